//! Pinned tool definitions (issue 28, the MCP "rug pull"): each approved
//! plugin's tools as first seen after approval, by hash of their canonical
//! JSON, and the tools withheld because they differ; the records, the
//! bounds both backends apply, and the [`ToolPinStore`] trait.
//!
//! One row per plugin, tied to the approval's digest: a revocation and a
//! re-approval clear it (triggers on `approvals` in both backends), so the
//! next catalog is pinned again. Everything stored per plugin is bounded
//! ([`MAX_PINNED_TOOLS`], [`MAX_KEPT_DEFINITION_BYTES`],
//! [`MAX_PIN_BYTES`], [`MAX_WITHHELD_TOOLS`], [`MAX_DIFF_BYTES`]), so a
//! server flooding `list_changed` with ever-new definitions cannot grow the
//! state: pins are written once per tool, and the withheld list replaces
//! the previous one.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Invalid, StoreError};

/// Most tools pinned for one plugin; tools beyond it are never pinned
/// (they wait for approval, like new tools).
pub const MAX_PINNED_TOOLS: usize = 1024;

/// A definition longer than this (canonical JSON) is pinned by hash only:
/// a change to it is still caught, but its diff cannot show the old text.
pub const MAX_KEPT_DEFINITION_BYTES: usize = 64 * 1024;

/// Most bytes of kept definitions per plugin; later ones are pinned by hash only.
pub const MAX_PIN_BYTES: usize = 1024 * 1024;

/// Most withheld tools recorded for one plugin (every one is withheld; only
/// this many are named with their diff).
pub const MAX_WITHHELD_TOOLS: usize = 256;

/// Longest diff kept for one withheld tool, in bytes.
pub const MAX_DIFF_BYTES: usize = 4096;

/// Longest tool name pinned or recorded, in bytes.
pub const MAX_TOOL_NAME_BYTES: usize = 512;

/// One pinned tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedTool {
    /// `sha256:HEX` of the definition's canonical JSON.
    pub sha256: String,
    /// The definition as pinned (canonical), for diffs; `None` when it was
    /// too large to keep ([`MAX_KEPT_DEFINITION_BYTES`], [`MAX_PIN_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<Value>,
}

/// Why a tool is withheld.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WithheldReason {
    /// Its definition differs from the pinned one.
    Changed,
    /// It appeared after the pins were taken (`accept_new_tools` is off).
    New,
}

/// One tool withheld from every surface until an operator re-approves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithheldTool {
    /// The tool's plugd name.
    pub name: String,
    /// Changed or new.
    pub reason: WithheldReason,
    /// `sha256:HEX` of the definition the plugin reports now.
    pub sha256: String,
    /// `sha256:HEX` of the pinned definition (`None` for a new tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_sha256: Option<String>,
    /// What changed, one line per JSON path (`- old`, `+ new`), at most
    /// [`MAX_DIFF_BYTES`].
    pub diff: String,
}

/// The pins of one approved plugin and what is withheld now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolPins {
    /// The plugin.
    pub plugin_id: String,
    /// The approval's digest the pins belong to.
    pub digest: String,
    /// Tool name → pin.
    pub tools: BTreeMap<String, PinnedTool>,
    /// The tools withheld at the last catalog refresh (at most
    /// [`MAX_WITHHELD_TOOLS`]), by name.
    pub withheld: Vec<WithheldTool>,
}

/// Merges `add` into `existing` as the stores do: a tool already pinned
/// keeps its pin, names too long are skipped, at most [`MAX_PINNED_TOOLS`]
/// in all, and definitions are kept only within [`MAX_KEPT_DEFINITION_BYTES`]
/// each and [`MAX_PIN_BYTES`] in all. Returns whether anything was added.
pub fn merge_pins(
    existing: &mut BTreeMap<String, PinnedTool>,
    add: &BTreeMap<String, PinnedTool>,
) -> bool {
    let mut kept: usize = existing
        .values()
        .filter_map(|p| p.definition.as_ref())
        .map(|d| d.to_string().len())
        .sum();
    let mut added = false;
    for (name, pin) in add {
        if existing.len() >= MAX_PINNED_TOOLS {
            break;
        }
        if name.len() > MAX_TOOL_NAME_BYTES || existing.contains_key(name) {
            continue;
        }
        let definition = pin.definition.as_ref().and_then(|d| {
            let len = d.to_string().len();
            (len <= MAX_KEPT_DEFINITION_BYTES && kept + len <= MAX_PIN_BYTES).then(|| {
                kept += len;
                d.clone()
            })
        });
        existing.insert(
            name.clone(),
            PinnedTool {
                sha256: pin.sha256.clone(),
                definition,
            },
        );
        added = true;
    }
    added
}

