//! The MCP server features beyond tools, as a client: resources (list,
//! templates, read, subscribe), prompts (list, get) and completion.
//!
//! * A method is sent only when the server declared its capability in its
//!   `initialize` reply (`resources`, `resources.subscribe`, `prompts`,
//!   `completions`); otherwise [`FeatureError::NotDeclared`] names the server
//!   and the capability, without a round trip.
//! * Listings follow `nextCursor` over at most [`MAX_PAGES`] pages and keep at
//!   most [`MAX_ITEMS`] items and, all pages together, no more bytes than one
//!   frame may carry ([`Peer::max_frame`]); a server past a bound is refused,
//!   naming server and method. One reply is bounded by the frame limit itself
//!   (the peer refuses a bigger frame unread).
//! * Items and replies are kept as the server gave them (`title`,
//!   `description`, `mimeType`, `annotations`, `icons`, `size`, `_meta`, …);
//!   only their shape is checked. A listed item without its required string
//!   fields is skipped with a warning; a reply of the wrong shape is an error.
//! * A server that declares `listChanged` for resources or prompts has its
//!   listing cached on the connection; `notifications/resources/list_changed`
//!   (`prompts/list_changed`) drops the cache, so the next listing re-reads
//!   it, and is forwarded as an [`McpEvent`](plugd_host::dialect::McpEvent). Other servers are asked each
//!   time.
//! * Subscriptions belong to the plugin, not the connection
//!   ([`McpSubscriptions`]): a restarted server is subscribed again during
//!   its handshake, and `notifications/resources/updated` for a subscribed
//!   URI is forwarded on the host's [`McpEvents`](plugd_host::dialect::McpEvents) broadcast.
//!
//! **Why one file** (~800 product lines): resources, templates, prompts
//! and completion are one client feature set with one capability check, one
//! bounded pagination (`page_of`) and one listing cache (`FeatureState`);
//! split per feature, each would restate those bounds.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};

use crate::mcp::{MAX_PAGES, McpState, preview};
use plugd_host::dialect::McpSubscriptions;
use plugd_host::peer::{CallError, Peer};
use plugd_host::supervisor::Conn;

/// Most items kept from one listing (resources, templates or prompts).
pub const MAX_ITEMS: usize = 10_000;

/// Longest resource URI plugd sends or accepts, in bytes.
pub const MAX_URI: usize = 8 * 1024;

/// Most resources subscribed on one server.
pub const MAX_SUBSCRIPTIONS: usize = 1024;

/// Most values of one completion (the MCP limit); more are cut, with
/// `hasMore: true`.
pub const MAX_COMPLETIONS: usize = 100;

/// A server capability a method needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// `resources`.
    Resources,
    /// `resources.subscribe: true`.
    Subscribe,
    /// `prompts`.
    Prompts,
    /// `completions`.
    Completions,
}

impl Capability {
    /// The capability as `initialize` names it.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Resources => "resources",
            Capability::Subscribe => "resources.subscribe",
            Capability::Prompts => "prompts",
            Capability::Completions => "completions",
        }
    }

    /// Whether `caps` (the `capabilities` of an `initialize` reply) declares it.
    pub fn declared_in(self, caps: &Value) -> bool {
        let present = |k: &str| caps.get(k).is_some_and(|v| !v.is_null());
        match self {
            Capability::Resources => present("resources"),
            Capability::Subscribe => {
                caps.get("resources")
                    .and_then(|r| r.get("subscribe"))
                    .and_then(Value::as_bool)
                    == Some(true)
            }
            Capability::Prompts => present("prompts"),
            Capability::Completions => present("completions"),
        }
    }
}

/// One of the three listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListKind {
    /// `resources/list`.
    Resources,
    /// `resources/templates/list`.
    Templates,
    /// `prompts/list`.
    Prompts,
}

