//! Invocation records through the real binary: calls to a native (bash)
//! tool made by the CLI and over HTTP, then read back with `plugd
//! invocations list|show` and `GET /v1/invocations[/{id}]` (fields,
//! filters, pages, roles).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::http::{Serve, make_token, request_as};
use crate::support::{Ws, ok, stderr};

fn get_as(serve: &Serve, token: &str, path: &str) -> crate::http::Resp {
    request_as(serve, token, "GET", path, &[], None)
}

#[test]
fn cli_and_http_calls_are_recorded_and_read_by_cli_and_http() {
    let ws = Ws::new();
    ws.example("hello-bash");
    ok(&ws.plugd(&["plugin", "approve", "hello_bash"]));
    // A CLI call that succeeds and one refused for its arguments.
    ok(&ws.plugd(&[
        "tool",
        "call",
        "hello_bash_greet",
        "--args",
        r#"{"name":"Ada"}"#,
    ]));
    let bad = ws.plugd(&[
        "tool",
        "call",
        "hello_bash_greet",
        "--args",
        r#"{"name":5}"#,
    ]);
    assert!(!bad.status.success());

    let listed: Value =
        serde_json::from_str(&ok(&ws.plugd(&["invocations", "list", "--json"]))).unwrap();
    let rows = listed["invocations"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{listed}");
    let (failed, good) = (&rows[0], &rows[1]);
    assert_eq!(good["status"], "succeeded");
    assert_eq!(good["plugin_id"], "hello_bash");
    assert_eq!(good["dialect"], "native");
    assert_eq!(good["export_kind"], "tool");
    assert_eq!(good["export_id"], "hello_bash_greet");
    assert_eq!(good["tool"], "hello_bash_greet");
    assert_eq!(good["retry_count"], 0);
    assert!(
        good["caller"].as_str().unwrap().starts_with("cli:"),
        "{good}"
    );
    assert!(good["invocation_id"].as_str().unwrap().starts_with("inv_"));
    assert!(good["started_at"].as_str().unwrap() <= good["ended_at"].as_str().unwrap());
    assert!(good["error_code"].is_null());
    for unknown in ["binding_id", "package_id", "chain_id", "run_id"] {
        assert!(good[unknown].is_null(), "{unknown}: {good}");
    }
    assert!(good.get("args").is_none() && good.get("payload").is_none());
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error_code"], "invalid_arguments");
    // A call that did not succeed keeps its error; bodies are off by default.
    let shown: Value = serde_json::from_str(&ok(&ws.plugd(&[
        "invocations",
        "show",
        failed["invocation_id"].as_str().unwrap(),
        "--json",
    ])))
    .unwrap();
    let error = &shown["payload"]["error"];
    assert_eq!(error["code"], "invalid_arguments", "{shown}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("hello_bash_greet") && m.contains("name")),
        "{shown}"
    );
    for body in ["args", "result"] {
        assert!(shown["payload"].get(body).is_none(), "{body}: {shown}");
    }
    let text = ok(&ws.plugd(&[
        "invocations",
        "show",
        failed["invocation_id"].as_str().unwrap(),
    ]));
    assert!(
        text.contains("invalid_arguments") && text.contains("hello_bash"),
        "{text}"
    );
    let filtered = ok(&ws.plugd(&["invocations", "list", "--status", "succeeded"]));
    assert!(
        filtered.contains(good["invocation_id"].as_str().unwrap()),
        "{filtered}"
    );
    assert!(
        !filtered.contains(failed["invocation_id"].as_str().unwrap()),
        "{filtered}"
    );
    let missing = ws.plugd(&["invocations", "show", "inv_nope"]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("inv_nope"),
        "{}",
        stderr(&missing)
    );

    // serve sees what the CLI wrote, and records its own calls.
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = make_token(&ws, "agent");
    let viewer = make_token(&ws, "viewer");
    let mut named = Vec::new();
    for name in ["Bo", "Cy", "Di"] {
        let body = json!({"args": {"name": name}}).to_string();
        let r = request_as(
            &serve,
            &agent,
            "POST",
            "/v1/tools/hello_bash_greet:invoke",
            &[("Content-Type", "application/json")],
            Some(body.as_bytes()),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        // The answer names its record.
        let id = r.header("plugd-invocation-id").unwrap_or_default();
        assert!(id.starts_with("inv_") && id.len() == 36, "{:?}", r.headers);
        named.push(id.to_owned());
    }
    // Records are written off the call's path: wait for them.
    let all = (0..100)
        .find_map(|_| {
            let page = get_as(&serve, &viewer, "/v1/invocations").json();
            if page["invocations"].as_array().unwrap().len() == 5 {
                Some(page)
            } else {
                std::thread::sleep(std::time::Duration::from_millis(50));
                None
            }
        })
        .expect("five records within 5 s");
    let rows = all["invocations"].as_array().unwrap();
    assert!(all["next_cursor"].is_null());
    assert!(
        rows[..3]
            .iter()
            .all(|r| r["caller"].as_str().unwrap().starts_with("token:"))
    );
    assert_eq!(rows[4]["invocation_id"], good["invocation_id"]);
    // Each HTTP answer's Plugd-Invocation-Id is its record's id.
    named.reverse();
    let http_ids: Vec<&str> = rows[..3]
        .iter()
        .map(|r| r["invocation_id"].as_str().unwrap())
        .collect();
    assert_eq!(http_ids, named);

    // Pages of 2 cover the five once each, in the same order.
    let mut seen = Vec::new();
    let mut path = "/v1/invocations?limit=2".to_owned();
    loop {
        let page = get_as(&serve, &viewer, &path).json();
        let ids = page["invocations"].as_array().unwrap();
        assert!(ids.len() <= 2);
        seen.extend(ids.iter().map(|r| r["invocation_id"].clone()));
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/invocations?limit=2&cursor={c}"),
            None => break,
        }
    }
    let order: Vec<_> = rows.iter().map(|r| r["invocation_id"].clone()).collect();
    assert_eq!(seen, order);
    assert_eq!(
        seen.iter()
            .map(Value::to_string)
            .collect::<BTreeSet<_>>()
            .len(),
        5
    );

    // Filters.
    let failed_only = get_as(&serve, &viewer, "/v1/invocations?status=failed").json();
    assert_eq!(failed_only["invocations"].as_array().unwrap().len(), 1);
    let none = get_as(&serve, &viewer, "/v1/invocations?plugin=other").json();
    assert!(none["invocations"].as_array().unwrap().is_empty());
    let since = get_as(&serve, &viewer, "/v1/invocations?since=2999-01-01").json();
    assert!(since["invocations"].as_array().unwrap().is_empty());
    let tool = get_as(
        &serve,
        &viewer,
        "/v1/invocations?tool=hello_bash_greet&org=none",
    )
    .json();
    assert!(tool["invocations"].as_array().unwrap().is_empty());
    get_as(&serve, &viewer, "/v1/invocations?status=ok").error(400, "bad_request");
    get_as(&serve, &viewer, "/v1/invocations?limit=501").error(400, "bad_request");
    get_as(&serve, &viewer, "/v1/invocations?colour=red").error(400, "bad_request");

    // One record; an unknown one; no token.
    let id = failed["invocation_id"].as_str().unwrap();
    let one = get_as(&serve, &viewer, &format!("/v1/invocations/{id}")).json();
    assert_eq!(one["error_code"], "invalid_arguments");
    get_as(&serve, &viewer, "/v1/invocations/inv_nope").error(404, "unknown_invocation");
    let anon = request_as(&serve, "", "GET", "/v1/invocations", &[], None);
    assert_eq!(anon.status, 401, "{}", anon.text());

    // The counters.
    let metrics = serve.get("/metrics").text();
    assert!(
        metrics.contains("plugd_invocations_total{plugin=\"hello_bash\",status=\"succeeded\"} 3"),
        "{metrics}"
    );
    assert!(metrics.contains("plugd_invocation_duration_ms_count{plugin=\"hello_bash\""));
    assert!(metrics.contains("plugd_invocation_records_unwritten_total 0"));

    // An error answer and a streamed one name their records too.
    let refused = serve.post(
        "/v1/tools/hello_bash_greet:invoke",
        &json!({"args": {"name": 5}}),
    );
    refused.error(422, "invalid_arguments");
    let streamed = request_as(
        &serve,
        &serve.token,
        "POST",
        "/v1/tools/hello_bash_greet:invoke",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "text/event-stream"),
        ],
        Some(json!({"args": {"name": "Ev"}}).to_string().as_bytes()),
    );
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    assert!(
        streamed.text().contains("event: result"),
        "{}",
        streamed.text()
    );
    for (answer, status) in [(&refused, "failed"), (&streamed, "succeeded")] {
        let id = answer.header("plugd-invocation-id").unwrap();
        let one = (0..100)
            .find_map(|_| {
                let r = get_as(&serve, &viewer, &format!("/v1/invocations/{id}"));
                if r.status == 200 {
                    return Some(r.json());
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
                None
            })
            .unwrap_or_else(|| panic!("no record {id}"));
        assert_eq!(one["status"], status, "{one}");
        assert_eq!(one["surface"], "http", "{one}");
    }
}

