//! The Salmex I/O dialect: JSON-RPC 2.0 with Content-Length framing (seed 004).
//!
//! * Handshake: `initialize {protocolVersion: "1.0", config}` →
//!   `{protocolVersion, capabilities: {tools}}`, then the `initialized`
//!   notification. `config` is the launch's effective configuration
//!   (defaults plus the operator's values, secrets decrypted), or the
//!   manifest's defaults when the runtime gave none; changes arrive
//!   through [`config_changed`].
//! * The reply must say `protocolVersion: "1.0"` and may only advertise tools
//!   the manifest declares, by their bare names; a `/` in an advertised name is
//!   an attempt to impersonate another plugin's tool. Either is a permanent
//!   refusal. The registry gets the manifest's tools, namespaced
//!   `<plugin>/<tool>`, with their `risk_level`.
//! * `tools/call {name, arguments}` → `{content: [...]}`, returned as is;
//!   `isError: true` is a tool-level failure ([`ToolError::ExecutionFailed`]).
//! * `shutdown` is a notification; the process is expected to exit, and the
//!   supervisor kills its group after the grace period.
//! * From the plugin: `log.debug|info|warn|error` go to `tracing` with the
//!   plugin id; `event.progress` goes to the progress stream of the call it
//!   names (or the one in flight).
//! * Frames to the plugin are pure ASCII JSON (non-ASCII as `\uXXXX`), see
//!   [`ascii_json`].
//! * Malformed frames (bad headers, a header block without its blank line, a
//!   frame over the size limit) end the connection: the plugin is killed and
//!   every caller gets an error naming the cause at once.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use plugd_manifest::PluginSpec;
use plugd_manifest::salmex::SALMEX_PROTOCOL_VERSION;
use plugd_wire::{ErrorObject, Framing, Id, codes};
use serde_json::{Value, json};

use plugd_host::dialect::{
    CallFuture, Capabilities, Dialect, DialectFuture, HandshakeArgs, HandshakeFuture, HostServices,
    Setup, SetupArgs, ToolCall,
};
use plugd_host::model::{Handshake, HandshakeError, ToolDef, ToolError};
use plugd_host::peer::{CallError, Closed, Handler, Peer};
use plugd_host::protocol::{Incoming, JsonRpc, Protocol, decode_jsonrpc};
use plugd_host::spawn::ProcessHandle;
use plugd_host::supervisor::Conn;

/// Longest log message kept from a plugin's `log.*` notification.
pub const MAX_LOG_MESSAGE: usize = 4096;

/// How often a waiting call checks whether the plugin sent an oversized frame.
const OVERSIZE_POLL: Duration = Duration::from_millis(20);

/// The Salmex envelope: JSON-RPC 2.0 over Content-Length frames, with
/// `event.progress` notifications turned into per-call events.
#[derive(Debug, Clone, Copy, Default)]
pub struct SalmexProtocol;

impl SalmexProtocol {
    const INNER: JsonRpc = JsonRpc::CONTENT_LENGTH;
}

/// Rewrites serialized JSON so it is pure ASCII: every non-ASCII character
/// (they only occur inside strings) becomes `\uXXXX` escapes (UTF-16, so
/// surrogate pairs above U+FFFF). Same JSON value, but its length in bytes
/// equals its length in characters and in UTF-16 units. The Salmex
/// documentation's reference `main.js` compares Content-Length (bytes) with
/// a JavaScript string length (UTF-16 units) and would otherwise stall on
/// the first non-ASCII argument.
pub fn ascii_json(bytes: Vec<u8>) -> Vec<u8> {
    if bytes.is_ascii() {
        return bytes;
    }
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => return e.into_bytes(),
    };
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
    out.into_bytes()
}

/// The host request an `event.progress` is about: `params.id`,
/// `params.requestId` or `params.request_id` when it is an integer.
fn progress_request_id(params: &Value) -> Option<i64> {
    ["id", "requestId", "request_id"]
        .iter()
        .find_map(|k| params.get(*k).and_then(Value::as_i64))
}

impl Protocol for SalmexProtocol {
    fn framing(&self) -> Framing {
        Self::INNER.framing()
    }

    fn encode_request(&self, id: i64, method: &str, params: Option<Value>) -> Vec<u8> {
        ascii_json(Self::INNER.encode_request(id, method, params))
    }

    fn encode_notification(&self, method: &str, params: Option<Value>) -> Vec<u8> {
        ascii_json(Self::INNER.encode_notification(method, params))
    }

