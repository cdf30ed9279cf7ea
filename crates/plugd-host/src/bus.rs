//! The host's event bus: subjects with NATS-style wildcards, per-plugin topic
//! allowlists (nexo contract §6) and subscribers that never block a publisher
//! (§8: what does not fit is shed and counted).
//!
//! **API boundary**: callers see the [`Bus`] trait only, so a NATS backend can
//! replace [`LocalBus`] without touching them.
//!
//! Subjects are dot-separated segments (`plugin.inbound.slack.team_a`). A
//! pattern may use `*` for exactly one segment and `>` as its last segment for
//! one or more trailing segments, as NATS and `nexo_broker::topic` do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

/// Longest subject or pattern accepted, in bytes (NATS' own default limit is
/// far larger; a topic is a name, not a payload).
pub const MAX_SUBJECT_BYTES: usize = 256;

/// Most segments in a subject or pattern.
pub const MAX_SEGMENTS: usize = 16;

/// One event on the bus (a serialised `nexo_broker::Event`, §5.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Unique id; the host fills it when a publisher leaves it out.
    #[serde(default)]
    pub id: String,
    /// RFC 3339 time; the host fills it when a publisher leaves it out.
    #[serde(default)]
    pub timestamp: String,
    /// The subject it was published on.
    #[serde(default)]
    pub topic: String,
    /// Who published it (`agent.coordinator`, `slack`, a plugin id).
    #[serde(default)]
    pub source: String,
    /// The session it belongs to, if any.
    #[serde(default)]
    pub session_id: Option<String>,
    /// What it carries.
    #[serde(default)]
    pub payload: Value,
    /// Other fields publishers send (`correlation_id`, `metadata`), kept as
    /// they are.
    #[serde(default, flatten)]
    pub extra: serde_json::Map<String, Value>,
}

impl Event {
    /// An event on `topic` from `source`, without id and timestamp (the bus
    /// completes them, see [`Event::complete`]).
    pub fn new(topic: impl Into<String>, source: impl Into<String>, payload: Value) -> Event {
        Event {
            id: String::new(),
            timestamp: String::new(),
            topic: topic.into(),
            source: source.into(),
            session_id: None,
            payload,
            extra: serde_json::Map::new(),
        }
    }

    /// Fills a missing id and timestamp (the published SDKs send neither).
    pub fn complete(&mut self, id: impl FnOnce() -> String, now: impl FnOnce() -> String) {
        if self.id.trim().is_empty() {
            self.id = id();
        }
        if self.timestamp.trim().is_empty() {
            self.timestamp = now();
        }
    }
}

/// Why a subject or pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubjectError {
    /// Empty, or an empty segment (`a..b`, a leading or trailing dot).
    #[error(
        "subject {0:?} has an empty segment; use dot-separated names like plugin.inbound.slack"
    )]
    EmptySegment(String),
    /// Over [`MAX_SUBJECT_BYTES`] or [`MAX_SEGMENTS`].
    #[error(
        "subject {0:?} is too long (at most {MAX_SUBJECT_BYTES} bytes and {MAX_SEGMENTS} segments)"
    )]
    TooLong(String),
    /// Whitespace or a control character.
    #[error("subject {0:?} contains whitespace or a control character")]
    BadCharacter(String),
    /// A wildcard where a concrete subject is needed.
    #[error("subject {0:?} contains a wildcard (* or >); publish on a concrete subject")]
    Wildcard(String),
    /// `>` not as the last segment, or a wildcard inside a segment (`a*`).
    #[error(
        "pattern {0:?} misuses a wildcard: * and > must be whole segments, and > only the last one"
    )]
    BadWildcard(String),
}

fn segments(s: &str) -> Result<Vec<&str>, SubjectError> {
    if s.len() > MAX_SUBJECT_BYTES {
        return Err(SubjectError::TooLong(clip(s)));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(SubjectError::BadCharacter(clip(s)));
    }
    let segs: Vec<&str> = s.split('.').collect();
    if segs.iter().any(|p| p.is_empty()) {
        return Err(SubjectError::EmptySegment(s.to_owned()));
    }
    if segs.len() > MAX_SEGMENTS {
        return Err(SubjectError::TooLong(clip(s)));
    }
    Ok(segs)
}

fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Checks a concrete subject (no wildcards).
pub fn check_subject(s: &str) -> Result<(), SubjectError> {
    let segs = segments(s)?;
    if segs.iter().any(|p| p.contains('*') || p.contains('>')) {
        return Err(SubjectError::Wildcard(s.to_owned()));
    }
    Ok(())
}

/// Checks a subscription pattern.
pub fn check_pattern(s: &str) -> Result<(), SubjectError> {
    let segs = segments(s)?;
    for (i, p) in segs.iter().enumerate() {
        let wild = p.contains('*') || p.contains('>');
        let whole = *p == "*" || (*p == ">" && i == segs.len() - 1);
        if wild && !whole {
            return Err(SubjectError::BadWildcard(s.to_owned()));
        }
    }
    Ok(())
}

