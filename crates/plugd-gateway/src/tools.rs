//! `tools/list` and `tools/call` of the gateway: which tools a session sees,
//! how a plugd tool looks as an MCP `Tool`, and one call through the
//! runtime's governed path (hooks, risk gate, plugin, record), back as a
//! `CallToolResult`.
//!
//! A workspace identity's session serves the workspace's tools; an org
//! identity's ([`crate::OrgScope`]) serves the tool exports bound to its
//! scope instead, each under its export id, through
//! [`plugd_runtime::Runtime::call_export_governed`] (the resolution of
//! `/v1/plugin-tools/{export}:invoke`, on the same governed path). The
//! binding a session's export first resolved to is kept in the session
//! (`pins`) and taken again while it still applies, so one session stays
//! on one rollout choice. Under a `discovery: search` profile
//! `tools/list` holds `search_tools` ([`crate::search`]) and what the
//! session's searches found; every tool the session may see is callable
//! whether it was found or not.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use plugd_host::dialect::{CallContext, ClientHandle, ClientLink};
use plugd_mcp::names::{NameTable, mcp_name, registry_name_hint};
use plugd_mcp::version::at_least;
use plugd_runtime::bindings_rt::{ExportCall, ScopedExport};
use plugd_runtime::governed::{Governed, Surface};
use plugd_runtime::hooks::{HookContext, HookPoint};
use plugd_runtime::mcp_config::Discovery;
use plugd_runtime::risk::{GateError, RiskLevel, effective_risk};
use plugd_runtime::tool_policy::PolicyCaller;
use plugd_runtime::{RuntimeError, ToolEntry};
use plugd_wire::ErrorObject;
use serde_json::{Map, Value, json};

use crate::approve::ElicitApprover;
use crate::session::{RequestCx, Session, code, error, lock};
use crate::{OrgScope, search};

/// How long a call waits for its last progress notifications to go out.
const PROGRESS_DRAIN: Duration = Duration::from_millis(200);

/// The enabled tools `session` may see, sorted by plugd name.
fn visible(session: &Session) -> Vec<Arc<ToolEntry>> {
    // plugd.yaml's `policy:` hides what a deny rule keeps from the caller
    // (with the org its calls carry: plugd.yaml's `tenant:`).
    let caller = plugd_runtime::tool_policy::PolicyCaller {
        org: session
            .inner
            .gw
            .inner
            .config
            .tenant
            .tenant_id
            .clone()
            .unwrap_or_default(),
        groups: session.caller().groups.clone(),
        // The role its calls carry (`caller_role`), so a rule on
        // `caller.role` hides at list time what it refuses at call time.
        role: session.caller().role.clone().unwrap_or_default(),
        ..plugd_runtime::tool_policy::PolicyCaller::named(&session.caller().name)
    };
    let all = session.inner.gw.runtime().tools_for(&caller);
    match &session.inner.profile {
        None => all,
        Some((_, m)) => all
            .into_iter()
            .filter(|t| m.matches(&t.plugin, &t.name))
            .collect(),
    }
}

/// The names of what `session` sees, for change detection.
pub(crate) async fn visible_names(session: &Session) -> Vec<String> {
    served(session).await.into_iter().map(|(n, _)| n).collect()
}

/// One tool a session serves: a workspace tool, or (an org identity's
/// session) an export bound to its scope.
#[derive(Clone)]
pub(crate) enum Served {
    /// A tool of the workspace's registry.
    Tool(Arc<ToolEntry>),
    /// A tool export bound to the session's org.
    Export(Box<ScopedExport>),
}

impl Served {
    /// The tool entry.
    pub(crate) fn entry(&self) -> &Arc<ToolEntry> {
        match self {
            Served::Tool(t) => t,
            Served::Export(x) => &x.entry,
        }
    }
}

/// Whether `session`'s profile finds its tools by search.
pub(crate) fn searching(session: &Session) -> bool {
    session
        .inner
        .profile
        .as_ref()
        .is_some_and(|(_, m)| m.discovery == Discovery::Search)
}

