//! Unknown manifest keys that could change containment or consent: a key named like a containment section (or a misspelling of one) is refused, never warned about.
//!
//! Most unknown keys are tolerated with a warning (a newer host may know
//! them). A key that *looks like* `sandbox`, `limits` or `permissions` is
//! different: `[plugin.sandbx] enabled = true` reads as a sandbox to its
//! author, and ignoring it runs the plugin with none. Such keys make the
//! manifest invalid.

use std::path::Path;

use crate::error::ManifestError;

/// Section names whose absence silently weakens containment or consent.
pub(crate) const CONTAINMENT_SECTIONS: &[&str] = &["sandbox", "limits", "permissions"];

/// The containment section `key` is (or is a misspelling of), if any: equal
/// ignoring case, `-`/`_`, or within a small edit distance (1 for names of
/// up to 6 letters, 2 above).
pub(crate) fn near_containment(key: &str) -> Option<&'static str> {
    let k: Vec<char> = key
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    CONTAINMENT_SECTIONS.iter().copied().find(|name| {
        let n: Vec<char> = name.chars().collect();
        let allowed = if n.len() > 6 { 2 } else { 1 };
        k.len().abs_diff(n.len()) <= allowed && distance(&k, &n) <= allowed
    })
}

/// The error for an unknown key `field` that looks like section `meant`.
pub(crate) fn refused(path: &Path, field: &str, key: &str, meant: &str) -> ManifestError {
    let what = if key.eq_ignore_ascii_case(meant) {
        format!("{key:?} is not a section plugd knows here")
    } else {
        format!("unknown key {key:?} looks like a misspelling of {meant:?}")
    };
    ManifestError::Invalid {
        path: path.to_path_buf(),
        field: field.to_owned(),
        message: format!(
            "{what}, which would change the plugin's containment or consent; plugd refuses it rather than run the plugin without it: fix the spelling or remove it"
        ),
    }
}

/// Levenshtein distance of `a` and `b`.
fn distance(a: &[char], b: &[char]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspellings_of_containment_sections_are_caught() {
        for k in [
            "sandbx",
            "sandbox",
            "Sandbox",
            "sand_box",
            "sanbox",
            "sandboxes",
            "limit",
            "limts",
            "limits",
            "permision",
            "permissions",
            "permissons",
            "Permissions",
        ] {
            assert!(near_containment(k).is_some(), "{k}");
        }
        for k in [
            "homepage",
            "author",
            "links",
            "license",
            "description",
            "timeout",
            "lints",
            "submissions",
            "keywords",
            "sandwich",
        ] {
            assert_eq!(near_containment(k), None, "{k}");
        }
    }
}
