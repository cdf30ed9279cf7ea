//! Remote hook handlers: a plugin of the [`Runtime`] serving one handler, with
//! its reply mapped onto [`HandlerResult`].
//!
//! * [`NativeHook`]: `hook.on_hook {plugin_id, hook_name, event}` (nexo §5.z),
//!   reply `HookResponse`, see [`map_hook_response`].
//! * [`MicroappHook`]: `hooks/<hook>` with the payload as params; vote `deny`
//!   cancels, `allow` and `abstain` pass.
//! * [`ToolHook`]: any dialect's tool bound as a hook, called with
//!   `{point, payload, context}`; its result carries Dexto `PluginResult`
//!   fields, see [`parse_tool_result`].
//!
//! Each adapter holds the runtime and the plugin id, never a connection: every
//! call asks the supervisor for the current one, so a restarted plugin keeps
//! serving. Plugin-side failures (crash, timeout, JSON-RPC error, malformed
//! reply) are [`HookError`]s, so the entry's `on_error` policy applies. For
//! a native `hook.on_hook` handler the default is nexo §5.z's
//! continue-on-error (`hooks::build` sets it); the operator makes a guard
//! fail closed with `on_error: block` in plugd.yaml. Other handlers keep
//! plugd's default: fail closed when blocking.

use std::time::{Duration, Instant};

use plugd_dialects::microapp::{self, Vote};
use plugd_dialects::native::{self, HookCallError, HookDecision, HookResponse};
use plugd_host::dialect::CallContext;
use plugd_host::model::ToolError;
use plugd_host::{CallError, CallToolError, Conn, PluginError};
use serde_json::{Map, Value, json};

use plugd_runtime::hooks::{
    HandlerResult, HookContext, HookError, HookFuture, HookHandler, HookPoint, Notice, NoticeKind,
};
use plugd_runtime::{Runtime, RuntimeError};

/// The payload field a `transform` decision rewrites at `point`
/// (`None` at `before_tool_call`, whose payload has no text: use `override`).
pub fn text_field(point: HookPoint) -> Option<&'static str> {
    match point {
        HookPoint::BeforeLlmRequest => Some("text"),
        HookPoint::BeforeResponse => Some("content"),
        HookPoint::BeforeMessage => Some("body"),
        HookPoint::AfterToolResult => Some("result"),
        HookPoint::BeforeToolCall => None,
    }
}

/// The current connection of `plugin`, started if needed, within `timeout`.
async fn connection(
    runtime: &Runtime,
    plugin: &str,
    timeout: Duration,
) -> Result<std::sync::Arc<Conn>, HookError> {
    let sup = runtime
        .supervised(plugin)
        .map_err(|e| HookError::Failed(e.to_string()))?;
    let started = Instant::now();
    sup.connection(started + timeout)
        .await
        .map_err(|e| match e {
            // Not ready because the time ran out; a start that failed
            // earlier (backoff) is a failure, not a timeout.
            PluginError::NotReady { .. } if started.elapsed() >= timeout => {
                HookError::Timeout(timeout)
            }
            other => HookError::Failed(other.to_string()),
        })
}

fn call_error(e: CallError) -> HookError {
    match e {
        CallError::Timeout { after, .. } => HookError::Timeout(after),
        other => HookError::Failed(other.to_string()),
    }
}

fn block_notice(code: &str, message: &str, details: Value) -> Notice {
    let mut n = Notice::new(NoticeKind::Block, Some(code), message);
    n.details = Some(details);
    n
}

