//! The one governed path of every tool call, whatever door it came in by
//! (HTTP invoke and its SSE form, `/mcp`, `plugd mcp`, `plugd tool call`,
//! the agent turn, calls through bindings, hook-bound tools):
//!
//! resolve → enabled → `policy:` rules ([`crate::tool_policy`]) → schema →
//! rate limits (`limits:`, [`crate::limits`]) → `before_tool_call` hooks (may modify the
//! arguments, may cancel; a blocking hook that fails blocks) → risk gate →
//! call → `after_tool_result` hooks (may modify the result, may cancel) →
//! one invocation record.
//!
//! The hook pipeline is the runtime's ([`Runtime::set_hooks`]; `plugd
//! serve`, `plugd mcp`, `plugd tool call` and the agent commands install the
//! one built from plugd.yaml): no surface runs tool hooks itself, so no
//! surface can skip them. The hook context names the surface (`surface`,
//! Dexto's execution context) and carries the call's trace id.
//!
//! Every call has a trace id: the caller's (a W3C `traceparent` the
//! surface parsed, or the exported span's when traces are on), else a new
//! random one; the plugin gets it (VAI `context.trace_id`) and the record
//! keeps it.
//!
//! A tool a hook handler calls (a hook served by a tool) runs every step
//! but the tool hooks themselves, which would call it again without end.

use std::borrow::Cow;
use std::sync::Arc;

use plugd_host::Supervised;
use plugd_host::dialect::CallContext;
use serde_json::{Value, json};

use crate::hooks::{HookContext, HookPoint, Notice, Pipeline};
use crate::record_payload::CallDecision;
use crate::{Runtime, RuntimeError, ToolEntry, risk};

/// The door a call came in by; hook contexts and invocation records name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Surface {
    /// `POST /v1/tools/{name}:invoke` (JSON or SSE).
    Http,
    /// The MCP gateway (`/mcp`, `plugd mcp`).
    Mcp,
    /// `plugd tool call` without a running serve.
    Cli,
    /// The agent turn.
    Agent,
    /// A call through a binding (`/v1/plugin-tools/{export}:invoke`,
    /// `plugd tool call EXPORT --org`).
    Binding,
    /// A tool serving as a hook handler (its own tool hooks do not run).
    Hook,
    /// Anything else in this process (benchmarks, embedding code).
    Runtime,
}

impl Surface {
    /// Its name in hook contexts and records.
    pub fn name(self) -> &'static str {
        match self {
            Surface::Http => "http",
            Surface::Mcp => "mcp",
            Surface::Cli => "cli",
            Surface::Agent => "agent",
            Surface::Binding => "binding",
            Surface::Hook => "hook",
            Surface::Runtime => "runtime",
        }
    }

    fn runs_tool_hooks(self) -> bool {
        self != Surface::Hook
    }
}

/// What [`Governed::on_args`] calls: the arguments the tool is about to
/// get and the notices of `before_tool_call`.
pub type ArgsObserver<'a> = dyn Fn(&Value, &[Notice]) + Send + Sync + 'a;

/// How a surface takes the governed path.
#[derive(Clone, Copy)]
pub struct Governed<'a> {
    /// The door.
    pub surface: Surface,
    /// Decides a `high` or `critical` call instead of the runtime's own
    /// approver (the MCP gateway asking its client's user).
    pub approver: Option<&'a dyn risk::Approver>,
    /// The hook context the surface has (the agent's tenant, user,
    /// channel); derived from the call context when `None`.
    pub hook_context: Option<&'a HookContext>,
    /// The caller's id of this call (hook payloads' `callId`); the
    /// invocation id when `None`.
    pub call_id: Option<&'a str>,
    /// Told the arguments the tool is about to get, and the notices of
    /// `before_tool_call`, once those hooks let the call through (the
    /// agent's `tool_call` event).
    pub on_args: Option<&'a ArgsObserver<'a>>,
}

impl std::fmt::Debug for Governed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Governed")
            .field("surface", &self.surface)
            .field("call_id", &self.call_id)
            .finish_non_exhaustive()
    }
}

impl Governed<'_> {
    /// The plain path of `surface`.
    pub fn new(surface: Surface) -> Governed<'static> {
        Governed {
            surface,
            approver: None,
            hook_context: None,
            call_id: None,
            on_args: None,
        }
    }
}

