//! The host side of nexo §5.y `llm.chat`: plugin LLM providers, sync and streaming.
//!
//! A native plugin that declares `[plugin.extends].llm_providers` answers
//! `llm.chat {provider, model, stream, request}` with a result
//! `{content: {type: text|tool_calls, ..}, usage, finish_reason: {kind, reason?}}`.
//! When `stream` is true it first sends `llm.chat.delta {request_id, chunk}`
//! notifications; [`NativeProtocol`] turns them into per-request events so
//! [`Peer::call_with`] hands them to the call that asked. [`chat`] merges
//! the streamed chunks into the complete reply (the final result of a
//! stream usually carries empty text). Typed errors `-33101..-33105` map to
//! [`LlmCallError`] variants.
//!
//! This module knows only the wire; `plugd-runtime` maps [`LlmReply`] onto
//! its provider contract and streams the [`Delta`]s of [`LlmChunk`]s as they are.

use std::time::Duration;

use plugd_wire::{ErrorObject, Framing, Id, codes};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::peer::{CallError, Peer};
use crate::protocol::{Incoming, JsonRpc, Protocol, decode_jsonrpc};

/// The request method.
pub const LLM_CHAT: &str = "llm.chat";
/// The streaming notification method.
pub const LLM_CHAT_DELTA: &str = "llm.chat.delta";
/// Default deadline of a sync `llm.chat` (§5.y).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// Default deadline of a streaming `llm.chat` (§5.y).
pub const STREAM_TIMEOUT: Duration = Duration::from_secs(300);
/// The operator override of both deadlines, in milliseconds.
pub const TIMEOUT_ENV: &str = "NEXO_PLUGIN_LLM_TIMEOUT_MS";

/// `-33101`: the plugin could not reach its model.
pub const LLM_CONNECTION_FAILED: i64 = -33101;
/// `-33102`: the model refused the plugin's credentials.
pub const LLM_AUTHENTICATION_FAILED: i64 = -33102;
/// `-33103`: rate limited (`data.retry_after_secs`).
pub const LLM_RATE_LIMITED: i64 = -33103;
/// `-33104`: unknown model.
pub const LLM_MODEL_NOT_FOUND: i64 = -33104;
/// `-33105`: the conversation does not fit the context.
pub const LLM_CONTEXT_OVERFLOW: i64 = -33105;

/// The deadline of one call: `override_ms` (the value of
/// [`TIMEOUT_ENV`], if set) for both modes, else 60 s sync / 300 s streaming.
/// An override that is not a positive integer is an error naming the variable.
pub fn llm_timeout(override_ms: Option<&str>, stream: bool) -> Result<Duration, String> {
    let default = if stream { STREAM_TIMEOUT } else { SYNC_TIMEOUT };
    crate::extensions::override_ms(TIMEOUT_ENV, override_ms, default)
}

/// The envelope of the native dialect: line-delimited JSON-RPC, where an
/// `llm.chat.delta` notification is an event of the request it names
/// (`params.request_id`; when absent, of the one call in flight that
/// collects events). Everything else is plain [`JsonRpc::LINES`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NativeProtocol;

impl Protocol for NativeProtocol {
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
        match decode_jsonrpc(bytes)? {
            Incoming::Notification { method, params } if method == LLM_CHAT_DELTA => {
                let mut params = params.unwrap_or(Value::Null);
                let request_id = params.get("request_id").and_then(Value::as_i64);
                let event = params
                    .get_mut("chunk")
                    .map(Value::take)
                    .unwrap_or(Value::Null);
                Ok(Incoming::Event { request_id, event })
            }
            other => Ok(other),
        }
    }
}

/// Token counts as the plugin reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlmUsage {
    /// Input tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Output tokens.
    #[serde(default)]
    pub completion_tokens: u64,
}

/// `finish_reason: {kind, reason?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlmFinish {
    /// `stop`, `tool_use`, `length` or `other`.
    pub kind: String,
    /// Detail for `other`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One tool call in a reply (`arguments` parsed when the plugin sent a
/// JSON string).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmToolCall {
    /// Call id.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments (a JSON value).
    #[serde(default)]
    pub arguments: Value,
}

