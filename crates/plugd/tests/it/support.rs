//! Test support: temporary workspaces with real plugins, and the plugd binary.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use plugd_host::HostConfig;
use plugd_runtime::Runtime;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Copies directory `from` to `to`, recursively.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// Starts the Python fixture server `script` (a path under the repository)
/// with `args` from the repo's venv, and reads the `url: …` line it prints
/// first: the child (the caller kills it) and that URL.
pub fn python_server(script: &str, args: &[&str]) -> (std::process::Child, String) {
    use std::io::BufRead as _;
    #[allow(clippy::disallowed_methods)] // the test's own fixture server
    let mut child = std::process::Command::new(repo().join(".venv/bin/python3"))
        .arg(repo().join(script))
        .args(args)
        .env("PATH", path_with_venv())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .strip_prefix("url: ")
        .unwrap_or_else(|| panic!("{script} printed {line:?}"))
        .trim()
        .to_owned();
    (child, url)
}

/// `PATH` with the repo's venv first (where `nexoai` is installed by scripts/test).
pub fn path_with_venv() -> String {
    let venv = repo().join(".venv/bin");
    assert!(
        venv.join("python3").exists(),
        "{} is missing: run ./scripts/test, which creates the venv with nexoai",
        venv.display()
    );
    format!(
        "{}:{}",
        venv.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A temporary workspace. With `PLUGD_TEST_STATE=postgres` ([`on_postgres`])
/// its state lives on a fresh database of the shared test PostgreSQL,
/// initialised as a cluster by `plugd cluster init`, and every plugd process
/// and in-process runtime of it uses that database (`PLUGD_STATE`).
pub struct Ws {
    pub tmp: tempfile::TempDir,
    /// The workspace's cluster database, in the PostgreSQL pass.
    state: Option<String>,
}

/// A master key for tests that set `PLUGD_MASTER_KEY` (never the
/// machine's key); in the PostgreSQL pass every workspace's cluster is
/// initialised with it and every plugd process gets it.
pub const TEST_MASTER_KEY: &str =
    "0101010101010101010101010101010101010101010101010101010101010101";

/// The variable that runs the suite's workspaces on PostgreSQL
/// (`scripts/test` runs the `it` suite once more with it set to `postgres`).
pub const TEST_STATE_ENV: &str = "PLUGD_TEST_STATE";

/// Whether this run keeps every workspace's state on PostgreSQL.
pub fn on_postgres() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var(TEST_STATE_ENV).as_deref() {
        Ok("postgres") => true,
        Ok("sqlite") | Err(_) => false,
        Ok(other) => panic!("{TEST_STATE_ENV}={other}: expected postgres or sqlite"),
    })
}

/// The cluster database of each live workspace of the PostgreSQL pass, by
/// its directory ([`plugd_cmd`] finds a workspace's by path).
fn state_urls() -> &'static std::sync::Mutex<Vec<(PathBuf, String)>> {
    static URLS: std::sync::OnceLock<std::sync::Mutex<Vec<(PathBuf, String)>>> =
        std::sync::OnceLock::new();
    URLS.get_or_init(Default::default)
}

/// The cluster database that `workspace` (or the workspace holding it)
/// keeps its state in, in the PostgreSQL pass.
pub fn state_url(workspace: &Path) -> Option<String> {
    let urls = state_urls().lock().unwrap_or_else(|e| e.into_inner());
    urls.iter()
        .find(|(dir, _)| workspace.starts_with(dir))
        .map(|(_, url)| url.clone())
}

impl Ws {
    pub fn new() -> Ws {
        landlock_by_default();
        let tmp = tempfile::tempdir().unwrap();
        let state = on_postgres().then(|| {
            let url = plugd_store_pg::test_pg::TestPg::shared().fresh_database();
            cluster_init(tmp.path(), &url);
            state_urls()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((tmp.path().to_owned(), url.clone()));
            url
        });
        Ws { tmp, state }
    }

