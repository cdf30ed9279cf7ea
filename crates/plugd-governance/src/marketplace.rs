//! The marketplace index: `marketplace:` in plugd.yaml (where the signed
//! index lives and the mode), reading it from a file or an HTTPS URL within
//! bounds, verifying its Ed25519 signature against `trusted_publishers`,
//! and signing one (`plugd marketplace sign`).
//!
//! The document and its canonical bytes are `plugd_control::marketplace`'s;
//! keys are [`crate::signing::keys`]'s, the same as plugin signatures'.
//! An index is read afresh on every use (it is small and may be replaced
//! at any time); one that fails any check is refused whole, naming why.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signature, Signer, SigningKey};
use plugd_control::marketplace::{
    ALGORITHM, Catalog, FORMAT, IndexDocument, IndexSignature, MAX_INDEX_BYTES, Mode, index_digest,
    parse_catalog, payload,
};
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use crate::plugd_yaml::ConfigError;
use crate::signing::{SigningPolicy, keys};

/// The longest fetching an index over HTTP(S) may take: 10 s.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the index lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexSource {
    /// A file (relative paths are below the workspace).
    File(PathBuf),
    /// An `https://` URL (or `http://` on loopback).
    Url(String),
}

impl std::fmt::Display for IndexSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexSource::File(p) => write!(f, "{}", p.display()),
            IndexSource::Url(u) => f.write_str(u),
        }
    }
}

/// `marketplace:` in plugd.yaml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MarketplaceConfig {
    /// `index`: the signed index document.
    pub index: IndexSource,
    /// `mode`: `production` (default) or `development`.
    pub mode: Mode,
}

/// `marketplace:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMarketplace {
    index: String,
    #[serde(default)]
    mode: Option<Mode>,
}

/// Reads `marketplace:` (`path` names plugd.yaml in errors).
pub fn parse_config(
    raw: Spanned<RawMarketplace>,
    path: &Path,
    workspace: &Path,
) -> Result<MarketplaceConfig, ConfigError> {
    let line = raw.referenced.line();
    let invalid = |message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field: "marketplace.index".into(),
        line,
        message,
    };
    let text = raw.value.index.trim();
    let index = source(text, workspace).map_err(invalid)?;
    Ok(MarketplaceConfig {
        index,
        mode: raw.value.mode.unwrap_or_default(),
    })
}

/// `text` as an index source: an `https://` URL, an `http://` URL on
/// loopback, or a path (relative to `workspace`).
pub fn source(text: &str, workspace: &Path) -> Result<IndexSource, String> {
    if text.is_empty() {
        return Err("is empty; give the signed index's path or https:// URL".into());
    }
    if let Some(rest) = text.strip_prefix("http://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(v6),
            None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
        };
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return Err(format!(
                "{text:?} is plain http to a host that is not loopback; an index is fetched over https:// (plain http only on 127.0.0.1, [::1] or localhost)"
            ));
        }
        return Ok(IndexSource::Url(text.to_owned()));
    }
    if text.starts_with("https://") {
        return Ok(IndexSource::Url(text.to_owned()));
    }
    if text.contains("://") {
        return Err(format!(
            "{text:?} has a scheme plugd does not fetch; use https://, or a file path"
        ));
    }
    Ok(IndexSource::File(workspace.join(text)))
}

/// Why an index was refused.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// No `marketplace:` in plugd.yaml.
    #[error(
        "no marketplace is configured; set marketplace: {{index: FILE-or-https-URL}} in plugd.yaml"
    )]
    NotConfigured,
    /// The file or URL could not be read.
    #[error("marketplace index {location}: cannot read it: {reason}")]
    Read {
        /// Where.
        location: String,
        /// Why.
        reason: String,
    },
    /// Over [`MAX_INDEX_BYTES`].
    #[error(
        "marketplace index {location}: it is over the {MAX_INDEX_BYTES}-byte limit; split the catalog or shorten its entries"
    )]
    TooLarge {
        /// Where.
        location: String,
    },
    /// Not a well-formed, signed `plugd-marketplace/1` document.
    #[error("marketplace index {location}: {message}")]
    Malformed {
        /// Where.
        location: String,
        /// What is wrong, naming the field or entry.
        message: String,
    },
    /// The signature does not verify: the document was altered after
    /// signing, or signed by another key.
    #[error(
        "marketplace index {location}: its signature does not verify with its public_key (key {key_id}): the index was altered after it was signed, or signed by another key; refusing the whole index"
    )]
    BadSignature {
        /// Where.
        location: String,
        /// The key id it claims.
        key_id: String,
    },
    /// A good signature by a key `trusted_publishers` does not list.
    #[error(
        "marketplace index {location}: it is signed by key {key_id}, which is not in plugd.yaml trusted_publishers; refusing the whole index (if you trust its curator, add {{name: NAME, public_key: \"{public_key}\"}} there)"
    )]
    UntrustedKey {
        /// Where.
        location: String,
        /// The key id.
        key_id: String,
        /// The key.
        public_key: String,
    },
}

