//! Per-plugin configuration values with secrets sealed, and org secrets: the records and the [`ConfigStore`] trait.
//!
//! Sealing and opening belong to the master key (`plugd_store::secrets`);
//! a backend stores sealed boxes as they are and never sees a plaintext.

use async_trait::async_trait;
use serde_json::Value;

use super::{Invalid, StoreError};

/// A sealed secret as stored: key id, nonce, ciphertext with its tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// Id of the master key that sealed it (the master key's id).
    pub key_id: String,
    /// The 96-bit nonce, fresh for every value.
    pub nonce: Vec<u8>,
    /// AES-256-GCM ciphertext followed by the 16-byte tag.
    pub ciphertext: Vec<u8>,
}

/// One change of [`ConfigStore::config_write_all`].
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigWrite {
    /// Store this plain value.
    Plain(Value),
    /// Store this sealed secret (sealed by the master key).
    Sealed(Sealed),
    /// Remove the value (the default applies again).
    Unset,
}

/// One stored configuration value.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredValue {
    /// A plain JSON value.
    Plain(Value),
    /// A secret, sealed.
    Secret(Sealed),
}

/// The outcome of [`ConfigStore::rotate_secrets`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotation {
    /// How many secrets were re-sealed.
    pub resealed: usize,
    /// Id of the key they were sealed with before.
    pub old_key_id: String,
    /// Id of the new key.
    pub new_key_id: String,
}

/// Re-seals one secret (`plugin`, `key`, sealed under the old key) under a new key.
pub type Reseal<'a> = dyn Fn(&str, &str, &Sealed) -> Result<Sealed, StoreError> + Send + Sync + 'a;

/// Checks a plugin id and config key: non-empty, no NUL.
pub fn check_config_names(plugin: &str, key: &str) -> Result<(), Invalid> {
    if plugin.is_empty() || plugin.contains('\0') {
        return Err(Invalid::new(
            format!("plugin id {plugin:?}"),
            "a plugin id must be non-empty and contain no NUL",
        ));
    }
    if key.is_empty() || key.contains('\0') {
        return Err(Invalid::new(
            format!("config key {key:?}"),
            "a config key must be non-empty and contain no NUL",
        ));
    }
    Ok(())
}

/// Configuration values of plugins and secrets of orgs.
#[async_trait]
pub trait ConfigStore: Send + Sync {
    /// Stores a plain value for `key` of `plugin`.
    async fn config_set_plain(
        &self,
        plugin: &str,
        key: &str,
        value: &Value,
    ) -> Result<(), StoreError>;
    /// Stores a sealed secret for `key` of `plugin`.
    async fn put_sealed(&self, plugin: &str, key: &str, sealed: &Sealed) -> Result<(), StoreError>;
    /// Applies every write in one transaction: all of them, or none.
    async fn config_write_all(
        &self,
        plugin: &str,
        writes: &[(String, ConfigWrite)],
    ) -> Result<(), StoreError>;
    /// Removes `key` of `plugin`; whether it was set.
    async fn config_unset(&self, plugin: &str, key: &str) -> Result<bool, StoreError>;
    /// Every stored value of `plugin`, by key.
    async fn config_values(&self, plugin: &str) -> Result<Vec<(String, StoredValue)>, StoreError>;
    /// One stored value of `plugin`.
    async fn config_value(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<Option<StoredValue>, StoreError>;
    /// Re-seals every secret with `reseal` in one transaction; `old_key_id`
    /// and `new_key_id` are reported back in the [`Rotation`].
    async fn reseal_secrets(
        &self,
        old_key_id: &str,
        new_key_id: &str,
        reseal: &Reseal<'_>,
    ) -> Result<Rotation, StoreError>;
    /// The ids of the master keys the stored secrets are sealed with.
    async fn secret_key_ids(&self) -> Result<Vec<String>, StoreError>;
    /// The names of `org_id`'s secrets.
    async fn org_secret_names(&self, org_id: &str) -> Result<Vec<String>, StoreError>;
    /// Sets one secret of `org_id`.
    async fn org_secret_set(&self, org_id: &str, name: &str, value: &str)
    -> Result<(), StoreError>;
    /// Deletes one secret of `org_id`; whether it existed.
    async fn org_secret_delete(&self, org_id: &str, name: &str) -> Result<bool, StoreError>;
    /// Whether `org_id` has a secret `name`.
    async fn org_secret_exists(&self, org_id: &str, name: &str) -> Result<bool, StoreError>;
}
