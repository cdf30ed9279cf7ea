//! LLM providers: the OpenAI-compatible client against a local HTTP double,
//! a plugin provider over a real Python plugin (`llm.chat`), and the
//! scripted provider from a file.
//!
//! **Test double**: the OpenAI tests talk to a local HTTP double of the
//! chat-completions API (axum, bound to 127.0.0.1), which issue 4 allows in
//! place of a real model server. It answers by the latest user message:
//! `[status:N]` an HTTP error, `[tool:NAME]` a tool call, `[bad_args]`
//! malformed tool arguments, `[malformed_json]` / `[malformed_sse]` junk,
//! `[slow]` a 5 s delay, `[huge]` a 64 KiB body, else an echo.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use plugd_agent::llm::openai::{OpenAiOptions, OpenAiProvider};
use plugd_agent::llm::plugin::PluginProvider;
use plugd_agent::llm::scripted::ScriptedProvider;
use plugd_agent::llm::{
    ChatMessage, ChatRequest, ChatResponse, Delta, FinishReason, LlmConfig, LlmError, LlmProvider,
    Role, ToolCall, ToolSpec, build_provider,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support::{Ws, quick, repo};

// ---------------------------------------------------------------------------
// The chat-completions double
// ---------------------------------------------------------------------------

#[derive(Default)]
pub(crate) struct Seen {
    bodies: Vec<Value>,
    auth: Vec<Option<String>>,
}

pub(crate) type Shared = Arc<Mutex<Seen>>;

impl Seen {
    /// The request bodies received so far, in order.
    pub(crate) fn bodies(&self) -> &[Value] {
        &self.bodies
    }

    /// The `Authorization` header of each request, in order.
    pub(crate) fn auth(&self) -> &[Option<String>] {
        &self.auth
    }
}

fn latest_user(body: &Value) -> String {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn reply(status: u16, content_type: &str, body: String) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(axum::body::Body::from(body))
        .unwrap()
}

fn sse(events: &[Value]) -> Response {
    let mut body = String::from(": a comment line the client must skip\n\n");
    for e in events {
        body.push_str(&format!("data: {e}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    reply(200, "text/event-stream", body)
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "x", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

async fn completions(State(seen): State<Shared>, headers: HeaderMap, body: String) -> Response {
    let body: Value = serde_json::from_str(&body).expect("the client sends JSON");
    {
        let mut seen = seen.lock().unwrap();
        seen.bodies.push(body.clone());
        seen.auth.push(
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        );
    }
    let user = latest_user(&body);
    let stream = body["stream"] == true;
    let last_is_tool = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .is_some_and(|m| m["role"] == "tool");
    if let Some(rest) = user.split("[status:").nth(1) {
        let status: u16 = rest.split(']').next().unwrap().parse().unwrap();
        let message = match status {
            400 => "This model's maximum context length is 8192 tokens; you asked for 9000",
            401 => "Incorrect API key provided",
            404 => "The model `nope` does not exist",
            429 => "Rate limit reached",
            _ => "the server had an error",
        };
        let code = if status == 400 {
            "context_length_exceeded"
        } else {
            "x"
        };
        let mut r = reply(
            status,
            "application/json",
            json!({"error": {"message": message, "type": "invalid_request_error", "code": code}})
                .to_string(),
        );
        if status == 429 {
            r.headers_mut().insert("retry-after", "12".parse().unwrap());
        }
        return r;
    }
    if user.contains("[slow]") {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    if user.contains("[huge]") {
        return reply(200, "application/json", "x".repeat(64 << 10));
    }
    if user.contains("[malformed_json]") {
        return reply(200, "application/json", "{\"choices\": [".into());
    }
    if user.contains("[malformed_sse]") {
        return reply(
            200,
            "text/event-stream",
            "data: {\"choices\": [{\"delta\": {\"content\": \"a\"}}]}\n\ndata: {oops\n\n".into(),
        );
    }
    let tool = user
        .split("[tool:")
        .nth(1)
        .map(|r| r.split(']').next().unwrap().to_owned())
        .or_else(|| user.contains("[bad_args]").then(|| "lookup".to_owned()));
    if let (Some(name), false) = (tool, last_is_tool) {
        let args = if user.contains("[bad_args]") {
            "{nope".to_owned()
        } else {
            json!({"city": "Paris"}).to_string()
        };
        if stream {
            let (a, b) = args.split_at(args.len() / 2);
            return sse(&[
                chunk(
                    json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_abc", "type": "function", "function": {"name": name, "arguments": ""}}]}),
                    None,
                ),
                chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}),
                    None,
                ),
                chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": b}}]}),
                    None,
                ),
                chunk(json!({}), Some("tool_calls")),
                json!({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7}}),
            ]);
        }
        return reply(
            200,
            "application/json",
            json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
                "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_abc", "type": "function", "function": {"name": name, "arguments": args}}]},
                "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7}})
            .to_string(),
        );
    }
    let text = if last_is_tool {
        let result = body["messages"].as_array().unwrap().last().unwrap()["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        format!("the tool said {result}")
    } else {
        format!("echo: {user}")
    };
    if stream {
        let mut events: Vec<Value> = text
            .split_inclusive(' ')
            .map(|w| chunk(json!({"content": w}), None))
            .collect();
        events.push(chunk(json!({}), Some("stop")));
        events.push(json!({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}));
        return sse(&events);
    }
    let finish = if user.contains("[length]") {
        "length"
    } else {
        "stop"
    };
    reply(
        200,
        "application/json",
        json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4}})
        .to_string(),
    )
}

