//! Dexto plugin modules in real Node host processes, through `dexto::load`
//! and the hook `Pipeline` (no YAML): loader validation, modify, cancel,
//! throwing, hanging, spinning and exiting modules, logger forwarding,
//! cleanup, console noise, and the seed's tenant-auth example.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plugd_agent::hooks::dexto::{self, DextoModule, DextoOptions};
use plugd_host::spawn::process_group_alive;
use plugd_runtime::hooks::{
    HandlerSpec, HookContext, HookHandler, HookPoint, OnError, Outcome, OutcomeKind, Pipeline,
    PipelineError,
};
use serde_json::{Value, json};

use crate::support::{Ws, eventually, repo};

fn module(file: &str) -> PathBuf {
    repo().join("tests/plugins/dexto").join(file)
}

const DEXTO_POINTS: [HookPoint; 4] = [
    HookPoint::BeforeLlmRequest,
    HookPoint::BeforeToolCall,
    HookPoint::AfterToolResult,
    HookPoint::BeforeResponse,
];

fn spec(name: &str, priority: i64, blocking: bool, timeout_ms: u64) -> HandlerSpec {
    HandlerSpec {
        name: name.into(),
        points: DEXTO_POINTS.to_vec(),
        priority,
        blocking,
        on_error: None,
        timeout: Duration::from_millis(timeout_ms),
    }
}

async fn load_with(
    ws: &Ws,
    name: &str,
    path: &Path,
    config: Value,
    options: &DextoOptions,
) -> Result<Arc<DextoModule>, PipelineError> {
    dexto::load_module(name, path, &config, ws.dir(), options).await
}

async fn load(ws: &Ws, name: &str, file: &str, config: Value) -> Arc<DextoModule> {
    load_with(ws, name, &module(file), config, &DextoOptions::default())
        .await
        .unwrap_or_else(|e| panic!("loading {file}: {e}"))
}

fn pipeline(entries: Vec<(HandlerSpec, Arc<DextoModule>)>) -> Pipeline {
    Pipeline::new(
        entries
            .into_iter()
            .map(|(s, m)| (s, m as Arc<dyn HookHandler>))
            .collect(),
    )
    .unwrap()
}

