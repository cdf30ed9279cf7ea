//! Installing a pulled package: fetch and verify its blobs, unpack them in
//! a staging directory, validate the manifest there, make everything
//! read-only, move it to `STATE/packages/sha256/<hex>` and record it.
//!
//! An install is keyed by the digest of the OCI manifest: pulling a digest
//! already installed changes nothing, and pulling a tag that moved installs
//! the new digest beside the old one (a new version) or, when it claims an
//! installed version, is refused. Nothing is recorded before the files are
//! in place, and nothing is moved in place before every check passed.
//!
//! The record keeps the tree digest of the read-only directory as
//! installed; plugd checks it before every start of the package's process.
//! Pulling an installed digest whose files changed since restores them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use plugd_control::{Inserted, Package, PackageStore, SignatureStatus};
use plugd_store::digest::{DigestLimits, plugin_digest};
use serde::Deserialize;

use crate::archive::{extract, make_read_only};
use crate::oci::{OciRef, RegistryOptions, Remote};
use crate::scan::{check_secret, load_manifest};
use crate::{Limits, PackageError};

/// The longest a whole pull may take: 5 minutes.
pub const PULL_DEADLINE: Duration = Duration::from_secs(300);

/// The result of [`install`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The installed record.
    pub package: Package,
    /// `false` when this digest was installed already.
    pub new: bool,
    /// `true` when this digest was installed already but its files had
    /// changed since, and the pull put them back.
    pub restored: bool,
}

/// Where installed packages live below a workspace's state directory.
pub fn packages_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("packages")
}

/// The config blob's fields plugd reads.
#[derive(Deserialize)]
pub(crate) struct Config {
    pub(crate) package_id: String,
    pub(crate) version: String,
}

/// Checks the signature of a package directory (staged, or installed
/// already) under the caller's trust policy: the status to record, or why
/// the install is refused. `plugd-runtime::signing::package_verifier` makes
/// the one plugd uses, so packages and `.plugins/` share one verifier.
pub type SignatureCheck = dyn Fn(&Path) -> Result<SignatureStatus, String> + Send + Sync;

/// What to pull, how, and who asks.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    /// The reference to pull.
    pub source: &'a OciRef,
    /// How to reach its registry.
    pub opts: &'a RegistryOptions,
    /// Who installs it (`token:NAME`, a Unix user name).
    pub by: &'a str,
    /// When (RFC 3339 UTC).
    pub at: &'a str,
    /// The signature check: run on the staged files before anything is
    /// moved in place, and on an installed digest before it is reused.
    pub verify: &'a SignatureCheck,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("source", &self.source)
            .field("by", &self.by)
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}

/// Pulls `req.source` and installs it under `state_dir` (the workspace's
/// `.plugd`), recorded in `store`, within [`PULL_DEADLINE`].
pub async fn install<S: PackageStore + ?Sized>(
    store: &S,
    state_dir: &Path,
    req: &Request<'_>,
) -> Result<Installed, PackageError> {
    tokio::time::timeout(PULL_DEADLINE, pull(store, state_dir, req))
        .await
        .unwrap_or_else(|_| {
            Err(PackageError::Timeout {
                reference: req.source.to_string(),
                secs: PULL_DEADLINE.as_secs(),
            })
        })
}

fn store_error(e: impl std::error::Error + Send + Sync + 'static) -> PackageError {
    PackageError::Store(Box::new(e))
}

async fn pull<S: PackageStore + ?Sized>(
    store: &S,
    state_dir: &Path,
    req: &Request<'_>,
) -> Result<Installed, PackageError> {
    let Request {
        source,
        opts,
        by,
        at,
        verify,
    } = *req;
    let remote = Remote::new(source, opts);
    let artifact = remote.artifact().await?;
    let restore = match existing(store, &artifact.digest, verify, &source.to_string()).await? {
        Existing::Done(done) => return Ok(done),
        Existing::Restore(p) => p,
    };
    let limits = opts.limits;
    let config = remote
        .blob(&artifact.config, limits.max_document_bytes)
        .await?;
    let config: Config =
        serde_json::from_slice(&config).map_err(|e| PackageError::NotAPackage {
            reference: source.to_string(),
            detail: format!("its config blob is not plugd's ({e})"),
        })?;
    let manifest = remote
        .blob(&artifact.manifest_layer, plugd_manifest::MAX_MANIFEST_BYTES)
        .await?;
    let files = remote
        .blob(&artifact.files_layer, limits.max_layer_bytes())
        .await?;
    place(
        store,
        state_dir,
        Placement {
            reference: source.to_string(),
            source: source.pinned(&artifact.digest),
            digest: artifact.digest,
            config,
            manifest_file: artifact.manifest_file,
            manifest,
            files,
            limits,
            restore,
            by,
            at,
            verify,
        },
    )
    .await
}

