//! Installing a package that did not come from a registry: an uploaded
//! archive (`POST /v1/plugin-packages` with an `application/x-tar` body,
//! seed 003's "Upload a plugin package") or a local directory (`plugd
//! package install DIR`).
//!
//! The archive is a plain tar of the package directory, its manifest at the
//! root. It is unpacked within the package bounds ([`Limits`]: files,
//! bytes, path length and depth; regular files and directories only, plain
//! relative paths, no links) into a staging directory, read as a package
//! directory (manifest validated, `.env` files and private keys refused),
//! and turned into the very artifact `plugd package push` makes of that
//! directory ([`crate::oci::artifact`]). It is then installed by the checks
//! a pull runs, under that artifact's digest: a directory uploaded, and the
//! same directory pushed and pulled, are one package with one digest. Its
//! record's `source` is `upload:sha256:…`.

use std::path::Path;

use plugd_control::PackageStore;

use crate::archive::extract_package;
use crate::install::{
    Config, Existing, Installed, PULL_DEADLINE, Placement, SignatureCheck, existing, packages_dir,
    place,
};
use crate::oci::{Blobs, artifact};
use crate::scan::read_package_dir;
use crate::{Limits, PackageError};

/// The media type of an uploaded package archive.
pub const ARCHIVE_MEDIA_TYPE: &str = "application/x-tar";

/// Who installs, when, and under which trust policy.
#[derive(Clone, Copy)]
pub struct Local<'a> {
    /// The package bounds.
    pub limits: Limits,
    /// Who installs it (`token:NAME`, a Unix user name).
    pub by: &'a str,
    /// When (RFC 3339 UTC).
    pub at: &'a str,
    /// The signature check, as for a pull.
    pub verify: &'a SignatureCheck,
}

impl std::fmt::Debug for Local<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("by", &self.by)
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}

/// Installs the package archive `data` (a tar of the package directory)
/// under `state_dir`, within [`PULL_DEADLINE`].
pub async fn install_archive<S: PackageStore + ?Sized>(
    store: &S,
    state_dir: &Path,
    data: Vec<u8>,
    how: &Local<'_>,
) -> Result<Installed, PackageError> {
    let limits = how.limits;
    if data.len() as u64 > limits.max_layer_bytes() {
        return Err(PackageError::TooLarge {
            what: "the uploaded archive".into(),
            limit: format!("{} bytes", limits.max_layer_bytes()),
            hint: "a package is at most 256 MiB of files; move large data out of it",
        });
    }
    let tmp = packages_dir(state_dir).join("tmp");
    let blobs = tokio::task::spawn_blocking(move || -> Result<Blobs, PackageError> {
        std::fs::create_dir_all(&tmp).map_err(|e| PackageError::io(&tmp, e))?;
        let staging = tempfile::Builder::new()
            .prefix("upload-")
            .tempdir_in(&tmp)
            .map_err(|e| PackageError::io(&tmp, e))?;
        extract_package(&data, staging.path(), &limits)?;
        artifact(read_package_dir(staging.path(), &limits)?)
    })
    .await
    .map_err(|e| PackageError::io("upload", std::io::Error::other(e)))??;
    within_deadline(install_blobs(
        store,
        state_dir,
        blobs,
        "an uploaded archive",
        how,
    ))
    .await
}

/// Installs the package directory `dir` as [`install_archive`] installs
/// its archive.
pub async fn install_dir<S: PackageStore + ?Sized>(
    store: &S,
    state_dir: &Path,
    dir: &Path,
    how: &Local<'_>,
) -> Result<Installed, PackageError> {
    let blobs = artifact(read_package_dir(dir, &how.limits)?)?;
    let reference = dir.display().to_string();
    within_deadline(install_blobs(store, state_dir, blobs, &reference, how)).await
}

async fn within_deadline(
    f: impl Future<Output = Result<Installed, PackageError>>,
) -> Result<Installed, PackageError> {
    tokio::time::timeout(PULL_DEADLINE, f)
        .await
        .unwrap_or_else(|_| {
            Err(PackageError::Timeout {
                reference: "an upload".into(),
                secs: PULL_DEADLINE.as_secs(),
            })
        })
}

async fn install_blobs<S: PackageStore + ?Sized>(
    store: &S,
    state_dir: &Path,
    blobs: Blobs,
    reference: &str,
    how: &Local<'_>,
) -> Result<Installed, PackageError> {
    let restore = match existing(store, &blobs.digest, how.verify, reference).await? {
        Existing::Done(done) => return Ok(done),
        Existing::Restore(p) => p,
    };
    place(
        store,
        state_dir,
        Placement {
            reference: reference.to_owned(),
            source: format!("upload:{}", blobs.digest),
            digest: blobs.digest,
            config: Config {
                package_id: blobs.package_id,
                version: blobs.version,
            },
            manifest_file: blobs.manifest_file,
            manifest: blobs.manifest,
            files: blobs.files_tar,
            limits: how.limits,
            restore,
            by: how.by,
            at: how.at,
            verify: how.verify,
        },
    )
    .await
}
