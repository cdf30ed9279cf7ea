//! Approvals of plugin content and the supervisor's failures: the records and the [`ApprovalStore`] trait.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{Invalid, StoreError};

/// A person's approval of one plugin's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// The plugin's id as declared in its manifest.
    pub plugin_id: String,
    /// The content digest approved, as made by `plugd_store::digest::plugin_digest`.
    pub digest: String,
    /// Who approved it (a user name, or e.g. `cli`).
    pub approved_by: String,
    /// When, as RFC 3339 UTC (see `plugd_store::now_rfc3339`).
    pub approved_at: String,
    /// The plugin's tool catalog as last seen (a JSON array), cached for listing without starting it.
    pub catalog: serde_json::Value,
}

/// The supervisor's record that it gave up restarting a plugin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The plugin's id.
    pub plugin_id: String,
    /// Why the supervisor gave up, for people.
    pub reason: String,
    /// When, as RFC 3339 UTC.
    pub at: String,
}

/// Checks a plugin id about to be approved or marked failed: not empty.
pub fn check_plugin_id(plugin_id: &str) -> Result<(), Invalid> {
    if plugin_id.is_empty() {
        return Err(Invalid::new(
            "plugin id \"\"",
            "a plugin id must not be empty",
        ));
    }
    Ok(())
}

/// Who approved which plugin content, and which plugins the supervisor gave up on.
#[async_trait]
pub trait ApprovalStore: Send + Sync {
    /// Records an approval, replacing any earlier one for the same plugin.
    async fn approve(&self, a: &Approval) -> Result<(), StoreError>;
    /// Records an approval and clears the plugin's failure, in one transaction.
    async fn approve_clearing_failure(&self, a: &Approval) -> Result<(), StoreError>;
    /// Removes the approval only if it is still exactly `a`; whether it did.
    async fn revoke_exact(&self, a: &Approval) -> Result<bool, StoreError>;
    /// The approval of `plugin_id`.
    async fn approval(&self, plugin_id: &str) -> Result<Option<Approval>, StoreError>;
    /// Every approval, by plugin id.
    async fn approvals(&self) -> Result<Vec<Approval>, StoreError>;
    /// Removes the approval of `plugin_id`; whether there was one.
    async fn revoke(&self, plugin_id: &str) -> Result<bool, StoreError>;
    /// Replaces the cached catalog of `plugin_id` if its approval still pins `digest`.
    async fn update_catalog(
        &self,
        plugin_id: &str,
        digest: &str,
        catalog: &serde_json::Value,
    ) -> Result<bool, StoreError>;
    /// Records that the supervisor gave up on `plugin_id`.
    async fn mark_failed(&self, plugin_id: &str, reason: &str) -> Result<(), StoreError>;
    /// The failure recorded for `plugin_id`.
    async fn failure(&self, plugin_id: &str) -> Result<Option<Failure>, StoreError>;
    /// Clears the failure of `plugin_id`; whether there was one.
    async fn clear_failure(&self, plugin_id: &str) -> Result<bool, StoreError>;
}
