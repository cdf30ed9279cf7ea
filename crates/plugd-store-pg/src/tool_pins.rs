//! Pinned tool definitions on PostgreSQL: same rows and bounds as
//! `plugd-store`'s `tool_pins.rs` (see `plugd_control::store::tool_pins`);
//! a pin write locks the approval's row, so two nodes pinning one plugin's
//! first catalog at once keep the first one's definitions.

use std::collections::BTreeMap;

use plugd_control::store::tool_pins::{
    PinnedTool, ToolPins, WithheldTool, bound_withheld, check_tool_pins, merge_pins,
};

use crate::{PgError, PgStore};

/// Schema step 7 (SQLite's 22), with the triggers that clear a plugin's
/// pins when its approval is revoked or written again.
pub(crate) const MIGRATION: &str = r#"
    CREATE TABLE tool_pins (
        plugin_id text COLLATE "C" PRIMARY KEY NOT NULL,
        digest    text COLLATE "C" NOT NULL,
        pins      text COLLATE "C" NOT NULL,
        withheld  text COLLATE "C" NOT NULL DEFAULT '[]'
    );
    CREATE FUNCTION plugd_clear_tool_pins() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM tool_pins WHERE plugin_id = OLD.plugin_id;
        RETURN NULL;
    END $$;
    CREATE TRIGGER tool_pins_revoked AFTER DELETE ON approvals
        FOR EACH ROW EXECUTE FUNCTION plugd_clear_tool_pins();
    CREATE TRIGGER tool_pins_reapproved AFTER UPDATE OF digest, approved_by, approved_at ON approvals
        FOR EACH ROW EXECUTE FUNCTION plugd_clear_tool_pins();
"#;

impl PgStore {
    /// The pins of `plugin_id` (see `ToolPinStore::tool_pins`).
    pub async fn tool_pins(&self, plugin_id: &str) -> Result<Option<ToolPins>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT digest, pins, withheld FROM tool_pins WHERE plugin_id = $1",
                &[&plugin_id],
            )
            .await
            .map_err(|e| self.query_error(format!("read tool pins of {plugin_id:?}"), e))?;
        row.map(|r| self.decode_pins(plugin_id, r.get(0), r.get(1), r.get(2)))
            .transpose()
    }

    /// Pins the tools of `add` not pinned yet (see `ToolPinStore::pin_tools`).
    pub async fn pin_tools(
        &self,
        plugin_id: &str,
        digest: &str,
        add: &BTreeMap<String, PinnedTool>,
    ) -> Result<Option<ToolPins>, PgError> {
        check_tool_pins(plugin_id, digest)?;
        let action = || format!("pin tools of {plugin_id:?}");
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        // The approval's row lock orders concurrent pinning of one plugin.
        let approved: Option<String> = tx
            .query_opt(
                "SELECT digest FROM approvals WHERE plugin_id = $1 FOR UPDATE",
                &[&plugin_id],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?
            .map(|r| r.get(0));
        if approved.as_deref() != Some(digest) {
            return Ok(None);
        }
        let row = tx
            .query_opt(
                "SELECT digest, pins, withheld FROM tool_pins WHERE plugin_id = $1",
                &[&plugin_id],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?;
        let (mut pins, withheld) = match row {
            Some(r) if r.get::<_, String>(0) == digest => (
                serde_json::from_str::<BTreeMap<String, PinnedTool>>(&r.get::<_, String>(1))
                    .unwrap_or_default(),
                r.get::<_, String>(2),
            ),
            _ => (BTreeMap::new(), "[]".to_owned()),
        };
        merge_pins(&mut pins, add);
        let text = serde_json::to_string(&pins).unwrap_or_else(|_| "{}".into());
        tx.execute(
            "INSERT INTO tool_pins (plugin_id, digest, pins, withheld) VALUES ($1, $2, $3, $4)
             ON CONFLICT (plugin_id) DO UPDATE SET
                digest = excluded.digest, pins = excluded.pins, withheld = excluded.withheld",
            &[&plugin_id, &digest, &text, &withheld],
        )
        .await
        .map_err(|e| self.query_error(action(), e))?;
        tx.commit()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        self.decode_pins(plugin_id, digest.to_owned(), text, withheld)
            .map(Some)
    }

    /// Replaces the withheld list (see `ToolPinStore::set_withheld_tools`).
    pub async fn set_withheld_tools(
        &self,
        plugin_id: &str,
        digest: &str,
        withheld: &[WithheldTool],
    ) -> Result<bool, PgError> {
        check_tool_pins(plugin_id, digest)?;
        let text = serde_json::to_string(&bound_withheld(withheld)).unwrap_or_else(|_| "[]".into());
        let client = self.client().await?;
        let n = client
            .execute(
                "UPDATE tool_pins SET withheld = $3 WHERE plugin_id = $1 AND digest = $2",
                &[&plugin_id, &digest, &text],
            )
            .await
            .map_err(|e| self.query_error(format!("record withheld tools of {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    fn decode_pins(
        &self,
        plugin_id: &str,
        digest: String,
        pins: String,
        withheld: String,
    ) -> Result<ToolPins, PgError> {
        let damaged = |what: &str, e: serde_json::Error| PgError::Damaged {
            db: self.label().to_owned(),
            what: format!("tool pins of plugin {plugin_id:?}"),
            detail: format!("{what} are not JSON ({e}); re-approve the plugin"),
        };
        Ok(ToolPins {
            plugin_id: plugin_id.to_owned(),
            digest,
            tools: serde_json::from_str(&pins).map_err(|e| damaged("pins", e))?,
            withheld: serde_json::from_str(&withheld).map_err(|e| damaged("withheld tools", e))?,
        })
    }
}