/// A verified index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoadedIndex {
    /// Where it was read.
    pub source: String,
    /// The marketplace mode.
    pub mode: Mode,
    /// The catalog.
    pub catalog: Catalog,
    /// Who signed it: the trusted publisher's name.
    pub signed_by: String,
    /// The signing key's id.
    pub key_id: String,
    /// When it was signed.
    pub signed_at: String,
}

/// Reads the index `source` within [`MAX_INDEX_BYTES`] and [`FETCH_TIMEOUT`].
pub async fn fetch(source: &IndexSource) -> Result<Vec<u8>, IndexError> {
    let shown = source.to_string();
    let read = |reason: String| IndexError::Read {
        location: shown.clone(),
        reason,
    };
    let too_large = || IndexError::TooLarge {
        location: shown.clone(),
    };
    match source {
        IndexSource::File(path) => {
            let path = path.clone();
            let bytes = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
                let file = std::fs::File::open(&path)?;
                if !file.metadata()?.is_file() {
                    return Err(std::io::Error::other("not a regular file"));
                }
                let mut bytes = Vec::new();
                file.take(MAX_INDEX_BYTES + 1).read_to_end(&mut bytes)?;
                Ok(bytes)
            })
            .await
            .map_err(|e| read(e.to_string()))?
            .map_err(|e| read(e.to_string()))?;
            if bytes.len() as u64 > MAX_INDEX_BYTES {
                return Err(too_large());
            }
            Ok(bytes)
        }
        IndexSource::Url(url) => {
            let get = async {
                let _ = rustls::crypto::ring::default_provider().install_default();
                let client = reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| read(format!("http client: {e}")))?;
                let mut resp = client
                    .get(url)
                    .send()
                    .await
                    .map_err(|e| read(error_chain(&e)))?;
                if !resp.status().is_success() {
                    return Err(read(format!("the server answered {}", resp.status())));
                }
                if resp.content_length().is_some_and(|n| n > MAX_INDEX_BYTES) {
                    return Err(too_large());
                }
                let mut bytes = Vec::new();
                while let Some(chunk) = resp.chunk().await.map_err(|e| read(error_chain(&e)))? {
                    bytes.extend_from_slice(&chunk);
                    if bytes.len() as u64 > MAX_INDEX_BYTES {
                        return Err(too_large());
                    }
                }
                Ok(bytes)
            };
            tokio::time::timeout(FETCH_TIMEOUT, get)
                .await
                .unwrap_or_else(|_| {
                    Err(read(format!(
                        "no complete answer within {} s",
                        FETCH_TIMEOUT.as_secs()
                    )))
                })
        }
    }
}

/// Verifies the index document `bytes` (read from `source`) against
/// `policy`: format, signature fields, the Ed25519 signature over the
/// canonical bytes, the signer in `trusted_publishers`, then every entry.
pub fn verify(
    bytes: &[u8],
    source: &str,
    policy: &SigningPolicy,
    mode: Mode,
) -> Result<LoadedIndex, IndexError> {
    let malformed = |message: String| IndexError::Malformed {
        location: source.to_owned(),
        message,
    };
    let doc: IndexDocument = serde_json::from_slice(bytes)
        .map_err(|e| malformed(format!("not a {FORMAT} document: {e}")))?;
    if doc.format != FORMAT {
        return Err(malformed(format!(
            "format: {:?} is not supported; this plugd reads {FORMAT:?}",
            doc.format
        )));
    }
    let Some(sig) = &doc.signature else {
        return Err(malformed(
            "it is not signed (no signature); sign it with `plugd marketplace sign INDEX --key KEY`"
                .into(),
        ));
    };
    if sig.algorithm != ALGORITHM {
        return Err(malformed(format!(
            "signature.algorithm: {:?} is not supported; only {ALGORITHM:?}",
            sig.algorithm
        )));
    }
    let public = keys::decode_public_key(&sig.public_key)
        .map_err(|e| malformed(format!("signature.public_key: {e}")))?;
    let key_id = keys::key_id(&public);
    if sig.key_id != key_id {
        return Err(malformed(format!(
            "signature.key_id: {:?} is not the id of its public_key ({key_id:?})",
            sig.key_id
        )));
    }
    if sig.signed_at.is_empty()
        || sig.signed_at.len() > 64
        || sig.signed_at.chars().any(char::is_control)
    {
        return Err(malformed(format!(
            "signature.signed_at: {:?} is not a timestamp",
            sig.signed_at
        )));
    }
    let raw = B64
        .decode(&sig.signature)
        .map_err(|e| malformed(format!("signature.signature: not standard base64 ({e})")))?;
    let raw: [u8; 64] = raw.as_slice().try_into().map_err(|_| {
        malformed(format!(
            "signature.signature: decodes to {} bytes; an Ed25519 signature is 64 bytes",
            raw.len()
        ))
    })?;
    let digest = index_digest(&doc.index).map_err(|e| malformed(format!("index{e}")))?;
    if public
        .verify_strict(
            &payload(&sig.key_id, &sig.signed_at, &digest),
            &Signature::from_bytes(&raw),
        )
        .is_err()
    {
        return Err(IndexError::BadSignature {
            location: source.to_owned(),
            key_id,
        });
    }
    let Some(publisher) = policy.publisher(&key_id) else {
        return Err(IndexError::UntrustedKey {
            location: source.to_owned(),
            key_id,
            public_key: keys::public_key_string(&public),
        });
    };
    let catalog = parse_catalog(&doc.index).map_err(malformed)?;
    Ok(LoadedIndex {
        source: source.to_owned(),
        mode,
        catalog,
        signed_by: publisher.name.clone(),
        key_id,
        signed_at: sig.signed_at.clone(),
    })
}

