//! The resources, resource templates, prompts and completion of hosted MCP
//! servers, for every surface: per server, or listed over all servers with
//! each item carrying its server.
//!
//! Each request passes the same gate as a tool call, before anything starts:
//! the plugin exists and is an MCP server (any other dialect is refused
//! without starting it), it is approved and unchanged since, no operator
//! stopped it; then it is started on demand like a tool call and the request
//! goes to the connection current at that moment. Reading is governed by
//! plugd.yaml: `mcp.servers.NAME.resources: false` refuses every resource
//! request to that server (list, templates, read, subscribe, completion of
//! a resource reference), and the all-servers listing leaves it out. MCP's
//! default, resources allowed, holds otherwise; a plugd.yaml that does not
//! load refuses every resource request (fail closed) until it is fixed.
//!
//! An all-servers listing asks every approved MCP server at once; a server
//! without the capability is left out silently, one that fails is named in
//! [`Listing::errors`] and the others are still listed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use plugd_dialects::mcp_features::{FeatureError, ListKind};
use plugd_host::Conn;
use plugd_host::dialect::{McpEvent, McpEvents, McpSubscriptions};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::mcp_config::McpConfig;
use crate::{CallToolError, Runtime, RuntimeError, operator_stop};

/// One item of an all-servers listing: the item as its server gave it, and
/// the server (plugin id) it came from. Nothing is prefixed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerItem {
    /// The MCP server (its `.mcp.json` name, the plugin id).
    pub server: String,
    /// The resource, resource template or prompt, unchanged.
    pub item: Value,
}

/// A server an all-servers listing could not read, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerFailure {
    /// The MCP server.
    pub server: String,
    /// What failed, naming the server and the cause.
    pub error: String,
}

/// An all-servers listing: the items of every server that answered, and
/// the servers that failed.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Listing {
    /// Items, by server then in the server's order.
    pub items: Vec<ServerItem>,
    /// Servers that failed (the rest are listed regardless).
    pub errors: Vec<ServerFailure>,
}

impl Listing {
    /// One server's items in the all-servers shape.
    pub fn of_server(server: &str, items: Vec<Value>) -> Listing {
        Listing {
            items: items
                .into_iter()
                .map(|item| ServerItem {
                    server: server.to_owned(),
                    item,
                })
                .collect(),
            errors: Vec::new(),
        }
    }
}

/// What plugd.yaml says about reading MCP servers' resources.
#[derive(Debug, Clone)]
enum Policy {
    /// Servers whose resources are denied (`resources: false`).
    Denied(BTreeSet<String>),
    /// plugd.yaml did not load: nothing is read.
    Broken(String),
}

/// The runtime's MCP feature state: the resource policy, the host's event
/// broadcast and the subscriptions.
#[derive(Debug)]
pub(crate) struct McpFeatures {
    policy: RwLock<Policy>,
    events: McpEvents,
    subscriptions: McpSubscriptions,
}

impl McpFeatures {
    /// State over the host's `events` and `subscriptions`, with the policy
    /// of `config` (or, when plugd.yaml did not load, its error).
    pub(crate) fn new(
        config: Result<&McpConfig, String>,
        events: McpEvents,
        subscriptions: McpSubscriptions,
    ) -> Self {
        McpFeatures {
            policy: RwLock::new(policy_of(config)),
            events,
            subscriptions,
        }
    }

    /// Applies a new plugd.yaml's `mcp:` section.
    pub(crate) fn set_config(&self, config: &McpConfig) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = policy_of(Ok(config));
    }

    fn resources_refused(&self, server: &str) -> Option<String> {
        match &*self.policy.read().unwrap_or_else(|p| p.into_inner()) {
            Policy::Denied(set) if set.contains(server) => Some(format!(
                "plugd.yaml sets mcp.servers.{server}.resources: false; remove it to allow reading them"
            )),
            Policy::Denied(_) => None,
            Policy::Broken(why) => Some(format!(
                "plugd.yaml cannot be loaded ({why}), so no MCP resource is read; fix it"
            )),
        }
    }
}

fn policy_of(config: Result<&McpConfig, String>) -> Policy {
    match config {
        Ok(c) => Policy::Denied(
            c.servers
                .iter()
                .filter(|(_, s)| s.resources == Some(false))
                .map(|(name, _)| name.clone())
                .collect(),
        ),
        Err(why) => Policy::Broken(why),
    }
}

impl Runtime {
    /// The resources of MCP server `server`, as it lists them.
    pub async fn resources(&self, server: &str) -> Result<Vec<Value>, RuntimeError> {
        self.mcp_list(server, ListKind::Resources).await
    }

    /// The resource templates of `server`.
    pub async fn resource_templates(&self, server: &str) -> Result<Vec<Value>, RuntimeError> {
        self.mcp_list(server, ListKind::Templates).await
    }

    /// The prompts of `server`.
    pub async fn prompts(&self, server: &str) -> Result<Vec<Value>, RuntimeError> {
        self.mcp_list(server, ListKind::Prompts).await
    }

