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
    /// The shell that runs the server and stops it when its stdin closes
    /// (`None` while stopped).
    watchdog: Option<Child>,
}

impl TestNats {
    /// Starts a server and waits (at most 10 s) until it accepts
    /// connections; panics naming what is missing when it cannot.
    pub fn start() -> TestNats {
        TestNats::start_with("")
    }

    /// [`TestNats::start`] with `config` (nats-server's configuration
    /// format: `authorization { … }`, say) as its configuration file.
    pub fn start_with(config: &str) -> TestNats {
        let dir = tempfile::Builder::new()
            .prefix("plugd-nats-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        std::fs::write(dir.path().join("nats.conf"), config)
            .unwrap_or_else(|e| panic!("cannot write nats.conf: {e}"));
        let port = free_port();
        let watchdog = spawn(port, dir.path());
        TestNats {
            port,
            dir,
            watchdog: Some(watchdog),
        }
    }

    /// Stops the server (its JetStream store stays for [`TestNats::restart`]).
    pub fn stop(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            if let Some(mut stdin) = w.stdin.take() {
                let _ = stdin.write_all(b"\n");
            }
            let _ = w.wait();
        }
    }

    /// Starts the server again on the same port and store.
    pub fn restart(&mut self) {
        self.stop();
        self.watchdog = Some(spawn(self.port, self.dir.path()));
    }

    /// Freezes the server (`SIGSTOP`): its connections stay open and
    /// nothing answers on them, as with a stalled machine.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (`SIGCONT`).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// Kills the server at once (`SIGKILL`), frozen or not; its store stays
    /// for [`TestNats::restart`].
    pub fn kill(&mut self) {
        self.signal("-KILL");
        self.stop();
    }

    fn signal(&self, sig: &str) {
        let pid = std::fs::read_to_string(self.dir.path().join("pid")).unwrap_or_default();
        let pid = pid.trim();
        assert!(!pid.is_empty(), "nats-server's pid is unknown");
        #[allow(clippy::disallowed_methods)] // a signal to the test's own nats-server
        let status = Command::new("kill").args([sig, pid]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill {sig} {pid} failed");
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

/// Runs the server on `port` with its store in `dir` under a shell that
/// stops it when its stdin closes; waits until it accepts connections.
fn spawn(port: u16, dir: &std::path::Path) -> Child {
    let bin = std::env::var_os("PLUGD_NATS_SERVER")
        .map_or_else(|| PathBuf::from(NATS_SERVER), PathBuf::from);
    assert!(
        bin.exists(),
        "{} is missing: install Debian's nats-server package (scripts/test does)",
        bin.display()
    );
    // The server runs under a shell that waits for its stdin to close
    // (the value dropped, or the test process gone), then stops it.
    #[allow(clippy::disallowed_methods)] // the test's own nats-server
    let mut watchdog = Command::new("/bin/sh")
        .arg("-c")
        .arg("\"$0\" -c \"$2/nats.conf\" -a 127.0.0.1 -p \"$1\" -js -sd \"$2\" >>\"$2/log\" 2>&1 & pid=$!; echo $pid >\"$2/pid\"; read _; kill -CONT $pid; kill $pid; wait $pid")
        .arg(&bin)
        .arg(port.to_string())
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let end = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > end {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            let _ = watchdog.kill();
            panic!("nats-server did not accept connections on port {port} within 10 s:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    watchdog
}

impl Drop for TestNats {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free loopback port (bound, then released: the server takes it next).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}
