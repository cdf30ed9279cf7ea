//! The native dialect: the nexo Plugin Contract 1.10 (line-delimited JSON-RPC).
//!
//! Translates plugd's internal operations (handshake, tool call, shutdown)
//! into the contract's frames: `initialize` (§4.1, with the §4.1.1 tool
//! catalog), `tool.invoke` (§5.t) and `shutdown` (§4.2), and maps the
//! contract's typed errors into [`ToolError`]. The plugin's own requests
//! (`broker.*`, `memory.recall`, `llm.complete`) are served by
//! `plugd_host::native_host`, `llm.chat` by `plugd_host::native_llm`.

use std::sync::Arc;
use std::time::Duration;

use plugd_manifest::{NEXO_CONTRACT_VERSION, NEXO_HOST_VERSION, PluginSpec, tool_in_namespace};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use plugd_host::dialect::{
    CallFuture, Capabilities, Dialect, DialectFuture, DialectState, HandshakeArgs, HandshakeFuture,
    HookStyle, Setup, SetupArgs, ToolCall,
};
use plugd_host::model::{Handshake, HandshakeError, ToolDef, ToolError, map_tool_error};
use plugd_host::native_host::{self, NativeHost, NativeState};
use plugd_host::peer::{CallError, Peer};
use plugd_host::supervisor::Conn;

/// The nexo Plugin Contract (`nexo-plugin.toml`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Native;

impl Dialect for Native {
    fn name(&self) -> &'static str {
        "native"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hooks: Some(HookStyle::OnHook),
            nexo_providers: true,
            declared_tool_not_found: true,
            ..Capabilities::default()
        }
    }

    /// JSON-RPC lines, with `llm.chat.delta` routed to its `llm.chat` call;
    /// the plugin's own requests go to the host services.
    fn setup(&self, a: SetupArgs<'_>) -> Setup {
        let host = NativeHost::new(a.spec.clone(), a.services.api.clone());
        let state: DialectState = Arc::new(host.state());
        Setup {
            protocol: Arc::new(plugd_host::native_llm::NativeProtocol),
            handler: Arc::new(host),
            cancel: None,
            state: Some(state),
        }
    }

    fn handshake<'a>(&'a self, a: HandshakeArgs<'a>) -> HandshakeFuture<'a> {
        Box::pin(async move {
            let handshake = initialize_with(a.peer, a.spec, &a.launch.config, a.timeout).await?;
            if let Some(native) = a.state.and_then(|s| s.downcast_ref::<NativeState>()) {
                native_host::attach(a.peer, a.spec, a.services.api.as_ref(), native);
            }
            Ok(handshake)
        })
    }

    fn call_tool<'a>(&'a self, call: ToolCall<'a>) -> CallFuture<'a> {
        let (conn, _spec, tool, args, ctx, timeout) = call.into_parts();
        Box::pin(invoke_tool(
            &conn.peer,
            tool.wire(),
            args,
            ctx.agent_id.as_deref(),
            timeout,
        ))
    }

    fn shutdown<'a>(&'a self, conn: &'a Conn, reply_timeout: Duration) -> DialectFuture<'a, ()> {
        Box::pin(async move {
            let _ = shutdown(&conn.peer, reply_timeout).await;
        })
    }
}

/// Sends `initialize` and validates the reply against the manifest.
pub async fn initialize(
    peer: &Peer,
    spec: &PluginSpec,
    timeout: Duration,
) -> Result<Handshake, HandshakeError> {
    initialize_with(peer, spec, &Value::Null, timeout).await
}

/// [`initialize`] carrying the plugin's settings: when `config` is not null
/// it goes in `params.config` (a plugd extension of §4.1, which only defines
/// `nexo_version` and `contract_version`; SDKs ignore unknown params). Settings change only by a
/// restart, which sends a fresh `initialize`.
pub async fn initialize_with(
    peer: &Peer,
    spec: &PluginSpec,
    config: &Value,
    timeout: Duration,
) -> Result<Handshake, HandshakeError> {
    let mut params = json!({
        "nexo_version": NEXO_HOST_VERSION,
        "contract_version": NEXO_CONTRACT_VERSION,
    });
    if !config.is_null() {
        params["config"] = config.clone();
    }
    let reply = peer.call("initialize", Some(params), timeout).await?;
    check_initialize_reply(spec, &reply)
}

