//! The marketplace catalog: curated entries that describe installable
//! packages before anyone binds them (seed 003 "Marketplace"), the signed
//! index document that carries them (format `plugd-marketplace/1`), its
//! canonical bytes and signed payload, and which entries a mode lets install.
//!
//! The catalog is separate from the installed inventory: an entry is a
//! promise by its curator (publisher, review state, signer, sources, an OCI
//! reference pinned by digest), and installing it pulls that digest and
//! binds its exports through the ordinary package and binding code.
//!
//! The document (docs/marketplace.md is the normative description):
//!
//! ```json
//! {
//!   "format": "plugd-marketplace/1",
//!   "index": {"name": "…", "entries": [ … ]},
//!   "signature": {"algorithm": "ed25519", "public_key": "<base64>",
//!                 "key_id": "<16 hex>", "signed_at": "<RFC 3339>",
//!                 "signature": "<base64 of 64 bytes>"}
//! }
//! ```
//!
//! The Ed25519 signature covers [`payload`]: the UTF-8 bytes of
//! `plugd-marketplace/1\ned25519\n<key_id>\n<signed_at>\nsha256:<hex>\n`,
//! where the hex is the SHA-256 of [`canonical_json`] of the `index` value
//! (object keys sorted by their UTF-8 bytes, no whitespace, integers only).
//! This crate holds the pure parts; the Ed25519 check and loading live in
//! `plugd-runtime::marketplace`.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::packages::Digest;

/// The `format` this plugd writes and reads.
pub const FORMAT: &str = "plugd-marketplace/1";

/// The only signature `algorithm`.
pub const ALGORITHM: &str = "ed25519";

/// Largest index document read: 1 MiB (a thousand entries fit).
pub const MAX_INDEX_BYTES: u64 = 1 << 20;

/// Most entries in one index.
pub const MAX_ENTRIES: usize = 1000;

/// The export kinds an entry may offer (seed 003's four).
pub const EXPORT_KINDS: [&str; 4] = ["harness", "tool", "hook", "compactor"];

/// The signed index document, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexDocument {
    /// Always [`FORMAT`].
    pub format: String,
    /// What is signed: the catalog.
    pub index: Value,
    /// The curator's signature (absent in a document not signed yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<IndexSignature>,
}

/// The `signature` object of an index document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexSignature {
    /// Always [`ALGORITHM`].
    pub algorithm: String,
    /// The signer's public key, standard base64 of its 32 bytes.
    pub public_key: String,
    /// The key's id (first 8 bytes of its SHA-256, hex).
    pub key_id: String,
    /// When it was signed (covered by the signature).
    pub signed_at: String,
    /// Standard base64 of the 64-byte Ed25519 signature over [`payload`].
    pub signature: String,
}

/// The catalog: what `index` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// The catalog's name, for people.
    pub name: String,
    /// Its entries, in the order they are shown.
    pub entries: Vec<Entry>,
}

/// Whether a curator reviewed an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Review {
    /// Reviewed by the catalog's curator.
    Reviewed,
    /// Listed, not reviewed.
    Unreviewed,
}

/// What an entry lets operators do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstallPolicy {
    /// A pinned artifact exists: it may be installed (mode permitting).
    Available,
    /// The contract is specified but no pinned signed artifact exists yet:
    /// shown, never installed.
    ContractReady,
}

/// One export an entry offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntryExport {
    /// `harness`, `tool`, `hook` or `compactor`.
    pub kind: String,
    /// The export id in the package.
    pub id: String,
}

/// One catalog entry (a marketplace card).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Its id in the catalog: `[a-z0-9][a-z0-9._-]{0,63}`.
    pub id: String,
    /// Its display name.
    pub name: String,
    /// Who publishes the package.
    pub publisher: String,
    /// One paragraph for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Whether the curator reviewed it.
    pub review: Review,
    /// Whether it may be installed at all.
    pub install_policy: InstallPolicy,
    /// The package, `oci://HOST[:PORT]/REPO[:TAG]@sha256:…` (required, and
    /// pinned by digest, for an available entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<String>,
    /// The key id the package's `marketplace.signature.json` must carry
    /// (absent: the entry declares no signed artifact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
    /// Where its source, release notes or adapter contract live (URLs or
    /// repository paths), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    /// The adapter contract it implements (for a contract-ready entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract: Option<String>,
    /// The exports installing it binds.
    pub exports: Vec<EntryExport>,
}

