//! The inbound path of channel adapters (nexo §5.x): the channel service
//! `plugd serve` runs. The adapters themselves are the runtime's
//! (`plugd_runtime::channels`).
//!
//! Every native plugin declaring `[plugin.extends].channels = [K, ...]` is the
//! adapter of kind `K`: [`Runtime::channel`] hands out a [`ChannelAdapter`]
//! that sends `channel.start`, `channel.stop` and `channel.send_outbound`
//! through the plugin's `Supervised` connection, looked up per call (a
//! restart is transparent), with the 30 s / 30 s / 60 s deadlines of
//! `plugd_host::extensions` (`NEXO_PLUGIN_CHANNEL_TIMEOUT_MS` overrides all
//! three). A built-in adapter would implement the same trait.
//!
//! [`ChannelService`] is what `plugd serve` runs: `channel.start {kind,
//! instance: null}` for each approved adapter, a bus subscription to
//! `plugin.inbound.K` and `plugin.inbound.K.>`, and for every inbound event
//! (payload `{from, text, session_id?}`) a `before_message` hook run, an agent
//! turn for the session keyed by channel and sender ([`session_key`]), and the
//! reply out through `channel.send_outbound {kind: K, msg: {kind: "text", to:
//! from, body: reply}}`. A blocked `before_message` (or a turn blocked later)
//! sends the block message to the sender instead, and the LLM is not called
//! for a message blocked before the turn. Turns of one session run in order;
//! different sessions run concurrently. Failures are logged with plugin,
//! kind and sender and counted ([`ChannelStats`]); they never stop serve.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plugd_host::Status;
use plugd_host::bus::{Delivery, Event, Sink, SubscriptionGuard};
use plugd_host::extensions::{ChannelError, OutboundMessage};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use plugd_runtime::Runtime;
use plugd_runtime::channels::{ChannelAdapter, ChannelStats, ChannelTurn, InboundTurn};
use plugd_runtime::hooks::{HookContext, HookPoint, Pipeline};

/// The session an inbound message of `kind` from `sender` belongs to:
/// `channel-<kind>-<sender>`, with every byte a session id may not hold
/// replaced by `_`; when anything was replaced or cut (or the kind holds a
/// `-`), 12 hex digits of the SHA-256 of kind and sender are appended, so two
/// senders never share a session.
pub fn session_key(kind: &str, sender: &str) -> String {
    fn clean(s: &str, max: usize) -> (String, bool) {
        let mut changed = false;
        let mut out: String = s
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                    c
                } else {
                    changed = true;
                    '_'
                }
            })
            .collect();
        if out.len() > max {
            out.truncate(max);
            changed = true;
        }
        (out, changed)
    }
    let (clean_kind, kind_changed) = clean(kind, 24);
    let (from, changed) = clean(sender, 64);
    // A `-` in the kind makes `channel-a-b-c` ambiguous (kind `a-b` or `a`):
    // hashed too, over kind and sender.
    if changed || kind_changed || from.is_empty() || clean_kind.contains('-') {
        let mut h = Sha256::new();
        h.update(kind.as_bytes());
        h.update([0]);
        h.update(sender.as_bytes());
        let hash = hex::encode(h.finalize());
        format!("channel-{clean_kind}-{from}-{}", &hash[..12])
    } else {
        format!("channel-{clean_kind}-{from}")
    }
}

/// One inbound message, as parsed from an event on `plugin.inbound.K[.>]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Inbound {
    /// The channel kind (the topic's third segment).
    pub kind: String,
    /// The sender (`payload.from`), the reply's recipient.
    pub from: String,
    /// The text (`payload.text`).
    pub text: String,
    /// The session: `payload.session_id` (or the event's) when it is a valid
    /// session id in the channel's namespace (`channel-<kind>-…`), else
    /// [`session_key`].
    pub session_id: String,
    /// When plugd parsed it (ms since the Unix epoch): the microapp
    /// `inbound.ts_ms` of its turn.
    pub received_ms: u64,
}