    /// The resources of every approved MCP server that offers them.
    pub async fn all_resources(&self) -> Listing {
        self.mcp_list_all(ListKind::Resources).await
    }

    /// The resource templates of every approved MCP server that offers them.
    pub async fn all_resource_templates(&self) -> Listing {
        self.mcp_list_all(ListKind::Templates).await
    }

    /// The prompts of every approved MCP server that offers them.
    pub async fn all_prompts(&self) -> Listing {
        self.mcp_list_all(ListKind::Prompts).await
    }

    /// `resources/read {uri}` on `server`: the result as the server gave it
    /// (`contents`, each with `uri`, `mimeType`, and `text` or base64 `blob`).
    pub async fn read_resource(&self, server: &str, uri: &str) -> Result<Value, RuntimeError> {
        let (conn, timeout) = self.mcp_conn(server, "resources").await?;
        let f = plugd_dialects::features(&conn, &conn.spec, "resources")?;
        Ok(f.read_resource(uri, timeout).await?)
    }

    /// `prompts/get {name, arguments}` on `server`: the result as the
    /// server gave it (`description`, `messages`).
    pub async fn get_prompt(
        &self,
        server: &str,
        name: &str,
        arguments: &BTreeMap<String, String>,
    ) -> Result<Value, RuntimeError> {
        self.get_prompt_with(server, name, arguments, None).await
    }

    /// [`Runtime::get_prompt`] for a client on the 2026-07-28 revision
    /// when `rounds` is set: those params (`inputResponses`,
    /// `requestState`) go to the server too, and an `input_required`
    /// result is returned as it is, for the client to answer.
    pub async fn get_prompt_with(
        &self,
        server: &str,
        name: &str,
        arguments: &BTreeMap<String, String>,
        rounds: Option<&serde_json::Map<String, Value>>,
    ) -> Result<Value, RuntimeError> {
        let (conn, timeout) = self.mcp_conn(server, "prompts").await?;
        let f = plugd_dialects::features(&conn, &conn.spec, "prompts")?;
        Ok(f.get_prompt_with(name, arguments, rounds, timeout).await?)
    }

    /// `completion/complete` on `server` for `reference` (`{"type":
    /// "ref/prompt", "name"}` or `{"type": "ref/resource", "uri"}`) and
    /// `argument` (`{"name", "value"}`), with the other arguments already
    /// chosen in `context` (`{"arguments": {...}}`): the `completion`
    /// object (`values`, `total`, `hasMore`). Completing a resource
    /// reference is a resource request (plugd.yaml may deny it).
    pub async fn complete(
        &self,
        server: &str,
        reference: &Value,
        argument: &Value,
        context: Option<&Value>,
    ) -> Result<Value, RuntimeError> {
        let of_resource = reference.get("type").and_then(Value::as_str) == Some("ref/resource");
        let feature = if of_resource {
            "resources"
        } else {
            "completion"
        };
        let (conn, timeout) = self.mcp_conn(server, feature).await?;
        let f = plugd_dialects::features(&conn, &conn.spec, "completion")?;
        Ok(f.complete(reference, argument, context, timeout).await?)
    }

    /// `resources/subscribe {uri}` on `server`; its updates arrive on
    /// [`Runtime::mcp_events`], also after the server restarts.
    pub async fn subscribe_resource(&self, server: &str, uri: &str) -> Result<(), RuntimeError> {
        let (conn, timeout) = self.mcp_conn(server, "resources").await?;
        let f = plugd_dialects::features(&conn, &conn.spec, "resources")?;
        let subs = &self.inner.mcp_features.subscriptions;
        Ok(f.subscribe(uri, subs, timeout).await?)
    }

    /// `resources/unsubscribe {uri}` on `server` (if it runs; the
    /// subscription is forgotten either way).
    pub async fn unsubscribe_resource(&self, server: &str, uri: &str) -> Result<(), RuntimeError> {
        let sup = self.supervised(server)?;
        let subs = &self.inner.mcp_features.subscriptions;
        let Some(conn) = sup.current() else {
            subs.remove(server, uri);
            return Ok(());
        };
        let f = plugd_dialects::features(&conn, &conn.spec, "resources")?;
        Ok(f.unsubscribe(uri, subs, sup.call_timeout()).await?)
    }

    /// Every resource update and list change MCP servers announce from now
    /// on (a receiver that falls behind by more than
    /// [`plugd_host::dialect::EVENT_CAPACITY`] events loses
    /// the oldest and is told how many).
    pub fn mcp_events(&self) -> broadcast::Receiver<McpEvent> {
        self.inner.mcp_features.events.subscribe()
    }

    /// The MCP servers of the workspace that are approved, unchanged and
    /// not stopped by an operator, sorted.
    pub async fn mcp_servers(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (id, sup) in self.inner.plugins.iter() {
            if plugd_dialects::of(sup.spec().dialect)
                .capabilities()
                .server_features
                && operator_stop(&sup).is_none()
                && self.check_approved(&id).await.is_ok()
            {
                out.push(id);
            }
        }
        out
    }

