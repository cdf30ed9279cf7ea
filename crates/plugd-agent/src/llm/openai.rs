//! The OpenAI-compatible chat-completions provider (`POST {base_url}/chat/completions`).
//!
//! Works with OpenAI and any compatible server (llama.cpp, vLLM, Ollama,
//! LM Studio, …). A [`ChatRequest`] becomes `{model, messages, tools,
//! max_tokens, temperature, stream}`: the system prompt first, tools as
//! `{type: "function", function: {name, description, parameters}}`,
//! assistant tool calls with their arguments as JSON text, tool results as
//! `role: "tool"` messages with `tool_call_id`. Streaming uses server-sent
//! events (`data:` lines, `[DONE]` at the end); text and tool-call deltas are
//! forwarded as [`Delta`]s (tool calls accumulated by `index`) and merged into
//! the complete response.
//!
//! HTTP failures map onto [`LlmError`]: 401/403 authentication, 404 model not
//! found, 429 rate limited (with `retry-after`), context-length errors,
//! connection failures and timeouts. Response bodies are bounded
//! ([`DEFAULT_MAX_RESPONSE_BYTES`]).
//!
//! Why one file: one OpenAI-compatible client (request shape, tool calls, SSE
//! streaming, bounded bodies, typed errors) whose parts all follow the same
//! wire; the embeddings client shares its HTTP helpers.

use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::{
    ChatMessage, ChatRequest, ChatResponse, Delta, FinishReason, LlmError, LlmFuture, LlmProvider,
    Role, ToolCall, ToolChoice, Usage,
};

/// Largest response body read (sync body, or a whole stream): 8 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 << 20;
/// Default deadline of a sync request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default deadline of a streamed request.
pub const DEFAULT_STREAM_TIMEOUT: Duration = Duration::from_secs(300);
/// Deadline for establishing the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of one [`OpenAiProvider`].
#[derive(Clone)]
pub struct OpenAiOptions {
    /// The provider's name in logs and errors (e.g. `openai`).
    pub name: String,
    /// Base URL, e.g. `https://api.openai.com/v1`; `/chat/completions` is appended.
    pub base_url: String,
    /// The model used when a request names none.
    pub model: String,
    /// Bearer token, if the server wants one.
    pub api_key: Option<String>,
    /// Output budget used when a request sets none.
    pub max_tokens: Option<u32>,
    /// Deadline of one request; `None` = 60 s sync, 300 s streaming.
    pub timeout: Option<Duration>,
    /// Largest response body read.
    pub max_response_bytes: usize,
}