impl Inbound {
    /// Parses an inbound event; the error says what is missing.
    pub fn parse(event: &Event) -> Result<Inbound, String> {
        let mut parts = event.topic.split('.');
        let kind = match (parts.next(), parts.next(), parts.next()) {
            (Some("plugin"), Some("inbound"), Some(k)) if !k.is_empty() => k.to_owned(),
            _ => return Err(format!("topic {:?} is not plugin.inbound.K", event.topic)),
        };
        let p = &event.payload;
        let from = p
            .get("from")
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| {
                format!("payload needs a non-empty string \"from\" (the sender), got {p}")
            })?
            .to_owned();
        let text = p
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("payload needs a string \"text\", got {p}"))?
            .to_owned();
        // A plugin may pick a session (a thread, a group) but only inside its
        // channel's own namespace: never an HTTP API session or another
        // channel's.
        let own = format!("channel-{kind}-");
        let session_id = p
            .get("session_id")
            .and_then(Value::as_str)
            .or(event.session_id.as_deref())
            .filter(|s| s.starts_with(&own) && plugd_store::sessions::valid_session_id(s))
            .map(str::to_owned)
            .unwrap_or_else(|| session_key(&kind, &from));
        Ok(Inbound {
            kind,
            from,
            text,
            session_id,
            received_ms: plugd_runtime::microapp::now_ms(),
        })
    }
}

/// Inbound events waiting for the router; more are shed and counted.
pub const INBOUND_QUEUE: usize = 1024;
/// How long a node holds a channel kind's lease (`channel:KIND`) unless it
/// renews it: a node that dies holding it is replaced within this.
pub const CHANNEL_LEASE_TTL: Duration = Duration::from_secs(10);

/// How often the holder renews a channel's lease.
pub const CHANNEL_LEASE_EVERY: Duration = Duration::from_secs(2);

/// How often a node without a channel's lease tries to take it: a holder
/// that stops is replaced within [`CHANNEL_LEASE_TTL`] and this.
pub const CHANNEL_LEASE_WAIT: Duration = Duration::from_millis(500);

/// First pause after a failed `channel.start` (doubling up to [`KEEPER_BACKOFF_MAX`]).
const KEEPER_BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause between `channel.start` attempts.
const KEEPER_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Messages of one session waiting for its turns; more are shed and counted.
pub const SESSION_QUEUE: usize = 64;
/// A session's worker exits after this long without messages.
const SESSION_IDLE: Duration = Duration::from_secs(60);

struct Router {
    runtime: Runtime,
    agent: Option<Arc<dyn ChannelTurn>>,
    pipeline: Arc<Pipeline>,
    sessions: Mutex<HashMap<String, mpsc::Sender<Inbound>>>,
}

/// The channels of a running `plugd serve`: started adapters, the inbound
/// subscriptions and the per-session workers.
pub struct ChannelService {
    router: Arc<Router>,
    /// Who holds the channels' leases for this service (one id per start).
    holder: String,
    adapters: Vec<Arc<dyn ChannelAdapter>>,
    _subscriptions: Vec<SubscriptionGuard>,
    task: tokio::task::JoinHandle<()>,
    keepers: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for ChannelService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<&str> = self.adapters.iter().map(|a| a.kind()).collect();
        f.debug_struct("ChannelService")
            .field("kinds", &kinds)
            .finish()
    }
}

