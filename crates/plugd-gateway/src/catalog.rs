//! Resources, resource templates, prompts and completion of the hosted MCP
//! servers, and Salmex skills as prompts, served through the gateway.
//!
//! Names say where an item comes from, reversibly:
//! - a resource URI becomes `plugd:///SERVER/ORIGINAL` (the original URI
//!   unchanged after the server's name; server names hold no `/`), and so
//!   does a template's `uriTemplate`, so a client's expansion of it reads
//!   back to the server's own template;
//! - a prompt `NAME` of server (or Salmex plugin) `P` is named like a tool,
//!   [`plugd_mcp::mcp_name`] of `P/NAME` (`everything__simple-prompt`).
//!
//! A bare-names profile that holds exactly one MCP server serves that
//! server's URIs and prompt names unchanged. Servers outside the session's
//! profile do not exist for it, like tools.

use std::collections::{BTreeMap, BTreeSet};

use plugd_control::{Code, ServiceError};
use plugd_mcp::names::{mcp_name, registry_name_hint};
use plugd_runtime::RuntimeError;
use plugd_runtime::mcp_features::Listing;
use serde_json::{Value, json};

use crate::session::{Session, code, error};

/// The prefix of a resource URI the gateway serves.
pub const URI_PREFIX: &str = "plugd:///";

/// The MCP servers (and Salmex plugins with skills) `session` may see.
pub(crate) struct Scope {
    servers: BTreeSet<String>,
    /// The one server a bare-names profile fronts: its names pass as they are.
    bare: Option<String>,
}

pub(crate) async fn scope(session: &Session) -> Scope {
    let rt = session.inner.gw.runtime();
    let all: BTreeSet<String> = rt.mcp_servers().await.into_iter().collect();
    let Some((_, m)) = &session.inner.profile else {
        return Scope {
            servers: all,
            bare: None,
        };
    };
    let with_tools: BTreeSet<String> = rt
        .tools()
        .iter()
        .filter(|t| m.matches(&t.plugin, &t.name))
        .map(|t| t.plugin.clone())
        .collect();
    let servers: BTreeSet<String> = all
        .into_iter()
        .filter(|s| m.matches(s, "") || with_tools.contains(s))
        .collect();
    let bare = (m.bare_names && servers.len() == 1)
        .then(|| servers.iter().next().cloned())
        .flatten();
    Scope { servers, bare }
}

impl Scope {
    pub(crate) fn has(&self, server: &str) -> bool {
        self.servers.contains(server)
    }

    fn uri_out(&self, server: &str, uri: &str) -> String {
        if self.bare.is_some() {
            uri.to_owned()
        } else {
            format!("{URI_PREFIX}{server}/{uri}")
        }
    }

    /// The server and original URI behind a URI a client sent.
    fn uri_in(&self, uri: &str) -> Option<(String, String)> {
        if let Some(server) = &self.bare {
            return Some((server.clone(), uri.to_owned()));
        }
        let rest = uri.strip_prefix(URI_PREFIX)?;
        let (server, original) = rest.split_once('/')?;
        (self.has(server) && !original.is_empty()).then(|| (server.to_owned(), original.to_owned()))
    }

    fn prompt_out(&self, owner: &str, name: &str) -> String {
        if self.bare.is_some() {
            name.to_owned()
        } else {
            mcp_name(&format!("{owner}/{name}"))
        }
    }
}

/// The gateway's table over the one list of error codes
/// ([`plugd_control::Code`]): the JSON-RPC error code a runtime error
/// answers a listing or read with.
fn rpc_code(c: Code) -> i64 {
    match c {
        Code::UnknownPlugin => code::INVALID_PARAMS,
        _ => code::INTERNAL,
    }
}

/// A runtime error as the client's JSON-RPC error: a hosted server's own
/// error reply as it sent it ([`crate::hosted::rpc_error`]), anything else
/// by the table above.
fn runtime_error(e: RuntimeError) -> Value {
    if let Some(remote) = crate::hosted::rpc_error(&e) {
        return remote;
    }
    let e = ServiceError::from(e);
    error(rpc_code(e.code), e.message)
}

fn log_failures(listing: &Listing, what: &str) {
    for f in &listing.errors {
        tracing::warn!(server = %f.server, error = %f.error, "MCP {what} listing of a server failed; the others are served");
    }
}

/// The items of `listing` from servers `scope` holds, each with its
/// `field` renamed by `rename` (server, original) for the client.
fn served(
    scope: &Scope,
    listing: Listing,
    what: &str,
    field: &str,
    rename: impl Fn(&Scope, &str, &str) -> String,
) -> Vec<Value> {
    log_failures(&listing, what);
    listing
        .items
        .into_iter()
        .filter(|i| scope.has(&i.server))
        .filter_map(|i| {
            let mut item = i.item;
            let original = item.get(field)?.as_str()?.to_owned();
            item[field] = json!(rename(scope, &i.server, &original));
            Some(item)
        })
        .collect()
}

