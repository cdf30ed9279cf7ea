//! Installed packages: immutable, content-addressed records of plugin
//! packages pulled from an OCI registry, and the [`PackageStore`] trait that
//! keeps them.
//!
//! A package is identified three ways: by the digest of its OCI manifest
//! ([`Digest`], `sha256:<64 hex>`, the one that never lies), by
//! `package_id@version` (what bindings will name), and by `package_id` alone
//! (its highest installed version). Installing keeps both keys unique: the
//! same digest twice is the same install, and a second digest claiming an
//! installed `package_id@version` is refused ([`Inserted::VersionTaken`]), so
//! a tag that moves in the registry never changes what is installed.

use crate::store::{Invalid, StoreError};
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `sha256:` and 64 lower-case hex digits: the digest of an OCI manifest or blob.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

/// Why a string is not a [`Digest`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a sha256 digest; write sha256: and 64 lower-case hex digits")]
pub struct BadDigest(pub String);

impl Digest {
    /// Parses `sha256:<64 lower-case hex>`.
    pub fn parse(s: &str) -> Result<Digest, BadDigest> {
        let ok = s.strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if ok {
            Ok(Digest(s.to_owned()))
        } else {
            Err(BadDigest(s.to_owned()))
        }
    }

    /// The digest of `sha256_hex`, 64 lower-case hex digits.
    pub fn from_sha256_hex(sha256_hex: &str) -> Result<Digest, BadDigest> {
        Digest::parse(&format!("sha256:{sha256_hex}"))
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// `sha256:…`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = BadDigest;

    fn try_from(s: String) -> Result<Digest, BadDigest> {
        Digest::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

/// One thing a package offers, as its manifest declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageExport {
    /// The export id (VAI `[[exports]] id`; a native tool's name).
    pub id: String,
    /// `harness`, `tool`, `hook` or `compactor` (VAI); `tool` for a native
    /// manifest's tools.
    pub kind: String,
    /// VAI `display_name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// VAI `execution_class` (`inline`, `worker`, `isolated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_class: Option<String>,
}

/// What is known of a package's signature (`marketplace.signature.json`,
/// checked on install with the trust policy of `plugd.yaml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum SignatureStatus {
    /// The package carries no `marketplace.signature.json`.
    Unsigned,
    /// It carries one plugd cannot check: another tool's format (e.g.
    /// `vai-plugin-sign`), or a record installed before plugd checked
    /// package signatures.
    Unverified {
        /// The signature file, relative to the package root.
        file: String,
    },
    /// A key in `trusted_publishers` signed exactly these contents.
    Verified {
        /// The signing key's id.
        key_id: String,
        /// The trusted publisher holding the key.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        publisher: Option<String>,
        /// When it was signed, as the signer said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signed_at: Option<String>,
    },
    /// A good signature over exactly these contents, by a key that is not
    /// in `trusted_publishers`.
    UntrustedKey {
        /// The signing key's id.
        key_id: String,
        /// The key (`ed25519:<base64>`), to trust it.
        public_key: String,
    },
    /// It carries a signature that does not verify (never installed: an
    /// install refuses it).
    Invalid {
        /// Why, for people.
        reason: String,
    },
}

impl SignatureStatus {
    /// One short line: `verified (key …, publisher …)`, `unsigned`,
    /// `untrusted key …`, `invalid: …`, `unverified`.
    pub fn summary(&self) -> String {
        match self {
            SignatureStatus::Unsigned => "unsigned".into(),
            SignatureStatus::Unverified { .. } => "unverified".into(),
            SignatureStatus::Verified {
                key_id,
                publisher: Some(p),
                ..
            } => format!("verified (key {key_id}, publisher {p})"),
            SignatureStatus::Verified { key_id, .. } => format!("verified (key {key_id})"),
            SignatureStatus::UntrustedKey { key_id, .. } => format!("untrusted key {key_id}"),
            SignatureStatus::Invalid { reason } => format!("invalid: {reason}"),
        }
    }

    /// The one-word form of list tables.
    pub fn word(&self) -> &'static str {
        match self {
            SignatureStatus::Unsigned => "unsigned",
            SignatureStatus::Unverified { .. } => "unverified",
            SignatureStatus::Verified { .. } => "verified",
            SignatureStatus::UntrustedKey { .. } => "untrusted",
            SignatureStatus::Invalid { .. } => "invalid",
        }
    }
}