/// What a governed call produced.
#[derive(Debug)]
pub struct Called {
    /// The arguments as the hooks left them (what the tool got, or would
    /// have got).
    pub args: Value,
    /// The result (as `after_tool_result` left it), or why there is none
    /// ([`RuntimeError::BlockedByHook`] when a hook cancelled).
    pub outcome: Result<Value, RuntimeError>,
    /// Every hook notice, with its point, in order.
    pub notices: Vec<(HookPoint, Notice)>,
    /// The decisions taken on the way (a hook's block or change, the risk
    /// approval, a policy refusal), in order; the invocation record's
    /// `payload.decisions`.
    pub decisions: Vec<CallDecision>,
}

/// The runtime's hook pipeline and plugd.yaml's `tenant:` defaults.
#[derive(Clone)]
pub(crate) struct Hooks {
    pipeline: Arc<Pipeline>,
    defaults: HookContext,
}

/// The call context with a trace id: the exported span's when traces are
/// on, else the caller's, else a new one.
pub(crate) fn traced(ctx: &CallContext) -> Cow<'_, CallContext> {
    let trace = plugd_telemetry::trace_id();
    match (trace, &ctx.trace_id) {
        (None, Some(_)) => Cow::Borrowed(ctx),
        (Some(t), Some(c)) if &t == c => Cow::Borrowed(ctx),
        (t, _) => {
            let mut owned = ctx.clone();
            owned.trace_id = Some(t.unwrap_or_else(plugd_telemetry::new_trace_id));
            Cow::Owned(owned)
        }
    }
}

impl Runtime {
    /// Installs the hook pipeline every tool call of this runtime passes
    /// (see the module docs), with plugd.yaml's `tenant:` as the context
    /// defaults; replaces an earlier one.
    pub fn set_hooks(&self, pipeline: Arc<Pipeline>, defaults: HookContext) {
        let mut slot = self.inner.hooks.write().unwrap_or_else(|p| p.into_inner());
        *slot = Some(Hooks { pipeline, defaults });
    }

    /// The installed hook pipeline, if any.
    pub fn hooks(&self) -> Option<Arc<Pipeline>> {
        self.hooks_now().map(|h| h.pipeline)
    }

