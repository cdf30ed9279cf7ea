//! Pinned tool definitions on SQLite (see `plugd_control::store::tool_pins`):
//! one row per approved plugin, its pins and withheld tools as JSON.

use std::collections::BTreeMap;

use plugd_control::store::tool_pins::{
    PinnedTool, ToolPins, WithheldTool, bound_withheld, check_tool_pins, merge_pins,
};
use rusqlite::{OptionalExtension, TransactionBehavior, params};

use crate::error::StoreError;
use crate::store::Store;

/// Schema step 22: the pins of each approved plugin, tied to the approval's
/// digest; the triggers clear them when the approval is revoked or written
/// again (a re-approval re-pins the next catalog). `update_catalog` sets
/// only `catalog`, so it leaves them.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE tool_pins (
        plugin_id TEXT PRIMARY KEY NOT NULL,
        digest    TEXT NOT NULL,
        pins      TEXT NOT NULL,
        withheld  TEXT NOT NULL DEFAULT '[]'
    ) STRICT;
    CREATE TRIGGER tool_pins_revoked AFTER DELETE ON approvals
        BEGIN DELETE FROM tool_pins WHERE plugin_id = OLD.plugin_id; END;
    CREATE TRIGGER tool_pins_reapproved AFTER UPDATE OF digest, approved_by, approved_at ON approvals
        BEGIN DELETE FROM tool_pins WHERE plugin_id = OLD.plugin_id; END;
";

impl Store {
    /// The pins of `plugin_id` (see `ToolPinStore::tool_pins`).
    pub fn tool_pins(&self, plugin_id: &str) -> Result<Option<ToolPins>, StoreError> {
        let row: Option<(String, String, String)> = self
            .lock()
            .query_row(
                "SELECT digest, pins, withheld FROM tool_pins WHERE plugin_id = ?1",
                params![plugin_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(|e| self.query_error(format!("read tool pins of {plugin_id:?}"), e))?;
        row.map(|(digest, pins, withheld)| self.decode_pins(plugin_id, digest, &pins, &withheld))
            .transpose()
    }

    /// Pins the tools of `add` not pinned yet (see `ToolPinStore::pin_tools`).
    pub fn pin_tools(
        &self,
        plugin_id: &str,
        digest: &str,
        add: &BTreeMap<String, PinnedTool>,
    ) -> Result<Option<ToolPins>, StoreError> {
        check_tool_pins(plugin_id, digest)?;
        let mut conn = self.lock();
        let mut run = || -> rusqlite::Result<Option<(String, String)>> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let approved: Option<String> = tx
                .query_row(
                    "SELECT digest FROM approvals WHERE plugin_id = ?1",
                    params![plugin_id],
                    |r| r.get(0),
                )
                .optional()?;
            if approved.as_deref() != Some(digest) {
                return Ok(None);
            }
            let row: Option<(String, String, String)> = tx
                .query_row(
                    "SELECT digest, pins, withheld FROM tool_pins WHERE plugin_id = ?1",
                    params![plugin_id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            let (mut pins, withheld) = match row {
                Some((d, pins, withheld)) if d == digest => (
                    serde_json::from_str::<BTreeMap<String, PinnedTool>>(&pins).unwrap_or_default(),
                    withheld,
                ),
                _ => (BTreeMap::new(), "[]".to_owned()),
            };
            merge_pins(&mut pins, add);
            let text = serde_json::to_string(&pins).unwrap_or_else(|_| "{}".into());
            tx.execute(
                "INSERT INTO tool_pins (plugin_id, digest, pins, withheld) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (plugin_id) DO UPDATE SET
                    digest = excluded.digest, pins = excluded.pins, withheld = excluded.withheld",
                params![plugin_id, digest, text, withheld],
            )?;
            tx.commit()?;
            Ok(Some((text, withheld)))
        };
        let out = run().map_err(|e| self.query_error(format!("pin tools of {plugin_id:?}"), e))?;
        drop(conn);
        out.map(|(pins, withheld)| self.decode_pins(plugin_id, digest.to_owned(), &pins, &withheld))
            .transpose()
    }

    /// Replaces the withheld list (see `ToolPinStore::set_withheld_tools`).
    pub fn set_withheld_tools(
        &self,
        plugin_id: &str,
        digest: &str,
        withheld: &[WithheldTool],
    ) -> Result<bool, StoreError> {
        check_tool_pins(plugin_id, digest)?;
        let text = serde_json::to_string(&bound_withheld(withheld)).unwrap_or_else(|_| "[]".into());
        let n = self
            .lock()
            .execute(
                "UPDATE tool_pins SET withheld = ?3 WHERE plugin_id = ?1 AND digest = ?2",
                params![plugin_id, digest, text],
            )
            .map_err(|e| self.query_error(format!("record withheld tools of {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    fn decode_pins(
        &self,
        plugin_id: &str,
        digest: String,
        pins: &str,
        withheld: &str,
    ) -> Result<ToolPins, StoreError> {
        let corrupt = |what: &str, e: serde_json::Error| StoreError::Corrupt {
            db: self.label().to_owned(),
            plugin_id: plugin_id.to_owned(),
            detail: format!("{what} are not JSON ({e})"),
        };
        Ok(ToolPins {
            plugin_id: plugin_id.to_owned(),
            digest,
            tools: serde_json::from_str(pins).map_err(|e| corrupt("tool pins", e))?,
            withheld: serde_json::from_str(withheld).map_err(|e| corrupt("withheld tools", e))?,
        })
    }
}
