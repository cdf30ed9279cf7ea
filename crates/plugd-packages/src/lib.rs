//! plugd-packages: plugin packages as OCI artifacts. Reads a package
//! directory (its manifest validated by `plugd-manifest`, its files checked
//! for secrets), pushes it to a registry, pulls it back verifying every
//! blob, and installs it read-only under the workspace's state directory,
//! pinned by the digest of its OCI manifest.
//!
//! The artifact (an OCI image manifest, `artifactType` [`ARTIFACT_TYPE`]):
//!
//! | part | media type | content |
//! |------|------------|---------|
//! | config | [`CONFIG_MEDIA_TYPE`] | `{"package_id", "version", "manifest", "files", "size"}` |
//! | layer 0 | [`MANIFEST_LAYER_MEDIA_TYPE`] | the plugin manifest at the package root (`vai-plugin.toml` or `nexo-plugin.toml`), named by the `org.opencontainers.image.title` annotation |
//! | layer 1 | [`FILES_LAYER_MEDIA_TYPE`] | every other file, an uncompressed tar of regular files (mode 0644 or 0755, owner 0, mtime 0, sorted) |
//!
//! Modules: [`scan`] reads a directory and refuses secrets, [`archive`]
//! writes and reads the files layer within [`Limits`], [`oci`] talks to the
//! registry, [`install`] puts a pulled package in place and records it,
//! [`upload`] installs an uploaded archive or a local directory the same way,
//! [`contract`] reads what an installed export asks of its bindings.
//!
//! **Architecture invariant**: nothing pulled reaches the install directory
//! before its blob matched the digest the (digest-checked) OCI manifest
//! names, and nothing is extracted outside the staging directory: tar
//! entries are regular files and directories with plain relative paths.

pub mod archive;
pub mod contract;
pub mod install;
pub mod oci;
pub mod scan;
pub mod upload;

use std::path::PathBuf;

pub use contract::export_contract;
pub use install::{Installed, Request, SignatureCheck, install};
pub use oci::{OciRef, RegistryOptions, push};
pub use scan::{PackageDir, read_package_dir};
pub use upload::{ARCHIVE_MEDIA_TYPE, Local, install_archive, install_dir};

/// The OCI manifest's `artifactType`.
pub const ARTIFACT_TYPE: &str = "application/vnd.plugd.package.v1+json";
/// The config blob's media type (the same as the artifact type, as OCI 1.1
/// suggests for a config that describes the artifact).
pub const CONFIG_MEDIA_TYPE: &str = ARTIFACT_TYPE;
/// The layer holding the plugin manifest.
pub const MANIFEST_LAYER_MEDIA_TYPE: &str = "application/vnd.plugd.package.manifest.v1+toml";
/// The layer holding every other file.
pub const FILES_LAYER_MEDIA_TYPE: &str = "application/vnd.plugd.package.files.v1.tar";
/// The OCI image manifest media type.
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The annotation naming the manifest layer's file.
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";
/// The manifest files a package may have at its root, in order of preference.
pub const MANIFEST_FILES: [&str; 2] = ["vai-plugin.toml", "nexo-plugin.toml"];
/// The marketplace signature file (seed 003), verified on install by the
/// caller's [`SignatureCheck`].
pub const SIGNATURE_FILE: &str = "marketplace.signature.json";

/// Every bound on a package; the defaults are what plugd enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Files in a package, the manifest included: 10,000.
    pub max_files: u64,
    /// Their total size: 256 MiB.
    pub max_total_bytes: u64,
    /// Path components below the package root: 32.
    pub max_depth: usize,
    /// Bytes in one relative path: 1,024.
    pub max_path_bytes: usize,
    /// The OCI manifest and the config blob, each: 1 MiB.
    pub max_document_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_files: 10_000,
            max_total_bytes: 256 << 20,
            max_depth: 32,
            max_path_bytes: 1024,
            max_document_bytes: 1 << 20,
        }
    }
}

impl Limits {
    /// The largest files layer these limits allow: the files, one 512-byte
    /// header (and one GNU long-name record) per file, and the end blocks.
    pub fn max_layer_bytes(&self) -> u64 {
        self.max_total_bytes
            .saturating_add(self.max_files.saturating_mul(2048))
            .saturating_add(10_240)
    }
}

