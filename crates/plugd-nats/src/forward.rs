//! Node-to-node hand-offs over NATS in signed envelopes: [`NatsForwarder`] offers a message to the other nodes on `plugd.fwd.KIND` and waits for the node that takes it; every node answers the offers it can take (`plugd_control::forward`).
//!
//! An offer and its reply are each sealed under the cluster key
//! ([`crate::envelope::Sealer`]); a node acts only on an envelope that opens
//! (a node of this cluster sent it, unchanged, once, recently), and an
//! offerer counts only a reply that opens and names its offer's nonce. A
//! node ignores its own offers, but notes that NATS delivered them: an
//! offer nobody took within [`OFFER_WAIT`] that did not even come back to
//! its own node found NATS not delivering (a frozen server, a half-open
//! connection), and is [`ForwardError::Unavailable`], not "nobody".

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use futures_util::StreamExt as _;
use plugd_control::forward::{ForwardError, Forwarder, Taker};
use serde_json::{Value, json};

use crate::NatsError;
use crate::envelope::Sealer;

/// Subjects of the hand-offs: `plugd.fwd.KIND`.
pub const SUBJECT_PREFIX: &str = "plugd.fwd.";

/// How long an offer waits for a node to take it.
pub const OFFER_WAIT: Duration = Duration::from_secs(2);

/// Largest offer a node reads (NATS's default maximum payload).
pub const MAX_OFFER: usize = 1 << 20;

/// Offers to and answers from the other nodes (see the module).
pub struct NatsForwarder {
    client: async_nats::Client,
    sealer: Arc<Sealer>,
    taker: Arc<OnceLock<Arc<dyn Taker>>>,
    node: String,
    /// This node's offers waiting for a taker, by nonce: whether NATS has
    /// delivered each back to this node's own subscription.
    echoes: Echoes,
}

type Echoes = Arc<Mutex<HashMap<String, bool>>>;

fn lock(echoes: &Echoes) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
    echoes.lock().unwrap_or_else(|p| p.into_inner())
}

impl std::fmt::Debug for NatsForwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsForwarder")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl NatsForwarder {
    /// Starts answering the other nodes' offers as node `node` with the
    /// cluster key `key` (offers wait for [`NatsForwarder::set_taker`]).
    pub async fn start(
        client: async_nats::Client,
        key: &[u8],
        node: &str,
    ) -> Result<NatsForwarder, NatsError> {
        let sealer = Arc::new(Sealer::new(key, node));
        let taker: Arc<OnceLock<Arc<dyn Taker>>> = Arc::default();
        let echoes = Echoes::default();
        let subject = format!("{SUBJECT_PREFIX}>");
        let mut offers = client
            .subscribe(subject.clone())
            .await
            .map_err(|source| NatsError::Subscribe { subject, source })?;
        {
            let (client, sealer, taker, node, echoes) = (
                client.clone(),
                sealer.clone(),
                taker.clone(),
                node.to_owned(),
                echoes.clone(),
            );
            tokio::spawn(async move {
                while let Some(msg) = offers.next().await {
                    let (client, sealer, taker, node, echoes) = (
                        client.clone(),
                        sealer.clone(),
                        taker.clone(),
                        node.clone(),
                        echoes.clone(),
                    );
                    tokio::spawn(async move {
                        answer(msg, &client, &sealer, &taker, &node, &echoes).await;
                    });
                }
            });
        }
        Ok(NatsForwarder {
            client,
            sealer,
            taker,
            node: node.to_owned(),
            echoes,
        })
    }

    /// What this node does with the other nodes' offers.
    pub fn set_taker(&self, taker: Arc<dyn Taker>) {
        let _ = self.taker.set(taker);
    }
}

/// Answers one offer if it opens, is not this node's, and the taker took it.
async fn answer(
    msg: async_nats::Message,
    client: &async_nats::Client,
    sealer: &Sealer,
    taker: &OnceLock<Arc<dyn Taker>>,
    node: &str,
    echoes: &Echoes,
) {
    if msg.payload.len() > MAX_OFFER {
        tracing::warn!(subject = %msg.subject, bytes = msg.payload.len(), "oversized hand-off refused");
        return;
    }
    let env = match sealer.open(&msg.payload, now_ms()) {
        Ok(env) => env,
        Err(why) => {
            tracing::warn!(subject = %msg.subject, "hand-off refused: {why}");
            return;
        }
    };
    if env.node == node {
        if let Some(seen) = lock(echoes).get_mut(&env.nonce) {
            *seen = true;
        }
        return;
    }
    let Ok(body) = serde_json::from_str::<Value>(&env.body) else {
        return;
    };
    let kind = msg
        .subject
        .as_str()
        .strip_prefix(SUBJECT_PREFIX)
        .unwrap_or("");
    let (Some(k), Some(key)) = (body["kind"].as_str(), body["key"].as_str()) else {
        return;
    };
    if k != kind {
        tracing::warn!(subject = %msg.subject, "hand-off refused: its kind is not its subject");
        return;
    }
    let Some(taker) = taker.get() else { return };
    if !taker.take(kind, key, body["payload"].clone()).await {
        return;
    }
    if let Some(reply) = msg.reply {
        let sealed = sealer.seal(
            &json!({"taken": true, "re": env.nonce}).to_string(),
            now_ms(),
        );
        if let Ok(bytes) = serde_json::to_vec(&sealed) {
            let _ = client.publish(reply, bytes.into()).await;
        }
    }
}

#[async_trait::async_trait]
impl Forwarder for NatsForwarder {
    async fn offer(&self, kind: &str, key: &str, payload: Value) -> Result<bool, ForwardError> {
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(ForwardError::Unavailable("not connected to NATS".into()));
        }
        let body = json!({"kind": kind, "key": key, "payload": payload}).to_string();
        let sealed = self.sealer.seal(&body, now_ms());
        let nonce = sealed.nonce.clone();
        let bytes =
            serde_json::to_vec(&sealed).map_err(|e| ForwardError::Unavailable(e.to_string()))?;
        let request = async_nats::Request::new()
            .payload(bytes.into())
            .timeout(Some(OFFER_WAIT));
        lock(&self.echoes).insert(nonce.clone(), false);
        let sent = self
            .client
            .send_request(format!("{SUBJECT_PREFIX}{kind}"), request)
            .await;
        let echoed = lock(&self.echoes).remove(&nonce) == Some(true);
        match sent {
            Ok(reply) => match self.sealer.open(&reply.payload, now_ms()) {
                Ok(env) => {
                    let v: Value = serde_json::from_str(&env.body).unwrap_or(Value::Null);
                    Ok(v["taken"] == true && v["re"] == nonce.as_str())
                }
                Err(why) => {
                    tracing::warn!(kind, "reply to a hand-off refused: {why}");
                    Ok(false)
                }
            },
            Err(e) if e.kind() == RequestErrorKind::TimedOut && !echoed => {
                Err(ForwardError::Unavailable(format!(
                    "NATS did not deliver the hand-off within {} s",
                    OFFER_WAIT.as_secs()
                )))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    RequestErrorKind::TimedOut | RequestErrorKind::NoResponders
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(ForwardError::Unavailable(e.to_string())),
        }
    }
}