impl Entry {
    /// The digest the OCI reference pins, if any.
    pub fn pinned_digest(&self) -> Option<Digest> {
        let oci = self.oci.as_deref()?;
        let (_, d) = oci.rsplit_once('@')?;
        Digest::parse(d).ok()
    }
}

/// How strictly the marketplace treats signatures (`marketplace.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Only reviewed entries whose package carries a trusted Ed25519
    /// signature install (the seed's production imports). The default.
    #[default]
    Production,
    /// Unreviewed and unsigned entries install too; a signature that is
    /// present must still verify.
    Development,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Production => "production",
            Mode::Development => "development",
        })
    }
}

/// Whether an entry may be installed, decided from the catalog alone (the
/// package's own signature is checked again when it is pulled).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Installability {
    /// An install pulls it.
    Installable,
    /// A contract-ready entry: shown with its contract and sources.
    ContractReady {
        /// Why it is not installable.
        reason: String,
    },
    /// The mode refuses it.
    Refused {
        /// Why, and what would change it.
        reason: String,
    },
}

impl Installability {
    /// The reason it is not installable, if it is not.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Installability::Installable => None,
            Installability::ContractReady { reason } | Installability::Refused { reason } => {
                Some(reason)
            }
        }
    }
}

/// Whether `entry` may be installed in `mode`; `trusted(key_id)` names the
/// trusted publisher holding a key.
pub fn installability(
    entry: &Entry,
    mode: Mode,
    trusted: &dyn Fn(&str) -> Option<String>,
) -> Installability {
    if entry.install_policy == InstallPolicy::ContractReady {
        let mut reason =
            "contract-ready, not installable: no pinned signed artifact is published yet"
                .to_owned();
        if let Some(c) = &entry.contract {
            let _ = write!(reason, "; adapter contract: {c}");
        }
        if !entry.sources.is_empty() {
            let _ = write!(reason, "; sources: {}", entry.sources.join(", "));
        }
        return Installability::ContractReady { reason };
    }
    if mode == Mode::Development {
        return Installability::Installable;
    }
    if entry.review != Review::Reviewed {
        return Installability::Refused {
            reason: "production mode installs only reviewed entries and this one is unreviewed; review it, or set marketplace.mode: development".into(),
        };
    }
    match &entry.signed_by {
        None => Installability::Refused {
            reason: "production mode installs only packages with a trusted Ed25519 signature and this entry declares none (no signed_by); publish a signed release, or set marketplace.mode: development".into(),
        },
        Some(k) if trusted(k).is_none() => Installability::Refused {
            reason: format!(
                "production mode installs only packages signed by a trusted key and key {k} is not in plugd.yaml trusted_publishers; add its publisher there if you trust it"
            ),
        },
        Some(_) => Installability::Installable,
    }
}

/// [`canonical_json`] failed: the value holds something the canonical form
/// does not (a fractional or huge number).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct NotCanonical {
    /// JSON Pointer of the value.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// The canonical bytes of `v`: objects with their keys sorted by UTF-8
/// bytes, no insignificant whitespace, strings escaped as serde_json does,
/// integers only.
pub fn canonical_json(v: &Value) -> Result<String, NotCanonical> {
    let mut out = String::new();
    write_canonical(v, "", &mut out)?;
    Ok(out)
}