fn codes(out: &Outcome) -> Vec<&str> {
    out.notices
        .iter()
        .filter_map(|n| n.code.as_deref())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_loader_failure_names_the_handler_the_module_and_the_cause() {
    let ws = Ws::new();
    let cases: &[(&str, &[&str])] = &[
        ("does-not-exist.mjs", &["does not exist"]),
        (
            "syntax.mjs",
            &["cannot be imported", "SyntaxError: Unexpected token ','"],
        ),
        (
            "no-default.mjs",
            &["has no default export", "export default class"],
        ),
        (
            "not-class.mjs",
            &["plugin 'h' default export must be a class"],
        ),
        (
            "ctor-throws.mjs",
            &["failed to instantiate plugin 'h': Error: constructor needs a database"],
        ),
        (
            "no-points.mjs",
            &[
                "plugin 'h' must implement at least one extension point method",
                "beforeLLMRequest, beforeToolCall, afterToolResult, beforeResponse",
            ],
        ),
        (
            "bad-initialize.mjs",
            &["plugin 'h' initialize must be a function"],
        ),
        (
            "init-throws.mjs",
            &[
                "failed to initialize plugin 'h': Error: missing TENANT_DB_URL (config: {\"region\":\"eu\"})",
                "plugd does not start with a broken plugin",
            ],
        ),
    ];
    for (file, wanted) in cases {
        let path = module(file);
        let err = load_with(
            &ws,
            "h",
            &path,
            json!({"region": "eu"}),
            &DextoOptions::default(),
        )
        .await
        .unwrap_err()
        .to_string();
        let head = format!(
            "hook handler \"h\" failed to initialize: dexto module {:?}",
            path
        );
        assert!(err.starts_with(&head), "{file}: {err}");
        for w in *wanted {
            assert!(err.contains(w), "{file}: wanted {w:?} in {err}");
        }
    }

    let relative = load_with(
        &ws,
        "h",
        Path::new("plugins/x.js"),
        json!({}),
        &DextoOptions::default(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        relative.contains("\"plugins/x.js\" is not an absolute path")
            && relative.contains("${{dexto.agent_dir}}/plugins/"),
        "{relative}"
    );
    let python = repo().join("tests/plugins/misbehave.py");
    let wrong = load_with(&ws, "h", &python, json!({}), &DextoOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        wrong.contains("is not a .js, .mjs, .cjs or .ts file"),
        "{wrong}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_missing_is_named() {
    let ws = Ws::new();
    let options = DextoOptions {
        node: "plugd-test-no-such-node".into(),
        ..DextoOptions::default()
    };
    let err = load_with(&ws, "h", &module("behave.mjs"), json!({}), &options)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("hook handler \"h\" failed to initialize: dexto module")
            && err.contains("needs Node.js, but \"plugd-test-no-such-node\" is not on PATH"),
        "{err}"
    );
}

/// Node here is 20 (no `--experimental-strip-types`) and there is no tsx:
/// the message says so. Where a loader exists the module must simply work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_needs_a_loader_and_says_so_without_one() {
    let ws = Ws::new();
    let r = load_with(
        &ws,
        "typed",
        &module("typed.ts"),
        json!({}),
        &DextoOptions::default(),
    )
    .await;
    let node = plugd_host::spawn::resolve_program("t", "node").unwrap();
    let version = node_version(&node);
    let v = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    let parts: Vec<u32> = v.split('.').filter_map(|p| p.parse().ok()).collect();
    let strip_types = parts.as_slice() >= [22, 6, 0].as_slice();
    let tsx = plugd_host::spawn::resolve_program("t", "tsx").is_ok();
    match r {
        Ok(m) => {
            assert!(strip_types || tsx, "loaded without a loader on node {v}");
            let p = pipeline(vec![(spec("typed", 1, true, 5000), m)]);
            let out = p
                .run(
                    HookPoint::BeforeToolCall,
                    json!({"toolName": "t"}),
                    &HookContext::default(),
                )
                .await;
            assert_eq!(out.payload["typed"], "t");
        }
        Err(e) => {
            let e = e.to_string();
            assert!(!strip_types && !tsx, "node {v}, tsx {tsx}: {e}");
            assert!(
                e.contains("is TypeScript, but no TypeScript loader is available")
                    && e.contains(&format!(
                        "node v{v} has no --experimental-strip-types (it needs 22.6 or newer) and tsx is not on PATH"
                    ))
                    && e.contains("typed.ts"),
                "{e}"
            );
        }
    }
}

fn node_version(node: &Path) -> std::process::Output {
    #[allow(clippy::disallowed_methods)] // a one-off probe in a test, not a plugin
    std::process::Command::new(node)
        .args(["-p", "process.versions.node"])
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commonjs_modules_load_both_ways() {
    let ws = Ws::new();
    let a = load(&ws, "cjs", "common.cjs", json!({})).await;
    let b = load(&ws, "emitted", "exports-default.js", json!({})).await;
    assert_eq!(a.points().await, [HookPoint::BeforeToolCall]);
    let p = pipeline(vec![
        (spec("cjs", 1, true, 5000), a),
        (spec("emitted", 2, true, 5000), b),
    ]);
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"toolName": "x"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue);
    assert_eq!(
        out.payload,
        json!({"toolName": "x!", "form": "exports.default"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modifications_pass_through_with_the_context_and_config() {
    let ws = Ws::new();
    let a = load(&ws, "a", "behave.mjs", json!({"tag": "a"})).await;
    let llm = json!({"provider": "openai", "model": "m-1", "maxTokens": 256, "maxIterations": 8});
    let options = DextoOptions {
        llm_config: llm.clone(),
        ..DextoOptions::default()
    };
    let b = load_with(
        &ws,
        "b",
        &module("behave.mjs"),
        json!({"tag": "b"}),
        &options,
    )
    .await
    .unwrap();
    // Registered out of order: priority decides.
    let p = pipeline(vec![
        (spec("b", 20, false, 5000), b),
        (spec("a", 10, true, 5000), a),
    ]);
    let ctx = HookContext {
        session_id: Some("s-1".into()),
        user_id: Some("u-1".into()),
        tenant_id: Some("t-1".into()),
        ..HookContext::default()
    };
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "modify", "toolName": "x", "args": {"q": 1}}),
            &ctx,
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");
    assert_eq!(out.payload["tag"], "ab", "b saw a's modification");
    assert_eq!(out.payload["args"], json!({"q": 1}));
    assert_eq!(
        out.payload["seen"],
        json!({"sessionId": "s-1", "userId": "u-1", "tenantId": "t-1"})
    );
    assert_eq!(out.payload["config"], json!({"tag": "b"}));
    assert_eq!(out.payload["llm"], llm, "context.llmConfig is the agent's");

    // afterToolResult is not implemented by the module: it passes untouched;
    // before_message is not a Dexto point: it passes too.
    for point in [HookPoint::AfterToolResult, HookPoint::BeforeMessage] {
        let out = p
            .run(point, json!({"act": "block"}), &HookContext::default())
            .await;
        assert_eq!(out.outcome, OutcomeKind::Continue);
        assert_eq!(out.payload, json!({"act": "block"}));
    }
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_cancel_stops_the_chain() {
    let ws = Ws::new();
    let guard = load(&ws, "guard", "behave.mjs", json!({"tag": "g"})).await;
    let later = load(&ws, "later", "behave.mjs", json!({"tag": "l"})).await;
    let p = pipeline(vec![
        (spec("guard", 10, true, 5000), guard),
        (spec("later", 20, true, 5000), later),
    ]);
    let out = p
        .run(
            HookPoint::BeforeLlmRequest,
            json!({"act": "block", "text": "hi"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Blocked);
    assert_eq!(out.message.as_deref(), Some("blocked by g"));
    assert_eq!(codes(&out), ["TEST_BLOCK"]);
    assert_eq!(out.notices[0].handler.as_deref(), Some("guard"));
    assert_eq!(out.payload, json!({"act": "block", "text": "hi"}));
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throwing_hook_is_a_handler_error_under_its_policy() {
    let ws = Ws::new();
    let m = load(&ws, "thrower", "behave.mjs", json!({"tag": "t"})).await;
    let blocking = pipeline(vec![(spec("thrower", 1, true, 5000), m.clone())]);
    let out = blocking
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "throw"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Blocked);
    let msg = out.message.clone().unwrap();
    assert!(
        msg.contains("hook handler \"thrower\" failed at before_tool_call")
            && msg.contains(&format!("dexto module {:?}", module("behave.mjs")))
            && msg.contains("beforeToolCall threw Error: boom in hook"),
        "{msg}"
    );
    assert_eq!(codes(&out), ["HOOK_FAILED"]);

    // The same module, on_error continue: a warning, and the chain goes on.
    let mut lenient = spec("thrower", 1, true, 5000);
    lenient.on_error = Some(OnError::Continue);
    let p = pipeline(vec![(lenient, m)]);
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "throw"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue);
    assert_eq!(codes(&out), ["HOOK_FAILED"]);
    // The host survived the throw.
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "modify"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.payload["tag"], "t");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_of_the_wrong_shape_are_errors_naming_the_module() {
    let ws = Ws::new();
    let m = load(&ws, "liar", "behave.mjs", json!({"tag": "x"})).await;
    let p = pipeline(vec![(spec("liar", 1, true, 5000), m)]);
    for (act, wanted) in [
        (
            "bad",
            "beforeToolCall returned a string; it must return a PluginResult",
        ),
        (
            "bad-ok",
            "beforeToolCall returned a PluginResult whose \"ok\" is a string (\"yes\")",
        ),
    ] {
        let out = p
            .run(
                HookPoint::BeforeToolCall,
                json!({ "act": act }),
                &HookContext::default(),
            )
            .await;
        assert_eq!(out.outcome, OutcomeKind::Blocked);
        let msg = out.message.unwrap();
        assert!(
            msg.contains(&format!("dexto module {:?}", module("behave.mjs")))
                && msg.contains(wanted),
            "{act}: {msg}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_never_resolves_times_out_and_the_next_call_works() {
    let ws = Ws::new();
    let m = load(&ws, "sleepy", "behave.mjs", json!({"tag": "s"})).await;
    let pid = m.pid().await.unwrap();
    let p = pipeline(vec![(spec("sleepy", 1, true, 300), m.clone())]);
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "hang"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Blocked);
    assert_eq!(codes(&out), ["HOOK_TIMEOUT"]);
    // The host still answers (a pending promise does not wedge it), and was
    // not restarted: the same process serves the next call.
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "modify"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");
    assert_eq!(out.payload["pid"], pid);
    // Even after the liveness ping had time to run.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(m.pid().await, Some(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_looping_host_is_killed_and_restarted() {
    let ws = Ws::new();
    let options = DextoOptions {
        liveness: Duration::from_millis(300),
        ..DextoOptions::default()
    };
    let m = load_with(
        &ws,
        "spinner",
        &module("behave.mjs"),
        json!({"tag": "s"}),
        &options,
    )
    .await
    .unwrap();
    let pid = m.pid().await.unwrap();
    let p = pipeline(vec![(spec("spinner", 1, true, 300), m.clone())]);
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "spin"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(codes(&out), ["HOOK_TIMEOUT"]);
    assert!(
        eventually(Duration::from_secs(10), || !process_group_alive(pid)).await,
        "the stuck host was killed"
    );
    let mut last = None;
    for _ in 0..20 {
        let out = p
            .run(
                HookPoint::BeforeToolCall,
                json!({"act": "modify"}),
                &HookContext::default(),
            )
            .await;
        if out.outcome == OutcomeKind::Continue {
            last = Some(out);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = last.expect("a restarted host answers");
    assert_ne!(out.payload["pid"], pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_exit_fails_the_call_and_the_next_call_restarts_and_reinitializes() {
    let ws = Ws::new();
    let marker = ws.dir().join("inits");
    let m = load(
        &ws,
        "quitter",
        "behave.mjs",
        json!({"tag": "q", "initMarker": marker}),
    )
    .await;
    let first = m.pid().await.unwrap();
    let p = pipeline(vec![(spec("quitter", 1, true, 5000), m.clone())]);
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "exit"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Blocked);
    let msg = out.message.unwrap();
    assert!(
        msg.contains("the node host died during beforeToolCall")
            && msg.contains("exit status 1")
            && msg.contains("it starts again on the next call"),
        "{msg}"
    );
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "modify"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");
    let second = out.payload["pid"].as_u64().unwrap();
    assert_ne!(second, u64::from(first));
    let inits = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(
        inits.lines().collect::<Vec<_>>(),
        [first.to_string(), second.to_string()],
        "initialize ran again in the new host"
    );
    p.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_output_does_not_break_the_protocol() {
    let ws = Ws::new();
    let m = load(&ws, "chatty", "behave.mjs", json!({"tag": "c"})).await;
    let p = pipeline(vec![(spec("chatty", 1, true, 5000), m)]);
    for _ in 0..3 {
        let out = p
            .run(
                HookPoint::BeforeResponse,
                json!({"act": "chatty", "content": "hi"}),
                &HookContext::default(),
            )
            .await;
        assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");
        assert_eq!(
            out.payload,
            json!({"act": "chatty", "content": "hi", "chatty": true})
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_runs_on_pipeline_cleanup_and_stops_the_host() {
    let ws = Ws::new();
    let marker = ws.dir().join("cleaned");
    let m = load(
        &ws,
        "tidy",
        "behave.mjs",
        json!({"tag": "t", "cleanupMarker": marker}),
    )
    .await;
    let pid = m.pid().await.unwrap();
    let p = pipeline(vec![(spec("tidy", 1, true, 5000), m.clone())]);
    p.cleanup().await;
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        format!("cleaned {pid}")
    );
    assert!(eventually(Duration::from_secs(5), || !process_group_alive(pid)).await);
    assert_eq!(m.pid().await, None);
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "modify"}),
            &HookContext::default(),
        )
        .await;
    assert!(
        out.message.unwrap().contains("was cleaned up"),
        "no restart after cleanup"
    );
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

// Single-threaded, so the subscriber set for this thread sees the peer's
// reader task, which forwards the notifications.
#[tokio::test(flavor = "current_thread")]
async fn the_context_logger_forwards_to_plugd_tracing_with_the_handler_name() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let ws = Ws::new();
    let m = load(&ws, "auditor", "behave.mjs", json!({"tag": "a"})).await;
    let p = pipeline(vec![(spec("auditor", 1, false, 5000), m)]);
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"act": "log"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue);
    let text = captured.text();
    let warn = text
        .lines()
        .find(|l| l.contains("quota nearly used"))
        .unwrap_or_else(|| panic!("no forwarded warning in:\n{text}"));
    assert!(
        warn.contains("WARN")
            && warn.contains("plugd::dexto")
            && warn.contains("handler=\"auditor\"")
            && warn.contains("hook=\"beforeToolCall\"")
            && warn.contains(r#"data="{\"used\":99}""#),
        "{warn}"
    );
    let info = text.lines().find(|l| l.contains("plain info")).unwrap();
    assert!(
        info.contains("INFO") && info.contains("handler=\"auditor\""),
        "{info}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_auth_example_blocks_over_quota_and_unauthorized_tenants() {
    let ws = Ws::new();
    let path = repo().join("examples/workspace/plugins/tenant-auth.js");
    let m = load_with(
        &ws,
        "tenant-auth",
        &path,
        json!({"enforceQuota": true}),
        &DextoOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        m.points().await,
        [
            HookPoint::BeforeLlmRequest,
            HookPoint::BeforeToolCall,
            HookPoint::AfterToolResult
        ]
    );
    let p = pipeline(vec![(spec("tenant-auth", 100, true, 5000), m)]);
    let tenant = |t: &str| HookContext {
        tenant_id: Some(t.into()),
        user_id: Some("u-7".into()),
        ..HookContext::default()
    };
    let llm = json!({"text": "hello", "sessionId": "s-1"});

    // Over quota: blocked with the seed's message and QUOTA_EXCEEDED.
    let out = p
        .run(HookPoint::BeforeLlmRequest, llm.clone(), &tenant("globex"))
        .await;
    assert_eq!(out.outcome, OutcomeKind::Blocked);
    assert_eq!(
        out.message.as_deref(),
        Some("Daily token limit exceeded. Please upgrade your plan or try again tomorrow.")
    );
    assert_eq!(codes(&out), ["QUOTA_EXCEEDED"]);
    assert_eq!(
        out.notices[0].details,
        Some(json!({"used": 100000, "limit": 100000}))
    );

    // Unknown tenant: UNAUTHORIZED.
    let out = p
        .run(
            HookPoint::BeforeLlmRequest,
            llm.clone(),
            &tenant("umbrella"),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Blocked);
    assert_eq!(codes(&out), ["UNAUTHORIZED"]);

    // Allowed tenant, and a request without a tenant: both pass unchanged.
    for ctx in [tenant("acme"), HookContext::default()] {
        let out = p.run(HookPoint::BeforeLlmRequest, llm.clone(), &ctx).await;
        assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");
        assert_eq!(out.payload, llm);
    }

    // Tool access: initech's plan has one tool.
    let tool = |name: &str| json!({"toolName": name, "args": {}});
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            tool("fs_write"),
            &tenant("initech"),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Blocked);
    assert_eq!(
        out.message.as_deref(),
        Some("Tool 'fs_write' is not available on your plan.")
    );
    assert_eq!(codes(&out), ["TOOL_NOT_ALLOWED"]);
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            tool("hello_python_greet"),
            &tenant("initech"),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue);
    let out = p
        .run(
            HookPoint::AfterToolResult,
            json!({"toolName": "hello_python_greet", "result": "hi", "success": true}),
            &tenant("initech"),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue);
    p.cleanup().await;

    // initialize received the config: with enforceQuota off, globex passes.
    let relaxed = load_with(
        &ws,
        "tenant-auth",
        &path,
        json!({"enforceQuota": false}),
        &DextoOptions::default(),
    )
    .await
    .unwrap();
    let p = pipeline(vec![(spec("tenant-auth", 100, true, 5000), relaxed)]);
    let out = p
        .run(HookPoint::BeforeLlmRequest, llm.clone(), &tenant("globex"))
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");
    p.cleanup().await;
}

/// The seed's Tenant Auth plugin (§8), the `.ts` file verbatim, loaded
/// through the pinned tsx that scripts/test installs (Node 20 has no
/// type stripping), with its quota and tool-access data put into
/// `storage.database` by `plugd storage set` beforehand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_tenant_auth_ts_runs_verbatim_on_agent_storage() {
    let ws = Ws::new();
    let tsx = repo().join(".npm-tools/node_modules/.bin/tsx");
    assert!(
        tsx.is_file(),
        "{} is missing: run ./scripts/test, which installs the pinned tsx",
        tsx.display()
    );
    let storage = |args: &[&str]| {
        let mut all = vec!["storage"];
        all.extend_from_slice(args);
        let o = ws.plugd(&all);
        assert!(o.status.success(), "{}", crate::support::stderr(&o));
        crate::support::stdout(&o)
    };
    #[allow(clippy::disallowed_methods)] // the UTC date the module computes its key with
    let today = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .unwrap();
    let today = String::from_utf8_lossy(&today.stdout).trim().to_owned();
    // The setup step: globex used its whole quota today; initech may use one tool.
    storage(&[
        "set",
        "tenant:globex:quota",
        r#"{"tokensPerDay": 100, "requestsPerMinute": 5}"#,
    ]);
    storage(&[
        "set",
        &format!("tenant:globex:usage:{today}"),
        r#"{"tokens": 100, "requests": 7}"#,
    ]);
    storage(&["set", "tenant:initech:allowed_tools", r#"["fs_read"]"#]);

    let options = DextoOptions {
        tsx: Some(tsx),
        storage: Some(ws.state().await),
        ..DextoOptions::default()
    };
    let m = load_with(
        &ws,
        "tenant-auth",
        &repo().join("tests/plugins/dexto/tenant-auth.ts"),
        json!({"enforceQuota": true, "checkToolAccess": true}),
        &options,
    )
    .await
    .unwrap();
    let p = pipeline(vec![(spec("tenant-auth", 100, true, 10_000), m)]);
    let tenant = |t: &str| HookContext {
        tenant_id: Some(t.into()),
        user_id: Some("u-7".into()),
        ..HookContext::default()
    };

    // Over quota: the seed's message and notice, with the stored numbers.
    let llm = json!({"text": "hello", "sessionId": "s-1"});
    let out = p
        .run(HookPoint::BeforeLlmRequest, llm.clone(), &tenant("globex"))
        .await;
    assert_eq!(out.outcome, OutcomeKind::Blocked, "{out:?}");
    assert_eq!(
        out.message.as_deref(),
        Some("Daily token limit exceeded. Please upgrade your plan or try again tomorrow.")
    );
    assert_eq!(codes(&out), ["QUOTA_EXCEEDED"]);
    assert_eq!(
        out.notices[0].details,
        Some(json!({"used": 100, "limit": 100}))
    );
    // A tenant with nothing stored gets the seed's defaults: under quota.
    let out = p
        .run(HookPoint::BeforeLlmRequest, llm.clone(), &tenant("acme"))
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");

    // Tool access from storage: initech may use fs_read only.
    let tool = |name: &str| json!({"toolName": name, "args": {}, "sessionId": "s-1"});
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            tool("fs_write"),
            &tenant("initech"),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Blocked, "{out:?}");
    assert_eq!(
        out.message.as_deref(),
        Some("Tool 'fs_write' is not available on your plan.")
    );
    assert_eq!(codes(&out), ["TOOL_NOT_ALLOWED"]);
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            tool("fs_read"),
            &tenant("initech"),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");

    // afterToolResult writes usage through storage.database; plugd reads it back.
    for _ in 0..2 {
        let result = json!({"toolName": "fs_read", "success": true, "sessionId": "s-1"});
        let out = p
            .run(HookPoint::AfterToolResult, result, &tenant("initech"))
            .await;
        assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");
    }
    let usage: Value =
        serde_json::from_str(storage(&["get", "tenant:initech:usage:tools"]).trim()).unwrap();
    assert_eq!(usage, json!({"fs_read": 2}));
    let keys = storage(&["list", "tenant:initech:"]);
    assert_eq!(
        keys.lines().collect::<Vec<_>>(),
        ["tenant:initech:allowed_tools", "tenant:initech:usage:tools"]
    );
    // The cache is a separate namespace.
    assert_eq!(
        storage(&["get", "--cache", "tenant:initech:usage:tools"]).trim(),
        "null"
    );
}

/// The module's view of `context.agent` is what the agent sees: this
/// workspace's sessions, the enabled tools of approved plugins, the approved
/// MCP servers, the effective configuration without secrets, and the
/// `dexto.agent.*` part of plugd's bus, both ways. Two real modules record
/// what they see in storage (`tests/plugins/dexto/agent-probe.mjs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_managers_show_sessions_tools_mcp_config_and_bridge_the_bus() {
    use plugd_host::bus::Event;
    use plugd_runtime::config::PlugdConfig;

    let ws = Ws::new();
    ws.misbehave("tk", "good", None, "");
    let log = ws.dir().join("mcp.log");
    std::fs::write(&log, "").unwrap();
    let guard = json!({"command": "python3",
        "args": [repo().join("tests/plugins/hooks/mcp_guard.py"), &log]});
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": {"guard": guard, "hidden": guard}}).to_string(),
    )
    .unwrap();
    std::fs::write(ws.dir().join("turns.yaml"), r#"{"steps": []}"#).unwrap();
    let probe = module("agent-probe.mjs");
    let probe = probe.display();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!(
            r#"llm: {{provider: scripted, script: "${{{{workspace_dir}}}}/turns.yaml"}}
tenant: {{agent_id: probe-agent, tenant_id: acme}}
agent: {{system_prompt: be brief}}
plugins:
  custom:
    - name: probe-b
      module: "{probe}"
      priority: 5
      config: {{name: b, session: seeded, tool: tk_echo, listen: ["probe:ping"], expect: 1}}
    - name: probe-a
      module: "{probe}"
      priority: 10
      config:
        name: a
        session: seeded
        tool: tk_echo
        listen: ["probe:ping", "probe:from-plugd"]
        emit: [{{name: "probe:ping", payload: {{n: 1}}}}]
        expect: 2
"#
        ),
    )
    .unwrap();
    let rt = ws.runtime(crate::support::quick(10_000)).await;
    rt.approve("tk", "test").await.unwrap();
    rt.approve("guard", "test").await.unwrap();
    // "hidden" stays unapproved: not the agent's, so not the module's.

    let store = rt.state().clone();
    store.session_ensure("seeded").await.unwrap();
    store
        .session_append(
            "seeded",
            &[
                json!({"role": "user", "content": "echo this", "at": "2025-03-01T10:00:00Z"}),
                json!({"role": "assistant", "content": "calling", "at": "2025-03-01T10:00:01Z",
                       "tool_calls": [{"id": "c1", "name": "tk_echo", "arguments": {"x": 1}}]}),
                json!({"role": "tool", "content": "{\"echo\":{\"x\":1}}", "tool_call_id": "c1",
                       "at": "2025-03-01T10:00:02Z"}),
            ],
        )
        .await
        .unwrap();
    store.session_ensure("other").await.unwrap();

    let mut on_bus = rt.bus().subscribe("dexto.agent.>", 16).unwrap();
    let config = PlugdConfig::load(rt.dir()).unwrap();
    let pipeline = plugd_agent::hooks::build::build_pipeline(&config, &rt)
        .await
        .unwrap();
    let ctx = HookContext {
        session_id: Some("seeded".into()),
        ..HookContext::default()
    };
    let out = pipeline
        .run(
            HookPoint::BeforeLlmRequest,
            json!({"text": "hi", "sessionId": "seeded"}),
            &ctx,
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");
    // plugd's side of the bridge: the module's emit, on dexto.agent.<name>.
    let e = tokio::time::timeout(Duration::from_secs(5), on_bus.recv())
        .await
        .expect("the module's emit reached plugd's bus")
        .unwrap();
    assert_eq!(
        (e.topic.as_str(), e.source.as_str(), &e.payload),
        ("dexto.agent.probe:ping", "dexto:probe-a", &json!({"n": 1}))
    );
    assert!(!e.id.is_empty() && !e.timestamp.is_empty(), "{e:?}");
    // And the other way: what plugd publishes there reaches the listeners.
    rt.publish(Event::new(
        "dexto.agent.probe:from-plugd",
        "test",
        json!({"hello": "plugd"}),
    ))
    .unwrap();
    let out = pipeline
        .run(
            HookPoint::BeforeResponse,
            json!({"content": "done", "provider": "scripted"}),
            &ctx,
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");
    pipeline.cleanup().await;

    let seen = store
        .kv_get("database", "probe:a:seen")
        .await
        .unwrap()
        .unwrap();
    // sessionManager: this workspace's sessions, read-only, bounded.
    let mut sessions: Vec<&str> = seen["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    sessions.sort();
    assert_eq!(sessions, ["other", "seeded"]);
    let session = &seen["session"];
    assert_eq!(session["id"], "seeded");
    assert_eq!(
        session["metadata"],
        json!({"createdAt": session["metadata"]["createdAt"], "lastActivity": 1_740_823_202_000u64, "messageCount": 3})
    );
    assert!(session["metadata"]["createdAt"].as_u64().unwrap() > 1_700_000_000_000);
    let history = session["history"].as_array().unwrap();
    assert_eq!(history.len(), 3);
    assert_eq!(
        history[0],
        json!({"role": "user", "content": "echo this", "timestamp": 1_740_823_200_000u64})
    );
    assert_eq!(
        history[1]["toolCalls"],
        json!([{"id": "c1", "type": "function", "function": {"name": "tk_echo", "arguments": "{\"x\":1}"}}])
    );
    assert_eq!(history[2]["toolCallId"], "c1");
    assert_eq!(seen["lastTwo"], json!(["calling", "{\"echo\":{\"x\":1}}"]));
    assert_eq!(seen["metadata"], session["metadata"]);
    assert_eq!(seen["missing"], true);
    assert_eq!(seen["traversal"], true);
    let text = |k: &str| seen[k].as_str().unwrap_or_default().to_owned();
    assert!(
        text("missingHistory").contains("session \"no-such-session\" not found"),
        "{seen}"
    );
    assert!(
        text("hugeLimit").contains("limit 100000 is not 1 to 500"),
        "{seen}"
    );

    // toolManager: exactly the agent's tools, with description and schema.
    let mut agent_tools: Vec<String> = rt.tools().iter().map(|t| t.name.clone()).collect();
    agent_tools.sort();
    assert!(
        agent_tools.iter().any(|t| t == "tk_echo"),
        "{agent_tools:?}"
    );
    assert!(
        agent_tools.iter().any(|t| t.starts_with("guard/")),
        "{agent_tools:?}"
    );
    assert!(
        !agent_tools.iter().any(|t| t.starts_with("hidden/")),
        "{agent_tools:?}"
    );
    assert_eq!(seen["tools"], json!(agent_tools));
    let echo = rt
        .tools()
        .into_iter()
        .find(|t| t.name == "tk_echo")
        .unwrap();
    assert_eq!(
        seen["echo"],
        json!({"name": "tk_echo", "description": echo.description, "parameters": echo.input_schema})
    );
    assert_eq!(
        (&seen["hasTool"], &seen["hasNoTool"]),
        (&json!(true), &json!(false))
    );

    // mcpManager: the approved server only, with its tools.
    let guard_tools: Vec<&String> = agent_tools
        .iter()
        .filter(|t| t.starts_with("guard/"))
        .collect();
    let mcp = seen["mcp"].as_array().unwrap();
    assert_eq!(mcp.len(), 1, "{seen}");
    assert_eq!(mcp[0]["name"], "guard");
    assert_eq!(mcp[0]["transport"], "stdio");
    assert_eq!(mcp[0]["tools"], json!(guard_tools));
    assert_eq!(seen["mcpTools"], json!(guard_tools));
    assert_eq!(seen["failed"], json!({}));

    // stateManager: the snapshot plugd loaded, no paths or secrets.
    assert_eq!(
        seen["llm"],
        json!({"provider": "scripted", "model": "scripted", "maxIterations": 8})
    );
    assert_eq!(seen["llmIsContextLlm"], true);
    let runtime = &seen["runtime"];
    assert_eq!(runtime["agentId"], "probe-agent");
    assert_eq!(runtime["systemPrompt"], "be brief");
    assert_eq!(runtime["llm"], seen["llm"]);
    assert_eq!(runtime["mcpServers"], json!({"guard": {"type": "stdio"}}));
    assert_eq!(runtime["tenant"]["tenantId"], "acme");
    assert_eq!(
        runtime["plugins"]["custom"],
        json!([
            {"name": "probe-b", "priority": 5, "blocking": true, "enabled": true},
            {"name": "probe-a", "priority": 10, "blocking": true, "enabled": true}
        ])
    );
    let dir = ws.dir().canonicalize().unwrap();
    assert!(
        !runtime.to_string().contains(dir.to_str().unwrap()),
        "no paths in the runtime config: {runtime}"
    );

    // Read-only: frozen, no writing methods.
    assert_eq!(seen["frozen"], true);
    assert_eq!(seen["noWrites"], json!([]));
    assert_eq!(seen["assign"], "TypeError");
    assert!(
        text("badName").contains("event name \"bad.name\" is not 1-128 letters"),
        "{seen}"
    );
    assert!(text("bigPayload").contains("at most 65536"), "{seen}");
    assert_eq!(seen["listenerCount"], json!([1, 1]));

    // agentEventBus: a's own emit and plugd's publish reached a; b got a's.
    assert_eq!(
        store
            .kv_get("database", "probe:a:events")
            .await
            .unwrap()
            .unwrap(),
        json!([
            {"name": "probe:ping", "payload": {"n": 1}},
            {"name": "probe:from-plugd", "payload": {"hello": "plugd"}}
        ])
    );
    assert_eq!(
        store
            .kv_get("database", "probe:b:events")
            .await
            .unwrap()
            .unwrap(),
        json!([{"name": "probe:ping", "payload": {"n": 1}}])
    );
}

/// Writes `text` to `rel` under `dir`, creating directories.
fn put(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// The Dexto module of the test packages: tags the text with its config.
const TAGGER: &str = "export default class Tagger {\n  async initialize(config) { this.tag = config.tag; }\n  async beforeLLMRequest(payload) { return { ok: true, modify: { text: `${payload.text} [${this.tag}]` } }; }\n}\n";

/// The seed's `module: "@mycompany/dexto-tenant-plugin"  # from node_modules`:
/// a scoped package with conditional `exports` and an unscoped one with
/// `main`, installed in the workspace's node_modules by the test, load and
/// run; a package that is not installed, one symlinked from outside the
/// workspace, and a specifier that climbs out of its package are refused,
/// each saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_naming_an_npm_package_loads_from_the_workspaces_node_modules() {
    use plugd_agent::hooks::build::build_pipeline;
    use plugd_runtime::config::PlugdConfig;

    let ws = Ws::new();
    let nm = ws.dir().join("node_modules");
    put(
        &nm,
        "@mycompany/dexto-tenant-plugin/package.json",
        r#"{"name": "@mycompany/dexto-tenant-plugin", "version": "1.0.0", "type": "module",
            "exports": {".": {"require": "./dist/plugin.cjs", "import": "./dist/plugin.js"}}}"#,
    );
    put(&nm, "@mycompany/dexto-tenant-plugin/dist/plugin.js", TAGGER);
    put(
        &nm,
        "@mycompany/dexto-tenant-plugin/dist/plugin.cjs",
        "throw new Error('the require condition was used');\n",
    );
    put(&nm, "audit-plugin/package.json", r#"{"main": "lib/audit"}"#);
    put(
        &nm,
        "audit-plugin/lib/audit.js",
        &TAGGER.replace("export default class", "module.exports = class"),
    );
    let write_config = |custom: &str| {
        std::fs::write(
            ws.dir().join("plugd.yaml"),
            format!("plugins:\n  custom:\n{custom}"),
        )
        .unwrap();
    };
    write_config(
        "    - {name: tenant, priority: 1, module: \"@mycompany/dexto-tenant-plugin\", config: {tag: scoped}}\n    - {name: audit, priority: 2, module: audit-plugin, config: {tag: main}}\n",
    );
    let rt = ws.runtime(crate::support::quick(10_000)).await;
    let config = PlugdConfig::load(rt.dir()).unwrap();
    let pipeline = build_pipeline(&config, &rt).await.unwrap();
    let out = pipeline
        .run(
            HookPoint::BeforeLlmRequest,
            json!({"text": "hi"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue, "{out:?}");
    assert_eq!(out.payload["text"], "hi [scoped] [main]");
    pipeline.cleanup().await;

    let build_err = |custom: &str| {
        write_config(custom);
        let rt = rt.clone();
        async move {
            let config = PlugdConfig::load(rt.dir()).unwrap();
            build_pipeline(&config, &rt).await.unwrap_err().to_string()
        }
    };
    let e = build_err("    - {name: x, priority: 1, module: \"@mycompany/not-installed\"}\n").await;
    assert!(
        e.contains("hook handler \"x\" failed to initialize")
            && e.contains("package \"@mycompany/not-installed\" is not installed in")
            && e.contains("npm install @mycompany/not-installed"),
        "{e}"
    );
    // A package that is a symlink to elsewhere (npm link) reaches outside.
    let outside = tempfile::tempdir().unwrap();
    put(outside.path(), "linked/index.js", TAGGER);
    std::os::unix::fs::symlink(outside.path().join("linked"), nm.join("linked")).unwrap();
    let e = build_err("    - {name: x, priority: 1, module: linked}\n").await;
    assert!(e.contains("outside the workspace"), "{e}");
    // A subpath that is not exported is Node's error too.
    let e = build_err(
        "    - {name: x, priority: 1, module: \"@mycompany/dexto-tenant-plugin/dist/plugin.cjs\"}\n",
    )
    .await;
    assert!(e.contains("\"./dist/plugin.cjs\" is not exported"), "{e}");
    // Climbing out of the package is refused when plugd.yaml loads.
    write_config("    - {name: x, priority: 1, module: \"audit-plugin/../../../etc/passwd\"}\n");
    let e = PlugdConfig::load(rt.dir()).unwrap_err().to_string();
    assert!(
        e.contains("escapes its package") && e.contains("plugins.custom[0].module"),
        "{e}"
    );
}

/// A version of the reload test's module: tags the text with `tag`; its
/// `initialize` throws when `broken`.
fn versioned(tag: &str, broken: bool) -> String {
    let init = if broken {
        format!("throw new Error('{tag} is broken');")
    } else {
        String::new()
    };
    format!(
        "export default class Versioned {{\n  async initialize() {{ {init} }}\n  async beforeLLMRequest(p) {{ return {{ ok: true, modify: {{ text: `${{p.text}} [{tag}]` }} }}; }}\n  async cleanup() {{ console.log('cleanup of {tag}'); }}\n}}\n"
    )
}

/// The seed's "Hot Reloading" under a real `plugd serve`: a changed module
/// file is reloaded and serves the next request; a new version whose
/// `initialize` throws leaves the previous instance serving and serve's log
/// says so; a fixed version is picked up again.
#[test]
fn serve_reloads_a_changed_module_and_keeps_the_old_one_when_the_new_fails() {
    use crate::http::Serve;

    let ws = Ws::new();
    let file = ws.dir().join("plugins/versioned.mjs");
    put(ws.dir(), "plugins/versioned.mjs", &versioned("v1", false));
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "plugins:\n  custom:\n    - {name: versioned, priority: 1, module: \"${{dexto.agent_dir}}/plugins/versioned.mjs\"}\n",
    )
    .unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let text = || {
        let r = serve.post(
            "/v1/hooks/before_llm_request:run",
            &json!({"payload": {"text": "hi"}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["payload"]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let becomes = |want: &str| {
        crate::support::eventually_blocking(Duration::from_secs(20), || text() == want)
    };
    assert_eq!(text(), "hi [v1]");

    std::fs::write(&file, versioned("v2", false)).unwrap();
    assert!(becomes("hi [v2]"), "v2 not loaded: {}", serve.log_text());

    // A broken version: the log says so, and v2 keeps serving.
    std::fs::write(&file, versioned("v3", true)).unwrap();
    assert!(
        crate::support::eventually_blocking(Duration::from_secs(20), || serve
            .log_text()
            .contains("keeping the previous instance")),
        "no refusal logged: {}",
        serve.log_text()
    );
    let log = serve.log_text();
    assert!(
        log.contains("failed to initialize plugin 'versioned': Error: v3 is broken"),
        "{log}"
    );
    assert_eq!(text(), "hi [v2]");

    // Fixed again: picked up.
    std::fs::write(&file, versioned("v4", false)).unwrap();
    assert!(becomes("hi [v4]"), "v4 not loaded: {}", serve.log_text());
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    // Each replaced instance ran its cleanup.
    for v in ["v1", "v2"] {
        assert!(log.contains(&format!("cleanup of {v}")), "{v}: {log}");
    }
    assert!(!log.contains("cleanup of v3"), "{log}");
}
