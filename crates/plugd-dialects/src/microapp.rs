//! The microapp dialect: nexo microapps (seed 001), line-delimited JSON-RPC 2.0 over stdio.
//!
//! | plugd operation | wire |
//! |---|---|
//! | handshake | `initialize {extension_id, state_dir, config}` → `{tools, version}` |
//! | refresh | `tools/list` → `{tools}` (or a bare list) |
//! | tool call | `tools/call {tool, args, binding_context, inbound}` → `{output}` or `{error}` |
//! | hook | `hooks/<name>` (event as params) → `{vote, reason, metadata}`, see [`call_hook`] |
//! | notification | `agents/updated`, `nexo/notify/*`, see [`notify`] |
//! | shutdown | `shutdown` (reply within 5 s), then SIGTERM; the supervisor SIGKILLs 5 s later |
//!
//! Nothing but `initialize` is sent at start-up: the seed's own Python
//! example crashes on `tools/list` and on any notification.
//!
//! **Tool names.** Every advertised tool must start with the entry id with
//! `-` read as `_`, then `_` (`agent-creator` → `agent_creator_create`); the
//! listed name is the advertised name, sent back unchanged.
//!
//! **Outbound requests** (ids `app:…`) are gated by the entry's
//! `capabilities`. A granted `nexo/dispatch {to, channel, body}` sends a text
//! message through the channel adapter of `channel` and answers
//! `{message_id, sent_at_unix}`, or the channel's typed error code
//! (`-33001..-33005`, `-32603` for anything else, `-32602` for bad params).
//! A granted `nexo/admin/<domain>/<method>` request (the names of the seed's
//! companion admin-rpc page) goes to `HostApi::microapp_admin` once its
//! params passed the checks here (an object or absent, at most
//! [`MAX_ADMIN_PARAMS_BYTES`] serialized, else `-32602`); an ungranted one is
//! answered `-32000` with `data {capability, method}`; an unknown method
//! `-32601`; a request whose id does not start with `app:` `-32600`. Admin
//! methods map to capabilities by family, the word after `nexo/admin/` up to
//! the first `/`, `_` or `.` (`llm_keys` and `llm_providers` are one family
//! each):
//!
//! | method | capability |
//! |---|---|
//! | `nexo/dispatch` | `dispatch_outbound` |
//! | `nexo/admin/agents/*`, `nexo/admin/reload` | `agents_crud` |
//! | `nexo/admin/credentials/*` | `credentials_crud` |
//! | `nexo/admin/pairing/*` | `pairing_initiate` |
//! | `nexo/admin/llm_providers/*`, `nexo/admin/llm_keys/*` | `llm_keys_crud` |
//! | `nexo/admin/channels/*` | `channels_crud` |
//! | `nexo/admin/transcripts/*` | `transcripts_subscribe` (plugd's choice; the seed names transcripts as admin surface without a capability) |
//!
//! **Hooks.** An `initialize` reply may carry `hooks: ["<name>", ...]`, the
//! hooks the microapp registers (at most [`MAX_HOOKS`] names of at most
//! [`MAX_HOOK_NAME`] characters, no duplicates; anything else fails the
//! handshake, naming the field); [`registered_hooks`] reads them from the
//! running connection and the runtime dispatches `hooks/<name>` for them.
//!
//! **Identity.** The contract has no identity echo; when an `initialize`
//! reply carries `extension_id` anyway, it must be this entry's id.
//!
//! **Why one file** (~810 product lines): one contract's dialect: its
//! envelope (`MicroappRpc`), its handler of the plugin's `app:` requests
//! with their capability gates, the handshake, `tools/call` and hook votes
//! all read the entry's `MicroappSpec` capabilities and the connection's
//! `MicroappState`.

use std::sync::Arc;
use std::time::Duration;

use plugd_manifest::PluginSpec;
use plugd_manifest::microapp::{Capability, MicroappSpec, tool_in_extension};
use plugd_wire::{ErrorObject, Framing, Id, codes};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use plugd_host::dialect::{
    CallContext, CallFuture, Capabilities, Dialect, DialectFuture, HandshakeArgs, HandshakeFuture,
    HookStyle, HostServices, Setup, SetupArgs, ToolCall,
};
use plugd_host::extensions::{OutboundMessage, channel_error_object};
use plugd_host::model::{Handshake, HandshakeError, ToolDef, ToolError};
use plugd_host::peer::{CallError, Handler, HandlerFuture, Peer};
use plugd_host::protocol::{Incoming, JsonRpc, Protocol};
use plugd_host::supervisor::Conn;

