//! `sampling/createMessage` of a hosted MCP server, the agent side: once
//! the runtime has checked that the operator allows it for that server and
//! that plugd.yaml has an `llm:` (`plugd_runtime::mcp_requests`), the
//! request is mapped to the provider's shape ([`chat_request`]: anything
//! plugd cannot pass on faithfully is refused, never dropped), bounded to
//! [`MAX_IN_FLIGHT`] at once per server, sent to the configured provider and
//! its reply mapped back (`stopReason` in MCP's words).

use plugd_runtime::Runtime;
use plugd_runtime::mcp_requests::{
    MAX_IN_FLIGHT, MAX_SAMPLING_BYTES, MAX_SAMPLING_MESSAGES, sampling_refused, short,
};
use plugd_wire::{ErrorObject, codes};
use serde_json::{Value, json};

use crate::llm::{
    ChatMessage, ChatRequest, FinishReason, LlmConfig, MAX_STOP_SEQUENCE, MAX_STOP_SEQUENCES, Role,
};

fn invalid_params(message: String) -> ErrorObject {
    ErrorObject::new(codes::INVALID_PARAMS, message)
}

/// Samples for `server` with the provider `llm` describes; `cap` bounds
/// `maxTokens` (`mcp.servers.NAME.sampling_max_tokens`).
pub async fn sample(
    rt: &Runtime,
    server: &str,
    llm: &LlmConfig,
    params: &Value,
    cap: u32,
) -> Result<Value, ErrorObject> {
    let request = chat_request(params, cap)?;
    let Some(_slot) = rt.mcp_request_slot(server, "sampling") else {
        return Err(sampling_refused(format!(
            "server {server:?} already has {MAX_IN_FLIGHT} sampling requests running; plugd refuses more until they finish"
        )));
    };
    let provider = crate::llm::build_provider(llm, rt, rt.dir())
        .await
        .map_err(|e| ErrorObject::new(codes::INTERNAL_ERROR, format!("sampling failed: {e}")))?;
    tracing::info!(plugin = %server, messages = request.messages.len(), max_tokens = ?request.max_tokens, "sampling for an MCP server");
    let reply = provider.chat(&request, None).await.map_err(|e| {
        tracing::warn!(plugin = %server, error = %e, "sampling failed");
        ErrorObject::new(codes::INTERNAL_ERROR, format!("sampling failed: {e}"))
    })?;
    if reply.content.is_empty() && !reply.tool_calls.is_empty() {
        return Err(ErrorObject::new(
            codes::INTERNAL_ERROR,
            "sampling failed: the model answered with tool calls only, and this request offered no tools".to_owned(),
        ));
    }
    let model = match llm {
        LlmConfig::Openai { model, .. } | LlmConfig::Plugin { model, .. } => model.clone(),
        LlmConfig::Scripted { .. } => "scripted".to_owned(),
    };
    let stop = match &reply.finish_reason {
        FinishReason::Stop => "endTurn".to_owned(),
        FinishReason::Length => "maxTokens".to_owned(),
        FinishReason::ToolUse => "toolUse".to_owned(),
        FinishReason::Other(s) => s.clone(),
    };
    Ok(json!({
        "role": "assistant",
        "content": {"type": "text", "text": reply.content},
        "model": model,
        "stopReason": stop,
    }))
}

