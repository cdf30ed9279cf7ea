//! The bus across nodes: each node's [`LocalBus`] plus NATS between them.
//!
//! A publish is delivered to this node's subscribers at once (as on one
//! node) and queued to a relay task that publishes it on NATS under
//! `plugd.bus.TOPIC` with the node's id in a header; every node's one
//! subscription to `plugd.bus.>` hands what other nodes published to its
//! own [`LocalBus`], whose subscribers (and their allowlists, applied where
//! they subscribe) see it as if it were published there. The nexo broker's
//! semantics hold across nodes: at most once, and a publisher never waits:
//! a full relay queue or a NATS that is down drops the event for the other
//! nodes and counts it ([`BusStats`]); this node's subscribers got it.
//! Events from NATS are checked like a plugin's (subject, size, shape)
//! before any subscriber sees them.
//!
//! **Queue groups** ([`Bus::subscribe_group`]): a plugin that runs on
//! several nodes subscribes on each under one group, its id. Such a
//! subscription is a NATS queue subscription (queue `plugd.q.GROUP`), so
//! NATS hands each event to one member of the group, on any node, the
//! publishing node's included; the other nodes' copies of the plugin never
//! see it. While NATS is away, the publishing node's own group members get
//! the event at once (marked in the relayed message, should it still go
//! out, so no group gets it twice).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt as _;
use plugd_host::bus::{Bus, Event, LocalBus, Published, Sink, SubjectError, SubscriptionGuard};
use tokio::sync::mpsc;

use crate::NatsError;

/// The NATS subject prefix of bus events.
pub const SUBJECT_PREFIX: &str = "plugd.bus.";

/// The header naming the node that published an event.
pub const NODE_HEADER: &str = "Plugd-Node";

/// The header marking an event whose queue groups the publishing node
/// served itself (NATS was away when it was published).
pub const GROUPS_SERVED_HEADER: &str = "Plugd-Groups-Served";

/// The prefix of the NATS queue group of a [`Bus::subscribe_group`] group.
pub const QUEUE_PREFIX: &str = "plugd.q.";

/// Events waiting for the relay; beyond, they are dropped for other nodes.
pub const RELAY_QUEUE: usize = 4096;

/// Largest event accepted from NATS, in bytes (a plugin's frame limit).
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// What the bus moved between nodes.
#[derive(Debug, Default)]
pub struct BusStats {
    /// Events published on NATS for other nodes.
    pub relayed: AtomicU64,
    /// Events other nodes did not get: the relay queue was full or NATS
    /// refused them.
    pub dropped: AtomicU64,
    /// Events received from other nodes and delivered here.
    pub received: AtomicU64,
    /// Messages on the bus subjects that were not a valid event (refused).
    pub refused: AtomicU64,
    /// Events handed to a queue group's member on this node (by NATS, or
    /// here at once while NATS was away).
    pub grouped: AtomicU64,
}

/// The bus of one node of a cluster (see the module).
pub struct NatsBus {
    local: LocalBus,
    /// This node's queue group members, served here only while NATS is away.
    groups: LocalBus,
    client: async_nats::Client,
    runtime: tokio::runtime::Handle,
    out: mpsc::Sender<(Event, bool)>,
    stats: Arc<BusStats>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for NatsBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBus").finish_non_exhaustive()
    }
}