/// The scope and session of an org identity's calls through bindings
/// (the session id is the rollout key and `context.session_id`).
fn export_call(session: &Session, org: &OrgScope, trace_id: Option<String>) -> ExportCall {
    ExportCall {
        org_id: org.org_id.clone(),
        project_id: org.project().map(str::to_owned),
        session_id: Some(format!("mcp-{}", session.id())),
        caller: Some(session.caller().name.clone()),
        trace_id,
    }
}

/// Every tool `session` serves with its MCP name: the workspace's tools,
/// or an org identity's bound exports.
pub(crate) async fn served(session: &Session) -> Vec<(String, Served)> {
    match &session.caller().org {
        None => served_tools(session)
            .into_iter()
            .map(|(n, t)| (n, Served::Tool(t)))
            .collect(),
        Some(org) => served_exports(session, org).await,
    }
}

/// The exports bound to `org`'s scope that `session` serves, under their
/// export ids (made MCP names by [`mcp_name`], so one naming holds
/// everywhere), the bindings they resolved to kept as the session's pins.
async fn served_exports(session: &Session, org: &OrgScope) -> Vec<(String, Served)> {
    let rt = session.inner.gw.runtime();
    let call = export_call(session, org, None);
    let caller = PolicyCaller {
        org: org.org_id.clone(),
        project: org.project().unwrap_or_default().to_owned(),
        role: session.caller().role.clone().unwrap_or_default(),
        ..PolicyCaller::named(&session.caller().name)
    };
    let pins = lock(&session.inner.pins).clone();
    let exports = match rt.scoped_exports(&call, &pins, &caller).await {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(session = %session.id(), org = %org.org_id, error = %e, "cannot list the exports bound to the session's org; it lists none");
            return Vec::new();
        }
    };
    {
        let mut pins = lock(&session.inner.pins);
        for x in &exports {
            let old = pins.insert(x.export_id.clone(), x.binding.binding_id.clone());
            if old.as_ref() != Some(&x.binding.binding_id) {
                session.inner.changed.store(true, Ordering::Relaxed);
            }
        }
    }
    let exports: Vec<ScopedExport> = match &session.inner.profile {
        None => exports,
        Some((_, m)) => exports
            .into_iter()
            .filter(|x| m.matches(&x.binding.package_id, &x.export_id))
            .collect(),
    };
    let table = NameTable::new(exports.iter().map(|x| x.export_id.as_str()));
    exports
        .into_iter()
        .filter(|x| table.serves(&x.export_id))
        .map(|x| (mcp_name(&x.export_id), Served::Export(Box::new(x))))
        .collect()
}

/// Whether `session`'s profile serves tools under their plugins' own names.
fn bare(session: &Session) -> bool {
    session
        .inner
        .profile
        .as_ref()
        .is_some_and(|(_, m)| m.bare_names)
}

/// The name a tool is keyed by before the MCP mapping: plugd's, or in a
/// bare-names profile the one its plugin gave it.
fn key(entry: &ToolEntry, bare: bool) -> &str {
    if bare {
        entry.def.wire_name.as_deref().unwrap_or(&entry.name)
    } else {
        &entry.name
    }
}

/// Every workspace tool `session` serves with its MCP name (collisions
/// withheld).
fn served_tools(session: &Session) -> Vec<(String, Arc<ToolEntry>)> {
    let tools = visible(session);
    let bare = bare(session);
    let table = NameTable::new(tools.iter().map(|t| key(t, bare)));
    for (a, b) in table.collisions() {
        tracing::warn!(first = %a, second = %b, "two tools meet on one MCP name; both are withheld from MCP clients");
    }
    tools
        .into_iter()
        .filter(|t| table.serves(key(t, bare)))
        .map(|t| (mcp_name(key(&t, bare)), t))
        .collect()
}

/// `tools/list`: every tool served, one page; under a `discovery: search`
/// profile `search_tools` and the tools this session's searches found.
pub(crate) async fn list(session: &Session, cx: &RequestCx) -> Result<Value, Value> {
    let rt = session.inner.gw.runtime();
    let policy = rt
        .risk_config()
        .map_err(|e| error(code::INTERNAL, e.to_string()))?;
    let mut served = served(session).await;
    let mut out = Vec::new();
    if searching(session) {
        out.push(search::tool_json());
        let loaded = lock(&session.inner.loaded).clone();
        served.retain(|(name, _)| name != search::SEARCH_TOOL && loaded.contains(name));
    }
    out.extend(served.iter().map(|(name, s)| {
        let t = s.entry();
        let (risk, _) = effective_risk(t, &policy);
        let vai = vai_annotations(rt, t);
        tool_json(name, t, risk, vai, cx.version)
    }));
    Ok(json!({"tools": out}))
}

