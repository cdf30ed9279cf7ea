//! The router and its errors without a socket (`ServiceExt::oneshot`): each
//! error type's fixed status and body, and each endpoint's refusals.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use plugd_agent::agent::{TurnOutcome, TurnStatus};
use plugd_agent::hooks::build::build_pipeline;
use plugd_host::HostConfig;
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::hooks::{HookPoint, Notice, NoticeKind};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;

mod fleet;

/// A workspace with `yaml` as plugd.yaml (none when empty) and its router.
async fn app(yaml: &str, limit: usize) -> (tempfile::TempDir, Router) {
    let tmp = tempfile::tempdir().unwrap();
    // The script of configurations with `llm: {provider: scripted}`.
    std::fs::write(tmp.path().join("turns.yaml"), "steps:\n  - text: hello\n").unwrap();
    if !yaml.is_empty() {
        std::fs::write(tmp.path().join("plugd.yaml"), yaml).unwrap();
    }
    let rt = plugd_agent::open(tmp.path(), HostConfig::default())
        .await
        .unwrap();
    let config = PlugdConfig::load(tmp.path()).unwrap();
    let pipeline = Arc::new(build_pipeline(&config, &rt).await.unwrap());
    let agent = agent_for(&rt, &pipeline, &config).await.unwrap();
    let state = AppState::new(rt, pipeline, Arc::new(config), agent).with_body_limit(limit);
    (tmp, router(state))
}

