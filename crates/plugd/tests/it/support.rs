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

/// A temporary workspace.
pub struct Ws {
    pub tmp: tempfile::TempDir,
}

impl Ws {
    pub fn new() -> Ws {
        landlock_by_default();
        Ws {
            tmp: tempfile::tempdir().unwrap(),
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

    /// Opens the runtime with `config`.
    pub async fn runtime(&self, config: HostConfig) -> Runtime {
        plugd_agent::open(self.dir(), config).await.unwrap()
    }

    /// Runs the plugd binary on this workspace.
    pub fn plugd(&self, args: &[&str]) -> Output {
        plugd_cmd(self.dir()).args(args).output().unwrap()
    }
}

/// A `Command` for the plugd binary on `workspace`, with the venv on PATH
/// and the Landlock baseline unless the test sets `PLUGD_BASELINE=view`
/// ([`landlock_by_default`]).
pub fn plugd_cmd(workspace: &Path) -> std::process::Command {
    #[allow(clippy::disallowed_methods)] // tests run the binary under test
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_plugd"));
    cmd.arg("--workspace")
        .arg(workspace)
        .env("PATH", path_with_venv())
        .env("PLUGD_BASELINE", "landlock")
        .env_remove("PLUGD_LOG");
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