/// Validates an `initialize` reply (§4.1, §4.1.1).
pub fn check_initialize_reply(
    spec: &PluginSpec,
    reply: &Value,
) -> Result<Handshake, HandshakeError> {
    let malformed = |reason: String| HandshakeError::Malformed {
        plugin: spec.id.clone(),
        reason,
    };
    let Some(obj) = reply.as_object() else {
        return Err(malformed(format!("expected an object, got {reply}")));
    };
    let got = obj
        .get("manifest")
        .and_then(|m| m.get("plugin"))
        .and_then(|p| p.get("id"))
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("missing manifest.plugin.id".into()))?;
    if got != spec.id {
        return Err(HandshakeError::IdentityMismatch {
            expected: spec.id.clone(),
            got: got.chars().take(64).collect(),
        });
    }
    let server_version = obj
        .get("server_version")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let tools: Vec<ToolDef> = match obj.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|e| malformed(format!("\"tools\": {e}")))?
        }
    };
    let mut seen = std::collections::HashSet::new();
    for tool in &tools {
        if !tool_in_namespace(&spec.id, &tool.name) {
            return Err(HandshakeError::Namespace {
                plugin: spec.id.clone(),
                tool: tool.name.clone(),
                rule: format!("names must start with \"{0}_\" or \"ext_{0}_\"", spec.id),
            });
        }
        if !spec.declared_tools.iter().any(|d| d == &tool.name) {
            return Err(HandshakeError::UndeclaredTool {
                plugin: spec.id.clone(),
                tool: tool.name.clone(),
                declared_in: "[plugin.extends].tools of nexo-plugin.toml",
            });
        }
        if !seen.insert(tool.name.as_str()) {
            return Err(malformed(format!("tool {:?} advertised twice", tool.name)));
        }
        if !tool.input_schema.is_object() && !tool.input_schema.is_boolean() {
            return Err(malformed(format!(
                "tool {:?}: input_schema must be a JSON Schema object",
                tool.name
            )));
        }
    }
    if !spec.declared_tools.is_empty() && tools.is_empty() {
        return Err(malformed(
            "the manifest declares tools but the reply has no \"tools\" catalog (§4.1.1)".into(),
        ));
    }
    let warnings = spec
        .declared_tools
        .iter()
        .filter(|d| !seen.contains(d.as_str()))
        .map(|d| {
            format!(
                "tool {d:?} is declared in the manifest but not advertised; calls to it will fail"
            )
        })
        .collect();
    Ok(Handshake {
        server_version,
        tools,
        warnings,
    })
}

/// Calls one tool with `tool.invoke` (§5.t).
pub async fn invoke_tool(
    peer: &Peer,
    tool: &str,
    args: Value,
    agent_id: Option<&str>,
    timeout: Duration,
) -> Result<Value, ToolError> {
    let params = json!({
        "plugin_id": &**peer.plugin(),
        "tool_name": tool,
        "args": args,
        "agent_id": agent_id,
    });
    peer.call("tool.invoke", Some(params), timeout)
        .await
        .map_err(|e| map_tool_error(peer.plugin(), tool, e))
}

/// Sends `shutdown` (§4.2) and waits for the reply.
pub async fn shutdown(peer: &Peer, timeout: Duration) -> Result<(), CallError> {
    peer.call(
        "shutdown",
        Some(json!({"reason": "host requested"})),
        timeout,
    )
    .await
    .map(|_| ())
}

/// A native plugin's answer to `hook.on_hook` (§5.z, nexo's `HookResponse`).
/// Every field is optional on the wire; `{}` means "continue unchanged".
/// Unknown fields are ignored (nexo adds fields in minor versions); known
/// fields with the wrong type make the reply malformed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HookResponse {
    /// Legacy block signal (Phase 11.6): `true` stops the event.
    #[serde(default)]
    pub abort: bool,
    /// Operator-readable explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Key-by-key event mutation; non-object values are ignored (and reported).
    #[serde(default, rename = "override", skip_serializing_if = "Option::is_none")]
    pub override_: Option<Value>,
    /// The richer decision (Phase 83.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<HookDecision>,
    /// The new body, meaningful with `decision: "transform"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformed_body: Option<String>,
    /// Anti-loop signal: suppress pending auto-replies for the conversation.
    #[serde(default)]
    pub do_not_reply_again: bool,
}

/// `HookResponse.decision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HookDecision {
    /// Proceed.
    Allow,
    /// Stop.
    Block,
    /// Proceed with `transformed_body` as the new body.
    Transform,
}

/// Why `hook.on_hook` produced no [`HookResponse`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum HookCallError {
    /// The call failed (timeout, crash, JSON-RPC error other than `-32601`).
    #[error(transparent)]
    Call(#[from] CallError),
    /// The reply is not a `HookResponse`.
    #[error(
        "plugin {plugin:?} answered hook.on_hook ({hook:?}) with a malformed HookResponse: {reason}; reply with {{abort, reason, override, decision: allow|block|transform, transformed_body, do_not_reply_again}}"
    )]
    Malformed {
        /// Plugin id.
        plugin: Arc<str>,
        /// The hook name.
        hook: String,
        /// What is wrong.
        reason: String,
    },
}

/// Asks a native plugin to handle one hook event (`hook.on_hook`, §5.z).
/// Every failure, `-32601` included, is an error, so the caller's error
/// policy decides: nexo's continue-on-error by default for native handlers,
/// fail closed when the operator marks the handler `on_error: block`.
pub async fn on_hook(
    peer: &Peer,
    plugin_id: &str,
    hook_name: &str,
    event: Value,
    timeout: Duration,
) -> Result<HookResponse, HookCallError> {
    let params = json!({"plugin_id": plugin_id, "hook_name": hook_name, "event": event});
    let reply = peer.call("hook.on_hook", Some(params), timeout).await?;
    let malformed = |reason: String| HookCallError::Malformed {
        plugin: peer.plugin().clone(),
        hook: hook_name.to_owned(),
        reason,
    };
    match &reply {
        Value::Null => return Ok(HookResponse::default()),
        Value::Object(_) => {}
        other => {
            let text: String = other.to_string().chars().take(120).collect();
            return Err(malformed(format!("expected an object, got {text}")));
        }
    }
    serde_json::from_value(reply).map_err(|e| malformed(e.to_string()))
}
