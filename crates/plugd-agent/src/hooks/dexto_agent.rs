//! `context.agent` of Dexto modules (seed 002 `ExecutionContext.agent`):
//! what plugd answers when a module's Node host asks for its storage,
//! sessions, tools, MCP servers or event bus.
//!
//! Each manager method in the host (`js/dexto-host.mjs`) is one JSON-RPC
//! request to plugd, served here on its own task:
//!
//! | request | answers with |
//! |---|---|
//! | `storage.get\|set\|delete\|list` | the agent's key-value storage (`plugd_store::kv`) |
//! | `sessions.list {}` | `{ids}`: stored session ids, newest first, at most [`MAX_SESSIONS`] |
//! | `sessions.get {id}` | `{session: {id, createdAt, lastActivity, messageCount} \| null}` |
//! | `sessions.history {id, limit?}` | `{messages, total}`: the last `limit` (≤ [`MAX_HISTORY`]) transcript entries as Dexto messages, cut to [`MAX_HISTORY_BYTES`] |
//! | `tools.list {}` | `{tools: [{name, description, parameters}]}`: the enabled tools of approved plugins, the agent's own list |
//! | `mcp.list {}` | `{servers: [{name, transport, state, tools}]}`: the approved MCP servers and their enabled tools |
//! | `events.subscribe\|unsubscribe {name}` | subscribes the host to bus subject `dexto.agent.<name>` |
//!
//! and one notification, `events.emit {name, payload}`, which publishes on
//! `dexto.agent.<name>`; events on a subscribed subject reach the host as
//! `event {name, payload, source, id, timestamp}` notifications.
//!
//! **Architecture invariant:** a module learns nothing here the agent does
//! not see: sessions and tools of its own workspace (the runtime it was
//! loaded by), no plugin commands, environments, settings, secrets or stderr,
//! and only the `dexto.agent.*` part of the bus. Every answer is bounded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use plugd_host::bus::{Delivery, Event, Sink, SubscriptionGuard};
use plugd_host::peer::Notifier;
use plugd_wire::ErrorObject;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use plugd_runtime::Runtime;

/// Most session ids `sessions.list` returns (the newest).
pub const MAX_SESSIONS: usize = 1000;

/// Most messages one `sessions.history` returns (the newest).
pub const MAX_HISTORY: usize = 500;

/// Most bytes of JSON one `sessions.history` returns; older messages are
/// left out first.
pub const MAX_HISTORY_BYTES: usize = 4 * 1024 * 1024;

/// Most tools `tools.list` or `mcp.list` returns.
pub const MAX_TOOLS: usize = 2000;

/// The bus subject prefix of `agentEventBus` events: `emit("run:done", p)`
/// publishes on `dexto.agent.run:done`.
pub const EVENT_SUBJECT_PREFIX: &str = "dexto.agent.";

/// Longest event name, in bytes.
pub const MAX_EVENT_NAME: usize = 128;

/// Largest event payload, in bytes of JSON.
pub const MAX_EVENT_PAYLOAD: usize = 64 * 1024;

/// Most event names one module subscribes to at a time.
pub const MAX_SUBSCRIPTIONS: usize = 64;

/// Events queued for one module's host before new ones are shed (counted
/// and logged).
pub const EVENT_QUEUE: usize = 256;

/// What a module's requests reach.
#[derive(Clone, Default)]
pub struct AgentServices {
    /// The agent's state store: storage and sessions.
    pub store: Option<Arc<dyn plugd_store::StateStore>>,
    /// The runtime: tools, MCP servers, bus.
    pub runtime: Option<Runtime>,
}

fn invalid(message: String) -> ErrorObject {
    ErrorObject::new(plugd_wire::codes::INVALID_PARAMS, message)
}

fn internal(message: String) -> ErrorObject {
    ErrorObject::new(plugd_wire::codes::INTERNAL_ERROR, message)
}

/// Whether `name` is an acceptable event name: 1-128 bytes of letters,
/// digits, `_`, `-` and `:` (Dexto's names, `llm:thinking`,
/// `mcp:server-connected`, fit; a dot would split the subject).
pub fn valid_event_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_EVENT_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':'))
}