impl std::fmt::Debug for OpenAiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiOptions")
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("max_tokens", &self.max_tokens)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl OpenAiOptions {
    /// Options for `base_url` and `model`, no key, default limits.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiOptions {
            name: "openai".into(),
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            max_tokens: None,
            timeout: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

/// An OpenAI-compatible chat-completions client.
#[derive(Debug)]
pub struct OpenAiProvider {
    options: OpenAiOptions,
    url: String,
    client: reqwest::Client,
}

impl OpenAiProvider {
    /// A client for `options`; fails on a base URL that is not `http(s)://`.
    pub fn new(options: OpenAiOptions) -> Result<Self, LlmError> {
        let base = options.base_url.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(LlmError::NotConfigured(format!(
                "llm.base_url {:?} must start with http:// or https:// (e.g. \"https://api.openai.com/v1\")",
                options.base_url
            )));
        }
        let url = format!("{base}/chat/completions");
        let client = http_client().map_err(LlmError::NotConfigured)?;
        Ok(OpenAiProvider {
            options,
            url,
            client,
        })
    }

    /// The request body for `request`.
    pub fn request_body(&self, request: &ChatRequest, stream: bool) -> Value {
        request_body(&self.options, request, stream)
    }

    fn err_other(&self, message: impl Into<String>) -> LlmError {
        LlmError::Other {
            provider: self.options.name.clone(),
            message: message.into(),
        }
    }

    async fn run(
        &self,
        request: &ChatRequest,
        deltas: Option<mpsc::UnboundedSender<Delta>>,
    ) -> Result<ChatResponse, LlmError> {
        let stream = deltas.is_some();
        let timeout = self.options.timeout.unwrap_or(if stream {
            DEFAULT_STREAM_TIMEOUT
        } else {
            DEFAULT_TIMEOUT
        });
        let body = self.request_body(request, stream);
        let exchange = async {
            let mut builder = self
                .client
                .post(&self.url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(
                    reqwest::header::ACCEPT,
                    if stream {
                        "text/event-stream"
                    } else {
                        "application/json"
                    },
                )
                .body(serde_json::to_vec(&body).unwrap_or_default());
            if let Some(key) = &self.options.api_key {
                builder = builder.bearer_auth(key);
            }
            let mut response = builder.send().await.map_err(|e| self.transport(e))?;
            let status = response.status();
            if !status.is_success() {
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok());
                let body = self.read_body(&mut response, 64 << 10).await?;
                return Err(http_error(
                    &self.options.name,
                    status.as_u16(),
                    retry_after,
                    &body,
                ));
            }
            let is_sse = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            match deltas {
                Some(tx) if is_sse => self.read_stream(&mut response, &tx).await,
                deltas => {
                    // A server that ignores `stream: true` answers with one body.
                    let body = self
                        .read_body(&mut response, self.options.max_response_bytes)
                        .await?;
                    let reply = parse_response(&self.options.name, &body)?;
                    if let Some(tx) = deltas {
                        replay_as_deltas(&reply, &tx);
                    }
                    Ok(reply)
                }
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(LlmError::Connection {
                provider: self.options.name.clone(),
                message: format!(
                    "{} did not answer within {timeout:?}; raise llm.timeout_ms or check the server",
                    self.url
                ),
            }),
        }
    }

    fn transport(&self, e: reqwest::Error) -> LlmError {
        LlmError::Connection {
            provider: self.options.name.clone(),
            message: format!(
                "{}; is the server at {} running?",
                error_chain(&e),
                self.url
            ),
        }
    }

    /// The body, refusing more than `limit` bytes.
    async fn read_body(
        &self,
        response: &mut reqwest::Response,
        limit: usize,
    ) -> Result<Vec<u8>, LlmError> {
        read_capped(response, limit).await.map_err(|e| match e {
            BodyError::Transport(e) => self.transport(e),
            BodyError::TooLarge(limit) => self.err_other(format!(
                "the response is larger than {limit} bytes; it was refused"
            )),
        })
    }

    async fn read_stream(
        &self,
        response: &mut reqwest::Response,
        tx: &mpsc::UnboundedSender<Delta>,
    ) -> Result<ChatResponse, LlmError> {
        let limit = self.options.max_response_bytes;
        let mut sse = SseState::new(&self.options.name, tx);
        let mut total = 0usize;
        while let Some(chunk) = response.chunk().await.map_err(|e| self.transport(e))? {
            total += chunk.len();
            if total > limit {
                return Err(self.err_other(format!(
                    "the event stream is larger than {limit} bytes; it was refused"
                )));
            }
            sse.feed(&chunk)?;
            if sse.done {
                return sse.finish();
            }
        }
        sse.end()?;
        sse.finish()
    }
}

impl LlmProvider for OpenAiProvider {
    fn name(&self) -> &str {
        &self.options.name
    }

    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        deltas: Option<mpsc::UnboundedSender<Delta>>,
    ) -> LlmFuture<'a> {
        Box::pin(self.run(request, deltas))
    }
}

/// The chat-completions body for `request`.
fn request_body(options: &OpenAiOptions, request: &ChatRequest, stream: bool) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = &request.system_prompt {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend(request.messages.iter().map(message_json));
    let mut body = Map::new();
    body.insert(
        "model".into(),
        json!(request.model.as_deref().unwrap_or(&options.model)),
    );
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(n) = request.max_tokens.or(options.max_tokens) {
        body.insert("max_tokens".into(), json!(n));
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if !request.stop_sequences.is_empty() {
        body.insert("stop".into(), json!(request.stop_sequences));
    }
    // OpenAI refuses a tool_choice without tools; `cache_tools` has no
    // equivalent there and is left out.
    if let Some(choice) = request
        .tool_choice
        .as_ref()
        .filter(|_| !request.tools.is_empty())
    {
        let v = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::Any => json!("required"),
            ToolChoice::None => json!("none"),
            ToolChoice::Specific { name } => {
                json!({"type": "function", "function": {"name": name}})
            }
        };
        body.insert("tool_choice".into(), v);
    }
    if stream {
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Value::Object(body)
}

fn message_json(m: &ChatMessage) -> Value {
    match m.role {
        Role::Assistant if !m.tool_calls.is_empty() => {
            let calls: Vec<Value> = m
                .tool_calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function", "function": {
                        "name": c.name, "arguments": c.arguments.to_string()}})
                })
                .collect();
            let content = if m.content.is_empty() {
                Value::Null
            } else {
                json!(m.content)
            };
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        }
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": m.tool_call_id.as_deref().unwrap_or_default(),
            "content": m.content,
        }),
        role => json!({"role": role, "content": m.content}),
    }
}

