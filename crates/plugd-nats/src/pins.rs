//! Approval pins in NATS JetStream's Object Store (bucket `plugd_pins`): the `PinBlobs` of a cluster's nodes.
//!
//! The bucket carries nothing that cannot be rebuilt: every pin is also on
//! the disk of the node that approved it, and a node verifies what it takes
//! from here against the approval's digest in PostgreSQL before use.

use async_nats::jetstream::{self, object_store};
use plugd_control::blobs::PinBlobs;
use tokio::io::AsyncReadExt;

/// The Object Store bucket of approval pins.
pub const PINS_BUCKET: &str = "plugd_pins";

/// Approval pins on the cluster's NATS.
pub struct NatsPinBlobs {
    bucket: object_store::ObjectStore,
}

impl NatsPinBlobs {
    /// Opens (creating on first use) the pins bucket on `client`'s JetStream.
    pub async fn open(client: async_nats::Client) -> Result<NatsPinBlobs, String> {
        let js = jetstream::new(client);
        let bucket = match js.get_object_store(PINS_BUCKET).await {
            Ok(b) => b,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: PINS_BUCKET.to_owned(),
                    description: Some("plugd approval pins (verified by digest on use)".into()),
                    ..Default::default()
                })
                .await
                .map_err(|e| {
                    format!("cannot create the JetStream object store {PINS_BUCKET:?}: {e}")
                })?,
        };
        Ok(NatsPinBlobs { bucket })
    }
}

#[async_trait::async_trait]
impl PinBlobs for NatsPinBlobs {
    async fn put(&self, name: &str, data: Vec<u8>) -> Result<(), String> {
        let mut reader = data.as_slice();
        self.bucket
            .put(name, &mut reader)
            .await
            .map(|_| ())
            .map_err(|e| format!("cannot store pin {name} on NATS: {e}"))
    }

    async fn get(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, String> {
        let info = match self.bucket.info(name).await {
            Ok(i) => i,
            Err(e) if e.kind() == object_store::InfoErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read pin {name} on NATS: {e}")),
        };
        if info.deleted {
            return Ok(None);
        }
        if info.size as u64 > max {
            return Err(format!(
                "pin {name} on NATS is {} bytes, over the {max} a pin may have",
                info.size
            ));
        }
        let object = self
            .bucket
            .get(name)
            .await
            .map_err(|e| format!("cannot read pin {name} on NATS: {e}"))?;
        let mut data = Vec::with_capacity(info.size);
        object
            .take(max + 1)
            .read_to_end(&mut data)
            .await
            .map_err(|e| format!("cannot read pin {name} on NATS: {e}"))?;
        if data.len() as u64 > max {
            return Err(format!(
                "pin {name} on NATS is over the {max} bytes a pin may have"
            ));
        }
        Ok(Some(data))
    }
}
