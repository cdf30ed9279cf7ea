//! Frame boundaries: newline-delimited and Content-Length streams, size-limited.
//!
//! The decoder never holds more than `max_frame` bytes of one frame (plus one
//! read's worth of slack): a longer line, or a Content-Length above the limit,
//! is skipped as it streams past and reported as [`Frame::Oversized`] with the
//! first bytes kept for diagnostics. Header errors in Content-Length streams
//! are fatal ([`FrameError`]) because the stream can no longer be re-synchronised.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::Decoder;

/// Default largest frame: 16 MiB.
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024 * 1024;

/// Largest Content-Length header block accepted (all header lines together).
pub const MAX_HEADER_BLOCK: usize = 8 * 1024;

/// How many leading bytes of an oversized frame are kept for diagnostics.
pub const OVERSIZED_PREFIX: usize = 256;

/// How a byte stream is cut into frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// One frame per `\n`-terminated line (a trailing `\r` is stripped). The
    /// nexo native contract, microapps and MCP stdio use this.
    Lines,
    /// `Content-Length: N\r\n` headers, a blank line, then N bytes (LSP style).
    /// Salmex and VAI use this.
    ContentLength,
}

/// One unit cut from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A complete frame's payload (without line terminator or headers).
    Data(Bytes),
    /// A frame larger than the limit was skipped without being buffered.
    Oversized {
        /// Bytes the frame had (for lines: at least this many; for
        /// Content-Length: the declared length).
        len: u64,
        /// The first bytes of the frame, for diagnostics and id recovery.
        prefix: Bytes,
    },
}

/// A fatal framing error: the stream cannot be decoded any further.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Reading the underlying stream failed.
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
    /// A Content-Length header block was malformed.
    #[error("bad Content-Length header: {reason} (header block {preview:?})")]
    BadHeader {
        /// What was wrong.
        reason: String,
        /// The start of the offending header block, lossily decoded.
        preview: String,
    },
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame ({buffered} bytes buffered)")]
    Truncated {
        /// Bytes of the incomplete frame.
        buffered: usize,
    },
}

/// Decoder state for both framings.
#[derive(Debug)]
enum State {
    /// Looking for the end of a line (Lines) or a header block (ContentLength).
    /// `scanned` bytes of the buffer are already known not to contain it.
    Seeking { scanned: usize },
    /// Content-Length: waiting for `len` body bytes.
    Body { len: usize },
    /// Skipping an oversized frame. For lines `remaining` is `None` (skip to
    /// the next newline); for Content-Length it counts the bytes left.
    Discarding {
        seen: u64,
        remaining: Option<u64>,
        prefix: Bytes,
        reported: bool,
    },
}

/// A size-limited [`Decoder`] for one [`Framing`].
#[derive(Debug)]
pub struct FrameDecoder {
    framing: Framing,
    max_frame: usize,
    state: State,
}

impl FrameDecoder {
    /// A decoder with the given framing and largest frame in bytes.
    pub fn new(framing: Framing, max_frame: usize) -> Self {
        FrameDecoder {
            framing,
            max_frame: max_frame.max(1),
            state: State::Seeking { scanned: 0 },
        }
    }