/// The HTTP client of OpenAI-compatible servers (chat and embeddings):
/// rustls, a 10 s connect deadline.
pub(crate) fn http_client() -> Result<reqwest::Client, String> {
    // reqwest's rustls backend needs a process-wide crypto provider; an
    // `Err` only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .map_err(|e| format!("http client: {e}"))
}

/// A transport error with its causes, `: `-joined.
pub(crate) fn error_chain(e: &reqwest::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

/// Why a bounded body read failed.
pub(crate) enum BodyError {
    /// The connection failed mid-body.
    Transport(reqwest::Error),
    /// The body is over the limit (the limit).
    TooLarge(usize),
}

/// The response body, refusing more than `limit` bytes.
pub(crate) async fn read_capped(
    response: &mut reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The message and code of an OpenAI-style error body
/// (`{"error": {"message", "code"}}`), or an excerpt of the body.
pub(crate) fn error_detail(body: &[u8]) -> (String, String) {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let err = parsed.as_ref().and_then(|v| v.get("error"));
    let message = err
        .and_then(|e| e.get("message").or(Some(e)))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| excerpt(&String::from_utf8_lossy(body)));
    let code = err
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    (message, code)
}

/// Maps an HTTP error status and body to an [`LlmError`].
fn http_error(provider: &str, status: u16, retry_after: Option<u64>, body: &[u8]) -> LlmError {
    let (message, code) = error_detail(body);
    let provider = provider.to_owned();
    let detail = format!("HTTP {status}: {message}");
    let lower = message.to_lowercase();
    let overflow = code == "context_length_exceeded"
        || lower.contains("context length")
        || lower.contains("context_length")
        || lower.contains("maximum context")
        || lower.contains("context window");
    match status {
        401 | 403 => LlmError::Authentication {
            provider,
            message: format!("{detail}; check the API key variable (llm.api_key_env)"),
        },
        404 => LlmError::ModelNotFound {
            provider,
            message: format!("{detail}; check llm.model and llm.base_url"),
        },
        429 => LlmError::RateLimited {
            provider,
            retry_after_secs: retry_after,
        },
        413 => LlmError::ContextOverflow {
            provider,
            message: detail,
        },
        400 if overflow => LlmError::ContextOverflow {
            provider,
            message: detail,
        },
        _ => LlmError::Other {
            provider,
            message: detail,
        },
    }
}

/// `s` trimmed, cut after 300 characters.
pub(crate) fn excerpt(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

fn malformed(provider: &str, what: String) -> LlmError {
    LlmError::Other {
        provider: provider.to_owned(),
        message: format!("malformed chat-completions reply: {what}"),
    }
}

/// Parses a non-streamed chat-completions body.
fn parse_response(provider: &str, body: &[u8]) -> Result<ChatResponse, LlmError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        malformed(
            provider,
            format!(
                "not JSON ({e}): {}",
                excerpt(&String::from_utf8_lossy(body))
            ),
        )
    })?;
    if let Some(err) = v.get("error") {
        return Err(malformed(
            provider,
            format!("the server sent an error: {err}"),
        ));
    }
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| malformed(provider, "no choices[0]".into()))?;
    let message = choice
        .get("message")
        .ok_or_else(|| malformed(provider, "no choices[0].message".into()))?;
    let content = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(malformed(
                provider,
                format!("choices[0].message.content is not text: {other}"),
            ));
        }
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls
            .as_array()
            .ok_or_else(|| malformed(provider, "tool_calls is not an array".into()))?;
        for (i, call) in calls.iter().enumerate() {
            let function = call.get("function");
            let name = function
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| malformed(provider, format!("tool_calls[{i}] has no name")))?;
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| format!("call_{i}"));
            let args = function.and_then(|f| f.get("arguments"));
            let arguments = match args {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(s)) => parse_arguments(provider, name, s)?,
                Some(other) => other.clone(),
            };
            tool_calls.push(ToolCall {
                id,
                name: name.to_owned(),
                arguments,
            });
        }
    }
    let finish = choice.get("finish_reason").and_then(Value::as_str);
    Ok(ChatResponse {
        content,
        finish_reason: finish_reason(finish, !tool_calls.is_empty()),
        tool_calls,
        usage: usage(v.get("usage")),
    })
}