/// Seed code: "Capability not granted".
pub const CAPABILITY_NOT_GRANTED: i64 = -32000;
/// Seed code: "Tool input failed schema validation".
pub const INPUT_INVALID: i64 = -32001;
/// Seed code: "Backend service unavailable".
pub const BACKEND_UNAVAILABLE: i64 = -32002;
/// Seed code: "Rate limit".
pub const RATE_LIMITED: i64 = -32003;

/// Largest params object of a `nexo/admin/*` request, serialized (64 KiB);
/// a bigger one is refused with `-32602` before the runtime sees it.
pub const MAX_ADMIN_PARAMS_BYTES: usize = 64 * 1024;

/// Most hook names an `initialize` reply may register.
pub const MAX_HOOKS: usize = 64;
/// Longest hook name an `initialize` reply may register.
pub const MAX_HOOK_NAME: usize = 128;

/// What the microapp dialect keeps per connection: the hooks registered in
/// the `initialize` reply.
#[derive(Debug, Default)]
struct MicroappState {
    hooks: std::sync::Mutex<Vec<String>>,
}

/// The hooks a running microapp registered in its `initialize` reply (empty
/// for other dialects).
pub fn registered_hooks(conn: &Conn) -> Vec<String> {
    conn.state
        .as_ref()
        .and_then(|s| s.downcast_ref::<MicroappState>())
        .map(|s| s.hooks.lock().unwrap_or_else(|p| p.into_inner()).clone())
        .unwrap_or_default()
}

/// Prefix of the ids of requests a microapp sends the host.
pub const OUTBOUND_ID_PREFIX: &str = "app:";

/// Method name the envelope gives a child request whose id lacks `app:`,
/// so the handler can refuse it with `-32600` (a real method never has a NUL).
const BAD_ID_METHOD: &str = "\0plugd/bad-outbound-id";

/// The microapp part of `spec` (present for every microapp spec the loader makes).
fn micro(spec: &PluginSpec) -> Result<&MicroappSpec, String> {
    spec.microapp
        .as_ref()
        .ok_or_else(|| format!("plugin {:?} has no microapp declaration", spec.id))
}

/// JSON-RPC lines, with child requests checked for `app:` ids.
#[derive(Debug, Clone, Copy)]
struct MicroappRpc;

impl Protocol for MicroappRpc {
    fn framing(&self) -> Framing {
        Framing::Lines
    }
    fn encode_request(&self, id: i64, method: &str, params: Option<Value>) -> Vec<u8> {
        JsonRpc::LINES.encode_request(id, method, params)
    }
    fn encode_notification(&self, method: &str, params: Option<Value>) -> Vec<u8> {
        JsonRpc::LINES.encode_notification(method, params)
    }
    fn encode_response(&self, id: Id, outcome: Result<Value, ErrorObject>) -> Vec<u8> {
        JsonRpc::LINES.encode_response(id, outcome)
    }
    fn decode(&self, bytes: &[u8]) -> Result<Incoming, String> {
        match plugd_host::protocol::decode_jsonrpc(bytes)? {
            Incoming::Request { id, method, params } => {
                let ok = matches!(&id, Id::Str(s) if s.starts_with(OUTBOUND_ID_PREFIX));
                if ok {
                    Ok(Incoming::Request { id, method, params })
                } else {
                    Ok(Incoming::Request {
                        id,
                        method: BAD_ID_METHOD.to_owned(),
                        params: Some(json!({ "method": method })),
                    })
                }
            }
            other => Ok(other),
        }
    }
}

/// Serves a microapp's outbound requests and notifications.
struct MicroappHandler {
    plugin: Arc<str>,
    capabilities: Vec<Capability>,
    /// The runtime's services (`nexo/dispatch` through a channel adapter).
    api: Option<Arc<dyn plugd_host::native_host::HostApi>>,
}