/// Whether `topic` matches `pattern` (`*` one segment, `>` one or more
/// trailing segments, anything else literally). Invalid input never matches.
pub fn topic_matches(pattern: &str, topic: &str) -> bool {
    let mut pat = pattern.split('.');
    let mut top = topic.split('.');
    loop {
        match (pat.next(), top.next()) {
            (Some(">"), Some(t)) => return !t.is_empty() && pat.next().is_none(),
            (Some("*"), Some(t)) => {
                if t.is_empty() {
                    return false;
                }
            }
            (Some(p), Some(t)) => {
                if p != t || p.is_empty() {
                    return false;
                }
            }
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// What a plugin may receive and publish (§6), derived from its
/// `[[plugin.channels.register]]` kinds plus operator grants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Allowlist {
    /// Patterns delivered to the plugin as `broker.event`.
    pub deliver: Vec<String>,
    /// Patterns the plugin may `broker.publish` on.
    pub accept: Vec<String>,
}

impl Allowlist {
    /// `plugin.outbound.K` and `plugin.outbound.K.>` to deliver,
    /// `plugin.inbound.K` and `plugin.inbound.K.>` to accept, per kind.
    pub fn for_channels<S: AsRef<str>>(kinds: &[S]) -> Allowlist {
        let mut list = Allowlist::default();
        for k in kinds {
            let k = k.as_ref();
            list.deliver.push(format!("plugin.outbound.{k}"));
            list.deliver.push(format!("plugin.outbound.{k}.>"));
            list.accept.push(format!("plugin.inbound.{k}"));
            list.accept.push(format!("plugin.inbound.{k}.>"));
        }
        list
    }

    /// Whether the plugin may publish on `topic`.
    pub fn may_publish(&self, topic: &str) -> bool {
        check_subject(topic).is_ok() && self.accept.iter().any(|p| topic_matches(p, topic))
    }

    /// Whether an event on `topic` is delivered to the plugin.
    pub fn delivers(&self, topic: &str) -> bool {
        self.deliver.iter().any(|p| topic_matches(p, topic))
    }
}

/// How one subscriber took an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Queued for the subscriber.
    Queued,
    /// The subscriber's queue was full: dropped and counted.
    Shed,
    /// The subscriber is gone.
    Closed,
}

/// A subscriber that takes events without waiting (a plugin's notification
/// queue, for instance).
pub type Sink = Arc<dyn Fn(&Event) -> Delivery + Send + Sync>;

/// What [`Bus::publish`] did with one event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    /// Subscribers that queued it.
    pub delivered: usize,
    /// Subscribers whose queue was full.
    pub shed: usize,
}

/// The host's bus. Publishing never blocks; slow subscribers lose events
/// (at-most-once, as the nexo broker promises).
pub trait Bus: Send + Sync {
    /// Delivers `event` (its topic already checked) to every subscriber whose
    /// pattern matches.
    fn publish(&self, event: Event) -> Published;
    /// Calls `sink` for every event matching `pattern` until the returned
    /// guard is dropped.
    fn subscribe_sink(&self, pattern: &str, sink: Sink) -> Result<SubscriptionGuard, SubjectError>;
    /// Like [`Bus::subscribe_sink`], but one of several subscribers of the
    /// same `group` gets each event: across the nodes of a cluster, the
    /// copies of one plugin (its id is the group) share its events instead
    /// of each getting them all. On one node every subscription is its
    /// own group's only member, so this is `subscribe_sink`.
    fn subscribe_group(
        &self,
        pattern: &str,
        group: &str,
        sink: Sink,
    ) -> Result<SubscriptionGuard, SubjectError> {
        let _ = group;
        self.subscribe_sink(pattern, sink)
    }
    /// Whether events published on other nodes reach this bus (a cluster's
    /// bus); `false` for a bus within one process.
    fn spans_nodes(&self) -> bool {
        false
    }
    /// Counters of the bus's traffic with other nodes, as (name, help,
    /// value) for `GET /metrics`; none for a bus within one process.
    fn node_counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        Vec::new()
    }
    /// Events matching `pattern` into a queue of `depth` events; what does not
    /// fit is shed and counted in [`Subscription::shed`].
    fn subscribe(&self, pattern: &str, depth: usize) -> Result<Subscription, SubjectError> {
        let (tx, rx) = mpsc::channel(depth.max(1));
        let shed = Arc::new(AtomicU64::new(0));
        let counter = shed.clone();
        let sink: Sink = Arc::new(move |e: &Event| match tx.try_send(e.clone()) {
            Ok(()) => Delivery::Queued,
            Err(mpsc::error::TrySendError::Full(_)) => {
                counter.fetch_add(1, Ordering::Relaxed);
                Delivery::Shed
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Closed,
        });
        let guard = self.subscribe_sink(pattern, sink)?;
        Ok(Subscription {
            rx,
            shed,
            _guard: guard,
        })
    }
}

