//! Execution classes of VAI packages with real processes and real bwrap: each export runs in the process of its class with that process's own sandbox.
//!
//! `tests/plugins/vai/vai_classes.py` reports, for every request, its
//! process (a token drawn at its start; its pid is its sandbox's),
//! its scratch directory and what its sandbox let it do (a TCP connect, a
//! write in its scratch directory and elsewhere, a listing of the scratch
//! directory's parent). The package mixes isolated exports with and without
//! network, an isolated export granted scratch (a process per invocation),
//! worker exports, a hook, a compactor, a harness, an export that claims
//! `inline`, and one that exits in the middle of its call.

use plugd_dialects::vai::{self, CompactRequest, HarnessRequest};
use plugd_host::dialect::CallContext;
use plugd_host::groups::ProcessInfo;
use plugd_host::{CallToolError, Status};
use plugd_runtime::{Runtime, RuntimeError};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::{Ws, eventually, quick, repo, stderr, stdout};

const ID: &str = "test/classes";

/// The exports: id, kind, then the lines of its section.
const EXPORTS: &[(&str, &str, &str)] = &[
    (
        "net",
        "tool",
        "execution_class = \"isolated\"\n[exports.permissions]\nnetwork = \"egress\"\n",
    ),
    (
        "quiet",
        "tool",
        "execution_class = \"isolated\"\n[exports.permissions]\nnetwork = \"none\"\n",
    ),
    (
        "scratch",
        "tool",
        "[exports.permissions]\nfilesystem = \"scratch\"\n",
    ),
    (
        "work_a",
        "tool",
        "execution_class = \"worker\"\n[exports.permissions]\nfilesystem = \"scratch\"\n",
    ),
    ("work_b", "tool", "execution_class = \"worker\"\n"),
    (
        "claims_inline",
        "tool",
        "execution_class = \"inline\"\n[exports.permissions]\nnetwork = \"egress\"\n",
    ),
    ("crash", "tool", ""),
    (
        "notify",
        "hook",
        "[exports.hook]\nsubscribes_to = [\"run.completed\"]\n",
    ),
    ("window", "compactor", ""),
    (
        "triage",
        "harness",
        "[exports.harness]\nmode = \"composite\"\n",
    ),
];

/// The manifest of package `package_id`.
fn manifest(package_id: &str) -> String {
    let mut m = format!(
        "api_version = \"vai.plugin.v1\"\npackage_id = \"{package_id}\"\nversion = \"0.1.0\"\n\n[runtime]\nprotocol = \"vai.rpc.v1\"\ntransport = \"stdio\"\nentrypoint = [\"python3\", \"plugin.py\", \"{package_id}\", \"0.1.0\"]\n"
    );
    for (id, kind, extra) in EXPORTS {
        m.push_str(&format!(
            "\n[[exports]]\nid = \"{id}\"\nkind = \"{kind}\"\ndescription = \"{id}\"\n{extra}"
        ));
        if *kind == "tool" {
            m.push_str("\n[exports.tool]\ninput_schema = \"schemas/any.json\"\n");
        }
    }
    m
}

/// Writes the package into `dir`.
fn write_package(dir: &Path, package_id: &str) {
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/vai/vai_classes.py"),
        dir.join("plugin.py"),
    )
    .unwrap();
    std::fs::write(dir.join("schemas/any.json"), r#"{"type":"object"}"#).unwrap();
    std::fs::write(dir.join("vai-plugin.toml"), manifest(package_id)).unwrap();
}

async fn approved(ws: &Ws) -> Runtime {
    write_package(&ws.plugin_dir("classes"), ID);
    let rt = ws.runtime(quick(20_000)).await;
    rt.approve(ID, "test").await.unwrap();
    rt
}

async fn call(rt: &Runtime, export: &str, input: Value) -> Value {
    let out = rt
        .call_tool(&format!("{ID}/{export}"), input, None)
        .await
        .unwrap_or_else(|e| panic!("{export}: {e}"));
    out["structured_output"].clone()
}

/// The process that answered (its start token).
fn pid(v: &Value) -> String {
    v["instance"]
        .as_str()
        .unwrap_or_else(|| panic!("no instance in {v}"))
        .to_owned()
}