impl ChannelService {
    /// Subscribes to every channel kind's inbound topics and sends
    /// `channel.start {kind, instance: null}` to each approved adapter, and to
    /// the others once they are approved (in the background: a failure is
    /// logged and retried, the others go on). `agent` is
    /// `None` without an `llm:` section: inbound events are then logged as
    /// unhandled.
    pub async fn start(
        runtime: &Runtime,
        agent: Option<Arc<dyn ChannelTurn>>,
        pipeline: Arc<Pipeline>,
    ) -> Self {
        let router = Arc::new(Router {
            runtime: runtime.clone(),
            agent,
            pipeline,
            sessions: Mutex::new(HashMap::new()),
        });
        let mut adapters: Vec<Arc<dyn ChannelAdapter>> = Vec::new();
        for (kind, plugin) in runtime.channel_kinds() {
            if let Ok(sup) = runtime.supervised(&plugin)
                && !plugd_host::native_host::channel_kinds(sup.spec()).contains(&kind)
            {
                tracing::warn!(%plugin, %kind, "the plugin declares channel {kind:?} in [plugin.extends].channels but not in [[plugin.channels.register]], so it may not publish plugin.inbound.{kind}; add [[plugin.channels.register]] kind = {kind:?}");
            }
            match runtime.plugin(&plugin).await {
                Ok(info) if !info.approved => {
                    tracing::warn!(%plugin, %kind, state = %info.state, "channel waits for approval: `plugd plugin approve {plugin}` starts it");
                }
                _ => {}
            }
            match runtime.channel(&kind) {
                Ok(a) => adapters.push(a),
                Err(e) => tracing::warn!(%plugin, %kind, "channel not started: {e}"),
            }
        }
        let (tx, mut rx) = mpsc::channel::<(String, Event)>(INBOUND_QUEUE);
        let mut subscriptions = Vec::new();
        let bus = runtime.bus();
        // On a cluster's bus every node hears a kind's inbound events; only
        // the node running the kind's adapter (holding its lease) answers
        // them, so a message gets one turn and one reply.
        let spans_nodes = bus.spans_nodes();
        let mut running = HashMap::new();
        for a in &adapters {
            let runs = RunsUntil::default();
            running.insert(a.kind().to_owned(), runs.clone());
            for pattern in [
                format!("plugin.inbound.{}", a.kind()),
                format!("plugin.inbound.{}.>", a.kind()),
            ] {
                let tx = tx.clone();
                let c = runtime.channel_counters(a.kind());
                let kind = a.kind().to_owned();
                let runs = runs.clone();
                let sink: Sink = Arc::new(move |e: &Event| {
                    if spans_nodes && !runs.now() {
                        return Delivery::Closed;
                    }
                    match tx.try_send((kind.clone(), e.clone())) {
                        Ok(()) => Delivery::Queued,
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            c.shed.fetch_add(1, Ordering::Relaxed);
                            Delivery::Shed
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Closed,
                    }
                });
                match bus.subscribe_sink(&pattern, sink) {
                    Ok(g) => subscriptions.push(g),
                    Err(e) => {
                        tracing::warn!(kind = %a.kind(), plugin = %a.owner(), "cannot subscribe to {pattern:?}: {e}")
                    }
                }
            }
        }
        drop(tx);
        let holder = format!("{}/channels", runtime.node_id());
        let keepers = adapters
            .iter()
            .map(|a| {
                let runs = running.remove(a.kind()).unwrap_or_default();
                tokio::spawn(keep_leased(
                    runtime.clone(),
                    a.clone(),
                    holder.clone(),
                    runs,
                ))
            })
            .collect();
        let r = router.clone();
        let task = tokio::spawn(async move {
            while let Some((kind, event)) = rx.recv().await {
                r.dispatch(&kind, event);
            }
        });
        ChannelService {
            router,
            holder,
            adapters,
            _subscriptions: subscriptions,
            task,
            keepers,
        }
    }

    /// The kinds started.
    pub fn kinds(&self) -> Vec<String> {
        self.adapters.iter().map(|a| a.kind().to_owned()).collect()
    }

    /// The counters now, by kind.
    pub fn stats(&self) -> BTreeMap<String, ChannelStats> {
        self.router.runtime.channel_stats()
    }

