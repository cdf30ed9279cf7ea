//! A throw-away nats-server (Debian's, 2.9) with JetStream for tests: a loopback port, its store in a temporary directory, stopped when dropped or when the test process ends.

use std::io::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's `nats-server` package puts the server.
pub const NATS_SERVER: &str = "/usr/sbin/nats-server";

/// A running test server (see the module).
#[derive(Debug)]
pub struct TestNats {
    port: u16,
    dir: tempfile::TempDir,
    /// The shell that runs the server and stops it when its stdin closes.
    watchdog: Child,
}

impl TestNats {
    /// Starts a server and waits (at most 10 s) until it accepts
    /// connections; panics naming what is missing when it cannot.
    pub fn start() -> TestNats {
        let bin = std::env::var_os("PLUGD_NATS_SERVER")
            .map_or_else(|| PathBuf::from(NATS_SERVER), PathBuf::from);
        assert!(
            bin.exists(),
            "{} is missing: install Debian's nats-server package (scripts/test does)",
            bin.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("plugd-nats-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        let port = free_port();
        // The server runs under a shell that waits for its stdin to close
        // (this value dropped, or the test process gone), then stops it.
        #[allow(clippy::disallowed_methods)] // the test's own nats-server
        let mut watchdog = Command::new("/bin/sh")
            .arg("-c")
            .arg("\"$0\" -a 127.0.0.1 -p \"$1\" -js -sd \"$2\" >\"$2/log\" 2>&1 & pid=$!; read _; kill $pid; wait $pid")
            .arg(&bin)
            .arg(port.to_string())
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > end {
                let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
                let _ = watchdog.kill();
                panic!("nats-server did not accept connections on port {port} within 10 s:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        TestNats {
            port,
            dir,
            watchdog,
        }
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }
}

impl Drop for TestNats {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.watchdog.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let _ = self.watchdog.wait();
    }
}

/// A free loopback port (bound, then released: the server takes it next).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}
