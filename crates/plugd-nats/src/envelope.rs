//! Signed envelopes for requests and replies between the nodes of a cluster: HMAC-SHA256 under the cluster key over the sender, a nonce, the sender's time and the body; forged, altered, stale and replayed envelopes are refused by name.
//!
//! NATS credentials decide who may publish on plugd's subjects; the
//! envelope decides what a node acts on: a message that a node of this
//! cluster sent, unchanged, once, recently. The receiver keeps the nonces
//! it accepted for twice the allowed skew, so a replay inside the window
//! is caught by its nonce and one outside it by its time.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// How far a sender's clock may be from the receiver's, in ms: five
/// minutes, so nodes whose clocks drifted apart by minutes still hand off
/// (time decisions are the database's; this bounds only how long a
/// captured envelope could be replayed, and the nonce cache covers that
/// window).
pub const MAX_SKEW_MS: i64 = 300_000;

/// Most nonces remembered (beyond, the oldest go first and a message that
/// old is refused by its time anyway).
pub const MAX_REMEMBERED: usize = 100_000;

/// A signed message between nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The sending node's id.
    pub node: String,
    /// 128 random bits, hex.
    pub nonce: String,
    /// The sender's time, ms since the Unix epoch.
    pub at_ms: i64,
    /// What it carries (JSON text).
    pub body: String,
    /// HMAC-SHA256 of the fields above under the cluster key, hex.
    pub tag: String,
}

/// Why an envelope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not an envelope at all.
    #[error("not a plugd envelope: {0}")]
    Malformed(String),
    /// The tag does not match: another key, or altered on the way.
    #[error(
        "envelope from {node:?} has a tag that does not match the cluster key (forged or altered)"
    )]
    BadTag {
        /// Who it claims to be from.
        node: String,
    },
    /// Its time is too far from ours.
    #[error(
        "envelope from {node:?} is {skew_ms} ms from this node's clock (at most {MAX_SKEW_MS})"
    )]
    Stale {
        /// Who it is from.
        node: String,
        /// How far off.
        skew_ms: i64,
    },
    /// Its nonce was accepted before.
    #[error("envelope from {node:?} replays nonce {nonce}")]
    Replayed {
        /// Who it is from.
        node: String,
        /// The nonce.
        nonce: String,
    },
}

/// Signs and checks envelopes with one cluster key.
pub struct Sealer {
    key: Vec<u8>,
    node: String,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Seen {
    at: HashMap<String, i64>,
    order: VecDeque<(i64, String)>,
}

impl Sealer {
    /// The sealer of node `node` with the cluster key `key`.
    pub fn new(key: &[u8], node: &str) -> Sealer {
        Sealer {
            key: key.to_vec(),
            node: node.to_owned(),
            seen: Mutex::new(Seen::default()),
        }
    }