/// Unsubscribes when dropped.
pub struct SubscriptionGuard {
    unsubscribe: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl std::fmt::Debug for SubscriptionGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubscriptionGuard")
    }
}

impl SubscriptionGuard {
    /// A guard that runs `f` when dropped.
    pub fn new(f: impl FnOnce() + Send + Sync + 'static) -> Self {
        SubscriptionGuard {
            unsubscribe: Some(Box::new(f)),
        }
    }
}

impl Drop for SubscriptionGuard {
    fn drop(&mut self) {
        if let Some(f) = self.unsubscribe.take() {
            f();
        }
    }
}

/// A queue of matching events.
#[derive(Debug)]
pub struct Subscription {
    rx: mpsc::Receiver<Event>,
    shed: Arc<AtomicU64>,
    _guard: SubscriptionGuard,
}

impl Subscription {
    /// The next event; `None` once the bus is gone.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event if one is queued.
    pub fn try_recv(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// Events dropped because the queue was full.
    pub fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }
}

struct Entry {
    id: u64,
    pattern: String,
    sink: Sink,
}

#[derive(Default)]
struct Subscribers {
    next: u64,
    list: Vec<Entry>,
}

/// The in-process [`Bus`].
#[derive(Clone, Default)]
pub struct LocalBus {
    subs: Arc<Mutex<Subscribers>>,
}

impl std::fmt::Debug for LocalBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBus").finish_non_exhaustive()
    }
}

impl LocalBus {
    /// An empty bus.
    pub fn new() -> Self {
        LocalBus::default()
    }