    /// The cluster database this workspace keeps its state in (the
    /// PostgreSQL pass), else `None` (the workspace's SQLite file).
    pub fn state_url(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// Every byte the workspace's state store holds, to look for what must
    /// never be stored (a token, an unredacted value): the SQLite files, or
    /// a plain dump of the cluster database.
    pub fn state_bytes(&self) -> Vec<u8> {
        match &self.state {
            Some(url) => plugd_store_pg::test_pg::TestPg::shared().dump(url),
            None => {
                let mut all = Vec::new();
                for f in std::fs::read_dir(self.dir().join(".plugd")).unwrap() {
                    let path = f.unwrap().path();
                    let name = path.file_name().unwrap().to_string_lossy().into_owned();
                    if path.is_file() && name.starts_with(plugd_store::STATE_DB_FILE) {
                        all.extend(std::fs::read(&path).unwrap());
                    }
                }
                all
            }
        }
    }

    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    pub fn plugin_dir(&self, name: &str) -> PathBuf {
        self.dir().join(".plugins").join(name)
    }

    /// A plugin running `tests/plugins/misbehave.py MODE [ARG]`, with the five
    /// standard tools declared and `extra` appended to its manifest.
    pub fn misbehave(&self, id: &str, mode: &str, arg: Option<&str>, extra: &str) -> PathBuf {
        let dir = self.plugin_dir(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            repo().join("tests/plugins/misbehave.py"),
            dir.join("misbehave.py"),
        )
        .unwrap();
        let mut args = vec![format!("\"misbehave.py\""), format!("\"{mode}\"")];
        if let Some(a) = arg {
            args.push(format!("\"{a}\""));
        }
        let tools: Vec<String> = ["echo", "sleep", "crash", "fail", "pid"]
            .iter()
            .map(|t| format!("\"{id}_{t}\""))
            .collect();
        let manifest = format!(
            "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [{}]\n\n[plugin.extends]\ntools = [{}]\n{extra}\n",
            args.join(", "),
            tools.join(", ")
        );
        std::fs::write(dir.join("nexo-plugin.toml"), manifest).unwrap();
        dir
    }

    /// Copies one of the example plugins into this workspace.
    pub fn example(&self, name: &str) -> PathBuf {
        let from = repo().join("examples/workspace/.plugins").join(name);
        let to = self.plugin_dir(name);
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(&from).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
        to
    }

    /// Writes a plugd.yaml that turns the sandbox off for plugins `ids` (VAI
    /// packages are sandboxed by their permissions by default); `why` says
    /// what the test needs from outside the sandbox.
    pub fn unsandbox(&self, ids: &[&str], why: &str) {
        let path = self.dir().join("plugd.yaml");
        assert!(!path.exists(), "unsandbox writes plugd.yaml itself");
        let mut text = format!("# {why}\nsandbox:\n  plugins:\n");
        for id in ids {
            text.push_str(&format!("    \"{id}\": {{enabled: false}}\n"));
        }
        std::fs::write(path, text).unwrap();
    }

    /// Opens the runtime with `config`, on the workspace's state (its
    /// cluster database in the PostgreSQL pass).
    pub async fn runtime(&self, config: HostConfig) -> Runtime {
        match &self.state {
            None => plugd_agent::open(self.dir(), config).await.unwrap(),
            Some(url) => {
                let state = plugd_store_pg::PgStore::connect(url, &Default::default())
                    .await
                    .unwrap();
                Runtime::open_on(
                    self.dir(),
                    std::sync::Arc::new(state),
                    config,
                    plugd_agent::parts(),
                )
                .await
                .unwrap()
            }
        }
    }

    /// The workspace's state store, as the backend-neutral trait object.
    pub async fn state(&self) -> std::sync::Arc<dyn plugd_store::StateStore> {
        match &self.state {
            None => {
                std::sync::Arc::new(plugd_store::Store::open(&self.dir().join(".plugd")).unwrap())
            }
            Some(url) => std::sync::Arc::new(
                plugd_store_pg::PgStore::connect(url, &Default::default())
                    .await
                    .unwrap(),
            ),
        }
    }

    /// Runs the plugd binary on this workspace.
    pub fn plugd(&self, args: &[&str]) -> Output {
        plugd_cmd(self.dir()).args(args).output().unwrap()
    }
}

/// Makes `url` a cluster with the suite's master key.
fn cluster_init(dir: &Path, url: &str) {
    let init = plugd_cmd(dir)
        .env("PLUGD_MASTER_KEY", TEST_MASTER_KEY)
        .args(["cluster", "init", "--state", url])
        .output()
        .unwrap();
    assert!(init.status.success(), "cluster init: {}", stderr(&init));
}

/// In the PostgreSQL pass, writes the suite's key ([`TEST_MASTER_KEY`])
/// into `path`, the key file a test's plugd processes use (mode 0600 in a
/// 0700 directory, as plugd makes it): the cluster's key; nothing otherwise
/// (plugd creates the file at first use).
pub fn test_key_file(path: &Path) {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    if !on_postgres() {
        return;
    }
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .unwrap();
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut f, format!("{TEST_MASTER_KEY}\n").as_bytes()).unwrap();
}