/// `search_tools` of a `discovery: search` session: the tools it may see
/// that match `args.query`, best first, which join its list
/// (`notifications/tools/list_changed` when any is new).
async fn search_call(session: &Session, args: &Value, cx: &RequestCx) -> Value {
    let request = match search::Request::parse(args) {
        Ok(r) => r,
        Err(message) => return tool_error(message),
    };
    let served = served(session).await;
    let pool: Vec<&(String, Served)> = served
        .iter()
        .filter(|(name, _)| name != search::SEARCH_TOOL)
        .collect();
    let candidates: Vec<(&str, &str)> = pool
        .iter()
        .map(|(name, s)| (name.as_str(), s.entry().description.as_str()))
        .collect();
    let found = search::rank(&request, &candidates);
    let tools: Vec<Value> = found
        .iter()
        .filter_map(|&i| pool.get(i))
        .map(|(name, s)| {
            json!({
                "name": name,
                "description": s.entry().description,
                "inputSchema": object_schema(&s.entry().input_schema),
            })
        })
        .collect();
    let new = {
        let mut loaded = lock(&session.inner.loaded);
        let mut new = false;
        for (name, _) in found.iter().filter_map(|&i| candidates.get(i)) {
            if loaded.len() >= crate::session::MAX_SESSION_TOOLS {
                break;
            }
            new |= loaded.insert((*name).to_owned());
        }
        new
    };
    if new {
        session.inner.changed.store(true, Ordering::Relaxed);
        session.tools_changed(cx.sink.as_ref());
    }
    let structured = json!({"tools": tools, "query": request.query});
    json!({
        "content": [{"type": "text", "text": structured.to_string()}],
        "structuredContent": structured,
        "isError": false,
    })
}

/// The MCP annotations a VAI tool export's `effect_class` and
/// `permissions.network` imply (`None`: not a VAI tool):
///
/// | VAI | MCP annotations |
/// |---|---|
/// | `effect_class = "read_only"` | `readOnlyHint: true`, `destructiveHint: false`, `idempotentHint: true` |
/// | `effect_class = "idempotent_write"` | `readOnlyHint: false`, `idempotentHint: true` |
/// | `effect_class = "non_idempotent_write"` | `readOnlyHint: false`, `idempotentHint: false` |
/// | `effect_class = "unknown"` or unset | none (MCP's defaults) |
/// | `permissions.network = "egress"` / `"none"` | `openWorldHint: true` / `false` |
///
/// A write is not called destructive or not: VAI does not say, so the
/// client assumes MCP's default (destructive).
fn vai_annotations(rt: &plugd_runtime::Runtime, t: &ToolEntry) -> Option<Map<String, Value>> {
    use plugd_manifest::vai::{EffectClass, NetworkPermission};
    let sup = rt.supervised(&t.plugin).ok()?;
    let export = sup
        .spec()
        .vai
        .as_ref()?
        .exports
        .iter()
        .find(|e| e.id == t.def.wire())?;
    let tool = export.tool.as_ref()?;
    let mut ann = Map::new();
    let mut hint = |k: &str, v: bool| {
        ann.insert(k.into(), json!(v));
    };
    match tool.effect_class {
        EffectClass::ReadOnly => {
            hint("readOnlyHint", true);
            hint("destructiveHint", false);
            hint("idempotentHint", true);
        }
        EffectClass::IdempotentWrite => {
            hint("readOnlyHint", false);
            hint("idempotentHint", true);
        }
        EffectClass::NonIdempotentWrite => {
            hint("readOnlyHint", false);
            hint("idempotentHint", false);
        }
        EffectClass::Unknown => {}
    }
    hint(
        "openWorldHint",
        export.permissions.network == NetworkPermission::Egress,
    );
    Some(ann)
}

/// Whether `schema` may be an MCP `outputSchema` (an object schema: MCP
/// clients reject a tool list holding another kind).
fn object_output_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}