    fn mac(&self, node: &str, nonce: &str, at_ms: i64, body: &str) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        // Length-prefixed fields: no two field lists share their bytes.
        for field in [
            node.as_bytes(),
            nonce.as_bytes(),
            &at_ms.to_be_bytes(),
            body.as_bytes(),
        ] {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field);
        }
        mac
    }

    /// `body` sealed by this node at `now_ms`.
    pub fn seal(&self, body: &str, now_ms: i64) -> Envelope {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).expect("the OS random source");
        let nonce = hex::encode(nonce);
        let tag = hex::encode(
            self.mac(&self.node, &nonce, now_ms, body)
                .finalize()
                .into_bytes(),
        );
        Envelope {
            node: self.node.clone(),
            nonce,
            at_ms: now_ms,
            body: body.to_owned(),
            tag,
        }
    }

    /// The envelope in `bytes` checked at `now_ms`: its tag, its time, its
    /// nonce (remembered from now on).
    pub fn open(&self, bytes: &[u8], now_ms: i64) -> Result<Envelope, Refused> {
        let env: Envelope =
            serde_json::from_slice(bytes).map_err(|e| Refused::Malformed(e.to_string()))?;
        let tag = hex::decode(&env.tag).map_err(|_| Refused::BadTag {
            node: env.node.clone(),
        })?;
        self.mac(&env.node, &env.nonce, env.at_ms, &env.body)
            .verify_slice(&tag)
            .map_err(|_| Refused::BadTag {
                node: env.node.clone(),
            })?;
        let skew_ms = (now_ms - env.at_ms).abs();
        if skew_ms > MAX_SKEW_MS {
            return Err(Refused::Stale {
                node: env.node,
                skew_ms,
            });
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        // Forget what is old enough to be refused by its time.
        while let Some((at, _)) = seen.order.front()
            && (*at < now_ms - 2 * MAX_SKEW_MS || seen.order.len() >= MAX_REMEMBERED)
        {
            let (_, n) = seen.order.pop_front().expect("front exists");
            seen.at.remove(&n);
        }
        if seen.at.contains_key(&env.nonce) {
            return Err(Refused::Replayed {
                node: env.node,
                nonce: env.nonce,
            });
        }
        seen.at.insert(env.nonce.clone(), now_ms);
        seen.order.push_back((now_ms, env.nonce.clone()));
        Ok(env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_790_000_000_000;

    #[test]
    fn a_sealed_envelope_opens_once_and_forgeries_are_refused_by_name() {
        let a = Sealer::new(b"cluster key", "node-a");
        let b = Sealer::new(b"cluster key", "node-b");
        let env = a.seal(r#"{"op":"answer"}"#, NOW);
        let bytes = serde_json::to_vec(&env).unwrap();
        assert_eq!(b.open(&bytes, NOW + 5).unwrap(), env);
        // Replayed: refused by its nonce.
        assert!(matches!(
            b.open(&bytes, NOW + 10),
            Err(Refused::Replayed { .. })
        ));
        // Another key.
        let other = Sealer::new(b"another key", "node-a").seal("{}", NOW);
        let e = b
            .open(&serde_json::to_vec(&other).unwrap(), NOW)
            .unwrap_err();
        assert_eq!(
            e,
            Refused::BadTag {
                node: "node-a".into()
            }
        );
        // Altered body, sender or time.
        for alter in [
            (|e: &mut Envelope| e.body = r#"{"op":"approve"}"#.into()) as fn(&mut Envelope),
            |e| e.node = "node-c".into(),
            |e| e.at_ms += 1,
        ] {
            let mut forged = a.seal("{}", NOW);
            alter(&mut forged);
            let e = b
                .open(&serde_json::to_vec(&forged).unwrap(), NOW)
                .unwrap_err();
            assert!(matches!(e, Refused::BadTag { .. }), "{e}");
        }
        // Stale, both ways.
        let old = a.seal("{}", NOW - MAX_SKEW_MS - 1);
        let e = b.open(&serde_json::to_vec(&old).unwrap(), NOW).unwrap_err();
        assert!(matches!(e, Refused::Stale { .. }), "{e}");
        let ahead = a.seal("{}", NOW + MAX_SKEW_MS + 1);
        assert!(b.open(&serde_json::to_vec(&ahead).unwrap(), NOW).is_err());
        // Not an envelope.
        assert!(matches!(b.open(b"{nope", NOW), Err(Refused::Malformed(_))));
        let mut bad_hex = a.seal("{}", NOW);
        bad_hex.tag = "zz".into();
        assert!(matches!(
            b.open(&serde_json::to_vec(&bad_hex).unwrap(), NOW),
            Err(Refused::BadTag { .. })
        ));
    }

    #[test]
    fn remembered_nonces_are_bounded_and_expire_with_the_window() {
        let a = Sealer::new(b"k", "a");
        let b = Sealer::new(b"k", "b");
        for i in 0..1000 {
            let env = a.seal("{}", NOW + i);
            b.open(&serde_json::to_vec(&env).unwrap(), NOW + i).unwrap();
        }
        assert_eq!(b.seen.lock().unwrap().at.len(), 1000);
        // Past twice the window, the old nonces are forgotten.
        let late = NOW + 2 * MAX_SKEW_MS + 2000;
        let env = a.seal("{}", late);
        b.open(&serde_json::to_vec(&env).unwrap(), late).unwrap();
        assert_eq!(b.seen.lock().unwrap().at.len(), 1);
    }
}