    /// Stops listening and sends `channel.stop {kind}` to every adapter
    /// started (failures are logged).
    pub async fn shutdown(self) {
        // First: a plugin stopped by the shutdown must not be started again.
        for k in &self.keepers {
            k.abort();
        }
        self.task.abort();
        drop(self._subscriptions);
        let stops = self.adapters.iter().map(|a| async move {
            match a.stop().await {
                Ok(()) => tracing::info!(kind = %a.kind(), plugin = %a.owner(), "channel stopped"),
                Err(e) => {
                    tracing::warn!(kind = %a.kind(), plugin = %a.owner(), "channel.stop failed: {e}")
                }
            }
        });
        futures_util::future::join_all(stops).await;
        // Given up at once: another node takes the channels over at its next
        // try instead of after the lease's time to live.
        let state = self.router.runtime.state();
        for a in &self.adapters {
            let name = lease_name(a.kind());
            if let Ok(Some(lease)) = state.lease_holder(&name).await
                && lease.holder == self.holder
                && let Err(e) = state.lease_release(&lease.fence()).await
            {
                tracing::warn!(kind = %a.kind(), "cannot give the channel's lease up (it runs out by itself): {e}");
            }
        }
        for (kind, s) in self.router.runtime.channel_stats() {
            tracing::info!(
                %kind,
                received = s.received,
                replied = s.replied,
                blocked = s.blocked,
                unhandled = s.unhandled,
                failed = s.failed,
                shed = s.shed,
                "channel counters"
            );
        }
        tracing::info!("channels stopped");
    }
}

/// The lease a channel kind's adapter runs under.
fn lease_name(kind: &str) -> String {
    format!("channel:{kind}")
}

/// Runs `a` only while this service holds its kind's lease in the state
/// store (a singleton: of the nodes sharing one store, one runs each
/// channel): takes it, keeps the adapter started ([`keep_started`]) while
/// renewing it every [`CHANNEL_LEASE_EVERY`], and on losing it stops the
/// adapter and tries again; without it, tries every
/// [`CHANNEL_LEASE_WAIT`]. One node alone takes it at once.
/// `runs` says until when this node surely holds the lease.
async fn keep_leased(
    runtime: Runtime,
    a: Arc<dyn ChannelAdapter>,
    holder: String,
    runs: RunsUntil,
) {
    let name = lease_name(a.kind());
    let ttl_ms = CHANNEL_LEASE_TTL.as_millis() as i64;
    let mut waiting_logged = false;
    loop {
        match runtime.state().lease_acquire(&name, &holder, ttl_ms).await {
            Ok(Some(lease)) => {
                waiting_logged = false;
                tracing::info!(kind = %a.kind(), plugin = %a.owner(), fence = lease.fence, "holding the channel's lease: this node runs it");
                runs.set(Some(tokio::time::Instant::now() + lease_margin()));
                tokio::select! {
                    () = keep_started(runtime.clone(), a.clone()) => {
                        runs.set(None);
                        return;
                    }
                    () = hold(&runtime, &name, &holder, ttl_ms, &runs) => {}
                }
                runs.set(None);
                tracing::warn!(kind = %a.kind(), plugin = %a.owner(), "lost the channel's lease to another node: stopping the channel here");
                if let Err(e) = a.stop().await {
                    tracing::warn!(kind = %a.kind(), plugin = %a.owner(), "channel.stop failed: {e}");
                }
            }
            Ok(None) => {
                if !waiting_logged {
                    waiting_logged = true;
                    tracing::info!(kind = %a.kind(), plugin = %a.owner(), "another node runs this channel (it holds the lease); taking over if it stops");
                }
            }
            Err(e) => {
                tracing::warn!(kind = %a.kind(), plugin = %a.owner(), "cannot take the channel's lease: {e}");
            }
        }
        tokio::time::sleep(CHANNEL_LEASE_WAIT).await;
    }
}

/// How long after asking for a channel's lease its holder may count on it:
/// the time to live less one renewal interval.
fn lease_margin() -> Duration {
    CHANNEL_LEASE_TTL.saturating_sub(CHANNEL_LEASE_EVERY)
}

/// Until when this node surely holds a channel's lease (its step-down
/// point), by the monotonic clock: a node frozen past it (`SIGSTOP`, a
/// stalled machine) no longer answers the channel's messages when it
/// wakes, before it has even seen that the lease moved on.
#[derive(Clone, Default)]
struct RunsUntil(Arc<Mutex<Option<tokio::time::Instant>>>);