fn parse_arguments(provider: &str, tool: &str, text: &str) -> Result<Value, LlmError> {
    if text.trim().is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_str(text).map_err(|e| LlmError::Other {
        provider: provider.to_owned(),
        message: format!(
            "the model called tool {tool:?} with malformed JSON arguments ({e}): {}",
            excerpt(text)
        ),
    })
}

fn finish_reason(reason: Option<&str>, has_tool_calls: bool) -> FinishReason {
    match reason {
        Some("stop") | Some("eos") => FinishReason::Stop,
        Some("tool_calls") | Some("function_call") => FinishReason::ToolUse,
        Some("length") => FinishReason::Length,
        Some(other) => FinishReason::Other(other.to_owned()),
        None if has_tool_calls => FinishReason::ToolUse,
        None => FinishReason::Stop,
    }
}

fn usage(v: Option<&Value>) -> Usage {
    let n = |k: &str| {
        v.and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Usage {
        prompt_tokens: n("prompt_tokens"),
        completion_tokens: n("completion_tokens"),
    }
}

/// Sends a complete reply as deltas (for a server that did not stream).
fn replay_as_deltas(reply: &ChatResponse, tx: &mpsc::UnboundedSender<Delta>) {
    if !reply.content.is_empty() {
        let _ = tx.send(Delta::TextDelta {
            delta: reply.content.clone(),
        });
    }
    for call in &reply.tool_calls {
        let _ = tx.send(Delta::ToolCallStart {
            id: call.id.clone(),
            name: call.name.clone(),
        });
        let _ = tx.send(Delta::ToolCallArgsDelta {
            id: call.id.clone(),
            delta: call.arguments.to_string(),
        });
        let _ = tx.send(Delta::ToolCallEnd {
            id: call.id.clone(),
        });
    }
}

/// One tool call being streamed.
struct StreamedCall {
    index: u64,
    id: String,
    name: String,
    args: String,
}

/// Reassembles a chat-completions event stream.
struct SseState<'a> {
    provider: &'a str,
    tx: &'a mpsc::UnboundedSender<Delta>,
    text: String,
    calls: Vec<StreamedCall>,
    finish: Option<String>,
    usage: Option<Usage>,
    done: bool,
    /// Bytes of a line not yet complete.
    pending: Vec<u8>,
}

impl<'a> SseState<'a> {
    fn new(provider: &'a str, tx: &'a mpsc::UnboundedSender<Delta>) -> Self {
        SseState {
            provider,
            tx,
            text: String::new(),
            calls: Vec::new(),
            finish: None,
            usage: None,
            done: false,
            pending: Vec::new(),
        }
    }

