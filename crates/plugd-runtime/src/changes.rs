//! What changed in a plugin since its approval: the approved file listing, a
//! metadata-checked digest cache for display, and the tools withheld from
//! plugins whose files changed (so a call can say which file and what to do).
//!
//! At approval the plugin directory's per-file listing (each file's SHA-256,
//! each link's target, metadata stamps) is saved as
//! `.plugd/listings/<hex of the approved digest>.json`: content-addressed, so
//! the approval row in the state database picks its listing and nothing else
//! has to agree with it. Comparing the live directory against it names the
//! changed, added and removed files.
//!
//! **Architecture invariant**: the cache here only decides what `plugin list`
//! shows and which tools are listed. The start gate (`TrustObserver::may_start`)
//! hashes the directory every time, so no cache can let a changed plugin start.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use plugd_manifest::PluginSpec;
use plugd_store::Approval;
use plugd_store::digest::{
    DIGEST_PREFIX, DigestLimits, Listing, ListingDiff, plugin_listing, plugin_stamps,
};
use serde_json::Value;

const LISTINGS_DIR: &str = "listings";

/// The file holding the listing of the approval pinned to `digest`.
fn listing_path(state_dir: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix(DIGEST_PREFIX).unwrap_or(digest);
    state_dir.join(LISTINGS_DIR).join(format!("{hex}.json"))
}

/// The listing saved for the approval pinned to `digest`, if any.
pub(crate) fn load_listing(state_dir: &Path, digest: &str) -> Option<Listing> {
    let text = std::fs::read(listing_path(state_dir, digest)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Saves `listing` for the approval pinned to `digest` (atomically: a
/// temporary file renamed into place).
fn save_listing(state_dir: &Path, digest: &str, listing: &Listing) -> Result<(), String> {
    let path = listing_path(state_dir, digest);
    let dir = path.parent().unwrap_or(state_dir);
    let err = |e: std::io::Error| format!("cannot save the file listing {}: {e}", path.display());
    std::fs::create_dir_all(dir).map_err(err)?;
    let mut tmp = tempfile_in(dir).map_err(err)?;
    let text = serde_json::to_vec(listing).map_err(|e| err(e.into()))?;
    // Not synced: a listing lost in a crash only means the changed files
    // cannot be named; the approval and its gate do not depend on it.
    tmp.1.write_all(&text).map_err(err)?;
    std::fs::rename(&tmp.0, &path).map_err(err)?;
    Ok(())
}

/// A fresh `.listing.<pid>.<n>` file in `dir`, created exclusively.
fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".listing.{}.{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The spec digest from the directory's digest (`None` when the dialect
/// keeps no code in its directory) and the declaration entry outside it.
pub(crate) fn spec_digest_from(dir_digest: Option<&str>, spec: &PluginSpec) -> String {
    use sha2::{Digest, Sha256};
    match (dir_digest, &spec.pinned) {
        (Some(d), Value::Null) => d.to_owned(),
        _ => {
            let mut h = Sha256::new();
            h.update(b"plugd-spec-digest-v1\0");
            h.update(dir_digest.unwrap_or("-").as_bytes());
            h.update(b"\0");
            // serde_json writes object keys in sorted order (no preserve_order).
            h.update(serde_json::to_vec(&spec.pinned).unwrap_or_default());
            format!("sha256:{}", hex::encode(h.finalize()))
        }
    }
}

/// The digest to approve `spec` at, hashing its directory now and saving
/// the per-file listing under that digest.
pub(crate) fn approval_digest(spec: &PluginSpec, state_dir: &Path) -> Result<String, String> {
    if !spec.pin_dir {
        return Ok(spec_digest_from(None, spec));
    }
    let listing = plugin_listing(&spec.dir, &DigestLimits::default()).map_err(|e| e.to_string())?;
    let digest = spec_digest_from(Some(&listing.digest), spec);
    save_listing(state_dir, &digest, &listing)?;
    Ok(digest)
}

/// The digest of `spec` as it is now, for display and for listing tools:
/// when the approval's saved listing shows the same entries with the same
/// metadata (size, mtime, ctime, inode, mode), nothing is read; otherwise
/// the directory is hashed.
pub(crate) fn display_digest(
    spec: &PluginSpec,
    approval: Option<&Approval>,
    state_dir: &Path,
) -> Result<String, String> {
    if spec.pin_dir
        && let Some(approval) = approval
        && let Some(listing) = load_listing(state_dir, &approval.digest)
        && let Ok(stamps) = plugin_stamps(&spec.dir, &DigestLimits::default())
        && listing.stamps_match(&stamps)
    {
        return Ok(spec_digest_from(Some(&listing.digest), spec));
    }
    crate::spec_digest(spec)
}

/// What differs between the approval pinned to `approved` and `spec`'s files
/// now, e.g. `changed main.py; added x.sh`.
pub(crate) fn describe(spec: &PluginSpec, approved: &str, state_dir: &Path) -> String {
    if !spec.pin_dir {
        return "its declaration entry changed".to_owned();
    }
    let now = match plugin_listing(&spec.dir, &DigestLimits::default()) {
        Ok(now) => now,
        Err(e) => return format!("its directory cannot be read: {e}"),
    };
    let Some(then) = load_listing(state_dir, approved) else {
        return "no file listing was saved with that approval, so the files cannot be named"
            .to_owned();
    };
    let diff = ListingDiff::between(&then.entries, &now.entries);
    if diff.is_empty() {
        if spec_digest_from(Some(&now.digest), spec) == approved {
            // Changed back (or never changed): nothing to name.
            "no file differs from the approval now".to_owned()
        } else {
            "its declaration entry changed".to_owned()
        }
    } else {
        diff.to_string()
    }
}

/// A plugin whose files changed since approval: the tools it had (withheld
/// from the registry) and what changed.
#[derive(Debug, Clone)]
pub(crate) struct Withheld {
    /// The tool names of its approved catalog.
    pub tools: Vec<String>,
    /// What changed (files named), see [`describe`].
    pub files: String,
}

/// The withheld plugins of a runtime, by id.
#[derive(Debug, Default)]
pub(crate) struct WithheldMap(Mutex<BTreeMap<String, Withheld>>);

impl WithheldMap {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Withheld>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, id: &str, withheld: Withheld) {
        self.lock().insert(id.to_owned(), withheld);
    }

    /// Forgets `id`; whether it was withheld.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().remove(id).is_some()
    }

    pub fn get(&self, id: &str) -> Option<Withheld> {
        self.lock().get(id).cloned()
    }

    /// The withheld plugin that had tool `name`, with what changed.
    pub fn owner_of(&self, name: &str) -> Option<(String, String)> {
        self.lock()
            .iter()
            .find(|(_, w)| w.tools.iter().any(|t| t == name))
            .map(|(id, w)| (id.clone(), w.files.clone()))
    }
}

/// The tool names of an approval's cached catalog.
pub(crate) fn catalog_names(approval: &Approval) -> Vec<String> {
    approval
        .catalog
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
