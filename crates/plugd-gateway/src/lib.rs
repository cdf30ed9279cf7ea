//! plugd's MCP gateway: the governed catalog of every dialect served to any
//! MCP client.
//!
//! A [`Gateway`] is built once over the runtime and plugd.yaml; each client connection gets a [`Session`] (its negotiated
//! revision, capabilities, profile, in-flight calls and the requests plugd
//! sent it). A transport only moves JSON-RPC messages: [`stdio::serve`] for
//! `plugd mcp`, and plugd-server's Streamable HTTP at `/mcp` for `plugd
//! serve`. Every call takes the runtime's one governed path, as the CLI and
//! the HTTP API do (approval, disabled tools, schema validation, the
//! `before_tool_call` / `after_tool_result` hooks, the risk gate, the
//! record; [`plugd_runtime::governed`]); the gateway only turns a hook's
//! refusal into a tool error the model reads.
//!
//! Decisions written beside the code:
//! - tool names are [`plugd_mcp::names`] (stable, collision-free); an
//!   org identity's session serves the exports bound to its scope, each
//!   under its export id (the name `/v1/plugin-tools/{export}:invoke`
//!   takes), keeping the binding its first resolution chose for the
//!   session's lifetime while that binding still applies;
//! - a profile with `discovery: search` lists `search_tools` instead of
//!   every tool ([`search`]); what a search finds joins that session's list;
//! - a tool the caller may not see (profile, disabled) is answered exactly
//!   like one that does not exist, so policy does not reveal what exists;
//! - tool failures are `isError` results the model can read, protocol
//!   misuse is a JSON-RPC error;
//! - a `high` call is approved by the client's user through elicitation
//!   when the client supports it; a `critical` one only when the caller
//!   could approve it anyway (an admin), otherwise it waits for an
//!   operator like any other pending approval.

mod approve;
mod catalog;
mod hosted;
mod search;
mod session;
pub mod stdio;
mod tools;

use std::sync::Arc;

use plugd_runtime::Runtime;
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::mcp_config::ProfileMatcher;
use serde_json::Value;

pub use session::{Session, Sink};

/// The name and version plugd gives MCP clients (`serverInfo`).
pub const SERVER_NAME: &str = "plugd";

/// Why a session cannot be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The profile is not in plugd.yaml.
    #[error("no MCP profile {name:?} in plugd.yaml; known: {known}")]
    UnknownProfile {
        /// The name asked for.
        name: String,
        /// The profiles that exist, comma-separated (or "none").
        known: String,
    },
}

/// Who a session serves, as the surface authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The identity's name (`token:NAME`, a Unix user name).
    pub name: String,
    /// Whether the identity may decide pending calls itself (admin): only
    /// then may the client's own user approve a `critical` call.
    pub may_approve_critical: bool,
    /// The identity's role (`admin`, `agent`, …) when it has one, for
    /// plugd.yaml `limits:` rules `per: caller.role`.
    pub role: Option<String>,
    /// The identity's groups (OAuth/OIDC), for plugd.yaml `policy:` rules
    /// on `caller.groups`; empty for plugd tokens.
    pub groups: Vec<String>,
    /// The org (and projects) the identity is bound to: such a session
    /// sees the tool exports bound to its scope instead of the
    /// workspace's tools (see [`OrgScope`]); `None`: a workspace identity.
    pub org: Option<OrgScope>,
}

/// The scope of an identity bound to an org (a token made with `--org`):
/// its session serves the tool exports bound to the org (org-wide
/// bindings, and those of its project when it is limited to exactly one),
/// each under its export id, and nothing of the workspace's own tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgScope {
    /// The org.
    pub org_id: String,
    /// The projects the identity is limited to (empty: the whole org).
    pub project_ids: Vec<String>,
}

impl OrgScope {
    /// The project its calls are made for: its only project when it is
    /// limited to exactly one, else none (org-wide bindings only), as
    /// `POST /v1/plugin-tools/{export}:invoke` decides without a
    /// `project_id`.
    pub fn project(&self) -> Option<&str> {
        match self.project_ids.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }
}

/// What the gateway serves from; cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Runtime,
    config: Arc<PlugdConfig>,
    version: String,
    /// (server, URI) → how many sessions subscribed to it, so the server
    /// is unsubscribed only when the last one leaves.
    subscriptions: std::sync::Mutex<std::collections::HashMap<(String, String), usize>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("workspace", &self.inner.runtime.dir())
            .finish()
    }
}

impl Gateway {
    /// A gateway over `runtime` and plugd.yaml; `version` is what
    /// `serverInfo.version` says. Tool hooks are the runtime's: its calls
    /// take the runtime's governed path ([`plugd_runtime::governed`]).
    pub fn new(runtime: Runtime, config: Arc<PlugdConfig>, version: &str) -> Gateway {
        Gateway {
            inner: Arc::new(Inner {
                runtime,
                config,
                version: version.to_owned(),
                subscriptions: Default::default(),
            }),
        }
    }

    /// The runtime it serves.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// Counts one session's subscription to `server`'s `uri` in or out.
    pub(crate) fn count_subscription(&self, server: &str, uri: &str, on: bool) {
        let mut subs = session::lock(&self.inner.subscriptions);
        let key = (server.to_owned(), uri.to_owned());
        if on {
            *subs.entry(key).or_insert(0) += 1;
        } else if let Some(n) = subs.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                subs.remove(&key);
            }
        }
    }

    /// Whether any session is still subscribed to `server`'s `uri`.
    pub(crate) fn still_subscribed(&self, server: &str, uri: &str) -> bool {
        session::lock(&self.inner.subscriptions).contains_key(&(server.to_owned(), uri.to_owned()))
    }

    /// A new session for `caller` over `profile` (`None`: every tool).
    pub fn session(&self, caller: Caller, profile: Option<&str>) -> Result<Session, GatewayError> {
        let profile = match profile {
            None => None,
            Some(name) => Some((name.to_owned(), self.profile(name)?)),
        };
        Ok(Session::new(self.clone(), caller, profile))
    }

    /// Session `id` of `caller` over `profile`, rebuilt from the snapshot
    /// the state store kept ([`Session::snapshot`]); `Ok(None)` when the
    /// snapshot is not usable.
    pub fn restore_session(
        &self,
        id: &str,
        caller: Caller,
        profile: Option<&str>,
        snapshot: &Value,
    ) -> Result<Option<Session>, GatewayError> {
        let profile = match profile {
            None => None,
            Some(name) => Some((name.to_owned(), self.profile(name)?)),
        };
        Ok(Session::restore(
            self.clone(),
            id,
            caller,
            profile,
            snapshot,
        ))
    }

    fn profile(&self, name: &str) -> Result<ProfileMatcher, GatewayError> {
        // Under serve plugd.yaml is gated: a session opens on the profiles
        // in force now (a narrowed profile counts from the next session),
        // not on those serve started with.
        let rt = &self.inner.runtime;
        let live = rt
            .config_gated()
            .then(|| PlugdConfig::load(rt.dir()).ok())
            .flatten();
        let profiles = &live.as_ref().unwrap_or(&self.inner.config).mcp.profiles;
        profiles
            .get(name)
            .map(|p| p.matcher())
            .ok_or_else(|| GatewayError::UnknownProfile {
                name: name.to_owned(),
                known: if profiles.is_empty() {
                    "none".into()
                } else {
                    profiles.keys().cloned().collect::<Vec<_>>().join(", ")
                },
            })
    }
}
