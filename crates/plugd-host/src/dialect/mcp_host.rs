//! The host-wide MCP state every MCP connection shares and the runtime
//! reads: the broadcast of servers' announced changes ([`McpEvents`]), the
//! resources each server is subscribed to ([`McpSubscriptions`]), and who
//! answers servers' elicitation and sampling requests ([`McpRequests`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use plugd_wire::ErrorObject;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::broadcast;

/// Events buffered per receiver of [`McpEvents`]; a receiver that falls
/// further behind loses the oldest ones and is told how many.
pub const EVENT_CAPACITY: usize = 256;

/// A change an MCP server announced, as the host forwards it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum McpEvent {
    /// `notifications/resources/updated` for a subscribed URI.
    ResourceUpdated {
        /// Server (plugin id).
        server: String,
        /// The resource.
        uri: String,
    },
    /// `notifications/resources/list_changed`.
    ResourcesListChanged {
        /// Server (plugin id).
        server: String,
    },
    /// `notifications/prompts/list_changed`.
    PromptsListChanged {
        /// Server (plugin id).
        server: String,
    },
}

/// The host-wide broadcast of [`McpEvent`]s, shared by every MCP connection
/// (so a receiver keeps working across restarts). Cheap to clone.
#[derive(Debug, Clone)]
pub struct McpEvents(broadcast::Sender<McpEvent>);

impl Default for McpEvents {
    fn default() -> Self {
        McpEvents(broadcast::channel(EVENT_CAPACITY).0)
    }
}

impl McpEvents {
    /// A receiver of every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<McpEvent> {
        self.0.subscribe()
    }

    /// Sends `event` to whoever listens (nobody listening is fine).
    pub fn send(&self, event: McpEvent) {
        let _ = self.0.send(event);
    }
}

/// The resources each server is subscribed to, by plugin (not connection):
/// a restarted server is subscribed again. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct McpSubscriptions(Arc<RwLock<BTreeMap<String, BTreeSet<String>>>>);

impl McpSubscriptions {
    /// The URIs `server` is subscribed to.
    pub fn of(&self, server: &str) -> Vec<String> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(server)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether `server` is subscribed to `uri`.
    pub fn contains(&self, server: &str, uri: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(server)
            .is_some_and(|s| s.contains(uri))
    }

    /// How many resources `server` is subscribed to.
    pub fn count(&self, server: &str) -> usize {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(server)
            .map_or(0, BTreeSet::len)
    }

    /// Records `server`'s subscription to `uri`.
    pub fn insert(&self, server: &str, uri: &str) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(server.to_owned())
            .or_default()
            .insert(uri.to_owned());
    }

    /// Forgets `server`'s subscription to `uri`; whether there was one.
    pub fn remove(&self, server: &str, uri: &str) -> bool {
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        let Some(set) = map.get_mut(server) else {
            return false;
        };
        let had = set.remove(uri);
        if set.is_empty() {
            map.remove(server);
        }
        had
    }
}

/// A boxed future of a server request's answer.
pub type AnswerFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Value, ErrorObject>> + Send>>;

/// Who answers a hosted server's `elicitation/create` and
/// `sampling/createMessage` when no MCP client of a call in flight takes
/// them: the runtime (a person for elicitation; the configured LLM provider
/// for sampling, when the operator allows it for that server).
pub trait ServerRequests: Send + Sync {
    /// Answers request `method` (one of the two above) of server `server`;
    /// its result, or the error to answer the server with.
    fn answer(&self, server: &str, method: &str, params: Value) -> AnswerFuture;
}

/// The host's [`ServerRequests`], set once the runtime exists (every
/// connection shares the cell, so one set before or after a start counts).
#[derive(Clone, Default)]
pub struct McpRequests(Arc<std::sync::OnceLock<Arc<dyn ServerRequests>>>);

impl McpRequests {
    /// Sets the answerer; a second set is ignored (`false`).
    pub fn set(&self, answerer: Arc<dyn ServerRequests>) -> bool {
        self.0.set(answerer).is_ok()
    }

    /// The answerer, once set.
    pub fn get(&self) -> Option<&Arc<dyn ServerRequests>> {
        self.0.get()
    }
}

impl std::fmt::Debug for McpRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpRequests")
            .field("set", &self.0.get().is_some())
            .finish()
    }
}
