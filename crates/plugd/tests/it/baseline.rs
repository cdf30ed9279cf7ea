//! Containment by default: a real Python plugin without a sandbox (and one
//! whose sandbox the operator turned off) tries to read plugd's state
//! database, the master key file, another plugin's directory and plugd's
//! own `/proc/<pid>/environ`; the view (the default) shows none of them
//! (`ENOENT`), the Landlock fallback (forced with `PLUGD_BASELINE=landlock`)
//! refuses each with `EACCES`, and the per-plugin opt-out shows the same
//! reads succeed. Then `kill -9` of `plugd serve` with a plugin that left
//! processes behind (in its group, `setsid`, double-forked): under Landlock
//! the next serve kills them all; in the view they die with serve.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::http::Serve;
use crate::support::*;

const MASTER_KEY: &str = crate::support::TEST_MASTER_KEY;

/// A native probe plugin `id` (tests/plugins/sandbox_probe.py) with `args`
/// after its id.
pub(crate) fn probe(ws: &Ws, id: &str, args: &[&str]) {
    let dir = ws.plugin_dir(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/sandbox_probe.py"),
        dir.join("sandbox_probe.py"),
    )
    .unwrap();
    let args: String = args.iter().map(|a| format!(", \"{a}\"")).collect();
    let manifest = format!(
        "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"sandbox_probe.py\", \"{id}\"{args}]\n\n[plugin.extends]\ntools = [\"{id}_probe\"]\n"
    );
    std::fs::write(dir.join("nexo-plugin.toml"), manifest).unwrap();
}

/// Runs the CLI with `env`; `Ok(stdout)` or `Err(stderr)`.
pub(crate) fn cli(ws: &Ws, args: &[&str], env: &[(&str, String)]) -> Result<String, String> {
    let out = plugd_cmd(ws.dir())
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    if out.status.success() {
        Ok(stdout(&out))
    } else {
        Err(stderr(&out))
    }
}

fn call(ws: &Ws, id: &str, args: Value, env: &[(&str, String)]) -> Value {
    let out = cli(
        ws,
        &[
            "tool",
            "call",
            &format!("{id}_probe"),
            "--args",
            &args.to_string(),
        ],
        env,
    )
    .unwrap();
    serde_json::from_str(&out).unwrap()
}

fn read(ws: &Ws, id: &str, p: &Path, env: &[(&str, String)]) -> Value {
    call(ws, id, json!({"op": "read", "path": p}), env)
}

/// The baseline's mechanism a test runs under.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// The default: the view (a mount namespace).
    View,
    /// `PLUGD_BASELINE=landlock`.
    Landlock,
}

impl Mode {
    /// How a hidden path fails: absent in the view, refused by Landlock.
    fn denied(self, p: &Path) -> String {
        match self {
            Mode::View => format!(
                "FileNotFoundError: [Errno 2] No such file or directory: '{}'",
                p.display()
            ),
            Mode::Landlock => format!(
                "PermissionError: [Errno 13] Permission denied: '{}'",
                p.display()
            ),
        }
    }
}

#[test]
fn an_unsandboxed_plugin_cannot_read_plugd_state_keys_other_plugins_or_plugd_env() {
    if crate::support::sqlite_only("a plugin's reads of the SQLite state file (`.plugd/state.db`)")
    {
        return;
    }
    hidden_from_unsandboxed_plugins(Mode::View);
}

#[test]
fn the_landlock_fallback_refuses_the_same_reads() {
    if crate::support::sqlite_only("a plugin's reads of the SQLite state file (`.plugd/state.db`)")
    {
        return;
    }
    hidden_from_unsandboxed_plugins(Mode::Landlock);
}