/// Starts the double on 127.0.0.1; returns its base URL and what it saw.
pub(crate) async fn double() -> (String, Shared) {
    let seen: Shared = Arc::default();
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(completions))
        .fallback(|| async { StatusCode::NOT_FOUND })
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), seen)
}

fn openai(base: &str) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiOptions::new(base, "test-model")).unwrap()
}

fn ask(text: &str) -> ChatRequest {
    ChatRequest {
        model: None,
        messages: vec![ChatMessage::text(Role::User, text)],
        tools: Vec::new(),
        max_tokens: None,
        temperature: None,
        system_prompt: None,
        ..ChatRequest::default()
    }
}

/// Runs `request` streaming; returns the response and the deltas in order.
async fn streamed(
    p: &dyn LlmProvider,
    request: &ChatRequest,
) -> (Result<ChatResponse, LlmError>, Vec<Delta>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let r = p.chat(request, Some(tx)).await;
    let mut got = Vec::new();
    while let Ok(d) = rx.try_recv() {
        got.push(d);
    }
    (r, got)
}

fn text_of(deltas: &[Delta]) -> Vec<String> {
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::TextDelta { delta } => Some(delta.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sync_sends_the_chat_completions_shape_and_reads_the_reply() {
    let (base, seen) = double().await;
    let mut options = OpenAiOptions::new(&base, "test-model");
    options.api_key = Some("sk-test".into());
    options.max_tokens = Some(64);
    let p = OpenAiProvider::new(options).unwrap();
    let mut req = ask("hello there");
    req.system_prompt = Some("be brief".into());
    req.temperature = Some(0.5);
    let r = p.chat(&req, None).await.unwrap();
    assert_eq!(r.content, "echo: hello there");
    assert_eq!(r.finish_reason, FinishReason::Stop);
    assert_eq!((r.usage.prompt_tokens, r.usage.completion_tokens), (5, 4));
    assert!(r.tool_calls.is_empty());
    let body = {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.auth[0].as_deref(), Some("Bearer sk-test"));
        seen.bodies[0].clone()
    };
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["max_tokens"], 64);
    assert_eq!(body["temperature"], 0.5);
    assert_eq!(
        body["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}])
    );
    assert!(body.get("stream").is_none());

    let r = p.chat(&ask("stop early [length]"), None).await.unwrap();
    assert_eq!(r.finish_reason, FinishReason::Length);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_streams_text_deltas_in_order_and_returns_the_whole_answer() {
    let (base, seen) = double().await;
    let p = openai(&base);
    let (r, deltas) = streamed(&p, &ask("one two three")).await;
    let r = r.unwrap();
    assert_eq!(r.content, "echo: one two three");
    assert_eq!(
        text_of(&deltas),
        ["echo: ", "one ", "two ", "three"].map(String::from)
    );
    assert_eq!(r.usage.completion_tokens, 4);
    assert_eq!(r.finish_reason, FinishReason::Stop);
    let body = &seen.lock().unwrap().bodies[0];
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_tool_calling_round_trip() {
    let (base, seen) = double().await;
    let p = openai(&base);
    let mut req = ask("weather please [tool:weather_lookup]");
    req.tools = vec![ToolSpec {
        name: "weather_lookup".into(),
        description: "Looks up the weather".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    }];
    let r = p.chat(&req, None).await.unwrap();
    assert_eq!(r.finish_reason, FinishReason::ToolUse);
    assert_eq!(
        r.tool_calls,
        [ToolCall {
            id: "call_abc".into(),
            name: "weather_lookup".into(),
            arguments: json!({"city": "Paris"}),
        }]
    );
    // Back to the model with the result.
    req.messages.push(ChatMessage {
        role: Role::Assistant,
        content: String::new(),
        tool_calls: r.tool_calls.clone(),
        tool_call_id: None,
    });
    req.messages.push(ChatMessage {
        role: Role::Tool,
        content: "sunny".into(),
        tool_calls: Vec::new(),
        tool_call_id: Some("call_abc".into()),
    });
    let r = p.chat(&req, None).await.unwrap();
    assert_eq!(r.content, "the tool said sunny");
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.bodies[0]["tools"],
        json!([{"type": "function", "function": {"name": "weather_lookup",
            "description": "Looks up the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    );
    let msgs = &seen.bodies[1]["messages"];
    assert_eq!(
        msgs[1],
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
            "function": {"name": "weather_lookup", "arguments": "{\"city\":\"Paris\"}"}}]})
    );
    assert_eq!(
        msgs[2],
        json!({"role": "tool", "tool_call_id": "call_abc", "content": "sunny"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_streams_tool_call_deltas_accumulated_by_index() {
    let (base, _) = double().await;
    let p = openai(&base);
    let (r, deltas) = streamed(&p, &ask("[tool:weather_lookup]")).await;
    let r = r.unwrap();
    assert_eq!(r.tool_calls[0].arguments, json!({"city": "Paris"}));
    assert_eq!(r.finish_reason, FinishReason::ToolUse);
    assert_eq!(r.usage.prompt_tokens, 11);
    let args = r#"{"city":"Paris"}"#;
    let (a, b) = args.split_at(args.len() / 2);
    assert_eq!(
        deltas,
        [
            Delta::ToolCallStart {
                id: "call_abc".into(),
                name: "weather_lookup".into()
            },
            Delta::ToolCallArgsDelta {
                id: "call_abc".into(),
                delta: a.into()
            },
            Delta::ToolCallArgsDelta {
                id: "call_abc".into(),
                delta: b.into()
            },
            Delta::ToolCallEnd {
                id: "call_abc".into()
            },
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_http_errors_map_to_typed_errors() {
    let (base, _) = double().await;
    let p = openai(&base);
    let err = |s: &'static str| {
        let p = &p;
        async move { p.chat(&ask(s), None).await.unwrap_err() }
    };
    let e = err("[status:401]").await;
    assert!(matches!(e, LlmError::Authentication { .. }), "{e:?}");
    assert!(e.to_string().contains("Incorrect API key"), "{e}");
    let e = err("[status:403]").await;
    assert!(matches!(e, LlmError::Authentication { .. }), "{e:?}");
    let e = err("[status:404]").await;
    assert!(matches!(e, LlmError::ModelNotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("does not exist"), "{e}");
    let e = err("[status:429]").await;
    assert!(
        matches!(
            e,
            LlmError::RateLimited {
                retry_after_secs: Some(12),
                ..
            }
        ),
        "{e:?}"
    );
    let e = err("[status:400]").await;
    assert!(matches!(e, LlmError::ContextOverflow { .. }), "{e:?}");
    assert!(e.to_string().contains("maximum context length"), "{e}");
    let e = err("[status:500]").await;
    assert!(
        matches!(e, LlmError::Other { ref message, .. } if message.contains("HTTP 500")),
        "{e:?}"
    );
    // Streaming requests map errors the same way.
    let (r, _) = streamed(&p, &ask("[status:429]")).await;
    assert!(matches!(r, Err(LlmError::RateLimited { .. })), "{r:?}");

    // A wrong base URL path is a 404 from the server: model/endpoint not found.
    let wrong = openai(&base.replace("/v1", "/v2"));
    let e = wrong.chat(&ask("hi"), None).await.unwrap_err();
    assert!(matches!(e, LlmError::ModelNotFound { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_connection_failures_timeouts_and_oversized_bodies() {
    // Nothing listens on a port that was just released.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let p = openai(&format!("http://127.0.0.1:{port}/v1"));
    let e = p.chat(&ask("hi"), None).await.unwrap_err();
    assert!(matches!(e, LlmError::Connection { .. }), "{e:?}");
    assert!(e.to_string().contains("is the server at"), "{e}");

    let (base, _) = double().await;
    let mut options = OpenAiOptions::new(&base, "m");
    options.timeout = Some(Duration::from_millis(300));
    options.max_response_bytes = 16 << 10;
    let p = OpenAiProvider::new(options).unwrap();
    let e = p.chat(&ask("[slow]"), None).await.unwrap_err();
    assert!(
        matches!(e, LlmError::Connection { ref message, .. } if message.contains("did not answer within")),
        "{e:?}"
    );
    let e = p.chat(&ask("[huge]"), None).await.unwrap_err();
    assert!(e.to_string().contains("larger than 16384 bytes"), "{e}");

    let e = OpenAiProvider::new(OpenAiOptions::new("localhost:8080", "m")).unwrap_err();
    assert!(matches!(e, LlmError::NotConfigured(_)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_malformed_replies_are_errors_not_panics() {
    let (base, _) = double().await;
    let p = openai(&base);
    let e = p.chat(&ask("[malformed_json]"), None).await.unwrap_err();
    assert!(e.to_string().contains("not JSON"), "{e}");
    let (r, deltas) = streamed(&p, &ask("[malformed_sse]")).await;
    let e = r.unwrap_err();
    assert!(e.to_string().contains("stream event is not JSON"), "{e}");
    assert_eq!(
        text_of(&deltas),
        ["a"],
        "what came before the junk was streamed"
    );
    let e = p.chat(&ask("[bad_args]"), None).await.unwrap_err();
    assert!(
        e.to_string().contains("\"lookup\"") && e.to_string().contains("malformed JSON arguments"),
        "{e}"
    );
    let (r, _) = streamed(&p, &ask("[bad_args]")).await;
    assert!(
        r.unwrap_err().to_string().contains("\"lookup\""),
        "streamed arguments are checked too"
    );
}

// ---------------------------------------------------------------------------
// Plugin providers over a real Python plugin
// ---------------------------------------------------------------------------

/// A workspace with the approved Python LLM plugin `llmplug` (provider `echo_llm`).
async fn llm_plugin() -> (Ws, plugd_runtime::Runtime) {
    let ws = Ws::new();
    let dir = ws.plugin_dir("llmplug");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/llm/llm_plugin.py"),
        dir.join("llm_plugin.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"llmplug\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"llm_plugin.py\"]\n\n[plugin.extends]\nllm_providers = [\"echo_llm\"]\n",
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("llmplug", "test").await.unwrap();
    (ws, rt)
}

fn plugin_provider(rt: &plugd_runtime::Runtime) -> PluginProvider {
    PluginProvider::with_timeouts(
        rt,
        "llmplug",
        "echo_llm",
        "m1",
        Duration::from_secs(20),
        Duration::from_secs(20),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_provider_answers_sync_and_survives_a_restart() {
    let (_ws, rt) = llm_plugin().await;
    let p = plugin_provider(&rt);
    assert_eq!(p.name(), "llmplug/echo_llm");
    let r = p.chat(&ask("hello"), None).await.unwrap();
    assert_eq!(r.content, "echo[echo_llm/m1]: hello");
    assert_eq!(r.finish_reason, FinishReason::Stop);
    assert_eq!((r.usage.prompt_tokens, r.usage.completion_tokens), (1, 3));
    // The request's model wins over the configured one.
    let mut req = ask("again");
    req.model = Some("m2".into());
    assert_eq!(
        p.chat(&req, None).await.unwrap().content,
        "echo[echo_llm/m2]: again"
    );
    // The provider finds the plugin through its supervisor on every call.
    rt.restart("llmplug").await.unwrap();
    let r = p.chat(&ask("after restart"), None).await.unwrap();
    assert_eq!(r.content, "echo[echo_llm/m1]: after restart");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_provider_streams_deltas_in_order() {
    let (_ws, rt) = llm_plugin().await;
    let p = plugin_provider(&rt);
    let (r, deltas) = streamed(&p, &ask("one two three four")).await;
    let r = r.unwrap();
    let expected = ["echo[echo_llm/m1]: ", "one ", "two ", "three ", "four"].map(String::from);
    assert_eq!(text_of(&deltas), expected);
    assert_eq!(deltas.len(), expected.len(), "usage and end are folded in");
    assert_eq!(
        r.content,
        expected.concat(),
        "the final result's empty text is filled from the stream"
    );
    assert_eq!(r.usage.completion_tokens, 3);
    assert_eq!(r.finish_reason, FinishReason::Stop);

    let (r, _) = streamed(&p, &ask("[bad_chunk]")).await;
    let e = r.unwrap_err();
    assert!(
        e.to_string().contains("malformed llm.chat reply") && e.to_string().contains("chunk"),
        "{e}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_provider_tool_calls_sync_and_streamed() {
    let (_ws, rt) = llm_plugin().await;
    let p = plugin_provider(&rt);
    let mut req = ask("use it [tool:hello_python_greet]");
    let r = p.chat(&req, None).await.unwrap();
    assert_eq!(r.finish_reason, FinishReason::ToolUse);
    assert_eq!(
        r.tool_calls,
        [ToolCall {
            id: "call_1".into(),
            name: "hello_python_greet".into(),
            arguments: json!({"q": "use it [tool:hello_python_greet]"}),
        }]
    );
    let (s, deltas) = streamed(&p, &req).await;
    let s = s.unwrap();
    assert_eq!(s.tool_calls, r.tool_calls, "streamed calls are reassembled");
    assert_eq!(s.finish_reason, FinishReason::ToolUse);
    assert!(
        matches!(&deltas[0], Delta::ToolCallStart { name, .. } if name == "hello_python_greet")
    );
    assert_eq!(
        deltas
            .iter()
            .filter(|d| matches!(d, Delta::ToolCallArgsDelta { .. }))
            .count(),
        2
    );
    assert!(matches!(deltas.last(), Some(Delta::ToolCallEnd { id }) if id == "call_1"));
    // Round trip: the tool result goes back and the plugin answers with text.
    req.messages.push(ChatMessage {
        role: Role::Assistant,
        content: String::new(),
        tool_calls: r.tool_calls,
        tool_call_id: None,
    });
    req.messages.push(ChatMessage {
        role: Role::Tool,
        content: "Hello, Ada!".into(),
        tool_calls: Vec::new(),
        tool_call_id: Some("call_1".into()),
    });
    assert_eq!(
        p.chat(&req, None).await.unwrap().content,
        "tool said: Hello, Ada!"
    );
    let e = p.chat(&ask("[bad_args]"), None).await.unwrap_err();
    assert!(
        e.to_string().contains("\"lookup\"") && e.to_string().contains("malformed arguments"),
        "{e}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_provider_maps_every_typed_error() {
    let (_ws, rt) = llm_plugin().await;
    let p = plugin_provider(&rt);
    let e = |s: &'static str| {
        let p = &p;
        async move { p.chat(&ask(s), None).await.unwrap_err() }
    };
    let err = e("[error:-33101]").await;
    assert!(matches!(err, LlmError::Connection { .. }), "{err:?}");
    assert!(err.to_string().contains("scripted error -33101"), "{err}");
    let err = e("[error:-33102]").await;
    assert!(matches!(err, LlmError::Authentication { .. }), "{err:?}");
    let err = e("[error:-33103]").await;
    assert!(
        matches!(
            err,
            LlmError::RateLimited {
                retry_after_secs: Some(7),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("retry after 7s"), "{err}");
    assert!(matches!(
        e("[error:-33104]").await,
        LlmError::ModelNotFound { .. }
    ));
    assert!(matches!(
        e("[error:-33105]").await,
        LlmError::ContextOverflow { .. }
    ));
    let err = e("[error:-32000]").await;
    assert!(
        matches!(err, LlmError::Other { ref provider, .. } if provider == "llmplug/echo_llm"),
        "{err:?}"
    );
    // Streaming calls get the same typed errors.
    let (r, _) = streamed(&p, &ask("[error:-33103]")).await;
    assert!(matches!(r, Err(LlmError::RateLimited { .. })), "{r:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_provider_undeclared_name_and_timeouts() {
    let (_ws, rt) = llm_plugin().await;
    let e = PluginProvider::new(&rt, "llmplug", "cohere", "m").unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, LlmError::NotConfigured(_)), "{e:?}");
    assert!(
        text.contains("\"cohere\"")
            && text.contains("[plugin.extends].llm_providers")
            && text.contains("echo_llm"),
        "{text}"
    );
    let e = PluginProvider::new(&rt, "ghost", "echo_llm", "m").unwrap_err();
    assert!(e.to_string().contains("\"ghost\""), "{e}");
    // Through the config, too.
    let config = LlmConfig::Plugin {
        plugin: "llmplug".into(),
        name: "cohere".into(),
        model: "m".into(),
        stop_sequences: Vec::new(),
        tool_choice: None,
        cache_tools: false,
    };
    assert!(build_provider(&config, &rt, rt.dir()).await.is_err());

    let p = PluginProvider::with_timeouts(
        &rt,
        "llmplug",
        "echo_llm",
        "m",
        Duration::from_millis(500),
        Duration::from_millis(500),
    )
    .unwrap();
    let e = p.chat(&ask("[hang]"), None).await.unwrap_err();
    assert!(e.to_string().contains("did not answer llm.chat"), "{e}");
    // The plugin is still there for the next call.
    assert_eq!(
        p.chat(&ask("ok"), None).await.unwrap().content,
        "echo[echo_llm/m]: ok"
    );
    rt.shutdown().await;
}

// ---------------------------------------------------------------------------
// The scripted provider
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_provider_replays_a_file_through_build_provider() {
    let ws = Ws::new();
    std::fs::create_dir_all(ws.dir().join("scripts")).unwrap();
    std::fs::copy(
        repo().join("examples/workspace/scripts/demo.yaml"),
        ws.dir().join("scripts/demo.yaml"),
    )
    .unwrap();
    let rt = ws.runtime(quick(5_000)).await;
    let config = LlmConfig::Scripted {
        script: "${{workspace_dir}}/scripts/demo.yaml".into(),
    };
    let p = build_provider(&config, &rt, ws.dir()).await.unwrap();
    assert_eq!(p.name(), "scripted");

    let mut req = ask("Please greet Ada and add 2 and 3");
    let (r, deltas) = streamed(&*p, &req).await;
    let r = r.unwrap();
    assert_eq!(r.finish_reason, FinishReason::ToolUse);
    let names: Vec<&str> = r.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["hello_python_greet", "hello_python_add"]);
    assert_eq!(r.tool_calls[1].arguments, json!({"a": 2, "b": 3}));
    assert_eq!(deltas.len(), 6, "start, args, end per call: {deltas:?}");
    req.messages.push(ChatMessage {
        role: Role::Assistant,
        content: String::new(),
        tool_calls: r.tool_calls.clone(),
        tool_call_id: None,
    });
    for c in &r.tool_calls {
        req.messages.push(ChatMessage {
            role: Role::Tool,
            content: "ok".into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(c.id.clone()),
        });
    }
    let (r, deltas) = streamed(&*p, &req).await;
    let r = r.unwrap();
    assert_eq!(r.content, "I greeted Ada for you, and 2 + 3 = 5.");
    let pieces = text_of(&deltas);
    assert!(pieces.len() > 1, "streamed as a few deltas: {pieces:?}");
    assert_eq!(pieces.concat(), r.content);

    // A new session (a fresh conversation) starts over, and its check applies.
    let e = p.chat(&ask("hello"), None).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("expects the latest user message to contain \"greet\""),
        "{e}"
    );
    // Past the end of the script.
    req.messages
        .push(ChatMessage::text(Role::Assistant, r.content.clone()));
    req.messages.push(ChatMessage::text(Role::User, "more?"));
    assert!(p.chat(&req, None).await.is_ok());
    req.messages.push(ChatMessage::text(Role::Assistant, "…"));
    let e = p.chat(&req, None).await.unwrap_err();
    assert!(
        e.to_string().contains("exhausted") && e.to_string().contains("demo.yaml"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_provider_refuses_bad_configs_with_the_reason() {
    let ws = Ws::new();
    let rt = ws.runtime(quick(5_000)).await;
    let e = build_provider(
        &LlmConfig::Scripted {
            script: "scripts/demo.yaml".into(),
        },
        &rt,
        ws.dir(),
    )
    .await
    .err()
    .unwrap();
    assert!(
        e.to_string()
            .contains("${{workspace_dir}}/scripts/demo.yaml"),
        "{e}"
    );
    std::fs::write(
        ws.dir().join("bad.yaml"),
        "steps:\n  - text: hi\n    tool_calls: []\n",
    )
    .unwrap();
    let e = build_provider(
        &LlmConfig::Scripted {
            script: ws.dir().join("bad.yaml"),
        },
        &rt,
        ws.dir(),
    )
    .await
    .err()
    .unwrap();
    assert!(e.to_string().contains("bad.yaml"), "{e}");
    let e = build_provider(
        &LlmConfig::Openai {
            base_url: "http://127.0.0.1:9/v1".into(),
            model: "m".into(),
            api_key_env: Some("PLUGD_TEST_UNSET_API_KEY_VARIABLE".into()),
            api_key_secret: None,
            max_tokens: None,
            timeout_ms: None,
            stop_sequences: Vec::new(),
            tool_choice: None,
            cache_tools: false,
        },
        &rt,
        ws.dir(),
    )
    .await
    .err()
    .unwrap();
    assert!(
        e.to_string().contains("PLUGD_TEST_UNSET_API_KEY_VARIABLE"),
        "{e}"
    );
    let p = build_provider(
        &LlmConfig::Openai {
            base_url: "http://127.0.0.1:9/v1".into(),
            model: "m".into(),
            api_key_env: None,
            api_key_secret: None,
            max_tokens: None,
            timeout_ms: Some(1000),
            stop_sequences: Vec::new(),
            tool_choice: None,
            cache_tools: false,
        },
        &rt,
        ws.dir(),
    )
    .await
    .unwrap();
    assert_eq!(p.name(), "openai");
    // The shipped example script is valid.
    ScriptedProvider::load(&repo().join("examples/workspace/scripts/demo.yaml")).unwrap();
}