fn event_name(method: &str, p: &Value) -> Result<String, ErrorObject> {
    let name = p["name"].as_str().unwrap_or_default();
    if valid_event_name(name) {
        Ok(name.to_owned())
    } else {
        Err(invalid(format!(
            "{method}: event name {:?} is not 1-{MAX_EVENT_NAME} letters, digits, '_', '-' or ':'; use a name like \"tenant:quota-exceeded\"",
            name.chars().take(64).collect::<String>()
        )))
    }
}

/// The module's bus subscriptions, and the queue that carries their events
/// to its host.
#[derive(Default)]
pub(super) struct EventBridge {
    subs: HashMap<String, SubscriptionGuard>,
    tx: Option<mpsc::Sender<Event>>,
    shed: Arc<AtomicU64>,
}

/// Serves one request of a module's `context.agent`.
pub(super) async fn serve(
    services: &AgentServices,
    bridge: &Mutex<EventBridge>,
    handler: &str,
    method: &str,
    params: Value,
    notifier: Notifier,
) -> Result<Value, ErrorObject> {
    let area = method.split('.').next().unwrap_or_default();
    match area {
        "storage" | "sessions" => {
            let Some(store) = services.store.clone() else {
                return Err(internal(format!(
                    "{method}: plugd gave dexto handler {handler} no agent storage"
                )));
            };
            if method.starts_with("storage.") {
                storage_call(&*store, method, &params).await
            } else {
                sessions_call(&*store, method, &params).await
            }
        }
        "tools" | "mcp" | "events" => {
            let Some(runtime) = services.runtime.clone() else {
                return Err(internal(format!(
                    "{method}: plugd gave dexto handler {handler} no agent (only `plugd run`, `plugd serve` and `plugd hook` do)"
                )));
            };
            match method {
                "tools.list" => Ok(json!({"tools": tools_list(&runtime, None)})),
                "mcp.list" => mcp_list(&runtime).await,
                "events.subscribe" => subscribe(&runtime, bridge, handler, &params, notifier),
                "events.unsubscribe" => {
                    let name = event_name(method, &params)?;
                    let removed = lock(bridge).subs.remove(&name).is_some();
                    Ok(json!({"unsubscribed": removed}))
                }
                other => Err(not_found(other)),
            }
        }
        _ => Err(not_found(method)),
    }
}

fn not_found(method: &str) -> ErrorObject {
    ErrorObject::new(
        plugd_wire::codes::METHOD_NOT_FOUND,
        format!("method not found: {method}"),
    )
}

fn lock(bridge: &Mutex<EventBridge>) -> std::sync::MutexGuard<'_, EventBridge> {
    bridge.lock().unwrap_or_else(|p| p.into_inner())
}

/// One `storage.*` request of a module's `context.agent.storage`.
pub(super) async fn storage_call(
    store: &dyn plugd_store::StateStore,
    method: &str,
    p: &Value,
) -> Result<Value, ErrorObject> {
    let failed = |e: plugd_store::StoreError| invalid(format!("{method}: {e}"));
    let space = p["space"].as_str().unwrap_or_default();
    let key = || {
        p["key"]
            .as_str()
            .ok_or_else(|| invalid(format!("{method} needs a string key")))
    };
    match method {
        "storage.get" => Ok(json!({"value": store.kv_get(space, key()?).await.map_err(failed)?})),
        "storage.set" => {
            store
                .kv_set(space, key()?, &p["value"])
                .await
                .map_err(failed)?;
            Ok(json!({}))
        }
        "storage.delete" => {
            Ok(json!({"deleted": store.kv_delete(space, key()?).await.map_err(failed)?}))
        }
        "storage.list" => {
            let prefix = p["prefix"].as_str().unwrap_or_default();
            Ok(json!({"keys": store.kv_list(space, prefix).await.map_err(failed)?}))
        }
        other => Err(not_found(other)),
    }
}