    fn encode_response(&self, id: Id, outcome: Result<Value, ErrorObject>) -> Vec<u8> {
        ascii_json(Self::INNER.encode_response(id, outcome))
    }

    fn decode(&self, bytes: &[u8]) -> Result<Incoming, String> {
        let incoming = match decode_jsonrpc(bytes) {
            Ok(incoming) => incoming,
            Err(e) => scalar_params_notification(bytes).ok_or(e)?,
        };
        match incoming {
            Incoming::Notification { method, params } if method == "event.progress" => {
                let event = match params {
                    Some(Value::String(s)) => json!({ "message": s }),
                    Some(v) => v,
                    None => json!({}),
                };
                Ok(Incoming::Event {
                    request_id: progress_request_id(&event),
                    event,
                })
            }
            other => Ok(other),
        }
    }
}

/// A notification whose `params` is a string (or another scalar), which
/// strict JSON-RPC refuses but Salmex plugins send for `log.*` and
/// `event.progress`. Anything else stays junk.
fn scalar_params_notification(bytes: &[u8]) -> Option<Incoming> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    let obj = v.as_object()?;
    if obj.get("jsonrpc")? != "2.0" || obj.contains_key("id") {
        return None;
    }
    let method = obj.get("method")?.as_str()?;
    let params = obj.get("params")?;
    if params.is_object() || params.is_array() {
        return None;
    }
    Some(Incoming::Notification {
        method: method.to_owned(),
        params: Some(params.clone()),
    })
}

/// Serves what a Salmex plugin sends the host: `log.*` notifications.
#[derive(Debug)]
pub struct SalmexHandler {
    plugin: Arc<str>,
    redact: plugd_host::stderr::SharedRedact,
}