/// The capability an admin method needs, or `None` for an unknown family.
pub fn admin_capability(method: &str) -> Option<Capability> {
    let rest = method.strip_prefix("nexo/admin/")?;
    if rest == "reload" {
        return Some(Capability::AgentsCrud);
    }
    let family_is = |f: &str| {
        rest.strip_prefix(f)
            .and_then(|r| r.chars().next())
            .is_some_and(|c| matches!(c, '_' | '/' | '.'))
    };
    [
        ("agents", Capability::AgentsCrud),
        ("credentials", Capability::CredentialsCrud),
        ("pairing", Capability::PairingInitiate),
        ("llm_keys", Capability::LlmKeysCrud),
        ("llm_providers", Capability::LlmKeysCrud),
        ("channels", Capability::ChannelsCrud),
        ("transcripts", Capability::TranscriptsSubscribe),
    ]
    .into_iter()
    .find(|(f, _)| family_is(f))
    .map(|(_, c)| c)
}

impl MicroappHandler {
    fn answer(&self, method: &str, params: Option<&Value>) -> ErrorObject {
        if method == BAD_ID_METHOD {
            let m = params
                .and_then(|p| p.get("method"))
                .and_then(Value::as_str)
                .unwrap_or("");
            return ErrorObject::new(
                codes::INVALID_REQUEST,
                format!(
                    "request {m:?} refused: microapp request ids must be strings starting with \"{OUTBOUND_ID_PREFIX}\""
                ),
            );
        }
        let needed = if method == "nexo/dispatch" {
            Capability::DispatchOutbound
        } else if let Some(cap) = admin_capability(method) {
            cap
        } else {
            return ErrorObject::new(
                codes::METHOD_NOT_FOUND,
                format!("method not found: {method}"),
            );
        };
        if !self.capabilities.contains(&needed) {
            return ErrorObject::new(
                CAPABILITY_NOT_GRANTED,
                format!(
                    "capability {needed} not granted: {method} needs \"{needed}\" in entries.{}.capabilities of extensions.yaml",
                    self.plugin
                ),
            )
            .with_data(json!({"capability": needed.as_str(), "method": method}));
        }
        if method == "nexo/dispatch" {
            let message = match params
                .and_then(|p| p.get("channel"))
                .and_then(Value::as_str)
            {
                Some(ch) => format!("no channel {ch:?} is available in this plugd"),
                None => "no channel is available in this plugd".to_owned(),
            };
            return ErrorObject::new(codes::INTERNAL_ERROR, message);
        }
        ErrorObject::new(
            codes::METHOD_NOT_FOUND,
            format!("{method}: this host has no admin surface"),
        )
    }
}

/// Reads `nexo/dispatch {to, channel, body}`.
fn dispatch_params(params: Option<&Value>) -> Result<(String, OutboundMessage), ErrorObject> {
    let field = |k: &str| {
        params
            .and_then(|p| p.get(k))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                ErrorObject::new(
                    codes::INVALID_PARAMS,
                    format!(
                        "nexo/dispatch needs a non-empty string {k:?} in {{to, channel, body}}"
                    ),
                )
            })
    };
    let (to, channel, body) = (field("to")?, field("channel")?, field("body")?);
    Ok((channel, OutboundMessage::text(to, body)))
}

/// The params of an admin request: an object (absent reads as `{}`) of at
/// most [`MAX_ADMIN_PARAMS_BYTES`].
fn admin_params(method: &str, params: Option<Value>) -> Result<Value, ErrorObject> {
    let params = match params {
        None | Some(Value::Null) => return Ok(json!({})),
        Some(p @ Value::Object(_)) => p,
        Some(other) => {
            return Err(ErrorObject::new(
                codes::INVALID_PARAMS,
                format!(
                    "{method}: params must be an object, got {}",
                    preview(&other)
                ),
            ));
        }
    };
    let size = serde_json::to_vec(&params).map(|v| v.len()).unwrap_or(0);
    if size > MAX_ADMIN_PARAMS_BYTES {
        return Err(ErrorObject::new(
            codes::INVALID_PARAMS,
            format!(
                "{method}: params of {size} bytes refused; admin requests are limited to {MAX_ADMIN_PARAMS_BYTES} bytes"
            ),
        )
        .with_data(json!({"limit": MAX_ADMIN_PARAMS_BYTES, "size": size})));
    }
    Ok(params)
}