/// One plugd tool as an MCP `Tool` for a client at `version`; `vai`: the
/// annotations its VAI export implies.
fn tool_json(
    name: &str,
    t: &ToolEntry,
    risk: RiskLevel,
    vai: Option<Map<String, Value>>,
    version: &str,
) -> Value {
    let mut tool = Map::new();
    tool.insert("name".into(), json!(name));
    tool.insert("description".into(), json!(t.description));
    tool.insert("inputSchema".into(), object_schema(&t.input_schema));
    let meta = t.meta.as_deref();
    if at_least(version, "2025-06-18") {
        if let Some(title) = meta.and_then(|m| m.title.as_ref()) {
            tool.insert("title".into(), json!(title));
        }
        if let Some(out) = meta.and_then(|m| m.output_schema.as_ref())
            && object_output_schema(out)
        {
            tool.insert("outputSchema".into(), out.clone());
        }
        tool.insert(
            "_meta".into(),
            json!({"plugd/tool": t.name, "plugd/plugin": t.plugin, "plugd/risk": risk}),
        );
    }
    if at_least(version, "2025-11-25")
        && let Some(icons) = meta.and_then(|m| m.icons.as_ref())
    {
        tool.insert("icons".into(), json!(icons));
    }
    if at_least(version, "2025-03-26") {
        let mut ann = meta.and_then(|m| m.annotations.clone()).unwrap_or_default();
        for (k, v) in vai.into_iter().flatten() {
            ann.entry(k).or_insert(v);
        }
        if matches!(risk, RiskLevel::High | RiskLevel::Critical) {
            // What plugd will gate is destructive as far as a client knows.
            ann.entry("destructiveHint").or_insert(json!(true));
            ann.insert("readOnlyHint".into(), json!(false));
        }
        if !ann.is_empty() {
            tool.insert("annotations".into(), Value::Object(ann));
        }
    }
    Value::Object(tool)
}

/// MCP wants an object schema; plugins may give `{}` or `true`.
fn object_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(o) if o.contains_key("type") => schema.clone(),
        Value::Object(o) => {
            let mut o = o.clone();
            o.insert("type".into(), json!("object"));
            Value::Object(o)
        }
        _ => json!({"type": "object"}),
    }
}

/// What MCP name `name` stands for, if `session` may see it.
async fn resolve(session: &Session, name: &str) -> Option<Served> {
    if session.caller().org.is_none() {
        return resolve_tool(session, name).map(Served::Tool);
    }
    served(session)
        .await
        .into_iter()
        .find_map(|(m, s)| (m == name).then_some(s))
}

/// The workspace tool behind MCP name `name`, if `session` may see it.
fn resolve_tool(session: &Session, name: &str) -> Option<Arc<ToolEntry>> {
    let rt = session.inner.gw.runtime();
    let hint = if bare(session) {
        None
    } else {
        registry_name_hint(name)
    };
    let entry = match hint {
        Some(candidate) => rt.tool(&candidate).filter(|t| mcp_name(&t.name) == name)?,
        None => served_tools(session)
            .into_iter()
            .find_map(|(m, t)| (m == name).then_some(t))?,
    };
    match &session.inner.profile {
        Some((_, m)) if !m.matches(&entry.plugin, &entry.name) => None,
        _ => Some(entry),
    }
}

fn unknown_tool(name: &str) -> Value {
    json!({"code": code::INVALID_PARAMS, "message": format!("Unknown tool: {name}")})
}

/// A call over a `limits:` rule: JSON-RPC `-32029` with the wait in
/// whole seconds, rounded up (as HTTP's `Retry-After`).
fn rate_limited(e: &RuntimeError) -> Value {
    let RuntimeError::RateLimited {
        rule,
        retry_after_ms,
    } = e
    else {
        return error(code::INTERNAL, e.to_string());
    };
    json!({
        "code": code::RATE_LIMITED,
        "message": e.to_string(),
        "data": {
            "retryAfterSeconds": retry_after_ms.div_ceil(1000).max(1),
            "retryAfterMs": retry_after_ms,
            "rule": rule,
        },
    })
}

/// A tool failure the model can read: `isError: true` with the text.
fn tool_error(message: String) -> Value {
    json!({"content": [{"type": "text", "text": message}], "isError": true})
}