/// Reads and verifies the configured index (`None`: not configured).
pub async fn load(
    config: Option<&MarketplaceConfig>,
    policy: &SigningPolicy,
) -> Result<LoadedIndex, IndexError> {
    let config = config.ok_or(IndexError::NotConfigured)?;
    let bytes = fetch(&config.index).await?;
    verify(&bytes, &config.index.to_string(), policy, config.mode)
}

/// Signs the index document `bytes` (a `plugd-marketplace/1` document with
/// or without a signature; one present is replaced) with `key` at
/// `signed_at`, after checking every entry. Returns the signed document.
pub fn sign(bytes: &[u8], key: &SigningKey, signed_at: &str) -> Result<IndexDocument, String> {
    let mut doc: IndexDocument = serde_json::from_slice(bytes)
        .map_err(|e| format!("not a {FORMAT} document ({{\"format\", \"index\"}}): {e}"))?;
    if doc.format != FORMAT {
        return Err(format!(
            "format: {:?} is not supported; write {FORMAT:?}",
            doc.format
        ));
    }
    parse_catalog(&doc.index)?;
    let digest = index_digest(&doc.index).map_err(|e| format!("index{e}"))?;
    let public = key.verifying_key();
    let key_id = keys::key_id(&public);
    let signature = key.sign(&payload(&key_id, signed_at, &digest));
    doc.signature = Some(IndexSignature {
        algorithm: ALGORITHM.to_owned(),
        public_key: B64.encode(public.as_bytes()),
        key_id,
        signed_at: signed_at.to_owned(),
        signature: B64.encode(signature.to_bytes()),
    });
    Ok(doc)
}