impl RunsUntil {
    fn set(&self, until: Option<tokio::time::Instant>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }

    /// Whether the lease surely holds now.
    fn now(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|until| tokio::time::Instant::now() < until)
    }
}

/// Renews the lease `name` every [`CHANNEL_LEASE_EVERY`]; returns when it
/// is lost: another holder has it, or no renewal succeeded within the time
/// to live minus one interval of the last one. A renewal that hangs (a
/// store cut off) is abandoned at that point too, so the node steps down
/// while its lease still runs and the stop reaches the plugin before
/// another node can take over.
async fn hold(runtime: &Runtime, name: &str, holder: &str, ttl_ms: i64, runs: &RunsUntil) {
    let margin = lease_margin();
    let mut step_down = tokio::time::Instant::now() + margin;
    loop {
        tokio::time::sleep(CHANNEL_LEASE_EVERY).await;
        let asked = tokio::time::Instant::now();
        match tokio::time::timeout_at(
            step_down,
            runtime.state().lease_acquire(name, holder, ttl_ms),
        )
        .await
        {
            // The store's lease runs from when it answered, after `asked`.
            Ok(Ok(Some(_))) => {
                step_down = asked + margin;
                runs.set(Some(step_down));
            }
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                tracing::warn!(lease = %name, "cannot renew the channel's lease: {e}");
                if tokio::time::Instant::now() >= step_down {
                    return;
                }
            }
            Err(_) => {
                tracing::warn!(lease = %name, "the channel's lease could not be renewed in time: stepping down before it runs out");
                return;
            }
        }
    }
}

/// Sends `channel.start` to `a`'s plugin now and again after every restart
/// (a new process has no listener), until aborted. An approved plugin that
/// is idle or stopped (after `plugd plugin restart` or a settings change) is
/// started; one that failed, is not approved or was revoked is left alone
/// until its state changes (approving it starts it). A
/// failed `channel.start` is retried with a doubling pause (1 s to 60 s),
/// except an unsupported one.
async fn keep_started(runtime: Runtime, a: Arc<dyn ChannelAdapter>) {
    let Ok(sup) = runtime.supervised(a.owner()) else {
        return;
    };
    let mut watch = sup.watch();
    let mut started: Option<u32> = None;
    let mut backoff = KEEPER_BACKOFF;
    loop {
        let status = watch.borrow_and_update().clone();
        let due = match status {
            Status::Running { pid, .. } => started != Some(pid),
            // Only an approved plugin is started from here (approval itself
            // starts it, which lands in the arm above).
            Status::Idle | Status::Stopped => runtime
                .plugin(a.owner())
                .await
                .map(|i| i.approved)
                .unwrap_or(false),
            _ => false,
        };
        if due {
            let result = a.start(None).await;
            let pid = match sup.status() {
                Status::Running { pid, .. } => Some(pid),
                _ => None,
            };
            started = pid;
            match result {
                Ok(()) => {
                    backoff = KEEPER_BACKOFF;
                    tracing::info!(kind = %a.kind(), plugin = %a.owner(), pid, "channel started")
                }
                Err(e @ ChannelError::Unsupported { .. }) => {
                    tracing::warn!(kind = %a.kind(), plugin = %a.owner(), "channel.start failed: {e}; not retried");
                }
                Err(e) => {
                    tracing::warn!(kind = %a.kind(), plugin = %a.owner(), retry_in_ms = backoff.as_millis() as u64, "channel.start failed: {e}");
                    // Tried again (a busy port, an upstream down) after a
                    // pause that doubles, never in a tight loop.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(KEEPER_BACKOFF_MAX);
                    started = None;
                    continue;
                }
            }
            // Woken by our own start's transitions: look again before waiting.
            if watch.has_changed().unwrap_or(false) {
                continue;
            }
        }
        if watch.changed().await.is_err() {
            return;
        }
    }
}

/// What became of one inbound message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    /// Handled (replied, blocked, or failed and logged).
    Done,
    /// A `before_message` hook said `do_not_reply_again`: no reply, and none
    /// for the session's messages already waiting.
    DoNotReplyAgain,
}