impl ListKind {
    /// The method.
    pub fn method(self) -> &'static str {
        match self {
            ListKind::Resources => "resources/list",
            ListKind::Templates => "resources/templates/list",
            ListKind::Prompts => "prompts/list",
        }
    }

    /// The reply's array member.
    fn field(self) -> &'static str {
        match self {
            ListKind::Resources => "resources",
            ListKind::Templates => "resourceTemplates",
            ListKind::Prompts => "prompts",
        }
    }

    /// What the listing needs declared.
    pub fn capability(self) -> Capability {
        match self {
            ListKind::Resources | ListKind::Templates => Capability::Resources,
            ListKind::Prompts => Capability::Prompts,
        }
    }

    /// The string members every item must have.
    fn required(self) -> &'static [&'static str] {
        match self {
            ListKind::Resources => &["uri", "name"],
            ListKind::Templates => &["uriTemplate", "name"],
            ListKind::Prompts => &["name"],
        }
    }

    fn noun(self) -> &'static str {
        match self {
            ListKind::Resources => "resource",
            ListKind::Templates => "resource template",
            ListKind::Prompts => "prompt",
        }
    }

    /// Whether the server says it announces changes to this listing (then
    /// it is cached until it does).
    fn announces_changes(self, caps: &Value) -> bool {
        let key = match self {
            ListKind::Resources | ListKind::Templates => "resources",
            ListKind::Prompts => "prompts",
        };
        caps.get(key)
            .and_then(|c| c.get("listChanged"))
            .and_then(Value::as_bool)
            == Some(true)
    }
}

/// Why a resource, prompt or completion request failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FeatureError {
    /// The plugin's dialect has no such feature (only MCP has).
    #[error(
        "plugin {plugin:?} speaks the {dialect} dialect, which has no {feature}; only MCP servers (.mcp.json) offer resources, prompts and completion"
    )]
    NotSupported {
        /// Plugin id.
        plugin: String,
        /// Its dialect.
        dialect: String,
        /// What was asked for (`resources`, `prompts`, `completion`).
        feature: &'static str,
    },
    /// The server did not declare the capability the method needs.
    #[error(
        "MCP server {server:?} does not offer {capability} (its initialize reply declares no \"{capability}\" capability), so plugd does not send it {method}"
    )]
    NotDeclared {
        /// Server (plugin id).
        server: String,
        /// The missing capability.
        capability: &'static str,
        /// The method not sent.
        method: &'static str,
    },
    /// The request itself is unusable (empty or oversized URI, bad reference).
    #[error("{method} to MCP server {server:?} not sent: {reason}")]
    Invalid {
        /// Server (plugin id).
        server: String,
        /// The method.
        method: &'static str,
        /// What is wrong and what to do.
        reason: String,
    },
    /// The reply does not have the shape the method's result has.
    #[error("MCP server {server:?} answered {method} with an unusable reply: {reason}")]
    Malformed {
        /// Server (plugin id).
        server: String,
        /// The method.
        method: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The reply (or the listing) is over one of plugd's bounds.
    #[error("MCP server {server:?} answered {method} with too much: {reason}; plugd refused it")]
    TooLarge {
        /// Server (plugin id).
        server: String,
        /// The method.
        method: &'static str,
        /// Which bound, and by how much.
        reason: String,
    },
    /// The call failed (error reply, timeout, crash, oversized frame).
    #[error(transparent)]
    Call(#[from] CallError),
}

/// The `_meta` entries every request of a stateless (2026-07-28)
/// connection carries: unset on a connection that made the `initialize`
/// handshake. Shared between a connection's [`FeatureState`] (set by the
/// handshake) and its envelope, which stamps them on each request.
pub type Envelope = Arc<OnceLock<serde_json::Map<String, Value>>>;

/// What a connection knows about the server's features: its declared
/// capabilities and the cached listings. Lives in the MCP [`McpState`].
#[derive(Debug, Default)]
pub struct FeatureState {
    /// The `capabilities` of the `initialize` reply (or `server/discover`).
    capabilities: OnceLock<Value>,
    /// The per-request `_meta` of a stateless connection.
    envelope: Envelope,
    cache: Mutex<HashMap<ListKind, Arc<Vec<Value>>>>,
    /// Bumped by every list_changed, so a listing read across one is not cached.
    generation: AtomicU64,
}

impl FeatureState {
    /// Records the server's capabilities (once, from the handshake).
    pub fn set_capabilities(&self, caps: Value) {
        let _ = self.capabilities.set(caps);
    }

    /// The `_meta` cell of this connection, for its envelope to read.
    pub fn envelope(&self) -> Envelope {
        self.envelope.clone()
    }

    /// Makes this connection stateless: every later request carries `meta`
    /// (set once, by the handshake).
    pub fn set_stateless(&self, meta: serde_json::Map<String, Value>) {
        let _ = self.envelope.set(meta);
    }

    /// The stateless revision this connection speaks, when it speaks one
    /// (`None` after an `initialize` handshake).
    pub fn stateless_revision(&self) -> Option<&str> {
        self.envelope
            .get()?
            .get(plugd_mcp::META_PROTOCOL_VERSION)?
            .as_str()
    }

    /// The server's declared capabilities (`{}` before the handshake).
    pub fn capabilities(&self) -> &Value {
        static EMPTY: OnceLock<Value> = OnceLock::new();
        self.capabilities
            .get()
            .unwrap_or_else(|| EMPTY.get_or_init(|| json!({})))
    }

    /// Drops the cached listings of `kinds` (a list_changed came).
    pub fn invalidate(&self, kinds: &[ListKind]) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        for k in kinds {
            cache.remove(k);
        }
    }

    fn cached(&self, kind: ListKind) -> Option<Arc<Vec<Value>>> {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&kind)
            .cloned()
    }
}

