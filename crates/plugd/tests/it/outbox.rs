//! Async durable hooks: semantic events through the outbox to a real VAI hook plugin (Python stdlib), with retries, dead letters, lease takeover and a real `kill -9` of `plugd serve`.
//!
//! Every test runs `tests/plugins/outbox/outbox_plugin.py MODE RECORDS`,
//! whose hooks append each `hook.handle` they receive (export, delivery id,
//! attempt, event, pid, pgid, time) to RECORDS before answering per MODE.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use plugd_host::spawn::process_group_alive;
use plugd_runtime::Runtime;
use plugd_runtime::outbox::{OutboxConfig, OutboxExt, OutboxWorker};
use plugd_store::outbox::{DeliveryStatus, RetryPolicy};
use serde_json::{Value, json};

use crate::support::{Ws, eventually, eventually_blocking, plugd_cmd, quick, repo, stderr, stdout};

const PACKAGE: &str = "test/outbox";

/// Writes package `test/outbox` running the test plugin in `mode` into `ws`;
/// returns the records file (outside the package, so approval stays valid).
fn package(ws: &Ws, mode: &str) -> PathBuf {
    let dir = ws.plugin_dir("outbox");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/outbox/outbox_plugin.py"),
        dir.join("plugin.py"),
    )
    .unwrap();
    let records = ws.dir().join("records.jsonl");
    // The containment baseline: a plugin cannot create new files in the
    // workspace root, only use those that exist when it starts.
    std::fs::write(&records, "").unwrap();
    let entry = json!(["python3", "plugin.py", mode, records.display().to_string()]);
    let manifest = format!(
        r#"api_version = "vai.plugin.v1"
package_id = "{PACKAGE}"
version = "0.1.0"

[runtime]
protocol = "vai.rpc.v1"
transport = "stdio"
entrypoint = {entry}

[[exports]]
id = "recorder"
kind = "hook"
[exports.hook]
subscribes_to = ["run.completed", "tool.completed"]

[[exports]]
id = "audit"
kind = "hook"
[exports.hook]
subscribes_to = ["run.completed", "session.created"]
"#
    );
    std::fs::write(dir.join("vai-plugin.toml"), manifest).unwrap();
    ws.unsandbox(
        &[PACKAGE],
        "the test package writes its records outside its declared permissions",
    );
    records
}

/// What the plugin recorded, one object per `hook.handle` received.
fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn of_export(path: &Path, export: &str) -> Vec<Value> {
    records(path)
        .into_iter()
        .filter(|r| r["export"] == export)
        .collect()
}

/// Short backoff (100 ms doubling to 400 ms), fast polling, `max_attempts`.
fn fast(max_attempts: u32) -> OutboxConfig {
    OutboxConfig {
        retry: RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(400),
            max_attempts,
        },
        lease: Duration::from_secs(5),
        poll: Duration::from_millis(50),
        hook_timeout: Duration::from_secs(10),
        max_in_flight: 16,
    }
}

async fn approved(ws: &Ws) -> Runtime {
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve(PACKAGE, "test").await.unwrap();
    rt
}