/// `resources/list`.
pub(crate) async fn resources(session: &Session) -> Result<Value, Value> {
    let scope = scope(session).await;
    let listing = session.inner.gw.runtime().all_resources().await;
    let out = served(&scope, listing, "resources", "uri", Scope::uri_out);
    Ok(json!({"resources": out}))
}

/// `resources/templates/list`.
pub(crate) async fn templates(session: &Session) -> Result<Value, Value> {
    let scope = scope(session).await;
    let listing = session.inner.gw.runtime().all_resource_templates().await;
    let out = served(
        &scope,
        listing,
        "resource templates",
        "uriTemplate",
        Scope::uri_out,
    );
    Ok(json!({"resourceTemplates": out}))
}

fn uri_param(params: &Value) -> Result<&str, Value> {
    params
        .get("uri")
        .and_then(Value::as_str)
        .ok_or_else(|| error(code::INVALID_PARAMS, "needs a \"uri\""))
}

/// A URI no server of the session has: `-32002` up to 2025-11-25,
/// `-32602` (invalid params) from 2026-07-28 (SEP-2164), the URI in `data`.
fn unknown_resource(uri: &str, stateless: bool) -> Value {
    let code = if stateless {
        code::INVALID_PARAMS
    } else {
        -32002
    };
    json!({"code": code, "message": format!("Resource not found: {uri}"), "data": {"uri": uri}})
}

/// `resources/read`: the server's result, its URIs in the client's form; a
/// server's own error names the URI the client sent.
pub(crate) async fn read(
    session: &Session,
    params: &Value,
    stateless: bool,
) -> Result<Value, Value> {
    let uri = uri_param(params)?;
    let scope = scope(session).await;
    let Some((server, original)) = scope.uri_in(uri) else {
        return Err(unknown_resource(uri, stateless));
    };
    let mut out = session
        .inner
        .gw
        .runtime()
        .read_resource(&server, &original)
        .await
        .map_err(|e| {
            let mut e = runtime_error(e);
            if let Some(data) = e.get_mut("data").and_then(Value::as_object_mut)
                && data.contains_key("uri")
            {
                data.insert("uri".into(), json!(uri));
            }
            e
        })?;
    if let Some(contents) = out.get_mut("contents").and_then(Value::as_array_mut) {
        for c in contents {
            if let Some(u) = c.get("uri").and_then(Value::as_str).map(str::to_owned) {
                c["uri"] = json!(scope.uri_out(&server, &u));
            }
        }
    }
    Ok(out)
}

/// `resources/subscribe` and `resources/unsubscribe`.
pub(crate) async fn subscribe(session: &Session, params: &Value, on: bool) -> Result<Value, Value> {
    let uri = uri_param(params)?;
    let scope = scope(session).await;
    let Some((server, original)) = scope.uri_in(uri) else {
        return Err(unknown_resource(uri, false));
    };
    let rt = session.inner.gw.runtime();
    if on {
        rt.subscribe_resource(&server, &original)
            .await
            .map_err(runtime_error)?;
        session.subscribed(&server, &original, uri, true);
    } else {
        session.subscribed(&server, &original, uri, false);
        if !session.inner.gw.still_subscribed(&server, &original) {
            rt.unsubscribe_resource(&server, &original)
                .await
                .map_err(runtime_error)?;
        }
    }
    Ok(json!({}))
}

/// `prompts/list`: the hosted servers' prompts and the Salmex skills.
pub(crate) async fn prompts(session: &Session) -> Result<Value, Value> {
    let scope = scope(session).await;
    let rt = session.inner.gw.runtime();
    let listing = rt.all_prompts().await;
    let mut out = served(&scope, listing, "prompts", "name", Scope::prompt_out);
    if scope.bare.is_none() {
        for skill in skills(session).await {
            out.push(json!({
                "name": mcp_name(&format!("{}/{}", skill.plugin, skill.name)),
                "title": format!("{} skill {}", skill.plugin, skill.name),
                "description": format!("The {} skill of plugin {}, as instructions", skill.name, skill.plugin),
            }));
        }
    }
    Ok(json!({"prompts": out}))
}

/// The skills `session` may see (of plugins in its profile).
async fn skills(session: &Session) -> Vec<plugd_runtime::skills::SkillInfo> {
    let rt = session.inner.gw.runtime();
    rt.skills()
        .await
        .into_iter()
        .filter(|s| s.error.is_none())
        .filter(|s| match &session.inner.profile {
            None => true,
            Some((_, m)) => m.matches(&s.plugin, ""),
        })
        .collect()
}

