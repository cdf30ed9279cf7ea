//! cgroup v2 tracking of plugin processes, with real processes: a Python
//! plugin (tests/plugins/sandbox_probe.py `escape`) leaves three `sleep`s
//! behind (in its group, `setsid`, double-forked `setsid`). With a writable
//! cgroup2 hierarchy they all sit in the plugin's own
//! `plugd-<pid>-<start>/<id>-<n>` cgroup, and revoking the plugin through
//! serve kills them and removes the cgroup; with `PLUGD_CGROUP=off` the
//! `/proc` tracking alone kills the same processes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::baseline::{alive, cli, probe};
use crate::http::Serve;
use crate::support::*;

/// The unified-hierarchy path of `pid` (`/plugd-1-2/esc-1`), from
/// `/proc/<pid>/cgroup`.
fn cgroup_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap()
        .to_owned()
}

/// The cgroup2 mount point.
fn mount() -> PathBuf {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            right
                .starts_with("cgroup2 ")
                .then(|| PathBuf::from(left.split_whitespace().nth(4).unwrap()))
        })
        .unwrap()
}

/// `true` when this process may create cgroups where plugd would.
fn cgroup_writable() -> bool {
    let Some(base) = plugd_host::cgroup::base() else {
        return false;
    };
    let probe = base.join(format!("it-cgroup-probe-{}", std::process::id()));
    let ok = std::fs::create_dir(&probe).is_ok();
    let _ = std::fs::remove_dir(&probe);
    ok
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end && !done() {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(done(), "timed out waiting until {what}");
}

/// Starts serve (with `env`) in a workspace with the escaping probe `esc`
/// eager; the serve, the leader and the three escaped processes, each with
/// its start time.
fn serve_with_escapes(ws: &Ws, pidfile: &Path, env: &[(&str, &str)]) -> (Serve, Vec<(i32, u64)>) {
    probe(ws, "esc", &["escape", &pidfile.display().to_string()]);
    std::fs::write(ws.dir().join("plugd.yaml"), "eager: [esc]\n").unwrap();
    // Approving starts the plugin once: it must not escape then.
    std::fs::write(pidfile, "").unwrap();
    cli(ws, &["plugin", "approve", "esc"], &[]).unwrap();
    std::fs::remove_file(pidfile).unwrap();
    let serve = Serve::start_with_env(ws, env);
    wait_until("the plugin left its processes", || pidfile.exists());
    let pids: Vec<i32> = std::fs::read_to_string(pidfile)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 3);
    let leader = plugd_host::procs::stat(pids[0]).unwrap().pgrp;
    let procs: Vec<(i32, u64)> = std::iter::once(leader)
        .chain(pids)
        .map(|p| (p, plugd_host::procs::stat(p).unwrap().start))
        .collect();
    (serve, procs)
}

fn revoke_and_wait_for_the_kill(ws: &Ws, procs: &[(i32, u64)]) {
    let out = cli(ws, &["plugin", "revoke", "esc"], &[]).unwrap();
    assert!(out.contains("revoked esc"), "{out}");
    wait_until("no plugin process is left", || {
        procs.iter().all(|&(p, s)| !alive(p, s))
    });
}

#[test]
fn a_plugin_and_its_setsid_grandchild_share_a_cgroup_that_revoke_kills_and_removes() {
    let ws = Ws::new();
    if !cgroup_writable() {
        // Without a writable cgroup2 hierarchy plugd must say it tracks by
        // /proc only (the test below covers that path's kills).
        probe(&ws, "esc", &["escape", "/dev/null"]);
        let show = cli(&ws, &["plugin", "show", "esc", "--json"], &[]).unwrap();
        assert!(show.contains("/proc only"), "{show}");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let (serve, procs) = serve_with_escapes(&ws, &out.path().join("pids"), &[]);
    let serve_pid = serve.child.id() as i32;
    let serve_start = plugd_host::procs::stat(serve_pid).unwrap().start;

    // The leader's cgroup is `<own>/plugd-<serve pid>-<start>/esc-<n>`.
    let path = cgroup_of(procs[0].0);
    let root_name = format!("plugd-{serve_pid}-{serve_start}");
    let (parent, leaf) = path.rsplit_once('/').unwrap();
    assert!(parent.ends_with(&format!("/{root_name}")), "{path}");
    assert!(leaf.starts_with("esc-"), "{path}");
    let dir = mount().join(path.trim_start_matches('/'));
    let listed: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    // The leader, the one in its group, the setsid one and the
    // double-forked setsid grandchild: all in the same cgroup.
    for &(p, _) in &procs {
        assert!(listed.contains(&p), "{p} not in {listed:?} ({path})");
        assert_eq!(cgroup_of(p), path, "{p}");
    }

    // `plugin show` names the mechanism (the CLI's own cgroup, as the CLI
    // tracks what it starts itself).
    let show = cli(&ws, &["plugin", "show", "esc"], &[]).unwrap();
    assert!(show.contains("  tracking:  cgroup v2 ("), "{show}");
    assert!(show.contains("/esc-<n>), /proc as the backstop"), "{show}");

    // Revoked through serve: the plugin stops, serve keeps running.
    revoke_and_wait_for_the_kill(&ws, &procs);
    wait_until("the plugin's cgroup is removed", || !dir.exists());
    assert!(
        dir.parent().unwrap().exists(),
        "serve's own cgroup goes only at exit"
    );

    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(
        !dir.parent().unwrap().exists(),
        "serve's cgroup {} is left after its exit\n{log}",
        dir.parent().unwrap().display()
    );
}

#[test]
fn with_plugd_cgroup_off_the_proc_tracking_kills_the_same_processes() {
    let ws = Ws::new();
    let out = tempfile::tempdir().unwrap();
    let (serve, procs) =
        serve_with_escapes(&ws, &out.path().join("pids"), &[("PLUGD_CGROUP", "off")]);
    let serve_pid = serve.child.id();
    for &(p, _) in &procs {
        let path = cgroup_of(p);
        assert!(!path.contains("/plugd-"), "{p} is in cgroup {path}");
    }
    if let Some(base) = plugd_host::cgroup::base() {
        let none = std::fs::read_dir(&base).unwrap().flatten().all(|e| {
            !e.file_name()
                .to_string_lossy()
                .starts_with(&format!("plugd-{serve_pid}-"))
        });
        assert!(none, "serve made a cgroup under {}", base.display());
    }
    // Only what the /proc tracker saw can be killed: wait until it has
    // recorded all of them (the double-forked one is no longer below the
    // leader by the time the pid file exists).
    let records = ws.dir().join(".plugd/procs");
    let recorded = |pid: i32| crate::baseline::recorded_in(&records, pid);
    wait_until("the tracker recorded every process", || {
        procs.iter().all(|&(p, _)| recorded(p))
    });

    let show = cli(
        &ws,
        &["plugin", "show", "esc", "--json"],
        &[("PLUGD_CGROUP", "off".into())],
    )
    .unwrap();
    assert!(
        show.contains(r#""process_tracking":"/proc only (PLUGD_CGROUP=off)""#)
            || show.contains(r#""process_tracking": "/proc only (PLUGD_CGROUP=off)""#),
        "{show}"
    );

    revoke_and_wait_for_the_kill(&ws, &procs);
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("PLUGD_CGROUP=off"), "{log}");
}