/// Read through the runtime's state store (the polls of `eventually` are
/// synchronous: the read blocks this worker thread).
fn status_of(rt: &Runtime, delivery: &str) -> Option<DeliveryStatus> {
    let state = rt.state().clone();
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(state.outbox_delivery(delivery))
    })
    .unwrap()
    .map(|l| l.delivery.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emitted_events_reach_every_subscribed_export_once_and_are_acknowledged() {
    let ws = Ws::new();
    let rec = package(&ws, "ack");
    let rt = approved(&ws).await;

    // Recorded before delivery: no worker runs yet.
    let ids = rt
        .emit(
            "run.completed",
            json!({"kind": "run", "id": "run_1"}),
            json!({"task": "Fix auth redirect bug", "output": "Patched"}),
        )
        .await
        .unwrap();
    assert_eq!(ids.len(), 2, "recorder and audit subscribe: {ids:?}");
    let pending = rt.state().outbox_list(None).await.unwrap();
    let exports: Vec<&str> = pending.iter().map(|d| d.export_id.as_str()).collect();
    assert_eq!(exports, ["recorder", "audit"]);
    assert!(
        pending
            .iter()
            .all(|d| d.status == DeliveryStatus::Pending && d.attempt == 0)
    );
    assert!(records(&rec).is_empty());

    // An event type nobody subscribes to creates no deliveries.
    assert!(
        rt.emit("chain.compacted", json!({}), json!({}))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(rt.state().outbox_list(None).await.unwrap().len(), 2);

    let worker = OutboxWorker::spawn(&rt, fast(3));
    let session = rt
        .emit(
            "session.created",
            json!({"kind": "session", "id": "s_1"}),
            json!({}),
        )
        .await
        .unwrap();
    assert_eq!(session.len(), 1, "only audit subscribes to session.created");
    let all: Vec<String> = ids.iter().chain(&session).map(|d| d.0.clone()).collect();
    assert!(
        eventually(Duration::from_secs(20), || all.iter().all(|d| status_of(
            &rt, d
        ) == Some(
            DeliveryStatus::Delivered
        )))
        .await,
        "{:?}",
        rt.state().outbox_list(None).await.unwrap()
    );
    worker.stop().await;

    let got = records(&rec);
    assert_eq!(got.len(), 3, "each delivery once: {got:#?}");
    let run = got
        .iter()
        .find(|r| r["export"] == "recorder")
        .expect("recorder got run.completed");
    assert_eq!(run["delivery_id"], ids[0].0.as_str());
    assert_eq!(run["attempt"], 1);
    assert_eq!(run["event"]["type"], "run.completed");
    assert_eq!(
        run["event"]["subject"],
        json!({"kind": "run", "id": "run_1"})
    );
    assert_eq!(run["event"]["summary"]["task"], "Fix auth redirect bug");
    assert!(run["event"]["occurred_at"].as_str().unwrap().ends_with('Z'));
    let audit: Vec<&Value> = got.iter().filter(|r| r["export"] == "audit").collect();
    let types: Vec<&Value> = audit.iter().map(|r| &r["event"]["type"]).collect();
    assert!(types.contains(&&json!("run.completed")) && types.contains(&&json!("session.created")));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retryable_outcome_is_retried_with_the_same_delivery_id_then_acknowledged() {
    let ws = Ws::new();
    let rec = package(&ws, "retryable_once");
    let rt = approved(&ws).await;
    let worker = OutboxWorker::spawn(&rt, fast(3));
    let ids = rt
        .emit(
            "tool.completed",
            json!({"kind": "tool", "id": "t1"}),
            json!({}),
        )
        .await
        .unwrap();
    assert_eq!(ids.len(), 1);
    let id = ids[0].0.clone();
    assert!(
        eventually(Duration::from_secs(20), || status_of(&rt, &id)
            == Some(DeliveryStatus::Delivered))
        .await
    );
    worker.stop().await;
    let got = of_export(&rec, "recorder");
    let attempts: Vec<(&Value, &Value)> = got
        .iter()
        .map(|r| (&r["delivery_id"], &r["attempt"]))
        .collect();
    assert_eq!(attempts, [(&json!(id), &json!(1)), (&json!(id), &json!(2))]);
    let gap = got[1]["t"].as_f64().unwrap() - got[0]["t"].as_f64().unwrap();
    assert!(gap >= 0.08, "the retry waited its 100 ms backoff: {gap}");
    let d = rt
        .state()
        .outbox_delivery(&id)
        .await
        .unwrap()
        .unwrap()
        .delivery;
    assert_eq!(d.attempt, 2);
    assert!(
        d.last_error
            .as_deref()
            .unwrap()
            .contains("retryable_failure"),
        "{d:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_back_off_then_park_as_a_dead_letter_that_the_cli_shows_and_retries() {
    let ws = Ws::new();
    let rec = package(&ws, "always_fail");
    let rt = approved(&ws).await;
    let worker = OutboxWorker::spawn(&rt, fast(3));
    let ids = rt
        .emit(
            "tool.completed",
            json!({"kind": "tool", "id": "t1"}),
            json!({}),
        )
        .await
        .unwrap();
    let id = ids[0].0.clone();
    assert!(
        eventually(Duration::from_secs(20), || status_of(&rt, &id)
            == Some(DeliveryStatus::Dead))
        .await,
        "{:?}",
        rt.state().outbox_list(None).await.unwrap()
    );
    // Nothing more is attempted once dead.
    tokio::time::sleep(Duration::from_millis(600)).await;
    worker.stop().await;
    let got = of_export(&rec, "recorder");
    let attempts: Vec<u64> = got.iter().map(|r| r["attempt"].as_u64().unwrap()).collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert!(got.iter().all(|r| r["delivery_id"] == id.as_str()));
    let t: Vec<f64> = got.iter().map(|r| r["t"].as_f64().unwrap()).collect();
    // Backoff 100 ms then 200 ms (generous lower bounds; no upper bounds).
    assert!(t[1] - t[0] >= 0.08 && t[2] - t[1] >= 0.16, "{t:?}");

    // The CLI shows the dead letter (in JSON and in the table).
    let o = ws.plugd(&["outbox", "list", "--dead", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let dead: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let dead = dead.as_array().unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["delivery_id"], id.as_str());
    assert_eq!(dead[0]["status"], "dead");
    assert_eq!(dead[0]["attempt"], 3);
    assert_eq!(dead[0]["export_id"], "recorder");
    assert_eq!(dead[0]["event_type"], "tool.completed");
    assert!(
        dead[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("webhook is down"),
        "{dead:?}"
    );
    let o = ws.plugd(&["outbox", "list", "--dead"]);
    let table = stdout(&o);
    assert!(table.starts_with("  ID  DELIVERY"), "{table}");
    assert!(
        table.contains(&id) && table.contains("test/outbox/recorder") && table.contains(" dead "),
        "{table}"
    );

    // Retrying a delivery that is not dead is refused, naming it.
    let o = ws.plugd(&["outbox", "retry", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no outbox delivery \"nope\""),
        "{}",
        stderr(&o)
    );

    // `outbox retry` puts it back with a fresh budget: three more attempts,
    // numbered on from 4, then dead again.
    let o = ws.plugd(&["outbox", "retry", &id]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("pending again"), "{}", stdout(&o));
    let o = ws.plugd(&["outbox", "retry", &id]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("is pending, not dead"),
        "{}",
        stderr(&o)
    );
    assert!(
        ws.plugd(&["outbox", "list", "--dead", "--json"])
            .stdout
            .starts_with(b"[]")
    );
    let worker = OutboxWorker::spawn(&rt, fast(3));
    assert!(
        eventually(Duration::from_secs(20), || status_of(&rt, &id)
            == Some(DeliveryStatus::Dead))
        .await
    );
    worker.stop().await;
    let attempts: Vec<u64> = of_export(&rec, "recorder")
        .iter()
        .map(|r| r["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2, 3, 4, 5, 6]);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_marked_not_retryable_and_an_unapproved_plugin() {
    // `failed` with retryable=false is a dead letter after one attempt.
    let ws = Ws::new();
    let rec = package(&ws, "fatal");
    let rt = approved(&ws).await;
    let worker = OutboxWorker::spawn(&rt, fast(5));
    let id = rt
        .emit("tool.completed", json!({}), json!({}))
        .await
        .unwrap()[0]
        .0
        .clone();
    assert!(
        eventually(Duration::from_secs(20), || status_of(&rt, &id)
            == Some(DeliveryStatus::Dead))
        .await
    );
    let d = rt
        .state()
        .outbox_delivery(&id)
        .await
        .unwrap()
        .unwrap()
        .delivery;
    assert_eq!(d.attempt, 1);
    assert!(d.last_error.unwrap().contains("event rejected"));
    assert_eq!(of_export(&rec, "recorder").len(), 1);

    // A plugin that lost its approval is never started; the delivery is
    // retried and parked, with the reason.
    rt.revoke(PACKAGE).await.unwrap();
    let id = rt
        .emit("tool.completed", json!({}), json!({}))
        .await
        .unwrap()[0]
        .0
        .clone();
    assert!(
        eventually(Duration::from_secs(20), || status_of(&rt, &id)
            == Some(DeliveryStatus::Dead))
        .await
    );
    worker.stop().await;
    let d = rt
        .state()
        .outbox_delivery(&id)
        .await
        .unwrap()
        .unwrap()
        .delivery;
    assert_eq!(d.attempt, 5);
    assert!(
        d.last_error.as_deref().unwrap().contains("not approved"),
        "{d:?}"
    );
    assert_eq!(of_export(&rec, "recorder").len(), 1, "never delivered");
    rt.shutdown().await;
}

/// Two hosts ("nodes") on one workspace store, each with its own runtime and
/// plugin process. Node A takes the delivery and hangs in it (the plugin
/// sleeps on attempt 1) while renewing its lease; then node A dies without
/// giving the lease back (its tokio runtime is torn down), and node B
/// redelivers once the lease runs out.
#[test]
fn lease_expiry_lets_a_second_worker_redeliver_with_the_same_delivery_id() {
    let ws = Ws::new();
    let rec = package(&ws, "sleep_first");
    let lease = Duration::from_millis(1500);
    let config = OutboxConfig { lease, ..fast(5) };
    let config = OutboxConfig {
        hook_timeout: Duration::from_secs(60),
        ..config
    };

    let node_a = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (rt_a, worker_a) = node_a.block_on(async {
        let rt = approved(&ws).await;
        let w = OutboxWorker::spawn(&rt, config.clone());
        (rt, w)
    });
    let id = node_a
        .block_on(rt_a.emit("tool.completed", json!({}), json!({})))
        .unwrap()[0]
        .0
        .clone();

    let node_b = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    node_b.block_on(async {
        let rt_b = ws.runtime(quick(10_000)).await;
        assert!(
            eventually(Duration::from_secs(20), || of_export(&rec, "recorder")
                .len()
                == 1)
            .await
        );
        let worker_b = OutboxWorker::spawn(&rt_b, config.clone());
        // Node A is alive and renews its lease: B does not take the delivery
        // although three lease periods pass.
        tokio::time::sleep(lease * 3).await;
        assert_eq!(of_export(&rec, "recorder").len(), 1, "{:?}", records(&rec));
        let d = rt_b
            .state()
            .outbox_delivery(&id)
            .await
            .unwrap()
            .unwrap()
            .delivery;
        assert_eq!(d.leased_by.as_deref(), Some(worker_a.id()));

        // Node A dies: no release, no more renewals.
        let a_id = worker_a.id().to_owned();
        std::mem::forget(worker_a);
        node_a.shutdown_background();

        assert!(
            eventually(Duration::from_secs(20), || status_of(&rt_b, &id)
                == Some(DeliveryStatus::Delivered))
            .await,
            "{:?}",
            rt_b.state().outbox_list(None).await.unwrap()
        );
        let got = of_export(&rec, "recorder");
        let attempts: Vec<(&Value, &Value)> = got
            .iter()
            .map(|r| (&r["delivery_id"], &r["attempt"]))
            .collect();
        assert_eq!(attempts, [(&json!(id), &json!(1)), (&json!(id), &json!(2))]);
        assert_ne!(got[0]["pid"], got[1]["pid"], "node B's own plugin process");
        let d = rt_b
            .state()
            .outbox_delivery(&id)
            .await
            .unwrap()
            .unwrap()
            .delivery;
        let err = d.last_error.unwrap();
        assert!(err.contains(&a_id) && err.contains("attempt 1"), "{err}");
        worker_b.stop().await;
        rt_b.shutdown().await;
    });
    drop(rt_a);
}

/// `plugd serve`, killed on drop so a failing test leaves nothing behind.
struct Serve {
    child: Child,
    log: PathBuf,
}

impl Serve {
    fn start(ws: &Ws, n: u32) -> Serve {
        let log = ws.dir().join(format!("serve-{n}.log"));
        let child = plugd_cmd(ws.dir())
            .arg("serve")
            .env("PLUGD_LOG", "info")
            .env("PLUGD_OUTBOX_LEASE_MS", "3000")
            .env("PLUGD_OUTBOX_POLL_MS", "100")
            .env("PLUGD_OUTBOX_HOOK_TIMEOUT_MS", "60000")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Serve { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cli_status(ws: &Ws, delivery: &str) -> Option<Value> {
    let o = ws.plugd(&["outbox", "list", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Value = serde_json::from_str(&stdout(&o)).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["delivery_id"] == delivery)
        .cloned()
}

#[test]
fn kill_9_of_serve_mid_delivery_redelivers_the_same_delivery_id_after_restart() {
    let ws = Ws::new();
    let rec = package(&ws, "sleep_first");
    let o = ws.plugd(&["plugin", "approve", PACKAGE]);
    assert!(o.status.success(), "{}", stderr(&o));

    let mut serve = Serve::start(&ws, 1);
    let o = ws.plugd(&[
        "events",
        "emit",
        "run.completed",
        "--payload",
        r#"{"task": "Fix auth redirect bug"}"#,
        "--subject",
        r#"{"kind": "run", "id": "run_9"}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: Vec<String> = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(ids.len(), 2, "recorder and audit: {ids:?}");

    // The recorder's first attempt is under way (and sleeps).
    assert!(
        eventually_blocking(Duration::from_secs(30), || !of_export(&rec, "recorder")
            .is_empty()),
        "no delivery reached the plugin\n{}",
        serve.log()
    );
    let first = of_export(&rec, "recorder")[0].clone();
    let delivery = first["delivery_id"].as_str().unwrap().to_owned();
    assert!(ids.contains(&delivery));
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["event"]["summary"]["task"], "Fix auth redirect bug");
    assert_eq!(first["event"]["subject"]["id"], "run_9");

    // The audit export is acknowledged in this run (it does not sleep); wait
    // for its record before the kill, or the kill can land between its
    // answer and the write of its acknowledgement (then it is, rightly,
    // delivered again).
    let audit_id = ids.iter().find(|i| **i != delivery).unwrap();
    assert!(
        eventually_blocking(Duration::from_secs(30), || {
            cli_status(&ws, audit_id).is_some_and(|r| r["status"] == "delivered")
        }),
        "{:?}\n{}",
        cli_status(&ws, audit_id),
        serve.log()
    );

    // kill -9 of the host, mid-delivery.
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    // The plugin dies with plugd (PR_SET_PDEATHSIG); no member of its
    // process group survives.
    let pgid = u32::try_from(first["pgid"].as_u64().unwrap()).unwrap();
    assert!(
        eventually_blocking(Duration::from_secs(10), || !process_group_alive(pgid)),
        "plugin process group {pgid} outlived kill -9 of plugd serve"
    );
    let row = cli_status(&ws, &delivery).unwrap();
    assert_eq!(row["status"], "pending", "not acknowledged: {row}");
    assert_eq!(row["attempt"], 1);
    drop(serve);

    // A restarted host delivers it again: same delivery id, higher attempt,
    // acknowledged this time.
    let serve = Serve::start(&ws, 2);
    assert!(
        eventually_blocking(Duration::from_secs(30), || {
            cli_status(&ws, &delivery).is_some_and(|r| r["status"] == "delivered")
        }),
        "{:?}\n{}",
        cli_status(&ws, &delivery),
        serve.log()
    );
    let got = of_export(&rec, "recorder");
    let attempts: Vec<(&Value, &Value)> = got
        .iter()
        .map(|r| (&r["delivery_id"], &r["attempt"]))
        .collect();
    assert_eq!(
        attempts,
        [(&json!(delivery), &json!(1)), (&json!(delivery), &json!(2))],
        "{got:#?}"
    );
    let row = cli_status(&ws, &delivery).unwrap();
    assert_eq!(row["attempt"], 2);
    assert!(
        row["last_error"]
            .as_str()
            .unwrap()
            .contains("ran out during attempt 1"),
        "{row}"
    );
    // The audit export acknowledged during the first run, exactly once.
    let audit = of_export(&rec, "audit");
    assert_eq!(audit.len(), 1, "{audit:#?}");
    assert!(
        serve.log().contains("hook delivery acknowledged"),
        "{}",
        serve.log()
    );
}

#[test]
fn events_emit_checks_its_input_and_reports_no_subscribers() {
    let ws = Ws::new();
    package(&ws, "ack");
    let o = ws.plugd(&["events", "emit", "chain.compacted"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "[]");
    let o = ws.plugd(&["events", "emit", "run.completed", "--payload", "{oops"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--payload is not valid JSON"),
        "{}",
        stderr(&o)
    );
    let o = ws.plugd(&["events", "emit", "Run Completed"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("event type \"Run Completed\""),
        "{}",
        stderr(&o)
    );
    let o = ws.plugd(&["outbox", "list"]);
    assert_eq!(stdout(&o).trim(), "no hook deliveries in the outbox");
}