/// Makes plugin text safe for one log line: control characters escaped, at
/// most [`MAX_LOG_MESSAGE`] bytes.
fn sanitize(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_LOG_MESSAGE));
    for c in s.chars() {
        if out.len() >= MAX_LOG_MESSAGE {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The message and the other fields of a `log.*` notification's params (a
/// string, or `{message, ...}`).
fn log_parts(params: Option<&Value>) -> (String, Option<String>) {
    match params {
        None | Some(Value::Null) => (String::new(), None),
        Some(Value::String(s)) => (sanitize(s), None),
        Some(Value::Object(obj)) => {
            let message = ["message", "msg"]
                .iter()
                .find_map(|k| obj.get(*k).and_then(Value::as_str))
                .map(sanitize)
                .unwrap_or_default();
            let rest: serde_json::Map<String, Value> = obj
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "message" | "msg"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let fields = (!rest.is_empty()).then(|| sanitize(&Value::Object(rest).to_string()));
            (message, fields)
        }
        Some(other) => (sanitize(&other.to_string()), None),
    }
}

impl Handler for SalmexHandler {
    fn notification(&self, method: String, params: Option<Value>) {
        let plugin = &*self.plugin;
        let Some(level) = method.strip_prefix("log.") else {
            tracing::debug!(plugin, method = %sanitize(&method), "notification from plugin ignored");
            return;
        };
        let (message, fields) = log_parts(params.as_ref());
        // The plugin's extra fields, when it sent any, follow the message.
        let line = match fields {
            Some(f) => format!("{message} {f}"),
            None => message,
        };
        let line = {
            let r = self.redact.read().unwrap_or_else(|p| p.into_inner());
            plugd_host::launch::scrub(&line, &r)
        };
        match level {
            "error" => tracing::error!(plugin, "{line}"),
            "warn" | "warning" => tracing::warn!(plugin, "{line}"),
            "info" => tracing::info!(plugin, "{line}"),
            _ => tracing::debug!(plugin, level = %sanitize(level), "{line}"),
        }
    }
}

/// Envelope and handler.
fn setup(a: SetupArgs<'_>) -> Setup {
    let SetupArgs { spec, redact, .. } = a;
    Setup {
        protocol: Arc::new(SalmexProtocol),
        handler: Arc::new(SalmexHandler {
            plugin: spec.id.as_str().into(),
            redact: redact.clone(),
        }),
        cancel: None,
        state: None,
    }
}

/// Resolves when the plugin broke the framing: its stream could not be
/// decoded any further, or it sent a frame over the size limit. Never
/// resolves for a plain end of stream (the exit report covers that).
async fn protocol_violation(peer: &Peer) -> String {
    let oversized_before = peer.stats().oversized_frames;
    let unreadable = async {
        let why = peer.wait_reader_done().await;
        if why.starts_with("unreadable output") {
            why
        } else {
            std::future::pending().await
        }
    };
    let oversized = async {
        loop {
            tokio::time::sleep(OVERSIZE_POLL).await;
            if peer.stats().oversized_frames > oversized_before {
                return "sent a frame over the frame size limit (it was skipped unread)".to_owned();
            }
        }
    };
    tokio::select! {
        why = unreadable => why,
        why = oversized => why,
    }
}

/// Ends the connection because of a framing violation: every pending call
/// fails with `why` at once, and the process group is killed (during a
/// handshake, `process` is `None` and the supervisor kills it).
fn drop_connection(peer: &Peer, process: Option<&ProcessHandle>, why: &str) -> Arc<Closed> {
    tracing::error!(plugin = %peer.plugin(), "{why}; killing the plugin");
    let closed = peer.close(Closed {
        plugin: peer.plugin().clone(),
        cause: format!("{why}; the plugin broke the Content-Length framing and was killed"),
        stderr_tail: Vec::new(),
        expected: false,
    });
    if let Some(process) = process {
        process.kill_group();
    }
    closed
}

/// Sends `request` and waits for its answer, or for a framing violation,
/// whichever comes first.
async fn guarded_call(
    peer: &Peer,
    process: Option<&ProcessHandle>,
    method: &str,
    params: Value,
    timeout: Duration,
    events: Option<tokio::sync::mpsc::UnboundedSender<Value>>,
) -> Result<Value, CallError> {
    let call = peer.call_with(method, Some(params), timeout, events);
    tokio::select! {
        biased;
        result = call => match result {
            Err(e @ CallError::FrameTooLarge { .. }) => {
                drop_connection(peer, process, &e.to_string());
                Err(e)
            }
            other => other,
        },
        why = protocol_violation(peer) => Err(CallError::Closed(drop_connection(peer, process, &why))),
    }
}

/// Sends `initialize`, validates the reply against the manifest, then sends
/// `initialized`.
pub async fn handshake(
    peer: &Peer,
    spec: &PluginSpec,
    _services: &HostServices,
    launch: &plugd_host::launch::Launch,
    timeout: Duration,
) -> Result<Handshake, HandshakeError> {
    // The stored configuration when the host has one, else the defaults.
    let config = if launch.config.is_null() {
        spec.salmex
            .as_ref()
            .map_or_else(|| json!({}), |s| s.default_config())
    } else {
        launch.config.clone()
    };
    let params = json!({"protocolVersion": SALMEX_PROTOCOL_VERSION, "config": config});
    let reply = guarded_call(peer, None, "initialize", params, timeout, None).await?;
    let handshake = check_initialize_reply(spec, &reply)?;
    peer.notify("initialized", Some(json!({})));
    Ok(handshake)
}

/// Validates an `initialize` reply and builds the catalog: the manifest's
/// tools, each with the advertised description when the manifest has none.
pub fn check_initialize_reply(
    spec: &PluginSpec,
    reply: &Value,
) -> Result<Handshake, HandshakeError> {
    let plugin = spec.id.clone();
    let malformed = |reason: String| HandshakeError::Malformed {
        plugin: plugin.clone(),
        reason,
    };
    let short = |v: &Value| -> String {
        let s = v.to_string();
        match s.char_indices().nth(64) {
            Some((i, _)) => format!("{}…", &s[..i]),
            None => s,
        }
    };
    let Some(obj) = reply.as_object() else {
        return Err(malformed(format!(
            "expected an object, got {}",
            short(reply)
        )));
    };
    match obj.get("protocolVersion") {
        Some(Value::String(v)) if v == SALMEX_PROTOCOL_VERSION => {}
        Some(v) => {
            return Err(malformed(format!(
                "protocolVersion {} is not \"{SALMEX_PROTOCOL_VERSION}\"; the plugin speaks another protocol and is refused",
                short(v)
            )));
        }
        None => {
            return Err(malformed(format!(
                "missing protocolVersion (expected \"{SALMEX_PROTOCOL_VERSION}\")"
            )));
        }
    }
    let advertised: &[Value] = match obj.get("capabilities") {
        None | Some(Value::Null) => &[],
        Some(Value::Object(caps)) => match caps.get("tools") {
            None | Some(Value::Null) => &[],
            Some(Value::Array(tools)) => tools,
            Some(v) => {
                return Err(malformed(format!(
                    "capabilities.tools must be an array, got {}",
                    short(v)
                )));
            }
        },
        Some(v) => {
            return Err(malformed(format!(
                "capabilities must be an object, got {}",
                short(v)
            )));
        }
    };
    let mut seen: Vec<(&str, Option<&str>)> = Vec::new();
    for (i, tool) in advertised.iter().enumerate() {
        let Some(name) = tool.get("name").and_then(Value::as_str) else {
            return Err(malformed(format!(
                "capabilities.tools[{i}] has no string \"name\": {}",
                short(tool)
            )));
        };
        let shown: String = name.chars().take(128).collect();
        if name.contains('/') {
            return Err(HandshakeError::Namespace {
                plugin: plugin.clone(),
                tool: shown,
                rule: "Salmex tool names are plain (no \"/\"); plugd namespaces them as \"<plugin>/<tool>\"".into(),
            });
        }
        if !spec.tools.iter().any(|t| t.wire_name == name) {
            return Err(HandshakeError::UndeclaredTool {
                plugin: plugin.clone(),
                tool: shown,
                declared_in: "capabilities.tools of plugin.json",
            });
        }
        if seen.iter().any(|(n, _)| *n == name) {
            return Err(malformed(format!("tool {shown:?} advertised twice")));
        }
        seen.push((name, tool.get("description").and_then(Value::as_str)));
    }
    let mut warnings = Vec::new();
    let tools = spec
        .tools
        .iter()
        .map(|t| {
            let advertised = seen.iter().find(|(n, _)| *n == t.wire_name);
            if advertised.is_none() {
                warnings.push(format!(
                    "tool {:?} is declared in plugin.json but the plugin did not advertise it; calls to it may fail",
                    t.wire_name
                ));
            }
            let mut def = ToolDef::declared(t);
            if def.description.is_empty() {
                def.description = advertised
                    .and_then(|(_, d)| *d)
                    .unwrap_or_default()
                    .chars()
                    .take(1024)
                    .collect();
            }
            def
        })
        .collect();
    Ok(Handshake {
        server_version: None,
        tools,
        warnings,
    })
}

/// The catalog `plugin.json` declares (`capabilities.tools`), without
/// starting the plugin: what an approval lists while the plugin still waits
/// for its required settings (seed 004: approval, then configuration, then
/// the first call starts it).
pub fn declared_tools(spec: &PluginSpec) -> Vec<ToolDef> {
    spec.tools.iter().map(ToolDef::declared).collect()
}

/// The text of a result's `content` items, joined by newlines.
fn content_text(result: &Value) -> String {
    let text: Vec<&str> = result
        .get("content")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|c| c.get("text").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    text.join("\n")
}

/// The Salmex I/O plugin contract.
#[derive(Debug, Clone, Copy, Default)]
pub struct Salmex;

impl Dialect for Salmex {
    fn name(&self) -> &'static str {
        "salmex"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            live_config: true,
            ..Capabilities::default()
        }
    }

    fn declared_catalog(&self, spec: &PluginSpec) -> Option<Vec<ToolDef>> {
        Some(declared_tools(spec))
    }

    fn config_changed(&self, conn: &Conn, config: Value) -> bool {
        config_changed(conn, config)
    }

    fn setup(&self, a: SetupArgs<'_>) -> Setup {
        setup(a)
    }

    fn handshake<'a>(&'a self, a: HandshakeArgs<'a>) -> HandshakeFuture<'a> {
        Box::pin(handshake(a.peer, a.spec, a.services, a.launch, a.timeout))
    }

    /// Calls a tool with `tools/call {name, arguments}`. The result comes back
    /// as the plugin sent it; `isError: true` becomes
    /// [`ToolError::ExecutionFailed`] with the text content as message.
    fn call_tool<'a>(&'a self, call: ToolCall<'a>) -> CallFuture<'a> {
        let (conn, spec, tool, args, ctx, timeout) = call.into_parts();
        Box::pin(async move {
            let plugin: Arc<str> = spec.id.as_str().into();
            let params = json!({"name": tool.wire(), "arguments": args});
            let result = guarded_call(
                &conn.peer,
                Some(&conn.process),
                "tools/call",
                params,
                timeout,
                ctx.progress.clone(),
            )
            .await;
            let result = result.map_err(|e| map_error(&plugin, &tool.name, e))?;
            if result.get("isError").and_then(Value::as_bool) == Some(true) {
                let text = content_text(&result);
                let message = if text.is_empty() {
                    "the tool reported an error without text content".to_owned()
                } else {
                    sanitize(&text)
                };
                return Err(ToolError::ExecutionFailed {
                    plugin,
                    tool: tool.name.clone(),
                    message,
                });
            }
            Ok(result)
        })
    }

    /// Sends the `shutdown` notification (waiting at most `reply_timeout` for
    /// room in the queue). No reply comes: the supervisor then waits the grace
    /// period for the exit and kills the process group.
    fn shutdown<'a>(&'a self, conn: &'a Conn, reply_timeout: Duration) -> DialectFuture<'a, ()> {
        Box::pin(async move {
            let payload = SalmexProtocol.encode_notification("shutdown", None);
            let _ = tokio::time::timeout(reply_timeout, conn.peer.send_payload(payload)).await;
        })
    }
}

