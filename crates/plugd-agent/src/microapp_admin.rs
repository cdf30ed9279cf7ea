//! The `nexo/admin/*` methods of the nexo microapp contract (seed 001) that
//! plugd can back, the host service a microapp calls (the runtime reaches
//! it through `AgentParts::microapp_admin`). Each method answers from
//! plugd's own state; the methods plugd has no concept for answer `-32601`
//! with the reason (see [`admin`] and `docs/contracts/microapp.md`).
//! Secrets are never returned: credential listings carry setting names
//! only.

use crate::llm::LlmConfig;
use plugd_runtime::Runtime;
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::microapp::MAX_TRANSCRIPT_READ;
use plugd_runtime::plugin_config::Kind;
use plugd_wire::{ErrorObject, codes};
use serde_json::{Value, json};

fn not_backed(method: &str, why: &str) -> ErrorObject {
    ErrorObject::new(
        codes::METHOD_NOT_FOUND,
        format!("{method} is not available in plugd: {why}"),
    )
    .with_data(json!({"method": method, "reason": why}))
}

fn invalid(method: &str, message: impl std::fmt::Display) -> ErrorObject {
    ErrorObject::new(codes::INVALID_PARAMS, format!("{method}: {message}"))
}

fn internal(method: &str, message: impl std::fmt::Display) -> ErrorObject {
    ErrorObject::new(codes::INTERNAL_ERROR, format!("{method}: {message}"))
}

/// A string param, when present; `-32602` when present with another type.
fn opt_str<'a>(method: &str, p: &'a Value, key: &str) -> Result<Option<&'a str>, ErrorObject> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(
            method,
            format!("{key:?} must be a string, got {other}"),
        )),
    }
}

fn req_str<'a>(method: &str, p: &'a Value, key: &str) -> Result<&'a str, ErrorObject> {
    opt_str(method, p, key)?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid(method, format!("needs a non-empty string {key:?}")))
}

/// One provider of `llm_providers/list`: how it is reached and whether its
/// key is there (never the key).
async fn provider_view(rt: &Runtime, id: &str, llm: &LlmConfig, active: bool) -> Value {
    match llm {
        LlmConfig::Openai {
            base_url,
            model,
            api_key_env,
            api_key_secret,
            ..
        } => {
            let key_present = match (api_key_env, api_key_secret) {
                (_, Some(name)) => rt.secret(name).await.is_ok_and(|v| v.is_some()),
                (Some(var), None) => std::env::var_os(var).is_some_and(|s| !s.is_empty()),
                (None, None) => false,
            };
            json!({
                "id": id,
                "kind": "openai",
                "model": model,
                "base_url": base_url,
                "api_key_env": api_key_env,
                "api_key_secret": api_key_secret,
                "key_present": key_present,
                "active": active,
            })
        }
        LlmConfig::Plugin { plugin, model, .. } => json!({
            "id": id,
            "kind": "plugin",
            "plugin": plugin,
            "model": model,
            "active": active,
        }),
        LlmConfig::Scripted { .. } => json!({"id": id, "kind": "scripted", "active": active}),
    }
}

