//! The bridge that runs first inside a sandbox with egress through plugd:
//! it listens on the namespace's own `127.0.0.1:PORT`, forks a process that
//! forwards every connection to the proxy's Unix socket, and `exec`s the
//! plugin in its own place (so the plugin keeps the pid, the pipes and the
//! exit status bwrap reports).
//!
//! The plugd binary runs it as `plugd __egress-bridge PORT SOCKET -- PROGRAM
//! ARGS...`, before it starts any thread (the fork needs a single-threaded
//! process). It gives the plugin nothing the sandbox does not already have:
//! a listener on its own loopback that reaches the proxy, which decides.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Connections the bridge relays at once (the proxy has its own, lower,
/// limit; this one only bounds the bridge's threads).
pub const MAX_RELAYS: usize = 256;

/// Runs the bridge; returns only on failure, with the exit code to use
/// (`exec` replaces the process on success).
pub fn main(args: &[OsString]) -> i32 {
    let usage = || {
        say("usage: plugd __egress-bridge PORT SOCKET -- PROGRAM [ARGS...]".to_owned());
        2
    };
    let (Some(port), Some(socket), Some(sep)) = (args.first(), args.get(1), args.get(2)) else {
        return usage();
    };
    let Some(port) = port.to_str().and_then(|p| p.parse::<u16>().ok()) else {
        return usage();
    };
    if sep != "--" || args.len() < 4 {
        return usage();
    }
    let program = &args[3];
    let rest = &args[4..];
    // Bound before the fork: the plugin can connect from its first instruction.
    let listener = match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) => {
            say(format!(
                "plugd egress bridge: cannot listen on 127.0.0.1:{port}: {e}"
            ));
            return 126;
        }
    };
    let parent = rustix::process::getpid();
    // SAFETY: the process is single-threaded here (the plugd binary calls
    // this before it starts anything), so the child may run any code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        say(format!(
            "plugd egress bridge: fork failed: {}",
            std::io::Error::last_os_error()
        ));
        return 126;
    }
    if pid == 0 {
        // The relay: dies with the plugin (and with the sandbox's pid
        // namespace, which ends when the plugin does).
        let _ =
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
        if rustix::process::getppid() != Some(parent) {
            std::process::exit(0);
        }
        detach_stdio();
        serve(listener, socket.into());
        std::process::exit(0);
    }
    drop(listener);
    #[allow(clippy::disallowed_methods)] // replaces this process with the plugin spawn contained
    let err = std::process::Command::new(program).args(rest).exec();
    say(format!(
        "plugd egress bridge: cannot run {:?}: {err}",
        program.to_string_lossy()
    ));
    127
}

/// One line on stderr (the plugin's, which plugd keeps in its log): the
/// bridge has no logger, and library crates deny `eprintln!`.
fn say(line: String) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Points stdin and stdout at /dev/null, so the relay holds none of the
/// plugin's protocol pipes.
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto the standard descriptors of this process.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
}

fn serve(listener: TcpListener, socket: std::path::PathBuf) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        if active.load(Ordering::Relaxed) >= MAX_RELAYS {
            continue; // dropped: closes the connection
        }
        let Ok(unix) = UnixStream::connect(&socket) else {
            let _ = (&tcp).write_all(&super::proxy::reply(
                502,
                "Bad Gateway",
                "plugd egress bridge: the proxy is not reachable\n",
            ));
            continue;
        };
        active.fetch_add(1, Ordering::Relaxed);
        let active = active.clone();
        std::thread::spawn(move || {
            relay(tcp, unix);
            active.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

fn relay(tcp: TcpStream, unix: UnixStream) {
    let (Ok(tcp2), Ok(unix2)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        copy(&tcp2, &unix2);
        let _ = unix2.shutdown(Shutdown::Write);
    });
    copy(&unix, &tcp);
    let _ = tcp.shutdown(Shutdown::Write);
    let _ = up.join();
}

/// Copies until EOF. Once `to` is gone, the rest of `from` is read and
/// dropped: closing a TCP socket with unread bytes would reset it and could
/// take the proxy's last answer (a 431, a 403) away from the plugin.
fn copy(mut from: impl Read, mut to: impl Write) {
    let mut buf = [0u8; 16 * 1024];
    let mut open = true;
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if open && to.write_all(&buf[..n]).is_err() {
                    open = false;
                }
            }
        }
    }
}