/// An installed package: what was pulled, from where, and where it lives.
///
/// Immutable once installed: the files under [`Package::path`] are
/// read-only and pinned by [`Package::digest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    /// `package_id` of `vai-plugin.toml` (`acme/devkit`), or a native
    /// manifest's plugin id.
    pub package_id: String,
    /// The manifest's version (semver).
    pub version: String,
    /// The digest of the OCI manifest it was pulled as.
    pub digest: Digest,
    /// Where it came from: `oci://HOST/REPO:TAG@sha256:…` as pulled.
    pub source: String,
    /// When it was installed (RFC 3339 UTC).
    pub installed_at: String,
    /// Who installed it (`token:NAME`, a Unix user name).
    pub installed_by: String,
    /// The directory holding its files (read-only).
    pub path: PathBuf,
    /// The manifest file at its root (`vai-plugin.toml`, `nexo-plugin.toml`).
    pub manifest: String,
    /// Its exports, in manifest order.
    pub exports: Vec<PackageExport>,
    /// Its signature, as far as it was checked.
    pub signature: SignatureStatus,
    /// How many files it holds (the manifest included).
    pub files: u64,
    /// Their total size in bytes.
    pub size: u64,
    /// The tree digest (`plugd_store::digest::plugin_digest`) of its
    /// directory as installed, checked before every start of its process.
    /// `None` only for records of development builds that did not take it
    /// (their tree is digested when plugd first loads them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_digest: Option<String>,
}

/// How a caller names a package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackageSelector {
    /// Exactly this install.
    Digest(Digest),
    /// `package_id@version`.
    Version {
        /// The package id.
        package_id: String,
        /// The version.
        version: String,
    },
    /// The highest installed version of a package id.
    Latest(String),
}

impl PackageSelector {
    /// `sha256:…`, `PUBLISHER/NAME@VERSION` or `PUBLISHER/NAME`.
    pub fn parse(s: &str) -> Result<PackageSelector, BadDigest> {
        if s.starts_with("sha256:") {
            return Digest::parse(s).map(PackageSelector::Digest);
        }
        Ok(match s.rsplit_once('@') {
            Some((id, version)) => PackageSelector::Version {
                package_id: id.to_owned(),
                version: version.to_owned(),
            },
            None => PackageSelector::Latest(s.to_owned()),
        })
    }
}

impl fmt::Display for PackageSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PackageSelector::Digest(d) => write!(f, "{d}"),
            PackageSelector::Version {
                package_id,
                version,
            } => write!(f, "{package_id}@{version}"),
            PackageSelector::Latest(id) => f.write_str(id),
        }
    }
}

/// What [`PackageStore::insert_package`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inserted {
    /// A new install.
    New,
    /// This digest is installed already (nothing changed); the record.
    Existing(Package),
    /// Another digest is installed as this `package_id@version`; nothing
    /// changed. The installed record.
    VersionTaken(Package),
}

/// The package's path as stored: UTF-8 only.
pub fn package_path(p: &Package) -> Result<&str, Invalid> {
    p.path.to_str().ok_or_else(|| {
        Invalid::new(
            format!("package path {}", p.path.display()),
            "is not UTF-8; install packages under a UTF-8 workspace path",
        )
    })
}

/// Keeps the installed-package inventory. `plugd-store` implements it on
/// SQLite; a PostgreSQL backend implements the same.
#[async_trait::async_trait]
pub trait PackageStore: Send + Sync {
    /// Records `p` unless its digest or its `package_id@version` is taken;
    /// both checks and the write are one transaction.
    async fn insert_package(&self, p: &Package) -> Result<Inserted, StoreError>;

    /// The install of `digest`.
    async fn package(&self, digest: &Digest) -> Result<Option<Package>, StoreError>;

    /// Every installed version of `package_id`, in no set order.
    async fn package_versions(&self, package_id: &str) -> Result<Vec<Package>, StoreError>;

    /// Every install, by package id then install time.
    async fn packages(&self) -> Result<Vec<Package>, StoreError>;

    /// The install `sel` names: for [`PackageSelector::Latest`] the highest
    /// version by semver (by text when one does not parse).
    async fn find_package(&self, sel: &PackageSelector) -> Result<Option<Package>, StoreError> {
        match sel {
            PackageSelector::Digest(d) => self.package(d).await,
            PackageSelector::Version {
                package_id,
                version,
            } => Ok(self
                .package_versions(package_id)
                .await?
                .into_iter()
                .find(|p| &p.version == version)),
            PackageSelector::Latest(id) => Ok(latest(self.package_versions(id).await?)),
        }
    }
}