/// `tools/call`.
pub(crate) async fn call(
    session: &Session,
    params: &Value,
    cx: &RequestCx,
) -> Result<Value, Value> {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err(error(code::INVALID_PARAMS, "tools/call needs a \"name\""));
    };
    let args = match params.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(other) => {
            return Err(error(
                code::INVALID_PARAMS,
                format!("\"arguments\" must be an object, got {other}"),
            ));
        }
    };
    if searching(session) && name == search::SEARCH_TOOL {
        return Ok(search_call(session, &args, cx).await);
    }
    let Some(target) = resolve(session, name).await else {
        return Err(unknown_tool(name));
    };
    let entry = target.entry().clone();
    let gw = &session.inner.gw.inner;
    let rt = &gw.runtime;
    let started = Instant::now();
    let hook_cx = gw.config.context(&HookContext {
        session_id: Some(format!("mcp-{}", session.id())),
        tenant_id: session.caller().org.as_ref().map(|o| o.org_id.clone()),
        ..HookContext::default()
    });
    // The caller's W3C trace (`_meta.traceparent`), kept in the record and
    // passed to the plugin.
    let trace = params
        .get("_meta")
        .and_then(|m| m.get("traceparent"))
        .and_then(Value::as_str)
        .and_then(plugd_telemetry::trace_id_of)
        .or_else(|| hook_cx.trace_id.clone());

    // Progress: the plugin's events as MCP progress on this request.
    let token = params
        .get("_meta")
        .and_then(|m| m.get("progressToken"))
        .filter(|t| t.is_string() || t.is_number())
        .cloned();
    let (progress, forwarder) = match (&token, &cx.sink) {
        (Some(token), Some(sink)) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (
                Some(tx),
                Some(tokio::spawn(forward_progress(
                    rx,
                    token.clone(),
                    sink.clone(),
                ))),
            )
        }
        _ => (None, None),
    };
    let client = cx.sink.clone().map(|sink| {
        ClientHandle(Arc::new(GatewayLink {
            session: session.clone(),
            sink,
            capabilities: cx.capabilities.clone(),
            stateless: cx.version == plugd_mcp::STATELESS,
            // 2026-07-28: log messages only for a request that set a level.
            logs: cx.version != plugd_mcp::STATELESS
                || params
                    .get("_meta")
                    .is_some_and(|m| m.get("io.modelcontextprotocol/logLevel").is_some()),
            timeout: rt
                .risk_config()
                .map(|p| p.approval_timeout)
                .unwrap_or(Duration::from_secs(120)),
        }))
    });
    // A 2026-07-28 client answers a server's input_required itself: its
    // answers and its capabilities go to the server with the call.
    let rounds = (cx.version == plugd_mcp::STATELESS).then(|| {
        let mut r = crate::hosted::round_params(params).unwrap_or_default();
        r.insert(
            "_meta".into(),
            json!({(plugd_mcp::META_CLIENT_CAPABILITIES): cx.capabilities}),
        );
        r
    });
    let ctx = CallContext {
        session_id: hook_cx.session_id.clone(),
        agent_id: hook_cx.agent_id.clone(),
        org_id: hook_cx.tenant_id.clone(),
        trace_id: trace,
        progress,
        client,
        caller: Some(session.caller().name.clone()),
        caller_role: session.caller().role.clone(),
        caller_groups: session.caller().groups.clone(),
        rounds,
        user: session.user(),
        ..CallContext::default()
    };

    let approver = approver_for(session, &entry, cx);
    // The runtime's governed path runs plugd.yaml's tool hooks; a hook's
    // refusal is a tool error the model reads.
    let gov = Governed {
        approver: approver.as_ref().map(|a| a as _),
        hook_context: Some(&hook_cx),
        ..Governed::new(Surface::Mcp)
    };
    let outcome = match (&target, &session.caller().org) {
        (Served::Export(x), Some(org)) => {
            let call = export_call(session, org, ctx.trace_id.clone());
            let pin = lock(&session.inner.pins).get(&x.export_id).cloned();
            let done = rt
                .call_export_governed(&x.export_id, args, &call, ctx, &gov, pin.as_deref())
                .await;
            if let Some(b) = done.binding_id {
                let old = lock(&session.inner.pins).insert(x.export_id.clone(), b.clone());
                if old != Some(b) {
                    session.inner.changed.store(true, Ordering::Relaxed);
                }
            }
            done.called.outcome
        }
        _ => {
            let out = rt
                .call_tool_governed(&entry.name, args, &ctx, &gov)
                .await
                .outcome;
            drop(ctx);
            out
        }
    };
    if let Some(mut f) = forwarder
        && tokio::time::timeout(PROGRESS_DRAIN, &mut f).await.is_err()
    {
        tracing::warn!(tool = %entry.name, "progress forwarding did not end within {PROGRESS_DRAIN:?} of the call; stopped");
        f.abort();
    }

    let (ok, result, how) = match outcome {
        Ok(value) => (true, as_call_result(rt, &entry, value), "ok"),
        Err(RuntimeError::UnknownTool(_))
        | Err(RuntimeError::UnknownExport { .. })
        | Err(RuntimeError::Gate(GateError::Disabled { .. })) => {
            log_call(session, &entry, false, started, "unknown or disabled");
            return Err(unknown_tool(name));
        }
        Err(e @ RuntimeError::RateLimited { .. }) => {
            log_call(session, &entry, false, started, "rate limited");
            return Err(rate_limited(&e));
        }
        Err(RuntimeError::BlockedByHook { point, message, .. }) => {
            let how = match point {
                HookPoint::AfterToolResult => "blocked by after_tool_result",
                _ => "blocked by before_tool_call",
            };
            (false, tool_error(message), how)
        }
        Err(e) => match crate::hosted::rpc_error(&e) {
            // The hosted server's own error reply, code and data kept.
            Some(remote) => {
                log_call(session, &entry, false, started, "error reply");
                return Err(remote);
            }
            None => (false, tool_error(e.to_string()), "failed"),
        },
    };
    log_call(session, &entry, ok, started, how);
    Ok(result)
}