/// What an install finds of a digest already recorded.
pub(crate) enum Existing {
    /// Installed, its files as installed, and the request's policy accepts
    /// it: nothing to do.
    Done(Installed),
    /// Not installed (`None`), or installed with files changed since, which
    /// this install puts back (the record stays).
    Restore(Option<Package>),
}

pub(crate) async fn existing<S: PackageStore + ?Sized>(
    store: &S,
    digest: &plugd_control::Digest,
    verify: &SignatureCheck,
    reference: &str,
) -> Result<Existing, PackageError> {
    let Some(p) = store.package(digest).await.map_err(store_error)? else {
        return Ok(Existing::Restore(None));
    };
    if intact(&p).await {
        // The policy of this request still applies (it may be stricter
        // than the one it was installed under).
        verify(&p.path).map_err(|message| PackageError::Signature {
            reference: reference.to_owned(),
            message,
        })?;
        return Ok(Existing::Done(Installed {
            package: p,
            new: false,
            restored: false,
        }));
    }
    tracing::warn!(package = %p.package_id, version = %p.version, digest = %p.digest,
        "the installed files changed since the install; restoring them from {reference}");
    Ok(Existing::Restore(Some(p)))
}

/// Verified blobs of one package, ready to be staged and put in place.
pub(crate) struct Placement<'a> {
    /// What the caller named, for errors (`oci://…`, `an uploaded archive`).
    pub(crate) reference: String,
    /// What the record keeps as its source.
    pub(crate) source: String,
    /// The OCI manifest digest the package is installed under.
    pub(crate) digest: plugd_control::Digest,
    /// The config blob's ids, checked against the manifest.
    pub(crate) config: Config,
    pub(crate) manifest_file: &'static str,
    pub(crate) manifest: Vec<u8>,
    pub(crate) files: Vec<u8>,
    pub(crate) limits: Limits,
    /// The installed record whose changed files this placement restores.
    pub(crate) restore: Option<Package>,
    pub(crate) by: &'a str,
    pub(crate) at: &'a str,
    pub(crate) verify: &'a SignatureCheck,
}

/// Stages `p`'s blobs, checks them (manifest, signature, ids, version),
/// makes them read-only, takes their tree digest, moves them in place and
/// records the package; nothing is in place or recorded before every check
/// passed.
pub(crate) async fn place<S: PackageStore + ?Sized>(
    store: &S,
    state_dir: &Path,
    p: Placement<'_>,
) -> Result<Installed, PackageError> {
    let Placement {
        reference,
        source,
        digest,
        config,
        manifest_file,
        manifest,
        files,
        limits,
        restore,
        by,
        at,
        verify,
    } = p;
    let refused = |message: String| PackageError::Signature {
        reference: reference.clone(),
        message,
    };
    let root = packages_dir(state_dir);
    let staged = tokio::task::spawn_blocking(move || {
        stage(&root, manifest_file, &manifest, &files, &limits)
    })
    .await
    .map_err(|e| PackageError::io("staging", std::io::Error::other(e)))??;
    let (staging, info, extracted) = staged;
    // Before anything is moved in place: a bad signature, or one the policy
    // refuses, leaves nothing installed.
    let signature = verify(staging.path()).map_err(refused)?;
    if info.package_id != config.package_id || info.version != config.version {
        return Err(PackageError::NotAPackage {
            reference: reference.clone(),
            detail: format!(
                "its config names {}@{} but its manifest declares {}@{}",
                config.package_id, config.version, info.package_id, info.version
            ),
        });
    }
    let taken = store
        .package_versions(&info.package_id)
        .await
        .map_err(store_error)?
        .into_iter()
        .find(|p| p.version == info.version && p.digest != digest);
    if let Some(p) = taken {
        return Err(version_taken(p, &digest));
    }
    let dest = packages_dir(state_dir).join("sha256").join(digest.hex());
    let staged_path = staging.path().to_path_buf();
    let dest2 = dest.clone();
    let expected = restore.as_ref().and_then(|p| p.tree_digest.clone());
    let tree_reference = reference.clone();
    let tree = tokio::task::spawn_blocking(move || -> Result<String, PackageError> {
        make_read_only(&staged_path)?;
        // Taken on the read-only tree, as every start will take it.
        let tree = plugin_digest(&staged_path, &DigestLimits::default())
            .map_err(|e| PackageError::io(&staged_path, std::io::Error::other(e.to_string())))?;
        // A restore puts back exactly the tree recorded, or nothing.
        if let Some(expected) = expected.filter(|e| *e != tree) {
            return Err(PackageError::NotAPackage {
                reference: tree_reference,
                detail: format!(
                    "its files unpack to tree digest {tree}, not the {expected} recorded at its install"
                ),
            });
        }
        if let Some(parent) = dest2.parent() {
            std::fs::create_dir_all(parent).map_err(|e| PackageError::io(parent, e))?;
        }
        if std::fs::symlink_metadata(&dest2).is_ok() {
            // Left by an install that died before recording it.
            remove_tree(&dest2)?;
        }
        std::fs::rename(&staged_path, &dest2).map_err(|e| PackageError::io(&dest2, e))?;
        Ok(tree)
    })
    .await
    .map_err(|e| PackageError::io("install", std::io::Error::other(e)))??;
    if let Some(p) = restore {
        return Ok(Installed {
            package: p,
            new: false,
            restored: true,
        });
    }
    // The directory moved away; dropping the guard finds nothing to remove.
    drop(staging);
    let package = Package {
        package_id: info.package_id,
        version: info.version,
        digest: digest.clone(),
        source,
        installed_at: at.to_owned(),
        installed_by: by.to_owned(),
        path: dest.clone(),
        manifest: manifest_file.to_owned(),
        exports: info.exports,
        signature,
        files: extracted.files + 1,
        size: extracted.bytes,
        tree_digest: Some(tree),
    };
    match store.insert_package(&package).await.map_err(store_error)? {
        Inserted::New => Ok(Installed {
            package,
            new: true,
            restored: false,
        }),
        Inserted::Existing(p) => Ok(Installed {
            package: p,
            new: false,
            restored: false,
        }),
        Inserted::VersionTaken(p) => {
            let _ = remove_tree(&dest);
            Err(version_taken(p, &digest))
        }
    }
}