impl Handler for MicroappHandler {
    fn request(&self, method: String, params: Option<Value>) -> HandlerFuture {
        if method == "nexo/dispatch"
            && self.capabilities.contains(&Capability::DispatchOutbound)
            && let Some(api) = self.api.clone()
        {
            let plugin = self.plugin.clone();
            return Box::pin(async move {
                let (channel, msg) = dispatch_params(params.as_ref())?;
                match api.dispatch(&plugin, &channel, msg).await {
                    Ok(r) => {
                        Ok(json!({"message_id": r.message_id, "sent_at_unix": r.sent_at_unix}))
                    }
                    Err(e) => Err(channel_error_object(&e)),
                }
            });
        }
        if let Some(cap) = admin_capability(&method)
            && self.capabilities.contains(&cap)
            && let Some(api) = self.api.clone()
        {
            let plugin = self.plugin.clone();
            return Box::pin(async move {
                let params = admin_params(&method, params)?;
                let started = std::time::Instant::now();
                let out = api.microapp_admin(&plugin, &method, params).await;
                tracing::info!(
                    plugin = %plugin,
                    %method,
                    capability = %cap,
                    ok = out.is_ok(),
                    code = out.as_ref().err().map(|e| e.code),
                    ms = started.elapsed().as_millis() as u64,
                    "microapp admin request"
                );
                out
            });
        }
        let err = self.answer(&method, params.as_ref());
        let shown = if method == BAD_ID_METHOD {
            "(bad id)"
        } else {
            method.as_str()
        };
        tracing::debug!(plugin = %self.plugin, method = shown, code = err.code, "outbound request refused");
        Box::pin(async move { Err(err) })
    }

    fn notification(&self, method: String, _params: Option<Value>) {
        tracing::debug!(plugin = %self.plugin, %method, "notification from microapp ignored");
    }
}

/// Envelope and handler.
fn setup(a: SetupArgs<'_>) -> Setup {
    let SetupArgs { spec, services, .. } = a;
    let capabilities = spec
        .microapp
        .as_ref()
        .map(|m| m.capabilities.clone())
        .unwrap_or_default();
    Setup {
        protocol: Arc::new(MicroappRpc),
        handler: Arc::new(MicroappHandler {
            plugin: spec.id.as_str().into(),
            capabilities,
            api: services.api.clone(),
        }),
        cancel: None,
        state: Some(Arc::new(MicroappState::default())),
    }
}

/// Sends `initialize {extension_id, state_dir, config}` (creating the state
/// directory first) and validates the `{tools, version}` reply.
pub async fn handshake(
    peer: &Peer,
    spec: &PluginSpec,
    services: &HostServices,
    state: Option<&plugd_host::dialect::DialectState>,
    timeout: Duration,
) -> Result<Handshake, HandshakeError> {
    let malformed = |reason: String| HandshakeError::Malformed {
        plugin: spec.id.clone(),
        reason,
    };
    let m = micro(spec).map_err(malformed)?;
    let state_dir = services.state_dir(&spec.id);
    std::fs::create_dir_all(&state_dir).map_err(|e| {
        malformed(format!(
            "cannot create its state directory {}: {e}",
            state_dir.display()
        ))
    })?;
    let params = json!({
        "extension_id": m.extension_id,
        "state_dir": state_dir.display().to_string(),
        "config": m.config,
    });
    let reply = peer.call("initialize", Some(params), timeout).await?;
    let Some(obj) = reply.as_object() else {
        return Err(malformed(format!(
            "initialize: expected an object {{tools, version}}, got {}",
            preview(&reply)
        )));
    };
    if let Some(got) = obj.get("extension_id") {
        let got = got.as_str().unwrap_or("");
        if got != m.extension_id {
            return Err(HandshakeError::IdentityMismatch {
                expected: spec.id.clone(),
                got: got.chars().take(64).collect(),
            });
        }
    }
    let server_version = match obj.get("version") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.chars().take(128).collect()),
        Some(v) => {
            return Err(malformed(format!(
                "initialize: \"version\" must be a string, got {}",
                preview(v)
            )));
        }
    };
    let tools = check_tools(spec, m, obj.get("tools"), "initialize")?;
    let hooks = check_hooks(obj.get("hooks")).map_err(malformed)?;
    if let Some(st) = state.and_then(|s| s.downcast_ref::<MicroappState>()) {
        *st.hooks.lock().unwrap_or_else(|p| p.into_inner()) = hooks;
    }
    Ok(Handshake {
        server_version,
        tools,
        warnings: Vec::new(),
    })
}