/// Why a package could not be read, pushed, pulled or installed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackageError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The directory has no manifest at its root.
    #[error(
        "{} has no plugin manifest at its root; a package needs vai-plugin.toml (or nexo-plugin.toml) there",
        dir.display()
    )]
    NoManifest {
        /// The package directory.
        dir: PathBuf,
    },
    /// The manifest does not validate.
    #[error(transparent)]
    Manifest(#[from] plugd_manifest::ManifestError),
    /// A file looks like a secret; packages never carry secrets.
    #[error(
        "package file {path:?} {why}; packages never carry secrets: remove it (bind secrets with secret slots instead)"
    )]
    Secret {
        /// The file, relative to the package root.
        path: String,
        /// What gave it away.
        why: &'static str,
    },
    /// Something is not a regular file or directory, or its path is not plain.
    #[error("package file {path:?} {why}")]
    BadEntry {
        /// The path as found (relative to the package root or in the tar).
        path: String,
        /// What is wrong, and what to do.
        why: String,
    },
    /// A bound of [`Limits`] was passed.
    #[error("{what} is over plugd's limit of {limit}; {hint}")]
    TooLarge {
        /// What grew too large, e.g. `package files`.
        what: String,
        /// The limit, with its unit.
        limit: String,
        /// What to do.
        hint: &'static str,
    },
    /// Not an `oci://HOST[:PORT]/REPO[:TAG][@sha256:…]` reference.
    #[error("{input:?} is not a package reference: {problem}")]
    Reference {
        /// The input.
        input: String,
        /// Why, and what to write.
        problem: String,
    },
    /// The registry failed or refused.
    #[error("registry {reference}: {detail}")]
    Registry {
        /// The reference being pushed or pulled.
        reference: String,
        /// What the client reported.
        detail: String,
    },
    /// A blob or the manifest does not match its digest.
    #[error(
        "{what} {expected} from {reference} does not match its digest (its content hashes to {actual}): the registry's copy is damaged or was tampered with; nothing was installed"
    )]
    Tampered {
        /// `blob` or `manifest`.
        what: &'static str,
        /// The digest it should have.
        expected: String,
        /// The digest of what came.
        actual: String,
        /// The reference pulled.
        reference: String,
    },
    /// The artifact is not a plugd package, or is malformed.
    #[error("{reference} is not a usable plugd package: {detail}")]
    NotAPackage {
        /// The reference pulled.
        reference: String,
        /// What is wrong.
        detail: String,
    },
    /// Another artifact is installed as this `package_id@version`.
    #[error(
        "{package_id}@{version} is installed already as {installed} (from {source_ref}); {new} claims the same version, and installed versions never change: publish it under a new version"
    )]
    VersionTaken {
        /// The package id.
        package_id: String,
        /// The version.
        version: String,
        /// The installed digest.
        installed: String,
        /// Where the installed one came from.
        source_ref: String,
        /// The refused digest.
        new: String,
    },
    /// The package store failed.
    #[error("package store: {0}")]
    Store(Box<dyn std::error::Error + Send + Sync>),
    /// The package's signature is invalid, or the trust policy refuses it.
    #[error("{reference}: the package's signature is refused: {message}; nothing was installed")]
    Signature {
        /// The reference pulled.
        reference: String,
        /// Why (from the trust policy's check).
        message: String,
    },
    /// The pull took longer than its deadline.
    #[error("pulling {reference} took longer than {secs} s; check the registry, or retry")]
    Timeout {
        /// The reference.
        reference: String,
        /// The deadline.
        secs: u64,
    },
}

impl From<PackageError> for plugd_control::ServiceError {
    /// The stable code of a package error: a bad reference →
    /// `invalid_source`, a digest mismatch → `package_tampered`, the
    /// registry → `registry_error`, another digest as the same version →
    /// `package_version_taken`, a refused signature → `signature_refused`,
    /// a file or the store → `internal`, any other refusal of the content →
    /// `package_refused`.
    fn from(e: PackageError) -> plugd_control::ServiceError {
        use plugd_control::Code;
        let code = match &e {
            PackageError::Reference { .. } => Code::InvalidSource,
            PackageError::Tampered { .. } => Code::PackageTampered,
            PackageError::Registry { .. } | PackageError::Timeout { .. } => Code::RegistryError,
            PackageError::VersionTaken { .. } => Code::PackageVersionTaken,
            PackageError::Signature { .. } => Code::SignatureRefused,
            PackageError::Io { .. } | PackageError::Store(_) => Code::Internal,
            _ => Code::PackageRefused,
        };
        plugd_control::ServiceError::new(code, e.to_string())
    }
}

impl PackageError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> PackageError {
        PackageError::Io {
            path: path.into(),
            source,
        }
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> plugd_control::Digest {
    use sha2::Digest as _;
    let hex = hex::encode(sha2::Sha256::digest(data));
    plugd_control::Digest::from_sha256_hex(&hex).unwrap_or_else(|_| unreachable!("sha256 hex"))
}