    /// The framing this decoder cuts.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// The largest frame this decoder accepts.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    fn decode_lines(&mut self, buf: &mut BytesMut) -> Option<Frame> {
        loop {
            match &mut self.state {
                State::Seeking { scanned } => {
                    let start = (*scanned).min(buf.len());
                    match memchr(b'\n', &buf[start..]) {
                        Some(off) => {
                            let end = start + off;
                            self.state = State::Seeking { scanned: 0 };
                            let mut line = buf.split_to(end + 1);
                            line.truncate(end);
                            if line.last() == Some(&b'\r') {
                                line.truncate(line.len() - 1);
                            }
                            if line.len() > self.max_frame {
                                return Some(Frame::Oversized {
                                    len: line.len() as u64,
                                    prefix: prefix_of(&line),
                                });
                            }
                            if line.iter().all(u8::is_ascii_whitespace) {
                                continue; // blank lines carry nothing
                            }
                            return Some(Frame::Data(line.freeze()));
                        }
                        None if buf.len() > self.max_frame => {
                            let prefix = prefix_of(buf);
                            let seen = buf.len() as u64;
                            buf.clear();
                            self.state = State::Discarding {
                                seen,
                                remaining: None,
                                prefix,
                                reported: false,
                            };
                            return None;
                        }
                        None => {
                            *scanned = buf.len();
                            return None;
                        }
                    }
                }
                State::Discarding {
                    seen,
                    remaining: None,
                    prefix,
                    ..
                } => match memchr(b'\n', buf) {
                    Some(pos) => {
                        let frame = Frame::Oversized {
                            len: *seen + pos as u64,
                            prefix: std::mem::take(prefix),
                        };
                        buf.advance(pos + 1);
                        self.state = State::Seeking { scanned: 0 };
                        return Some(frame);
                    }
                    None => {
                        *seen += buf.len() as u64;
                        buf.clear();
                        return None;
                    }
                },
                State::Body { .. } | State::Discarding { .. } => {
                    unreachable!("content-length states never occur in line framing")
                }
            }
        }
    }

    fn decode_content_length(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        loop {
            match &mut self.state {
                State::Seeking { scanned } => {
                    // Tolerate blank lines between frames.
                    while buf.starts_with(b"\r\n") {
                        buf.advance(2);
                    }
                    let start = scanned.saturating_sub(3).min(buf.len());
                    let Some(off) = find(&buf[start..], b"\r\n\r\n") else {
                        if buf.len() > MAX_HEADER_BLOCK {
                            return Err(bad_header(
                                format!(
                                    "header block exceeds {MAX_HEADER_BLOCK} bytes without a blank line"
                                ),
                                buf,
                            ));
                        }
                        *scanned = buf.len();
                        return Ok(None);
                    };
                    let end = start + off;
                    if end > MAX_HEADER_BLOCK {
                        return Err(bad_header(
                            format!("header block exceeds {MAX_HEADER_BLOCK} bytes"),
                            buf,
                        ));
                    }
                    let len = parse_headers(&buf[..end]).map_err(|r| bad_header(r, buf))?;
                    buf.advance(end + 4);
                    if len > self.max_frame as u64 {
                        self.state = State::Discarding {
                            seen: len,
                            remaining: Some(len),
                            prefix: Bytes::new(),
                            reported: false,
                        };
                    } else {
                        self.state = State::Body { len: len as usize };
                    }
                }
                State::Body { len } => {
                    if buf.len() < *len {
                        buf.reserve(*len - buf.len());
                        return Ok(None);
                    }
                    let body = buf.split_to(*len).freeze();
                    self.state = State::Seeking { scanned: 0 };
                    return Ok(Some(Frame::Data(body)));
                }
                State::Discarding {
                    seen,
                    remaining: Some(remaining),
                    prefix,
                    reported,
                } => {
                    if !*reported {
                        let want = (OVERSIZED_PREFIX as u64).min(*remaining) as usize;
                        if buf.len() < want {
                            return Ok(None);
                        }
                        *prefix = Bytes::copy_from_slice(&buf[..want]);
                    }
                    let take = (*remaining).min(buf.len() as u64);
                    buf.advance(take as usize);
                    *remaining -= take;
                    let frame = (!*reported).then(|| Frame::Oversized {
                        len: *seen,
                        prefix: prefix.clone(),
                    });
                    *reported = true;
                    if *remaining == 0 {
                        self.state = State::Seeking { scanned: 0 };
                    }
                    if frame.is_some() {
                        return Ok(frame);
                    }
                    if matches!(self.state, State::Discarding { .. }) {
                        return Ok(None);
                    }
                }
                State::Discarding {
                    remaining: None, ..
                } => {
                    unreachable!("line discarding never occurs in content-length framing")
                }
            }
        }
    }
}

impl Decoder for FrameDecoder {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        match self.framing {
            Framing::Lines => Ok(self.decode_lines(buf)),
            Framing::ContentLength => self.decode_content_length(buf),
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        match (&mut self.state, self.framing) {
            // A last line without its newline is still a line.
            (State::Seeking { .. }, Framing::Lines) if !buf.is_empty() => {
                buf.extend_from_slice(b"\n");
                Ok(self.decode_lines(buf))
            }
            (State::Discarding { seen, prefix, .. }, Framing::Lines) => {
                let frame = Frame::Oversized {
                    len: *seen,
                    prefix: std::mem::take(prefix),
                };
                self.state = State::Seeking { scanned: 0 };
                Ok(Some(frame))
            }
            (State::Seeking { .. }, Framing::ContentLength)
                if buf.iter().all(u8::is_ascii_whitespace) =>
            {
                buf.clear();
                Ok(None)
            }
            (State::Seeking { .. }, Framing::Lines) => Ok(None),
            _ => {
                let buffered = buf.len();
                buf.clear();
                self.state = State::Seeking { scanned: 0 };
                Err(FrameError::Truncated { buffered })
            }
        }
    }
}