/// Maps a native `HookResponse` onto a handler result:
/// * `abort: true` or `decision: "block"` cancels with `reason` (notice
///   `HOOK_BLOCKED`);
/// * `override` (an object) is merged key by key; any other value is ignored
///   with a `HOOK_OVERRIDE_IGNORED` warning, as nexo does;
/// * `decision: "transform"` sets the point's text field ([`text_field`]) to
///   `transformed_body` (after `override`); a transform without a body, or at
///   a point without a text field, is a malformed reply (an error);
/// * `do_not_reply_again: true` adds an info notice `DO_NOT_REPLY_AGAIN`;
/// * `{}` and `decision: "allow"` pass.
pub fn map_hook_response(
    point: HookPoint,
    plugin: &str,
    hook: &str,
    resp: HookResponse,
) -> Result<HandlerResult, HookError> {
    let mut result = HandlerResult::pass();
    let details = json!({"plugin": plugin, "hook": hook});
    if resp.do_not_reply_again {
        let mut n = Notice::new(
            NoticeKind::Info,
            Some("DO_NOT_REPLY_AGAIN"),
            format!("plugin {plugin:?} asks not to auto-reply again in this conversation"),
        );
        n.details = Some(details.clone());
        result.notices.push(n);
    }
    if resp.abort || resp.decision == Some(HookDecision::Block) {
        let message = resp
            .reason
            .unwrap_or_else(|| format!("blocked by plugin {plugin:?} (hook {hook:?})"));
        result.cancel = true;
        result
            .notices
            .insert(0, block_notice("HOOK_BLOCKED", &message, details));
        result.message = Some(message);
        return Ok(result);
    }
    let mut modify = Map::new();
    match resp.override_ {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => modify.extend(m),
        Some(other) => {
            let kind = match other {
                Value::Array(_) => "a list",
                Value::String(_) => "a string",
                Value::Number(_) => "a number",
                _ => "a boolean",
            };
            let mut n = Notice::new(
                NoticeKind::Warn,
                Some("HOOK_OVERRIDE_IGNORED"),
                format!(
                    "plugin {plugin:?} sent override as {kind}; only an object is merged, so it was ignored"
                ),
            );
            n.details = Some(details.clone());
            result.notices.push(n);
        }
    }
    if resp.decision == Some(HookDecision::Transform) {
        let Some(field) = text_field(point) else {
            return Err(HookError::Failed(format!(
                "plugin {plugin:?} answered hook {hook:?} with decision \"transform\" at {point}, which has no text field; send override {{\"args\": …}} instead"
            )));
        };
        let Some(body) = resp.transformed_body else {
            return Err(HookError::Failed(format!(
                "plugin {plugin:?} answered hook {hook:?} with decision \"transform\" but no transformed_body"
            )));
        };
        modify.insert(field.to_owned(), Value::String(body));
    }
    if !modify.is_empty() {
        result.modify = Some(modify);
    }
    Ok(result)
}

/// A handler served by a native plugin's `hook.on_hook`.
#[derive(Debug, Clone)]
pub struct NativeHook {
    runtime: Runtime,
    plugin: String,
    hook: String,
    timeout: Duration,
}

impl NativeHook {
    /// Serves hook `hook` of plugin `plugin`; `timeout` bounds each call.
    pub fn new(runtime: Runtime, plugin: &str, hook: &str, timeout: Duration) -> Self {
        NativeHook {
            runtime,
            plugin: plugin.to_owned(),
            hook: hook.to_owned(),
            timeout,
        }
    }

    async fn call(&self, point: HookPoint, payload: &Value) -> Result<HandlerResult, HookError> {
        let started = Instant::now();
        let conn = connection(&self.runtime, &self.plugin, self.timeout).await?;
        let left = self
            .timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        let resp = native::on_hook(&conn.peer, &self.plugin, &self.hook, payload.clone(), left)
            .await
            .map_err(|e| match e {
                HookCallError::Call(e) => call_error(e),
                other => HookError::Failed(other.to_string()),
            })?;
        map_hook_response(point, &self.plugin, &self.hook, resp)
    }
}

impl HookHandler for NativeHook {
    fn handle<'a>(
        &'a self,
        point: HookPoint,
        payload: &'a Value,
        _ctx: &'a HookContext,
    ) -> HookFuture<'a> {
        Box::pin(self.call(point, payload))
    }
}

/// A handler served by a microapp's `hooks/<hook>`.
#[derive(Debug, Clone)]
pub struct MicroappHook {
    runtime: Runtime,
    plugin: String,
    hook: String,
    timeout: Duration,
}

impl MicroappHook {
    /// Serves `hooks/<hook>` of microapp `plugin`; `timeout` bounds each call.
    pub fn new(runtime: Runtime, plugin: &str, hook: &str, timeout: Duration) -> Self {
        MicroappHook {
            runtime,
            plugin: plugin.to_owned(),
            hook: hook.to_owned(),
            timeout,
        }
    }