/// The package of the highest version among `versions`.
pub fn latest(versions: Vec<Package>) -> Option<Package> {
    versions.into_iter().max_by(|a, b| {
        match (
            semver::Version::parse(&a.version),
            semver::Version::parse(&b.version),
        ) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            _ => a.version.cmp(&b.version),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn pkg(id: &str, version: &str, n: u8) -> Package {
        Package {
            package_id: id.to_owned(),
            version: version.to_owned(),
            digest: Digest::from_sha256_hex(&format!("{n:02x}").repeat(32)).unwrap(),
            source: format!("oci://127.0.0.1:5000/{id}:{version}"),
            installed_at: "2026-01-01T00:00:00Z".to_owned(),
            installed_by: "test".to_owned(),
            path: PathBuf::from("/x"),
            manifest: "vai-plugin.toml".to_owned(),
            exports: vec![],
            signature: SignatureStatus::Unsigned,
            files: 1,
            size: 1,
            tree_digest: None,
        }
    }

    /// The trait's provided method over a plain list (the SQLite backend is
    /// tested in plugd-store).
    struct List(Mutex<Vec<Package>>);

    #[async_trait::async_trait]
    impl PackageStore for List {
        async fn insert_package(&self, p: &Package) -> Result<Inserted, StoreError> {
            self.0.lock().unwrap().push(p.clone());
            Ok(Inserted::New)
        }
        async fn package(&self, digest: &Digest) -> Result<Option<Package>, StoreError> {
            Ok(self
                .packages()
                .await?
                .into_iter()
                .find(|p| &p.digest == digest))
        }
        async fn package_versions(&self, id: &str) -> Result<Vec<Package>, StoreError> {
            Ok(self
                .packages()
                .await?
                .into_iter()
                .filter(|p| p.package_id == id)
                .collect())
        }
        async fn packages(&self) -> Result<Vec<Package>, StoreError> {
            Ok(self.0.lock().unwrap().clone())
        }
    }

    #[test]
    fn digests_are_sha256_and_lower_case_hex() {
        let good = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(Digest::parse(&good).unwrap().hex(), "ab".repeat(32));
        for bad in [
            "sha256:".to_owned(),
            format!("sha256:{}", "AB".repeat(32)),
            format!("sha512:{}", "ab".repeat(32)),
            format!("sha256:{}", "ab".repeat(31)),
            format!("sha256:{}/..", "ab".repeat(31)),
        ] {
            assert!(Digest::parse(&bad).is_err(), "{bad}");
        }
        let json = serde_json::to_string(&Digest::parse(&good).unwrap()).unwrap();
        assert_eq!(json, format!("\"{good}\""));
        assert!(serde_json::from_str::<Digest>("\"sha256:00\"").is_err());
    }

    #[test]
    fn selectors_name_a_digest_a_version_or_the_latest() {
        let d = format!("sha256:{}", "0f".repeat(32));
        assert_eq!(
            PackageSelector::parse(&d).unwrap(),
            PackageSelector::Digest(Digest::parse(&d).unwrap())
        );
        assert!(PackageSelector::parse("sha256:nope").is_err());
        assert_eq!(
            PackageSelector::parse("acme/devkit@0.1.0").unwrap(),
            PackageSelector::Version {
                package_id: "acme/devkit".into(),
                version: "0.1.0".into()
            }
        );
        assert_eq!(
            PackageSelector::parse("acme/devkit").unwrap().to_string(),
            "acme/devkit"
        );
    }

    #[tokio::test]
    async fn latest_is_the_highest_semver_not_the_last_text() {
        let store = List(Mutex::new(vec![]));
        for (v, n) in [("0.9.0", 1), ("0.10.0", 2), ("0.2.0", 3)] {
            store
                .insert_package(&pkg("acme/devkit", v, n))
                .await
                .unwrap();
        }
        store
            .insert_package(&pkg("acme/other", "9.0.0", 4))
            .await
            .unwrap();
        let sel = PackageSelector::Latest("acme/devkit".into());
        assert_eq!(
            store.find_package(&sel).await.unwrap().unwrap().version,
            "0.10.0"
        );
        let sel = PackageSelector::parse("acme/devkit@0.2.0").unwrap();
        assert_eq!(
            store.find_package(&sel).await.unwrap().unwrap().digest,
            pkg("", "", 3).digest
        );
        let sel = PackageSelector::Latest("acme/none".into());
        assert_eq!(store.find_package(&sel).await.unwrap(), None);
    }

    #[test]
    fn signature_status_is_tagged() {
        let v = serde_json::to_value(SignatureStatus::Unverified {
            file: "marketplace.signature.json".into(),
        })
        .unwrap();
        assert_eq!(v["status"], "unverified");
        assert_eq!(v["file"], "marketplace.signature.json");
    }
}