/// `{id, createdAt, lastActivity, messageCount}` of session `id` (times in
/// RFC 3339; the host turns them into Dexto's epoch milliseconds).
async fn session_summary(
    store: &dyn plugd_store::StateStore,
    id: &str,
) -> Result<Value, ErrorObject> {
    let failed = |e: plugd_store::StoreError| internal(format!("sessions.get: {e}"));
    let Some(row) = store.session_get(id).await.map_err(failed)? else {
        return Ok(Value::Null);
    };
    let (total, last) = store.session_tail(id, 1).await.map_err(failed)?;
    let last_at = last
        .first()
        .and_then(|e| e["at"].as_str())
        .unwrap_or(&row.created_at)
        .to_owned();
    Ok(json!({
        "id": row.id,
        "createdAt": row.created_at,
        "lastActivity": last_at,
        "messageCount": total,
    }))
}

/// A transcript entry as a Dexto message: `{role, content, timestamp,
/// toolCalls?: [{id, type: "function", function: {name, arguments}}],
/// toolCallId?}`.
fn dexto_message(entry: &Value) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("role".into(), entry["role"].clone());
    m.insert("content".into(), entry["content"].clone());
    if let Some(at) = entry["at"].as_str() {
        m.insert("timestamp".into(), Value::String(at.to_owned()));
    }
    if let Some(calls) = entry["tool_calls"].as_array().filter(|c| !c.is_empty()) {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let arguments = match &c["arguments"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                json!({"id": c["id"], "type": "function",
                       "function": {"name": c["name"], "arguments": arguments}})
            })
            .collect();
        m.insert("toolCalls".into(), Value::Array(calls));
    }
    if let Some(id) = entry["tool_call_id"].as_str() {
        m.insert("toolCallId".into(), Value::String(id.to_owned()));
    }
    Value::Object(m)
}

fn session_id<'a>(method: &str, p: &'a Value) -> Result<&'a str, ErrorObject> {
    p["id"]
        .as_str()
        .ok_or_else(|| invalid(format!("{method} needs a string session id")))
}

/// One `sessions.*` request of `context.agent.sessionManager` (read-only).
async fn sessions_call(
    store: &dyn plugd_store::StateStore,
    method: &str,
    p: &Value,
) -> Result<Value, ErrorObject> {
    let failed = |e: plugd_store::StoreError| internal(format!("{method}: {e}"));
    match method {
        "sessions.list" => {
            let ids: Vec<String> = store
                .session_list(MAX_SESSIONS)
                .await
                .map_err(failed)?
                .into_iter()
                .map(|r| r.id)
                .collect();
            Ok(json!({ "ids": ids }))
        }
        "sessions.get" => {
            let id = session_id(method, p)?;
            // An id plugd could never have stored is no session, as an
            // unknown one is (Dexto answers `undefined`).
            if !plugd_store::sessions::valid_session_id(id) {
                return Ok(json!({"session": null}));
            }
            Ok(json!({"session": session_summary(store, id).await?}))
        }
        "sessions.history" => {
            let id = session_id(method, p)?;
            let limit = match &p["limit"] {
                Value::Null => MAX_HISTORY,
                v => match v.as_u64() {
                    Some(n) if (1..=MAX_HISTORY as u64).contains(&n) => n as usize,
                    _ => {
                        return Err(invalid(format!(
                            "{method}: limit {v} is not 1 to {MAX_HISTORY}; leave it out for the last {MAX_HISTORY} messages"
                        )));
                    }
                },
            };
            let exists = plugd_store::sessions::valid_session_id(id)
                && store.session_get(id).await.map_err(failed)?.is_some();
            if !exists {
                return Err(invalid(format!(
                    "session {:?} not found; sessionManager.listSessions() names the stored ones",
                    id.chars().take(128).collect::<String>()
                )));
            }
            let (total, entries) = store.session_tail(id, limit).await.map_err(failed)?;
            let mut messages: Vec<Value> = entries.iter().map(dexto_message).collect();
            // Newest kept: drop from the front until the answer fits.
            let mut size: usize = messages.iter().map(|m| m.to_string().len() + 1).sum();
            let mut cut = 0;
            while size > MAX_HISTORY_BYTES && cut < messages.len() {
                size -= messages[cut].to_string().len() + 1;
                cut += 1;
            }
            messages.drain(..cut);
            Ok(json!({"messages": messages, "total": total}))
        }
        other => Err(not_found(other)),
    }
}