/// Reads the `hooks` of an `initialize` reply: absent or `null` is none.
fn check_hooks(hooks: Option<&Value>) -> Result<Vec<String>, String> {
    let items = match hooks {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(v) => {
            return Err(format!(
                "initialize: \"hooks\" must be a list of hook names, got {}",
                preview(v)
            ));
        }
    };
    if items.len() > MAX_HOOKS {
        return Err(format!(
            "initialize: \"hooks\" lists {} names; at most {MAX_HOOKS} are accepted",
            items.len()
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let name = match item.as_str() {
            Some(n) if !n.is_empty() && n.chars().count() <= MAX_HOOK_NAME => n,
            _ => {
                return Err(format!(
                    "initialize: hooks[{i}] must be a hook name (1-{MAX_HOOK_NAME} characters), got {}",
                    preview(item)
                ));
            }
        };
        if out.iter().any(|h| h == name) {
            return Err(format!("initialize: hook {name:?} registered twice"));
        }
        out.push(name.to_owned());
    }
    Ok(out)
}

/// Validates an advertised catalog: tool objects, names in the extension's
/// namespace, no duplicates, object (or boolean) schemas.
fn check_tools(
    spec: &PluginSpec,
    m: &MicroappSpec,
    tools: Option<&Value>,
    method: &str,
) -> Result<Vec<ToolDef>, HandshakeError> {
    let malformed = |reason: String| HandshakeError::Malformed {
        plugin: spec.id.clone(),
        reason: format!("{method}: {reason}"),
    };
    let items = match tools {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(v) => {
            return Err(malformed(format!(
                "\"tools\" must be a list, got {}",
                preview(v)
            )));
        }
    };
    let mut out = Vec::with_capacity(items.len());
    let mut seen = std::collections::HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let Some(name) = item.get("name").and_then(Value::as_str) else {
            return Err(malformed(format!(
                "tools[{i}] needs a string \"name\", got {}",
                preview(item)
            )));
        };
        if !tool_in_extension(&m.extension_id, name) {
            return Err(HandshakeError::Namespace {
                plugin: spec.id.clone(),
                tool: name.chars().take(128).collect(),
                rule: format!("microapp tool names must start with \"{}\"", m.tool_prefix),
            });
        }
        let description = match item.get("description") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => {
                return Err(malformed(format!(
                    "tool {name:?}: \"description\" must be a string, got {}",
                    preview(v)
                )));
            }
        };
        let input_schema = match item.get("input_schema") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(v) if v.is_object() || v.is_boolean() => v.clone(),
            Some(v) => {
                return Err(malformed(format!(
                    "tool {name:?}: input_schema must be a JSON Schema object, got {}",
                    preview(v)
                )));
            }
        };
        if !seen.insert(name.to_owned()) {
            return Err(malformed(format!("tool {name:?} advertised twice")));
        }
        out.push(ToolDef::new(name, description, input_schema));
    }
    Ok(out)
}

/// The `binding_context` of a call: `ctx.binding` as the runtime built it
/// (agent turns), else the seed's five keys from what the call has:
/// `agent_id` from `ctx.agent_id`, `account_id` from the tenant scope
/// (`ctx.org_id`), no channel (`channel`, `binding_id` and `binding_index`
/// `null`).
fn binding_context(ctx: &CallContext) -> Value {
    match &ctx.binding {
        Some(b) => b.clone(),
        None => json!({
            "agent_id": ctx.agent_id,
            "channel": null,
            "account_id": ctx.org_id,
            "binding_id": null,
            "binding_index": null,
        }),
    }
}

/// The microapp contract (nexo `extensions.yaml` apps).
#[derive(Debug, Clone, Copy, Default)]
pub struct Microapp;