/// The gateway's client as the plugin's dialect sees it: a hosted MCP
/// server's `elicitation/create` and `sampling/createMessage` during the
/// call are asked of this client (when it declared the capability), and
/// its `notifications/message` reach it on the call's stream.
struct GatewayLink {
    session: Session,
    sink: crate::Sink,
    capabilities: Value,
    stateless: bool,
    logs: bool,
    timeout: Duration,
}

impl ClientLink for GatewayLink {
    fn accepts(&self, method: &str) -> bool {
        let cap = match method {
            "elicitation/create" => "elicitation",
            "sampling/createMessage" => "sampling",
            _ => return false,
        };
        !self.stateless && self.capabilities.get(cap).is_some_and(Value::is_object)
    }

    fn request(
        &self,
        method: String,
        params: Value,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Value, ErrorObject>> + Send>>
    {
        let (session, sink, timeout) = (self.session.clone(), self.sink.clone(), self.timeout);
        Box::pin(async move {
            session
                .ask_client(&sink, &method, params, timeout)
                .await
                .map_err(|reason| ErrorObject::new(code::INTERNAL, reason))
        })
    }

    fn notify(&self, method: &str, params: Value) {
        if method == "notifications/message" && !self.logs {
            return;
        }
        let _ = self
            .sink
            .send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }
}

/// Whether a `tools/call` may send the client something before its answer
/// (so HTTP answers it as a stream): a progress token, a client that can be
/// asked things, or a tool of a hosted MCP server (which may log).
pub(crate) fn may_stream(session: &Session, params: &Value) -> bool {
    let progress = params
        .get("_meta")
        .and_then(|m| m.get("progressToken"))
        .is_some();
    if progress || session.can_elicit() || session.can_sample() {
        return true;
    }
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return false;
    };
    if session.caller().org.is_some() {
        // Bound exports are packages (VAI, native), never hosted MCP
        // servers: nothing of theirs precedes the answer.
        return false;
    }
    resolve_tool(session, name).is_some_and(|t| {
        session
            .inner
            .gw
            .runtime()
            .supervised(&t.plugin)
            .is_ok_and(|s| {
                plugd_dialects::of(s.spec().dialect)
                    .capabilities()
                    .mcp_results
            })
    })
}