/// Appends one frame carrying `payload` to `dst`.
///
/// For [`Framing::Lines`] the payload must not contain a newline; serialized
/// JSON never does (newlines inside strings are escaped).
pub fn encode_frame(framing: Framing, payload: &[u8], dst: &mut BytesMut) {
    match framing {
        Framing::Lines => {
            debug_assert!(
                !payload.contains(&b'\n'),
                "line frames cannot contain a newline"
            );
            dst.reserve(payload.len() + 1);
            dst.extend_from_slice(payload);
            dst.extend_from_slice(b"\n");
        }
        Framing::ContentLength => {
            let header = format!("Content-Length: {}\r\n\r\n", payload.len());
            dst.reserve(header.len() + payload.len());
            dst.extend_from_slice(header.as_bytes());
            dst.extend_from_slice(payload);
        }
    }
}

fn parse_headers(block: &[u8]) -> Result<u64, String> {
    let text = std::str::from_utf8(block).map_err(|_| "header block is not UTF-8".to_owned())?;
    let mut length: Option<u64> = None;
    for line in text.split("\r\n") {
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("header line {line:?} has no colon"));
        };
        if !name.trim().eq_ignore_ascii_case("content-length") {
            continue; // Content-Type and friends are ignored
        }
        let value = value.trim();
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "Content-Length {value:?} is not a non-negative integer"
            ));
        }
        let parsed: u64 = value
            .parse()
            .map_err(|_| format!("Content-Length {value:?} is too large"))?;
        if length.is_some_and(|l| l != parsed) {
            return Err("conflicting Content-Length headers".to_owned());
        }
        length = Some(parsed);
    }
    length.ok_or_else(|| "missing Content-Length header".to_owned())
}

fn bad_header(reason: String, buf: &[u8]) -> FrameError {
    let end = buf.len().min(80);
    FrameError::BadHeader {
        reason,
        preview: String::from_utf8_lossy(&buf[..end]).into_owned(),
    }
}

