//! The agent's key-value storage: limits and the [`KvStore`] trait.

use async_trait::async_trait;
use serde_json::Value;

use super::{Invalid, StoreError};

/// The namespaces: Dexto's `storage.database` and `storage.cache`.
pub const SPACES: [&str; 2] = ["database", "cache"];

/// Longest key, in bytes.
pub const MAX_KEY: usize = 512;

/// Largest value, in bytes of JSON.
pub const MAX_VALUE: usize = 1024 * 1024;

/// Most keys one `list` returns.
pub const MAX_LIST: usize = 1000;

/// Checks a storage space and key (shared by every backend).
pub fn check_key(space: &str, key: &str) -> Result<(), Invalid> {
    if !SPACES.contains(&space) {
        return Err(Invalid::new(
            format!("storage {space:?}"),
            "the agent's storage is \"database\" or \"cache\"",
        ));
    }
    if key.is_empty() || key.len() > MAX_KEY || key.contains('\0') {
        return Err(Invalid::new(
            format!("key {:?}", key.chars().take(64).collect::<String>()),
            "a storage key is 1 to 512 bytes without NUL",
        ));
    }
    Ok(())
}

/// Checks the JSON text of `key`'s value: at most [`MAX_VALUE`] bytes.
pub fn check_value(key: &str, text: &str) -> Result<(), Invalid> {
    if text.len() > MAX_VALUE {
        return Err(Invalid::new(
            format!("the value of {key:?} ({} bytes)", text.len()),
            "a storage value is at most 1 MiB of JSON",
        ));
    }
    Ok(())
}

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