async fn call(app: &Router, mut req: Request<Body>) -> (StatusCode, Value) {
    // Requests come from this user over the socket unless a test says otherwise.
    if req.extensions().get::<auth::Peer>().is_none() {
        req.extensions_mut().insert(auth::Peer::local_owner());
    }
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

fn post(uri: &str, content_type: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut b = Request::post(uri);
    if let Some(ct) = content_type {
        b = b.header("content-type", ct);
    }
    b.body(body.into()).unwrap()
}

fn post_json(uri: &str, body: Value) -> Request<Body> {
    post(uri, Some("application/json"), body.to_string())
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

#[track_caller]
fn assert_error(got: &(StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["error"]["code"], code, "{}", got.1);
    assert!(
        got.1["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{}",
        got.1
    );
}

fn outcome(codes: &[&str]) -> TurnOutcome {
    TurnOutcome {
        session_id: "s1".into(),
        status: TurnStatus::Blocked,
        reply: None,
        message: Some("no".into()),
        blocked_at: Some(HookPoint::BeforeLlmRequest),
        notices: codes
            .iter()
            .map(|c| Notice::new(NoticeKind::Block, Some(c), "no"))
            .collect(),
        tool_calls: vec![],
        rounds: 0,
        usage: Default::default(),
        run_id: None,
        chain_id: None,
        compaction_id: None,
    }
}

#[test]
fn error_types_have_fixed_statuses_and_bodies() {
    let e = ApiError::too_large(10);
    assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        e.body(),
        json!({"error": {"code": "payload_too_large",
            "message": "the request body is larger than the 10-byte limit; send less",
            "details": {"limit": 10}}})
    );
    let parse = serde_json::from_str::<Value>("{\n  \"a\": }").unwrap_err();
    let e = ApiError::json(&parse);
    assert_eq!(e.status, StatusCode::BAD_REQUEST);
    assert_eq!(e.code, "malformed_json");
    assert_eq!(e.details, Some(json!({"line": 2, "column": 8})));
    let shape = serde_json::from_str::<MessageRequest>("{\"txt\": 1}").unwrap_err();
    assert_eq!(
        ApiError::json(&shape).status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(ApiError::json(&shape).code, "invalid_body");

    let blocked = ApiError::blocked(&outcome(&["INPUT_TOO_LONG"]));
    assert_eq!(
        (blocked.status, blocked.code),
        (StatusCode::FORBIDDEN, "turn_blocked")
    );
    let body = blocked.body();
    assert_eq!(body["outcome"]["status"], "blocked");
    assert_eq!(
        body["error"]["message"],
        "the turn was blocked at before_llm_request: no"
    );
    let quota = ApiError::blocked(&outcome(&["INPUT_TOO_LONG", "QUOTA_EXCEEDED"]));
    assert_eq!(
        (quota.status, quota.code),
        (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded")
    );
    let auth = ApiError::blocked(&outcome(&["QUOTA_EXCEEDED", "UNAUTHORIZED"]));
    assert_eq!(
        (auth.status, auth.code),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );

    let e = ApiError::from(plugd_runtime::RuntimeError::UnknownTool("nope".into()));
    assert_eq!((e.status, e.code), (StatusCode::NOT_FOUND, "unknown_tool"));
    let e = ApiError::from(plugd_runtime::RuntimeError::Changed {
        plugin: "p".into(),
        tool: "p_t".into(),
        files: "changed main.py".into(),
    });
    assert_eq!((e.status, e.code), (StatusCode::CONFLICT, "plugin_changed"));
    assert!(
        e.message.contains("changed main.py") && e.message.contains("plugd plugin approve p"),
        "{}",
        e.message
    );
    let e = ApiError::from(AgentError::BadSession("a b".into()));
    assert_eq!(
        (e.status, e.code),
        (StatusCode::BAD_REQUEST, "invalid_session_id")
    );
    let e = ApiError::from(AgentError::Store("disk full".into()));
    assert_eq!(
        (e.status, e.code),
        (StatusCode::INTERNAL_SERVER_ERROR, "internal")
    );
}

#[test]
fn only_loopback_addresses_may_listen() {
    for ok in [
        "127.0.0.1:0",
        "[::1]:0",
        "127.1.2.3:80",
        "[::ffff:127.0.0.1]:0",
    ] {
        let addr: SocketAddr = ok.parse().unwrap();
        check_listen(addr).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for bad in [
        "0.0.0.0:0",
        "[::]:0",
        "10.0.0.1:7777",
        "[::ffff:10.0.0.1]:0",
    ] {
        let addr: SocketAddr = bad.parse().unwrap();
        let err = check_listen(addr).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "refusing to listen on {addr}: it is not a loopback address"
            )),
            "{err}"
        );
    }
}

#[tokio::test]
async fn listings_are_json_arrays() {
    let (_tmp, app) = app("", DEFAULT_BODY_LIMIT).await;
    assert_eq!(
        call(&app, get("/v1/plugins")).await,
        (StatusCode::OK, json!([]))
    );
    assert_eq!(
        call(&app, get("/v1/tools")).await,
        (StatusCode::OK, json!([]))
    );
}

#[tokio::test]
async fn bodies_are_checked_before_any_work() {
    let (_tmp, app) = app("", 64).await;
    let got = call(
        &app,
        post(
            "/v1/tools/x:invoke",
            Some("application/json"),
            "{\"args\": [",
        ),
    )
    .await;
    assert_error(&got, StatusCode::BAD_REQUEST, "malformed_json");
    assert_eq!(got.1["error"]["details"], json!({"line": 1, "column": 10}));
    assert!(
        got.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("(line 1, column 10)"),
        "{}",
        got.1
    );
    let got = call(&app, post("/v1/tools/x:invoke", Some("text/plain"), "{}")).await;
    assert_error(
        &got,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
    let big = json!({"args": {"pad": "x".repeat(100)}}).to_string();
    let got = call(
        &app,
        post("/v1/tools/x:invoke", Some("application/json"), big),
    )
    .await;
    assert_error(&got, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert_eq!(got.1["error"]["details"]["limit"], 64);
    let got = call(&app, post_json("/v1/tools/x:invoke", json!({"argz": {}}))).await;
    assert_error(&got, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    let got = call(&app, post_json("/v1/tools/x:invoke", json!({"args": [1]}))).await;
    assert_error(&got, StatusCode::UNPROCESSABLE_ENTITY, "invalid_arguments");
    // An empty body without a content type means `{}`.
    let got = call(&app, post("/v1/tools/nope:invoke", None, Body::empty())).await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_tool");
    assert_eq!(
        got.1["error"]["message"],
        "no tool \"nope\"; `plugd tool list` shows the tools of approved plugins"
    );
}

#[tokio::test]
async fn unknown_routes_points_and_methods_are_json_errors() {
    let (_tmp, app) = app("", DEFAULT_BODY_LIMIT).await;
    assert_error(
        &call(&app, get("/v2/x")).await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_error(
        &call(&app, post_json("/v1/tools/a/b", json!({}))).await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_error(
        &call(&app, post_json("/v1/plugins", json!({}))).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    let got = call(
        &app,
        post_json("/v1/hooks/before_lunch:run", json!({"payload": {}})),
    )
    .await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_hook_point");
    assert_eq!(got.1["error"]["details"]["point"], "before_lunch");
    let got = call(
        &app,
        post_json("/v1/hooks/before_message:run", json!({"payload": 3})),
    )
    .await;
    assert_error(&got, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
}

#[tokio::test]
async fn hook_runs_answer_200_continue_or_blocked() {
    let (_tmp, app) = app(
        "plugins:\n  contentPolicy: {priority: 10, maxInputChars: 5}\n",
        DEFAULT_BODY_LIMIT,
    )
    .await;
    let got = call(
        &app,
        post_json(
            "/v1/hooks/before_llm_request:run",
            json!({"payload": {"text": "hi"}}),
        ),
    )
    .await;
    assert_eq!(
        got,
        (
            StatusCode::OK,
            json!({"outcome": "continue", "payload": {"text": "hi"}, "message": null, "notices": []})
        )
    );
    let got = call(
        &app,
        post_json(
            "/v1/hooks/before_llm_request:run",
            json!({"payload": {"text": "too long"}, "context": {"tenant_id": "t"}}),
        ),
    )
    .await;
    assert_eq!(got.0, StatusCode::OK);
    assert_eq!(got.1["outcome"], "blocked");
    assert_eq!(got.1["notices"][0]["code"], "INPUT_TOO_LONG");
}

#[tokio::test]
async fn sessions_without_an_llm_answer_503() {
    let (_tmp, app) = app("", DEFAULT_BODY_LIMIT).await;
    let got = call(
        &app,
        post_json("/v1/sessions/s1/messages", json!({"text": "hi"})),
    )
    .await;
    assert_error(&got, StatusCode::SERVICE_UNAVAILABLE, "llm_not_configured");
    assert!(
        got.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("has no llm: section"),
        "{}",
        got.1
    );
    // Reading sessions is the store's, with or without an LLM.
    let got = call(&app, get("/v1/sessions/s1")).await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_session");
}

#[tokio::test]
async fn unknown_sessions_are_404() {
    let (_tmp, app) = app(
        "llm: {provider: scripted, script: \"${{workspace_dir}}/turns.yaml\"}\n",
        DEFAULT_BODY_LIMIT,
    )
    .await;
    let got = call(&app, get("/v1/sessions/never-seen")).await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_session");
}

#[tokio::test]
async fn plugin_actions_route_slash_ids_and_refuse_unknown_ones() {
    let (_tmp, app) = app("", DEFAULT_BODY_LIMIT).await;
    assert_eq!(
        PluginAction::split("@acme/pkg:restart"),
        Some(("@acme/pkg", PluginAction::Restart))
    );
    assert_eq!(
        PluginAction::split("a:b:approve"),
        Some(("a:b", PluginAction::Approve))
    );
    assert_eq!(PluginAction::split(":revoke"), None);
    assert_eq!(PluginAction::split("x:explode"), None);
    for action in PluginAction::ALL {
        let got = call(
            &app,
            post_json(
                &format!("/v1/plugins/@acme/nope:{}", action.name()),
                json!({}),
            ),
        )
        .await;
        assert_error(&got, StatusCode::NOT_FOUND, error::code::UNKNOWN_PLUGIN);
    }
    let got = call(&app, post_json("/v1/plugins/x:explode", json!({}))).await;
    assert_error(&got, StatusCode::NOT_FOUND, error::code::NOT_FOUND);
    let got = call(&app, post_json("/v1/plugins/x:approve", json!({"who": 1}))).await;
    assert_eq!(got.0, StatusCode::UNPROCESSABLE_ENTITY, "{}", got.1);
}

/// A TCP peer on 127.0.0.1:7777 for `req`, with `Host` set to it.
fn over_tcp(mut req: Request<Body>, token: Option<&str>) -> Request<Body> {
    let local: std::net::SocketAddr = "127.0.0.1:7777".parse().unwrap();
    req.extensions_mut().insert(auth::Peer::Tcp {
        remote: "127.0.0.1:50000".parse().unwrap(),
        local,
    });
    let h = req.headers_mut();
    h.insert("host", "127.0.0.1:7777".parse().unwrap());
    if let Some(t) = token {
        h.insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    req
}

#[tokio::test]
async fn tcp_needs_a_token_and_each_role_gets_its_routes_only() {
    let (tmp, app) = app("", DEFAULT_BODY_LIMIT).await;
    let store = plugd_store::Store::open(&tmp.path().join(".plugd")).unwrap();
    let token = |name: &str, role: plugd_store::tokens::Role| {
        store.token_create(name, role, None, "test").unwrap().token
    };
    use plugd_store::tokens::Role;
    let (admin, operator, agent, viewer) = (
        token("a", Role::Admin),
        token("o", Role::Operator),
        token("g", Role::Agent),
        token("v", Role::Viewer),
    );
    // No token: 401 with how to get one; /healthz is open.
    let (s, v) = call(&app, over_tcp(get("/v1/plugins"), None)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(v["error"]["code"], "unauthenticated");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("plugd token create"),
        "{v}"
    );
    let (s, v) = call(&app, over_tcp(get("/healthz"), None)).await;
    assert_eq!((s, v["status"].clone()), (StatusCode::OK, json!("ok")));
    // A wrong token, a revoked one.
    let (s, _) = call(&app, over_tcp(get("/v1/plugins"), Some("plugd_0_0"))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let gone = token("gone", Role::Admin);
    store.token_revoke("gone").unwrap();
    let (s, v) = call(&app, over_tcp(get("/v1/plugins"), Some(&gone))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("revoked"),
        "{v}"
    );

    let approve = || post("/v1/plugins/nope:approve", Some("application/json"), "{}");
    let invoke = || {
        post(
            "/v1/tools/nope:invoke",
            Some("application/json"),
            "{\"args\":{}}",
        )
    };
    let decide = || post("/v1/approvals/apr_x:deny", Some("application/json"), "{}");
    // (token, request, allowed?) — allowed requests reach the handler (404
    // for the unknown names), refused ones get 403 naming the role needed.
    let cases: Vec<(&str, Request<Body>, Option<&str>)> = vec![
        (&viewer, get("/v1/plugins"), None),
        (&viewer, get("/v1/approvals"), None),
        (&viewer, invoke(), Some("agent")),
        (&viewer, approve(), Some("operator")),
        (&agent, invoke(), None),
        (&agent, approve(), Some("operator")),
        (&agent, decide(), Some("operator")),
        (&operator, approve(), None),
        (&operator, decide(), None),
        (&operator, invoke(), Some("agent")),
        (&admin, approve(), None),
        (&admin, invoke(), None),
        (&admin, decide(), None),
    ];
    for (tok, req, refused) in cases {
        let what = format!("{} {}", req.method(), req.uri());
        let (s, v) = call(&app, over_tcp(req, Some(tok))).await;
        match refused {
            Some(role) => {
                assert_eq!(s, StatusCode::FORBIDDEN, "{what}: {v}");
                let msg = v["error"]["message"].as_str().unwrap();
                assert!(
                    msg.contains(&format!("needs the {role} role")),
                    "{what}: {msg}"
                );
            }
            None => assert!(
                s == StatusCode::OK || s == StatusCode::NOT_FOUND,
                "{what} should pass auth: {s} {v}"
            ),
        }
    }
    // State-changing requests are audited under the token's name (by the
    // audit writer's thread: give it a moment).
    let audited = |a: &[plugd_store::tokens::AuditEntry]| {
        a.iter()
            .any(|e| e.identity == "token:o" && e.path == "/v1/plugins/nope:approve")
    };
    for _ in 0..200 {
        if audited(&store.audit_list(100).unwrap()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let audit = store.audit_list(100).unwrap();
    assert!(audited(&audit), "{audit:?}");
    assert!(
        !audit.iter().any(|e| e.method == "GET"),
        "reads are not audited: {audit:?}"
    );
}

#[tokio::test]
async fn foreign_hosts_origins_and_socket_users_are_refused() {
    let (tmp, app) = app("", DEFAULT_BODY_LIMIT).await;
    let store = plugd_store::Store::open(&tmp.path().join(".plugd")).unwrap();
    let admin = store
        .token_create("a", plugd_store::tokens::Role::Admin, None, "test")
        .unwrap()
        .token;
    // DNS rebinding: a valid token does not help with a foreign Host.
    let mut req = over_tcp(get("/v1/plugins"), Some(&admin));
    req.headers_mut()
        .insert("host", "evil.example:7777".parse().unwrap());
    let (s, v) = call(&app, req).await;
    assert_eq!(
        (s, v["error"]["code"].clone()),
        (StatusCode::FORBIDDEN, json!("forbidden_host"))
    );
    // localhost is the same listener.
    let mut req = over_tcp(get("/v1/plugins"), Some(&admin));
    req.headers_mut()
        .insert("host", "localhost:7777".parse().unwrap());
    assert_eq!(call(&app, req).await.0, StatusCode::OK);
    // Cross-origin state changes are refused; same-origin ones pass.
    for (origin, ok) in [
        ("http://evil.example", false),
        ("null", false),
        ("http://127.0.0.1:7778", false),
        ("http://127.0.0.1:7777", true),
    ] {
        let mut req = over_tcp(
            post("/v1/plugins/nope:revoke", Some("application/json"), "{}"),
            Some(&admin),
        );
        req.headers_mut().insert("origin", origin.parse().unwrap());
        let (s, v) = call(&app, req).await;
        if ok {
            assert_eq!(s, StatusCode::NOT_FOUND, "{origin}: {v}");
        } else {
            assert_eq!(
                (s, v["error"]["code"].clone()),
                (StatusCode::FORBIDDEN, json!("cross_origin")),
                "{origin}"
            );
        }
    }
    let mut req = over_tcp(
        post("/v1/plugins/nope:revoke", Some("application/json"), "{}"),
        Some(&admin),
    );
    req.headers_mut()
        .insert("sec-fetch-site", "cross-site".parse().unwrap());
    assert_eq!(call(&app, req).await.0, StatusCode::FORBIDDEN);
    // A socket peer of another user is refused; root and the owner are admins.
    let mut req = get("/v1/plugins");
    req.extensions_mut().insert(auth::Peer::Unix {
        uid: 4242,
        pid: Some(1),
    });
    let (s, v) = call(&app, req).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("uid 4242"),
        "{v}"
    );
    let mut req = get("/v1/plugins");
    req.extensions_mut()
        .insert(auth::Peer::Unix { uid: 0, pid: None });
    assert_eq!(call(&app, req).await.0, StatusCode::OK);
    // Without a peer at all (not through a listener): refused.
    let resp = app.clone().oneshot(get("/v1/plugins")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn an_agent_token_publishes_only_on_its_grants_and_as_itself() {
    let yaml = "broker:\n  grants:\n    \"token:bot\": {publish: [\"agent.bot.>\"]}\n";
    let (tmp, app) = app(yaml, DEFAULT_BODY_LIMIT).await;
    let store = plugd_store::Store::open(&tmp.path().join(".plugd")).unwrap();
    let bot = store
        .token_create("bot", plugd_store::tokens::Role::Agent, None, "test")
        .unwrap()
        .token;
    let other = store
        .token_create("other", plugd_store::tokens::Role::Agent, None, "test")
        .unwrap()
        .token;
    let publish = |subject: &str| {
        post(
            "/v1/bus/publish",
            Some("application/json"),
            json!({"subject": subject, "source": "hello_python"}).to_string(),
        )
    };
    let (s, v) = call(&app, over_tcp(publish("agent.bot.x"), Some(&bot))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["event"]["source"], "token:bot", "no impersonation: {v}");
    for (tok, subject) in [
        (&bot, "plugin.outbound.slack"),
        (&bot, "agent.other"),
        (&other, "agent.bot.x"),
    ] {
        let (s, v) = call(&app, over_tcp(publish(subject), Some(tok))).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{subject}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("broker.grants"),
            "{v}"
        );
    }
}

#[test]
fn mcp_feature_errors_have_fixed_statuses() {
    use plugd_dialects::FeatureError;
    use plugd_runtime::RuntimeError;
    let cases = [
        (
            RuntimeError::Feature(FeatureError::NotDeclared {
                server: "s".into(),
                capability: "prompts",
                method: "prompts/list",
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "capability_missing",
            json!({"server": "s", "capability": "prompts", "method": "prompts/list"}),
        ),
        (
            RuntimeError::Feature(FeatureError::NotSupported {
                plugin: "n".into(),
                dialect: "native".into(),
                feature: "resources",
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "not_supported_by_dialect",
            json!({"server": "n", "dialect": "native"}),
        ),
        (
            RuntimeError::Feature(FeatureError::Malformed {
                server: "s".into(),
                method: "resources/read",
                reason: "x".into(),
            }),
            StatusCode::BAD_GATEWAY,
            "plugin_error",
            json!({"server": "s", "method": "resources/read"}),
        ),
        (
            RuntimeError::NotApproved { plugin: "s".into() },
            StatusCode::FORBIDDEN,
            "plugin_not_approved",
            json!({"plugin": "s"}),
        ),
        (
            RuntimeError::ResourcesDenied {
                server: "s".into(),
                why: "no".into(),
            },
            StatusCode::FORBIDDEN,
            "resources_denied",
            json!({"server": "s"}),
        ),
        (
            RuntimeError::PluginChanged {
                plugin: "s".into(),
                files: "a.py changed".into(),
            },
            StatusCode::CONFLICT,
            "plugin_changed",
            json!({"plugin": "s"}),
        ),
    ];
    for (err, status, code, details) in cases {
        let message = err.to_string();
        let e = ApiError::from(err);
        assert_eq!((e.status, e.code), (status, code), "{message}");
        assert_eq!(e.message, message);
        assert_eq!(e.details, Some(details), "{code}");
    }
}

#[tokio::test]
async fn mcp_routes_list_nothing_in_an_empty_workspace_and_check_their_input() {
    let (_tmp, app) = app("", DEFAULT_BODY_LIMIT).await;
    assert_eq!(
        call(&app, get("/v1/resources")).await,
        (StatusCode::OK, json!({"resources": [], "errors": []}))
    );
    assert_eq!(
        call(&app, get("/v1/resources/templates")).await,
        (StatusCode::OK, json!({"templates": [], "errors": []}))
    );
    assert_eq!(
        call(&app, get("/v1/prompts")).await,
        (StatusCode::OK, json!({"prompts": [], "errors": []}))
    );
    let got = call(&app, get("/v1/prompts?server=nobody")).await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_plugin");
    let got = call(&app, get("/v1/resources?sever=x")).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "bad_request");
    let got = call(
        &app,
        post_json("/v1/resources:read", json!({"server": "s", "url": "x"})),
    )
    .await;
    assert_error(&got, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");
    let got = call(
        &app,
        post_json(
            "/v1/completions",
            json!({"server": "nobody", "ref": {"type": "ref/prompt", "name": "p"}, "argument": {"name": "a", "value": ""}}),
        ),
    )
    .await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_plugin");
}

/// Every route template the router declares: each `.route("…"` in this
/// crate's sources and in the console's (its assets), read from the files,
/// so a route added anywhere is walked without touching this test.
fn declared_routes() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [root.join("src"), root.join("../plugd-console/src")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
                files.push(path);
            }
        }
    }
    let mut routes = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        // A file's own unit tests (its `#[cfg(test)]` module, at the end)
        // build apps of their own, not the API's router.
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut rest = text;
        while let Some(i) = rest.find(".route(") {
            rest = &rest[i + ".route(".len()..];
            let t = rest.trim_start();
            if let Some(lit) = t.strip_prefix('"') {
                let end = lit.find('"').unwrap();
                routes.push(lit[..end].to_owned());
            }
        }
    }
    routes.sort();
    routes.dedup();
    routes
}

/// Concrete paths of `template`: each parameter filled, the last one with
/// every action suffix a handler dispatches on.
fn canonical_paths(template: &str) -> Vec<String> {
    const SUFFIXES: [&str; 16] = [
        "",
        ":invoke",
        ":enable",
        ":disable",
        ":approve",
        ":revoke",
        ":restart",
        ":reconfigure",
        ":start",
        ":stop",
        ":deny",
        ":install",
        ":validate",
        ":run",
        "/config",
        "/logs",
    ];
    let params = template.matches('{').count();
    if params == 0 {
        return vec![template.to_owned()];
    }
    SUFFIXES
        .iter()
        .filter_map(|suffix| {
            let mut out = String::new();
            let mut rest = template;
            let mut n = 0;
            while let Some(open) = rest.find('{') {
                out.push_str(&rest[..open]);
                let close = rest[open..].find('}').unwrap() + open;
                let wildcard = rest[open + 1..].starts_with('*');
                n += 1;
                if suffix.starts_with('/') && !wildcard {
                    return None;
                }
                out.push_str(if wildcard { "a/b" } else { "x" });
                if n == params {
                    out.push_str(suffix);
                }
                rest = &rest[close + 1..];
            }
            out.push_str(rest);
            Some(out)
        })
        .collect()
}

/// Spellings of `path` that a string check could take for another route:
/// encoded `:`, `/`, `.` and letters, doubled and trailing slashes, dot
/// segments.
fn spellings(path: &str) -> Vec<String> {
    let mut v = vec![
        path.replace(':', "%3A"),
        path.replace(':', "%3a"),
        path.replace('/', "//"),
        format!("/{path}"),
        format!("{path}/"),
        format!("{}/", path.replace(':', "%3A")),
        path.replace('.', "%2e"),
    ];
    if let Some(i) = path.rfind('/').filter(|i| *i > 0) {
        let (head, last) = (&path[..i], &path[i + 1..]);
        v.push(format!("{head}%2F{last}"));
        v.push(format!("{head}%2f{last}"));
        v.push(format!("{head}//{last}"));
        v.push(format!("{head}/%2e/{last}"));
        v.push(format!("{head}/./{last}"));
        v.push(format!("{head}/x/%2e%2e/{last}"));
        let encoded: String = last.bytes().map(|b| format!("%{b:02X}")).collect();
        v.push(format!("{head}/{encoded}"));
    }
    v.retain(|s| s != path);
    v
}

#[tokio::test]
async fn no_spelling_of_a_route_reaches_it_with_less_right() {
    use plugd_store::tokens::Role;
    // The opt-in routes mounted too, so that every declared one is walked.
    const LEGACY_SSE_ON: &str = "mcp:\n  http:\n    legacy_sse: true\n";
    let (tmp, app) = app(LEGACY_SSE_ON, DEFAULT_BODY_LIMIT).await;
    let store = plugd_store::Store::open(&tmp.path().join(".plugd")).unwrap();
    let token =
        |name: &str, role: Role| store.token_create(name, role, None, "test").unwrap().token;
    let admin = token("walk-admin", Role::Admin);
    let roles = [
        (Role::Agent, token("walk-agent", Role::Agent)),
        (Role::Viewer, token("walk-viewer", Role::Viewer)),
    ];
    // What a request reached: the right it was checked against when it got
    // to a handler, `None` when it did not.
    let send = |method: &'static str, path: String, tok: String| {
        let app = app.clone();
        async move {
            // `//v1/…` would parse as an authority: build the origin form.
            let mut parts = axum::http::uri::Parts::default();
            parts.path_and_query = Some(path.parse().unwrap_or_else(|e| panic!("{path}: {e}")));
            let req = Request::builder()
                .method(method)
                .uri(Uri::from_parts(parts).unwrap())
                .header("content-type", "application/json")
                .body(Body::from("{}"))
                .unwrap();
            let resp = app.oneshot(over_tcp(req, Some(&tok))).await.unwrap();
            let status = resp.status();
            let reached = resp.extensions().get::<auth::Authorized>().cloned();
            (status, reached)
        }
    };
    let routes = declared_routes();
    assert!(routes.len() >= 50, "too few routes found: {routes:?}");
    assert!(
        routes.iter().any(|r| r == "/v1/tools/{*name}"),
        "{routes:?}"
    );
    let mut walked = 0;
    for template in &routes {
        let mut mounted = false;
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            for canonical in canonical_paths(template) {
                let (_, reached) = send(method, canonical.clone(), admin.clone()).await;
                let Some(need) = reached else { continue };
                mounted = true;
                assert_eq!(&need.route, template, "{method} {canonical}");
                for (role, tok) in &roles {
                    if auth::allows(*role, need.right) {
                        continue;
                    }
                    let (status, got) = send(method, canonical.clone(), tok.clone()).await;
                    assert!(
                        got.is_none() && status == StatusCode::FORBIDDEN,
                        "{role} reached {method} {canonical} ({status}, {got:?}), which needs {:?}",
                        need.right
                    );
                    for variant in spellings(&canonical) {
                        let (status, got) = send(method, variant.clone(), tok.clone()).await;
                        walked += 1;
                        assert!(
                            got.is_none(),
                            "{role} reached a handler with {method} {variant} ({status}, {got:?}) though {canonical} needs {:?}",
                            need.right
                        );
                        assert!(
                            matches!(
                                status,
                                StatusCode::FORBIDDEN
                                    | StatusCode::NOT_FOUND
                                    | StatusCode::METHOD_NOT_ALLOWED
                                    | StatusCode::BAD_REQUEST
                            ),
                            "{role} {method} {variant}: {status}"
                        );
                    }
                }
            }
        }
        assert!(
            mounted,
            "{template} is declared but no method of it reaches a handler"
        );
    }
    assert!(walked > 500, "only {walked} spellings walked");
    // The one of the issue: an agent may not disable a tool by encoding `:`.
    let (agent_role, agent) = &roles[0];
    assert_eq!(*agent_role, Role::Agent);
    let (status, got) = send("POST", "/v1/tools/x%3Adisable".into(), agent.clone()).await;
    assert_eq!((status, got), (StatusCode::FORBIDDEN, None));
    // An unmatched path is 404, and only after authentication.
    let (status, _) = send("POST", "/v1/nowhere".into(), "plugd_0_0".into()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = send("POST", "/v1/nowhere".into(), agent.clone()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