fn write_canonical(v: &Value, path: &str, out: &mut String) -> Result<(), NotCanonical> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if n.is_i64() || n.is_u64() {
                out.push_str(&n.to_string());
            } else {
                return Err(NotCanonical {
                    path: path.to_owned(),
                    message: format!("{n} is not an integer; an index holds integers only"),
                });
            }
        }
        Value::String(s) => out.push_str(&Value::String(s.clone()).to_string()),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, &format!("{path}/{i}"), out)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                let child = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
                write_canonical(&map[k], &child, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// `sha256:<hex>` of the canonical bytes of `index`.
pub fn index_digest(index: &Value) -> Result<String, NotCanonical> {
    let c = canonical_json(index)?;
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(c.as_bytes()))
    ))
}

/// The bytes the index signature covers.
pub fn payload(key_id: &str, signed_at: &str, digest: &str) -> Vec<u8> {
    format!("{FORMAT}\n{ALGORITHM}\n{key_id}\n{signed_at}\n{digest}\n").into_bytes()
}

/// Whether `id` is an entry id.
fn entry_id_ok(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
}

/// Reads the catalog out of a (verified) `index` value and checks it: entry
/// ids well-formed and unique, export kinds known, an available entry pinned
/// to an `oci://` reference by digest and offering at least one export.
/// The error names the entry.
pub fn parse_catalog(index: &Value) -> Result<Catalog, String> {
    let catalog: Catalog = serde_json::from_value(index.clone())
        .map_err(|e| format!("index: not a {FORMAT} catalog: {e}"))?;
    if catalog.entries.len() > MAX_ENTRIES {
        return Err(format!(
            "index: {} entries, over the limit of {MAX_ENTRIES}",
            catalog.entries.len()
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, e) in catalog.entries.iter().enumerate() {
        let at = format!("index.entries[{i}] ({:?})", e.id);
        if !entry_id_ok(&e.id) {
            return Err(format!(
                "{at}: the id is not [a-z0-9][a-z0-9._-]{{0,63}}; rename the entry"
            ));
        }
        if !seen.insert(e.id.as_str()) {
            return Err(format!("{at}: the id repeats an earlier entry's"));
        }
        for x in &e.exports {
            if !EXPORT_KINDS.contains(&x.kind.as_str()) {
                return Err(format!(
                    "{at}: export {:?} has kind {:?}; use one of {}",
                    x.id,
                    x.kind,
                    EXPORT_KINDS.join(", ")
                ));
            }
            if x.id.is_empty() {
                return Err(format!("{at}: an export has an empty id"));
            }
        }
        if let Some(k) = &e.signed_by
            && !(k.len() == 16 && k.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(format!(
                "{at}: signed_by {k:?} is not a key id (16 hex digits, as `plugd plugin keygen` prints)"
            ));
        }
        if let Some(oci) = &e.oci
            && !oci.starts_with("oci://")
        {
            return Err(format!(
                "{at}: oci {oci:?} does not start with oci://; write oci://HOST[:PORT]/REPO@sha256:DIGEST"
            ));
        }
        if e.install_policy == InstallPolicy::Available {
            if e.pinned_digest().is_none() {
                return Err(format!(
                    "{at}: an available entry needs an oci reference pinned by digest (oci://HOST/REPO@sha256:…); pin it, or mark the entry contract_ready"
                ));
            }
            if e.exports.is_empty() {
                return Err(format!(
                    "{at}: an available entry must list the exports installing it binds"
                ));
            }
        }
    }
    Ok(catalog)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry() -> Value {
        json!({
            "id": "thread-weave",
            "name": "Thread Weave Compactor",
            "publisher": "Rhone",
            "review": "reviewed",
            "install_policy": "available",
            "oci": format!("oci://127.0.0.1:5000/rhone/weave@sha256:{}", "ab".repeat(32)),
            "signed_by": "0123456789abcdef",
            "exports": [{"kind": "compactor", "id": "thread_weave"}],
        })
    }

    #[test]
    fn canonical_json_sorts_keys_by_bytes_and_drops_whitespace() {
        let a: Value =
            serde_json::from_str(r#"{ "b": [1, {"z": true, "a": null}], "a": "é\n", "B": 2 }"#)
                .unwrap();
        assert_eq!(
            canonical_json(&a).unwrap(),
            r#"{"B":2,"a":"é\n","b":[1,{"a":null,"z":true}]}"#
        );
        let err = canonical_json(&json!({"x": [1.5]})).unwrap_err();
        assert_eq!(err.path, "/x/0");
        // Stable across releases: this value is part of every index signature.
        assert_eq!(
            index_digest(&json!({"name": "n", "entries": []})).unwrap(),
            format!(
                "sha256:{}",
                hex::encode(Sha256::digest(br#"{"entries":[],"name":"n"}"#))
            )
        );
        assert_eq!(
            String::from_utf8(payload("00ff", "t", "sha256:ab")).unwrap(),
            "plugd-marketplace/1\ned25519\n00ff\nt\nsha256:ab\n"
        );
    }

    #[test]
    fn a_catalog_is_checked_entry_by_entry_naming_the_entry() {
        let ok = parse_catalog(&json!({"name": "c", "entries": [entry()]})).unwrap();
        assert_eq!(
            ok.entries[0].pinned_digest().unwrap().hex(),
            "ab".repeat(32)
        );
        let bad = |f: &dyn Fn(&mut Value), want: &str| {
            let mut e = entry();
            f(&mut e);
            let err = parse_catalog(&json!({"name": "c", "entries": [e]})).unwrap_err();
            assert!(err.contains(want), "{err}");
        };
        bad(&|e| e["id"] = json!("Bad Id"), "the id is not");
        bad(
            &|e| e["oci"] = json!("oci://127.0.0.1:5000/rhone/weave:1.0"),
            "pinned by digest",
        );
        bad(
            &|e| e["exports"][0]["kind"] = json!("widget"),
            "has kind \"widget\"",
        );
        bad(&|e| e["signed_by"] = json!("nope"), "is not a key id");
        bad(&|e| e["review"] = json!("maybe"), "unknown variant");
        bad(&|e| e["surprise"] = json!(1), "unknown field `surprise`");
        let err = parse_catalog(&json!({"name": "c", "entries": [entry(), entry()]})).unwrap_err();
        assert!(err.contains("repeats"), "{err}");
        // A contract-ready entry needs no artifact.
        let mut e = entry();
        e["install_policy"] = json!("contract_ready");
        e.as_object_mut().unwrap().remove("oci");
        parse_catalog(&json!({"name": "c", "entries": [e]})).unwrap();
    }

    #[test]
    fn production_installs_only_reviewed_entries_signed_by_a_trusted_key() {
        let trusted = |k: &str| (k == "0123456789abcdef").then(|| "rhone".to_owned());
        let none = |_: &str| None;
        let base: Entry = serde_json::from_value(entry()).unwrap();
        assert_eq!(
            installability(&base, Mode::Production, &trusted),
            Installability::Installable
        );
        let r = installability(&base, Mode::Production, &none);
        assert!(
            r.reason()
                .unwrap()
                .contains("not in plugd.yaml trusted_publishers"),
            "{r:?}"
        );
        let unsigned = Entry {
            signed_by: None,
            ..base.clone()
        };
        let r = installability(&unsigned, Mode::Production, &trusted);
        assert!(r.reason().unwrap().contains("declares none"), "{r:?}");
        assert_eq!(
            installability(&unsigned, Mode::Development, &none),
            Installability::Installable
        );
        let unreviewed = Entry {
            review: Review::Unreviewed,
            ..base.clone()
        };
        assert!(matches!(
            installability(&unreviewed, Mode::Production, &trusted),
            Installability::Refused { .. }
        ));
        let contract = Entry {
            install_policy: InstallPolicy::ContractReady,
            contract: Some("vai.harness.v1".into()),
            sources: vec!["https://example.com/codex".into()],
            ..base
        };
        for mode in [Mode::Production, Mode::Development] {
            let r = installability(&contract, mode, &trusted);
            let why = r.reason().unwrap();
            assert!(
                why.starts_with("contract-ready, not installable")
                    && why.contains("vai.harness.v1")
                    && why.contains("https://example.com/codex"),
                "{why}"
            );
        }
    }
}
