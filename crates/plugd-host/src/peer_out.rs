//! The way out to a plugin: frames written by the caller itself when the
//! pipe is idle, else queued (bounded) for a writer task.
//!
//! A call used to hand its frame to the peer's writer task, which woke,
//! wrote and slept again: one task wake-up per call before the child saw a
//! byte. Now a sender that asks for it (the peer does when its call is the
//! only one waiting: a quiet plugin, where latency is all) writes the frame
//! itself when nothing is queued and the pipe takes it without waiting.
//! Under load frames go through the writer task, which writes whatever has
//! gathered in one write (fewer system calls, and fewer wake-ups of the
//! child, than one write per frame). What the pipe cannot take now always
//! goes to the writer task, which alone waits for the pipe to drain. So:
//!
//! * **Order** is the order of [`PeerOut::send`] / [`PeerOut::try_send`]: a
//!   frame is written directly only when nothing is queued or in flight.
//! * **A frame is never torn**: a direct write that the pipe takes only in
//!   part leaves the rest at the head of the queue, written before
//!   anything else. A sender that gives up (its deadline, a dropped
//!   future) never leaves half a frame: the direct write does not wait.
//! * **Backpressure** is as before: at most `depth` frames wait; `send`
//!   waits for room, `try_send` says `Full` (the peer sheds notifications).
//! * **A child that stops reading** blocks nobody's reads, and senders wait
//!   for room as before; the writer task alone waits on the pipe.
//! * When the [`PeerOut`] drops (its peer is gone), what is queued is
//!   written, then the pipe is shut (the child sees end of input).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

/// The largest batch the writer task writes at once.
const BATCH: usize = 256 * 1024;

/// Why a frame was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `depth` frames already wait (only [`PeerOut::try_send`]).
    Full,
    /// Writing to the plugin failed; nothing more is written.
    Closed,
}

type Io = Box<dyn AsyncWrite + Unpin + Send>;

struct State {
    /// Writing failed: nothing more goes out.
    closed: bool,
    /// Frames waiting for the writer task, in order (the head may be the
    /// rest of a frame that a direct write began).
    queue: VecDeque<Bytes>,
    /// The writer task holds a batch it has not finished writing (or a
    /// flush it has not finished): no direct write until it has.
    busy: bool,
    /// A direct write's flush did not finish; the writer task finishes it.
    unflushed: bool,
    /// The [`PeerOut`] dropped: write what is queued, then shut the pipe.
    gone: bool,
}

struct Shared {
    plugin: Arc<str>,
    depth: usize,
    state: Mutex<State>,
    /// The pipe (`None` once writing failed or it was shut). Taken after
    /// `state` by a direct write, alone by the writer task: senders queue
    /// while the writer task is in a system call.
    io: Mutex<Option<Io>>,
    /// Wakes the writer task (work queued, or the `PeerOut` gone).
    work: Notify,
    /// Wakes senders waiting for room (frames taken, or writing failed).
    room: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn io(&self) -> MutexGuard<'_, Option<Io>> {
        self.io.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writing failed: nothing more goes out; waiting senders learn it.
    fn fail(&self, state: &mut State, e: &std::io::Error) {
        tracing::debug!(plugin = %self.plugin, error = %e, "write to plugin failed; writer stops");
        state.closed = true;
        state.queue.clear();
        self.room.notify_waiters();
        // The writer task lets go of the pipe.
        self.work.notify_one();
    }

    /// Takes `frame` now if it may (nothing queued nor in flight): written
    /// directly as far as the pipe takes it without waiting, the rest queued
    /// first. `Err(frame)` when it must wait its turn in the queue.
    fn direct(
        &self,
        state: &mut State,
        frame: Bytes,
        direct: bool,
    ) -> Result<Result<(), Refused>, Bytes> {
        if state.closed {
            return Ok(Err(Refused::Closed));
        }
        if !direct || !state.queue.is_empty() || state.busy || state.unflushed {
            return Err(frame);
        }
        let mut io = self.io();
        let Some(io) = io.as_mut() else {
            return Ok(Err(Refused::Closed));
        };
        let mut cx = Context::from_waker(Waker::noop());
        let mut off = 0;
        while off < frame.len() {
            match Pin::new(&mut *io).poll_write(&mut cx, &frame[off..]) {
                Poll::Ready(Ok(0)) => {
                    self.fail(state, &std::io::ErrorKind::WriteZero.into());
                    return Ok(Err(Refused::Closed));
                }
                Poll::Ready(Ok(n)) => off += n,
                Poll::Ready(Err(e)) => {
                    self.fail(state, &e);
                    return Ok(Err(Refused::Closed));
                }
                Poll::Pending => break,
            }
        }
        if off < frame.len() {
            // The writer task writes the rest, and it alone waits on the pipe.
            state.queue.push_back(frame.slice(off..));
            self.work.notify_one();
            return Ok(Ok(()));
        }
        match Pin::new(&mut *io).poll_flush(&mut cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => {
                self.fail(state, &e);
                return Ok(Err(Refused::Closed));
            }
            Poll::Pending => {
                state.unflushed = true;
                self.work.notify_one();
            }
        }
        Ok(Ok(()))
    }