/// The agent's tools (`plugin: None`) or one plugin's, as Dexto's `ToolSet`
/// entries `{name, description, parameters}`, sorted by name.
fn tools_list(runtime: &Runtime, plugin: Option<&str>) -> Vec<Value> {
    runtime
        .tools()
        .iter()
        .filter(|t| plugin.is_none_or(|p| t.plugin == p))
        .take(MAX_TOOLS)
        .map(
            |t| json!({"name": t.name, "description": t.description, "parameters": t.input_schema}),
        )
        .collect()
}

/// The approved MCP servers plugd hosts (`.mcp.json`), with their state and
/// enabled tools. Unapproved servers are not the agent's and are left out.
async fn mcp_list(runtime: &Runtime) -> Result<Value, ErrorObject> {
    let plugins = runtime
        .plugin_list()
        .await
        .map_err(|e| internal(format!("mcp.list: {e}")))?;
    let servers: Vec<Value> = plugins
        .iter()
        .filter(|p| p.dialect == "mcp" && p.approved)
        .map(|p| {
            json!({
                "name": p.id,
                "transport": "stdio",
                "state": p.state,
                "tools": tools_list(runtime, Some(&p.id)),
            })
        })
        .collect();
    Ok(json!({ "servers": servers }))
}

fn subscribe(
    runtime: &Runtime,
    bridge: &Mutex<EventBridge>,
    handler: &str,
    p: &Value,
    notifier: Notifier,
) -> Result<Value, ErrorObject> {
    let name = event_name("events.subscribe", p)?;
    let mut b = lock(bridge);
    if b.subs.contains_key(&name) {
        return Ok(json!({"subscribed": true}));
    }
    if b.subs.len() >= MAX_SUBSCRIPTIONS {
        return Err(invalid(format!(
            "events.subscribe {name:?}: this module already listens to {MAX_SUBSCRIPTIONS} event names; remove listeners (agentEventBus.off) first"
        )));
    }
    let tx = match &b.tx {
        Some(tx) => tx.clone(),
        None => {
            let (tx, rx) = mpsc::channel(EVENT_QUEUE);
            tokio::spawn(forward(rx, notifier));
            b.tx = Some(tx.clone());
            tx
        }
    };
    let shed = b.shed.clone();
    let who = handler.to_owned();
    let sink: Sink = Arc::new(move |e: &Event| match tx.try_send(e.clone()) {
        Ok(()) => Delivery::Queued,
        Err(mpsc::error::TrySendError::Full(_)) => {
            let n = shed.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(handler = %who, topic = %e.topic, shed = n,
                "dexto module's event queue is full ({EVENT_QUEUE}); event shed");
            Delivery::Shed
        }
        Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Closed,
    });
    let guard = runtime
        .bus()
        .subscribe_sink(&format!("{EVENT_SUBJECT_PREFIX}{name}"), sink)
        .map_err(|e| invalid(format!("events.subscribe: {e}")))?;
    b.subs.insert(name, guard);
    Ok(json!({"subscribed": true}))
}

/// Carries bus events to the host until it is gone.
async fn forward(mut rx: mpsc::Receiver<Event>, notifier: Notifier) {
    while let Some(e) = rx.recv().await {
        let name = e
            .topic
            .strip_prefix(EVENT_SUBJECT_PREFIX)
            .unwrap_or(&e.topic)
            .to_owned();
        let params = json!({"name": name, "payload": e.payload, "source": e.source,
                            "id": e.id, "timestamp": e.timestamp});
        if !notifier.send("event", Some(params)).await {
            return;
        }
    }
}