/// The features of one running MCP server: borrow it from a [`Conn`] with
/// [`crate::features`].
pub struct Features<'a> {
    peer: &'a Peer,
    state: &'a McpState,
    server: &'a str,
}

impl std::fmt::Debug for Features<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Features")
            .field("server", &self.server)
            .finish()
    }
}

impl<'a> Features<'a> {
    /// The features of `conn`, an MCP server's connection.
    pub(crate) fn of(conn: &'a Conn) -> Result<Features<'a>, FeatureError> {
        let server = &**conn.peer.plugin();
        let state = conn
            .state
            .as_ref()
            .and_then(|s| s.downcast_ref::<McpState>())
            .ok_or_else(|| FeatureError::NotSupported {
                plugin: server.to_owned(),
                dialect: conn.spec.dialect.to_string(),
                feature: "resources, prompts or completion",
            })?;
        Ok(Features {
            peer: &conn.peer,
            state,
            server,
        })
    }

    /// The server's declared capabilities.
    pub fn capabilities(&self) -> &Value {
        self.state.features.capabilities()
    }

    /// Whether the server declared `cap`.
    pub fn has(&self, cap: Capability) -> bool {
        cap.declared_in(self.capabilities())
    }

    fn require(&self, cap: Capability, method: &'static str) -> Result<(), FeatureError> {
        if self.has(cap) {
            Ok(())
        } else {
            Err(FeatureError::NotDeclared {
                server: self.server.to_owned(),
                capability: cap.name(),
                method,
            })
        }
    }

    fn malformed(&self, method: &'static str, reason: String) -> FeatureError {
        FeatureError::Malformed {
            server: self.server.to_owned(),
            method,
            reason,
        }
    }

    fn invalid(&self, method: &'static str, reason: String) -> FeatureError {
        FeatureError::Invalid {
            server: self.server.to_owned(),
            method,
            reason,
        }
    }

    /// Every item of `kind`, as the server listed them (cached while the
    /// server announces changes to it).
    pub async fn list(
        &self,
        kind: ListKind,
        timeout: Duration,
    ) -> Result<Arc<Vec<Value>>, FeatureError> {
        self.require(kind.capability(), kind.method())?;
        let features = &self.state.features;
        let cache = kind.announces_changes(self.capabilities());
        if cache && let Some(hit) = features.cached(kind) {
            return Ok(hit);
        }
        let generation = features.generation.load(Ordering::Acquire);
        let items = Arc::new(self.read_listing(kind, timeout).await?);
        if cache {
            let mut map = features.cache.lock().unwrap_or_else(|p| p.into_inner());
            // A list_changed that came while reading makes this stale.
            if features.generation.load(Ordering::Acquire) == generation {
                map.insert(kind, items.clone());
            }
        }
        Ok(items)
    }

    async fn read_listing(
        &self,
        kind: ListKind,
        timeout: Duration,
    ) -> Result<Vec<Value>, FeatureError> {
        let method = kind.method();
        let deadline = tokio::time::Instant::now() + timeout;
        let byte_cap = self.peer.max_frame();
        let too_large = |reason: String| FeatureError::TooLarge {
            server: self.server.to_owned(),
            method,
            reason,
        };
        let mut items = Vec::new();
        let mut bytes = 0usize;
        let mut cursors = HashSet::new();
        let mut cursor: Option<String> = None;
        for page in 0.. {
            if page >= MAX_PAGES {
                return Err(too_large(format!(
                    "still more pages after {MAX_PAGES}; plugd reads at most {MAX_PAGES}"
                )));
            }
            let params = cursor.as_ref().map(|c| json!({"cursor": c}));
            let left = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .max(Duration::from_millis(1));
            let reply = self.peer.call(method, params, left).await?;
            let Page { list, next } = page_of(kind, reply)
                .map_err(|r| self.malformed(method, format!("page {page}: {r}")))?;
            if items.len() + list.len() > MAX_ITEMS {
                return Err(too_large(format!(
                    "more than {MAX_ITEMS} {}s (page {page} alone has {})",
                    kind.noun(),
                    list.len()
                )));
            }
            for (i, item) in list.into_iter().enumerate() {
                if let Err(why) = check_item(kind, &item) {
                    tracing::warn!(plugin = %self.server, "{method} page {page}, item {i} skipped: {why}");
                    continue;
                }
                bytes += json_len(&item);
                if bytes > byte_cap {
                    return Err(too_large(format!(
                        "the {}s listed add up to more than {byte_cap} bytes (the frame limit, PLUGD_MAX_FRAME_BYTES)",
                        kind.noun()
                    )));
                }
                items.push(item);
            }
            let Some(next) = next else { break };
            if !cursors.insert(next.clone()) {
                return Err(self.malformed(
                    method,
                    format!(
                        "cursor {:?} came twice; its pagination loops",
                        next.chars().take(64).collect::<String>()
                    ),
                ));
            }
            cursor = Some(next);
        }
        Ok(items)
    }

    fn check_uri(&self, method: &'static str, uri: &str) -> Result<(), FeatureError> {
        if uri.trim().is_empty() {
            return Err(self.invalid(
                method,
                "the resource URI is empty; give a URI as `plugd resource list` shows it".into(),
            ));
        }
        if uri.len() > MAX_URI {
            return Err(self.invalid(
                method,
                format!(
                    "the resource URI is {} bytes, over the {MAX_URI}-byte limit",
                    uri.len()
                ),
            ));
        }
        Ok(())
    }

    /// `resources/read {uri}`: the whole result (`contents`, `_meta`), each
    /// content checked to have a string `uri` and a string `text` or `blob`.
    pub async fn read_resource(&self, uri: &str, timeout: Duration) -> Result<Value, FeatureError> {
        const METHOD: &str = "resources/read";
        self.require(Capability::Resources, METHOD)?;
        self.check_uri(METHOD, uri)?;
        let reply = self
            .peer
            .call(METHOD, Some(json!({"uri": uri})), timeout)
            .await?;
        if let Some(why) = crate::mcp::not_complete(&reply) {
            return Err(self.malformed(METHOD, why));
        }
        check_read(&reply).map_err(|r| self.malformed(METHOD, r))?;
        Ok(reply)
    }

    /// `resources/subscribe {uri}`; remembered in `subs` for restarts.
    pub async fn subscribe(
        &self,
        uri: &str,
        subs: &McpSubscriptions,
        timeout: Duration,
    ) -> Result<(), FeatureError> {
        const METHOD: &str = "resources/subscribe";
        self.require(Capability::Subscribe, METHOD)?;
        self.check_uri(METHOD, uri)?;
        if !subs.contains(self.server, uri) && subs.count(self.server) >= MAX_SUBSCRIPTIONS {
            return Err(self.invalid(
                METHOD,
                format!(
                    "the server has {MAX_SUBSCRIPTIONS} subscriptions already; unsubscribe from some first"
                ),
            ));
        }
        self.peer
            .call(METHOD, Some(json!({"uri": uri})), timeout)
            .await?;
        subs.insert(self.server, uri);
        Ok(())
    }

    /// `resources/unsubscribe {uri}` (forgotten in `subs` whatever the reply).
    pub async fn unsubscribe(
        &self,
        uri: &str,
        subs: &McpSubscriptions,
        timeout: Duration,
    ) -> Result<(), FeatureError> {
        const METHOD: &str = "resources/unsubscribe";
        self.require(Capability::Subscribe, METHOD)?;
        self.check_uri(METHOD, uri)?;
        subs.remove(self.server, uri);
        self.peer
            .call(METHOD, Some(json!({"uri": uri})), timeout)
            .await?;
        Ok(())
    }

    /// `prompts/get {name, arguments}`: the whole result (`description`,
    /// `messages`, `_meta`), each message checked to have a string `role`
    /// and an object `content`.
    pub async fn get_prompt(
        &self,
        name: &str,
        arguments: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<Value, FeatureError> {
        self.get_prompt_with(name, arguments, None, timeout).await
    }

    /// [`Features::get_prompt`] with a 2026-07-28 client's `rounds`
    /// (`inputResponses`, `requestState`) sent along; then an
    /// `input_required` reply is returned unchecked, for that client.
    pub async fn get_prompt_with(
        &self,
        name: &str,
        arguments: &BTreeMap<String, String>,
        rounds: Option<&serde_json::Map<String, Value>>,
        timeout: Duration,
    ) -> Result<Value, FeatureError> {
        const METHOD: &str = "prompts/get";
        self.require(Capability::Prompts, METHOD)?;
        if name.is_empty() {
            return Err(self.invalid(
                METHOD,
                "the prompt name is empty; `plugd prompt list` shows the names".into(),
            ));
        }
        let mut params = json!({"name": name});
        if !arguments.is_empty() {
            params["arguments"] = json!(arguments);
        }
        for (k, v) in rounds.into_iter().flatten() {
            params[k] = v.clone();
        }
        let reply = self.peer.call(METHOD, Some(params), timeout).await?;
        if rounds.is_some()
            && reply.get("resultType").and_then(Value::as_str) == Some("input_required")
        {
            return Ok(reply);
        }
        if let Some(why) = crate::mcp::not_complete(&reply) {
            return Err(self.malformed(METHOD, why));
        }
        check_prompt(&reply).map_err(|r| self.malformed(METHOD, r))?;
        Ok(reply)
    }

    /// `completion/complete {ref, argument, context?}`: the `completion`
    /// object (`values`, `total`, `hasMore`), at most [`MAX_COMPLETIONS`]
    /// values.
    pub async fn complete(
        &self,
        reference: &Value,
        argument: &Value,
        context: Option<&Value>,
        timeout: Duration,
    ) -> Result<Value, FeatureError> {
        const METHOD: &str = "completion/complete";
        self.require(Capability::Completions, METHOD)?;
        check_reference(reference).map_err(|r| self.invalid(METHOD, r))?;
        let arg_ok = argument.get("name").is_some_and(Value::is_string)
            && argument.get("value").is_some_and(Value::is_string);
        if !arg_ok {
            return Err(self.invalid(
                METHOD,
                format!(
                    "\"argument\" must be {{\"name\": string, \"value\": string}}, got {}",
                    preview(argument)
                ),
            ));
        }
        let mut params = json!({"ref": reference, "argument": argument});
        if let Some(ctx) = context.filter(|c| !c.is_null()) {
            if !ctx.is_object() {
                return Err(self.invalid(
                    METHOD,
                    format!(
                        "\"context\" must be an object like {{\"arguments\": {{...}}}}, got {}",
                        preview(ctx)
                    ),
                ));
            }
            params["context"] = ctx.clone();
        }
        let reply = self.peer.call(METHOD, Some(params), timeout).await?;
        let (completion, cut) = completion_of(reply).map_err(|r| self.malformed(METHOD, r))?;
        if cut > 0 {
            tracing::warn!(plugin = %self.server, "completion/complete returned {} values; the first {MAX_COMPLETIONS} are kept (the MCP limit)", cut + MAX_COMPLETIONS);
        }
        Ok(completion)
    }
}

/// One page of a listing: its items (unchecked) and the next cursor.
#[derive(Debug)]
struct Page {
    list: Vec<Value>,
    next: Option<String>,
}

/// Cuts a listing reply into its items and next cursor; the reason when it
/// is not `{FIELD: [...], nextCursor?: string}`.
fn page_of(kind: ListKind, mut reply: Value) -> Result<Page, String> {
    let Some(list) = reply
        .get_mut(kind.field())
        .and_then(Value::as_array_mut)
        .map(std::mem::take)
    else {
        return Err(format!(
            "expected {{\"{}\": [...]}}, got {}",
            kind.field(),
            preview(&reply)
        ));
    };
    let next = match reply.get("nextCursor") {
        None | Some(Value::Null) => None,
        Some(Value::String(next)) => Some(next.clone()),
        Some(other) => {
            return Err(format!(
                "\"nextCursor\" must be a string, got {}",
                preview(other)
            ));
        }
    };
    Ok(Page { list, next })
}

/// Whether a listed item has the string members its kind requires.
fn check_item(kind: ListKind, item: &Value) -> Result<(), String> {
    match kind
        .required()
        .iter()
        .find(|f| !item.get(**f).is_some_and(Value::is_string))
    {
        Some(missing) => Err(format!("no string \"{missing}\" in {}", preview(item))),
        None => Ok(()),
    }
}

/// Checks a `resources/read` result: `contents` is an array whose every
/// item has a string `uri` and exactly one of a string `text` or `blob`.
fn check_read(reply: &Value) -> Result<(), String> {
    let Some(contents) = reply.get("contents").and_then(Value::as_array) else {
        return Err(format!(
            "expected {{\"contents\": [...]}}, got {}",
            preview(reply)
        ));
    };
    for (i, c) in contents.iter().enumerate() {
        if !c.get("uri").is_some_and(Value::is_string) {
            return Err(format!(
                "contents[{i}] has no string \"uri\": {}",
                preview(c)
            ));
        }
        let text = c.get("text").is_some_and(Value::is_string);
        let blob = c.get("blob").is_some_and(Value::is_string);
        if text == blob {
            return Err(format!(
                "contents[{i}] must have exactly one of a string \"text\" or a base64 \"blob\": {}",
                preview(c)
            ));
        }
    }
    Ok(())
}

/// Checks a `prompts/get` result: `messages` is an array whose every item
/// has a string `role` and an object `content`.
fn check_prompt(reply: &Value) -> Result<(), String> {
    let Some(messages) = reply.get("messages").and_then(Value::as_array) else {
        return Err(format!(
            "expected {{\"messages\": [...]}}, got {}",
            preview(reply)
        ));
    };
    for (i, m) in messages.iter().enumerate() {
        if !m.get("role").is_some_and(Value::is_string)
            || !m.get("content").is_some_and(Value::is_object)
        {
            return Err(format!(
                "messages[{i}] needs a string \"role\" and an object \"content\": {}",
                preview(m)
            ));
        }
    }
    Ok(())
}

/// The `completion` object of a `completion/complete` result, its values
/// cut to [`MAX_COMPLETIONS`] (with `hasMore: true`), and how many were cut.
fn completion_of(mut reply: Value) -> Result<(Value, usize), String> {
    let Some(completion) = reply.get_mut("completion").filter(|c| c.is_object()) else {
        return Err(format!(
            "expected {{\"completion\": {{\"values\": [...]}}}}, got {}",
            preview(&reply)
        ));
    };
    let Some(values) = completion.get_mut("values").and_then(Value::as_array_mut) else {
        return Err(format!(
            "\"completion.values\" must be an array of strings, got {}",
            preview(completion)
        ));
    };
    if let Some(i) = values.iter().position(|v| !v.is_string()) {
        return Err(format!(
            "completion.values[{i}] is not a string: {}",
            preview(&values[i])
        ));
    }
    let cut = values.len().saturating_sub(MAX_COMPLETIONS);
    if cut > 0 {
        values.truncate(MAX_COMPLETIONS);
        completion["hasMore"] = Value::Bool(true);
    }
    Ok((completion.take(), cut))
}

/// Checks a completion reference: `{"type": "ref/prompt", "name"}` or
/// `{"type": "ref/resource", "uri"}`.
pub fn check_reference(reference: &Value) -> Result<(), String> {
    let field = match reference.get("type").and_then(Value::as_str) {
        Some("ref/prompt") => "name",
        Some("ref/resource") => "uri",
        _ => {
            return Err(format!(
                "\"ref\" must be {{\"type\": \"ref/prompt\", \"name\": ...}} or {{\"type\": \"ref/resource\", \"uri\": ...}}, got {}",
                preview(reference)
            ));
        }
    };
    match reference.get(field).and_then(Value::as_str) {
        Some(s) if !s.is_empty() && s.len() <= MAX_URI => Ok(()),
        _ => Err(format!(
            "\"ref.{field}\" must be a non-empty string of at most {MAX_URI} bytes, got {}",
            preview(reference)
        )),
    }
}

/// Re-subscribes a restarted server to what its plugin was subscribed to
/// (during the handshake); each failure is a warning.
pub(crate) async fn resubscribe(
    peer: &Peer,
    server: &str,
    uris: Vec<String>,
    timeout: Duration,
    warnings: &mut Vec<String>,
) {
    let calls = uris.iter().map(|uri| async move {
        (
            uri,
            peer.call("resources/subscribe", Some(json!({"uri": uri})), timeout)
                .await,
        )
    });
    for (uri, result) in futures_util::future::join_all(calls).await {
        if let Err(e) = result {
            warnings.push(format!(
                "could not subscribe {server} to {uri:?} again after its restart: {e}"
            ));
        }
    }
}

/// Bytes of `v` as JSON, counted without building the text.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_read_from_initialize() {
        let caps = json!({"resources": {"subscribe": true, "listChanged": true}, "prompts": {}, "completions": {}});
        for c in [
            Capability::Resources,
            Capability::Subscribe,
            Capability::Prompts,
            Capability::Completions,
        ] {
            assert!(c.declared_in(&caps), "{c:?}");
        }
        let none = json!({"tools": {}, "resources": null, "prompts": null});
        for c in [
            Capability::Resources,
            Capability::Subscribe,
            Capability::Prompts,
            Capability::Completions,
        ] {
            assert!(!c.declared_in(&none), "{c:?}");
        }
        assert!(!Capability::Subscribe.declared_in(&json!({"resources": {"subscribe": "yes"}})));
        assert!(ListKind::Resources.announces_changes(&caps));
        assert!(!ListKind::Prompts.announces_changes(&caps));
    }