/// The worker process, by an export it serves.
async fn worker_of(rt: &Runtime) -> String {
    pid(&call(rt, "work_b", json!({})).await)
}

fn group<'a>(procs: &'a [ProcessInfo], name: &str) -> &'a ProcessInfo {
    procs
        .iter()
        .find(|p| p.group == name)
        .unwrap_or_else(|| panic!("no group {name} in {procs:?}"))
}

fn worker_pid(rt: &Runtime) -> u64 {
    match rt.supervised(ID).unwrap().status() {
        Status::Running { pid, .. } => u64::from(pid),
        other => panic!("the worker is not running: {other:?}"),
    }
}

/// Whether host process `pid` has exited.
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).map_or(true, |s| s.contains("State:\tZ"))
}

const REFUSED: &str = "ConnectionRefusedError: [Errno 111] Connection refused";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_export_runs_in_the_process_of_its_class_with_that_process_sandbox() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ws = Ws::new();
    let rt = approved(&ws).await;
    let worker = worker_of(&rt).await;
    let worker_host_pid = worker_pid(&rt);

    // Two isolated exports: two processes, two sandboxes.
    let net = call(&rt, "net", json!({"port": port})).await;
    let quiet = call(&rt, "quiet", json!({"port": port})).await;
    assert_eq!(net["connect"], "ok", "{net}");
    assert_eq!(quiet["connect"], REFUSED, "{quiet}");
    assert_ne!(pid(&net), pid(&quiet));
    assert!(
        pid(&net) != worker && pid(&quiet) != worker,
        "{net} {quiet}"
    );
    // Neither may write its scratch directory (not granted); the same
    // process answers the next call of its export.
    assert!(
        quiet["write_scratch"]
            .as_str()
            .unwrap()
            .starts_with("FileNotFoundError"),
        "{quiet}"
    );
    assert_eq!(
        pid(&call(&rt, "quiet", json!({})).await),
        pid(&quiet),
        "a long-lived isolated process"
    );

    // Worker exports share the worker process; its sandbox is their union
    // (scratch from work_a) and nothing of the isolated exports (no egress).
    let a = call(&rt, "work_a", json!({"port": port})).await;
    let b = call(&rt, "work_b", json!({})).await;
    assert_eq!((pid(&a), pid(&b)), (worker.clone(), worker.clone()));
    assert_eq!(a["connect"], REFUSED, "{a}");
    assert_eq!(a["write_scratch"], "ok", "{a}");
    let scratch_root = ws
        .dir()
        .join(".plugd/state/test__classes/scratch/worker")
        .canonicalize()
        .unwrap();
    assert!(
        Path::new(a["scratch_dir"].as_str().unwrap()).starts_with(&scratch_root),
        "{a}"
    );
    // The worker cannot write where isolated invocations get theirs: the
    // write lands in its sandbox's own mount tree, never on the host.
    let elsewhere = scratch_root.parent().unwrap().join("planted");
    let w = call(
        &rt,
        "work_b",
        json!({"target": elsewhere.display().to_string()}),
    )
    .await;
    assert!(w["write_target"].is_string(), "{w}");
    assert!(!elsewhere.exists(), "{w}");

    // Hooks and compactors (worker by default) reach the worker; a harness
    // (isolated by default) a process of its own.
    let sup = rt.supervised(ID).unwrap();
    let ctx = CallContext::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    let t = Duration::from_secs(20);
    let conn = sup
        .export_connection("notify", &ctx, deadline)
        .await
        .unwrap();
    assert_eq!(conn.group(), "worker");
    let hook = vai::handle_hook(
        &conn,
        "notify",
        "del_1",
        1,
        json!({"type": "run.completed"}),
        conn.context(),
        t,
    )
    .await
    .unwrap();
    assert_eq!(pid(&hook["probe"]), worker);
    drop(conn);
    let conn = sup
        .export_connection("window", &ctx, deadline)
        .await
        .unwrap();
    let compacted = vai::compact(
        &conn,
        "window",
        CompactRequest {
            compaction_id: "cmp_1".into(),
            source: json!({"chain_id": "ch_1", "projection": {"transport": "inline", "blocks": []}}),
            target: json!({"max_input_tokens": 1000}),
            policy: json!({}),
        },
        conn.context(),
        t,
    )
    .await
    .unwrap();
    assert_eq!(pid(&compacted["diagnostics"]), worker);
    drop(conn);
    let conn = sup
        .export_connection("triage", &ctx, deadline)
        .await
        .unwrap();
    assert_eq!(conn.group(), "isolated:triage");
    let run = vai::run_harness(
        &conn,
        "triage",
        HarnessRequest {
            mode: "start".into(),
            target: json!({"session_id": "s"}),
            trigger: json!({"type": "user_request"}),
            policy: json!({}),
        },
        conn.context(),
        t,
    )
    .await
    .unwrap();
    let harness = pid(&run["summary"]);
    assert!(
        ![worker.clone(), pid(&net), pid(&quiet)].contains(&harness),
        "{run}"
    );
    let harness_host_pid = conn.process.pid();
    drop(conn);

    // plugin show: every export with its class and group, every group with
    // its pid and sandbox.
    let info = rt.plugin(ID).await.unwrap();
    let procs = &info.processes;
    assert_eq!(group(procs, "worker").pids, vec![worker_host_pid as u32]);
    assert_eq!(group(procs, "isolated:triage").pids, vec![harness_host_pid]);
    assert_eq!(
        group(procs, "worker").exports,
        ["work_a", "work_b", "notify", "window"]
    );
    let (n, q) = (
        &group(procs, "isolated:net").pids,
        &group(procs, "isolated:quiet").pids,
    );
    assert!(n.len() == 1 && q.len() == 1 && n != q, "{procs:?}");
    assert!(!n.contains(&(worker_host_pid as u32)), "{procs:?}");
    assert_eq!(group(procs, "isolated:crash").state, "idle");
    assert!(group(procs, "isolated:scratch").per_invocation);
    let perms = info.permissions.as_ref().unwrap();
    let sandbox = |g: &str| {
        perms
            .groups
            .iter()
            .find(|x| x.group == g)
            .unwrap_or_else(|| panic!("no group {g} in {:?}", perms.groups))
            .clone()
    };
    assert_eq!(sandbox("isolated:net").network, "host");
    assert_eq!(sandbox("isolated:quiet").network, "deny");
    assert_eq!(sandbox("worker").network, "deny");
    assert_eq!(
        sandbox("worker").writable,
        vec![
            ws.dir()
                .canonicalize()
                .unwrap()
                .join(".plugd/state/test__classes/scratch/worker")
        ]
    );
    assert!(sandbox("isolated:quiet").writable.is_empty());
    assert_eq!(
        sandbox("isolated:scratch").writable,
        vec![
            ws.dir()
                .canonicalize()
                .unwrap()
                .join(".plugd/state/test__classes/scratch/<invocation_id>")
        ]
    );
    let inline = perms
        .vai
        .iter()
        .find(|e| e.export == "claims_inline")
        .unwrap();
    assert_eq!(
        serde_json::to_value(inline).unwrap()["effective_class"],
        "isolated"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_scratch_invocation_cannot_reach_a_concurrent_one_and_is_gone_after() {
    let ws = Ws::new();
    let rt = approved(&ws).await;
    // Invocation A holds, and says where its scratch directory is.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let ctx = CallContext {
        progress: Some(tx),
        ..CallContext::default()
    };
    let rt_a = rt.clone();
    let a = tokio::spawn(async move {
        rt_a.call_tool_with(&format!("{ID}/scratch"), json!({"hold": true}), &ctx)
            .await
    });
    let event = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .unwrap()
        .unwrap();
    let a_dir = PathBuf::from(event["message"].as_str().unwrap());
    assert!(a_dir.is_dir(), "{event}");
    // Invocation B, at the same time, writes its own directory but not A's.
    let b = call(
        &rt,
        "scratch",
        json!({"target": a_dir.join("evil").display().to_string()}),
    )
    .await;
    assert_eq!(b["write_scratch"], "ok", "{b}");
    let refused = b["write_target"].as_str().unwrap();
    assert!(
        refused.starts_with("OSError: [Errno 30]") || refused.starts_with("FileNotFoundError"),
        "{b}"
    );
    assert!(!a_dir.join("evil").exists());
    // Its scratch's parent shows B's own directory and nothing else.
    let own = Path::new(b["scratch_dir"].as_str().unwrap())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(b["siblings"], json!([own]), "{b}");
    // Two invocations, two processes; A's is listed while it runs.
    // A's process is listed while it runs (B's goes once B's call ended).
    let sup = rt.supervised(ID).unwrap().clone();
    assert!(
        eventually(Duration::from_secs(10), || group(
            &sup.processes(),
            "isolated:scratch"
        )
        .pids
        .len()
            == 1)
        .await,
        "{:?}",
        sup.processes()
    );
    let live = group(&sup.processes(), "isolated:scratch").pids.clone();
    std::fs::write(a_dir.join("release"), "").unwrap();
    let a = a.await.unwrap().unwrap();
    let a = &a["structured_output"];
    assert_eq!(a["write_scratch"], "ok", "{a}");
    assert_ne!(pid(a), pid(&b));
    // Each process is stopped and its directory removed after its call.
    assert!(
        eventually(Duration::from_secs(10), || group(
            &sup.processes(),
            "isolated:scratch"
        )
        .pids
        .is_empty())
        .await
    );
    assert!(!a_dir.exists());
    for p in live {
        assert!(
            eventually(Duration::from_secs(5), || gone(p)).await,
            "process {p} outlived its invocation"
        );
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_isolated_scratch_calls_each_get_their_own_process_and_directory() {
    let ws = Ws::new();
    let rt = approved(&ws).await;
    let calls = (0..50).map(|_| {
        let rt = rt.clone();
        async move { call(&rt, "scratch", json!({})).await }
    });
    let outs = futures_util::future::join_all(calls).await;
    let mut pids = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    for o in &outs {
        assert_eq!(o["write_scratch"], "ok", "{o}");
        let dir = Path::new(o["scratch_dir"].as_str().unwrap());
        let own = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(o["siblings"], json!([own]), "{o}");
        pids.insert(pid(o));
        dirs.insert(dir.to_path_buf());
    }
    assert_eq!(pids.len(), 50, "one process per invocation");
    assert_eq!(dirs.len(), 50);
    let sup = rt.supervised(ID).unwrap().clone();
    assert!(
        eventually(Duration::from_secs(20), || group(
            &sup.processes(),
            "isolated:scratch"
        )
        .pids
        .is_empty())
        .await
    );
    assert!(dirs.iter().all(|d| !d.exists()));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_inline_class_runs_isolated_unless_the_operator_trusts_the_package() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ws = Ws::new();
    let rt = approved(&ws).await;
    let worker = worker_of(&rt).await;
    // Untrusted: the export that claims `inline` gets a process and a
    // sandbox of its own; the worker gains nothing from it.
    let inline = call(&rt, "claims_inline", json!({"port": port})).await;
    assert_ne!(pid(&inline), worker);
    assert_eq!(inline["connect"], "ok", "its own grant (egress)");
    let a = call(&rt, "work_a", json!({"port": port})).await;
    assert_eq!(a["connect"], REFUSED, "{a}");
    let info = rt.plugin(ID).await.unwrap();
    let e = info
        .permissions
        .as_ref()
        .unwrap()
        .vai
        .iter()
        .find(|e| e.export == "claims_inline")
        .unwrap()
        .clone();
    assert_eq!(e.group, "isolated:claims_inline");
    assert_eq!(
        e.note.as_deref(),
        Some(
            "inline needs an operator's trust (plugd.yaml sandbox.plugins.test/classes.trusted: true); it runs isolated"
        )
    );
    rt.shutdown().await;
    drop(rt);

    // Trusted: inline runs in the worker process, whose sandbox then
    // includes its grant (egress) for every worker export.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "sandbox:\n  plugins:\n    test/classes: {trusted: true}\n",
    )
    .unwrap();
    let rt = ws.runtime(quick(20_000)).await;
    let inline = call(&rt, "claims_inline", json!({"port": port})).await;
    let b = call(&rt, "work_b", json!({"port": port})).await;
    assert_eq!(pid(&inline), pid(&b));
    assert!(worker_pid(&rt) > 0);
    assert_eq!(b["connect"], "ok", "{b}");
    let procs = rt.plugin(ID).await.unwrap().processes;
    assert!(
        group(&procs, "worker")
            .exports
            .contains(&"claims_inline".to_owned()),
        "{procs:?}"
    );
    assert!(!procs.iter().any(|p| p.group == "isolated:claims_inline"));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_that_exits_mid_call_fails_that_call_only_and_its_group_restarts_alone() {
    let ws = Ws::new();
    let rt = approved(&ws).await;
    let worker = worker_of(&rt).await;
    let worker_host_pid = worker_pid(&rt);
    let quiet = pid(&call(&rt, "quiet", json!({})).await);
    // The worker and another isolated process are busy while it crashes.
    let (rt1, rt2) = (rt.clone(), rt.clone());
    let busy_worker = tokio::spawn(async move { call(&rt1, "work_b", json!({"sleep": 1})).await });
    let busy_quiet = tokio::spawn(async move { call(&rt2, "quiet", json!({"sleep": 1})).await });
    let e = rt
        .call_tool(&format!("{ID}/crash"), json!({"exit": 3}), None)
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, RuntimeError::Call(CallToolError::Tool(_))) && text.contains("exit"),
        "{text}"
    );
    assert!(text.contains("exiting mid-call as asked"), "{text}");
    assert_eq!(pid(&busy_worker.await.unwrap()), worker);
    assert_eq!(pid(&busy_quiet.await.unwrap()), quiet);
    // Its group restarts on its own account; the others did not move.
    let sup = rt.supervised(ID).unwrap().clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let p = sup.processes();
            group(&p, "isolated:crash").restarts == 1
        })
        .await,
        "{:?}",
        sup.processes()
    );
    let procs = sup.processes();
    assert_eq!(group(&procs, "worker").restarts, 0);
    assert_eq!(group(&procs, "isolated:quiet").restarts, 0);
    assert_eq!(sup.restarts(), 0);
    assert_eq!(worker_pid(&rt), worker_host_pid);
    // It serves again.
    assert!(!pid(&call(&rt, "crash", json!({})).await).is_empty());
    // `plugin stop` stops every process of the package.
    call(&rt, "net", json!({})).await;
    let running: Vec<u32> = sup
        .processes()
        .iter()
        .flat_map(|p| p.pids.clone())
        .collect();
    assert_eq!(running.len(), 4, "worker, quiet, crash, net: {running:?}");
    rt.stop(ID, "test").await.unwrap();
    for p in running {
        assert!(
            eventually(Duration::from_secs(5), || gone(p)).await,
            "process {p} survived plugin stop"
        );
    }
    assert!(
        rt.supervised(ID)
            .unwrap()
            .processes()
            .iter()
            .all(|p| p.pids.is_empty())
    );
    rt.shutdown().await;
}