/// Whether the files of installed `p` are as installed (records without a
/// tree digest, from development builds, count as intact).
async fn intact(p: &Package) -> bool {
    let Some(expected) = p.tree_digest.clone() else {
        return true;
    };
    let path = p.path.clone();
    tokio::task::spawn_blocking(move || {
        plugin_digest(&path, &DigestLimits::default()).is_ok_and(|now| now == expected)
    })
    .await
    .unwrap_or(false)
}

fn version_taken(installed: Package, new: &plugd_control::Digest) -> PackageError {
    PackageError::VersionTaken {
        package_id: installed.package_id,
        version: installed.version,
        installed: installed.digest.to_string(),
        source_ref: installed.source,
        new: new.to_string(),
    }
}

type Staged = (
    tempfile::TempDir,
    crate::scan::ManifestInfo,
    crate::archive::Extracted,
);

/// Unpacks the verified blobs into a new directory below `root/tmp` and
/// validates the manifest there.
fn stage(
    root: &Path,
    manifest_file: &'static str,
    manifest: &[u8],
    files: &[u8],
    limits: &Limits,
) -> Result<Staged, PackageError> {
    let tmp = root.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| PackageError::io(&tmp, e))?;
    let staging = tempfile::Builder::new()
        .prefix("pull-")
        .tempdir_in(&tmp)
        .map_err(|e| PackageError::io(&tmp, e))?;
    check_secret(manifest_file, manifest)?;
    let path = staging.path().join(manifest_file);
    std::fs::write(&path, manifest).map_err(|e| PackageError::io(&path, e))?;
    let extracted = extract(files, staging.path(), limits, 1, manifest.len() as u64)?;
    let (found, info) = load_manifest(staging.path())?;
    debug_assert_eq!(found, manifest_file);
    let extracted = crate::archive::Extracted {
        bytes: extracted.bytes + manifest.len() as u64,
        ..extracted
    };
    Ok((staging, info, extracted))
}

/// Removes a tree made read-only by [`make_read_only`].
pub fn remove_tree(path: &Path) -> Result<(), PackageError> {
    use std::os::unix::fs::PermissionsExt;
    fn writable(p: &Path) {
        if std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
            if let Ok(entries) = std::fs::read_dir(p) {
                for e in entries.flatten() {
                    writable(&e.path());
                }
            }
        }
    }
    writable(path);
    std::fs::remove_dir_all(path).map_err(|e| PackageError::io(path, e))
}