impl Dialect for Microapp {
    fn name(&self) -> &'static str {
        "microapp"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hooks: Some(HookStyle::Vote),
            unsigned: Some(
                "a microapp is declared by an extensions.yaml entry, which no plugin signature covers",
            ),
            ..Capabilities::default()
        }
    }

    fn setup(&self, a: SetupArgs<'_>) -> Setup {
        setup(a)
    }

    fn handshake<'a>(&'a self, a: HandshakeArgs<'a>) -> HandshakeFuture<'a> {
        Box::pin(handshake(a.peer, a.spec, a.services, a.state, a.timeout))
    }

    /// Re-reads the catalog with `tools/list` (validated like `initialize`'s).
    fn refresh_tools<'a>(
        &'a self,
        conn: &'a Conn,
        spec: &'a PluginSpec,
        timeout: Duration,
    ) -> DialectFuture<'a, Result<Vec<ToolDef>, HandshakeError>> {
        Box::pin(async move {
            let m = micro(spec).map_err(|reason| HandshakeError::Malformed {
                plugin: spec.id.clone(),
                reason,
            })?;
            let reply = conn.peer.call("tools/list", None, timeout).await?;
            let tools = match &reply {
                Value::Array(_) => Some(&reply),
                Value::Object(o) => o.get("tools"),
                other => {
                    return Err(HandshakeError::Malformed {
                        plugin: spec.id.clone(),
                        reason: format!(
                            "tools/list: expected {{\"tools\": [...]}}, got {}",
                            preview(other)
                        ),
                    });
                }
            };
            check_tools(spec, m, tools, "tools/list")
        })
    }

    /// Calls a tool: `tools/call {tool, args, binding_context, inbound}`. Returns
    /// the reply's `output`; `{error}` is a tool-level failure
    /// ([`ToolError::ExecutionFailed`]); JSON-RPC errors stay protocol errors
    /// except the seed's `-32001` (arguments) and `-32002`/`-32003` (unavailable).
    fn call_tool<'a>(&'a self, call: ToolCall<'a>) -> CallFuture<'a> {
        let (conn, spec, tool, args, ctx, timeout) = call.into_parts();
        Box::pin(async move {
            let plugin: Arc<str> = spec.id.as_str().into();
            let mut params = json!({
                "tool": tool.wire(),
                "args": args,
                "binding_context": binding_context(ctx),
            });
            if let Some(inbound) = &ctx.inbound {
                params["inbound"] = inbound.clone();
            }
            let reply = conn
                .peer
                .call_with("tools/call", Some(params), timeout, ctx.progress.clone())
                .await
                .map_err(|e| map_error(&plugin, tool.wire(), e))?;
            let failed = |message: String| ToolError::ExecutionFailed {
                plugin: plugin.clone(),
                tool: tool.name.clone(),
                message,
            };
            let Some(obj) = reply.as_object() else {
                return Err(failed(format!(
                    "malformed tools/call reply: expected {{\"output\": ...}} or {{\"error\": ...}}, got {}",
                    preview(&reply)
                )));
            };
            match (obj.get("error"), obj.get("output")) {
                (Some(e), _) if !e.is_null() => Err(failed(match e {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })),
                (_, Some(output)) => Ok(output.clone()),
                _ => Err(failed(format!(
                    "malformed tools/call reply: expected {{\"output\": ...}} or {{\"error\": ...}}, got {}",
                    preview(&reply)
                ))),
            }
        })
    }

    /// Sends `shutdown` and waits for its reply (at most `reply_timeout`), then
    /// SIGTERMs the process group as the seed says; the supervisor SIGKILLs it
    /// after `shutdown_grace` if it is still there.
    fn shutdown<'a>(&'a self, conn: &'a Conn, reply_timeout: Duration) -> DialectFuture<'a, ()> {
        Box::pin(async move {
            let res = conn
                .peer
                .call("shutdown", Some(json!({})), reply_timeout)
                .await;
            if let Err(e) = &res {
                tracing::debug!(plugin = %conn.peer.plugin(), "shutdown: {e}");
            }
            if conn.peer.closed_reason().is_none() {
                conn.process.terminate_group();
            }
        })
    }
}

/// Maps a `tools/call` error reply: the seed's reserved codes that mean
/// "your arguments" or "try later" become typed errors, the rest stay
/// [`ToolError::Call`].
fn map_error(plugin: &Arc<str>, tool: &str, err: CallError) -> ToolError {
    let CallError::Remote { error, .. } = &err else {
        return ToolError::Call(err);
    };
    let (plugin, tool) = (plugin.clone(), tool.to_owned());
    let message = error.message.clone();
    match error.code {
        INPUT_INVALID => ToolError::ArgumentInvalid {
            plugin,
            tool,
            message,
            details: error.data.clone(),
        },
        BACKEND_UNAVAILABLE | RATE_LIMITED => ToolError::Unavailable {
            plugin,
            tool,
            message,
            retry_after_ms: error
                .data
                .as_ref()
                .and_then(|d| d.get("retry_after_ms"))
                .and_then(Value::as_u64),
        },
        _ => ToolError::Call(err),
    }
}