    fn lock(subs: &Mutex<Subscribers>) -> std::sync::MutexGuard<'_, Subscribers> {
        subs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Bus for LocalBus {
    fn publish(&self, event: Event) -> Published {
        // Sinks run outside the lock, so one may subscribe or publish itself.
        let sinks: Vec<Sink> = LocalBus::lock(&self.subs)
            .list
            .iter()
            .filter(|e| topic_matches(&e.pattern, &event.topic))
            .map(|e| e.sink.clone())
            .collect();
        let mut out = Published::default();
        for sink in sinks {
            match sink(&event) {
                Delivery::Queued => out.delivered += 1,
                Delivery::Shed => out.shed += 1,
                Delivery::Closed => {}
            }
        }
        out
    }

    fn subscribe_sink(&self, pattern: &str, sink: Sink) -> Result<SubscriptionGuard, SubjectError> {
        check_pattern(pattern)?;
        let id = {
            let mut subs = LocalBus::lock(&self.subs);
            subs.next += 1;
            let id = subs.next;
            subs.list.push(Entry {
                id,
                pattern: pattern.to_owned(),
                sink,
            });
            id
        };
        let weak: Weak<Mutex<Subscribers>> = Arc::downgrade(&self.subs);
        Ok(SubscriptionGuard::new(move || {
            if let Some(subs) = weak.upgrade() {
                LocalBus::lock(&subs).list.retain(|e| e.id != id);
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn wildcards_follow_the_contract() {
        assert!(topic_matches(
            "plugin.inbound.slack",
            "plugin.inbound.slack"
        ));
        assert!(topic_matches(
            "plugin.inbound.slack.>",
            "plugin.inbound.slack.team_a"
        ));
        assert!(topic_matches(
            "plugin.inbound.slack.>",
            "plugin.inbound.slack.team_a.thread_42"
        ));
        // `>` needs at least one trailing segment.
        assert!(!topic_matches(
            "plugin.inbound.slack.>",
            "plugin.inbound.slack"
        ));
        assert!(topic_matches("plugin.*.slack", "plugin.inbound.slack"));
        assert!(!topic_matches(
            "plugin.*.slack",
            "plugin.inbound.team.slack"
        ));
        assert!(!topic_matches("plugin.*", "plugin"));
        assert!(!topic_matches("agent.route", "agent.route.x"));
        assert!(topic_matches(">", "anything.at.all"));
        // Empty segments never match, even under a wildcard.
        assert!(!topic_matches("a.*.c", "a..c"));
        assert!(!topic_matches("a.>", "a."));
    }

    #[test]
    fn subjects_and_patterns_are_checked() {
        assert!(check_subject("plugin.inbound.slack").is_ok());
        assert_eq!(
            check_subject("plugin.*.x"),
            Err(SubjectError::Wildcard("plugin.*.x".into()))
        );
        assert!(matches!(
            check_subject("a..b"),
            Err(SubjectError::EmptySegment(_))
        ));
        assert!(matches!(
            check_subject(""),
            Err(SubjectError::EmptySegment(_))
        ));
        assert!(matches!(
            check_subject("a b"),
            Err(SubjectError::BadCharacter(_))
        ));
        assert!(matches!(
            check_subject(&"a".repeat(300)),
            Err(SubjectError::TooLong(_))
        ));
        assert!(matches!(
            check_subject(&vec!["a"; 17].join(".")),
            Err(SubjectError::TooLong(_))
        ));
        assert!(check_pattern("plugin.*.slack.>").is_ok());
        assert!(matches!(
            check_pattern("a.>.b"),
            Err(SubjectError::BadWildcard(_))
        ));
        assert!(matches!(
            check_pattern("a.b*"),
            Err(SubjectError::BadWildcard(_))
        ));
    }

    #[test]
    fn allowlist_derives_from_channel_kinds() {
        let list = Allowlist::for_channels(&["slack"]);
        assert!(list.may_publish("plugin.inbound.slack"));
        assert!(list.may_publish("plugin.inbound.slack.team_a"));
        assert!(!list.may_publish("plugin.inbound.telegram"));
        assert!(!list.may_publish("agent.route.x"));
        assert!(!list.may_publish("command.shutdown"));
        // A wildcard subject is not a way around the list.
        assert!(!list.may_publish("plugin.inbound.slack.>"));
        assert!(list.delivers("plugin.outbound.slack.team_a"));
        assert!(!list.delivers("plugin.inbound.slack"));
        assert_eq!(Allowlist::for_channels::<&str>(&[]), Allowlist::default());
    }

    #[tokio::test]
    async fn subscribers_get_matching_events_and_full_queues_shed() {
        let bus = LocalBus::new();
        let mut all = bus.subscribe("plugin.>", 64).unwrap();
        let mut small = bus.subscribe("plugin.outbound.*", 2).unwrap();
        for i in 0..5 {
            bus.publish(Event::new("plugin.outbound.slack", "test", json!(i)));
        }
        let other = bus.publish(Event::new("agent.route", "test", json!(null)));
        assert_eq!(other, Published::default());
        assert_eq!(small.shed(), 3);
        assert_eq!(all.shed(), 0);
        assert_eq!(small.recv().await.unwrap().payload, json!(0));
        assert_eq!(small.recv().await.unwrap().payload, json!(1));
        assert!(small.try_recv().is_none());
        for i in 0..5 {
            assert_eq!(all.recv().await.unwrap().payload, json!(i));
        }
        drop(all);
        let p = bus.publish(Event::new("plugin.outbound.slack", "test", json!(9)));
        assert_eq!(
            p,
            Published {
                delivered: 1,
                shed: 0
            }
        );
        drop(small);
        assert_eq!(
            bus.publish(Event::new("plugin.outbound.slack", "t", json!(0))),
            Published::default()
        );
    }

    #[test]
    fn events_without_id_or_timestamp_are_completed() {
        let mut e: Event = serde_json::from_value(
            json!({"topic": "plugin.inbound.slack", "payload": {"text": "hi"}}),
        )
        .unwrap();
        e.complete(|| "id-1".into(), || "2026-11-22T00:00:00Z".into());
        assert_eq!(e.id, "id-1");
        assert_eq!(e.timestamp, "2026-11-22T00:00:00Z");
        let mut given = Event::new("t", "s", json!(null));
        given.id = "mine".into();
        given.complete(|| "other".into(), || "now".into());
        assert_eq!(given.id, "mine");
    }

    /// A straightforward matcher over segment lists, to check the fast one.
    fn reference(pattern: &[&str], topic: &[&str]) -> bool {
        match (pattern.split_first(), topic.split_first()) {
            (Some((&">", [])), Some(_)) => true,
            (Some((&"*", pr)), Some((_, tr))) => reference(pr, tr),
            (Some((p, pr)), Some((t, tr))) => p == t && reference(pr, tr),
            (None, None) => true,
            _ => false,
        }
    }

    proptest! {
        #[test]
        fn matching_agrees_with_the_reference(
            pattern in prop::collection::vec(prop_oneof!["a", "b", "\\*", ">"], 1..5),
            topic in prop::collection::vec(prop_oneof!["a", "b"], 1..5),
        ) {
            let p = pattern.join(".");
            prop_assume!(check_pattern(&p).is_ok());
            let t = topic.join(".");
            let pr: Vec<&str> = pattern.iter().map(String::as_str).collect();
            let tr: Vec<&str> = topic.iter().map(String::as_str).collect();
            prop_assert_eq!(topic_matches(&p, &t), reference(&pr, &tr));
        }

        #[test]
        fn checks_never_panic(s in any::<String>()) {
            let _ = check_subject(&s);
            let _ = check_pattern(&s);
            let _ = topic_matches(&s, &s);
        }
    }
}