    fn hooks_now(&self) -> Option<Hooks> {
        self.inner
            .hooks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Calls tool `name` through the governed path (module docs).
    pub async fn call_tool_governed(
        &self,
        name: &str,
        args: Value,
        ctx: &CallContext,
        gov: &Governed<'_>,
    ) -> Called {
        // The tool call span (the round trip to the plugin is its child).
        let plugin = plugd_telemetry::enabled()
            .then(|| Some(self.tool(name)?.plugin.to_string()))
            .flatten();
        let subject = || plugd_telemetry::Subject {
            plugin: plugin.as_deref(),
            export: Some(name),
            ..plugd_telemetry::Subject::default()
        };
        let mut called = None;
        let call = async {
            let c = self.call_resolved(name, args, ctx, gov).await;
            let out = match &c.outcome {
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            };
            called = Some(c);
            out
        };
        let _ = plugd_telemetry::in_span("tool call", subject, call).await;
        called.unwrap_or_else(|| unreachable!("the call future ran to its end"))
    }

    async fn call_resolved(
        &self,
        name: &str,
        args: Value,
        ctx: &CallContext,
        gov: &Governed<'_>,
    ) -> Called {
        let Some(entry) = self.tool(name) else {
            return Called {
                args,
                outcome: Err(self.unknown_tool(name).await),
                notices: Vec::new(),
                decisions: Vec::new(),
            };
        };
        let ctx = traced(ctx);
        let sup = match self.supervised(&entry.plugin) {
            Ok(s) => s,
            Err(e) => {
                return Called {
                    args,
                    outcome: Err(e),
                    notices: Vec::new(),
                    decisions: Vec::new(),
                };
            }
        };
        self.recorded(&sup, &entry, args, &ctx, gov, |cx| Ok((cx, Vec::new())))
            .await
    }

    /// The one place a tool call's invocation record opens and closes,
    /// whether the call came by name or by binding: the record opens, then
    /// `prepare` gives the context the call runs with and the secrets to
    /// mask in what it returns (a binding resolves its secrets there; its
    /// failure is recorded like any other), then the governed steps run.
    /// The record keeps the call's error and decisions (and its bodies
    /// under `records.keep_bodies`) with every secret value the runtime
    /// knows masked ([`crate::record_payload`]).
    pub(crate) async fn recorded(
        &self,
        sup: &Supervised,
        entry: &ToolEntry,
        args: Value,
        ctx: &CallContext,
        gov: &Governed<'_>,
        prepare: impl FnOnce(CallContext) -> Result<(CallContext, Vec<String>), RuntimeError>,
    ) -> Called {
        let record = self
            .inner
            .invocations
            .begin(entry, Some(&**sup.spec()), ctx, gov.surface);
        let call_id = gov.call_id.unwrap_or(record.id()).to_owned();
        let mut secrets = Vec::new();
        let called = match prepare(record.context().into_owned()) {
            Ok((call_ctx, bound)) => {
                secrets = bound;
                self.govern(sup, entry, args, &call_ctx, gov, &call_id, &secrets)
                    .await
            }
            Err(e) => Called {
                args,
                outcome: Err(e),
                notices: Vec::new(),
                decisions: Vec::new(),
            },
        };
        let keep_bodies = self.keep_bodies();
        if keep_bodies || called.outcome.is_err() || !called.decisions.is_empty() {
            secrets.extend(self.inner.redactions.all());
        }
        record.finish(&called, &secrets, keep_bodies);
        called
    }

    /// The governed steps once the tool is resolved (its record is the
    /// caller's): enabled → schema → hooks → gate → call → hooks. `secrets`
    /// are masked in the result and errors before `after_tool_result`
    /// sees them (a binding's).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn govern(
        &self,
        sup: &Supervised,
        entry: &ToolEntry,
        args: Value,
        ctx: &CallContext,
        gov: &Governed<'_>,
        call_id: &str,
        secrets: &[String],
    ) -> Called {
        let mut notices = Vec::new();
        let hooks = if gov.surface.runs_tool_hooks() {
            self.hooks_now()
        } else {
            None
        };
        let hooked = |p: HookPoint| hooks.as_ref().filter(|h| !h.pipeline.chain(p).is_empty());
        let mut decisions = Vec::new();
        let fail = |args, e, notices, decisions| Called {
            args,
            outcome: Err(e),
            notices,
            decisions,
        };
        // Disabled tools and approvals as the store has them now: a change
        // made through another process or node holds from this call on.
        if let Err(e) = self.consent_current().await {
            return fail(args, e, notices, decisions);
        }
        if self
            .inner
            .plugins
            .snapshot()
            .map
            .contains_key(&entry.plugin)
            && crate::read(&self.inner.registry).get(&entry.name).is_none()
        {
            return fail(
                args,
                RuntimeError::UnknownTool(entry.name.clone()),
                notices,
                decisions,
            );
        }
        if let Err(e) = risk::check_enabled(self, entry) {
            if matches!(e, RuntimeError::Gate(risk::GateError::Disabled { .. })) {
                decisions.push(CallDecision::policy_refused("tool_disabled"));
            }
            return fail(args, e, notices, decisions);
        }
        // plugd.yaml's `policy:` (a deny answers as an unknown tool, before
        // the arguments are checked, so it does not reveal the tool).
        if let Err(e) = crate::tool_policy::check_call(
            self,
            entry,
            &args,
            ctx,
            gov.approver,
            gov.surface,
            &mut decisions,
        )
        .await
        {
            return fail(args, e, notices, decisions);
        }
        if let Err(e) = entry.validate(&args) {
            return fail(args, e.into(), notices, decisions);
        }
        // plugd.yaml `limits:` (before hooks, approvals and the plugin).
        if let Err(e) = self
            .check_limits(entry, ctx, gov.surface, &mut decisions)
            .await
        {
            return fail(args, e, notices, decisions);
        }
        let hook_cx = |h: &Hooks| {
            let own;
            let over = match gov.hook_context {
                Some(c) => c,
                None => {
                    own = HookContext {
                        session_id: ctx.session_id.clone(),
                        tenant_id: ctx.org_id.clone(),
                        agent_id: ctx.agent_id.clone(),
                        ..HookContext::default()
                    };
                    &own
                }
            };
            let mut cx = h.defaults.overlaid(over);
            cx.surface = Some(gov.surface.name().to_owned());
            if cx.trace_id.is_none() {
                cx.trace_id = ctx.trace_id.clone();
            }
            cx
        };
        let mut args = args;
        let mut before_notices = Vec::new();
        if let Some(h) = hooked(HookPoint::BeforeToolCall) {
            let cx = hook_cx(h);
            let payload = json!({
                "toolName": entry.name,
                "args": args,
                "sessionId": cx.session_id,
                "callId": call_id,
                "surface": gov.surface.name(),
            });
            let out = h
                .pipeline
                .run(HookPoint::BeforeToolCall, payload, &cx)
                .await;
            let blocked = out.is_blocked();
            let crate::hooks::Outcome {
                mut payload,
                message,
                notices: got,
                handler,
                ..
            } = out;
            if blocked {
                let message =
                    message.unwrap_or_else(|| "blocked by a before_tool_call hook".to_owned());
                decisions.push(CallDecision::hook_blocked(
                    HookPoint::BeforeToolCall,
                    handler,
                    &message,
                ));
                let e = RuntimeError::BlockedByHook {
                    point: HookPoint::BeforeToolCall,
                    message,
                    notices: got.clone(),
                };
                notices.extend(got.into_iter().map(|n| (HookPoint::BeforeToolCall, n)));
                return fail(args, e, notices, decisions);
            }
            if let Some(new) = payload.get_mut("args").map(Value::take)
                && new != args
            {
                decisions.push(CallDecision::hook_modified(HookPoint::BeforeToolCall));
                // A modification is checked like the caller's arguments.
                if let Err(e) = entry.validate(&new) {
                    notices.extend(got.into_iter().map(|n| (HookPoint::BeforeToolCall, n)));
                    return fail(new, e.into(), notices, decisions);
                }
                args = new;
            }
            before_notices = got;
        }
        if let Some(tell) = gov.on_args {
            tell(&args, &before_notices);
        }
        notices.extend(
            before_notices
                .into_iter()
                .map(|n| (HookPoint::BeforeToolCall, n)),
        );
        let asked = risk::Asked {
            approver: gov.approver,
            surface: gov.surface,
        };
        let outcome = self
            .call_entry_on(sup, entry, args.clone(), ctx, asked, &mut decisions)
            .await;
        if let Err(RuntimeError::Gate(risk::GateError::Policy(_))) = &outcome {
            decisions.push(CallDecision::policy_refused("risk_policy_unreadable"));
        }
        let outcome = match outcome {
            Ok(mut v) if !secrets.is_empty() => {
                crate::bindings_rt::scrub_value(&mut v, secrets);
                Ok(v)
            }
            Err(e) if !secrets.is_empty() => {
                Err(crate::bindings_rt::scrub_error(e, entry, secrets))
            }
            other => other,
        };
        let Some(h) = hooked(HookPoint::AfterToolResult) else {
            return Called {
                args,
                outcome,
                notices,
                decisions,
            };
        };
        // A failed call passes them too (they may audit it), as a failure.
        let cx = hook_cx(h);
        let (shown, ok) = match &outcome {
            Ok(v) => (v.clone(), true),
            Err(e) => (Value::String(format!("error: {e}")), false),
        };
        let payload = json!({
            "toolName": entry.name,
            "result": shown,
            "success": ok,
            "sessionId": cx.session_id,
            "callId": call_id,
            "surface": gov.surface.name(),
        });
        let out = h
            .pipeline
            .run(HookPoint::AfterToolResult, payload, &cx)
            .await;
        let blocked = out.is_blocked();
        let crate::hooks::Outcome {
            mut payload,
            message,
            notices: got,
            handler,
            ..
        } = out;
        notices.extend(got.iter().cloned().map(|n| (HookPoint::AfterToolResult, n)));
        if blocked {
            let message =
                message.unwrap_or_else(|| "blocked by an after_tool_result hook".to_owned());
            decisions.push(CallDecision::hook_blocked(
                HookPoint::AfterToolResult,
                handler,
                &message,
            ));
            return Called {
                args,
                outcome: Err(RuntimeError::BlockedByHook {
                    point: HookPoint::AfterToolResult,
                    message,
                    notices: got,
                }),
                notices,
                decisions,
            };
        }
        let outcome = match (outcome, payload.get_mut("result").map(Value::take)) {
            (Ok(v), Some(r)) if !r.is_null() && r != v => {
                decisions.push(CallDecision::hook_modified(HookPoint::AfterToolResult));
                Ok(r)
            }
            (other, _) => other,
        };
        Called {
            args,
            outcome,
            notices,
            decisions,
        }
    }
}