/// A microapp's vote on a hook (seed: "Hook decision").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Vote {
    /// Proceed.
    Allow,
    /// Stop.
    Deny,
    /// No opinion (the default).
    #[default]
    Abstain,
}

/// The reply to `hooks/<name>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct HookVote {
    /// The vote; `abstain` when the reply has none.
    #[serde(default)]
    pub vote: Vote,
    /// Why, when the microapp says.
    #[serde(default)]
    pub reason: Option<String>,
    /// Structured detail, when the microapp sends some.
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// Asks a microapp about hook `name` (`hooks/<name>` with `event` as params).
/// `-32601` (the microapp does not know the hook) is an abstention; an
/// unknown vote or a reply that is not a hook decision is
/// [`ToolError::ExecutionFailed`]; other failures are [`ToolError::Call`].
pub async fn call_hook(
    conn: &Conn,
    name: &str,
    event: Value,
    timeout: Duration,
) -> Result<HookVote, ToolError> {
    let method = format!("hooks/{name}");
    let plugin = conn.peer.plugin().clone();
    let reply = match conn.peer.call(&method, Some(event), timeout).await {
        Ok(r) => r,
        Err(CallError::Remote { error, .. }) if error.code == codes::METHOD_NOT_FOUND => {
            return Ok(HookVote::default());
        }
        Err(e) => return Err(ToolError::Call(e)),
    };
    if !reply.is_object() {
        return Err(ToolError::ExecutionFailed {
            plugin,
            tool: method,
            message: format!(
                "malformed hook decision: expected {{\"vote\": \"allow|deny|abstain\", ...}}, got {}",
                preview(&reply)
            ),
        });
    }
    serde_json::from_value::<HookVote>(reply.clone()).map_err(|e| ToolError::ExecutionFailed {
        plugin,
        tool: method,
        message: format!(
            "malformed hook decision ({e}): expected {{\"vote\": \"allow|deny|abstain\", \"reason\": ..., \"metadata\": ...}}, got {}",
            preview(&reply)
        ),
    })
}

/// The capability a host-to-microapp notification needs: `Ok(None)` for
/// `agents/updated` (every microapp), `Err` for methods that are not
/// microapp notifications.
pub fn notification_capability(method: &str) -> Result<Option<Capability>, String> {
    match method {
        "agents/updated" => Ok(None),
        "nexo/notify/transcript_appended" | "nexo/notify/agent_event" => {
            Ok(Some(Capability::TranscriptsSubscribe))
        }
        "nexo/notify/pairing_status_changed" => Ok(Some(Capability::PairingInitiate)),
        "nexo/notify/token_rotated" => Ok(Some(Capability::CredentialsCrud)),
        other => Err(format!(
            "{other:?} is not a microapp notification (known: agents/updated, nexo/notify/transcript_appended, nexo/notify/pairing_status_changed, nexo/notify/token_rotated, nexo/notify/agent_event)"
        )),
    }
}

/// Sends a notification to a running microapp if its entry may receive it
/// (see [`notification_capability`]). `Ok(false)` when the queue to the
/// microapp was full and the notification was shed; `Err` says why it may not
/// be sent.
pub fn notify(conn: &Conn, method: &str, params: Value) -> Result<bool, String> {
    let m = micro(&conn.spec)?;
    if let Some(cap) = notification_capability(method)?
        && !m.has(cap)
    {
        return Err(format!(
            "microapp {:?} may not receive {method}: capability \"{cap}\" not granted in extensions.yaml",
            conn.spec.id
        ));
    }
    Ok(conn.peer.notify(method, Some(params)))
}