#[test]
fn plugin_show_lists_classes_processes_and_sandboxes() {
    let ws = Ws::new();
    write_package(&ws.plugin_dir("classes"), ID);
    let out = ws.plugd(&["plugin", "approve", ID]);
    assert!(out.status.success(), "{}", stderr(&out));
    let show = stdout(&ws.plugd(&["plugin", "show", ID]));
    for line in [
        "  claims_inline (tool, inline -> isolated in isolated:claims_inline): network=egress filesystem=none",
        "  work_a (tool, worker in worker): network=none filesystem=scratch",
        "  scratch (tool, isolated in isolated:scratch): network=none filesystem=scratch",
        "      note: inline needs an operator's trust (plugd.yaml sandbox.plugins.test/classes.trusted: true); it runs isolated",
        "    net: network=egress filesystem=none -> network=egress filesystem=none; isolated -> isolated, isolated:net",
        "    scratch: network=none filesystem=scratch -> network=none filesystem=scratch; isolated -> isolated, isolated:scratch (a process per invocation)",
        "  isolated:scratch (a process per invocation): idle, restarts 0; exports scratch",
        "  isolated:net: idle, restarts 0; exports net",
    ] {
        assert!(show.contains(line), "{line:?} not in:\n{show}");
    }
    assert!(
        show.lines().any(|l| l
            .starts_with("    isolated:net: exports net; sandbox bwrap, network host, writable -")),
        "{show}"
    );
    assert!(
        show.lines().any(|l| l.starts_with("    worker: exports work_a, work_b, notify, window; sandbox bwrap, network deny, writable /")
            && l.ends_with("/scratch/worker")),
        "{show}"
    );
    // Calling it says in the log that it runs isolated, and why.
    let out = ws.plugd(&[
        "tool",
        "call",
        &format!("{ID}/claims_inline"),
        "--args",
        "{}",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("export \"claims_inline\" asks for execution class inline: inline needs an operator's trust (plugd.yaml sandbox.plugins.test/classes.trusted: true); it runs isolated"),
        "{}",
        stderr(&out)
    );
    let json: Value =
        serde_json::from_str(&stdout(&ws.plugd(&["plugin", "show", ID, "--json"]))).unwrap();
    let procs = json["processes"].as_array().unwrap();
    assert_eq!(procs[0]["group"], "worker");
    assert_eq!(procs.len(), 1 + 6, "{json}");
}

/// Runs `plugd ARGS` on `ws`, failing the test on an error; its stdout.
fn plugd_ok(ws: &Ws, args: &[&str]) -> String {
    let out = ws.plugd(args);
    assert!(out.status.success(), "plugd {args:?}: {}", stderr(&out));
    stdout(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installed_package_called_through_bindings_runs_each_export_in_its_class_process() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ws = Ws::new();
    let src = ws.dir().join("src");
    write_package(&src, "acme/classes");
    plugd_ok(
        &ws,
        &["package", "install", src.to_str().unwrap(), "--json"],
    );
    for export in ["net", "quiet", "scratch", "work_a", "work_b"] {
        plugd_ok(
            &ws,
            &[
                "binding",
                "create",
                "--package",
                "acme/classes",
                "--export",
                export,
                "--org",
                "org_1",
            ],
        );
    }
    // What `plugd package show` says before anything runs.
    let show = plugd_ok(&ws, &["package", "show", "acme/classes"]);
    for line in [
        "    net: network=egress filesystem=none -> network=egress filesystem=none; isolated -> isolated, isolated:net",
        "    scratch: network=none filesystem=scratch -> network=none filesystem=scratch; isolated -> isolated, isolated:scratch (a process per invocation)",
    ] {
        assert!(show.contains(line), "{line:?} not in:\n{show}");
    }
    assert!(
        show.contains("    isolated:quiet: exports quiet; sandbox bwrap, network deny, writable -"),
        "{show}"
    );

    let rt = ws.runtime(quick(20_000)).await;
    let caller = plugd_runtime::bindings_rt::ExportCall {
        org_id: "org_1".into(),
        ..Default::default()
    };
    let call = |export: &'static str, input: Value| {
        let (rt, caller) = (rt.clone(), caller.clone());
        async move {
            rt.call_export(export, input, &caller, None)
                .await
                .unwrap_or_else(|e| panic!("{export}: {e}"))["structured_output"]
                .clone()
        }
    };
    let net = call("net", json!({"port": port})).await;
    let quiet = call("quiet", json!({"port": port})).await;
    assert_eq!(net["connect"], "ok", "{net}");
    assert_eq!(quiet["connect"], REFUSED, "{quiet}");
    assert_ne!(pid(&net), pid(&quiet));
    let (a, b) = (
        call("work_a", json!({})).await,
        call("work_b", json!({})).await,
    );
    assert_eq!(pid(&a), pid(&b));
    assert!(![pid(&net), pid(&quiet)].contains(&pid(&a)));
    let (s1, s2) = (
        call("scratch", json!({})).await,
        call("scratch", json!({})).await,
    );
    assert_ne!(pid(&s1), pid(&s2), "a process per invocation");
    assert_eq!(s1["write_scratch"], "ok", "{s1}");
    // The package's processes, by group, as the runtime reports them.
    let pkg = ws
        .state()
        .await
        .find_package(&plugd_control::PackageSelector::parse("acme/classes").unwrap())
        .await
        .unwrap()
        .unwrap();
    let procs = rt.package_procs().processes(&pkg);
    for g in ["worker", "isolated:net", "isolated:quiet"] {
        assert_eq!(group(&procs, g).pids.len(), 1, "{procs:?}");
    }
    rt.shutdown().await;
}