    async fn mcp_list(&self, server: &str, kind: ListKind) -> Result<Vec<Value>, RuntimeError> {
        let feature = feature_of(kind);
        let (conn, timeout) = self.mcp_conn(server, feature).await?;
        let f = plugd_dialects::features(&conn, &conn.spec, feature)?;
        Ok(f.list(kind, timeout).await?.as_ref().clone())
    }

    async fn mcp_list_all(&self, kind: ListKind) -> Listing {
        let feature = feature_of(kind);
        let servers: Vec<String> = self
            .mcp_servers()
            .await
            .into_iter()
            .filter(|s| {
                feature != "resources" || self.inner.mcp_features.resources_refused(s).is_none()
            })
            .collect();
        let asks = servers.iter().map(|s| async move {
            let conn = self.mcp_conn(s, feature).await?;
            let f = plugd_dialects::features(&conn.0, &conn.0.spec, feature)?;
            if !f.has(kind.capability()) {
                return Ok(None);
            }
            Ok::<_, RuntimeError>(Some(f.list(kind, conn.1).await?))
        });
        let mut listing = Listing::default();
        for (server, result) in servers
            .iter()
            .zip(futures_util::future::join_all(asks).await)
        {
            match result {
                Ok(Some(items)) => listing.items.extend(items.iter().map(|item| ServerItem {
                    server: server.clone(),
                    item: item.clone(),
                })),
                Ok(None) => {}
                Err(e) => listing.errors.push(ServerFailure {
                    server: server.clone(),
                    error: e.to_string(),
                }),
            }
        }
        listing
    }

    /// The gate of every MCP feature request, then the current connection
    /// (started on demand) and the call timeout.
    async fn mcp_conn(
        &self,
        server: &str,
        feature: &'static str,
    ) -> Result<(Arc<Conn>, Duration), RuntimeError> {
        let sup = self.supervised(server)?;
        plugd_dialects::features_supported(sup.spec(), feature)?;
        self.check_approved(server).await?;
        if feature == "resources"
            && let Some(why) = self.inner.mcp_features.resources_refused(server)
        {
            return Err(RuntimeError::ResourcesDenied {
                server: server.to_owned(),
                why,
            });
        }
        if let Some(reason) = operator_stop(&sup) {
            return Err(RuntimeError::Stopped {
                plugin: server.to_owned(),
                reason,
            });
        }
        sup.call_connection()
            .await
            .map_err(|e| RuntimeError::Call(CallToolError::Plugin(e)))
    }

    /// Approved, and unchanged since (as last digested).
    async fn check_approved(&self, id: &str) -> Result<(), RuntimeError> {
        let approval =
            self.inner
                .state
                .approval(id)
                .await?
                .ok_or_else(|| RuntimeError::NotApproved {
                    plugin: id.to_owned(),
                })?;
        match self.digest_now(id, false) {
            Ok(d) if d == approval.digest => Ok(()),
            Ok(_) => Err(RuntimeError::PluginChanged {
                plugin: id.to_owned(),
                files: self
                    .inner
                    .withheld
                    .get(id)
                    .map(|w| w.files)
                    .unwrap_or_else(|| "its files differ from the approved ones".into()),
            }),
            Err(error) => Err(RuntimeError::Broken {
                name: id.to_owned(),
                error,
            }),
        }
    }
}

fn feature_of(kind: ListKind) -> &'static str {
    match kind {
        ListKind::Resources | ListKind::Templates => "resources",
        ListKind::Prompts => "prompts",
    }
}

impl From<FeatureError> for RuntimeError {
    fn from(e: FeatureError) -> Self {
        RuntimeError::Feature(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp_config::McpServerConfig;

    #[test]
    fn resources_are_allowed_unless_denied_and_a_broken_config_refuses_all() {
        let mut config = McpConfig::default();
        config.servers.insert(
            "closed".into(),
            McpServerConfig {
                resources: Some(false),
                ..McpServerConfig::default()
            },
        );
        config.servers.insert(
            "open".into(),
            McpServerConfig {
                resources: Some(true),
                ..McpServerConfig::default()
            },
        );
        let f = McpFeatures::new(
            Ok(&config),
            McpEvents::default(),
            McpSubscriptions::default(),
        );
        let why = f.resources_refused("closed").unwrap();
        assert!(why.contains("mcp.servers.closed.resources: false"), "{why}");
        assert!(f.resources_refused("open").is_none());
        assert!(f.resources_refused("unlisted").is_none(), "MCP's default");
        f.set_config(&McpConfig::default());
        assert!(f.resources_refused("closed").is_none());

        let broken = McpFeatures::new(
            Err("line 3: bad".into()),
            McpEvents::default(),
            McpSubscriptions::default(),
        );
        let why = broken.resources_refused("any").unwrap();
        assert!(
            why.contains("line 3: bad") && why.contains("fix it"),
            "{why}"
        );
    }
}