    /// Queues `frame` when there is room.
    fn enqueue(&self, state: &mut State, frame: Bytes) -> Result<(), Bytes> {
        if state.queue.len() >= self.depth {
            return Err(frame);
        }
        state.queue.push_back(frame);
        self.work.notify_one();
        Ok(())
    }
}

/// The sending side of a plugin's input (see the module docs). Dropping it
/// ends the writer task once the queue is written.
pub(crate) struct PeerOut {
    shared: Arc<Shared>,
}

impl PeerOut {
    /// A `PeerOut` over `writer` holding at most `depth` waiting frames, with
    /// its writer task started.
    pub(crate) fn start<W>(plugin: Arc<str>, depth: usize, writer: W) -> PeerOut
    where
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            plugin,
            depth: depth.max(1),
            state: Mutex::new(State {
                closed: false,
                queue: VecDeque::new(),
                busy: false,
                unflushed: false,
                gone: false,
            }),
            io: Mutex::new(Some(Box::new(writer))),
            work: Notify::new(),
            room: Notify::new(),
        });
        tokio::spawn(write_loop(shared.clone()));
        PeerOut { shared }
    }

    /// Takes `frame` if it can now: `Full` when `depth` frames wait.
    /// `direct`: write it here if the pipe is idle (see the module docs).
    pub(crate) fn try_send(&self, frame: Bytes, direct: bool) -> Result<(), Refused> {
        let shared = &*self.shared;
        let mut state = shared.lock();
        match shared.direct(&mut state, frame, direct) {
            Ok(done) => done,
            Err(frame) => shared.enqueue(&mut state, frame).map_err(|_| Refused::Full),
        }
    }

    /// Takes `frame`, waiting for room in the queue; `Err` once writing to
    /// the plugin failed. `direct`: write it here if the pipe is idle.
    pub(crate) async fn send(&self, frame: Bytes, direct: bool) -> Result<(), Refused> {
        let shared = &*self.shared;
        let mut frame = frame;
        loop {
            let room = shared.room.notified();
            let mut room = std::pin::pin!(room);
            // Registered before the check: a wake-up between the two is kept.
            room.as_mut().enable();
            {
                let mut state = shared.lock();
                frame = match shared.direct(&mut state, frame, direct) {
                    Ok(done) => return done,
                    Err(frame) => match shared.enqueue(&mut state, frame) {
                        Ok(()) => return Ok(()),
                        Err(frame) => frame,
                    },
                };
            }
            room.await;
        }
    }
}

impl Drop for PeerOut {
    fn drop(&mut self) {
        self.shared.lock().gone = true;
        self.shared.work.notify_one();
    }
}