/// Maps `sampling/createMessage` params to a provider request: roles `user`
/// and `assistant`, text content (one block or a list; several text blocks
/// joined by newlines), `systemPrompt`, `temperature`, `stopSequences`, and
/// `maxTokens` cut to `cap`. Anything plugd cannot pass on faithfully
/// (images, audio, tool use) is refused, never dropped.
pub fn chat_request(params: &Value, cap: u32) -> Result<ChatRequest, ErrorObject> {
    let Some(messages) = params.get("messages").and_then(Value::as_array) else {
        return Err(invalid_params(
            "sampling/createMessage needs a \"messages\" array".into(),
        ));
    };
    if messages.len() > MAX_SAMPLING_MESSAGES {
        return Err(invalid_params(format!(
            "sampling/createMessage has {} messages; plugd passes on at most {MAX_SAMPLING_MESSAGES}",
            messages.len()
        )));
    }
    if params.get("tools").is_some_and(|t| !t.is_null()) {
        return Err(invalid_params(
            "sampling/createMessage with \"tools\": plugd does not offer tool use in sampling (it does not declare sampling.tools)".into(),
        ));
    }
    let mut bytes = 0usize;
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            other => {
                return Err(invalid_params(format!(
                    "messages[{i}].role must be \"user\" or \"assistant\", got {}",
                    other.map_or("nothing".to_owned(), |r| format!(
                        "{:?}",
                        r.chars().take(40).collect::<String>()
                    ))
                )));
            }
        };
        let blocks: Vec<&Value> = match m.get("content") {
            Some(Value::Array(list)) => list.iter().collect(),
            Some(one @ Value::Object(_)) => vec![one],
            _ => {
                return Err(invalid_params(format!(
                    "messages[{i}].content must be a content block or a list of them"
                )));
            }
        };
        let mut texts = Vec::with_capacity(blocks.len());
        for (j, b) in blocks.iter().enumerate() {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => match b.get("text").and_then(Value::as_str) {
                    Some(t) => texts.push(t),
                    None => {
                        return Err(invalid_params(format!(
                            "messages[{i}].content[{j}] is a text block without a string \"text\""
                        )));
                    }
                },
                Some(kind @ ("image" | "audio")) => {
                    return Err(invalid_params(format!(
                        "messages[{i}].content[{j}] is {kind}: plugd's LLM providers take text only, so it cannot be passed on; send text"
                    )));
                }
                other => {
                    return Err(invalid_params(format!(
                        "messages[{i}].content[{j}] has type {}, which plugd cannot pass on to its LLM provider",
                        other.map_or("none".to_owned(), |t| format!(
                            "{:?}",
                            t.chars().take(40).collect::<String>()
                        ))
                    )));
                }
            }
        }
        let text = texts.join("\n");
        bytes += text.len();
        out.push(ChatMessage::text(role, text));
    }
    let system_prompt = match params.get("systemPrompt") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            bytes += s.len();
            Some(s.clone())
        }
        Some(_) => return Err(invalid_params("\"systemPrompt\" must be a string".into())),
    };
    if bytes > MAX_SAMPLING_BYTES {
        return Err(invalid_params(format!(
            "sampling/createMessage carries {bytes} bytes of text; plugd passes on at most {MAX_SAMPLING_BYTES}"
        )));
    }
    let max_tokens = match params.get("maxTokens") {
        None | Some(Value::Null) => cap,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => u32::try_from(n).unwrap_or(u32::MAX).min(cap),
            _ => {
                return Err(invalid_params(format!(
                    "\"maxTokens\" must be a positive integer, got {}",
                    short(v)
                )));
            }
        },
    };
    let temperature = match params.get("temperature") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_f64() {
            Some(t) if t.is_finite() && (0.0..=2.0).contains(&t) => Some(t),
            _ => {
                return Err(invalid_params(format!(
                    "\"temperature\" must be a number from 0 to 2, got {}",
                    short(v)
                )));
            }
        },
    };
    let stop_sequences = match params.get("stopSequences") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list))
            if list.len() <= MAX_STOP_SEQUENCES
                && list.iter().all(|s| {
                    s.as_str()
                        .is_some_and(|s| !s.is_empty() && s.len() <= MAX_STOP_SEQUENCE)
                }) =>
        {
            list.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        }
        Some(_) => {
            return Err(invalid_params(format!(
                "\"stopSequences\" must be at most {} strings of 1-{} bytes",
                MAX_STOP_SEQUENCES, MAX_STOP_SEQUENCE
            )));
        }
    };
    Ok(ChatRequest {
        model: None,
        messages: out,
        max_tokens: Some(max_tokens),
        temperature,
        system_prompt,
        stop_sequences,
        ..ChatRequest::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_messages_map_faithfully_and_max_tokens_is_cut() {
        let r = chat_request(
            &json!({
                "messages": [
                    {"role": "user", "content": {"type": "text", "text": "hi"}},
                    {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                ],
                "systemPrompt": "be brief",
                "maxTokens": 100_000,
                "temperature": 0.5,
                "stopSequences": ["END"],
                "modelPreferences": {"hints": [{"name": "x"}]},
            }),
            64,
        )
        .unwrap();
        assert_eq!(
            r.messages,
            vec![
                ChatMessage::text(Role::User, "hi"),
                ChatMessage::text(Role::Assistant, "a\nb")
            ]
        );
        assert_eq!(r.max_tokens, Some(64), "cut to the operator's bound");
        assert_eq!(r.system_prompt.as_deref(), Some("be brief"));
        assert_eq!(r.temperature, Some(0.5));
        assert_eq!(r.stop_sequences, vec!["END".to_owned()]);
        let r = chat_request(&json!({"messages": [], "maxTokens": 10}), 64).unwrap();
        assert_eq!(r.max_tokens, Some(10), "a smaller request keeps its own");
    }

    #[test]
    fn sampling_refuses_what_it_cannot_pass_on() {
        let img = json!({"messages": [{"role": "user", "content": {"type": "image", "data": "AA==", "mimeType": "image/png"}}], "maxTokens": 5});
        let e = chat_request(&img, 64).unwrap_err();
        assert_eq!(e.code, codes::INVALID_PARAMS);
        assert!(
            e.message.contains("messages[0].content[0] is image"),
            "{}",
            e.message
        );
        for (bad, wants) in [
            (json!({}), "\"messages\" array"),
            (
                json!({"messages": [{"role": "system", "content": {"type": "text", "text": "x"}}]}),
                "messages[0].role",
            ),
            (json!({"messages": [], "maxTokens": 0}), "maxTokens"),
            (json!({"messages": [], "maxTokens": "5"}), "maxTokens"),
            (json!({"messages": [], "temperature": 9}), "temperature"),
            (json!({"messages": [], "tools": []}), "tool use"),
            (
                json!({"messages": [], "stopSequences": [""]}),
                "stopSequences",
            ),
            (
                json!({"messages": [{"role": "user", "content": {"type": "tool_use"}}]}),
                "\"tool_use\"",
            ),
        ] {
            let e = chat_request(&bad, 64).unwrap_err();
            assert!(e.message.contains(wants), "{bad}: {}", e.message);
        }
        let many: Vec<Value> = (0..=MAX_SAMPLING_MESSAGES)
            .map(|_| json!({"role": "user", "content": {"type": "text", "text": "x"}}))
            .collect();
        assert!(chat_request(&json!({"messages": many}), 64).is_err());
        let big = "x".repeat(MAX_SAMPLING_BYTES + 1);
        let e = chat_request(
            &json!({"messages": [{"role": "user", "content": {"type": "text", "text": big}}]}),
            64,
        )
        .unwrap_err();
        assert!(e.message.contains("bytes of text"), "{}", e.message);
    }
}
