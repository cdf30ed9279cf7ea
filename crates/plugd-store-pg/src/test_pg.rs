//! [`TestPg`]: a throw-away PostgreSQL 15 server for tests, on a Unix socket
//! in a temporary directory, with one fresh database per test.
//!
//! Start-up: a temporary directory owned by the `postgres` user (when the
//! tests run as root, since `initdb` and `postgres` refuse root; otherwise by
//! the current user), `initdb -A trust -U plugd` into `DIR/data`, then
//! `pg_ctl start -w -t 20` with `listen_addresses=''` (no TCP at all) and the
//! socket `DIR/.s.PGSQL.PORT`. Stop: a watchdog shell holding the read end of
//! a pipe runs `pg_ctl stop -m immediate` and removes the directory when the
//! pipe closes: at [`Drop`], or when the test process exits however it ends
//! (so the [`shared`](TestPg::shared) server of a test binary is stopped too).

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Where Debian's `postgresql-15` package puts the server binaries.
pub const PG_BIN_DIR: &str = "/usr/lib/postgresql/15/bin";

/// Overrides [`PG_BIN_DIR`] (a directory holding `initdb`, `pg_ctl`,
/// `postgres`, `createdb`).
pub const PG_BIN_ENV: &str = "PLUGD_TEST_PG_BIN";

/// The role `initdb` creates and every test URL connects as (trust auth).
pub const TEST_USER: &str = "plugd";

/// How long starting (or restarting) the server may take.
const START_TIMEOUT_SECS: u32 = 20;

/// Why the test server could not be started, restarted or used.
#[derive(Debug)]
pub struct TestPgError(String);

impl std::fmt::Display for TestPgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TestPgError {}

/// How [`TestPg::restart`] restarts the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartMode {
    /// `pg_ctl restart -m fast`: clients are disconnected, open
    /// transactions roll back, the server shuts down cleanly and starts.
    Fast,
    /// `pg_ctl stop -m immediate`, then start: a crash as far as clients
    /// know; the server replays its WAL on the way up.
    Immediate,
}

/// A running PostgreSQL 15 on a Unix socket in its own temporary directory.
pub struct TestPg {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    /// Run the server tools as `postgres` (the tests run as root).
    as_postgres: bool,
    watchdog: Mutex<Option<Child>>,
    databases: AtomicU64,
}

impl std::fmt::Debug for TestPg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPg")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .finish()
    }
}

