//! Approval pins what actually runs: starts run from the read-only pin (a swap in the source never runs), symlinks leaving the plugin are refused, concurrent approvals leave one approval, containment-like unknown manifest keys are refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::http::Serve;
use crate::support::{Ws, quick, repo, stderr, stdout};

/// The good entry file, and an evil one that first creates `marker`.
fn good_and_evil(marker: &Path) -> (String, String) {
    let good = std::fs::read_to_string(repo().join("tests/plugins/misbehave.py")).unwrap();
    let evil = format!(
        "open({:?}, \"w\").close()\n{good}",
        marker.display().to_string()
    );
    (good, evil)
}

/// Replaces `path` with `text` atomically (write aside, rename over).
fn swap(path: &Path, text: &str) {
    let tmp = path.with_extension("swap");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Gives the owner write access to a (read-only) pin, as an attacker with
/// the same uid could.
fn make_writable(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(p).unwrap();
    if meta.file_type().is_symlink() {
        return;
    }
    let mode = meta.permissions().mode() | 0o200;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    if meta.is_dir() {
        for e in std::fs::read_dir(p).unwrap().flatten() {
            make_writable(&e.path());
        }
    }
}

fn pins_of(ws: &Ws) -> PathBuf {
    ws.dir().join(".plugd/pins")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_swapped_after_approval_never_runs_while_starting_in_a_loop() {
    let ws = Ws::new();
    let dir = ws.misbehave("racer", "good", None, "");
    let marker = ws.dir().join("MARKER-racer");
    let (good, evil) = good_and_evil(&marker);
    let rt = ws.runtime(quick(10_000)).await;
    let info = rt.approve("racer", "test").await.unwrap();
    assert!(info.approved, "{info:?}");
    let cwd = info.cwd.clone().unwrap();
    assert!(
        cwd.starts_with(pins_of(&ws).canonicalize().unwrap()),
        "runs from the pin: {cwd:?}"
    );

    // A swapper flips the entry file between evil and good as fast as it can.
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps, entry) = (stop.clone(), swaps.clone(), dir.join("misbehave.py"));
        let (good, evil) = (good.clone(), evil.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                swap(&entry, &evil);
                swap(&entry, &good);
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Meanwhile: stop, start (through a call) and call, again and again.
    let sup = rt.supervised("racer").unwrap().clone();
    let end = Instant::now() + Duration::from_secs(12);
    let (mut starts, mut answered, mut refused) = (0u32, 0u32, 0u32);
    while Instant::now() < end && starts < 400 {
        sup.reset().await;
        starts += 1;
        match rt.call_tool("racer_echo", json!({"i": starts}), None).await {
            Ok(v) => {
                assert_eq!(v, json!({"echo": {"i": starts}}));
                answered += 1;
            }
            Err(e) => {
                let text = e.to_string();
                assert!(
                    text.contains("changed")
                        || text.contains("cannot read")
                        || text.contains("hashed"),
                    "only the gate refuses: {text}"
                );
                refused += 1;
            }
        }
        assert!(
            !marker.exists(),
            "swapped code ran after {starts} starts ({answered} answered)"
        );
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(
        starts >= 10 && answered >= 1 && swaps.load(Ordering::Relaxed) >= 100,
        "the race ran: {starts} starts, {answered} answered, {refused} refused, {} swaps",
        swaps.load(Ordering::Relaxed)
    );
    rt.shutdown().await;
    assert!(!marker.exists(), "no swapped code ever ran");

    // The swapped source now shows as changed and does not start.
    swap(&dir.join("misbehave.py"), &evil);
    let out = ws.plugd(&["plugin", "list"]);
    let text = stdout(&out);
    let row = text.lines().find(|l| l.contains("racer")).unwrap_or("");
    assert!(row.contains("changed"), "{text}");
    let out = ws.plugd(&["tool", "call", "racer_echo", "--args", "{}"]);
    assert!(!out.status.success());
    assert!(!marker.exists(), "a changed plugin does not run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_or_missing_pin_refuses_the_start_naming_it() {
    let ws = Ws::new();
    ws.misbehave("tamper", "good", None, "");
    let rt = ws.runtime(quick(10_000)).await;
    let info = rt.approve("tamper", "test").await.unwrap();
    let pin = info.cwd.clone().unwrap();
    rt.shutdown().await;
    // Edit the pin behind plugd's back.
    make_writable(&pin);
    let entry = pin.join("misbehave.py");
    let mut text = std::fs::read_to_string(&entry).unwrap();
    text.push_str("\n# tampered\n");
    std::fs::write(&entry, text).unwrap();
    let err = rt
        .call_tool("tamper_echo", json!({}), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&pin.display().to_string())
            && err.contains("was modified")
            && err.contains("plugd plugin approve tamper"),
        "{err}"
    );
    // A missing pin is not re-created silently.
    let out = ws.plugd(&["plugin", "revoke", "tamper"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!pin.exists(), "revoke removes the pin");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("tamper", "test").await.unwrap();
    let pin = rt.plugin("tamper").await.unwrap().cwd.unwrap();
    rt.shutdown().await;
    make_writable(&pin);
    std::fs::remove_dir_all(&pin).unwrap();
    let err = rt
        .call_tool("tamper_echo", json!({}), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is missing") && err.contains("plugd plugin approve tamper"),
        "{err}"
    );
    assert!(!pin.exists(), "the start did not re-create it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_are_read_only_shared_by_content_and_removed_with_their_last_approval() {
    let ws = Ws::new();
    ws.misbehave("twin_a", "good", None, "");
    // Its own id, so its own manifest and its own pin.
    ws.misbehave("twin_b", "good", None, "");
    let rt = ws.runtime(quick(10_000)).await;
    let a = rt.approve("twin_a", "test").await.unwrap().cwd.unwrap();
    let b = rt.approve("twin_b", "test").await.unwrap().cwd.unwrap();
    assert_ne!(a, b);
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&a), 0o555);
    assert_eq!(mode(&a.join("misbehave.py")), 0o444);
    assert_eq!(mode(&a.join("nexo-plugin.toml")), 0o444);
    // `plugin show` names the pin as the working directory.
    let out = ws.plugd(&["plugin", "show", "twin_a"]);
    assert!(
        stdout(&out).contains(&format!("cwd:       {}", a.display())),
        "{}",
        stdout(&out)
    );
    // Re-approval of edited files makes a new pin and drops the old one.
    let manifest = ws.plugin_dir("twin_a").join("nexo-plugin.toml");
    let mut text = std::fs::read_to_string(&manifest).unwrap();
    text.push_str("\n# edited\n");
    std::fs::write(&manifest, text).unwrap();
    let a2 = rt.approve("twin_a", "test").await.unwrap().cwd.unwrap();
    assert_ne!(a, a2);
    assert!(!a.exists(), "the old pin is gone");
    assert_eq!(
        rt.call_tool("twin_a_echo", json!({"v": 2}), None)
            .await
            .unwrap(),
        json!({"echo": {"v": 2}})
    );
    rt.revoke("twin_a").await.unwrap();
    assert!(!a2.exists(), "revoke removes the pin");
    assert!(b.exists(), "another plugin's pin stays");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_out_of_the_plugin_is_refused_naming_link_and_target() {
    let ws = Ws::new();
    let dir = ws.misbehave("linky", "good", None, "");
    let outside = ws.dir().join("outside-helper.py");
    let marker = ws.dir().join("MARKER-linky");
    std::fs::write(&outside, "X = 1\n").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("helper.py")).unwrap();

    let out = ws.plugd(&["plugin", "approve", "linky"]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&dir.join("helper.py").display().to_string())
            && err.contains(&outside.display().to_string())
            && err.contains("outside the plugin directory"),
        "{err}"
    );
    // The entry now imports the helper; the helper's target is edited to
    // create a marker: nothing runs.
    let (good, _) = good_and_evil(&marker);
    std::fs::write(dir.join("misbehave.py"), format!("import helper\n{good}")).unwrap();
    std::fs::write(
        &outside,
        format!("open({:?}, \"w\").close()\n", marker.display().to_string()),
    )
    .unwrap();
    let out = ws.plugd(&["plugin", "approve", "linky"]);
    assert!(!out.status.success());
    let out = ws.plugd(&["tool", "call", "linky_echo", "--args", "{}"]);
    assert!(!out.status.success());
    assert!(!marker.exists(), "nothing of the plugin ran");
    let pins = pins_of(&ws);
    let left: Vec<String> = std::fs::read_dir(&pins)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != ".lock" && n != "by-plugin")
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "no pin or staging left: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_inside_the_plugin_are_kept_and_point_into_the_pin() {
    let ws = Ws::new();
    let dir = ws.misbehave("inlink", "good", None, "");
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::rename(dir.join("misbehave.py"), dir.join("lib/real.py")).unwrap();
    // An absolute link into the plugin itself, and a relative one.
    std::os::unix::fs::symlink(dir.join("lib/real.py"), dir.join("misbehave.py")).unwrap();
    std::os::unix::fs::symlink("real.py", dir.join("lib/alias.py")).unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    let pin = rt.approve("inlink", "test").await.unwrap().cwd.unwrap();
    assert_eq!(
        std::fs::read_link(pin.join("misbehave.py")).unwrap(),
        Path::new("lib/real.py"),
        "rewritten relative, never back at the source"
    );
    assert_eq!(
        std::fs::read_link(pin.join("lib/alias.py")).unwrap(),
        Path::new("real.py")
    );
    assert_eq!(
        rt.call_tool("inlink_echo", json!({"ok": true}), None)
            .await
            .unwrap(),
        json!({"echo": {"ok": true}})
    );
    // Editing the (source) link target is an edit of the plugin.
    std::fs::write(dir.join("lib/real.py"), "raise SystemExit(5)\n").unwrap();
    rt.shutdown().await;
    let err = rt
        .call_tool("inlink_echo", json!({}), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("changed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_parallel_approvals_leave_the_plugin_approved_once() {
    let ws = Ws::new();
    ws.misbehave("many", "good", None, "");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("many", "first").await.unwrap();
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let rt = rt.clone();
            tokio::spawn(async move { rt.approve("many", &format!("op{i}")).await })
        })
        .collect();
    for t in tasks {
        let info = t.await.unwrap().unwrap();
        assert!(info.approved, "{info:?}");
    }
    let info = rt.plugin("many").await.unwrap();
    assert!(info.approved, "{info:?}");
    assert!(info.tools.iter().any(|t| t == "many_echo"), "{info:?}");
    let approvals = rt.state().approvals().await.unwrap();
    assert_eq!(
        approvals.iter().filter(|a| a.plugin_id == "many").count(),
        1
    );
    assert_eq!(
        rt.call_tool("many_echo", json!({"n": 50}), None)
            .await
            .unwrap(),
        json!({"echo": {"n": 50}})
    );
    // Exactly one pin is left for it.
    let pins: Vec<_> = std::fs::read_dir(pins_of(&ws))
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_dir() && e.file_name() != "by-plugin")
        .collect();
    assert_eq!(pins.len(), 1, "{pins:?}");
    rt.shutdown().await;
}

