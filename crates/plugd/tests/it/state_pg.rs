//! plugd on PostgreSQL. The runtime opened with `Runtime::open_on` on a `PgStore` keeps approvals and tool state in the database (and never opens the workspace's SQLite file), and a second runtime on the same database reads what the first left. `plugd serve --state postgres://…` (and plugd.yaml `state:` for every command) runs the walk-through on a cluster: approve, call, a token revoked by the CLI refused at the next request, a restart keeping approvals and MCP sessions, a node with another master key refused by name; and PostgreSQL restarted under load (`-m fast`, and `-m immediate` + start): 503 `store_unavailable` meanwhile, writes again within 5 s, no 2xx for a write that did not commit.

use std::sync::Arc;
use std::time::Duration;

use plugd_runtime::Runtime;
use plugd_store::StateStore;
use plugd_store_pg::test_pg::TestPg;
use plugd_store_pg::{PgOptions, PgStore};
use serde_json::json;

use crate::support::{Ws, quick};

/// A migrated store on a fresh database of the shared test server.
async fn pg(url: &str) -> Arc<dyn StateStore> {
    let opts = PgOptions {
        pool_size: 4,
        timeout: Duration::from_secs(10),
        op_timeout: Duration::from_secs(10),
    };
    Arc::new(PgStore::connect(url, &opts).await.unwrap())
}

async fn open(ws: &Ws, state: Arc<dyn StateStore>) -> Runtime {
    Runtime::open_on(ws.dir(), state, quick(10_000), plugd_agent::parts())
        .await
        .unwrap()
}

pub(crate) async fn greet(rt: &Runtime) -> Result<serde_json::Value, String> {
    rt.call_tool("hello_python_greet", json!({"name": "pg"}), None)
        .await
        .map(|r| serde_json::to_value(r).unwrap())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_on_postgres_keeps_approvals_and_tool_state_in_the_database() {
    let url = TestPg::shared().fresh_database();
    let ws = Ws::new();
    ws.example("hello-python");
    let sqlite_file = ws.dir().join(".plugd").join(plugd_store::STATE_DB_FILE);

    let first = pg(&url).await;
    let rt = open(&ws, first.clone()).await;
    rt.approve("hello_python", "test").await.unwrap();
    assert!(first.approval("hello_python").await.unwrap().is_some());
    let out = greet(&rt).await.unwrap();
    assert!(out.to_string().contains("pg"), "{out}");

    // Disabled: refused before the plugin is called; enabled: served again.
    rt.set_tool_enabled("hello_python_greet", false, "test")
        .await
        .unwrap();
    let refused = greet(&rt).await.unwrap_err();
    assert!(refused.contains("is disabled"), "{refused}");
    assert_eq!(first.disabled_tools().await.unwrap().len(), 1);
    rt.set_tool_enabled("hello_python_greet", true, "test")
        .await
        .unwrap();
    greet(&rt).await.unwrap();

    // Revoked: refused, and the database has no approval.
    assert!(rt.revoke("hello_python").await.unwrap());
    assert!(greet(&rt).await.is_err());
    assert!(first.approval("hello_python").await.unwrap().is_none());

    // What the second runtime must find: approved again, `add` disabled.
    rt.approve("hello_python", "test").await.unwrap();
    rt.set_tool_enabled("hello_python_add", false, "test")
        .await
        .unwrap();
    rt.shutdown().await;
    drop(rt);
    drop(first);
    assert!(
        !sqlite_file.exists(),
        "a runtime opened on PostgreSQL created {}",
        sqlite_file.display()
    );

    // A second runtime, on a new pool to the same database.
    let rt = open(&ws, pg(&url).await).await;
    let info = rt.plugin("hello_python").await.unwrap();
    assert!(info.approved, "{info:?}");
    greet(&rt).await.unwrap();
    let refused = rt
        .call_tool("hello_python_add", json!({"a": 1, "b": 2}), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("is disabled"), "{refused}");
    rt.shutdown().await;
    assert!(!sqlite_file.exists());
}

/// A fixed master key for a test's processes (never the machine's own).
const KEY: &str = "7f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// The environment of every plugd process on the cluster at `url`.
fn cluster_env(url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("PLUGD_STATE", url.to_owned()),
        ("PLUGD_MASTER_KEY", KEY.to_owned()),
    ]
}

