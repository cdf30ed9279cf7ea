//! The turn loop behind [`Agent::turn`]: hooks, LLM rounds, tool calls, the
//! transcript and the outbox events of one turn.
//!
//! What is stored: the user message as `before_llm_request` left it (so a
//! redacted text is never persisted), each assistant message with its tool
//! calls (registry names), each tool result as the model saw it, and the
//! reply as `before_response` left it. A blocked or failed turn stores the
//! user message and a `system` note saying what stopped it; notes are kept
//! for people reading the session and are never sent to the model.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use plugd_control::chains::{Run, RunKind, RunPatch, RunStatus, fresh_id, token_estimate};
use plugd_host::dialect::CallContext;

use super::names::ToolNames;
use super::{
    Agent, AgentError, OrgTurn, ToolCallRecord, TranscriptEntry, TurnEvent, TurnOutcome, TurnStatus,
};
use crate::llm::{
    ChatMessage, ChatRequest, ChatResponse, Delta, LlmError, Role, ToolCall, ToolSpec, Usage,
};
use plugd_runtime::RuntimeError;
use plugd_runtime::bindings_rt::ExportCall;
use plugd_runtime::compaction::OnFailure;
use plugd_runtime::governed::{Governed, Surface};
use plugd_runtime::hooks::{HookContext, HookPoint, Notice, NoticeKind, Outcome};
use plugd_runtime::outbox::OutboxExt;

/// A new session id: `s_` and a UUIDv7 in 32 hex digits
/// (`plugd_control::id::fresh`).
pub fn new_session_id() -> String {
    fresh_id("s")
}

/// `base` overlaid by `over` (fields set in `over` win).
pub(super) fn overlay(base: &HookContext, over: &HookContext) -> HookContext {
    base.overlaid(over)
}

fn entry(role: &str, content: impl Into<String>) -> TranscriptEntry {
    TranscriptEntry {
        role: role.to_owned(),
        content: content.into(),
        tool_calls: Vec::new(),
        tool_call_id: None,
        at: plugd_store::now_rfc3339(),
    }
}