    /// Stream bytes as they arrive, cut anywhere (inside a line or a UTF-8
    /// sequence): complete lines are parsed, the rest waits for more. Stops
    /// at `[DONE]`.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), LlmError> {
        self.pending.extend_from_slice(bytes);
        while !self.done
            && let Some(nl) = self.pending.iter().position(|b| *b == b'\n')
        {
            let line: Vec<u8> = self.pending.drain(..=nl).collect();
            self.line(&line)?;
        }
        Ok(())
    }

    /// The stream ended: a last line without its newline still counts.
    fn end(&mut self) -> Result<(), LlmError> {
        if !self.done && !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.line(&line)?;
        }
        Ok(())
    }

    fn send(&self, delta: Delta) {
        // The receiver may be gone (caller stopped listening); keep assembling.
        let _ = self.tx.send(delta);
    }

    /// One line of the stream (with or without its newline).
    fn line(&mut self, raw: &[u8]) -> Result<(), LlmError> {
        let line = String::from_utf8_lossy(raw);
        let line = line.trim_end_matches(['\n', '\r']);
        // Blank lines end an event; `:` lines are comments; `event:`/`id:`
        // lines carry nothing chat-completions needs.
        let Some(data) = line.strip_prefix("data:") else {
            return Ok(());
        };
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let event: Value = serde_json::from_str(data).map_err(|e| {
            malformed(
                self.provider,
                format!("stream event is not JSON ({e}): {}", excerpt(data)),
            )
        })?;
        if let Some(err) = event.get("error") {
            return Err(LlmError::Other {
                provider: self.provider.to_owned(),
                message: format!("the server reported an error mid-stream: {err}"),
            });
        }
        if let Some(u) = event.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage(Some(u)));
        }
        let Some(choice) = event
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            return Ok(());
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta") else {
            return Ok(());
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str)
            && !text.is_empty()
        {
            self.text.push_str(text);
            self.send(Delta::TextDelta {
                delta: text.to_owned(),
            });
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (pos, call) in calls.iter().enumerate() {
                self.tool_call_delta(pos, call)?;
            }
        }
        Ok(())
    }

    fn tool_call_delta(&mut self, pos: usize, call: &Value) -> Result<(), LlmError> {
        let index = call
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(pos as u64);
        let function = call.get("function");
        let args = function
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let at = match self.calls.iter().position(|c| c.index == index) {
            Some(at) => at,
            None => {
                let name = function
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        malformed(
                            self.provider,
                            format!("streamed tool call {index} began without a function name"),
                        )
                    })?;
                let id = call
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("call_{index}"));
                self.send(Delta::ToolCallStart {
                    id: id.clone(),
                    name: name.to_owned(),
                });
                self.calls.push(StreamedCall {
                    index,
                    id,
                    name: name.to_owned(),
                    args: String::new(),
                });
                self.calls.len() - 1
            }
        };
        if !args.is_empty() {
            let c = &mut self.calls[at];
            c.args.push_str(args);
            let id = c.id.clone();
            self.send(Delta::ToolCallArgsDelta {
                id,
                delta: args.to_owned(),
            });
        }
        Ok(())
    }

    fn finish(self) -> Result<ChatResponse, LlmError> {
        if !self.done && self.finish.is_none() {
            return Err(malformed(
                self.provider,
                "the event stream ended before a finish_reason or [DONE]".into(),
            ));
        }
        let mut tool_calls = Vec::new();
        for c in &self.calls {
            self.send(Delta::ToolCallEnd { id: c.id.clone() });
        }
        for c in self.calls {
            let arguments = parse_arguments(self.provider, &c.name, &c.args)?;
            tool_calls.push(ToolCall {
                id: c.id,
                name: c.name,
                arguments,
            });
        }
        Ok(ChatResponse {
            content: self.text,
            finish_reason: finish_reason(self.finish.as_deref(), !tool_calls.is_empty()),
            tool_calls,
            usage: self.usage.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolSpec;

    #[test]
    fn request_body_has_the_chat_completions_shape() {
        let options = OpenAiOptions::new("http://127.0.0.1:1/v1", "m1");
        let req = ChatRequest {
            model: None,
            messages: vec![
                ChatMessage::text(Role::User, "weather?"),
                ChatMessage {
                    role: Role::Assistant,
                    content: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "weather".into(),
                        arguments: json!({"city": "Paris"}),
                    }],
                    tool_call_id: None,
                },
                ChatMessage {
                    role: Role::Tool,
                    content: "sunny".into(),
                    tool_calls: Vec::new(),
                    tool_call_id: Some("c1".into()),
                },
            ],
            tools: vec![ToolSpec {
                name: "weather".into(),
                description: "looks it up".into(),
                parameters: json!({"type": "object"}),
            }],
            max_tokens: Some(10),
            temperature: None,
            system_prompt: Some("be brief".into()),
            ..ChatRequest::default()
        };
        let body = request_body(&options, &req, true);
        assert_eq!(
            body,
            json!({
                "model": "m1",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
                ],
                "tools": [{"type": "function", "function": {"name": "weather", "description": "looks it up", "parameters": {"type": "object"}}}],
                "max_tokens": 10,
                "stream": true,
                "stream_options": {"include_usage": true}
            })
        );
        // plugd.yaml's stop sequences and tool choice, in OpenAI's words.
        let mut req = req;
        req.stop_sequences = vec!["\nUser:".into()];
        for (choice, want) in [
            (ToolChoice::Auto, json!("auto")),
            (ToolChoice::Any, json!("required")),
            (ToolChoice::None, json!("none")),
            (
                ToolChoice::Specific {
                    name: "weather".into(),
                },
                json!({"type": "function", "function": {"name": "weather"}}),
            ),
        ] {
            req.tool_choice = Some(choice);
            let body = request_body(&options, &req, false);
            assert_eq!(body["stop"], json!(["\nUser:"]));
            assert_eq!(body["tool_choice"], want);
        }
        // Without tools, no tool_choice (OpenAI would refuse it).
        req.tools.clear();
        assert_eq!(request_body(&options, &req, false).get("tool_choice"), None);
    }

    #[test]
    fn http_errors_map_to_typed_errors() {
        let body = br#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#;
        assert!(matches!(
            http_error("o", 400, None, body),
            LlmError::ContextOverflow { .. }
        ));
        assert!(matches!(
            http_error("o", 400, None, b"bad request"),
            LlmError::Other { .. }
        ));
        assert!(matches!(
            http_error("o", 429, Some(7), b""),
            LlmError::RateLimited {
                retry_after_secs: Some(7),
                ..
            }
        ));
        let e = http_error("o", 401, None, br#"{"error":{"message":"bad key"}}"#);
        assert!(matches!(e, LlmError::Authentication { .. }));
        assert!(e.to_string().contains("bad key"), "{e}");
        assert!(matches!(
            http_error("o", 404, None, b"nope"),
            LlmError::ModelNotFound { .. }
        ));
    }

    #[test]
    fn sse_lines_assemble_text_and_tool_calls() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut s = SseState::new("o", &tx);
        for line in [
            ": keep-alive",
            r#"data: {"choices":[{"delta":{"role":"assistant","content":"Hi"}}]}"#,
            "",
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c9","type":"function","function":{"name":"t","arguments":""}}]}}]}"#,
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]}}]}"#,
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}"#,
            r#"data: {"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6}}"#,
            "data: [DONE]",
        ] {
            s.line(line.as_bytes()).unwrap();
        }
        let r = s.finish().unwrap();
        assert_eq!(r.content, "Hi");
        assert_eq!(r.tool_calls[0].arguments, json!({"a": 1}));
        assert_eq!(r.finish_reason, FinishReason::ToolUse);
        assert_eq!(r.usage.completion_tokens, 6);
        let got: Vec<Delta> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(got[4], Delta::ToolCallEnd { id: "c9".into() });
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::test_json::json_with;
    use proptest::prelude::*;
    use proptest::sample::Index;

    const KEYS: &[&str] = &[
        "choices",
        "delta",
        "message",
        "content",
        "tool_calls",
        "index",
        "id",
        "function",
        "name",
        "arguments",
        "finish_reason",
        "usage",
        "prompt_tokens",
        "completion_tokens",
        "error",
    ];
    const STRINGS: &[&str] = &[
        "stop",
        "tool_calls",
        "length",
        "{}",
        "{\"a\":",
        "1}",
        "[DONE]",
        "data: ",
        "é",
    ];

    fn json() -> BoxedStrategy<Value> {
        json_with(KEYS, STRINGS)
    }

    /// Tool arguments without floats (exact through JSON text).
    fn args() -> impl Strategy<Value = Value> {
        proptest::collection::btree_map(
            "[a-zé]{1,6}",
            prop_oneof![
                any::<i64>().prop_map(|n| json!(n)),
                any::<String>().prop_map(Value::String),
                any::<bool>().prop_map(Value::Bool),
            ],
            0..4,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    /// `s` cut at `cuts` (char boundaries only when `chars`).
    fn pieces(s: &[u8], cuts: &[Index], chars: bool) -> Vec<Vec<u8>> {
        let text = std::str::from_utf8(s).ok();
        let bounds: Vec<usize> = (0..=s.len())
            .filter(|i| !chars || text.is_some_and(|t| t.is_char_boundary(*i)))
            .collect();
        let mut at: Vec<usize> = cuts.iter().map(|c| bounds[c.index(bounds.len())]).collect();
        at.extend([0, s.len()]);
        at.sort_unstable();
        at.windows(2).map(|w| s[w[0]..w[1]].to_vec()).collect()
    }

    fn data(v: Value, tight: bool) -> String {
        if tight {
            format!("data:{v}")
        } else {
            format!("data: {v}")
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn sse_lines_never_panic(lines in proptest::collection::vec(
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..64),
                json().prop_map(|v| format!("data: {v}").into_bytes()),
                "(data:|event:|:| |\\[DONE\\]|\\{|\"|é|\r|\n){0,8}".prop_map(String::into_bytes),
            ],
            0..8,
        )) {
            let (tx, _rx) = mpsc::unbounded_channel();
            let mut s = SseState::new("o", &tx);
            for line in &lines {
                if s.line(line).is_err() {
                    return Ok(());
                }
            }
            let _ = s.finish();
        }

        #[test]
        fn sse_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8)) {
            let (tx, _rx) = mpsc::unbounded_channel();
            let mut s = SseState::new("o", &tx);
            for c in &chunks {
                if s.feed(c).is_err() {
                    return Ok(());
                }
            }
            if s.end().is_ok() {
                let _ = s.finish();
            }
        }

        #[test]
        fn the_response_parser_never_panics(v in json(), bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_response("o", v.to_string().as_bytes());
            let _ = parse_response("o", &bytes);
            let wrapped = json!({"choices": [{"message": v, "finish_reason": "stop"}]});
            let _ = parse_response("o", wrapped.to_string().as_bytes());
        }

        /// A stream of text and interleaved tool-call argument deltas, its
        /// bytes cut anywhere (inside `data:` lines and UTF-8 sequences),
        /// reassembles to what was sent.
        #[test]
        fn streams_cut_anywhere_reassemble(
            texts in proptest::collection::vec(any::<String>(), 0..5),
            calls in proptest::collection::vec((args(), proptest::collection::vec(any::<Index>(), 0..5)), 0..3),
            crlf in any::<bool>(),
            tight in any::<bool>(),
            done in any::<bool>(),
            cuts in proptest::collection::vec(any::<Index>(), 0..12),
        ) {
            let mut lines = vec![": keep-alive".to_owned()];
            for t in &texts {
                lines.push(data(json!({"choices": [{"delta": {"content": t}}]}), tight));
                lines.push(String::new());
            }
            let arg_pieces: Vec<Vec<String>> = calls
                .iter()
                .map(|(a, cuts)| {
                    pieces(a.to_string().as_bytes(), cuts, true)
                        .into_iter()
                        .map(|p| String::from_utf8(p).unwrap())
                        .collect()
                })
                .collect();
            for (i, _) in calls.iter().enumerate() {
                lines.push(data(json!({"choices": [{"delta": {"tool_calls": [
                    {"index": i, "id": format!("c{i}"), "type": "function",
                     "function": {"name": format!("t{i}"), "arguments": ""}}]}}]}), tight));
            }
            let rounds = arg_pieces.iter().map(Vec::len).max().unwrap_or(0);
            for r in 0..rounds {
                for (i, p) in arg_pieces.iter().enumerate() {
                    if let Some(piece) = p.get(r) {
                        lines.push(data(json!({"choices": [{"delta": {"tool_calls": [
                            {"index": i, "function": {"arguments": piece}}]}}]}), tight));
                    }
                }
            }
            lines.push(data(json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}), tight));
            if done {
                lines.push("data: [DONE]".into());
            }
            let eol = if crlf { "\r\n" } else { "\n" };
            let body = lines.join(eol);

            let (tx, mut rx) = mpsc::unbounded_channel();
            let mut s = SseState::new("o", &tx);
            for chunk in pieces(body.as_bytes(), &cuts, false) {
                s.feed(&chunk).unwrap();
            }
            s.end().unwrap();
            let r = s.finish().unwrap();
            prop_assert_eq!(&r.content, &texts.concat());
            let want: Vec<ToolCall> = calls
                .iter()
                .enumerate()
                .map(|(i, (a, _))| ToolCall { id: format!("c{i}"), name: format!("t{i}"), arguments: a.clone() })
                .collect();
            prop_assert_eq!(&r.tool_calls, &want);

            let mut streamed = String::new();
            let mut args: Vec<String> = vec![String::new(); calls.len()];
            while let Ok(d) = rx.try_recv() {
                match d {
                    Delta::TextDelta { delta } => streamed.push_str(&delta),
                    Delta::ToolCallArgsDelta { id, delta } => {
                        let i: usize = id[1..].parse().unwrap();
                        args[i].push_str(&delta);
                    }
                    _ => {}
                }
            }
            prop_assert_eq!(streamed, texts.concat());
            for (i, (a, _)) in calls.iter().enumerate() {
                prop_assert_eq!(&args[i], &a.to_string());
            }
        }
    }
}