#[tokio::test]
async fn fifty_parallel_approvals_through_serve_leave_the_plugin_approved_once() {
    let ws = Ws::new();
    ws.misbehave("viaserve", "good", None, "");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let r = serve.post("/v1/plugins/viaserve:approve", &json!({"by": "first"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let serve = Arc::new(serve);
    let threads: Vec<_> = (0..50)
        .map(|i| {
            let serve = serve.clone();
            std::thread::spawn(move || {
                serve.post(
                    "/v1/plugins/viaserve:approve",
                    &json!({"by": format!("op{i}")}),
                )
            })
        })
        .collect();
    for t in threads {
        let r = t.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let rows = serve.get("/v1/plugins").json();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "viaserve")
        .unwrap()
        .clone();
    assert_eq!(row["approved"], true, "{row}");
    assert!(
        row["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "viaserve_echo"),
        "{row}"
    );
    let r = serve.post("/v1/tools/viaserve_echo:invoke", &json!({"args": {"n": 1}}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("\"n\":1"), "{}", r.text());
    let Ok(serve) = Arc::try_unwrap(serve) else {
        panic!("threads still hold serve")
    };
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    let approvals = ws.state().await.approvals().await.unwrap();
    assert_eq!(
        approvals
            .iter()
            .filter(|a| a.plugin_id == "viaserve")
            .count(),
        1
    );
}

#[test]
fn misspelled_sandbox_section_is_refused_and_listed_invalid() {
    let ws = Ws::new();
    ws.misbehave("typo", "good", None, "\n[plugin.sandbx]\nenabled = true\n");
    let out = ws.plugd(&["plugin", "list"]);
    let text = stdout(&out);
    let row = text.lines().find(|l| l.contains("typo")).unwrap_or("");
    assert!(row.contains("invalid"), "{text}");
    let out = ws.plugd(&["plugin", "list", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "typo")
        .unwrap();
    let reason = row["error"].as_str().unwrap_or("");
    assert!(
        reason.contains("plugin.sandbx") && reason.contains("\"sandbox\""),
        "{row}"
    );
    let out = ws.plugd(&["plugin", "approve", "typo"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("plugin.sandbx"), "{}", stderr(&out));
}

#[test]
fn unknown_key_inside_the_sandbox_section_is_refused() {
    let ws = Ws::new();
    ws.misbehave(
        "sbkey",
        "good",
        None,
        "\n[plugin.sandbox]\nenabled = true\nallow_everything = true\n",
    );
    let out = ws.plugd(&["plugin", "approve", "sbkey"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("plugin.sandbox.allow_everything"), "{err}");
    let out = ws.plugd(&["plugin", "list"]);
    let text = stdout(&out);
    let row = text.lines().find(|l| l.contains("sbkey")).unwrap_or("");
    assert!(row.contains("invalid"), "{text}");
}

#[test]
fn harmless_unknown_key_is_approved_and_approve_prints_the_warning() {
    let ws = Ws::new();
    let dir = ws.misbehave("harmless", "good", None, "");
    let manifest = dir.join("nexo-plugin.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let text = text.replacen(
        "version = \"0.1.0\"\n",
        "version = \"0.1.0\"\nhomepage = \"https://example.org\"\n",
        1,
    );
    std::fs::write(&manifest, text).unwrap();
    let out = ws.plugd(&["plugin", "approve", "harmless"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("approved harmless"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("warning: plugin.homepage: unknown key ignored"),
        "{}",
        stderr(&out)
    );
}