    #[test]
    fn references_are_checked_before_sending() {
        assert!(check_reference(&json!({"type": "ref/prompt", "name": "p"})).is_ok());
        assert!(check_reference(&json!({"type": "ref/resource", "uri": "demo://x/{id}"})).is_ok());
        for bad in [
            json!({"type": "ref/prompt"}),
            json!({"type": "ref/prompt", "name": ""}),
            json!({"type": "ref/tool", "name": "x"}),
            json!({"type": "ref/resource", "uri": "x".repeat(MAX_URI + 1)}),
            json!("ref/prompt"),
        ] {
            assert!(check_reference(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subscriptions_belong_to_the_server_and_are_forgotten_once_empty() {
        let subs = McpSubscriptions::default();
        subs.insert("a", "u1");
        subs.insert("a", "u2");
        assert_eq!(subs.of("a"), ["u1", "u2"]);
        assert!(subs.contains("a", "u1") && !subs.contains("b", "u1"));
        assert!(subs.remove("a", "u1") && !subs.remove("a", "u1"));
        assert!(subs.remove("a", "u2"));
        assert_eq!(subs.count("a"), 0);
    }

    #[test]
    fn a_list_changed_drops_the_cache() {
        let st = FeatureState::default();
        st.cache
            .lock()
            .unwrap()
            .insert(ListKind::Prompts, Arc::new(vec![json!({"name": "p"})]));
        assert!(st.cached(ListKind::Prompts).is_some());
        st.invalidate(&[ListKind::Resources, ListKind::Templates]);
        assert!(st.cached(ListKind::Prompts).is_some());
        st.invalidate(&[ListKind::Prompts]);
        assert!(st.cached(ListKind::Prompts).is_none());
        assert_eq!(st.generation.load(Ordering::Acquire), 2);
    }

    #[test]
    fn json_len_counts_the_encoding() {
        let v = json!({"uri": "a", "n": [1, 2]});
        assert_eq!(json_len(&v), serde_json::to_vec(&v).unwrap().len());
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::test_json::json_with;
    use proptest::prelude::*;

    const KEYS: &[&str] = &[
        "resources",
        "resourceTemplates",
        "prompts",
        "nextCursor",
        "uri",
        "uriTemplate",
        "name",
        "contents",
        "text",
        "blob",
        "messages",
        "role",
        "content",
        "completion",
        "values",
        "hasMore",
        "type",
    ];
    const STRINGS: &[&str] = &["mem://x", "user", "ref/prompt", "ref/resource", "a"];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn listing_pages_never_panic_and_keep_what_they_accept(v in json_with(KEYS, STRINGS)) {
            for kind in [ListKind::Resources, ListKind::Templates, ListKind::Prompts] {
                if let Ok(page) = page_of(kind, v.clone()) {
                    prop_assert_eq!(&Value::Array(page.list.clone()), &v[kind.field()]);
                    for item in page.list.iter().filter(|i| check_item(kind, i).is_ok()) {
                        for f in kind.required() {
                            prop_assert!(item[*f].is_string());
                        }
                    }
                }
            }
        }

        #[test]
        fn results_never_panic_and_accepted_ones_have_their_shape(v in json_with(KEYS, STRINGS)) {
            if check_read(&v).is_ok() {
                for c in v["contents"].as_array().unwrap() {
                    prop_assert!(c["uri"].is_string());
                    prop_assert!(c["text"].is_string() != c["blob"].is_string());
                }
            }
            if check_prompt(&v).is_ok() {
                for m in v["messages"].as_array().unwrap() {
                    prop_assert!(m["role"].is_string() && m["content"].is_object());
                }
            }
            if let Ok((c, _)) = completion_of(v.clone()) {
                let values = c["values"].as_array().unwrap();
                prop_assert!(values.len() <= MAX_COMPLETIONS);
                prop_assert!(values.iter().all(Value::is_string));
            }
            let _ = check_reference(&v);
        }
    }

    #[test]
    fn too_many_completions_are_cut_with_has_more() {
        let v =
            json!({"completion": {"values": (0..150).map(|i| i.to_string()).collect::<Vec<_>>()}});
        let (c, cut) = completion_of(v).unwrap();
        assert_eq!(
            (c["values"].as_array().unwrap().len(), cut),
            (MAX_COMPLETIONS, 50)
        );
        assert_eq!(c["hasMore"], true);
        let (c, cut) = completion_of(json!({"completion": {"values": ["a"], "total": 1}})).unwrap();
        assert_eq!((c, cut), (json!({"values": ["a"], "total": 1}), 0));
    }
}