/// Bounds a withheld list as the stores keep it: at most
/// [`MAX_WITHHELD_TOOLS`] entries, names and diffs cut to their limits.
pub fn bound_withheld(withheld: &[WithheldTool]) -> Vec<WithheldTool> {
    withheld
        .iter()
        .take(MAX_WITHHELD_TOOLS)
        .map(|w| WithheldTool {
            name: cut(&w.name, MAX_TOOL_NAME_BYTES),
            diff: cut(&w.diff, MAX_DIFF_BYTES),
            ..w.clone()
        })
        .collect()
}

/// `s` cut to at most `max` bytes on a character boundary, with `…` when cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Checks the plugin id and digest of a pin write.
pub fn check_tool_pins(plugin_id: &str, digest: &str) -> Result<(), Invalid> {
    super::approvals::check_plugin_id(plugin_id)?;
    if digest.is_empty() {
        return Err(Invalid::new(
            format!("tool pins of {plugin_id:?}"),
            "tool pins belong to an approval's digest, which must not be empty",
        ));
    }
    Ok(())
}

/// The pinned tool definitions of approved plugins.
#[async_trait]
pub trait ToolPinStore: Send + Sync {
    /// The pins of `plugin_id`, whatever approval they were taken under
    /// (compare [`ToolPins::digest`] with the approval's).
    async fn tool_pins(&self, plugin_id: &str) -> Result<Option<ToolPins>, StoreError>;
    /// Pins the tools of `add` not pinned yet (every one when the plugin
    /// has no pins under `digest`), bounded as [`merge_pins`] does, in one
    /// transaction, only while the approval of `plugin_id` is for `digest`.
    /// Returns the pins as stored after, `None` when the approval is gone
    /// or for another digest. An existing pin is never replaced: of two
    /// nodes pinning at once, the first one's definitions hold.
    async fn pin_tools(
        &self,
        plugin_id: &str,
        digest: &str,
        add: &BTreeMap<String, PinnedTool>,
    ) -> Result<Option<ToolPins>, StoreError>;
    /// Replaces the withheld list of `plugin_id` (bounded as
    /// [`bound_withheld`] does) if its pins are for `digest`; whether it did.
    async fn set_withheld_tools(
        &self,
        plugin_id: &str,
        digest: &str,
        withheld: &[WithheldTool],
    ) -> Result<bool, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(n: usize) -> PinnedTool {
        PinnedTool {
            sha256: format!("sha256:{n}"),
            definition: Some(Value::String("x".repeat(n))),
        }
    }

    #[test]
    fn an_existing_pin_is_never_replaced() {
        let mut pins = BTreeMap::from([("a".to_owned(), pin(1))]);
        let add = BTreeMap::from([("a".to_owned(), pin(2)), ("b".to_owned(), pin(3))]);
        assert!(merge_pins(&mut pins, &add));
        assert_eq!(pins["a"], pin(1));
        assert_eq!(pins["b"], pin(3));
        assert!(!merge_pins(&mut pins, &add));
    }

    #[test]
    fn pins_are_bounded_in_count_and_bytes() {
        let mut pins = BTreeMap::new();
        let add: BTreeMap<String, PinnedTool> = (0..MAX_PINNED_TOOLS + 10)
            .map(|i| (format!("t{i:05}"), pin(2000)))
            .collect();
        merge_pins(&mut pins, &add);
        assert_eq!(pins.len(), MAX_PINNED_TOOLS);
        let kept: usize = pins
            .values()
            .filter_map(|p| p.definition.as_ref())
            .map(|d| d.to_string().len())
            .sum();
        assert!(kept <= MAX_PIN_BYTES, "{kept}");
        assert!(pins.values().any(|p| p.definition.is_none()));
        let mut big = BTreeMap::new();
        merge_pins(
            &mut big,
            &BTreeMap::from([("big".to_owned(), pin(MAX_KEPT_DEFINITION_BYTES + 1))]),
        );
        assert_eq!(big["big"].definition, None);
    }

    #[test]
    fn withheld_lists_are_bounded() {
        let w = WithheldTool {
            name: "é".repeat(MAX_TOOL_NAME_BYTES),
            reason: WithheldReason::Changed,
            sha256: "sha256:1".into(),
            pinned_sha256: None,
            diff: "d".repeat(MAX_DIFF_BYTES * 2),
        };
        let out = bound_withheld(&vec![w; MAX_WITHHELD_TOOLS + 1]);
        assert_eq!(out.len(), MAX_WITHHELD_TOOLS);
        assert!(out[0].name.len() <= MAX_TOOL_NAME_BYTES);
        assert!(out[0].diff.len() <= MAX_DIFF_BYTES);
    }
}
