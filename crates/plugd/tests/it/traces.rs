//! OpenTelemetry traces over OTLP/HTTP: a real `plugd serve` exporting to a
//! real receiver started on loopback by the test
//! (`tests/plugins/traces/otlp_receiver.py`, decoding the protobuf with the
//! `opentelemetry-proto` package), called over HTTP with a `traceparent`
//! header. The spans must continue the caller's trace and link HTTP request →
//! tool call → plugin round trip (and HTTP request → hook handler for a hook
//! run of the built-in content policy); a VAI plugin (`vai_plugin.py`) must see
//! the trace in `context.trace_id` and an MCP server of the official Python
//! SDK (`meta_mcp.py`) in `_meta.traceparent`. With no `OTEL_*` variable
//! nothing is exported and the same calls work.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use serde_json::{Value, json};

use crate::http::{Resp, Serve, request_as};
use crate::support::{Ws, ok, plugd_cmd, repo};

/// The trace a caller sends, and the span id of its own (remote) span.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// The trace of the MCP call.
const TRACE_MCP: &str = "0af7651916cd43dd8448eb211c80319c";
/// The trace of the hook run.
const TRACE_HOOK: &str = "5b8efff798038103d269b633813fc60c";

/// `otlp_receiver.py` writing the spans it receives to `out`; killed on drop.
struct Receiver {
    child: Child,
    url: String,
    out: PathBuf,
}