/// The text a model is given for a tool result.
fn result_text(result: &Value) -> String {
    match result {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The scope and session of an org turn's calls through bindings (the
/// session id is the rollout key and `context.session_id`).
fn export_call(org: &OrgTurn, session_id: &str, trace_id: Option<String>) -> ExportCall {
    ExportCall {
        org_id: org.org_id.clone(),
        project_id: org.project_id.clone(),
        session_id: Some(session_id.to_owned()),
        caller: Some(org.caller.clone()),
        trace_id,
    }
}

/// The state of one running turn.
struct Turn<'a> {
    agent: &'a Agent,
    session_id: String,
    input: String,
    ctx: HookContext,
    /// The microapp `inbound` reference of a channel-triggered turn.
    inbound: Option<Value>,
    events: Option<mpsc::UnboundedSender<TurnEvent>>,
    names: ToolNames,
    tools: Vec<ToolSpec>,
    /// The org scope of an org identity's turn (its tools are the org's
    /// bound exports, called through their bindings).
    org: Option<OrgTurn>,
    /// The binding each export resolved to when listed (export id →
    /// binding id), taken again by its calls while it still applies.
    pins: HashMap<String, String>,
    /// The stored transcript before this turn.
    prior: Vec<TranscriptEntry>,
    /// This turn's entries so far (stored at the end).
    new: Vec<TranscriptEntry>,
    notices: Vec<Notice>,
    tool_calls: Vec<ToolCallRecord>,
    rounds: u32,
    usage: Usage,
    /// This turn's run.
    run_id: String,
    /// The chain it appends to (the session's head).
    chain_id: String,
    /// The compaction this turn made.
    compaction_id: Option<String>,
}

/// How a step ended when it did not continue.
enum Stop {
    Blocked { point: HookPoint, message: String },
    Failed(AgentError),
}

impl Agent {
    pub(super) async fn run_turn(
        &self,
        session_id: &str,
        input: &str,
        ctx: &HookContext,
        inbound: Option<Value>,
        org: Option<&OrgTurn>,
        events: Option<mpsc::UnboundedSender<TurnEvent>>,
    ) -> Result<TurnOutcome, AgentError> {
        if !plugd_store::sessions::valid_session_id(session_id) {
            return Err(AgentError::BadSession(session_id.to_owned()));
        }
        let prior = self.load(session_id).await?;
        // An org turn's session is the org's (and its project's).
        let store = self.runtime.state();
        let created = match org {
            None => store.session_ensure(session_id).await.map(|(_, c)| c),
            Some(o) => store
                .session_open(session_id, Some(&o.org_id), o.project_id.as_deref())
                .await
                .map(|(_, c)| c),
        }
        .map_err(|e| AgentError::Store(e.to_string()))?;
        if created {
            self.emit(
                "session.created",
                json!({"kind": "session", "id": session_id}),
                json!({"session_id": session_id}),
            )
            .await;
        }
        let mut ctx = overlay(&self.settings.defaults, ctx);
        ctx.session_id = Some(session_id.to_owned());
        let store = self.runtime.state();
        let chain_id = store
            .session_head(session_id)
            .await
            .map_err(|e| AgentError::Store(e.to_string()))?;
        let run = Run {
            id: fresh_id("run"),
            session_id: session_id.to_owned(),
            chain_id: Some(chain_id.clone()),
            parent_run_id: None,
            depth: 0,
            kind: RunKind::Turn,
            harness: None,
            mode: None,
            status: RunStatus::Running,
            // Nothing of the raw input: before_llm_request may redact it;
            // the run's summary gets the stored (redacted) task at the end.
            input: json!({}),
            checkpoint: Value::Null,
            summary: Value::Null,
            artifacts: json!([]),
            error: None,
            created_by: ctx
                .user_id
                .clone()
                .map_or_else(|| "agent".to_owned(), |u| format!("user:{u}")),
            created_at: plugd_store::now_rfc3339(),
            ended_at: None,
        };
        store
            .run_create(&run)
            .await
            .map_err(|e| AgentError::Store(e.to_string()))?;
        let (names, tools, pins) = match org {
            None => self.workspace_tools(&ctx),
            Some(org) => self.org_tools(org, session_id, &ctx).await,
        };
        let mut turn = Turn {
            agent: self,
            session_id: session_id.to_owned(),
            input: input.to_owned(),
            ctx,
            inbound,
            events,
            names,
            tools,
            org: org.cloned(),
            pins,
            prior,
            new: Vec::new(),
            notices: Vec::new(),
            tool_calls: Vec::new(),
            rounds: 0,
            usage: Usage::default(),
            run_id: run.id,
            chain_id,
            compaction_id: None,
        };
        let result = match turn.compact_if_needed().await {
            Ok(()) => turn.steps().await,
            Err(stop) => Err(stop),
        };
        turn.finish(result).await
    }

    /// The tools plugd.yaml's `policy:` lets this agent see (the caller
    /// its calls' records name), with their model names.
    fn workspace_tools(
        &self,
        ctx: &HookContext,
    ) -> (ToolNames, Vec<ToolSpec>, HashMap<String, String>) {
        let caller = plugd_runtime::tool_policy::PolicyCaller::of(&CallContext {
            agent_id: ctx.agent_id.clone(),
            org_id: ctx.tenant_id.clone(),
            ..CallContext::default()
        });
        let registry = self.runtime.tools_for(&caller);
        let names = ToolNames::new(registry.iter().map(|t| t.name.as_str()));
        let tools = registry
            .iter()
            .map(|t| ToolSpec {
                name: names.model_name(&t.name),
                description: t.description.clone(),
                parameters: t.input_schema.clone(),
            })
            .collect();
        (names, tools, HashMap::new())
    }

    /// The tool exports bound to `org`'s scope (what `/mcp` serves it, by
    /// export id, what `policy:` hides left out), the binding each chose
    /// for this session kept as its pin. A listing that fails offers no
    /// tools (logged), as `/mcp` does.
    async fn org_tools(
        &self,
        org: &OrgTurn,
        session_id: &str,
        ctx: &HookContext,
    ) -> (ToolNames, Vec<ToolSpec>, HashMap<String, String>) {
        let caller = plugd_runtime::tool_policy::PolicyCaller {
            org: org.org_id.clone(),
            project: org.project_id.clone().unwrap_or_default(),
            role: org.role.clone().unwrap_or_default(),
            groups: org.groups.clone(),
            ..plugd_runtime::tool_policy::PolicyCaller::named(&org.caller)
        };
        let call = export_call(org, session_id, ctx.trace_id.clone());
        let exports = match self
            .runtime
            .scoped_exports(&call, &HashMap::new(), &caller)
            .await
        {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(session = %session_id, org = %org.org_id, error = %e, "cannot list the exports bound to the turn's org; the model is offered none");
                Vec::new()
            }
        };
        let names = ToolNames::new(exports.iter().map(|x| x.export_id.as_str()));
        let tools = exports
            .iter()
            .map(|x| ToolSpec {
                name: names.model_name(&x.export_id),
                description: x.entry.description.clone(),
                parameters: x.entry.input_schema.clone(),
            })
            .collect();
        let pins = exports
            .into_iter()
            .map(|x| (x.export_id, x.binding.binding_id))
            .collect();
        (names, tools, pins)
    }

    /// The stored transcript of `id` (empty when unknown).
    pub(super) async fn load(&self, id: &str) -> Result<Vec<TranscriptEntry>, AgentError> {
        let rows = self
            .runtime
            .state()
            .session_transcript(id)
            .await
            .map_err(|e| AgentError::Store(e.to_string()))?;
        rows.into_iter()
            .map(|v| {
                serde_json::from_value(v).map_err(|e| {
                    AgentError::Store(format!(
                        "the stored transcript of session {id:?} has an entry plugd cannot read ({e}); start a new session"
                    ))
                })
            })
            .collect()
    }

    /// Records an outbox event; a failure is logged, never fails the turn.
    async fn emit(&self, event_type: &str, subject: Value, summary: Value) {
        if let Err(e) = self.runtime.emit(event_type, subject, summary).await {
            tracing::warn!(event_type, error = %e, "could not record the event in the outbox");
        }
    }
}