    async fn call(&self, payload: &Value) -> Result<HandlerResult, HookError> {
        let started = Instant::now();
        let conn = connection(&self.runtime, &self.plugin, self.timeout).await?;
        let left = self
            .timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        let vote = microapp::call_hook(&conn, &self.hook, payload.clone(), left)
            .await
            .map_err(|e| match e {
                ToolError::Call(e) => call_error(e),
                other => HookError::Failed(other.to_string()),
            })?;
        match vote.vote {
            Vote::Deny => {
                let message = vote.reason.clone().unwrap_or_else(|| {
                    format!("denied by microapp {:?} (hooks/{})", self.plugin, self.hook)
                });
                let details =
                    json!({"plugin": self.plugin, "hook": self.hook, "metadata": vote.metadata});
                Ok(HandlerResult {
                    cancel: true,
                    notices: vec![block_notice("HOOK_BLOCKED", &message, details)],
                    message: Some(message),
                    ..HandlerResult::default()
                })
            }
            Vote::Allow | Vote::Abstain => Ok(HandlerResult::pass()),
        }
    }
}

impl HookHandler for MicroappHook {
    fn handle<'a>(
        &'a self,
        _point: HookPoint,
        payload: &'a Value,
        _ctx: &'a HookContext,
    ) -> HookFuture<'a> {
        Box::pin(self.call(payload))
    }
}

/// A plugin tool (any dialect) bound as a hook handler.
#[derive(Debug, Clone)]
pub struct ToolHook {
    runtime: Runtime,
    plugin: String,
    tool: String,
}

impl ToolHook {
    /// Binds tool `tool` (its registry name or wire name) of plugin `plugin`.
    pub fn new(runtime: Runtime, plugin: &str, tool: &str) -> Self {
        ToolHook {
            runtime,
            plugin: plugin.to_owned(),
            tool: tool.to_owned(),
        }
    }

    /// The registry name of the bound tool, if the plugin has it now.
    pub fn registry_name(&self) -> Option<String> {
        find_tool(&self.runtime, &self.plugin, &self.tool)
    }

    async fn call(
        &self,
        point: HookPoint,
        payload: &Value,
        ctx: &HookContext,
    ) -> Result<HandlerResult, HookError> {
        let name = self.registry_name().ok_or_else(|| {
            HookError::Failed(format!(
                "plugin {:?} has no tool {:?} now; `plugd tool list` shows its tools",
                self.plugin, self.tool
            ))
        })?;
        let args = json!({"point": point.name(), "payload": payload, "context": ctx});
        let call_ctx = CallContext {
            agent_id: ctx.agent_id.clone(),
            session_id: ctx.session_id.clone(),
            trace_id: ctx.trace_id.clone(),
            org_id: ctx.tenant_id.clone(),
            ..CallContext::default()
        };
        // A hook's own tool passes every step but the tool hooks (which
        // would call it again).
        let gov = plugd_runtime::governed::Governed::new(plugd_runtime::governed::Surface::Hook);
        let result = self
            .runtime
            .call_tool_governed(&name, args, &call_ctx, &gov)
            .await
            .outcome
            .map_err(|e| match e {
                RuntimeError::Call(CallToolError::Tool(ToolError::Call(e))) => call_error(e),
                other => HookError::Failed(other.to_string()),
            })?;
        parse_tool_result(&result).map_err(|why| {
            HookError::Failed(format!(
                "tool {name:?} of plugin {:?} answered as a hook with {why}; return {{ok, modify, cancel, message, notices}} as its JSON result or as the JSON text of its first text content",
                self.plugin
            ))
        })
    }
}

impl HookHandler for ToolHook {
    fn handle<'a>(
        &'a self,
        point: HookPoint,
        payload: &'a Value,
        ctx: &'a HookContext,
    ) -> HookFuture<'a> {
        Box::pin(self.call(point, payload, ctx))
    }
}