fn env_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn plugd_env(ws: &Ws, env: &[(&'static str, String)], args: &[&str]) -> std::process::Output {
    crate::support::plugd_cmd(ws.dir())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(args)
        .output()
        .unwrap()
}

/// A workspace with hello-python approved on a fresh cluster at `url`.
fn cluster_workspace(url: &str) -> (Ws, Vec<(&'static str, String)>) {
    let ws = Ws::new();
    ws.example("hello-python");
    let env = cluster_env(url);
    let init = plugd_env(&ws, &env, &["cluster", "init"]);
    assert!(init.status.success(), "{}", crate::support::stderr(&init));
    let approve = plugd_env(&ws, &env, &["plugin", "approve", "hello_python"]);
    assert!(
        approve.status.success(),
        "{}",
        crate::support::stderr(&approve)
    );
    (ws, env)
}

fn invoke(serve: &crate::http::Serve, token: &str) -> crate::http::Resp {
    crate::http::request_as(
        serve,
        token,
        "POST",
        "/v1/tools/hello_python_greet:invoke",
        &[("Content-Type", "application/json")],
        Some(br#"{"args": {"name": "pg"}}"#),
    )
}

#[test]
fn serve_on_a_postgres_cluster_runs_the_walk_through() {
    use crate::gateway::{initialize, mcp_post};
    use crate::http::{Serve, make_token_env};

    let url = TestPg::shared().fresh_database();
    let (ws, env) = cluster_workspace(&url);
    let env = env_refs(&env);
    let sqlite_file = ws.dir().join(".plugd").join(plugd_store::STATE_DB_FILE);
    let serve = Serve::start_with_env(&ws, &env);
    assert!(
        serve.log_text().contains("postgres"),
        "{}",
        serve.log_text()
    );
    let called = invoke(&serve, &serve.token);
    assert_eq!(called.status, 200, "{}", called.text());
    assert!(called.text().contains("pg"), "{}", called.text());

    // A token made and revoked by the CLI on the same cluster.
    let operator = make_token_env(&ws, "agent", &env);
    assert_eq!(invoke(&serve, &operator).status, 200);
    let list = plugd_env(&ws, &cluster_env(&url), &["token", "list", "--json"]);
    let tokens: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["role"] == "agent")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let revoke = plugd_env(&ws, &cluster_env(&url), &["token", "revoke", &id]);
    assert!(
        revoke.status.success(),
        "{}",
        crate::support::stderr(&revoke)
    );
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        invoke(&serve, &operator).status,
        401,
        "a revoked token still works"
    );

    // An MCP session, then a restart of serve: approvals and the session
    // come back from the database.
    let agent = make_token_env(&ws, "agent", &env);
    let r = mcp_post(&serve, &agent, "/mcp", None, &initialize());
    assert_eq!(r.status, 200, "{}", r.text());
    let session = r.header("mcp-session-id").unwrap().to_owned();
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    let serve = Serve::start_with_env(&ws, &env);
    assert_eq!(invoke(&serve, &serve.token).status, 200);
    let list = mcp_post(
        &serve,
        &agent,
        "/mcp",
        Some(&session),
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    );
    assert_eq!(list.status, 200, "{}", list.text());
    assert!(
        list.text().contains("hello_python_greet"),
        "{}",
        list.text()
    );
    // Still its owner's only: this serve's admin token is another identity.
    let other = mcp_post(
        &serve,
        &serve.token,
        "/mcp",
        Some(&session),
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    );
    assert_eq!(other.status, 404, "{}", other.text());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(
        !sqlite_file.exists(),
        "serve on PostgreSQL created {}",
        sqlite_file.display()
    );

    // A node with another master key is refused, naming both key ids.
    let other = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let refused = crate::support::plugd_cmd(ws.dir())
        .env("PLUGD_STATE", &url)
        .env("PLUGD_MASTER_KEY", other)
        .args(["serve"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = crate::support::stderr(&refused);
    assert!(err.contains("key"), "{err}");
    let cluster = plugd_store::secrets::MasterKey::from_hex(KEY, "test").unwrap();
    let mine = plugd_store::secrets::MasterKey::from_hex(other, "test").unwrap();
    assert!(
        err.contains(cluster.id()) && err.contains(mine.id()),
        "{err}"
    );
}

#[test]
fn postgres_restarted_under_load_gives_503_then_writes_again_and_loses_no_commit() {
    use crate::http::{Serve, request_as};

    // A server of its own: the shared one serves other tests meanwhile.
    let pg = TestPg::start().unwrap();
    let url = pg.fresh_database();
    let (ws, env) = cluster_workspace(&url);
    let env = env_refs(&env);
    let serve = Serve::start_with_env(&ws, &env);
    // Writes (org secrets, one name each) while the database restarts.
    let (seen, back) = writes_across_restarts(&pg, |i| {
        let name = format!("w{i}");
        let r = request_as(
            &serve,
            &serve.token,
            "PUT",
            &format!("/v1/secrets/acme/{name}"),
            &[("Content-Type", "application/json")],
            Some(br#"{"value": "s3cret"}"#),
        );
        (name, r.status, r.text())
    });
    let seen: Vec<(String, u16, String, std::time::Instant)> = seen
        .into_iter()
        .map(|((name, status, body), at)| (name, status, body, at))
        .collect();

    // While the database was down: 503 store_unavailable, never another 5xx.
    let down: Vec<_> = seen.iter().filter(|(_, s, _, _)| *s >= 500).collect();
    assert!(!down.is_empty(), "no request saw the database down");
    for (name, status, body, _) in &down {
        assert_eq!(*status, 503, "{name}: {body}");
        assert!(body.contains("store_unavailable"), "{name}: {body}");
    }
    // Writes again within 5 s of the database's return.
    let first_ok_after = seen
        .iter()
        .find(|(_, s, _, at)| (200..300).contains(s) && *at > back)
        .map(|(_, _, _, at)| at.duration_since(back));
    assert!(
        first_ok_after.is_some_and(|d| d <= Duration::from_secs(5)),
        "no write succeeded within 5 s of the database's return: {first_ok_after:?}"
    );
    // Every 2xx write is in the database.
    let list = request_as(&serve, &serve.token, "GET", "/v1/secrets/acme", &[], None);
    assert_eq!(list.status, 200, "{}", list.text());
    let names: Vec<String> = list.json()["names"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect();
    for (name, status, _, _) in &seen {
        if (200..300).contains(status) {
            assert!(
                names.contains(name),
                "{name} was answered {status} but is not stored"
            );
        }
    }
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

/// Runs `write(i)` (i = 1, 2, …, 20 ms apart) while `pg` restarts (fast),
/// then stops at once and starts again, until 6 s after it is back: what
/// each write returned with when, and when the database was back.
pub(crate) fn writes_across_restarts<T: Send>(
    pg: &TestPg,
    mut write: impl FnMut(usize) -> T + Send,
) -> (Vec<(T, std::time::Instant)>, std::time::Instant) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    let back = std::sync::Mutex::new(None::<std::time::Instant>);
    let seen = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(600));
            pg.restart(plugd_store_pg::test_pg::RestartMode::Fast)
                .unwrap();
            std::thread::sleep(Duration::from_millis(600));
            pg.stop_immediate().unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            pg.start_again().unwrap();
            *back.lock().unwrap() = Some(std::time::Instant::now());
            std::thread::sleep(Duration::from_secs(6));
            done.store(true, Ordering::Relaxed);
        });
        let mut seen = Vec::new();
        let mut i = 0;
        while !done.load(Ordering::Relaxed) {
            i += 1;
            let out = write(i);
            seen.push((out, std::time::Instant::now()));
            std::thread::sleep(Duration::from_millis(20));
        }
        seen
    });
    let back = back.lock().unwrap().expect("the database came back");
    (seen, back)
}