impl Turn<'_> {
    /// Compacts the session's chain first when it outgrew the compactor's
    /// budget (`agent.compactor`); the turn then works on the derived chain.
    async fn compact_if_needed(&mut self) -> Result<(), Stop> {
        let Some(cfg) = self.agent.settings.compactor.clone() else {
            return Ok(());
        };
        let store = self.agent.runtime.state();
        let blocks = store
            .chain_blocks(&self.chain_id, 0, usize::MAX)
            .await
            .map_err(|e| Stop::Failed(AgentError::Store(e.to_string())))?;
        let estimate = token_estimate(&blocks) + (self.input.len() as u64).div_ceil(4);
        if estimate <= cfg.max_input_tokens {
            return Ok(());
        }
        let notice = |kind, code: &str, message: String, details| Notice {
            kind,
            code: Some(code.to_owned()),
            message,
            details,
            handler: None,
        };
        match crate::compaction::compact_session(
            &self.agent.runtime,
            &self.session_id,
            &cfg,
            Some(&self.run_id),
        )
        .await
        {
            Ok(c) => {
                let derived = c.derived_chain_id.clone().unwrap_or_default();
                self.prior = self
                    .agent
                    .load(&self.session_id)
                    .await
                    .map_err(Stop::Failed)?;
                let n = notice(
                    NoticeKind::Info,
                    "CHAIN_COMPACTED",
                    format!(
                        "the chain ({estimate} tokens estimated, budget {}) was compacted by {} into {derived}",
                        cfg.max_input_tokens, cfg.export
                    ),
                    Some(
                        json!({"compaction_id": c.id, "source_chain_id": c.source_chain_id, "derived_chain_id": derived}),
                    ),
                );
                self.chain_id = derived;
                self.compaction_id = Some(c.id);
                self.send(TurnEvent::Notice {
                    point: HookPoint::BeforeLlmRequest,
                    notice: n.clone(),
                });
                self.notices.push(n);
                Ok(())
            }
            Err(e) if cfg.on_failure == OnFailure::Continue => {
                tracing::warn!(session = %self.session_id, error = %e, "compaction failed; the turn goes on with the chain as it was");
                let n = notice(NoticeKind::Warn, "COMPACTION_FAILED", e.to_string(), None);
                self.send(TurnEvent::Notice {
                    point: HookPoint::BeforeLlmRequest,
                    notice: n.clone(),
                });
                self.notices.push(n);
                Ok(())
            }
            Err(e) => Err(Stop::Failed(AgentError::Compaction(e.to_string()))),
        }
    }

    fn send(&self, event: TurnEvent) {
        if let Some(tx) = &self.events {
            let _ = tx.send(event);
        }
    }

    /// Runs `point`; records its notices; `Err` when it blocked.
    async fn hook(&mut self, point: HookPoint, payload: Value) -> Result<Value, Stop> {
        let outcome = self.agent.pipeline.run(point, payload, &self.ctx).await;
        let blocked = outcome.is_blocked();
        let Outcome {
            payload,
            message,
            notices,
            ..
        } = outcome;
        for notice in &notices {
            self.send(TurnEvent::Notice {
                point,
                notice: notice.clone(),
            });
        }
        self.notices.extend(notices);
        if blocked {
            return Err(Stop::Blocked {
                point,
                message: message.unwrap_or_else(|| format!("blocked by a {point} hook")),
            });
        }
        Ok(payload)
    }

    /// The request messages: the stored transcript and this turn's entries,
    /// without notes, tool names mapped for the model.
    fn messages(&self) -> Vec<ChatMessage> {
        self.prior
            .iter()
            .chain(&self.new)
            .filter_map(|e| {
                let role = match e.role.as_str() {
                    // A system block of the chain (e.g. a compactor's seed),
                    // unlike a note, is meant for the model.
                    "instructions" => Role::System,
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    "tool" => Role::Tool,
                    _ => return None,
                };
                Some(ChatMessage {
                    role,
                    content: e.content.clone(),
                    tool_calls: e
                        .tool_calls
                        .iter()
                        .map(|c| ToolCall {
                            id: c.id.clone(),
                            name: self.names.model_name(&c.name),
                            arguments: c.arguments.clone(),
                        })
                        .collect(),
                    tool_call_id: e.tool_call_id.clone(),
                })
            })
            .collect()
    }

    async fn chat(&mut self) -> Result<ChatResponse, Stop> {
        let request = ChatRequest {
            model: None,
            messages: self.messages(),
            tools: self.tools.clone(),
            max_tokens: None,
            temperature: None,
            system_prompt: self.agent.settings.system_prompt.clone(),
            ..ChatRequest::default()
        };
        self.rounds += 1;
        let llm = self.agent.llm.clone();
        // With before_response handlers, raw model text must not reach the
        // caller before they ran (a sanitizer would be bypassed): the reply
        // is sent as one delta after the hooks instead.
        let stream_to = if self.holds_deltas() {
            None
        } else {
            self.events.as_ref()
        };
        let response = match stream_to {
            None => llm.chat(&request, None).await,
            Some(events) => {
                let (tx, mut rx) = mpsc::unbounded_channel::<Delta>();
                let forward = |d: Delta| {
                    if let Delta::TextDelta { delta } = d {
                        let _ = events.send(TurnEvent::Delta { text: delta });
                    }
                };
                let fut = llm.chat(&request, Some(tx));
                tokio::pin!(fut);
                let r = loop {
                    tokio::select! {
                        r = &mut fut => break r,
                        Some(d) = rx.recv() => forward(d),
                    }
                };
                while let Ok(d) = rx.try_recv() {
                    forward(d);
                }
                r
            }
        };
        let response = response.map_err(|e: LlmError| Stop::Failed(e.into()))?;
        self.usage.prompt_tokens += response.usage.prompt_tokens;
        self.usage.completion_tokens += response.usage.completion_tokens;
        Ok(response)
    }

    async fn steps(&mut self) -> Result<String, Stop> {
        let payload = json!({"text": self.input, "sessionId": self.session_id});
        let out = self.hook(HookPoint::BeforeLlmRequest, payload).await;
        let out = match out {
            Ok(v) => v,
            Err(stop) => {
                self.new.push(entry("user", self.input.clone()));
                return Err(stop);
            }
        };
        let text = out
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or(&self.input)
            .to_owned();
        self.new.push(entry("user", text));
        let limit = self.agent.settings.max_tool_rounds;
        let mut tool_rounds = 0u32;
        loop {
            let response = self.chat().await?;
            if response.tool_calls.is_empty() {
                return self.respond(response.content).await;
            }
            tool_rounds += 1;
            if tool_rounds > limit {
                return Err(Stop::Failed(AgentError::TooManyRounds { limit }));
            }
            let calls: Vec<ToolCall> = response
                .tool_calls
                .iter()
                .map(|c| ToolCall {
                    id: c.id.clone(),
                    name: self.names.registry_name(&c.name),
                    arguments: c.arguments.clone(),
                })
                .collect();
            let mut assistant = entry("assistant", response.content.clone());
            assistant.tool_calls = calls.clone();
            self.new.push(assistant);
            for call in calls {
                self.call(call).await?;
            }
        }
    }

    /// One tool call through the runtime's governed path, which runs the
    /// `before_tool_call` and `after_tool_result` hooks ([`plugd_runtime::governed`]);
    /// the turn shows their notices and stops when one blocks.
    async fn call(&mut self, call: ToolCall) -> Result<(), Stop> {
        let cctx = CallContext {
            agent_id: self.ctx.agent_id.clone(),
            session_id: Some(self.session_id.clone()),
            binding: Some(self.agent.runtime.binding_context(&self.ctx)),
            inbound: self.inbound.clone(),
            trace_id: self.ctx.trace_id.clone(),
            org_id: self.ctx.tenant_id.clone(),
            chain_id: Some(self.chain_id.clone()),
            run_id: Some(self.run_id.clone()),
            ..CallContext::default()
        };
        // The risk gate records medium calls in the outbox; the turn shows them too.
        let risk = self.agent.runtime.risk_notice(&call.name);
        let told = AtomicBool::new(false);
        let events = self.events.clone();
        let tell = |args: &Value, notices: &[Notice]| {
            told.store(true, Ordering::Relaxed);
            let Some(tx) = &events else { return };
            for n in notices {
                let _ = tx.send(TurnEvent::Notice {
                    point: HookPoint::BeforeToolCall,
                    notice: n.clone(),
                });
            }
            let _ = tx.send(TurnEvent::ToolCall {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                args: args.clone(),
            });
            if let Some(n) = &risk {
                let _ = tx.send(TurnEvent::Notice {
                    point: HookPoint::BeforeToolCall,
                    notice: n.clone(),
                });
            }
        };
        let gov = Governed {
            hook_context: Some(&self.ctx),
            call_id: Some(&call.id),
            on_args: Some(&tell),
            ..Governed::new(Surface::Agent)
        };
        let called = match &self.org {
            None => {
                self.agent
                    .runtime
                    .call_tool_governed(&call.name, call.arguments.clone(), &cctx, &gov)
                    .await
            }
            Some(org) => {
                // Only what was offered: a name the org's catalog did not
                // list (a workspace tool, another org's export) is unknown.
                let Some(pin) = self.pins.get(&call.name).cloned() else {
                    return self.unknown(call).await;
                };
                let ecall = export_call(org, &self.session_id, self.ctx.trace_id.clone());
                let cctx = CallContext {
                    caller_role: org.role.clone(),
                    caller_groups: org.groups.clone(),
                    ..cctx
                };
                let done = self
                    .agent
                    .runtime
                    .call_export_governed(
                        &call.name,
                        call.arguments.clone(),
                        &ecall,
                        cctx,
                        &gov,
                        Some(&pin),
                    )
                    .await;
                if let Some(b) = done.binding_id {
                    self.pins.insert(call.name.clone(), b);
                }
                done.called
            }
        };
        let told = told.load(Ordering::Relaxed);
        let mut risk = risk.filter(|_| told);
        for (point, n) in called.notices {
            if point != HookPoint::BeforeToolCall
                && let Some(r) = risk.take()
            {
                self.notices.push(r);
            }
            if point != HookPoint::BeforeToolCall || !told {
                self.send(TurnEvent::Notice {
                    point,
                    notice: n.clone(),
                });
            }
            self.notices.push(n);
        }
        self.notices.extend(risk);
        let args = called.args;
        let (ok, result) = match called.outcome {
            Ok(v) => (true, v),
            Err(RuntimeError::BlockedByHook { point, message, .. }) => {
                return Err(Stop::Blocked { point, message });
            }
            Err(RuntimeError::RateLimited {
                rule,
                retry_after_ms,
            }) => {
                let e = RuntimeError::RateLimited {
                    rule: rule.clone(),
                    retry_after_ms,
                };
                // Over a `limits:` rule: the model reads the refusal as the
                // call's result (as any refused call) and the turn carries a
                // RATE_LIMITED notice.
                let n = Notice {
                    kind: NoticeKind::Warn,
                    code: Some("RATE_LIMITED".to_owned()),
                    message: e.to_string(),
                    details: Some(json!({"tool": call.name, "rule": rule,
                        "retry_after_ms": retry_after_ms,
                        "retry_after_secs": retry_after_ms.div_ceil(1000).max(1)})),
                    handler: None,
                };
                self.send(TurnEvent::Notice {
                    point: HookPoint::BeforeToolCall,
                    notice: n.clone(),
                });
                self.notices.push(n);
                (false, Value::String(format!("error: RATE_LIMITED: {e}")))
            }
            Err(e) => (false, Value::String(format!("error: {e}"))),
        };
        self.send(TurnEvent::ToolResult {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            ok,
            result: result.clone(),
        });
        self.agent
            .emit(
                "tool.completed",
                json!({"kind": "session", "id": self.session_id}),
                json!({"tool": call.name, "call_id": call.id, "success": ok}),
            )
            .await;
        let mut message = entry("tool", result_text(&result));
        message.tool_call_id = Some(call.id.clone());
        self.new.push(message);
        self.tool_calls.push(ToolCallRecord {
            call_id: call.id,
            tool: call.name,
            args,
            ok,
            result,
        });
        Ok(())
    }

    /// The answer to a call of a tool the turn did not offer: the model
    /// reads an unknown-tool error, as for any refused call.
    async fn unknown(&mut self, call: ToolCall) -> Result<(), Stop> {
        let result = Value::String(format!(
            "error: {}",
            RuntimeError::UnknownTool(call.name.clone())
        ));
        self.send(TurnEvent::ToolResult {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            ok: false,
            result: result.clone(),
        });
        let mut message = entry("tool", result_text(&result));
        message.tool_call_id = Some(call.id.clone());
        self.new.push(message);
        self.tool_calls.push(ToolCallRecord {
            call_id: call.id,
            tool: call.name,
            args: call.arguments,
            ok: false,
            result,
        });
        Ok(())
    }

    async fn respond(&mut self, content: String) -> Result<String, Stop> {
        let payload = json!({
            "content": content,
            "provider": self.agent.llm.name(),
            "model": Value::Null,
            "sessionId": self.session_id,
            "tokenUsage": {
                "input": self.usage.prompt_tokens,
                "output": self.usage.completion_tokens,
                "total": self.usage.prompt_tokens + self.usage.completion_tokens,
            },
        });
        let out = self.hook(HookPoint::BeforeResponse, payload).await?;
        let reply = out
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or(content);
        if self.holds_deltas() && !reply.is_empty() {
            self.send(TurnEvent::Delta {
                text: reply.clone(),
            });
        }
        self.new.push(entry("assistant", reply.clone()));
        Ok(reply)
    }

    /// `true` when streamed text is held back until `before_response` ran.
    fn holds_deltas(&self) -> bool {
        !self
            .agent
            .pipeline
            .chain(HookPoint::BeforeResponse)
            .is_empty()
    }

    /// Stores the turn's entries, records the events, and builds the outcome.
    async fn finish(mut self, result: Result<String, Stop>) -> Result<TurnOutcome, AgentError> {
        let (status, reply, message, blocked_at, error) = match result {
            Ok(reply) => (TurnStatus::Completed, Some(reply), None, None, None),
            Err(Stop::Blocked { point, message }) => {
                (TurnStatus::Blocked, None, Some(message), Some(point), None)
            }
            Err(Stop::Failed(e)) => (TurnStatus::Blocked, None, None, None, Some(e)),
        };
        if status != TurnStatus::Completed {
            // Keep only the user message; add a note of what stopped the turn.
            self.new.truncate(1);
            let note = match (&blocked_at, &message, &error) {
                (Some(point), Some(m), _) => {
                    let codes: Vec<&str> = self
                        .notices
                        .iter()
                        .filter_map(|n| n.code.as_deref())
                        .collect();
                    format!("turn blocked at {point}: {m} [{}]", codes.join(", "))
                }
                (_, _, Some(e)) => format!("turn failed: {e}"),
                _ => "turn stopped".to_owned(),
            };
            self.new.push(entry("system", note));
        }
        let patch = match (&reply, &message, &error) {
            (Some(r), _, _) => RunPatch {
                status: Some(RunStatus::Succeeded),
                summary: Some(json!({
                    "text": r,
                    "task": self.new.first().map(|e| e.content.as_str()),
                })),
                ..RunPatch::default()
            },
            (_, _, Some(e)) => RunPatch {
                status: Some(RunStatus::Failed),
                error: Some(e.to_string()),
                ..RunPatch::default()
            },
            (_, m, _) => RunPatch {
                status: Some(RunStatus::Failed),
                error: Some(format!(
                    "blocked at {}: {}",
                    blocked_at.map_or("?", |p| p.name()),
                    m.as_deref().unwrap_or("")
                )),
                ..RunPatch::default()
            },
        };
        let rows: Vec<Value> = self
            .new
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
            .collect();
        let stored = self
            .agent
            .runtime
            .state()
            .session_append(&self.session_id, &rows)
            .await;
        // The run's end, and for a turn that replied (and was stored) its
        // `run.completed`, in one transaction.
        let state = self.agent.runtime.state().clone();
        let ended = match (&reply, &stored) {
            (Some(reply), Ok(_)) => {
                let subscribers = self.agent.runtime.subscribers("run.completed");
                let task = self
                    .new
                    .first()
                    .map(|e| e.content.as_str())
                    .unwrap_or(&self.input);
                let (tool_calls, rounds) = (self.tool_calls.len(), self.rounds);
                let session_id = &self.session_id;
                let report = |run: &plugd_control::chains::Run| plugd_store::outbox::NewEvent {
                    event_type: "run.completed".to_owned(),
                    subject: json!({"kind": "run", "id": run.id}),
                    summary: json!({"session_id": session_id, "task": task, "output": reply, "tool_calls": tool_calls, "rounds": rounds}),
                };
                state
                    .run_finish(&self.run_id, &patch, &report, &subscribers)
                    .await
                    .map(|done| {
                        if let Some((_, queued)) = &done {
                            plugd_runtime::outbox::woke(queued);
                        }
                    })
            }
            _ => state.run_update(&self.run_id, &patch).await.map(drop),
        };
        if let Err(e) = ended {
            tracing::warn!(run = %self.run_id, error = %e, "could not record the end of the turn's run");
        }
        let agent = plugd_runtime::microapp::agent_id(&self.ctx);
        if stored.is_ok() {
            let entries: Vec<(&str, &str)> = self
                .new
                .iter()
                .map(|e| (e.role.as_str(), e.content.as_str()))
                .collect();
            let rt = &self.agent.runtime;
            rt.notify_transcript(&agent, &self.session_id, self.prior.len() + 1, &entries);
            rt.notify_agent_event(
                "turn_completed",
                &agent,
                json!({
                    "session_id": self.session_id,
                    "status": match (&status, &error) {
                        (_, Some(_)) => "failed",
                        (TurnStatus::Completed, _) => "completed",
                        (TurnStatus::Blocked, _) => "blocked",
                    },
                    "reply": reply,
                    "message": message.clone().or_else(|| error.as_ref().map(|e| e.to_string())),
                    "blocked_at": blocked_at,
                    "tool_calls": self.tool_calls.iter().map(|c| json!({"tool": c.tool, "ok": c.ok})).collect::<Vec<_>>(),
                    "rounds": self.rounds,
                }),
            );
        }
        if let Some(e) = error {
            if let Err(s) = stored {
                tracing::warn!(session = %self.session_id, error = %s, "could not store the failed turn");
            }
            return Err(e);
        }
        stored.map_err(|e| AgentError::Store(e.to_string()))?;
        let outcome = TurnOutcome {
            session_id: self.session_id.clone(),
            status,
            reply,
            message,
            blocked_at,
            notices: std::mem::take(&mut self.notices),
            tool_calls: std::mem::take(&mut self.tool_calls),
            rounds: self.rounds,
            usage: self.usage,
            run_id: Some(self.run_id.clone()),
            chain_id: Some(self.chain_id.clone()),
            compaction_id: self.compaction_id.clone(),
        };
        self.send(TurnEvent::Done {
            outcome: Box::new(outcome.clone()),
        });
        Ok(outcome)
    }
}