/// A piece of a streamed answer (nexo `llm.chat.delta` chunk types): the
/// part of a chunk a caller sees while the answer streams. Every LLM
/// provider of plugd streams this one type (`plugd-runtime`'s `llm::Delta`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Delta {
    /// More text.
    TextDelta {
        /// The text.
        delta: String,
    },
    /// A tool call begins.
    ToolCallStart {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// More of a tool call's arguments (JSON text).
    ToolCallArgsDelta {
        /// Call id.
        id: String,
        /// Argument text.
        delta: String,
    },
    /// A tool call is complete.
    ToolCallEnd {
        /// Call id.
        id: String,
    },
}

impl Delta {
    /// The `type` of each delta chunk.
    const TYPES: [&'static str; 4] = [
        "text_delta",
        "tool_call_start",
        "tool_call_args_delta",
        "tool_call_end",
    ];
}

/// One streamed chunk (`llm.chat.delta` `params.chunk`): a [`Delta`], or
/// what the final reply folds in.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum LlmChunk {
    /// Text or tool-call parts.
    Delta(Delta),
    /// Token counts so far, the end, or a chunk type this host does not know.
    Meta(ChunkMeta),
}

/// The chunks of a stream that are not a [`Delta`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChunkMeta {
    /// Token counts so far.
    Usage {
        /// The counts.
        usage: LlmUsage,
    },
    /// The stream ends.
    End {
        /// Why the model stopped.
        finish_reason: LlmFinish,
    },
    /// A chunk type this host does not know (skipped, for forward compatibility).
    #[serde(other)]
    Unknown,
}

impl<'de> Deserialize<'de> for LlmChunk {
    /// By the chunk's `type`: a delta type reads as a [`Delta`] (its errors
    /// are the delta's), any other as a [`ChunkMeta`].
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let v = Value::deserialize(d)?;
        let kind = v.get("type").and_then(Value::as_str);
        if kind.is_some_and(|k| Delta::TYPES.contains(&k)) {
            Delta::deserialize(v)
                .map(LlmChunk::Delta)
                .map_err(D::Error::custom)
        } else {
            ChunkMeta::deserialize(v)
                .map(LlmChunk::Meta)
                .map_err(D::Error::custom)
        }
    }
}

/// The complete reply of one `llm.chat`, streamed parts merged in.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmReply {
    /// The text (streamed text when the final result carries none).
    pub text: String,
    /// Tool calls, in order.
    pub tool_calls: Vec<LlmToolCall>,
    /// Token counts.
    pub usage: LlmUsage,
    /// Why the model stopped (`stop` when the plugin said nothing).
    pub finish_reason: LlmFinish,
    /// The optional `cache_usage` object, as sent.
    pub cache_usage: Option<Value>,
}

/// Why an `llm.chat` failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LlmCallError {
    /// `-33101`.
    #[error("plugin {plugin:?}: llm connection failed: {message}")]
    ConnectionFailed {
        /// Plugin id.
        plugin: String,
        /// The plugin's message.
        message: String,
    },
    /// `-33102`.
    #[error("plugin {plugin:?}: llm authentication failed: {message}")]
    AuthenticationFailed {
        /// Plugin id.
        plugin: String,
        /// The plugin's message.
        message: String,
    },
    /// `-33103`.
    #[error("plugin {plugin:?}: llm rate limited: {message}{}", retry_after_secs.map(|s| format!("; retry after {s}s")).unwrap_or_default())]
    RateLimited {
        /// Plugin id.
        plugin: String,
        /// The plugin's message.
        message: String,
        /// `data.retry_after_secs`.
        retry_after_secs: Option<u64>,
    },
    /// `-33104`.
    #[error("plugin {plugin:?}: llm model not found: {message}")]
    ModelNotFound {
        /// Plugin id.
        plugin: String,
        /// The plugin's message.
        message: String,
    },
    /// `-33105`.
    #[error("plugin {plugin:?}: llm context overflow: {message}")]
    ContextOverflow {
        /// Plugin id.
        plugin: String,
        /// The plugin's message.
        message: String,
    },
    /// `-32601`: the plugin does not implement `llm.chat`.
    #[error(
        "plugin {plugin:?} does not implement llm.chat (method not found); it must serve the providers it declares in [plugin.extends].llm_providers"
    )]
    NotImplemented {
        /// Plugin id.
        plugin: String,
    },
    /// The reply or a chunk does not have the §5.y shape.
    #[error("plugin {plugin:?}: malformed llm.chat reply: {reason}")]
    Malformed {
        /// Plugin id.
        plugin: String,
        /// What is wrong.
        reason: String,
    },
    /// Any other failure of the call (other error codes, timeout, crash).
    #[error(transparent)]
    Call(#[from] CallError),
}

