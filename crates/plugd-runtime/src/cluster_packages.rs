//! Installed packages on a cluster's nodes: a package's files shared through the cluster's blob store by a node that has them, and taken from it, verified by the package's tree digest, by a node that has not.
//!
//! An installed package's record (PostgreSQL, the truth) names the
//! directory its files were installed into on one machine and their tree
//! digest. A node with that directory shares it (blob `pkg-HEX` of the tree
//! digest, once its files still digest to it) when it starts and whenever
//! the control epoch moves (an install moves it). A node without it takes
//! the blob the first time the package is called, unpacks it under
//! `.plugd/cluster-packages/` and uses it only when it digests to the
//! recorded tree digest; before every start of its process the tree is
//! checked again, as for any installed package. Without a blob store (one
//! node) nothing changes.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use plugd_control::packages::Package;
use plugd_store::digest::{DIGEST_PREFIX, DigestLimits, plugin_digest};
use plugd_store::pin_share::{adopt_dir, archive_dir, max_archive_bytes};

use crate::{Runtime, RuntimeError};

/// The blob name of a package's files with tree digest `tree`.
pub fn package_blob_name(tree: &str) -> String {
    format!("pkg-{}", tree.strip_prefix(DIGEST_PREFIX).unwrap_or(tree))
}

impl Runtime {
    /// Where this node keeps the packages it took from the cluster.
    fn cluster_packages_dir(&self) -> PathBuf {
        self.inner.dir.join(".plugd").join("cluster-packages")
    }

    /// `pkg` as this node runs it: from its own directory when this node
    /// has it, else from the copy taken from the cluster (see the module).
    pub(crate) async fn package_here(&self, mut pkg: Package) -> Result<Package, RuntimeError> {
        let shared = &self.inner.shared_pins;
        let Some(blobs) = shared.blobs() else {
            return Ok(pkg);
        };
        if pkg.path.is_dir() {
            return Ok(pkg);
        }
        let broken = |error: String| RuntimeError::Broken {
            name: crate::bindings_rt::describe(&pkg),
            error,
        };
        let Some(tree) = pkg.tree_digest.clone() else {
            return Err(broken(format!(
                "its files ({}) are not on this node and its record has no tree digest to verify a copy by; install it on this node",
                pkg.path.display()
            )));
        };
        let name = package_blob_name(&tree);
        let root = self.cluster_packages_dir();
        let dir = root.join(&name);
        if !dir.is_dir() {
            let tar = blobs
                .get(&name, max_archive_bytes())
                .await
                .map_err(|e| broken(format!("cannot take its files from the cluster: {e}")))?
                .ok_or_else(|| {
                    broken(format!(
                        "its files ({}) are not on this node and no node has shared them (blob {name})",
                        pkg.path.display()
                    ))
                })?;
            let what = crate::bindings_rt::describe(&pkg);
            let (r, n, t) = (root.clone(), name.clone(), tree.clone());
            tokio::task::spawn_blocking(move || adopt_dir(&r, &n, &what, &t, &tar))
                .await
                .map_err(|e| broken(e.to_string()))?
                .map_err(|e| broken(e.to_string()))?;
            tracing::info!(package = %crate::bindings_rt::describe(&pkg), dir = %dir.display(), "took the package's files from the cluster, verified by their tree digest");
        }
        pkg.path = dir;
        Ok(pkg)
    }

    /// Shares the files of every package installed with its files on this
    /// node and not shared yet by this process, in the background (one
    /// round at a time).
    pub(crate) fn share_packages(&self) {
        let shared = &self.inner.shared_pins;
        if shared.blobs().is_none() || shared.sharing_packages.swap(true, Ordering::AcqRel) {
            return;
        }
        let rt = self.clone();
        tokio::spawn(async move {
            let packages = rt.inner.state.packages().await.unwrap_or_default();
            for pkg in packages {
                let Some(tree) = pkg.tree_digest.clone() else {
                    continue;
                };
                let name = package_blob_name(&tree);
                if !pkg.path.is_dir() || rt.inner.shared_pins.was_published(&name) {
                    continue;
                }
                let dir = pkg.path.clone();
                let archived = tokio::task::spawn_blocking(move || {
                    let now =
                        plugin_digest(&dir, &DigestLimits::default()).map_err(|e| e.to_string())?;
                    if now != tree {
                        return Err(format!(
                            "its files digest to {now}, not the installed {tree}: not shared"
                        ));
                    }
                    archive_dir(&dir).map_err(|e| e.to_string())
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
                let Some(blobs) = rt.inner.shared_pins.blobs() else {
                    break;
                };
                let result = match archived {
                    Ok(tar) => blobs.put(&name, tar).await,
                    Err(e) => Err(e),
                };
                match result {
                    Ok(()) => {
                        rt.inner.shared_pins.mark_published(name);
                        tracing::info!(package = %crate::bindings_rt::describe(&pkg), "shared the package's files with the cluster");
                    }
                    Err(e) => {
                        tracing::warn!(package = %crate::bindings_rt::describe(&pkg), error = %e, "could not share the package's files with the cluster; nodes without them cannot run it yet")
                    }
                }
            }
            rt.inner
                .shared_pins
                .sharing_packages
                .store(false, Ordering::Release);
        });
    }
}