impl TestPg {
    /// The one server of this test process, started on first use; panics
    /// with the reason (e.g. the package to install) if it cannot start.
    pub fn shared() -> &'static TestPg {
        static SHARED: OnceLock<TestPg> = OnceLock::new();
        SHARED.get_or_init(|| TestPg::start().unwrap_or_else(|e| panic!("{e}")))
    }

    /// Starts a new server of its own (stopped and removed when dropped).
    pub fn start() -> Result<TestPg, TestPgError> {
        let bin =
            std::env::var_os(PG_BIN_ENV).map_or_else(|| PathBuf::from(PG_BIN_DIR), PathBuf::from);
        check_binaries(&bin)?;
        let as_postgres = rustix::process::geteuid().is_root();
        // Under /tmp, not $TMPDIR: the `postgres` user must reach it, and a
        // socket path has at most 107 bytes.
        let base = Path::new("/tmp");
        let base = if base.is_dir() {
            base.to_owned()
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix("plugd-pg-")
            .tempdir_in(base)
            .map_err(|e| TestPgError(format!("cannot create a temporary directory: {e}")))?
            .keep();
        let port = free_port();
        let pg = TestPg {
            dir,
            bin,
            port,
            as_postgres,
            watchdog: Mutex::new(None),
            databases: AtomicU64::new(0),
        };
        pg.prepare_dir()?;
        // From here on the watchdog removes the directory whatever happens.
        pg.start_watchdog()?;
        pg.initdb()?;
        pg.pg_ctl_start()?;
        Ok(pg)
    }

    /// The socket directory (also the server's own temporary directory).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The socket's port number (`DIR/.s.PGSQL.PORT`; no TCP port is open).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the `postgres` maintenance database.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The URL of database `db` on this server.
    pub fn url_for(&self, db: &str) -> String {
        format!(
            "postgres://{TEST_USER}@/{db}?host={}&port={}",
            self.dir.display(),
            self.port
        )
    }

    /// Creates a new, empty database with a unique name and returns its
    /// URL, so tests sharing the server never see each other's state.
    pub fn fresh_database(&self) -> String {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let name = format!("t{}_{n}", std::process::id());
        let mut cmd = self.client_command("createdb");
        cmd.args(["-h"]).arg(&self.dir);
        cmd.args(["-p", &self.port.to_string(), "-U", TEST_USER, &name]);
        if let Err(e) = run(cmd, "createdb") {
            panic!("{e}\n{}", self.log_tail());
        }
        self.url_for(&name)
    }

    /// A plain SQL dump (`pg_dump`) of the database of `url`: every byte
    /// it stores, for tests that look for what must not be there.
    pub fn dump(&self, url: &str) -> Vec<u8> {
        let name = db_name(url).unwrap_or_default();
        let mut cmd = self.client_command("pg_dump");
        cmd.args(["-h"]).arg(&self.dir);
        cmd.args(["-p", &self.port.to_string(), "-U", TEST_USER, name]);
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run pg_dump: {e}"));
        assert!(
            out.status.success(),
            "pg_dump {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// Drops the database of `url` (made by [`TestPg::fresh_database`]),
    /// ending its connections first; a failure is only printed (a test's
    /// teardown must not hide its own result).
    pub fn drop_database(&self, url: &str) {
        let Some(name) = db_name(url) else {
            return;
        };
        let mut cmd = self.client_command("dropdb");
        cmd.args(["--force", "-h"]).arg(&self.dir);
        cmd.args(["-p", &self.port.to_string(), "-U", TEST_USER, name]);
        if let Err(e) = run(cmd, "dropdb") {
            tracing::warn!("could not drop the test database {name}: {e}");
        }
    }

    /// Creates a new database from `file`, a plain SQL dump (`pg_dump`),
    /// loaded by `psql` stopping at the first error; returns its URL.
    pub fn database_from_dump(&self, file: &Path) -> String {
        let url = self.fresh_database();
        let name = db_name(&url).unwrap_or_default().to_owned();
        let mut cmd = self.client_command("psql");
        cmd.args(["-q", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.dir);
        cmd.args([
            "-p",
            &self.port.to_string(),
            "-U",
            TEST_USER,
            "-d",
            &name,
            "-f",
        ])
        .arg(file);
        if let Err(e) = run(cmd, "psql -f") {
            panic!("{e}\n{}", self.log_tail());
        }
        url
    }

    /// Restarts the server (see [`RestartMode`]), waiting until it accepts
    /// connections again (at most 20 s).
    pub fn restart(&self, mode: RestartMode) -> Result<(), TestPgError> {
        match mode {
            RestartMode::Fast => {
                let mut cmd = self.server_command("pg_ctl");
                cmd.args(["restart", "-m", "fast"]);
                self.start_args(&mut cmd);
                run(cmd, "pg_ctl restart -m fast").map_err(|e| self.with_log(e))
            }
            RestartMode::Immediate => {
                self.stop_immediate()?;
                self.pg_ctl_start()
            }
        }
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`) and leaves it
    /// down until [`start_again`](Self::start_again): for tests of what
    /// callers see while the database is gone.
    pub fn stop_immediate(&self) -> Result<(), TestPgError> {
        let mut cmd = self.server_command("pg_ctl");
        cmd.args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(self.data_dir());
        run(cmd, "pg_ctl stop -m immediate").map_err(|e| self.with_log(e))
    }

    /// Starts the server again after [`stop_immediate`](Self::stop_immediate).
    pub fn start_again(&self) -> Result<(), TestPgError> {
        self.pg_ctl_start()
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        let _ = std::fs::File::open(self.log_file()).and_then(|mut f| f.read_to_string(&mut text));
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("last lines of {}:\n{tail}", self.log_file().display())
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    fn with_log(&self, e: TestPgError) -> TestPgError {
        TestPgError(format!("{e}\n{}", self.log_tail()))
    }

    /// Hands the directory to `postgres` when running as root; mode 0755 so
    /// the log and socket stay reachable.
    fn prepare_dir(&self) -> Result<(), TestPgError> {
        use std::os::unix::fs::PermissionsExt as _;
        let fail = |e: &dyn std::fmt::Display| {
            TestPgError(format!("cannot prepare {}: {e}", self.dir.display()))
        };
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| fail(&e))?;
        if self.as_postgres {
            let (uid, gid) = postgres_ids().ok_or_else(|| {
                fail(&"the tests run as root and there is no `postgres` user in /etc/passwd; install the Debian package postgresql-15, which creates it")
            })?;
            rustix::fs::chown(
                &self.dir,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            )
            .map_err(|e| fail(&e))?;
        }
        Ok(())
    }

    fn initdb(&self) -> Result<(), TestPgError> {
        let mut cmd = self.server_command("initdb");
        cmd.args([
            "-A",
            "trust",
            "-U",
            TEST_USER,
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
            "-D",
        ])
        .arg(self.data_dir());
        run(cmd, "initdb")
    }

    fn pg_ctl_start(&self) -> Result<(), TestPgError> {
        let mut cmd = self.server_command("pg_ctl");
        cmd.arg("start");
        self.start_args(&mut cmd);
        run(cmd, "pg_ctl start").map_err(|e| self.with_log(e))
    }

    /// `-D`, `-l`, `-w -t 20` and the server options of `start` and `restart`.
    fn start_args(&self, cmd: &mut Command) {
        cmd.arg("-D").arg(self.data_dir());
        cmd.arg("-l").arg(self.log_file());
        cmd.args(["-w", "-t", &START_TIMEOUT_SECS.to_string()]);
        // No TCP; the socket in DIR; fsync off (a test server need not survive
        // a machine crash, and committed data still survives `-m immediate`:
        // synchronous_commit stays on, so a commit reached the OS first).
        cmd.arg("-o").arg(format!(
            "-c listen_addresses='' -k {} -p {} -c fsync=off -c full_page_writes=off -c max_connections=300 -c shared_buffers=32MB",
            self.dir.display(),
            self.port
        ));
    }

    /// A server tool, run as `postgres` when the tests run as root.
    fn server_command(&self, tool: &str) -> Command {
        #[allow(clippy::disallowed_methods)] // the test's own PostgreSQL, not a plugin
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("/usr/sbin/runuser");
            c.args(["-u", "postgres", "--"]).arg(self.bin.join(tool));
            c
        } else {
            Command::new(self.bin.join(tool))
        };
        clean_env(&mut cmd);
        cmd
    }

    /// A client tool, run as the current user.
    fn client_command(&self, tool: &str) -> Command {
        #[allow(clippy::disallowed_methods)] // the test's own PostgreSQL client
        let mut cmd = Command::new(self.bin.join(tool));
        clean_env(&mut cmd);
        cmd
    }

    /// A shell that waits for its stdin to close (this value dropped, or the
    /// test process gone), then stops the server and removes the directory.
    /// In its own process group, so a Ctrl-C of the test run reaches it only
    /// through the closed pipe.
    fn start_watchdog(&self) -> Result<(), TestPgError> {
        use std::os::unix::process::CommandExt as _;
        let stop = self.server_command("pg_ctl");
        #[allow(clippy::disallowed_methods)] // the test server's watchdog
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(r#"cat >/dev/null; "$@" >/dev/null 2>&1; rm -rf -- "$0""#)
            .arg(&self.dir)
            .arg(stop.get_program())
            .args(stop.get_args())
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(self.data_dir());
        clean_env(&mut cmd);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let child = cmd
            .spawn()
            .map_err(|e| TestPgError(format!("cannot start the test server's watchdog: {e}")))?;
        *self.watchdog.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }
}

impl Drop for TestPg {
    fn drop(&mut self) {
        let child = self
            .watchdog
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut child) = child {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

/// Refuses a binary directory without the server tools, naming the package.
fn check_binaries(bin: &Path) -> Result<(), TestPgError> {
    for tool in ["initdb", "pg_ctl", "postgres", "createdb"] {
        if !bin.join(tool).is_file() {
            return Err(TestPgError(format!(
                "PostgreSQL 15 server binaries not found: {} is missing; install the Debian package postgresql-15 (`apt-get install postgresql-15`; scripts/test does) or set {PG_BIN_ENV} to a directory holding initdb, pg_ctl, postgres and createdb",
                bin.join(tool).display()
            )));
        }
    }
    Ok(())
}

/// An environment with nothing of the caller's (no `PG*` variables).
fn clean_env(cmd: &mut Command) {
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LC_ALL", "C");
}

/// Runs `cmd` to completion; its stderr (and stdout) in the error.
fn run(mut cmd: Command, what: &str) -> Result<(), TestPgError> {
    cmd.stdin(Stdio::null());
    let out = cmd
        .output()
        .map_err(|e| TestPgError(format!("cannot run {what} ({:?}): {e}", cmd.get_program())))?;
    if out.status.success() {
        return Ok(());
    }
    Err(TestPgError(format!(
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&out.stdout).trim()
    )))
}

/// A port number no one listens on over TCP, for the socket's name: each
/// server has its own directory, so this only keeps the numbers distinct.
fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map_or(5432, |a| a.port())
}

/// The uid and gid of `postgres`, from /etc/passwd.
fn postgres_ids() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        (f.next()? == "postgres").then_some(())?;
        let _password = f.next()?;
        Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
    })
}

/// The database name of a URL made by [`TestPg::url_for`].
fn db_name(url: &str) -> Option<&str> {
    url.split_once("@/")
        .and_then(|(_, rest)| rest.split('?').next())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_name_the_package() {
        let empty = tempfile::tempdir().unwrap();
        let msg = check_binaries(empty.path()).unwrap_err().to_string();
        assert!(msg.contains("postgresql-15"), "{msg}");
        assert!(msg.contains("initdb"), "{msg}");
    }

    #[test]
    fn reads_the_postgres_user() {
        // Debian's postgresql-15 creates the user; the tests need the package anyway.
        let (uid, _gid) = postgres_ids().expect("a postgres user in /etc/passwd");
        assert!(uid > 0);
    }
}