/// Maps an `llm.chat` error reply to a typed [`LlmCallError`].
pub fn map_llm_error(plugin: &str, err: CallError) -> LlmCallError {
    let CallError::Remote { error, .. } = &err else {
        return LlmCallError::Call(err);
    };
    let ErrorObject {
        code,
        message,
        data,
    } = (**error).clone();
    let plugin = plugin.to_owned();
    match code {
        LLM_CONNECTION_FAILED => LlmCallError::ConnectionFailed { plugin, message },
        LLM_AUTHENTICATION_FAILED => LlmCallError::AuthenticationFailed { plugin, message },
        LLM_RATE_LIMITED => LlmCallError::RateLimited {
            plugin,
            message,
            retry_after_secs: data
                .as_ref()
                .and_then(|d| d.get("retry_after_secs"))
                .and_then(Value::as_u64),
        },
        LLM_MODEL_NOT_FOUND => LlmCallError::ModelNotFound { plugin, message },
        LLM_CONTEXT_OVERFLOW => LlmCallError::ContextOverflow { plugin, message },
        codes::METHOD_NOT_FOUND => LlmCallError::NotImplemented { plugin },
        _ => LlmCallError::Call(err),
    }
}

/// Sends `llm.chat {provider, model, stream, request}` and returns the
/// complete reply. With `stream`, each `llm.chat.delta` chunk is passed to
/// `deltas` (if given) as it arrives, and the chunks are merged into the
/// reply. `timeout` covers the whole call (see [`llm_timeout`]).
pub async fn chat(
    peer: &Peer,
    provider: &str,
    model: &str,
    request: &Value,
    stream: bool,
    mut deltas: Option<&mut (dyn FnMut(&LlmChunk) + Send)>,
    timeout: Duration,
) -> Result<LlmReply, LlmCallError> {
    let plugin = peer.plugin().to_string();
    let params = json!({
        "provider": provider,
        "model": model,
        "stream": stream,
        "request": request,
    });
    let (tx, mut rx) = mpsc::unbounded_channel();
    let events = stream.then_some(tx);
    let call = peer.call_with(LLM_CHAT, Some(params), timeout, events);
    let mut merged = Merge::default();
    let pump = async {
        // Ends when the call's event sink is dropped (answer, timeout, crash).
        while let Some(event) = rx.recv().await {
            match serde_json::from_value::<LlmChunk>(event) {
                Ok(chunk) => {
                    merged.add(&chunk);
                    if let Some(f) = deltas.as_deref_mut() {
                        f(&chunk);
                    }
                }
                Err(e) => {
                    merged
                        .malformed
                        .get_or_insert(format!("llm.chat.delta chunk: {e}"));
                }
            }
        }
    };
    let (result, ()) = tokio::join!(call, pump);
    let result = result.map_err(|e| map_llm_error(&plugin, e))?;
    let malformed = |reason: String| LlmCallError::Malformed {
        plugin: plugin.clone(),
        reason,
    };
    if let Some(reason) = merged.malformed.take() {
        return Err(malformed(reason));
    }
    merged.finish(&result).map_err(malformed)
}

/// Streamed parts collected while the call runs.
#[derive(Default)]
struct Merge {
    text: String,
    /// Tool calls in start order: id, name, argument text.
    calls: Vec<(String, String, String)>,
    usage: Option<LlmUsage>,
    finish: Option<LlmFinish>,
    malformed: Option<String>,
}