/// `events.emit {name, payload}` from a module: published on
/// `dexto.agent.<name>` with source `dexto:<handler>`. A bad name or an
/// oversized payload is logged (the host checked both before sending).
pub(super) fn emit(runtime: Option<&Runtime>, handler: &str, params: &Value) {
    let Some(runtime) = runtime else {
        tracing::warn!(
            handler,
            "dexto module emitted an event, but plugd gave it no agent bus; dropped"
        );
        return;
    };
    let name = match event_name("events.emit", params) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(
                handler,
                "dexto module emitted an event plugd refuses: {}",
                e.message
            );
            return;
        }
    };
    let payload = params.get("payload").cloned().unwrap_or(Value::Null);
    let size = payload.to_string().len();
    if size > MAX_EVENT_PAYLOAD {
        tracing::warn!(handler, event = %name,
            "dexto module emitted an event of {size} bytes (at most {MAX_EVENT_PAYLOAD}); dropped");
        return;
    }
    let event = Event::new(
        format!("{EVENT_SUBJECT_PREFIX}{name}"),
        format!("dexto:{handler}"),
        payload,
    );
    if let Err(e) = runtime.publish(event) {
        tracing::warn!(handler, "dexto module event not published: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_one_subject_segment() {
        for ok in ["llm:thinking", "mcp:server-connected", "run_done", "a"] {
            assert!(valid_event_name(ok), "{ok}");
        }
        for bad in ["", "a.b", "a b", "a*", ">", "é", &"x".repeat(129)] {
            assert!(!valid_event_name(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn sessions_read_back_as_dexto_messages_bounded() {
        let store = plugd_store::Store::open_in_memory().unwrap();
        store.session_ensure("s1").unwrap();
        store
            .session_append(
                "s1",
                &[
                    json!({"role": "user", "content": "hi", "at": "2025-01-01T00:00:00Z"}),
                    json!({"role": "assistant", "content": "", "at": "2025-01-01T00:00:01Z",
                           "tool_calls": [{"id": "c1", "name": "tk_echo", "arguments": {"x": 1}}]}),
                    json!({"role": "tool", "content": "{}", "tool_call_id": "c1", "at": "2025-01-01T00:00:02Z"}),
                ],
            )
            .unwrap();
        let s = sessions_call(&store, "sessions.get", &json!({"id": "s1"}))
            .await
            .unwrap();
        assert_eq!(s["session"]["messageCount"], 3);
        assert_eq!(s["session"]["lastActivity"], "2025-01-01T00:00:02Z");
        let none = sessions_call(&store, "sessions.get", &json!({"id": "../x"}))
            .await
            .unwrap();
        assert_eq!(none["session"], Value::Null);
        let h = sessions_call(&store, "sessions.history", &json!({"id": "s1", "limit": 2}))
            .await
            .unwrap();
        assert_eq!(h["total"], 3);
        assert_eq!(
            h["messages"][0]["toolCalls"][0],
            json!({"id": "c1", "type": "function", "function": {"name": "tk_echo", "arguments": "{\"x\":1}"}})
        );
        assert_eq!(h["messages"][1]["toolCallId"], "c1");
        let e = sessions_call(&store, "sessions.history", &json!({"id": "s1", "limit": 0}))
            .await
            .unwrap_err();
        assert!(
            e.message.contains("limit 0 is not 1 to 500"),
            "{}",
            e.message
        );
        let e = sessions_call(&store, "sessions.history", &json!({"id": "nope"}))
            .await
            .unwrap_err();
        assert!(
            e.message.contains("session \"nope\" not found"),
            "{}",
            e.message
        );
        let l = sessions_call(&store, "sessions.list", &json!({}))
            .await
            .unwrap();
        assert_eq!(l["ids"], json!(["s1"]));
    }

    #[tokio::test]
    async fn a_long_history_keeps_the_newest_messages_within_the_byte_bound() {
        let store = plugd_store::Store::open_in_memory().unwrap();
        store.session_ensure("big").unwrap();
        let chunk = "x".repeat(100 * 1024);
        let entries: Vec<Value> = (0..60)
            .map(|i| json!({"role": "user", "content": format!("{i}:{chunk}")}))
            .collect();
        store.session_append("big", &entries).unwrap();
        let h = sessions_call(&store, "sessions.history", &json!({"id": "big"}))
            .await
            .unwrap();
        let messages = h["messages"].as_array().unwrap();
        assert!(h.to_string().len() <= MAX_HISTORY_BYTES + 1024);
        assert!(messages.len() < 60 && !messages.is_empty());
        assert!(
            messages.last().unwrap()["content"]
                .as_str()
                .unwrap()
                .starts_with("59:")
        );
        assert_eq!(h["total"], 60);
    }
}