/// Maps a failed `tools/call`: `-32602` (invalid params) is the plugin
/// refusing the arguments; everything else stays a call error.
fn map_error(plugin: &Arc<str>, tool: &str, err: CallError) -> ToolError {
    if let CallError::Remote { error, .. } = &err
        && error.code == codes::INVALID_PARAMS
    {
        return ToolError::ArgumentInvalid {
            plugin: plugin.clone(),
            tool: tool.to_owned(),
            message: error.message.clone(),
            details: error.data.clone(),
        };
    }
    ToolError::Call(err)
}

/// Tells a running plugin its configuration changed (`config/changed
/// {config}`) so it can hot-reload. Returns `false` when the notification
/// could not be queued (queue full or connection closed).
pub fn config_changed(conn: &Conn, config: Value) -> bool {
    conn.peer
        .notify("config/changed", Some(json!({ "config": config })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugd_manifest::DeclaredTool;

    fn spec() -> PluginSpec {
        let tool = |n: &str, d: &str, risk: &str| DeclaredTool {
            name: format!("hello-node/{n}"),
            wire_name: n.to_owned(),
            description: d.to_owned(),
            input_schema: json!({"type": "object"}),
            risk_level: Some(risk.to_owned()),
        };
        PluginSpec {
            id: "hello-node".into(),
            tools: vec![tool("say_hello", "", "low"), tool("wave", "Wave", "high")],
            ..PluginSpec::base()
        }
    }

    fn check(reply: &str) -> Result<Handshake, HandshakeError> {
        check_initialize_reply(&spec(), &serde_json::from_str(reply).unwrap())
    }

    /// The seed's `main.js` reply shape, and the verdicts on lying replies.
    #[test]
    fn initialize_replies() {
        let ok = check(
            r#"{"protocolVersion":"1.0","capabilities":{"tools":[{"name":"say_hello","description":"Greet someone","parameters":{"type":"object"}}]}}"#,
        )
        .unwrap();
        assert_eq!(ok.tools.len(), 2, "the catalog is the manifest's");
        assert_eq!(ok.tools[0].name, "hello-node/say_hello");
        assert_eq!(ok.tools[0].wire(), "say_hello");
        assert_eq!(
            ok.tools[0].description, "Greet someone",
            "advertised, as the manifest has none"
        );
        assert_eq!(ok.tools[1].description, "Wave");
        assert_eq!(ok.tools[1].risk_level.as_deref(), Some("high"));
        assert_eq!(ok.warnings.len(), 1, "{:?}", ok.warnings);
        assert!(ok.warnings[0].contains("\"wave\""));

        let e = check(r#"{"protocolVersion":"2.0","capabilities":{"tools":[]}}"#).unwrap_err();
        assert!(
            matches!(&e, HandshakeError::Malformed { reason, .. } if reason.contains("protocolVersion \"2.0\" is not \"1.0\"")),
            "{e}"
        );
        let e = check(r#"{"capabilities":{}}"#).unwrap_err();
        assert!(e.to_string().contains("missing protocolVersion"), "{e}");
        let e = check(
            r#"{"protocolVersion":"1.0","capabilities":{"tools":[{"name":"other/say_hello"}]}}"#,
        )
        .unwrap_err();
        assert!(
            matches!(&e, HandshakeError::Namespace { tool, .. } if tool == "other/say_hello"),
            "{e}"
        );
        assert!(e.is_permanent());
        let e = check(r#"{"protocolVersion":"1.0","capabilities":{"tools":[{"name":"rm_rf"}]}}"#)
            .unwrap_err();
        assert!(
            matches!(&e, HandshakeError::UndeclaredTool { tool, .. } if tool == "rm_rf"),
            "{e}"
        );
        let e = check(r#"{"protocolVersion":"1.0","capabilities":{"tools":[{"name":"wave"},{"name":"wave"}]}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("advertised twice"), "{e}");
        for bad in [
            r#"[1]"#,
            r#"{"protocolVersion":"1.0","capabilities":[]}"#,
            r#"{"protocolVersion":"1.0","capabilities":{"tools":{}}}"#,
            r#"{"protocolVersion":"1.0","capabilities":{"tools":[{"nom":"x"}]}}"#,
        ] {
            assert!(
                matches!(check(bad), Err(HandshakeError::Malformed { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn progress_notifications_become_events() {
        let p = SalmexProtocol;
        let got = p
            .decode(br#"{"jsonrpc":"2.0","method":"event.progress","params":{"id":7,"message":"half","progress":1,"total":2}}"#)
            .unwrap();
        assert!(
            matches!(&got, Incoming::Event { request_id: Some(7), event } if event["message"] == "half"),
            "{got:?}"
        );
        for (params, want) in [
            (r#"{"requestId":3}"#, Some(3)),
            (r#"{"request_id":4}"#, Some(4)),
            (r#"{"id":"abc"}"#, None),
            (r#""working""#, None),
        ] {
            let frame =
                format!(r#"{{"jsonrpc":"2.0","method":"event.progress","params":{params}}}"#);
            match p.decode(frame.as_bytes()).unwrap() {
                Incoming::Event { request_id, .. } => assert_eq!(request_id, want, "{params}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            p.decode(br#"{"jsonrpc":"2.0","method":"log.info","params":"x"}"#)
                .unwrap(),
            Incoming::Notification { .. }
        ));
        assert!(matches!(
            p.decode(br#"{"jsonrpc":"2.0","method":"log.info","params":"plain"}"#)
                .unwrap(),
            Incoming::Notification {
                params: Some(Value::String(_)),
                ..
            }
        ));
        assert!(p.decode(b"not json").is_err());
        assert!(
            p.decode(br#"{"jsonrpc":"2.0","id":1,"method":"m","params":"x"}"#)
                .is_err(),
            "a request with scalar params stays invalid"
        );
    }

    #[test]
    fn frames_to_plugins_are_ascii_with_the_same_value() {
        let params = json!({"name": "Zoë 😀 \"q\" \\ é"});
        let bytes = SalmexProtocol.encode_request(1, "tools/call", Some(params.clone()));
        assert!(bytes.is_ascii(), "{}", String::from_utf8_lossy(&bytes));
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains(r"Zo\u00eb \ud83d\ude00"), "{text}");
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["params"], params);
    }

    #[test]
    fn log_params_string_or_object() {
        assert_eq!(log_parts(Some(&json!("hi"))), ("hi".to_owned(), None));
        let (m, f) = log_parts(Some(&json!({"message": "a\nb\u{1b}[31m", "n": 1})));
        assert_eq!(m, "a\\nb\\u{1b}[31m");
        assert_eq!(f.as_deref(), Some(r#"{"n":1}"#));
        let long = "x".repeat(MAX_LOG_MESSAGE * 2);
        assert!(log_parts(Some(&json!(long))).0.len() <= MAX_LOG_MESSAGE + 4);
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::test_json::{json_with, jsonrpc_frame};
    use proptest::prelude::*;

    const KEYS: &[&str] = &[
        "id",
        "requestId",
        "request_id",
        "message",
        "msg",
        "progress",
        "level",
    ];
    const STRINGS: &[&str] = &[
        "event.progress",
        "log.info",
        "log.error",
        "log.debug",
        "log.warn",
        "1",
    ];

    fn frame() -> BoxedStrategy<Value> {
        jsonrpc_frame(STRINGS, KEYS, STRINGS)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn decode_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = SalmexProtocol.decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_notifications(v in frame()) {
            let _ = SalmexProtocol.decode(v.to_string().as_bytes());
        }

        /// `log.*` params render to one bounded line.
        #[test]
        fn log_parts_never_panic(v in prop::option::of(json_with(KEYS, STRINGS))) {
            let (message, fields) = log_parts(v.as_ref());
            for s in std::iter::once(&message).chain(fields.as_ref()) {
                prop_assert!(!s.contains('\n') && s.len() <= MAX_LOG_MESSAGE + 16, "{s:?}");
            }
        }
    }
}