/// Writes what senders could not, in order; shuts the pipe when the
/// `PeerOut` is gone and its queue written.
async fn write_loop(shared: Arc<Shared>) {
    let mut batch = BytesMut::with_capacity(64 * 1024);
    loop {
        // Take the next batch, or finish, or wait for work.
        let take = {
            let mut state = shared.lock();
            if state.closed {
                *shared.io() = None;
                return;
            }
            if state.queue.is_empty() && !state.unflushed {
                if state.gone { Some(false) } else { None }
            } else {
                while batch.len() < BATCH {
                    let Some(frame) = state.queue.pop_front() else {
                        break;
                    };
                    batch.extend_from_slice(&frame);
                }
                state.busy = true;
                state.unflushed = false;
                shared.room.notify_waiters();
                Some(true)
            }
        };
        match take {
            None => {
                shared.work.notified().await;
                continue;
            }
            Some(false) => {
                let _ = poll_fn(|cx| match shared.io().as_mut() {
                    Some(io) => Pin::new(io).poll_shutdown(cx),
                    None => Poll::Ready(Ok(())),
                })
                .await;
                *shared.io() = None;
                return;
            }
            Some(true) => {}
        }
        let mut off = 0;
        let written = poll_fn(|cx| {
            let mut io = shared.io();
            let Some(io) = io.as_mut() else {
                return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
            };
            while off < batch.len() {
                match Pin::new(&mut *io).poll_write(cx, &batch[off..]) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                    }
                    Poll::Ready(Ok(n)) => off += n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            Pin::new(&mut *io).poll_flush(cx)
        })
        .await;
        batch.clear();
        let mut state = shared.lock();
        state.busy = false;
        if let Err(e) = written {
            shared.fail(&mut state, &e);
            drop(state);
            *shared.io() = None;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn frames(n: usize) -> Vec<Bytes> {
        (0..n)
            .map(|i| Bytes::from(format!("{i:05}:{}\n", "x".repeat(200))))
            .collect()
    }

    #[tokio::test]
    async fn frames_arrive_whole_and_in_order_through_a_small_pipe() {
        // A 64-byte pipe takes no 207-byte frame whole: every frame is begun
        // directly or queued, and the writer task finishes it.
        let (w, mut r) = tokio::io::duplex(64);
        let out = Arc::new(PeerOut::start("t".into(), 8, w));
        let sent = frames(200);
        let expect: Vec<u8> = sent.iter().flat_map(|f| f.to_vec()).collect();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.map(|_| got)
        });
        // Several senders at once, each in order: the pipe sees each
        // sender's frames in its order, and no frame is torn.
        let mut tasks = Vec::new();
        for chunk in sent.chunks(50) {
            let out = out.clone();
            let chunk = chunk.to_vec();
            tasks.push(tokio::spawn(async move {
                for f in chunk {
                    out.send(f, true).await.expect("pipe open");
                    tokio::task::yield_now().await;
                }
            }));
        }
        for t in tasks {
            t.await.expect("sender");
        }
        drop(Arc::into_inner(out).expect("last handle"));
        let got = reader.await.expect("reader").expect("read");
        assert_eq!(got.len(), expect.len());
        let mut lines: Vec<&[u8]> = got
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        for line in &lines {
            assert_eq!(
                line.len(),
                206,
                "a torn frame: {:?}",
                String::from_utf8_lossy(line)
            );
        }
        // Each sender's frames (50 consecutive numbers) arrive in its order.
        let numbers: Vec<usize> = lines
            .iter()
            .map(|l| String::from_utf8_lossy(&l[..5]).parse().expect("numbered"))
            .collect();
        for sender in 0..4 {
            let mine: Vec<usize> = numbers
                .iter()
                .copied()
                .filter(|n| n / 50 == sender)
                .collect();
            assert!(
                mine.windows(2).all(|w| w[0] < w[1]),
                "sender {sender}: {mine:?}"
            );
        }
        lines.sort();
        let mut want: Vec<&[u8]> = expect
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        want.sort();
        assert_eq!(lines, want);
    }

    #[tokio::test]
    async fn one_sender_keeps_its_order_and_the_pipe_ends_when_it_drops() {
        let (w, mut r) = tokio::io::duplex(100);
        let out = PeerOut::start("t".into(), 4, w);
        let sent = frames(40);
        let expect: Vec<u8> = sent.iter().flat_map(|f| f.to_vec()).collect();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.map(|_| got)
        });
        for (i, f) in sent.into_iter().enumerate() {
            out.send(f, i % 2 == 0).await.expect("pipe open");
        }
        drop(out);
        // read_to_end returns only at end of input: the drop shut the pipe.
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), reader)
            .await
            .expect("the pipe is shut after the queue is written")
            .expect("reader")
            .expect("read");
        assert_eq!(got, expect);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_try_send_and_holds_send_until_there_is_room() {
        let (w, mut r) = tokio::io::duplex(16);
        let out = Arc::new(PeerOut::start("t".into(), 2, w));
        // Nobody reads: the pipe fills, then the queue.
        let mut taken = 0;
        while out.try_send(Bytes::from_static(b"0123456789abcdef\n"), true) == Ok(()) {
            taken += 1;
            tokio::task::yield_now().await;
            assert!(taken < 100, "a queue of 2 over a 16-byte pipe never fills");
        }
        assert_eq!(
            out.try_send(Bytes::from_static(b"x\n"), true),
            Err(Refused::Full)
        );
        let waiting = tokio::spawn({
            let out = out.clone();
            async move { out.send(Bytes::from_static(b"last\n"), false).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "send waits for room");
        // Reading drains the pipe; the writer task makes room; send returns.
        let drain = tokio::spawn(async move {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.map(|_| got)
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("room is made")
            .expect("task")
            .expect("pipe open");
        drop(Arc::into_inner(out).expect("last handle"));
        let got = drain.await.expect("reader").expect("read");
        assert!(got.ends_with(b"last\n"), "the waiting frame comes last");
        assert_eq!(got.len(), taken * 17 + 5);
    }

    #[tokio::test]
    async fn a_broken_pipe_refuses_every_later_frame() {
        let (w, r) = tokio::io::duplex(64);
        let out = PeerOut::start("t".into(), 4, w);
        drop(r);
        assert_eq!(
            out.send(Bytes::from_static(b"hello\n"), true).await,
            Err(Refused::Closed)
        );
        assert_eq!(
            out.try_send(Bytes::from_static(b"again\n"), false),
            Err(Refused::Closed)
        );
    }
}