impl Receiver {
    fn start(dir: &Path) -> Receiver {
        let out = dir.join("spans.jsonl");
        let script = repo().join("tests/plugins/traces/otlp_receiver.py");
        #[allow(clippy::disallowed_methods)] // the test's own receiver, not a plugin
        let mut child = std::process::Command::new(repo().join(".venv/bin/python3"))
            .args([script.as_path(), &out])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Its first line says where it listens.
        let first = BufReader::new(child.stdout.take().unwrap()).lines().next();
        let line = first.and_then(Result::ok).unwrap_or_default();
        let Some(url) = line.strip_prefix("url: ").map(str::to_owned) else {
            panic!("no url line from the receiver: {line:?}");
        };
        Receiver { child, url, out }
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A workspace with the VAI package `test/traced` (export `echo`, answering
/// with the context it got) and the MCP server `m` (tool `meta`, answering
/// with the `_meta` it got), both approved.
fn workspace() -> Ws {
    let ws = Ws::new();
    crate::vai::package(&ws, "traced", "good", &[]);
    let mcp = repo().join("tests/plugins/traces/meta_mcp.py");
    std::fs::write(
        ws.dir().join(".mcp.json"),
        json!({"mcpServers": {"m": {
            "command": repo().join(".venv/bin/python3"),
            "args": [mcp],
        }}})
        .to_string(),
    )
    .unwrap();
    // A hook chain of one built-in handler, for the hook handler span.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "plugins:\n  contentPolicy: {priority: 10, maxInputChars: 5}\n",
    )
    .unwrap();
    for id in ["test/traced", "m"] {
        ok(&ws.plugd(&["plugin", "approve", id]));
    }
    ws
}

/// `POST /v1/tools/{tool}:invoke` with `traceparent` (when given).
fn invoke(serve: &Serve, tool: &str, traceparent: Option<&str>) -> Resp {
    post(
        serve,
        &format!("/v1/tools/{tool}:invoke"),
        traceparent,
        br#"{"args": {"q": "x"}}"#,
    )
}

/// `POST path` with `body` and `traceparent` (when given); a 200.
fn post(serve: &Serve, path: &str, traceparent: Option<&str>, body: &[u8]) -> Resp {
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend(traceparent.map(|t| ("traceparent", t)));
    let r = request_as(serve, &serve.token, "POST", path, &headers, Some(body));
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r
}

/// The `_meta.traceparent` the MCP server saw, from its answer.
fn traceparent_seen(result: &Value) -> Option<String> {
    let text = result.to_string();
    let at = text.find("00-")?;
    Some(text[at..at + 55].to_owned())
}

/// The one span named `name` in `spans`.
fn one<'a>(spans: &'a [&'a Value], name: &str) -> &'a Value {
    let found: Vec<_> = spans.iter().filter(|s| s["name"] == name).collect();
    assert_eq!(found.len(), 1, "one {name:?} span: {spans:#?}");
    found[0]
}

#[test]
fn an_http_tool_call_continues_the_callers_trace_down_to_the_plugin() {
    let ws = workspace();
    let receiver = Receiver::start(ws.dir());
    // The default batch delay (5 s) is kept: the spans leave at shutdown.
    let serve = Serve::start_with_env(
        &ws,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url),
            ("OTEL_SERVICE_NAME", "plugd-under-test"),
        ],
    );
    let vai = invoke(
        &serve,
        "test/traced/echo",
        Some(&format!("00-{TRACE}-{CALLER_SPAN}-01")),
    )
    .json();
    assert_eq!(
        vai["structured_output"]["context"]["trace_id"], TRACE,
        "the VAI plugin gets the caller's trace: {vai}"
    );
    let mcp = invoke(
        &serve,
        "m/meta",
        Some(&format!("00-{TRACE_MCP}-{CALLER_SPAN}-01")),
    )
    .json();
    let seen = traceparent_seen(&mcp).unwrap_or_else(|| panic!("no traceparent: {mcp}"));
    assert!(seen.starts_with(&format!("00-{TRACE_MCP}-")), "{seen}");
    assert!(seen.ends_with("-01"), "sampled: {seen}");
    let hook = post(
        &serve,
        "/v1/hooks/before_llm_request:run",
        Some(&format!("00-{TRACE_HOOK}-{CALLER_SPAN}-01")),
        br#"{"payload": {"text": "longer than five"}}"#,
    )
    .json();
    assert_eq!(hook["outcome"], "blocked", "{hook}");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");

    let spans = receiver.spans();
    let ours: Vec<&Value> = spans
        .iter()
        .filter(|s| s["trace_id"] == TRACE_HOOK)
        .collect();
    let http = one(&ours, "POST /v1/hooks/{point}");
    let handler = one(&ours, "hook handler");
    assert_eq!(handler["parent_span_id"], http["span_id"], "{handler}");
    assert!(
        handler["attributes"]["plugd.export"].is_string(),
        "the handler's name: {handler}"
    );

    let ours: Vec<&Value> = spans.iter().filter(|s| s["trace_id"] == TRACE).collect();
    let http = one(&ours, "POST /v1/tools/{*name}");
    assert_eq!(http["parent_span_id"], CALLER_SPAN, "{http}");
    assert_eq!(http["kind"], 2, "a server span: {http}");
    assert_eq!(http["service"], "plugd-under-test");
    assert_eq!(http["attributes"]["http.request.method"], "POST");
    assert_eq!(http["attributes"]["http.response.status_code"], 200);
    let call = one(&ours, "tool call");
    assert_eq!(call["parent_span_id"], http["span_id"], "{call}");
    assert_eq!(call["attributes"]["plugd.export"], "test/traced/echo");
    assert_eq!(call["attributes"]["plugd.plugin.id"], "test/traced");
    let trip = one(&ours, "plugin round trip");
    assert_eq!(trip["parent_span_id"], call["span_id"], "{trip}");
    assert_eq!(trip["attributes"]["plugd.plugin.id"], "test/traced");
    assert_eq!(trip["attributes"]["plugd.dialect"], "vai");
    assert_eq!(trip["attributes"]["plugd.export"], "test/traced/echo");
    assert_eq!(trip["status"]["code"], 0, "unset: no error");

    // The MCP server's traceparent names plugd's round trip as its parent.
    let ours: Vec<&Value> = spans
        .iter()
        .filter(|s| s["trace_id"] == TRACE_MCP)
        .collect();
    let trip = one(&ours, "plugin round trip");
    assert_eq!(trip["attributes"]["plugd.dialect"], "mcp");
    assert_eq!(
        seen,
        format!("00-{TRACE_MCP}-{}-01", trip["span_id"].as_str().unwrap())
    );
    let call = one(&ours, "tool call");
    assert_eq!(trip["parent_span_id"], call["span_id"]);
}

#[test]
fn without_otel_variables_nothing_is_exported_and_calls_work() {
    let ws = workspace();
    let serve = Serve::start_with_env(&ws, &[]);
    let vai = invoke(
        &serve,
        "test/traced/echo",
        Some(&format!("00-{TRACE}-{CALLER_SPAN}-01")),
    )
    .json();
    // The caller's trace, kept without an exporter too.
    let id = vai["structured_output"]["context"]["trace_id"]
        .as_str()
        .unwrap();
    assert_eq!(id, TRACE, "{vai}");
    let mcp = invoke(&serve, "m/meta", None).json();
    assert_eq!(traceparent_seen(&mcp), None, "{mcp}");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
    assert!(!log.contains("exporting traces"), "{log}");
    // plugd_cmd is what serve ran with: no OTLP endpoint in the test's own
    // environment either, or this test would not say much.
    let cmd = plugd_cmd(ws.dir());
    let set: Vec<_> = cmd
        .get_envs()
        .filter(|(k, _)| k.to_string_lossy().starts_with("OTEL_EXPORTER_OTLP"))
        .collect();
    assert!(set.is_empty(), "{set:?}");
}