fn prefix_of(buf: &[u8]) -> Bytes {
    Bytes::copy_from_slice(&buf[..buf.len().min(OVERSIZED_PREFIX)])
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(framing: Framing, max: usize, chunks: &[&[u8]]) -> Vec<Result<Frame, String>> {
        let mut dec = FrameDecoder::new(framing, max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            loop {
                match dec.decode(&mut buf) {
                    Ok(Some(f)) => out.push(Ok(f)),
                    Ok(None) => break,
                    Err(e) => {
                        out.push(Err(e.to_string()));
                        return out;
                    }
                }
            }
        }
        loop {
            match dec.decode_eof(&mut buf) {
                Ok(Some(f)) => out.push(Ok(f)),
                Ok(None) => break,
                Err(e) => {
                    out.push(Err(e.to_string()));
                    break;
                }
            }
        }
        out
    }

    fn data(s: &str) -> Result<Frame, String> {
        Ok(Frame::Data(Bytes::copy_from_slice(s.as_bytes())))
    }

    #[test]
    fn lines_split_across_reads_and_crlf() {
        let got = decode_all(
            Framing::Lines,
            100,
            &[b"{\"a\"", b":1}\r\n\n  \n{\"b\":2}\n{\"c\":3}"],
        );
        assert_eq!(
            got,
            vec![data("{\"a\":1}"), data("{\"b\":2}"), data("{\"c\":3}")]
        );
    }

    #[test]
    fn long_line_is_skipped_without_buffering_it() {
        let mut dec = FrameDecoder::new(Framing::Lines, 64);
        let mut buf = BytesMut::new();
        let chunk = vec![b'x'; 50];
        let mut oversized = None;
        for _ in 0..1000 {
            buf.extend_from_slice(&chunk);
            assert!(dec.decode(&mut buf).unwrap().is_none());
            assert!(buf.len() <= 64 + 50, "decoder kept {} bytes", buf.len());
        }
        buf.extend_from_slice(b"tail\n{\"ok\":1}\n");
        if let Some(Frame::Oversized { len, prefix }) = dec.decode(&mut buf).unwrap() {
            oversized = Some((len, prefix));
        }
        let (len, prefix) = oversized.expect("oversized frame reported");
        assert_eq!(len, 50_004);
        assert!(!prefix.is_empty() && prefix.len() <= OVERSIZED_PREFIX);
        assert!(prefix.iter().all(|&b| b == b'x'));
        assert_eq!(
            dec.decode(&mut buf).unwrap(),
            Some(Frame::Data(Bytes::from_static(b"{\"ok\":1}")))
        );
    }

    #[test]
    fn line_exactly_at_limit_passes_one_over_does_not() {
        let at = "a".repeat(16);
        let over = "b".repeat(17);
        let input = format!("{at}\n{over}\n");
        let got = decode_all(Framing::Lines, 16, &[input.as_bytes()]);
        assert_eq!(got[0], data(&at));
        assert!(
            matches!(got[1], Ok(Frame::Oversized { len: 17, .. })),
            "{got:?}"
        );
    }

    #[test]
    fn content_length_frames_and_split_headers() {
        let got = decode_all(
            Framing::ContentLength,
            100,
            &[
                b"Content-Le",
                b"ngth: 7\r\nContent-Type: application/json\r\n\r\n{\"a\":1}",
                b"content-length:2\r\n\r\n{}",
            ],
        );
        assert_eq!(got, vec![data("{\"a\":1}"), data("{}")]);
    }

    #[test]
    fn content_length_hostile_headers_are_fatal() {
        for (input, needle) in [
            (
                &b"Content-Length: -5\r\n\r\n"[..],
                "not a non-negative integer",
            ),
            (
                b"Content-Length: 99999999999999999999999\r\n\r\n",
                "too large",
            ),
            (b"Content-Length: abc\r\n\r\n", "not a non-negative integer"),
            (b"Content-Type: x\r\n\r\n{}", "missing Content-Length"),
            (b"garbage line\r\n\r\n", "no colon"),
            (
                b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n",
                "conflicting",
            ),
        ] {
            let got = decode_all(Framing::ContentLength, 100, &[input]);
            let err = got.last().unwrap().clone().unwrap_err();
            assert!(err.contains(needle), "{input:?}: {err}");
        }
    }

    #[test]
    fn content_length_header_block_of_one_mib_is_refused_early() {
        let mut dec = FrameDecoder::new(Framing::ContentLength, 1 << 20);
        let mut buf = BytesMut::new();
        let line = b"X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
        let mut failed = false;
        while buf.len() < (1 << 20) {
            buf.extend_from_slice(line);
            if let Err(e) = dec.decode(&mut buf) {
                assert!(e.to_string().contains("header block exceeds"), "{e}");
                failed = true;
                break;
            }
        }
        assert!(failed, "a header block without end must be refused");
        assert!(buf.len() <= MAX_HEADER_BLOCK + line.len());
    }

    #[test]
    fn content_length_missing_blank_line_is_truncated_at_eof() {
        let got = decode_all(Framing::ContentLength, 100, &[b"Content-Length: 2\r\n{}"]);
        assert!(
            got.last()
                .unwrap()
                .as_ref()
                .unwrap_err()
                .contains("stream ended inside a frame")
        );
    }

    #[test]
    fn content_length_lying_length_is_skipped_not_buffered() {
        let mut dec = FrameDecoder::new(Framing::ContentLength, 1024);
        let mut buf = BytesMut::from(&b"Content-Length: 1000000\r\n\r\n"[..]);
        assert_eq!(dec.decode(&mut buf).unwrap(), None);
        let chunk = vec![b'z'; 4096];
        let mut reported = 0;
        let mut fed = 0;
        while fed < 1_000_000 {
            let n = chunk.len().min(1_000_000 - fed);
            buf.extend_from_slice(&chunk[..n]);
            fed += n;
            while let Some(f) = dec.decode(&mut buf).unwrap() {
                assert!(matches!(f, Frame::Oversized { len: 1_000_000, .. }));
                reported += 1;
            }
            assert!(buf.len() <= 4096);
        }
        assert_eq!(reported, 1);
        buf.extend_from_slice(b"Content-Length: 2\r\n\r\n{}");
        assert_eq!(
            dec.decode(&mut buf).unwrap(),
            Some(Frame::Data(Bytes::from_static(b"{}")))
        );
    }

    fn chunked(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 0;
        for &c in cuts {
            let end = (at + c).min(bytes.len());
            out.push(bytes[at..end].to_vec());
            at = end;
        }
        out.push(bytes[at..].to_vec());
        out
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048),
                                cuts in proptest::collection::vec(0usize..300, 0..10),
                                max in 1usize..512) {
            let chunks = chunked(&bytes, &cuts);
            let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            for framing in [Framing::Lines, Framing::ContentLength] {
                let _ = decode_all(framing, max, &refs);
            }
        }

        #[test]
        fn encoded_frames_round_trip(payloads in proptest::collection::vec("[^\n\r]{1,200}", 1..8),
                                     cuts in proptest::collection::vec(1usize..64, 0..12)) {
            for framing in [Framing::Lines, Framing::ContentLength] {
                let mut wire = BytesMut::new();
                for p in &payloads {
                    encode_frame(framing, p.as_bytes(), &mut wire);
                }
                let chunks = chunked(&wire, &cuts);
                let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
                let got = decode_all(framing, 1024, &refs);
                let want: Vec<_> = payloads
                    .iter()
                    .filter(|p| framing == Framing::ContentLength || !p.bytes().all(|b| b.is_ascii_whitespace()))
                    .map(|p| data(p))
                    .collect();
                prop_assert_eq!(got, want);
            }
        }
    }
}