impl Merge {
    fn add(&mut self, chunk: &LlmChunk) {
        match chunk {
            LlmChunk::Delta(Delta::TextDelta { delta }) => self.text.push_str(delta),
            LlmChunk::Delta(Delta::ToolCallStart { id, name }) => {
                self.calls.push((id.clone(), name.clone(), String::new()))
            }
            LlmChunk::Delta(Delta::ToolCallArgsDelta { id, delta }) => {
                match self.calls.iter_mut().find(|c| &c.0 == id) {
                    Some(call) => call.2.push_str(delta),
                    None => {
                        self.malformed.get_or_insert(format!(
                            "tool_call_args_delta for call {id:?}, which no tool_call_start began"
                        ));
                    }
                }
            }
            LlmChunk::Delta(Delta::ToolCallEnd { .. }) | LlmChunk::Meta(ChunkMeta::Unknown) => {}
            LlmChunk::Meta(ChunkMeta::Usage { usage }) => self.usage = Some(*usage),
            LlmChunk::Meta(ChunkMeta::End { finish_reason }) => {
                self.finish = Some(finish_reason.clone())
            }
        }
    }

    /// The final result, with streamed parts filling what it leaves empty.
    fn finish(self, result: &Value) -> Result<LlmReply, String> {
        let Some(obj) = result.as_object() else {
            return Err(format!(
                "the result must be an object, got {}",
                preview(result)
            ));
        };
        let (mut text, mut tool_calls) = (String::new(), Vec::new());
        match obj.get("content") {
            None | Some(Value::Null) => {}
            Some(content) => match content.get("type").and_then(Value::as_str) {
                Some("text") => {
                    text = match content.get("text") {
                        None | Some(Value::Null) => String::new(),
                        Some(Value::String(s)) => s.clone(),
                        Some(other) => {
                            return Err(format!(
                                "content.text must be a string, got {}",
                                preview(other)
                            ));
                        }
                    }
                }
                Some("tool_calls") => {
                    let calls = content
                        .get("tool_calls")
                        .and_then(Value::as_array)
                        .ok_or("content.tool_calls must be an array")?;
                    for (i, call) in calls.iter().enumerate() {
                        tool_calls.push(tool_call(i, call)?);
                    }
                }
                _ => {
                    return Err(format!(
                        "content.type must be \"text\" or \"tool_calls\", got {}",
                        preview(content.get("type").unwrap_or(&Value::Null))
                    ));
                }
            },
        }
        if text.is_empty() {
            text = self.text;
        }
        if tool_calls.is_empty() {
            for (id, name, args) in self.calls {
                let arguments = parse_arguments(&name, &Value::String(args))?;
                tool_calls.push(LlmToolCall {
                    id,
                    name,
                    arguments,
                });
            }
        }
        let usage = match obj.get("usage") {
            None | Some(Value::Null) => self.usage.unwrap_or_default(),
            Some(u) => serde_json::from_value(u.clone()).map_err(|e| format!("usage: {e}"))?,
        };
        let finish_reason = match obj.get("finish_reason") {
            None | Some(Value::Null) => self.finish.unwrap_or_else(|| LlmFinish {
                kind: if tool_calls.is_empty() {
                    "stop"
                } else {
                    "tool_use"
                }
                .to_owned(),
                reason: None,
            }),
            Some(f) => {
                serde_json::from_value(f.clone()).map_err(|e| format!("finish_reason: {e}"))?
            }
        };
        Ok(LlmReply {
            text,
            tool_calls,
            usage,
            finish_reason,
            cache_usage: obj.get("cache_usage").cloned().filter(|v| !v.is_null()),
        })
    }
}

fn tool_call(i: usize, call: &Value) -> Result<LlmToolCall, String> {
    let field = |k: &str| {
        call.get(k)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("content.tool_calls[{i}].{k} must be a string"))
    };
    let name = field("name")?;
    let id = field("id")?;
    let arguments = parse_arguments(&name, call.get("arguments").unwrap_or(&Value::Null))?;
    Ok(LlmToolCall {
        id,
        name,
        arguments,
    })
}

/// Arguments as a JSON value: objects as sent, JSON text parsed, nothing as `{}`.
fn parse_arguments(tool: &str, raw: &Value) -> Result<Value, String> {
    match raw {
        Value::Null => Ok(json!({})),
        Value::String(s) if s.trim().is_empty() => Ok(json!({})),
        Value::String(s) => serde_json::from_str(s).map_err(|e| {
            format!(
                "tool call {tool:?} has malformed arguments ({e}): {}",
                preview(raw)
            )
        }),
        other => Ok(other.clone()),
    }
}