impl Drop for NatsBus {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl NatsBus {
    /// The bus of node `node` on `client`'s NATS: subscribes to the other
    /// nodes' events and starts the relay of this node's.
    pub async fn start(client: async_nats::Client, node: &str) -> Result<NatsBus, NatsError> {
        let local = LocalBus::new();
        let stats = Arc::new(BusStats::default());
        let subject = format!("{SUBJECT_PREFIX}>");
        let mut inbound =
            client
                .subscribe(subject.clone())
                .await
                .map_err(|source| NatsError::Subscribe {
                    subject: subject.clone(),
                    source,
                })?;
        let (out, mut queue) = mpsc::channel::<(Event, bool)>(RELAY_QUEUE);
        let relay = {
            let (client, stats, node) = (client.clone(), stats.clone(), node.to_owned());
            tokio::spawn(async move {
                while let Some((event, groups_served)) = queue.recv().await {
                    // At most once, as on one node: while NATS is away the
                    // other nodes miss the event (counted), rather than get
                    // it late from the client's buffer.
                    if client.connection_state() != async_nats::connection::State::Connected {
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let Ok(body) = serde_json::to_vec(&event) else {
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert(NODE_HEADER, node.as_str());
                    if groups_served {
                        headers.insert(GROUPS_SERVED_HEADER, "1");
                    }
                    let subject = format!("{SUBJECT_PREFIX}{}", event.topic);
                    match client
                        .publish_with_headers(subject, headers, body.into())
                        .await
                    {
                        Ok(()) => stats.relayed.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            tracing::debug!(topic = %event.topic, "bus event not relayed to other nodes: {e}");
                            stats.dropped.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        };
        let receive = {
            let (local, stats, node) = (local.clone(), stats.clone(), node.to_owned());
            tokio::spawn(async move {
                while let Some(msg) = inbound.next().await {
                    let own = msg
                        .headers
                        .as_ref()
                        .and_then(|h| h.get(NODE_HEADER))
                        .is_some_and(|v| v.as_str() == node);
                    if own {
                        continue;
                    }
                    match accept(&msg.subject, &msg.payload) {
                        Ok(event) => {
                            stats.received.fetch_add(1, Ordering::Relaxed);
                            local.publish(event);
                        }
                        Err(why) => {
                            stats.refused.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(subject = %msg.subject, "refused a bus message from NATS: {why}");
                        }
                    }
                }
            })
        };
        Ok(NatsBus {
            local,
            groups: LocalBus::new(),
            client,
            runtime: tokio::runtime::Handle::current(),
            out,
            stats,
            tasks: vec![relay, receive],
        })
    }

    /// What the bus moved between nodes so far.
    pub fn stats(&self) -> &Arc<BusStats> {
        &self.stats
    }
}

/// An event from NATS on `subject`, checked: its size, its shape, a valid
/// topic equal to the subject's.
fn accept(subject: &str, payload: &[u8]) -> Result<Event, String> {
    if payload.len() > MAX_EVENT_BYTES {
        return Err(format!(
            "{} bytes, over the {MAX_EVENT_BYTES} byte limit",
            payload.len()
        ));
    }
    let event: Event = serde_json::from_slice(payload).map_err(|e| format!("not an event: {e}"))?;
    let topic = subject
        .strip_prefix(SUBJECT_PREFIX)
        .ok_or("not a bus subject")?;
    if event.topic != topic {
        return Err(format!(
            "its topic {:?} is not its subject's {topic:?}",
            event.topic
        ));
    }
    plugd_host::bus::check_subject(topic).map_err(|e| e.to_string())?;
    Ok(event)
}

/// The NATS queue group of bus group `group`: its characters outside
/// `[A-Za-z0-9_-]` replaced, and a digest of the name, so two names never
/// share a queue.
pub fn queue_name(group: &str) -> String {
    use sha2::Digest as _;
    let clean: String = group
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let digest = sha2::Sha256::digest(group.as_bytes());
    format!("{QUEUE_PREFIX}{clean}.{}", hex::encode(&digest[..6]))
}

impl Bus for NatsBus {
    fn publish(&self, event: Event) -> Published {
        let connected = self.client.connection_state() == async_nats::connection::State::Connected;
        let mut published = self.local.publish(event.clone());
        if !connected {
            let g = self.groups.publish(event.clone());
            self.stats
                .grouped
                .fetch_add((g.delivered + g.shed) as u64, Ordering::Relaxed);
            published.delivered += g.delivered;
            published.shed += g.shed;
        }
        if self.out.try_send((event, !connected)).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
        published
    }

    fn subscribe_sink(&self, pattern: &str, sink: Sink) -> Result<SubscriptionGuard, SubjectError> {
        self.local.subscribe_sink(pattern, sink)
    }

    fn subscribe_group(
        &self,
        pattern: &str,
        group: &str,
        sink: Sink,
    ) -> Result<SubscriptionGuard, SubjectError> {
        // Checks the pattern; serves the member while NATS is away.
        let fallback = self.groups.subscribe_sink(pattern, sink.clone())?;
        let subject = format!("{SUBJECT_PREFIX}{pattern}");
        let queue = queue_name(group);
        let (client, stats) = (self.client.clone(), self.stats.clone());
        let (pattern, group) = (pattern.to_owned(), group.to_owned());
        let task = self.runtime.spawn(async move {
            let mut inbound = match client.queue_subscribe(subject.clone(), queue).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(%group, %subject, "cannot join the bus queue group on NATS; this node's member gets events only while NATS is away: {e}");
                    return;
                }
            };
            while let Some(msg) = inbound.next().await {
                let served = msg
                    .headers
                    .as_ref()
                    .is_some_and(|h| h.get(GROUPS_SERVED_HEADER).is_some());
                if served {
                    continue;
                }
                match accept(&msg.subject, &msg.payload) {
                    Ok(event) if plugd_host::bus::topic_matches(&pattern, &event.topic) => {
                        stats.grouped.fetch_add(1, Ordering::Relaxed);
                        sink(&event);
                    }
                    Ok(_) => {}
                    Err(why) => {
                        stats.refused.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(subject = %msg.subject, %group, "refused a bus message from NATS: {why}");
                    }
                }
            }
        });
        Ok(SubscriptionGuard::new(move || {
            task.abort();
            drop(fallback);
        }))
    }

    fn spans_nodes(&self) -> bool {
        true
    }

    fn node_counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        let s = &self.stats;
        vec![
            (
                "plugd_cluster_bus_relayed_total",
                "Bus events sent to the other nodes over NATS.",
                s.relayed.load(Ordering::Relaxed),
            ),
            (
                "plugd_cluster_bus_dropped_total",
                "Bus events the other nodes did not get (NATS unreachable, or the relay queue full).",
                s.dropped.load(Ordering::Relaxed),
            ),
            (
                "plugd_cluster_bus_received_total",
                "Bus events received from other nodes.",
                s.received.load(Ordering::Relaxed),
            ),
            (
                "plugd_cluster_bus_grouped_total",
                "Bus events handed to a plugin's queue group member on this node.",
                s.grouped.load(Ordering::Relaxed),
            ),
            (
                "plugd_cluster_bus_refused_total",
                "Messages on the bus subjects refused (malformed, oversized, or lying about their topic).",
                s.refused.load(Ordering::Relaxed),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_events_whose_topic_is_their_subject_are_accepted() {
        let e = Event::new(
            "plugin.inbound.slack",
            "slack",
            serde_json::json!({"text": "hi"}),
        );
        let body = serde_json::to_vec(&e).unwrap();
        assert_eq!(accept("plugd.bus.plugin.inbound.slack", &body).unwrap(), e);
        let lying = accept("plugd.bus.plugin.inbound.mail", &body).unwrap_err();
        assert!(lying.contains("is not its subject's"), "{lying}");
        assert!(
            accept("plugd.bus.x", b"{nope")
                .unwrap_err()
                .contains("not an event")
        );
        let huge = vec![b' '; MAX_EVENT_BYTES + 1];
        assert!(
            accept("plugd.bus.x", &huge)
                .unwrap_err()
                .contains("byte limit")
        );
        let bad = Event::new("a..b", "x", serde_json::Value::Null);
        let body = serde_json::to_vec(&bad).unwrap();
        assert!(accept("plugd.bus.a..b", &body).is_err());
    }
}