/// True in the PostgreSQL pass for a test about the workspace's SQLite
/// file itself (its upgrade, its corruption, its bytes): the test says why
/// on stderr and returns; it runs in the SQLite pass.
#[allow(clippy::print_stderr)] // the test's own output says why it returned
pub fn sqlite_only(why: &str) -> bool {
    if on_postgres() {
        eprintln!("runs in the SQLite pass only: {why}");
    }
    on_postgres()
}

/// Runs `fut` to its end on a runtime of its own (for plain `#[test]`s
/// reading the state store).
pub fn block_on<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(fut)
}

/// The environment that makes a plugd started by something else (an MCP
/// SDK's client, a pty driver) use `ws`'s state as [`plugd_cmd`] does.
pub fn plugd_env(ws: &Ws) -> Vec<(&'static str, String)> {
    match ws.state_url() {
        Some(url) => vec![
            ("PLUGD_STATE", url.to_owned()),
            ("PLUGD_MASTER_KEY", TEST_MASTER_KEY.to_owned()),
        ],
        None => Vec::new(),
    }
}

/// The environment an MCP SDK's client gives the `plugd mcp` it starts on
/// `ws` (a JSON object): the venv's PATH, info logs, HOME, and
/// [`plugd_env`].
pub fn client_env(ws: &Ws) -> serde_json::Value {
    let mut env = serde_json::json!({
        "PATH": path_with_venv(),
        "PLUGD_LOG": "info",
        "HOME": std::env::var("HOME").unwrap_or_default(),
    });
    for (k, v) in plugd_env(ws) {
        env[k] = v.into();
    }
    env
}

impl Drop for Ws {
    fn drop(&mut self) {
        if let Some(url) = self.state.take() {
            state_urls()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(_, u)| *u != url);
            plugd_store_pg::test_pg::TestPg::shared().drop_database(&url);
        }
    }
}

/// A `Command` for the plugd binary on `workspace`, with the venv on PATH
/// and the Landlock baseline unless the test sets `PLUGD_BASELINE=view`
/// ([`landlock_by_default`]); in the PostgreSQL pass, `PLUGD_STATE` names
/// the workspace's cluster database and `PLUGD_MASTER_KEY` is the suite's
/// key ([`TEST_MASTER_KEY`]), a test's own settings winning.
pub fn plugd_cmd(workspace: &Path) -> std::process::Command {
    #[allow(clippy::disallowed_methods)] // tests run the binary under test
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_plugd"));
    cmd.arg("--workspace")
        .arg(workspace)
        .env("PATH", path_with_venv())
        .env("PLUGD_BASELINE", "landlock")
        .env_remove("PLUGD_LOG")
        .env_remove("PLUGD_STATE");
    if let Some(url) = state_url(workspace) {
        cmd.env("PLUGD_STATE", url)
            .env("PLUGD_MASTER_KEY", TEST_MASTER_KEY);
    }
    cmd
}

/// Plugins without a sandbox run under the Landlock baseline in the tests,
/// in this process and in the plugd processes they start (`plugd_cmd`):
/// many tests compare the process ids a plugin reports with the host's,
/// and the view (the default, a PID namespace of its own) changes them.
/// The view's own tests (baseline.rs, insider.rs) pass `PLUGD_BASELINE=view`.
fn landlock_by_default() {
    plugd_host::sandbox::view::force_landlock("plugd's test suite (tests/it/support.rs)");
}

/// Host config with short timeouts for tests.
pub fn quick(tool_timeout_ms: u64) -> HostConfig {
    HostConfig {
        tool_timeout: Duration::from_millis(tool_timeout_ms),
        ..HostConfig::default()
    }
}

/// Polls `f` until it is true or `limit` passes.
pub async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

/// Polls `f` every 50 ms from a plain thread until it is true or `limit` passes.
pub fn eventually_blocking(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The stdout of a command that must have succeeded (else both streams).
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `plugd tool list --json` row of tool `name` in `list`.
pub fn tool_row(list: &serde_json::Value, name: &str) -> serde_json::Value {
    list.as_array()
        .unwrap_or_else(|| panic!("not a tool list: {list}"))
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {list}"))
        .clone()
}

/// SIGCONT to a stopped process when dropped (however the test ends).
pub struct Stopped(i32);

impl Stopped {
    /// SIGSTOP to `pid`.
    pub fn stop(pid: u32) -> Stopped {
        let p = rustix::process::Pid::from_raw(pid as i32).unwrap();
        rustix::process::kill_process(p, rustix::process::Signal::STOP).unwrap();
        Stopped(pid as i32)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(p) = rustix::process::Pid::from_raw(self.0) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::CONT);
        }
    }
}
