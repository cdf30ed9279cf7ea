//! Provider-safe tool names: registry names mapped to `^[a-zA-Z0-9_-]{1,64}$` and back.
//!
//! Registry names may hold characters a provider refuses (`/`, `.`, spaces;
//! OpenAI accepts only `^[a-zA-Z0-9_-]{1,64}$`). Names already safe are kept
//! as they are; the others have every other character replaced by `_`, are
//! cut to fit, and get a `_2`, `_3`, … suffix when that collides. The result
//! depends only on the set of names, so the same tools always get the same
//! model-facing names.

use std::collections::{BTreeMap, BTreeSet};

/// Longest name a provider is given.
pub const MAX_NAME_LEN: usize = 64;

/// Whether `name` is acceptable to every provider as it is.
pub fn is_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The two-way mapping for one set of tools.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ToolNames {
    to_model: BTreeMap<String, String>,
    to_registry: BTreeMap<String, String>,
}

impl ToolNames {
    /// The mapping of `names` (registry names; order does not matter).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> ToolNames {
        let names: BTreeSet<&str> = names.into_iter().collect();
        let mut out = ToolNames::default();
        // Safe names first, so they never lose their name to a mapped one.
        for name in names.iter().filter(|n| is_safe(n)) {
            out.insert(name, name);
        }
        for name in names.iter().filter(|n| !is_safe(n)) {
            let base = crate::llm::provider_safe(name);
            let base = if base.is_empty() {
                "tool".to_owned()
            } else {
                base
            };
            let mut candidate = cut(&base, MAX_NAME_LEN);
            let mut n = 2u32;
            while out.to_registry.contains_key(&candidate) {
                let suffix = format!("_{n}");
                candidate = format!("{}{suffix}", cut(&base, MAX_NAME_LEN - suffix.len()));
                n += 1;
            }
            out.insert(name, &candidate);
        }
        out
    }

    fn insert(&mut self, registry: &str, model: &str) {
        self.to_model.insert(registry.to_owned(), model.to_owned());
        self.to_registry
            .insert(model.to_owned(), registry.to_owned());
    }

    /// The name the model sees for registry name `name` (itself when unknown).
    pub fn model_name(&self, name: &str) -> String {
        self.to_model
            .get(name)
            .cloned()
            .unwrap_or_else(|| name.to_owned())
    }

    /// The registry name of model-facing name `name` (itself when unknown).
    pub fn registry_name(&self, name: &str) -> String {
        self.to_registry
            .get(name)
            .cloned()
            .unwrap_or_else(|| name.to_owned())
    }
}

/// `s` cut to at most `max` bytes (all ASCII here).
fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_names_stay_and_unsafe_ones_map_uniquely_and_back() {
        let long = format!("p/{}", "x".repeat(80));
        let names = ToolNames::new([
            "hello_greet",
            "a/b",
            "a.b",
            "a_b",
            "with space",
            long.as_str(),
        ]);
        assert_eq!(names.model_name("hello_greet"), "hello_greet");
        assert_eq!(names.model_name("a_b"), "a_b");
        // "a.b" sorts before "a/b": deterministic suffixes.
        assert_eq!(names.model_name("a.b"), "a_b_2");
        assert_eq!(names.model_name("a/b"), "a_b_3");
        assert_eq!(names.model_name("with space"), "with_space");
        let mapped = names.model_name(&long);
        assert_eq!(mapped.len(), MAX_NAME_LEN);
        assert!(is_safe(&mapped));
        for n in ["hello_greet", "a/b", "a.b", "a_b", "with space", &long] {
            assert_eq!(names.registry_name(&names.model_name(n)), n);
        }
        assert_eq!(names.registry_name("unknown"), "unknown");
        // Same set, other order: the same mapping.
        let again = ToolNames::new([
            "with space",
            "a_b",
            "a/b",
            long.as_str(),
            "a.b",
            "hello_greet",
        ]);
        assert_eq!(again, names);
    }
}
