//! Blob stores shared by the nodes of a cluster: where approval pins travel between nodes ([`PinBlobs`]); trusted for availability only, every blob is verified by its digest from the state store before use.

/// Where the nodes of a cluster keep approval pins, by name (the hex of the
/// approved directory digest). `plugd-nats` implements it on NATS
/// JetStream's Object Store; the runtime sees only this trait.
#[async_trait::async_trait]
pub trait PinBlobs: Send + Sync {
    /// Stores `data` under `name` (replacing what was there).
    async fn put(&self, name: &str, data: Vec<u8>) -> Result<(), String>;
    /// The blob under `name`, `None` when there is none; more than `max`
    /// bytes is an error.
    async fn get(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, String>;
}