/// The notice code a hook's `do_not_reply_again` becomes.
const DO_NOT_REPLY_AGAIN: &str = "DO_NOT_REPLY_AGAIN";

impl Router {
    fn dispatch(self: &Arc<Self>, kind: &str, event: Event) {
        let c = self.runtime.channel_counters(kind);
        c.received.fetch_add(1, Ordering::Relaxed);
        let msg = match Inbound::parse(&event) {
            Ok(m) => m,
            Err(why) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(topic = %event.topic, source = %event.source, "inbound event dropped: {why}");
                return;
            }
        };
        if self.agent.is_none() {
            c.unhandled.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(kind = %msg.kind, sender = %msg.from, "inbound message unhandled: plugd.yaml has no llm: section");
            return;
        }
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let msg = match sessions.get(&msg.session_id) {
            Some(tx) => match tx.try_send(msg) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(m)) => {
                    c.shed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(kind = %m.kind, sender = %m.from, session = %m.session_id, "inbound message shed: {SESSION_QUEUE} messages of this session are already waiting");
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(m)) => m,
            },
            None => msg,
        };
        let (tx, rx) = mpsc::channel(SESSION_QUEUE);
        let session = msg.session_id.clone();
        let _ = tx.try_send(msg);
        sessions.insert(session.clone(), tx);
        let this = self.clone();
        tokio::spawn(async move { this.worker(session, rx).await });
    }

    /// Runs one session's messages in order; exits when idle.
    async fn worker(self: Arc<Self>, session: String, mut rx: mpsc::Receiver<Inbound>) {
        loop {
            match tokio::time::timeout(SESSION_IDLE, rx.recv()).await {
                Ok(Some(m)) => {
                    if self.handle(m).await == Handled::DoNotReplyAgain {
                        self.drop_pending(&session, &mut rx);
                    }
                }
                Ok(None) => return,
                Err(_) => {
                    // Senders send under the lock: an empty queue seen under
                    // it stays empty once the entry is gone.
                    let next = {
                        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
                        match rx.try_recv() {
                            Ok(m) => Some(m),
                            Err(_) => {
                                map.remove(&session);
                                None
                            }
                        }
                    };
                    match next {
                        Some(m) => {
                            if self.handle(m).await == Handled::DoNotReplyAgain {
                                self.drop_pending(&session, &mut rx);
                            }
                        }
                        None => return,
                    }
                }
            }
        }
    }

    /// nexo §5.z `do_not_reply_again`: the messages of `session` already
    /// waiting get no automatic reply either.
    fn drop_pending(&self, session: &str, rx: &mut mpsc::Receiver<Inbound>) {
        let mut n = 0u64;
        while rx.try_recv().is_ok() {
            n += 1;
        }
        if n > 0 {
            tracing::info!(%session, dropped = n, "pending messages get no automatic reply: a hook said do_not_reply_again");
        }
    }

    async fn handle(&self, m: Inbound) -> Handled {
        let Some(agent) = &self.agent else {
            return Handled::Done;
        };
        let c = self.runtime.channel_counters(&m.kind);
        let plugin = self
            .runtime
            .channel(&m.kind)
            .map(|a| a.owner().to_owned())
            .unwrap_or_default();
        let ctx = agent.defaults().overlaid(&HookContext {
            session_id: Some(m.session_id.clone()),
            user_id: Some(m.from.clone()),
            channel: Some(m.kind.clone()),
            ..HookContext::default()
        });
        let payload = json!({
            "body": m.text,
            "from": m.from,
            "channel": m.kind,
            "session_id": m.session_id,
        });
        let gate = self
            .pipeline
            .run(HookPoint::BeforeMessage, payload, &ctx)
            .await;
        let quiet = gate
            .notices
            .iter()
            .any(|n| n.code.as_deref() == Some(DO_NOT_REPLY_AGAIN));
        if quiet && !gate.is_blocked() {
            tracing::info!(%plugin, kind = %m.kind, sender = %m.from, session = %m.session_id, "no automatic reply: a before_message hook said do_not_reply_again");
            return Handled::DoNotReplyAgain;
        }
        let reply = if gate.is_blocked() {
            c.blocked.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%plugin, kind = %m.kind, sender = %m.from, session = %m.session_id, "inbound message blocked at before_message");
            gate.message.clone()
        } else {
            let input = gate
                .payload
                .get("body")
                .and_then(Value::as_str)
                .unwrap_or(&m.text)
                .to_owned();
            let inbound = plugd_runtime::microapp::inbound_reference(
                &m.kind,
                &m.from,
                m.received_ms,
                &m.session_id,
            );
            match agent
                .turn_inbound(&m.session_id, &input, &ctx, inbound)
                .await
            {
                Ok(InboundTurn::Blocked { at, message }) => {
                    c.blocked.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%plugin, kind = %m.kind, sender = %m.from, session = %m.session_id, point = ?at, "channel turn blocked");
                    message
                }
                Ok(InboundTurn::Completed { reply }) => reply,
                Err(e) => {
                    c.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%plugin, kind = %m.kind, sender = %m.from, session = %m.session_id, "channel turn failed: {e}");
                    return Handled::Done;
                }
            }
        };
        let Some(reply) = reply.filter(|r| !r.is_empty()) else {
            return Handled::Done;
        };
        let sent = match self.runtime.channel(&m.kind) {
            Ok(a) => a
                .send_outbound(OutboundMessage::text(m.from.clone(), reply))
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match sent {
            Ok(receipt) => {
                c.replied.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%plugin, kind = %m.kind, sender = %m.from, message_id = %receipt.message_id, "channel reply sent");
            }
            Err(e) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%plugin, kind = %m.kind, sender = %m.from, "channel reply not sent: {e}");
            }
        }
        Handled::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_keys_are_valid_and_distinct() {
        let plain = session_key("webhook", "ana");
        assert_eq!(plain, "channel-webhook-ana");
        let a = session_key("webhook", "a b");
        let b = session_key("webhook", "a_b");
        assert_ne!(a, b, "a replaced byte must not merge two senders");
        assert_eq!(b, "channel-webhook-a_b");
        assert_ne!(session_key("a-b", "c"), session_key("a", "b-c"));
        let long = session_key("webhook", &"x".repeat(500));
        for k in [&plain, &a, &b, &long, &session_key("w", "ñ@/")] {
            assert!(plugd_store::sessions::valid_session_id(k), "{k}");
        }
    }

    #[test]
    fn inbound_events_need_from_and_text() {
        let e = Event::new(
            "plugin.inbound.webhook.team",
            "webhook",
            json!({"from": "ana", "text": "hi"}),
        );
        let m = Inbound::parse(&e).unwrap();
        assert_eq!(
            (m.kind.as_str(), m.session_id.as_str()),
            ("webhook", "channel-webhook-ana")
        );
        let e = Event::new(
            "plugin.inbound.webhook",
            "webhook",
            json!({"from": "ana", "text": "hi", "session_id": "channel-webhook-room1"}),
        );
        assert_eq!(
            Inbound::parse(&e).unwrap().session_id,
            "channel-webhook-room1"
        );
        // Outside the channel's namespace (an API session, another channel):
        // ignored, the sender's session is used.
        for foreign in ["s1", "channel-slack-ana", "channel-webhook-a b"] {
            let e = Event::new(
                "plugin.inbound.webhook",
                "webhook",
                json!({"from": "ana", "text": "hi", "session_id": foreign}),
            );
            assert_eq!(
                Inbound::parse(&e).unwrap().session_id,
                "channel-webhook-ana"
            );
        }
        let e = Event::new("plugin.inbound.webhook", "webhook", json!({"text": "hi"}));
        assert!(Inbound::parse(&e).unwrap_err().contains("\"from\""));
        let e = Event::new("plugin.inbound.webhook", "webhook", json!({"from": "a"}));
        assert!(Inbound::parse(&e).unwrap_err().contains("\"text\""));
    }
}