/// Every record of `rt`, newest first, once the writer has written them.
async fn records(rt: &plugd_runtime::Runtime) -> Vec<plugd_control::InvocationRecord> {
    tokio::task::block_in_place(|| rt.invocations().flush());
    rt.state()
        .list_invocations(&plugd_control::InvocationFilter {
            limit: 500,
            ..Default::default()
        })
        .await
        .unwrap()
        .invocations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vai_calls_record_their_context_timeouts_and_cancels() {
    use plugd_control::TerminalStatus;
    use plugd_host::dialect::CallContext;

    let ws = Ws::new();
    crate::vai::package(&ws, "good", "good", &[]);
    let rt = crate::vai::approved(&ws, "test/good", crate::support::quick(1_000)).await;
    let ctx = CallContext {
        trace_id: Some("tr_rec".into()),
        org_id: Some("org_1".into()),
        project_id: Some("proj_1".into()),
        session_id: Some("sess_1".into()),
        caller: Some("token:ci".into()),
        ..CallContext::default()
    };
    let got = rt
        .call_tool_with("test/good/echo", json!({"q": "x"}), &ctx)
        .await
        .unwrap();
    let sent_id = got["structured_output"]["context"]["invocation_id"].clone();
    // A call past the 1 s deadline; one whose caller gives up.
    let err = rt
        .call_tool("test/good/sleep", json!({"ms": 5_000}), None)
        .await
        .unwrap_err();
    let rt2 = rt.clone();
    let gone = tokio::spawn(async move {
        rt2.call_tool("test/good/sleep", json!({"ms": 800}), Some("a1"))
            .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    gone.abort();
    let _ = gone.await;

    let all = records(&rt).await;
    assert_eq!(all.len(), 3, "{all:#?}");
    let (cancelled, timed_out, echo) = (&all[0], &all[1], &all[2]);
    assert_eq!(echo.status, TerminalStatus::Succeeded);
    assert_eq!(echo.dialect, "vai");
    assert_eq!(
        (echo.tool.as_str(), echo.export_id.as_str()),
        ("test/good/echo", "echo")
    );
    assert_eq!(json!(echo.invocation_id), sent_id, "the id the plugin got");
    assert_eq!(echo.org_id.as_deref(), Some("org_1"));
    assert_eq!(echo.project_id.as_deref(), Some("proj_1"));
    assert_eq!(echo.session_id.as_deref(), Some("sess_1"));
    assert_eq!(echo.trace_id.as_deref(), Some("tr_rec"));
    assert_eq!(echo.caller.as_deref(), Some("token:ci"));
    assert!(echo.execution_class.is_some());
    assert_eq!(
        timed_out.status,
        TerminalStatus::RetryableFailure,
        "{err:?} → {timed_out:?}"
    );
    assert_eq!(timed_out.error_code.as_deref(), Some("timeout"));
    assert!(timed_out.duration_ms >= 900, "{timed_out:?}");
    assert_eq!(cancelled.status, TerminalStatus::Cancelled);
    assert_eq!(cancelled.caller.as_deref(), Some("agent:a1"));
    let counts = rt.invocations().stats().by_plugin();
    assert_eq!(counts.iter().map(|(_, c)| c.calls).sum::<u64>(), 3);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_calls_are_recorded_like_any_other() {
    use plugd_control::TerminalStatus;

    let ws = crate::mcp::mcp_ws(json!({"everything": crate::mcp::everything()}));
    let rt = ws.runtime(crate::support::quick(10_000)).await;
    rt.approve("everything", "test").await.unwrap();
    rt.call_tool("everything/echo", json!({"message": "hi"}), None)
        .await
        .unwrap();
    let bad = rt.call_tool("everything/echo", json!({}), None).await;
    assert!(bad.is_err());
    let all = records(&rt).await;
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(
        all.iter()
            .all(|r| r.dialect == "mcp" && r.plugin_id == "everything")
    );
    assert_eq!(all[1].status, TerminalStatus::Succeeded);
    assert_eq!(all[1].export_id, "echo");
    assert_eq!(all[0].status, TerminalStatus::Failed);
    assert_eq!(all[0].error_code.as_deref(), Some("invalid_arguments"));
    rt.shutdown().await;
}