/// The owner (server or skill plugin) and original name of a prompt name a
/// client sent.
async fn prompt_in(session: &Session, scope: &Scope, name: &str) -> Option<(String, String)> {
    if let Some(server) = &scope.bare {
        return Some((server.clone(), name.to_owned()));
    }
    if let Some(plugd) = registry_name_hint(name)
        && let Some((owner, original)) = plugd.split_once('/')
        && mcp_name(&plugd) == name
    {
        return Some((owner.to_owned(), original.to_owned()));
    }
    // A name with a hash suffix: find it among what is served.
    let listing = session.inner.gw.runtime().all_prompts().await;
    let from_servers = listing.items.into_iter().filter_map(|i| {
        let n = i.item.get("name")?.as_str()?.to_owned();
        Some((i.server, n))
    });
    let from_skills = skills(session)
        .await
        .into_iter()
        .map(|s| (s.plugin, s.name));
    from_servers
        .chain(from_skills)
        .find(|(owner, n)| mcp_name(&format!("{owner}/{n}")) == name)
}

fn unknown_prompt(name: &str) -> Value {
    error(code::INVALID_PARAMS, format!("Unknown prompt: {name}"))
}

/// `prompts/get`.
///
/// `stateless`: the client is on 2026-07-28, so a server's
/// `input_required` result passes to it, and its `inputResponses` and
/// `requestState` on to the server ([`crate::hosted`]).
pub(crate) async fn get_prompt(
    session: &Session,
    params: &Value,
    stateless: bool,
) -> Result<Value, Value> {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err(error(code::INVALID_PARAMS, "prompts/get needs a \"name\""));
    };
    let scope = scope(session).await;
    let Some((owner, original)) = prompt_in(session, &scope, name).await else {
        return Err(unknown_prompt(name));
    };
    let rt = session.inner.gw.runtime();
    if scope.has(&owner) {
        let mut args = BTreeMap::new();
        if let Some(obj) = params.get("arguments").and_then(Value::as_object) {
            for (k, v) in obj {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                args.insert(k.clone(), v);
            }
        }
        let rounds = stateless.then(|| crate::hosted::round_params(params).unwrap_or_default());
        let mut out = rt
            .get_prompt_with(&owner, &original, &args, rounds.as_ref())
            .await
            .map_err(runtime_error)?;
        rewrite_embedded_uris(&scope, &owner, &mut out);
        return Ok(out);
    }
    if skills(session)
        .await
        .iter()
        .any(|s| s.plugin == owner && s.name == original)
    {
        let skill = rt
            .skill(&owner, &original)
            .await
            .map_err(|e| error(code::INTERNAL, e.to_string()))?;
        return Ok(json!({
            "description": format!("The {} skill of plugin {}", skill.name, skill.plugin),
            "messages": [{"role": "user", "content": {"type": "text", "text": skill.text}}],
        }));
    }
    Err(unknown_prompt(name))
}

/// Embedded resources in prompt messages name URIs of the server.
fn rewrite_embedded_uris(scope: &Scope, server: &str, out: &mut Value) {
    let Some(messages) = out.get_mut("messages").and_then(Value::as_array_mut) else {
        return;
    };
    for m in messages {
        if let Some(res) = m.get_mut("content").and_then(|c| c.get_mut("resource"))
            && let Some(u) = res.get("uri").and_then(Value::as_str).map(str::to_owned)
        {
            res["uri"] = json!(scope.uri_out(server, &u));
        }
    }
}

/// `completion/complete` for a prompt's or a resource template's argument.
pub(crate) async fn complete(session: &Session, params: &Value) -> Result<Value, Value> {
    let reference = params
        .get("ref")
        .ok_or_else(|| error(code::INVALID_PARAMS, "completion/complete needs a \"ref\""))?;
    let argument = params.get("argument").ok_or_else(|| {
        error(
            code::INVALID_PARAMS,
            "completion/complete needs an \"argument\"",
        )
    })?;
    let scope = scope(session).await;
    let empty = json!({"completion": {"values": [], "hasMore": false}});
    let (server, reference) = match reference.get("type").and_then(Value::as_str) {
        Some("ref/prompt") => {
            let name = reference.get("name").and_then(Value::as_str).unwrap_or("");
            match prompt_in(session, &scope, name).await {
                Some((owner, original)) if scope.has(&owner) => {
                    (owner, json!({"type": "ref/prompt", "name": original}))
                }
                // A skill takes no arguments.
                Some(_) => return Ok(empty),
                None => return Err(unknown_prompt(name)),
            }
        }
        Some("ref/resource") => {
            let uri = reference.get("uri").and_then(Value::as_str).unwrap_or("");
            match scope.uri_in(uri) {
                Some((server, original)) => {
                    (server, json!({"type": "ref/resource", "uri": original}))
                }
                None => return Err(unknown_resource(uri, false)),
            }
        }
        _ => {
            return Err(error(
                code::INVALID_PARAMS,
                "\"ref\" must be {\"type\": \"ref/prompt\", \"name\"} or {\"type\": \"ref/resource\", \"uri\"}",
            ));
        }
    };
    let completion = session
        .inner
        .gw
        .runtime()
        .complete(&server, &reference, argument, params.get("context"))
        .await
        .map_err(runtime_error)?;
    Ok(json!({"completion": completion}))
}