/// Answers a granted `nexo/admin/*` request of microapp `plugin`.
///
/// | method | answer |
/// |---|---|
/// | `agents/list {active_only?}` | `{agents: [{id, active, model_provider, bindings_count}]}` |
/// | `agents/get {id}` | the agent (`-32602` for another id) |
/// | `agents/upsert`, `agents/delete`, `reload` | `-32601`: plugd.yaml is edited by hand and read at start |
/// | `credentials/list` | `{credentials: [{channel, instance, plugin, keys, agent_ids}]}` (names of the channel plugin's secret settings that are set) |
/// | `credentials/register {channel, instance?, payload}` | stores each `payload` key as the channel plugin's secret setting; `{ok, channel, plugin, keys, applied}` |
/// | `credentials/revoke {channel, instance?}` | removes the channel plugin's secret settings; `{ok, channel, plugin, removed}` |
/// | `pairing/*` | `-32601`: plugd has no pairing flow |
/// | `llm_providers/list` | `{providers: [{id, kind, model, base_url, api_key_env, key_present, active}]}` |
/// | `llm_providers/upsert`, `llm_providers/delete` | `-32601`: the provider is `plugd.yaml`'s `llm:` and its key an environment variable |
/// | `channels/list` | `{channels: [{channel, plugin, approved, state, binding_id, binding_index}]}` |
/// | `channels/doctor` | `{channels: [{channel, plugin, ok, issues}]}` |
/// | `channels/approve`, `channels/revoke` | `-32601`: no per-agent channel servers; plugins are approved by the operator |
/// | `transcripts/read {session_id, since_seq?, limit?}` | `{session_id, entries: [{seq, role, body, at}]}`, entries after `since_seq` (the `seq` of `agent_event`), at most `limit` (≤ 500) |
pub async fn admin(
    rt: &Runtime,
    plugin: &str,
    method: &str,
    params: Value,
) -> Result<Value, ErrorObject> {
    let short = method.strip_prefix("nexo/admin/").unwrap_or(method);
    match short {
        "agents/list" | "agents/get" => {
            let config = PlugdConfig::load(rt.dir())
                .map_err(|e| internal(method, format!("plugd.yaml does not load: {e}")))?;
            let agents = rt.agents(&config);
            if short == "agents/list" {
                let list: Vec<Value> = agents
                    .iter()
                    .map(|a| {
                        json!({
                            "id": a["id"],
                            "active": a["active"],
                            "model_provider": a["model_provider"],
                            "bindings_count": a["inbound_bindings"].as_array().map_or(0, Vec::len),
                        })
                    })
                    .collect();
                return Ok(json!({"agents": list}));
            }
            let id = req_str(method, &params, "id")?;
            agents.into_iter().find(|a| a["id"] == id).ok_or_else(|| {
                invalid(method, format!("unknown agent {id:?}")).with_data(json!({"id": id}))
            })
        }
        "agents/upsert" | "agents/delete" | "reload" => Err(not_backed(
            method,
            "plugd runs one agent, configured by hand in plugd.yaml (agent:, llm:, tenant.agent_id) and read when serve starts; edit the file and restart serve (microapps get agents/updated when it changes)",
        )),
        "credentials/list" => {
            let mut out = Vec::new();
            let config = PlugdConfig::load(rt.dir()).ok();
            let agent_ids: Vec<Value> = config
                .map(|c| rt.agents(&c).into_iter().map(|a| a["id"].clone()).collect())
                .unwrap_or_default();
            for (kind, owner) in rt.channel_kinds() {
                let entries = rt
                    .config_show(&owner)
                    .await
                    .map_err(|e| internal(method, e))?;
                let keys: Vec<&str> = entries
                    .iter()
                    .filter(|e| e.secret && e.source == "set")
                    .map(|e| e.key.as_str())
                    .collect();
                out.push(json!({
                    "channel": kind,
                    "instance": null,
                    "plugin": owner,
                    "keys": keys,
                    "agent_ids": agent_ids,
                }));
            }
            Ok(json!({"credentials": out}))
        }
        "credentials/register" | "credentials/revoke" => {
            let (kind, owner) = channel_of(rt, method, &params)?;
            let schema = rt.config_schema(&owner).map_err(|e| internal(method, e))?;
            let secrets: Vec<&str> = schema
                .fields
                .iter()
                .filter(|f| f.kind == Kind::Secret)
                .map(|f| f.key.as_str())
                .collect();
            if short == "credentials/revoke" {
                let mut removed = Vec::new();
                for key in &secrets {
                    rt.config_unset(&owner, key)
                        .await
                        .map_err(|e| internal(method, e))?;
                    removed.push(*key);
                }
                tracing::info!(%plugin, channel = %kind, owner = %owner, "credentials revoked by microapp");
                return Ok(
                    json!({"ok": true, "channel": kind, "plugin": owner, "removed": removed}),
                );
            }
            let payload = params
                .get("payload")
                .and_then(Value::as_object)
                .filter(|m| !m.is_empty())
                .ok_or_else(|| {
                    invalid(
                        method,
                        "needs a non-empty object \"payload\" of the channel's secret settings",
                    )
                })?;
            // Every key is checked before anything is stored.
            let mut values = Vec::new();
            for (key, value) in payload {
                if !secrets.contains(&key.as_str()) {
                    return Err(invalid(
                        method,
                        format!(
                            "{key:?} is not a secret setting of channel {kind:?} (plugin {owner:?}; its secret settings: {})",
                            if secrets.is_empty() {
                                "none".to_owned()
                            } else {
                                secrets.join(", ")
                            }
                        ),
                    ));
                }
                let Some(v) = value.as_str() else {
                    return Err(invalid(method, format!("payload.{key} must be a string")));
                };
                values.push((key.as_str(), v));
            }
            let mut applied = "not_running";
            for (key, v) in &values {
                let a = rt
                    .config_set(&owner, key, v)
                    .await
                    .map_err(|e| internal(method, e))?;
                applied = match a {
                    plugd_runtime::plugin_config::Applied::NotRunning => "not_running",
                    plugd_runtime::plugin_config::Applied::Notified => "notified",
                    plugd_runtime::plugin_config::Applied::Restarted => "restarted",
                };
            }
            let keys: Vec<&str> = values.iter().map(|(k, _)| *k).collect();
            tracing::info!(%plugin, channel = %kind, owner = %owner, ?keys, "credentials registered by microapp");
            Ok(
                json!({"ok": true, "channel": kind, "plugin": owner, "keys": keys, "applied": applied}),
            )
        }
        "llm_providers/list" => {
            let config = PlugdConfig::load(rt.dir())
                .map_err(|e| internal(method, format!("plugd.yaml does not load: {e}")))?;
            // The single `llm:` (the agent's, registered as "openai" or its
            // plugin provider's name), then every `llm_providers:` entry.
            let mut entries: Vec<(String, &LlmConfig, bool)> = Vec::new();
            if let Some(llm) = &config.llm {
                let id = match llm {
                    LlmConfig::Plugin { name, .. } => name.clone(),
                    LlmConfig::Openai { .. } => "openai".to_owned(),
                    LlmConfig::Scripted { .. } => "scripted".to_owned(),
                };
                entries.push((id, llm, true));
            }
            for (name, llm) in &config.llm_providers {
                entries.push((name.clone(), llm, false));
            }
            let mut providers: Vec<Value> = Vec::new();
            for (id, llm, active) in entries {
                providers.push(provider_view(rt, &id, llm, active).await);
            }
            Ok(json!({"providers": providers}))
        }
        "llm_providers/upsert" | "llm_providers/delete" => Err(not_backed(
            method,
            "providers are plugd.yaml's llm: and llm_providers: sections and their keys an environment variable (api_key_env), an operator secret (api_key_secret, plugd secrets set) or a plugin setting; plugd does not rewrite them from a microapp",
        )),
        "pairing/start" | "pairing/status" | "pairing/cancel" => Err(not_backed(
            method,
            "plugd has no pairing flow: a channel plugin is configured with its settings (credentials/register or plugd plugin config)",
        )),
        "channels/list" => {
            let mut out = Vec::new();
            for (i, (kind, owner)) in rt.channel_kinds().into_iter().enumerate() {
                let info = rt.plugin(&owner).await.map_err(|e| internal(method, e))?;
                out.push(json!({
                    "channel": kind,
                    "plugin": owner,
                    "approved": info.approved,
                    "state": info.state,
                    "binding_id": format!("{kind}:default"),
                    "binding_index": i,
                }));
            }
            Ok(json!({"channels": out}))
        }
        "channels/doctor" => {
            let mut out = Vec::new();
            for (kind, owner) in rt.channel_kinds() {
                let mut issues = Vec::new();
                match rt.plugin(&owner).await {
                    Ok(info) => {
                        if !info.approved {
                            issues.push(format!(
                                "plugin {owner:?} is {}: run `plugd plugin approve {owner}`",
                                info.state
                            ));
                        }
                        if let Some(e) = info.error {
                            issues.push(format!("plugin {owner:?} failed: {e}"));
                        }
                    }
                    Err(e) => issues.push(e.to_string()),
                }
                if let Ok(sup) = rt.supervised(&owner)
                    && !plugd_host::native_host::channel_kinds(sup.spec()).contains(&kind)
                {
                    issues.push(format!("plugin {owner:?} does not register channel {kind:?} in [[plugin.channels.register]], so it may not publish plugin.inbound.{kind}"));
                }
                if let Ok(entries) = rt.config_show(&owner).await {
                    for e in entries.iter().filter(|e| e.required && e.source == "unset") {
                        issues.push(format!("required setting {:?} is not set", e.key));
                    }
                }
                out.push(json!({"channel": kind, "plugin": owner, "ok": issues.is_empty(), "issues": issues}));
            }
            Ok(json!({"channels": out}))
        }
        "transcripts/read" => {
            let session = req_str(method, &params, "session_id")?;
            if !plugd_store::sessions::valid_session_id(session) {
                return Err(invalid(method, format!("invalid session id {session:?}")));
            }
            let since = match params.get("since_seq") {
                None | Some(Value::Null) => 0,
                Some(v) => v.as_u64().ok_or_else(|| {
                    invalid(
                        method,
                        format!("\"since_seq\" must be a non-negative integer, got {v}"),
                    )
                })?,
            };
            let limit = match params.get("limit") {
                None | Some(Value::Null) => MAX_TRANSCRIPT_READ,
                Some(v) => v
                    .as_u64()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| {
                        invalid(
                            method,
                            format!("\"limit\" must be a positive integer, got {v}"),
                        )
                    })?
                    .min(MAX_TRANSCRIPT_READ as u64) as usize,
            };
            let rows = rt
                .state()
                .session_transcript(session)
                .await
                .map_err(|e| internal(method, e))?;
            let entries: Vec<Value> = rows
                .iter()
                .enumerate()
                .map(|(i, e)| (i as u64 + 1, e))
                .filter(|(seq, _)| *seq > since)
                .take(limit)
                .map(|(seq, e)| {
                    json!({
                        "seq": seq,
                        "role": e["role"],
                        "body": e["content"],
                        "at": e["at"],
                    })
                })
                .collect();
            Ok(json!({"session_id": session, "entries": entries}))
        }
        "channels/approve" | "channels/revoke" => Err(not_backed(
            method,
            "plugd has no per-agent channel servers: every approved channel plugin serves the agent, and approving a plugin is the operator's decision (plugd plugin approve|revoke)",
        )),
        _ => Err(ErrorObject::new(
            codes::METHOD_NOT_FOUND,
            format!(
                "method not found: {method} (plugd serves nexo/admin/agents/{{list,get}}, credentials/{{list,register,revoke}}, llm_providers/list, channels/{{list,doctor}}, transcripts/read)"
            ),
        )),
    }
}

/// The channel `params.channel` names and the plugin serving it; `instance`
/// must be absent, `null` or `"default"` (one instance per channel).
fn channel_of(rt: &Runtime, method: &str, params: &Value) -> Result<(String, String), ErrorObject> {
    let kind = req_str(method, params, "channel")?;
    match opt_str(method, params, "instance")? {
        None | Some("default") => {}
        Some(other) => {
            return Err(invalid(
                method,
                format!("instance {other:?}: plugd runs one instance per channel; omit instance"),
            ));
        }
    }
    rt.channel_kinds()
        .into_iter()
        .find(|(k, _)| k == kind)
        .ok_or_else(|| {
            let known: Vec<String> = rt.channel_kinds().into_iter().map(|(k, _)| k).collect();
            invalid(
                method,
                format!(
                    "unknown channel {kind:?} (channels here: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            )
        })
}