/// The registry name of `tool` (a registry or wire name) of `plugin`.
pub(crate) fn find_tool(runtime: &Runtime, plugin: &str, tool: &str) -> Option<String> {
    let tools = runtime.tools();
    tools
        .iter()
        .filter(|t| t.plugin == plugin)
        .find(|t| t.name == tool)
        .or_else(|| {
            tools
                .iter()
                .filter(|t| t.plugin == plugin)
                .find(|t| t.def.wire() == tool)
        })
        .map(|t| t.name.clone())
}

const RESULT_FIELDS: [&str; 5] = ["ok", "modify", "cancel", "message", "notices"];

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        s.chars().take(120).collect::<String>() + "…"
    } else {
        s
    }
}

/// Reads a hook verdict from a tool result: the result itself when it has
/// `PluginResult` fields, else its `structuredContent` (MCP), else the JSON
/// text of its first text content (MCP, Salmex); an object without any of
/// the fields passes. A result that is not an object, or text that is not a
/// JSON object, is an error (the handler's `on_error` policy applies).
pub fn parse_tool_result(result: &Value) -> Result<HandlerResult, String> {
    let has_fields = |v: &Value| {
        v.as_object()
            .is_some_and(|m| RESULT_FIELDS.iter().any(|k| m.contains_key(*k)))
    };
    let verdict: Value = if has_fields(result) {
        result.clone()
    } else if let Some(sc) = result.get("structuredContent").filter(|v| v.is_object()) {
        sc.clone()
    } else if let Some(content) = result.get("content").and_then(Value::as_array) {
        let text = content
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("text"))
            .and_then(|c| c.get("text"))
            .and_then(Value::as_str)
            .ok_or_else(|| format!("content without text: {}", short(result)))?;
        let v: Value = serde_json::from_str(text).map_err(|e| {
            format!(
                "text content that is not JSON ({e}): {:?}",
                short(&Value::String(text.to_owned()))
            )
        })?;
        if !v.is_object() {
            return Err(format!(
                "text content that is not a JSON object: {}",
                short(&v)
            ));
        }
        v
    } else if result.is_object() {
        result.clone()
    } else {
        return Err(format!("a result that is not an object: {}", short(result)));
    };
    let mut r: HandlerResult = serde_json::from_value(verdict.clone())
        .map_err(|e| format!("malformed PluginResult fields ({e}): {}", short(&verdict)))?;
    // The pipeline names the handler; a plugin does not get to.
    for n in &mut r.notices {
        n.handler = None;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(v: Value) -> HookResponse {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn native_block_transform_override_and_anti_loop() {
        let p = HookPoint::BeforeMessage;
        let r = map_hook_response(
            p,
            "c",
            "h",
            resp(json!({"abort": true, "reason": "PII detected", "decision": "block"})),
        )
        .unwrap();
        assert!(r.cancel);
        assert_eq!(r.message.as_deref(), Some("PII detected"));
        assert_eq!(r.notices[0].code.as_deref(), Some("HOOK_BLOCKED"));
        // Legacy abort alone blocks too, with a default message naming the plugin.
        let r = map_hook_response(p, "c", "h", resp(json!({"abort": true}))).unwrap();
        assert!(r.cancel && r.message.unwrap().contains("\"c\""));
        let r = map_hook_response(
            p,
            "c",
            "h",
            resp(json!({"decision": "transform", "transformed_body": "[REDACTED]"})),
        )
        .unwrap();
        assert_eq!(r.modify.unwrap()["body"], "[REDACTED]");
        let r = map_hook_response(HookPoint::BeforeLlmRequest, "c", "h", resp(json!({"decision": "transform", "transformed_body": "x", "override": {"text": "y", "k": 1}}))).unwrap();
        assert_eq!(
            Value::Object(r.modify.unwrap()),
            json!({"text": "x", "k": 1})
        );
        let r = map_hook_response(
            p,
            "c",
            "h",
            resp(json!({"override": [1], "do_not_reply_again": true})),
        )
        .unwrap();
        assert!(r.modify.is_none());
        let codes: Vec<_> = r.notices.iter().map(|n| n.code.clone().unwrap()).collect();
        assert_eq!(codes, ["DO_NOT_REPLY_AGAIN", "HOOK_OVERRIDE_IGNORED"]);
        let r = map_hook_response(p, "c", "h", resp(json!({}))).unwrap();
        assert_eq!(r, HandlerResult::pass());
        let r = map_hook_response(
            p,
            "c",
            "h",
            resp(json!({"decision": "allow", "reason": "fine"})),
        )
        .unwrap();
        assert_eq!(r, HandlerResult::pass());
    }

    #[test]
    fn native_transform_errors() {
        let e = map_hook_response(
            HookPoint::BeforeToolCall,
            "c",
            "h",
            resp(json!({"decision": "transform", "transformed_body": "x"})),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no text field"), "{e}");
        let e = map_hook_response(
            HookPoint::BeforeMessage,
            "c",
            "h",
            resp(json!({"decision": "transform"})),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no transformed_body"), "{e}");
    }

    #[test]
    fn hook_response_rejects_wrong_types_and_unknown_decisions() {
        for bad in [
            json!({"decision": "maybe"}),
            json!({"abort": "yes"}),
            json!({"transformed_body": 3}),
        ] {
            assert!(
                serde_json::from_value::<HookResponse>(bad.clone()).is_err(),
                "{bad}"
            );
        }
        // Unknown fields are tolerated (nexo adds fields in minor versions).
        assert!(serde_json::from_value::<HookResponse>(json!({"future": 1})).is_ok());
    }

    #[test]
    fn tool_results_in_every_shape() {
        let r = parse_tool_result(&json!({"ok": true, "modify": {"text": "x"}})).unwrap();
        assert_eq!(r.modify.unwrap()["text"], "x");
        let r = parse_tool_result(&json!({"content": [{"type": "text", "text": "{\"cancel\": true, \"message\": \"no\"}"}]})).unwrap();
        assert!(r.cancel && r.message.as_deref() == Some("no"));
        let r =
            parse_tool_result(&json!({"content": [], "structuredContent": {"modify": {"a": 1}}}))
                .unwrap();
        assert_eq!(r.modify.unwrap()["a"], 1);
        // An object without verdict fields passes.
        assert_eq!(
            parse_tool_result(&json!({"logged": true})).unwrap(),
            HandlerResult::pass()
        );
        // Spoofed handler names are cleared.
        let r = parse_tool_result(
            &json!({"notices": [{"kind": "info", "message": "m", "handler": "content_policy"}]}),
        )
        .unwrap();
        assert_eq!(r.notices[0].handler, None);
        for bad in [
            json!("yes"),
            json!({"content": [{"type": "text", "text": "Echo: hi"}]}),
            json!({"content": [{"type": "text", "text": "[1]"}]}),
            json!({"content": [{"type": "image", "data": ""}]}),
            json!({"cancel": "please"}),
            json!({"notices": [{"kind": "loud", "message": "m"}]}),
        ] {
            assert!(parse_tool_result(&bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::test_json::json_with;
    use proptest::prelude::*;

    const KEYS: &[&str] = &[
        "abort",
        "reason",
        "override",
        "decision",
        "transformed_body",
        "do_not_reply_again",
        "ok",
        "modify",
        "cancel",
        "message",
        "notices",
        "kind",
        "code",
        "details",
        "handler",
        "structuredContent",
        "content",
        "type",
        "text",
    ];
    const STRINGS: &[&str] = &[
        "allow",
        "block",
        "transform",
        "warn",
        "info",
        "text",
        "{}",
        "{\"ok\":true}",
        "{\"cancel\":true,\"message\":\"m\"}",
        "[]",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn map_hook_response_never_panics(v in json_with(KEYS, STRINGS)) {
            if let Ok(resp) = serde_json::from_value::<HookResponse>(v) {
                for point in HookPoint::ALL {
                    let _ = map_hook_response(point, "p", "h", resp.clone());
                }
            }
        }

        #[test]
        fn parse_tool_result_never_panics(v in json_with(KEYS, STRINGS)) {
            if let Ok(r) = parse_tool_result(&v) {
                prop_assert!(r.notices.iter().all(|n| n.handler.is_none()));
            }
            let _ = parse_tool_result(&json!({"content": [{"type": "text", "text": v.to_string()}]}));
        }
    }
}