fn preview(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 120 {
        return s;
    }
    let mut end = 120;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::{NoHandler, PeerConfig};
    use std::sync::Arc;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    #[test]
    fn delta_notifications_become_events_of_their_request() {
        let frame = br#"{"jsonrpc":"2.0","method":"llm.chat.delta","params":{"request_id":51,"chunk":{"type":"text_delta","delta":"Hello"}}}"#;
        assert_eq!(
            NativeProtocol.decode(frame).unwrap(),
            Incoming::Event {
                request_id: Some(51),
                event: json!({"type":"text_delta","delta":"Hello"}),
            }
        );
        let other = br#"{"jsonrpc":"2.0","method":"broker.publish","params":{}}"#;
        assert!(matches!(
            NativeProtocol.decode(other).unwrap(),
            Incoming::Notification { .. }
        ));
    }

    #[test]
    fn timeouts_follow_the_contract_and_the_override() {
        assert_eq!(llm_timeout(None, false).unwrap(), SYNC_TIMEOUT);
        assert_eq!(llm_timeout(None, true).unwrap(), STREAM_TIMEOUT);
        assert_eq!(
            llm_timeout(Some("1500"), true).unwrap(),
            Duration::from_millis(1500)
        );
        let err = llm_timeout(Some("soon"), false).unwrap_err();
        assert!(
            err.contains(TIMEOUT_ENV) && err.contains("\"soon\""),
            "{err}"
        );
        assert!(llm_timeout(Some("0"), false).is_err());
    }

    fn remote(code: i64, data: Option<Value>) -> CallError {
        CallError::Remote {
            plugin: "p".into(),
            method: LLM_CHAT.into(),
            error: Box::new(ErrorObject {
                code,
                message: "m".into(),
                data,
            }),
        }
    }

    #[test]
    fn typed_errors() {
        let e = map_llm_error("p", remote(-33103, Some(json!({"retry_after_secs": 30}))));
        assert!(matches!(
            e,
            LlmCallError::RateLimited {
                retry_after_secs: Some(30),
                ..
            }
        ));
        assert!(e.to_string().contains("retry after 30s"), "{e}");
        assert!(matches!(
            map_llm_error("p", remote(-33101, None)),
            LlmCallError::ConnectionFailed { .. }
        ));
        assert!(matches!(
            map_llm_error("p", remote(-33102, None)),
            LlmCallError::AuthenticationFailed { .. }
        ));
        assert!(matches!(
            map_llm_error("p", remote(-33104, None)),
            LlmCallError::ModelNotFound { .. }
        ));
        assert!(matches!(
            map_llm_error("p", remote(-33105, None)),
            LlmCallError::ContextOverflow { .. }
        ));
        assert!(matches!(
            map_llm_error("p", remote(-32601, None)),
            LlmCallError::NotImplemented { .. }
        ));
        assert!(matches!(
            map_llm_error("p", remote(-32000, None)),
            LlmCallError::Call(_)
        ));
    }

    #[test]
    fn final_results_and_streamed_parts_merge() {
        let sync = Merge::default()
            .finish(&json!({
                "content": {"type": "tool_calls", "tool_calls": [
                    {"id": "c1", "name": "t", "arguments": {"a": 1}},
                    {"id": "c2", "name": "u", "arguments": "{\"b\": 2}"}
                ]},
                "usage": {"prompt_tokens": 3, "completion_tokens": 4},
                "finish_reason": {"kind": "tool_use"}
            }))
            .unwrap();
        assert_eq!(sync.tool_calls[1].arguments, json!({"b": 2}));
        assert_eq!(sync.usage.completion_tokens, 4);
        assert_eq!(sync.finish_reason.kind, "tool_use");

        let mut m = Merge::default();
        for c in [
            json!({"type":"text_delta","delta":"Hel"}),
            json!({"type":"text_delta","delta":"lo"}),
            json!({"type":"tool_call_start","id":"c1","name":"t"}),
            json!({"type":"tool_call_args_delta","id":"c1","delta":"{\"x\":"}),
            json!({"type":"tool_call_args_delta","id":"c1","delta":"1}"}),
            json!({"type":"tool_call_end","id":"c1"}),
            json!({"type":"usage","usage":{"prompt_tokens":1,"completion_tokens":2}}),
            json!({"type":"end","finish_reason":{"kind":"other","reason":"filtered"}}),
            json!({"type":"from_the_future"}),
        ] {
            m.add(&serde_json::from_value(c).unwrap());
        }
        let r = m
            .finish(&json!({"content": {"type": "text", "text": ""}}))
            .unwrap();
        assert_eq!(r.text, "Hello");
        assert_eq!(r.tool_calls[0].arguments, json!({"x": 1}));
        assert_eq!(r.usage.prompt_tokens, 1);
        assert_eq!(r.finish_reason.reason.as_deref(), Some("filtered"));

        let bad = Merge::default()
            .finish(&json!({"content": {"type": "tool_calls", "tool_calls": [
                {"id": "c1", "name": "lookup", "arguments": "{nope"}]}}))
            .unwrap_err();
        assert!(
            bad.contains("\"lookup\"") && bad.contains("malformed"),
            "{bad}"
        );
        assert!(Merge::default().finish(&json!("text")).is_err());
        assert!(
            Merge::default()
                .finish(&json!({"content": {"type": "image"}}))
                .is_err()
        );
    }

    /// A streaming call over the in-memory transport: chunks reach the
    /// callback in order, before the call returns.
    #[tokio::test]
    async fn streamed_chunks_reach_the_caller_in_order() {
        let config = PeerConfig::with_protocol("p", Arc::new(NativeProtocol));
        let (peer, child) = Peer::memory(config, Arc::new(NoHandler));
        let (r, mut w) = tokio::io::split(child);
        tokio::spawn(async move {
            let mut lines = BufReader::new(r).lines();
            let line = lines.next_line().await.unwrap().unwrap();
            let req: Value = serde_json::from_str(&line).unwrap();
            let id = req["id"].clone();
            assert_eq!(req["params"]["provider"], "echo");
            for d in ["a", "b", "c"] {
                let n = json!({"jsonrpc":"2.0","method":"llm.chat.delta",
                    "params":{"request_id": id, "chunk":{"type":"text_delta","delta": d}}});
                w.write_all(format!("{n}\n").as_bytes()).await.unwrap();
            }
            let done = json!({"jsonrpc":"2.0","id": id,"result":{"content":{"type":"text","text":""},
                "finish_reason":{"kind":"stop"}}});
            w.write_all(format!("{done}\n").as_bytes()).await.unwrap();
            // Keep the pipe open until the host has read everything.
            tokio::time::sleep(Duration::from_secs(1)).await;
        });
        let mut seen = Vec::new();
        let mut sink = |c: &LlmChunk| seen.push(c.clone());
        let reply = chat(
            &peer,
            "echo",
            "m",
            &json!({}),
            true,
            Some(&mut sink),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(reply.text, "abc");
        assert_eq!(
            seen,
            ["a", "b", "c"].map(|d| LlmChunk::Delta(Delta::TextDelta { delta: d.into() }))
        );
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::test_json::json_with;
    use proptest::prelude::*;

    const KEYS: &[&str] = &[
        "type",
        "content",
        "text",
        "tool_calls",
        "id",
        "name",
        "arguments",
        "usage",
        "prompt_tokens",
        "completion_tokens",
        "finish_reason",
        "kind",
        "reason",
        "cache_usage",
        "delta",
        "chunk",
        "request_id",
    ];
    const STRINGS: &[&str] = &[
        "text",
        "tool_calls",
        "text_delta",
        "tool_call_start",
        "tool_call_args_delta",
        "tool_call_end",
        "usage",
        "end",
        "stop",
        "tool_use",
        "{}",
        "{\"a\":1}",
        "{nope",
        "c1",
    ];

    fn json() -> BoxedStrategy<Value> {
        json_with(KEYS, STRINGS)
    }

    /// A tool call's arguments without floats (exact through JSON text).
    fn args() -> impl Strategy<Value = Value> {
        proptest::collection::btree_map(
            "[a-z]{1,6}",
            prop_oneof![
                any::<i64>().prop_map(|n| json!(n)),
                any::<String>().prop_map(Value::String),
                any::<bool>().prop_map(Value::Bool),
                Just(Value::Null),
            ],
            0..4,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    fn finish() -> impl Strategy<Value = LlmFinish> {
        (
            prop_oneof![
                Just("stop"),
                Just("tool_use"),
                Just("length"),
                Just("other")
            ],
            prop::option::of(any::<String>()),
        )
            .prop_map(|(kind, reason)| LlmFinish {
                kind: kind.into(),
                reason,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn the_result_parser_never_panics(v in json(), chunks in proptest::collection::vec(json(), 0..6)) {
            let mut m = Merge::default();
            for c in chunks {
                if let Ok(chunk) = serde_json::from_value::<LlmChunk>(c) {
                    m.add(&chunk);
                }
            }
            let _ = m.finish(&v);
        }

        #[test]
        fn the_chunk_parser_never_panics(chunk in json(), request_id in json()) {
            let _ = serde_json::from_value::<LlmChunk>(chunk.clone());
            let frame = json!({"jsonrpc": "2.0", "method": LLM_CHAT_DELTA,
                "params": {"request_id": request_id, "chunk": chunk}});
            let _ = NativeProtocol.decode(frame.to_string().as_bytes());
        }

        /// A well-formed text reply parses to what was generated.
        #[test]
        fn text_replies_parse_to_what_was_sent(
            text in any::<String>(),
            prompt in any::<u64>(),
            completion in any::<u64>(),
            finish in finish(),
        ) {
            let result = json!({
                "content": {"type": "text", "text": text},
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
                "finish_reason": finish,
            });
            let r = Merge::default().finish(&result).unwrap();
            prop_assert_eq!(r.text, text);
            prop_assert!(r.tool_calls.is_empty());
            prop_assert_eq!(r.usage, LlmUsage { prompt_tokens: prompt, completion_tokens: completion });
            prop_assert_eq!(r.finish_reason, finish);
        }

        /// Tool calls, arguments as objects or as JSON text, parse to what was sent.
        #[test]
        fn tool_call_replies_parse_to_what_was_sent(
            calls in proptest::collection::vec(("[a-z0-9_]{1,8}", "[a-z_.]{1,12}", args(), any::<bool>()), 1..4),
        ) {
            let wire: Vec<Value> = calls
                .iter()
                .map(|(id, name, a, as_text)| {
                    let arguments = if *as_text { json!(a.to_string()) } else { a.clone() };
                    json!({"id": id, "name": name, "arguments": arguments})
                })
                .collect();
            let r = Merge::default()
                .finish(&json!({"content": {"type": "tool_calls", "tool_calls": wire}}))
                .unwrap();
            let want: Vec<LlmToolCall> = calls
                .into_iter()
                .map(|(id, name, arguments, _)| LlmToolCall { id, name, arguments })
                .collect();
            prop_assert_eq!(r.tool_calls, want);
            prop_assert_eq!(r.finish_reason.kind, "tool_use");
        }

        /// Streamed text and argument deltas, cut anywhere, merge to what was sent.
        #[test]
        fn streamed_parts_merge_to_what_was_sent(
            text in any::<String>(),
            text_cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
            a in args(),
            arg_cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let pieces = |s: &str, cuts: &[prop::sample::Index]| -> Vec<String> {
                let bounds: Vec<usize> = (0..=s.len()).filter(|i| s.is_char_boundary(*i)).collect();
                let mut at: Vec<usize> = cuts.iter().map(|c| bounds[c.index(bounds.len())]).collect();
                at.push(0);
                at.push(s.len());
                at.sort_unstable();
                at.windows(2).map(|w| s[w[0]..w[1]].to_owned()).collect()
            };
            let mut m = Merge::default();
            for delta in pieces(&text, &text_cuts) {
                m.add(&LlmChunk::Delta(Delta::TextDelta { delta }));
            }
            m.add(&LlmChunk::Delta(Delta::ToolCallStart { id: "c1".into(), name: "t".into() }));
            for delta in pieces(&a.to_string(), &arg_cuts) {
                m.add(&LlmChunk::Delta(Delta::ToolCallArgsDelta { id: "c1".into(), delta }));
            }
            m.add(&LlmChunk::Delta(Delta::ToolCallEnd { id: "c1".into() }));
            prop_assert!(m.malformed.is_none());
            let r = m.finish(&json!({})).unwrap();
            prop_assert_eq!(r.text, text);
            prop_assert_eq!(&r.tool_calls[0].arguments, &a);
        }
    }
}