/// `e` and its sources, joined by `: ` (reqwest's own message names
/// neither the refused connection nor the TLS failure).
fn error_chain(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::TrustedPublisher;
    use serde_json::json;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn trusting(k: &SigningKey) -> SigningPolicy {
        let public = k.verifying_key();
        SigningPolicy {
            require_signatures: false,
            trusted_publishers: vec![TrustedPublisher {
                name: "curator".into(),
                public_key: keys::public_key_string(&public),
                key_id: keys::key_id(&public),
            }],
        }
    }

    fn unsigned() -> Vec<u8> {
        json!({
            "format": FORMAT,
            "index": {"name": "test", "entries": [{
                "id": "weave",
                "name": "Thread Weave",
                "publisher": "Rhone",
                "review": "reviewed",
                "install_policy": "available",
                "oci": format!("oci://127.0.0.1:5000/r/w@sha256:{}", "ab".repeat(32)),
                "exports": [{"kind": "compactor", "id": "thread_weave"}],
            }]},
        })
        .to_string()
        .into_bytes()
    }

    fn signed(k: &SigningKey) -> Vec<u8> {
        serde_json::to_vec_pretty(&sign(&unsigned(), k, "2026-01-02T03:04:05Z").unwrap()).unwrap()
    }

    #[test]
    fn a_signed_index_verifies_whatever_its_whitespace_and_key_order() {
        let k = key(3);
        let bytes = signed(&k);
        let ok = verify(&bytes, "x", &trusting(&k), Mode::Production).unwrap();
        assert_eq!(ok.catalog.entries[0].id, "weave");
        assert_eq!(ok.signed_by, "curator");
        // Re-serialized compactly with keys in another order: same canonical bytes.
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let compact = serde_json::to_vec(&v).unwrap();
        verify(&compact, "x", &trusting(&k), Mode::Production).unwrap();
    }

    #[test]
    fn a_changed_value_an_untrusted_key_and_a_missing_signature_are_refused() {
        let k = key(3);
        let text = String::from_utf8(signed(&k)).unwrap();
        let tampered = text.replacen("Thread Weave", "Thread Wea e", 1);
        assert_eq!(tampered.len(), text.len());
        let err = verify(
            tampered.as_bytes(),
            "idx.json",
            &trusting(&k),
            Mode::Development,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("idx.json") && err.contains("does not verify"),
            "{err}"
        );

        let err = verify(
            text.as_bytes(),
            "idx.json",
            &trusting(&key(4)),
            Mode::Development,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("not in plugd.yaml trusted_publishers"),
            "{err}"
        );

        let err = verify(&unsigned(), "idx.json", &trusting(&k), Mode::Development)
            .unwrap_err()
            .to_string();
        assert!(err.contains("it is not signed"), "{err}");

        // A signature swapped in from another key's signing of the same index.
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let other: serde_json::Value = serde_json::from_slice(&signed(&key(5))).unwrap();
        v["signature"]["signature"] = other["signature"]["signature"].clone();
        let err = verify(
            v.to_string().as_bytes(),
            "i",
            &trusting(&k),
            Mode::Production,
        )
        .unwrap_err();
        assert!(matches!(err, IndexError::BadSignature { .. }), "{err}");
    }

    #[test]
    fn signing_refuses_a_bad_catalog_and_sources_refuse_plain_http_off_loopback() {
        let mut v: serde_json::Value = serde_json::from_slice(&unsigned()).unwrap();
        v["index"]["entries"][0]["oci"] = json!("oci://127.0.0.1:5000/r/w:1.0");
        let err = sign(v.to_string().as_bytes(), &key(1), "t").unwrap_err();
        assert!(err.contains("pinned by digest"), "{err}");

        let ws = Path::new("/ws");
        assert_eq!(
            source("idx.json", ws).unwrap(),
            IndexSource::File("/ws/idx.json".into())
        );
        assert!(matches!(
            source("https://example.com/i.json", ws).unwrap(),
            IndexSource::Url(_)
        ));
        for ok in [
            "http://127.0.0.1:8080/i",
            "http://localhost/i",
            "http://[::1]:9/i",
        ] {
            assert!(
                matches!(source(ok, ws).unwrap(), IndexSource::Url(_)),
                "{ok}"
            );
        }
        for bad in [
            "http://example.com/i",
            "http://127.0.0.1.evil.com/i",
            "ftp://x/i",
            "",
        ] {
            assert!(source(bad, ws).is_err(), "{bad}");
        }
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn verify_never_panics_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let _ = verify(&bytes, "x", &SigningPolicy::default(), Mode::Production);
            }

            /// Any one field of a signed entry, or of the signature,
            /// replaced by any JSON value: refused unless the value is the
            /// same; never a panic.
            #[test]
            fn a_mutated_field_is_refused(
                at in proptest::sample::select(vec![
                    "/index/name", "/index/entries/0/id", "/index/entries/0/oci",
                    "/index/entries/0/review", "/index/entries/0/exports",
                    "/signature/key_id", "/signature/signed_at", "/signature/public_key",
                    "/signature/signature", "/format",
                ]),
                value in prop_oneof![
                    any::<i64>().prop_map(serde_json::Value::from),
                    ".{0,40}".prop_map(serde_json::Value::from),
                    Just(serde_json::json!(null)),
                    Just(serde_json::json!([])),
                    Just(serde_json::json!({"a": 1.5})),
                ],
            ) {
                let k = key(3);
                let mut v: serde_json::Value = serde_json::from_slice(&signed(&k)).unwrap();
                let slot = v.pointer_mut(at).unwrap();
                let same = *slot == value;
                *slot = value;
                let r = verify(v.to_string().as_bytes(), "x", &trusting(&k), Mode::Production);
                prop_assert_eq!(r.is_ok(), same, "{:?}", r.err());
            }
        }
    }

    #[tokio::test]
    async fn an_oversized_file_is_refused_before_it_is_parsed() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("i.json");
        std::fs::write(&path, vec![b' '; MAX_INDEX_BYTES as usize + 1]).unwrap();
        let err = fetch(&IndexSource::File(path)).await.unwrap_err();
        assert!(matches!(err, IndexError::TooLarge { .. }), "{err}");
    }
}