fn hidden_from_unsandboxed_plugins(mode: Mode) {
    let ws = Ws::new();
    // Plugin "bare" has no sandbox section; the operator turned the sandbox
    // off for "off" and opted "optout" out of the baseline.
    for id in ["bare", "off", "optout"] {
        probe(&ws, id, &[]);
    }
    let policy =
        "sandbox:\n  plugins:\n    \"off\": {enabled: false}\n    optout: {baseline: false}\n";
    std::fs::write(ws.dir().join("plugd.yaml"), policy).unwrap();
    let other = ws.plugin_dir("other");
    std::fs::create_dir_all(&other).unwrap();
    let other_secret = other.join("secret.txt");
    std::fs::write(&other_secret, "other plugin's secret").unwrap();
    std::fs::write(ws.dir().join("notes.txt"), "workspace file").unwrap();
    // The master key file where plugd looks for it ($XDG_CONFIG_HOME).
    let config_home = tempfile::tempdir().unwrap();
    let key_file = config_home.path().join("plugd/master.key");
    std::fs::create_dir_all(key_file.parent().unwrap()).unwrap();
    std::fs::write(&key_file, MASTER_KEY).unwrap();
    let mut env = vec![
        ("XDG_CONFIG_HOME", config_home.path().display().to_string()),
        ("PLUGD_MASTER_KEY", MASTER_KEY.to_owned()),
    ];
    env.push((
        "PLUGD_BASELINE",
        match mode {
            Mode::View => "view",
            Mode::Landlock => "landlock",
        }
        .to_owned(),
    ));
    let env = &env[..];
    let denied = |p: &Path| mode.denied(p);
    for id in ["bare", "off", "optout"] {
        cli(&ws, &["plugin", "approve", id], env).unwrap();
        std::fs::create_dir_all(ws.dir().join(".plugd/state").join(id)).unwrap();
    }
    let state_db = ws.dir().join(".plugd/state.db");
    assert!(state_db.is_file());

    for id in ["bare", "off"] {
        for p in [&state_db, &key_file, &other_secret] {
            assert_eq!(
                read(&ws, id, p, env),
                json!({"ok": false, "error": denied(p)}),
                "{id} reading {}",
                p.display()
            );
        }
        let environ = call(&ws, id, json!({"op": "parent_environ"}), env);
        match mode {
            // Its parent is bwrap's init in its own PID namespace, which
            // has only the plugin's environment; plugd is not there.
            Mode::View => assert_eq!(
                environ,
                json!({"ok": true, "has_master_key": false}),
                "{id}"
            ),
            Mode::Landlock => {
                let err = environ["error"].as_str().unwrap_or_default();
                assert!(
                    err.starts_with("PermissionError: [Errno 13] Permission denied: '/proc/")
                        && err.ends_with("/environ'"),
                    "{id}: {environ}"
                );
            }
        }
        // It runs from its pin: its source directory is hidden like any
        // other plugin's (it is mutable and not what was approved).
        let source = ws.plugin_dir(id).join("sandbox_probe.py");
        assert_eq!(
            read(&ws, id, &source, env),
            json!({"ok": false, "error": denied(&source)}),
            "{id} reading its source"
        );
        // What is its own (the pin it runs from, relative to its working
        // directory), and the rest of the machine, stays readable.
        for p in [
            PathBuf::from("sandbox_probe.py"),
            ws.dir().join("notes.txt"),
            PathBuf::from("/etc/hostname"),
        ] {
            assert_eq!(read(&ws, id, &p, env)["ok"], json!(true), "{id}: {p:?}");
        }
        let own_state = ws.dir().join(".plugd/state").join(id).join("f");
        assert_eq!(
            call(&ws, id, json!({"op": "write", "path": own_state}), env),
            json!({"ok": true})
        );
        assert_eq!(std::fs::read_to_string(&own_state).unwrap(), "x");
        let not_own = ws.dir().join(".plugd/state/optout/f");
        assert_eq!(
            call(&ws, id, json!({"op": "write", "path": not_own}), env),
            json!({"ok": false, "error": denied(&not_own)})
        );
        // Its pin is read-only in the view (Landlock allows it whole).
        if mode == Mode::View {
            let in_pin = call(&ws, id, json!({"op": "write", "path": "planted.py"}), env);
            assert!(
                in_pin["error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("OSError: [Errno 30] Read-only file system")),
                "{id}: {in_pin}"
            );
        }

        let show = cli(&ws, &["plugin", "show", id], env).unwrap();
        let want = match mode {
            Mode::View => "  baseline:  on, view (bubblewrap mount namespace)",
            Mode::Landlock => "  baseline:  on, landlock (ABI ",
        };
        assert!(show.contains(want), "{show}");
        let hidden = show
            .lines()
            .find(|l| l.starts_with("    hidden:  "))
            .unwrap_or_default();
        for p in [
            key_file.parent().unwrap().to_path_buf(),
            ws.dir().join(".plugd"),
            ws.dir().join(".plugins"),
        ] {
            assert!(hidden.contains(&p.display().to_string()), "{p:?}\n{show}");
        }
        let json: Value =
            serde_json::from_str(&cli(&ws, &["plugin", "show", id, "--json"], env).unwrap())
                .unwrap();
        let b = &json["permissions"]["baseline"];
        assert_eq!(b["state"], "on", "{json}");
        // The directory it runs from (its pin) is what stays allowed.
        let cwd = json["cwd"].as_str().unwrap();
        assert!(cwd.contains("/.plugd/pins/"), "{json}");
        assert!(
            b["allowed"].as_array().unwrap().contains(&json!(cwd)),
            "{b}"
        );
        if mode == Mode::View {
            // Its pin and plugd.yaml read-only; its state directory is not.
            let ro = b["read_only"].as_array().unwrap();
            assert!(ro.contains(&json!(cwd)), "{b}");
            let yaml = ws.dir().join("plugd.yaml").canonicalize().unwrap();
            assert!(ro.contains(&json!(yaml)), "{b}");
            assert!(
                !ro.iter().any(|p| p.as_str().unwrap().contains("/state/")),
                "{b}"
            );
        }
    }
    // The opt-out: the same reads succeed (so the checks above can fail).
    for p in [&state_db, &key_file, &other_secret] {
        assert_eq!(
            read(&ws, "optout", p, env)["ok"],
            json!(true),
            "{}",
            p.display()
        );
    }
    assert_eq!(
        call(&ws, "optout", json!({"op": "parent_environ"}), env),
        json!({"ok": true, "has_master_key": true})
    );
    let show = cli(&ws, &["plugin", "show", "optout"], env).unwrap();
    assert!(
        show.contains(
            "  baseline:  off: opted out: plugd.yaml sandbox.plugins.optout.baseline is false"
        ),
        "{show}"
    );
}

/// `true` while `pid` is the process that started at `start` and is not a
/// zombie.
pub(crate) fn alive(pid: i32, start: u64) -> bool {
    plugd_host::procs::stat(pid).is_some_and(|s| s.start == start && s.state != 'Z')
}

#[test]
fn kill_9_of_serve_leaves_no_plugin_process_after_the_next_serve() {
    let ws = Ws::new();
    let out = tempfile::tempdir().unwrap();
    let pidfile = out.path().join("pids");
    probe(&ws, "esc", &["escape", &pidfile.display().to_string()]);
    std::fs::write(ws.dir().join("plugd.yaml"), "eager: [esc]\n").unwrap();
    // Approving starts the plugin once: it must not escape then.
    std::fs::write(&pidfile, "").unwrap();
    cli(&ws, &["plugin", "approve", "esc"], &[]).unwrap();
    std::fs::remove_file(&pidfile).unwrap();

    let first = Serve::start_with_env(&ws, &[]);
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < end && !pidfile.exists() {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(pidfile.exists(), "the plugin did not leave its processes");
    let pids: Vec<i32> = std::fs::read_to_string(&pidfile)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 3);
    let procs: Vec<(i32, u64)> = pids
        .iter()
        .map(|&p| (p, plugd_host::procs::stat(p).unwrap().start))
        .collect();
    // The one that stayed in the group, and the two that left it.
    let leader = plugd_host::procs::stat(procs[0].0).unwrap().pgrp;
    assert_ne!(plugd_host::procs::stat(procs[1].0).unwrap().pgrp, leader);
    assert_ne!(plugd_host::procs::stat(procs[2].0).unwrap().pgrp, leader);
    // Wait until serve's tracker has recorded all three under .plugd/procs.
    let records = ws.dir().join(".plugd/procs");
    let recorded = |pid: i32| recorded_in(&records, pid);
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < end && !pids.iter().all(|&p| recorded(p)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        pids.iter().all(|&p| recorded(p)),
        "not all of {pids:?} recorded"
    );

    // kill -9: the plugin's leader dies with serve, its processes do not.
    let first_pid = first.child.id();
    let mut first = first;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(first);
    std::thread::sleep(Duration::from_millis(300));
    for &(p, s) in &procs {
        assert!(alive(p, s), "{p} should have outlived the killed serve");
    }

    let second = Serve::start_with_env(&ws, &[]);
    let (status, log) = second.stop();
    assert!(status.success(), "{log}");
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < end && procs.iter().any(|&(p, s)| alive(p, s)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<i32> = procs
        .iter()
        .filter(|&&(p, s)| alive(p, s))
        .map(|&(p, _)| p)
        .collect();
    assert!(left.is_empty(), "still running: {left:?}\n{log}");
    assert!(log.contains("killed processes a previous plugd"), "{log}");
    // With cgroup v2, the killed serve's cgroups went with its processes.
    if let Some(base) = plugd_host::cgroup::base() {
        let prefix = format!("plugd-{first_pid}-");
        let stale: Vec<String> = std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        assert!(stale.is_empty(), "{stale:?} left in {}", base.display());
    }
}

#[test]
fn kill_9_of_serve_takes_the_view_with_it() {
    let ws = Ws::new();
    let out = tempfile::tempdir().unwrap();
    let pidfile = out.path().join("pids");
    probe(&ws, "esc", &["escape", &pidfile.display().to_string()]);
    std::fs::write(ws.dir().join("plugd.yaml"), "eager: [esc]\n").unwrap();
    std::fs::write(&pidfile, "").unwrap();
    let view = [("PLUGD_BASELINE", "view")];
    cli(
        &ws,
        &["plugin", "approve", "esc"],
        &[("PLUGD_BASELINE", "view".to_owned())],
    )
    .unwrap();
    std::fs::remove_file(&pidfile).unwrap();

    let first = Serve::start_with_env(&ws, &view);
    // The pids the plugin writes are its PID namespace's; serve's tracker
    // records the host's: bwrap, its init, python and the three sleepers.
    assert!(
        eventually_blocking(Duration::from_secs(30), || pidfile.exists()),
        "the plugin did not leave its processes"
    );
    let records = ws.dir().join(".plugd/procs");
    let recorded = || -> Vec<(i32, u64)> {
        std::fs::read_dir(&records)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|e| {
                std::fs::read_to_string(e.path())
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| {
                        let mut f = l.strip_prefix("proc ")?.split_whitespace();
                        Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let sleeping = |procs: &[(i32, u64)]| {
        procs
            .iter()
            .filter(|(p, _)| {
                std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == b"sleep\x001000\x00")
            })
            .count()
    };
    assert!(
        eventually_blocking(Duration::from_secs(30), || sleeping(&recorded()) == 3),
        "{:?}",
        recorded()
    );
    // (The double fork's middle process has exited by now.)
    let procs: Vec<(i32, u64)> = recorded()
        .into_iter()
        .filter(|&(p, s)| alive(p, s))
        .collect();
    assert_eq!(sleeping(&procs), 3, "{procs:?}");
    assert!(
        procs.len() >= 5,
        "bwrap, its init, python, 3 sleepers: {procs:?}"
    );
    let mut first = first;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    // bwrap dies with serve (--die-with-parent), and with its init the
    // whole PID namespace: no next serve is needed.
    assert!(
        eventually_blocking(Duration::from_secs(10), || procs
            .iter()
            .all(|&(p, s)| !alive(p, s))),
        "still running: {:?}",
        procs
            .iter()
            .filter(|&&(p, s)| alive(p, s))
            .collect::<Vec<_>>()
    );
    drop(first);
    let second = Serve::start_with_env(&ws, &view);
    let (status, log) = second.stop();
    assert!(status.success(), "{log}");
}

/// Whether a process record under `records` (`.plugd/procs`) names `pid`.
pub(crate) fn recorded_in(records: &Path, pid: i32) -> bool {
    std::fs::read_dir(records)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .lines()
                .any(|l| l.starts_with(&format!("proc {pid} ")))
        })
}
