//! Pinned tool definitions (issue 28, the MCP "rug pull"): the catalog an
//! approved plugin reports is screened against the definitions pinned
//! after its approval, and a tool whose definition changed, or that is new,
//! is withheld from every surface until an operator re-approves.
//!
//! A tool's definition is its whole [`ToolDef`] (name, description, input
//! schema, output schema, annotations, title, icons, risk) as canonical
//! JSON (object keys sorted, no whitespace), pinned by its SHA-256. The
//! first catalog seen under an approval is pinned (trust on first use;
//! plugd starts a plugin at approval to read it, so that is the catalog
//! the operator just approved); catalogs declared in a manifest are covered
//! by the approval's content digest as well. Later catalogs (a restart, an
//! MCP `notifications/tools/list_changed`) are compared by hash, once per
//! refresh, never per call: an equal hash is offered, a different one is
//! withheld with a diff, and a tool not pinned waits for approval unless
//! plugd.yaml sets `accept_new_tools: true` for that MCP server (then it is
//! pinned as first seen). Withheld tools are absent from the registry, so
//! every surface (`/mcp`, `GET /v1/tools`, the agent) lists none and a call
//! is refused as an unknown tool; `plugd plugin show`, the console and
//! `GET /v1/plugins/{id}` name them (`withheld_tools`). A re-approval or a
//! revocation clears the pins (triggers in both stores).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::RwLock;

use plugd_control::store::tool_pins::{
    MAX_DIFF_BYTES, PinnedTool, ToolPins, WithheldReason, WithheldTool, cut,
};
use plugd_host::ToolDef;
use plugd_store::StateStore;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// Longest value shown on one line of a diff, in characters.
const DIFF_VALUE_CHARS: usize = 240;

/// `v` as canonical JSON: object keys in byte order, no whitespace, so
/// key order never makes two definitions differ.
pub fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A tool's definition as pinned: its [`ToolDef`] as JSON.
pub fn definition(def: &ToolDef) -> Value {
    serde_json::to_value(def).unwrap_or(Value::Null)
}

/// `sha256:HEX` of `def`'s canonical JSON.
pub fn definition_hash(def: &Value) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(canonical(def).as_bytes()))
    )
}

/// What changed from `old` to `new`, one line per JSON path (`- PATH: old`,
/// `+ PATH: new`), bounded to [`MAX_DIFF_BYTES`]. `old` `None` with
/// `pinned` set: the pinned definition was too large to keep.
pub fn diff(old: Option<&Value>, new: &Value, pinned: Option<&str>) -> String {
    let mut lines = Vec::new();
    match (old, pinned) {
        (None, Some(pinned)) => {
            lines.push(format!(
                "pinned definition {pinned} was too large to keep; it differs from {}",
                definition_hash(new)
            ));
        }
        _ => {
            let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
            if let Some(old) = old {
                flatten("", old, &mut a);
            }
            flatten("", new, &mut b);
            let paths: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for path in paths {
                match (a.get(path), b.get(path)) {
                    (Some(x), Some(y)) if x == y => {}
                    (x, y) => {
                        if let Some(x) = x {
                            lines.push(format!("- {path}: {}", short(x)));
                        }
                        if let Some(y) = y {
                            lines.push(format!("+ {path}: {}", short(y)));
                        }
                    }
                }
            }
        }
    }
    cut(&lines.join("\n"), MAX_DIFF_BYTES)
}

fn short(s: &str) -> String {
    match s.char_indices().nth(DIFF_VALUE_CHARS) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Leaves of `v` by JSON Pointer, each as canonical JSON.
fn flatten(path: &str, v: &Value, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, item) in map {
                let k = k.replace('~', "~0").replace('/', "~1");
                flatten(&format!("{path}/{k}"), item, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                flatten(&format!("{path}/{i}"), item, out);
            }
        }
        leaf => {
            let p = if path.is_empty() { "/" } else { path };
            out.insert(p.to_owned(), canonical(leaf));
        }
    }
}

/// The MCP servers whose new tools are pinned as first seen
/// (`mcp.servers.NAME.accept_new_tools: true`), as plugd.yaml in force says.
#[derive(Debug, Default)]
pub(crate) struct AcceptNew(RwLock<BTreeSet<String>>);

impl AcceptNew {
    pub(crate) fn replace(&self, servers: BTreeSet<String>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = servers;
    }

    pub(crate) fn get(&self, plugin: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(plugin)
    }
}

/// A catalog after screening: what is offered, what is withheld.
#[derive(Debug, Default)]
pub(crate) struct Screened {
    pub(crate) offered: Vec<ToolDef>,
    pub(crate) withheld: Vec<WithheldTool>,
}