/// The approver of a gated call: the client's user through elicitation when
/// the client can be asked and may decide this level; `None` (the
/// runtime's own: a pending approval under serve) otherwise.
fn approver_for(session: &Session, entry: &ToolEntry, cx: &RequestCx) -> Option<ElicitApprover> {
    let rt = session.inner.gw.runtime();
    let policy = rt.risk_config().ok()?;
    let (risk, _) = effective_risk(entry, &policy);
    let may = match risk {
        RiskLevel::Low | RiskLevel::Medium => false,
        RiskLevel::High => true,
        RiskLevel::Critical => session.caller().may_approve_critical,
    };
    if !(may && cx.can_elicit()) {
        return None;
    }
    Some(ElicitApprover {
        session: session.clone(),
        sink: cx.sink.clone()?,
        timeout: policy.approval_timeout,
        version: cx.version,
    })
}

/// A plugin's result as a `CallToolResult`: an MCP server's result as it
/// sent it; any other dialect's value as text, and as `structuredContent`
/// when it is an object.
fn as_call_result(rt: &plugd_runtime::Runtime, entry: &ToolEntry, value: Value) -> Value {
    let from_mcp = rt.supervised(&entry.plugin).is_ok_and(|s| {
        plugd_dialects::of(s.spec().dialect)
            .capabilities()
            .mcp_results
    });
    if from_mcp
        && (value.get("content").is_some_and(Value::is_array)
            || crate::hosted::is_input_required(&value))
    {
        return value;
    }
    as_result_shape(value)
}

fn as_result_shape(mut value: Value) -> Value {
    let is_content = |v: &Value| {
        v.as_array().is_some_and(|items| {
            items
                .iter()
                .all(|i| i.get("type").is_some_and(Value::is_string))
        })
    };
    if value.get("content").is_some_and(is_content) {
        // Already content (nexo SDKs answer this shape); their snake_case
        // error flag becomes MCP's.
        if let Some(obj) = value.as_object_mut() {
            if let Some(flag) = obj.remove("is_error") {
                obj.entry("isError").or_insert(flag);
            }
            // VAI's structured output is MCP's structured content.
            if let Some(out) = obj.remove("structured_output").filter(Value::is_object) {
                obj.entry("structuredContent").or_insert(out);
            }
        }
        return value;
    }
    // A VAI result with structured output but no content: the output, as
    // text and as structured content.
    if let Some(out) = value
        .get("structured_output")
        .filter(|o| o.is_object())
        .cloned()
    {
        let is_error = value
            .get("is_error")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        return json!({
            "content": [{"type": "text", "text": out.to_string()}],
            "structuredContent": out,
            "isError": is_error,
        });
    }
    let text = match &value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = json!({"content": [{"type": "text", "text": text}]});
    if value.is_object() {
        out["structuredContent"] = value;
    }
    out
}

/// Forwards a plugin's progress events as `notifications/progress` with
/// strictly increasing `progress` (MCP requires it).
async fn forward_progress(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Value>,
    token: Value,
    sink: crate::Sink,
) {
    let mut last = 0.0f64;
    while let Some(event) = rx.recv().await {
        let given = event.get("progress").and_then(Value::as_f64);
        let progress = match given {
            Some(p) if p > last => p,
            _ => last + 1.0,
        };
        last = progress;
        let mut params = json!({"progressToken": token, "progress": progress});
        if let Some(total) = event.get("total").and_then(Value::as_f64) {
            params["total"] = json!(total);
        }
        let message = match &event {
            Value::String(s) => Some(s.clone()),
            e => ["message", "text", "status", "stage"]
                .iter()
                .find_map(|k| e.get(*k).and_then(Value::as_str).map(str::to_owned)),
        };
        if let Some(m) = message {
            params["message"] = json!(m.chars().take(1024).collect::<String>());
        }
        let msg = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": params});
        if sink.send(msg).is_err() {
            return;
        }
    }
}

fn log_call(session: &Session, entry: &ToolEntry, ok: bool, started: Instant, outcome: &str) {
    tracing::info!(
        target: "plugd::mcp",
        session = %session.id(),
        caller = %session.caller().name,
        tool = %entry.name,
        plugin = %entry.plugin,
        ok,
        outcome,
        ms = started.elapsed().as_millis() as u64,
        "MCP tool call"
    );
}
