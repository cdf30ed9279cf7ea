//! plugd tool names as MCP tool names: stable, reversible where it can be,
//! never two plugd tools under one MCP name.
//!
//! MCP (2025-11-25) allows `[A-Za-z0-9_.-]{1,128}`, but the LLM APIs most
//! MCP clients hand tools to accept only `[A-Za-z0-9_-]{1,64}`, so plugd
//! gives every tool a name of that shape. plugd's registry names are
//! `plugin_tool` (native, microapp), `plugin/tool` (Salmex, VAI, MCP
//! servers) or anything a plugin chose within its namespace. Three classes,
//! told apart by runs of `_`, so no name of one class can equal a name of
//! another:
//!
//! | class | registry name | MCP name |
//! |---|---|---|
//! | A | `[A-Za-z0-9_-]{1,64}` without `__` | the same |
//! | B | A's characters plus `/`, no `__`, no `/` at either end or next to `_` or `/`, ≤ 64 once mapped | each `/` as `__` (`everything/echo` → `everything__echo`) |
//! | C | anything else | the name with every other character as `_`, cut to 45, then `___` and 16 hex digits of its SHA-256 |
//!
//! A has no `__`, every B name has `__` but never `___`, every C name has
//! `___`: the classes are disjoint. A and B map back without a table; C
//! needs one ([`NameTable`]), and a C collision (two names with the same
//! 64-bit hash prefix and sanitized form, only reachable on purpose) makes
//! the table withhold both rather than route a call to the wrong tool.
//! The mapping depends on the name alone, so it is stable across restarts
//! and does not change when other plugins come and go.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

/// Longest MCP name plugd produces.
pub const MAX_NAME: usize = 64;

/// Hex digits of the hash in a class C name.
const HASH_DIGITS: usize = 16;

fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// The MCP name of plugd tool `name` (see the module docs).
pub fn mcp_name(name: &str) -> String {
    if !name.is_empty() && name.len() <= MAX_NAME && name.chars().all(plain) && !name.contains("__")
    {
        return name.to_owned();
    }
    if let Some(b) = class_b(name) {
        return b;
    }
    let mut out: String = name
        .chars()
        .map(|c| if plain(c) { c } else { '_' })
        .take(MAX_NAME - 3 - HASH_DIGITS)
        .collect();
    let digest = Sha256::digest(name.as_bytes());
    out.push_str("___");
    out.push_str(&hex::encode(digest)[..HASH_DIGITS]);
    out
}

fn class_b(name: &str) -> Option<String> {
    let ok = name.contains('/')
        && name.chars().all(|c| plain(c) || c == '/')
        && !name.contains("__")
        && !name.contains("//")
        && !name.contains("_/")
        && !name.contains("/_")
        && !name.starts_with('/')
        && !name.ends_with('/');
    let mapped = name.replace('/', "__");
    (ok && mapped.len() <= MAX_NAME).then_some(mapped)
}

/// The plugd name an MCP name of class A or B stands for, without a table;
/// `None` for class C. The caller must check that the candidate exists and
/// maps back to `mcp` ([`mcp_name`]): a client can send any string.
pub fn registry_name_hint(mcp: &str) -> Option<String> {
    if mcp.contains("___") {
        None
    } else {
        Some(mcp.replace("__", "/"))
    }
}

/// MCP name → plugd name for one set of tools, built with [`NameTable::new`].
#[derive(Debug, Default, Clone)]
pub struct NameTable {
    by_mcp: HashMap<String, String>,
    /// Pairs of plugd names that met on one MCP name (both withheld).
    collisions: Vec<(String, String)>,
}

impl NameTable {
    /// The table of `names` (plugd registry names, each once).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> NameTable {
        let mut by_mcp: HashMap<String, String> = HashMap::new();
        let mut withheld: HashMap<String, String> = HashMap::new();
        let mut collisions = Vec::new();
        for name in names {
            let m = mcp_name(name);
            if let Some(first) = withheld.get(&m) {
                collisions.push((first.clone(), name.to_owned()));
                continue;
            }
            match by_mcp.remove(&m) {
                Some(first) => {
                    collisions.push((first.clone(), name.to_owned()));
                    withheld.insert(m, first);
                }
                None => {
                    by_mcp.insert(m, name.to_owned());
                }
            }
        }
        NameTable { by_mcp, collisions }
    }

    /// The plugd name behind MCP name `mcp`.
    pub fn resolve(&self, mcp: &str) -> Option<&str> {
        self.by_mcp.get(mcp).map(String::as_str)
    }

    /// Whether plugd tool `name` is served (not withheld by a collision).
    pub fn serves(&self, name: &str) -> bool {
        self.resolve(&mcp_name(name)) == Some(name)
    }

    /// The pairs that met on one MCP name.
    pub fn collisions(&self) -> &[(String, String)] {
        &self.collisions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn valid(m: &str) -> bool {
        !m.is_empty() && m.len() <= MAX_NAME && m.chars().all(plain)
    }

    #[test]
    fn common_names_read_well() {
        assert_eq!(mcp_name("hello_python_greet"), "hello_python_greet");
        assert_eq!(mcp_name("everything/echo"), "everything__echo");
        assert_eq!(mcp_name("acme/devkit/lint"), "acme__devkit__lint");
        assert_eq!(
            mcp_name("hello-salmex-bash/greet"),
            "hello-salmex-bash__greet"
        );
        for odd in [
            "a__b",
            "a/_b",
            "x.y/z",
            "a//b",
            "/a",
            "",
            "ü",
            &"n".repeat(65),
        ] {
            let m = mcp_name(odd);
            assert!(valid(&m) && m.contains("___"), "{odd:?} -> {m:?}");
        }
        assert_eq!(
            registry_name_hint("everything__echo").as_deref(),
            Some("everything/echo")
        );
        assert_eq!(registry_name_hint("plain"), Some("plain".into()));
        assert_eq!(registry_name_hint(&mcp_name("a__b")), None);
    }

    #[test]
    fn a_deliberate_collision_withholds_both() {
        // A class A name cannot equal a class B name: `a__b` is not class A.
        let t = NameTable::new(["a/b", "a__b", "c"]);
        assert_eq!(t.resolve("a__b"), Some("a/b"));
        assert!(t.serves("a__b") && t.serves("a/b") && t.serves("c"));
        assert!(t.collisions().is_empty());
        // Two registry names with one MCP name never exist by accident; a
        // table given the same name twice withholds it.
        let t = NameTable::new(["x", "x", "x"]);
        assert_eq!(t.resolve("x"), None);
        assert_eq!(t.collisions().len(), 2);
    }

    proptest! {
        #[test]
        fn names_are_valid_and_distinct(a in "[a-z_/.-]{1,70}", b in "[a-z_/.-]{1,70}") {
            let (ma, mb) = (mcp_name(&a), mcp_name(&b));
            prop_assert!(valid(&ma));
            if a != b {
                prop_assert_ne!(&ma, &mb);
            }
            if let Some(hint) = registry_name_hint(&ma) {
                prop_assert_eq!(hint, a);
            }
        }
    }
}