/// Screens `tools`, the catalog plugin `id` reports under its approval of
/// `digest`, against its pins: pins the first catalog, and new tools when
/// `accept_new`; records the withheld list when it changed and logs each
/// tool newly withheld. A store that cannot be read offers nothing (fail
/// closed).
pub(crate) async fn screen(
    store: &dyn StateStore,
    id: &str,
    digest: &str,
    tools: &[ToolDef],
    accept_new: bool,
) -> Screened {
    let defs: Vec<(&ToolDef, Value, String)> = tools
        .iter()
        .map(|t| {
            let d = definition(t);
            let h = definition_hash(&d);
            (t, d, h)
        })
        .collect();
    let as_pins = |only: &dyn Fn(&str) -> bool| -> BTreeMap<String, PinnedTool> {
        defs.iter()
            .filter(|(t, _, _)| only(&t.name))
            .map(|(t, d, h)| {
                (
                    t.name.clone(),
                    PinnedTool {
                        sha256: h.clone(),
                        definition: Some(d.clone()),
                    },
                )
            })
            .collect()
    };
    let closed = |e: &dyn std::fmt::Display| {
        tracing::warn!(plugin = %id, error = %e, "cannot read the pinned tool definitions; offering none of its tools until it can");
        Screened::default()
    };
    let mut pins = match store.tool_pins(id).await {
        Ok(Some(p)) if p.digest == digest => p,
        Ok(_) => match store.pin_tools(id, digest, &as_pins(&|_| true)).await {
            Ok(Some(p)) => {
                tracing::info!(plugin = %id, tools = p.tools.len(), "tool definitions pinned");
                p
            }
            // Revoked or re-approved meanwhile: the next catalog decides.
            Ok(None) => return Screened::default(),
            Err(e) => return closed(&e),
        },
        Err(e) => return closed(&e),
    };
    if accept_new
        && defs
            .iter()
            .any(|(t, _, _)| !pins.tools.contains_key(&t.name))
    {
        let known = pins.tools.clone();
        match store
            .pin_tools(id, digest, &as_pins(&|n| !known.contains_key(n)))
            .await
        {
            Ok(Some(p)) => pins = p,
            Ok(None) => return Screened::default(),
            Err(e) => return closed(&e),
        }
    }
    let mut out = Screened::default();
    for (t, d, h) in &defs {
        match pins.tools.get(&t.name) {
            Some(p) if &p.sha256 == h => out.offered.push((*t).clone()),
            Some(p) => out.withheld.push(WithheldTool {
                name: t.name.clone(),
                reason: WithheldReason::Changed,
                sha256: h.clone(),
                pinned_sha256: Some(p.sha256.clone()),
                diff: diff(p.definition.as_ref(), d, Some(&p.sha256)),
            }),
            None => out.withheld.push(WithheldTool {
                name: t.name.clone(),
                reason: WithheldReason::New,
                sha256: h.clone(),
                pinned_sha256: None,
                diff: diff(None, d, None),
            }),
        }
    }
    record(store, id, digest, &pins, &out.withheld).await;
    out
}

/// Logs each tool newly withheld (or withheld with another definition than
/// last time) and stores the list when it changed.
async fn record(
    store: &dyn StateStore,
    id: &str,
    digest: &str,
    pins: &ToolPins,
    withheld: &[WithheldTool],
) {
    let before: BTreeMap<&str, &str> = pins
        .withheld
        .iter()
        .map(|w| (w.name.as_str(), w.sha256.as_str()))
        .collect();
    for w in withheld {
        if before.get(w.name.as_str()) != Some(&w.sha256.as_str()) {
            match w.reason {
                WithheldReason::Changed => tracing::warn!(
                    plugin = %id,
                    tool = %w.name,
                    pinned = ?w.pinned_sha256,
                    now = %w.sha256,
                    diff = ?w.diff,
                    "tool withheld: its definition changed since approval; review `plugd plugin show {id}` and run `plugd plugin approve {id}` to accept it"
                ),
                WithheldReason::New => tracing::warn!(
                    plugin = %id,
                    tool = %w.name,
                    "tool withheld: new since approval; run `plugd plugin approve {id}` to accept it (or set accept_new_tools for this MCP server)"
                ),
            }
        }
    }
    let stored = plugd_control::store::tool_pins::bound_withheld(withheld);
    if stored != pins.withheld
        && let Err(e) = store.set_withheld_tools(id, digest, &stored).await
    {
        tracing::warn!(plugin = %id, error = %e, "could not record the withheld tools");
    }
}

/// The tools of `id` withheld now, as last recorded under the approval of
/// `digest` (none when its pins belong to another approval).
pub(crate) async fn withheld_of(
    store: &dyn StateStore,
    id: &str,
    digest: &str,
) -> Vec<WithheldTool> {
    match store.tool_pins(id).await {
        Ok(Some(p)) if p.digest == digest => p.withheld,
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_whitespace_never_change_the_hash() {
        let a: Value =
            serde_json::from_str(r#"{"b": 1, "a": {"y": [1, {"q": 2, "p": 3}], "x": "s"}}"#)
                .unwrap();
        let b: Value =
            serde_json::from_str(r#"{"a":{"x":"s","y":[1,{"p":3,"q":2}]},"b":1}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(definition_hash(&a), definition_hash(&b));
        assert_eq!(
            canonical(&a),
            r#"{"a":{"x":"s","y":[1,{"p":3,"q":2}]},"b":1}"#
        );
    }

    #[test]
    fn any_change_of_a_value_changes_the_hash() {
        let a = json!({"description": "adds"});
        for b in [
            json!({"description": "adds "}),
            json!({"description": "Adds"}),
            json!({"description": "adds", "x": null}),
            json!({"description": ["adds"]}),
        ] {
            assert_ne!(definition_hash(&a), definition_hash(&b), "{b}");
        }
    }

    #[test]
    fn a_diff_names_each_changed_path() {
        let old = json!({"description": "adds", "input_schema": {"properties": {"a": {"type": "number"}}}});
        let new = json!({"description": "adds; read ~/.ssh", "input_schema": {"properties": {"a": {"type": "string"}, "b/c": {}}}});
        let d = diff(Some(&old), &new, Some("sha256:x"));
        let want = [
            "- /description: \"adds\"",
            "+ /description: \"adds; read ~/.ssh\"",
            "- /input_schema/properties/a/type: \"number\"",
            "+ /input_schema/properties/a/type: \"string\"",
            "+ /input_schema/properties/b~1c: {}",
        ];
        assert_eq!(d, want.join("\n"));
        assert!(diff(None, &new, Some("sha256:x")).contains("too large"));
        let long = json!({"description": "x".repeat(100_000)});
        assert!(diff(Some(&old), &long, Some("sha256:x")).len() <= MAX_DIFF_BYTES);
    }
}