/// At most 200 characters of a JSON value, for error messages.
fn preview(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_families_map_to_capabilities() {
        for (m, cap) in [
            ("nexo/admin/agents_list", Some(Capability::AgentsCrud)),
            ("nexo/admin/agents/create", Some(Capability::AgentsCrud)),
            (
                "nexo/admin/credentials_set",
                Some(Capability::CredentialsCrud),
            ),
            (
                "nexo/admin/pairing_start",
                Some(Capability::PairingInitiate),
            ),
            ("nexo/admin/llm_keys_rotate", Some(Capability::LlmKeysCrud)),
            ("nexo/admin/channels.list", Some(Capability::ChannelsCrud)),
            (
                "nexo/admin/transcripts_read",
                Some(Capability::TranscriptsSubscribe),
            ),
            (
                "nexo/admin/llm_providers/list",
                Some(Capability::LlmKeysCrud),
            ),
            ("nexo/admin/reload", Some(Capability::AgentsCrud)),
            ("nexo/admin/reloadx", None),
            ("nexo/admin/agentsx", None),
            ("nexo/admin/agents", None),
            ("nexo/admin/llm_list", None),
            ("nexo/dispatch", None),
        ] {
            assert_eq!(admin_capability(m), cap, "{m}");
        }
    }

    #[test]
    fn registered_hooks_are_checked() {
        assert_eq!(check_hooks(None).unwrap(), Vec::<String>::new());
        assert_eq!(
            check_hooks(Some(&json!(["before_message", "custom"]))).unwrap(),
            ["before_message", "custom"]
        );
        for (bad, why) in [
            (json!("before_message"), "must be a list"),
            (json!([1]), "hooks[0] must be a hook name"),
            (json!([""]), "hooks[0] must be a hook name"),
            (json!(["x".repeat(129)]), "hooks[0] must be a hook name"),
            (json!(["a", "a"]), "registered twice"),
            (json!(vec!["h"; 65]), "at most 64"),
        ] {
            let err = check_hooks(Some(&bad)).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn admin_params_must_be_a_small_object() {
        assert_eq!(admin_params("m", None).unwrap(), json!({}));
        assert_eq!(admin_params("m", Some(Value::Null)).unwrap(), json!({}));
        assert_eq!(
            admin_params("m", Some(json!({"id": "ana"}))).unwrap(),
            json!({"id": "ana"})
        );
        let e = admin_params("m", Some(json!([1]))).unwrap_err();
        assert_eq!(e.code, codes::INVALID_PARAMS);
        assert!(e.message.contains("params must be an object"), "{e:?}");
        let big = json!({"x": "a".repeat(MAX_ADMIN_PARAMS_BYTES)});
        let e = admin_params("m", Some(big)).unwrap_err();
        assert_eq!(e.code, codes::INVALID_PARAMS);
        assert!(e.message.contains("limited to 65536 bytes"), "{e:?}");
    }

    #[test]
    fn requests_without_app_ids_are_marked() {
        let p = MicroappRpc;
        let got = p
            .decode(br#"{"jsonrpc":"2.0","id":7,"method":"nexo/dispatch","params":{}}"#)
            .unwrap();
        assert!(
            matches!(&got, Incoming::Request { method, .. } if method == BAD_ID_METHOD),
            "{got:?}"
        );
        let got = p
            .decode(br#"{"jsonrpc":"2.0","id":"app:1","method":"nexo/dispatch"}"#)
            .unwrap();
        assert!(matches!(&got, Incoming::Request { method, .. } if method == "nexo/dispatch"));
    }

    #[test]
    fn hook_votes_parse() {
        let v: HookVote =
            serde_json::from_value(json!({"vote":"deny","reason":"r","metadata":{"a":1}})).unwrap();
        assert_eq!(v.vote, Vote::Deny);
        let v: HookVote = serde_json::from_value(json!({})).unwrap();
        assert_eq!(v.vote, Vote::Abstain);
        assert!(serde_json::from_value::<HookVote>(json!({"vote":"maybe"})).is_err());
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::test_json::jsonrpc_frame;
    use proptest::prelude::*;

    const KEYS: &[&str] = &["method", "app_id", "message", "vote", "decision"];
    const STRINGS: &[&str] = &[
        "agents.list",
        "dispatch.outbound",
        "app:1",
        "1",
        "log",
        "hook.vote",
    ];

    fn frame() -> BoxedStrategy<Value> {
        jsonrpc_frame(STRINGS, KEYS, STRINGS)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn decode_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = MicroappRpc.decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_notifications(v in frame()) {
            let _ = MicroappRpc.decode(v.to_string().as_bytes());
        }
    }
}
