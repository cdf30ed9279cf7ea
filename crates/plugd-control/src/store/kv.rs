//! The agent's key-value storage: limits and the [`KvStore`] trait.

use async_trait::async_trait;
use serde_json::Value;

use super::StoreError;

/// The namespaces: Dexto's `storage.database` and `storage.cache`.
pub const SPACES: [&str; 2] = ["database", "cache"];

/// Longest key, in bytes.
pub const MAX_KEY: usize = 512;

/// Largest value, in bytes of JSON.
pub const MAX_VALUE: usize = 1024 * 1024;

/// Most keys one `list` returns.
pub const MAX_LIST: usize = 1000;

/// JSON values by key in a few fixed spaces.
#[async_trait]
pub trait KvStore: Send + Sync {
    /// The value of `key` in `space`.
    async fn kv_get(&self, space: &str, key: &str) -> Result<Option<Value>, StoreError>;
    /// Sets `key` in `space`.
    async fn kv_set(&self, space: &str, key: &str, value: &Value) -> Result<(), StoreError>;
    /// Deletes `key` in `space`; whether it existed.
    async fn kv_delete(&self, space: &str, key: &str) -> Result<bool, StoreError>;
    /// The keys of `space` that start with `prefix`, sorted.
    async fn kv_list(&self, space: &str, prefix: &str) -> Result<Vec<String>, StoreError>;
}
