//! The content digest an approval is pinned to: a framed SHA-256 over a plugin directory tree.
//!
//! [`plugin_digest`] walks the directory in byte order of names and feeds the
//! hash, for every entry below the root, a kind tag, its relative path (`/`
//! separated), and then: for a file its executable bit and its bytes, for a
//! symlink its target string (never followed), for a directory nothing more.
//! Paths, contents and targets are each prefixed with their length as a
//! little-endian `u64`, so no two different trees frame to the same stream.
//! Timestamps, owners and permission bits other than "executable" are not
//! hashed: `touch` leaves the digest alone, `chmod +x` changes it.
//!
//! **Architecture invariant:** the framing below is part of every stored
//! approval. Changing it (even the order of fields) invalidates all approvals;
//! do it only together with a new domain tag.
//!
//! Unix only: names are hashed as raw bytes and files are opened with
//! `O_NOFOLLOW | O_NONBLOCK`.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Prefix of every digest string made by [`plugin_digest`].
pub const DIGEST_PREFIX: &str = "sha256:";

/// Domain tag hashed first; bump the version if the framing ever changes.
const DOMAIN: &[u8] = b"plugd-plugin-digest-v1\0";

const TAG_DIR: u8 = b'd';
const TAG_FILE: u8 = b'f';
const TAG_SYMLINK: u8 = b'l';

/// Bounds on what [`plugin_digest`] will walk, so a huge or hostile tree fails fast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestLimits {
    /// Most entries (files, directories and symlinks, the root not counted). Default 20 000.
    pub max_files: usize,
    /// Most bytes of file content in total. Default 512 MiB.
    pub max_bytes: u64,
    /// Deepest nesting: an entry at `a/b/c` has depth 3. Default 32.
    pub max_depth: usize,
}

impl Default for DigestLimits {
    fn default() -> Self {
        DigestLimits {
            max_files: 20_000,
            max_bytes: 512 * 1024 * 1024,
            max_depth: 32,
        }
    }
}

/// Cheap metadata of one entry: if none of it changed, neither did the
/// entry's content (a write moves mtime and ctime, a replace moves the inode).
/// Only ever used to skip re-hashing for display; the start gate hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Status change time, nanoseconds since the epoch.
    pub ctime_ns: i128,
    /// Inode number.
    pub ino: u64,
    /// Mode bits (kind and permissions).
    pub mode: u32,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            ino: meta.ino(),
            mode: meta.mode(),
        }
    }
}

/// One entry of a plugin directory as [`plugin_listing`] hashed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedEntry {
    /// Path relative to the plugin directory, `/` separated (lossy UTF-8).
    pub path: String,
    /// `file`, `dir` or `symlink`.
    pub kind: String,
    /// Executable bit (files).
    #[serde(default)]
    pub executable: bool,
    /// SHA-256 of the content (files), or the link target (symlinks).
    #[serde(default)]
    pub content: Option<String>,
    /// Metadata when it was hashed.
    pub stamp: Stamp,
}

impl ListedEntry {
    /// Same kind, bits and content (the stamp is not compared).
    pub fn same_content(&self, other: &ListedEntry) -> bool {
        self.kind == other.kind
            && self.executable == other.executable
            && self.content == other.content
    }
}

/// A plugin directory's digest and the per-entry listing it was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// What [`plugin_digest`] returns for the same tree.
    pub digest: String,
    /// Every entry below the root, in digest order.
    pub entries: Vec<ListedEntry>,
}

/// What changed between two listings: paths relative to the plugin directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ListingDiff {
    /// Present in both with other content, kind or executable bit.
    pub changed: Vec<String>,
    /// Only in the newer listing.
    pub added: Vec<String>,
    /// Only in the older listing.
    pub removed: Vec<String>,
}

impl ListingDiff {
    /// `old` (approved) against `new` (now).
    pub fn between(old: &[ListedEntry], new: &[ListedEntry]) -> ListingDiff {
        use std::collections::BTreeMap;
        let old: BTreeMap<&str, &ListedEntry> = old.iter().map(|e| (e.path.as_str(), e)).collect();
        let new: BTreeMap<&str, &ListedEntry> = new.iter().map(|e| (e.path.as_str(), e)).collect();
        let mut diff = ListingDiff::default();
        for (path, e) in &new {
            match old.get(path) {
                None => diff.added.push((*path).to_owned()),
                Some(o) if !o.same_content(e) => diff.changed.push((*path).to_owned()),
                Some(_) => {}
            }
        }
        diff.removed = old
            .keys()
            .filter(|p| !new.contains_key(*p))
            .map(|p| (*p).to_owned())
            .collect();
        diff
    }

    /// Nothing differs.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.added.is_empty() && self.removed.is_empty()
    }
}

impl std::fmt::Display for ListingDiff {
    /// `changed main.py; added x.sh; removed lib/a.py`, at most 10 paths per kind.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for (what, paths) in [
            ("changed", &self.changed),
            ("added", &self.added),
            ("removed", &self.removed),
        ] {
            if paths.is_empty() {
                continue;
            }
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            let shown: Vec<&str> = paths.iter().take(10).map(String::as_str).collect();
            write!(f, "{what} {}", shown.join(", "))?;
            if paths.len() > 10 {
                write!(f, " and {} more", paths.len() - 10)?;
            }
        }
        Ok(())
    }
}

/// Why a plugin directory could not be digested.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DigestError {
    /// The path given is not a directory.
    #[error("plugin directory {}: not a directory", path.display())]
    NotADirectory {
        /// The path given.
        path: PathBuf,
    },
    /// A file or directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The entry that failed.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// The tree has more entries than [`DigestLimits::max_files`].
    #[error(
        "plugin directory {} has more than {limit} entries; remove files from it or raise the file limit",
        dir.display()
    )]
    TooMany {
        /// The plugin directory.
        dir: PathBuf,
        /// The limit exceeded.
        limit: usize,
    },
    /// The files hold more bytes than [`DigestLimits::max_bytes`].
    #[error(
        "plugin directory {} holds more than {limit} bytes of files; remove files from it or raise the size limit",
        dir.display()
    )]
    TooLarge {
        /// The plugin directory.
        dir: PathBuf,
        /// The limit exceeded.
        limit: u64,
    },
    /// An entry is nested deeper than [`DigestLimits::max_depth`].
    #[error(
        "plugin directory {}: {} is nested more than {limit} levels deep; flatten the tree or raise the depth limit",
        dir.display(),
        path.display()
    )]
    TooDeep {
        /// The plugin directory.
        dir: PathBuf,
        /// The first entry found too deep.
        path: PathBuf,
        /// The limit exceeded.
        limit: usize,
    },
    /// An entry is a fifo, socket or device, which a plugin must not ship.
    #[error(
        "{} is a {kind}; a plugin directory may hold only files, directories and symlinks",
        path.display()
    )]
    Special {
        /// The entry.
        path: PathBuf,
        /// `fifo`, `socket`, `block device`, `character device` or `special file`.
        kind: &'static str,
    },
    /// A file changed (size or kind) while it was being hashed.
    #[error("{} changed while it was being hashed; try again once it is stable", path.display())]
    Changed {
        /// The file.
        path: PathBuf,
    },
}

/// The content digest of the plugin directory `dir`: `sha256:` and 64 lower-case hex digits.
///
/// `dir` itself may be reached through a symlink; nothing inside it is followed.
pub fn plugin_digest(dir: &Path, limits: &DigestLimits) -> Result<String, DigestError> {
    walk(dir, limits, None)
}

/// [`plugin_digest`] plus the listing of every entry it hashed (each file's
/// own SHA-256, each link's target, and metadata stamps), so a later
/// listing can name what changed.
pub fn plugin_listing(dir: &Path, limits: &DigestLimits) -> Result<Listing, DigestError> {
    let mut entries = Vec::new();
    let digest = walk(dir, limits, Some(&mut entries))?;
    Ok(Listing { digest, entries })
}

/// The metadata stamps of every entry below `dir` (path, kind, stamp), in
/// digest order, without reading any file: what [`Listing::stamps_match`]
/// compares.
pub fn plugin_stamps(
    dir: &Path,
    limits: &DigestLimits,
) -> Result<Vec<(String, Stamp)>, DigestError> {
    fn go(
        abs: &Path,
        rel: &str,
        depth: usize,
        limits: &DigestLimits,
        out: &mut Vec<(String, Stamp)>,
        root: &Path,
    ) -> Result<(), DigestError> {
        let names = sorted_names(abs)?;
        for name in names {
            let path = abs.join(&name);
            let child = if rel.is_empty() {
                name.to_string_lossy().into_owned()
            } else {
                format!("{rel}/{}", name.to_string_lossy())
            };
            if depth + 1 > limits.max_depth || out.len() >= limits.max_files {
                return Err(DigestError::TooMany {
                    dir: root.to_owned(),
                    limit: limits.max_files,
                });
            }
            let meta = fs::symlink_metadata(&path).map_err(|source| DigestError::Io {
                path: path.clone(),
                source,
            })?;
            out.push((child.clone(), Stamp::of(&meta)));
            if meta.file_type().is_dir() {
                go(&path, &child, depth + 1, limits, out, root)?;
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    go(dir, "", 0, limits, &mut out, dir)?;
    Ok(out)
}

impl Listing {
    /// True when `stamps` (from [`plugin_stamps`]) show the same entries with
    /// the same metadata as when this listing was hashed.
    pub fn stamps_match(&self, stamps: &[(String, Stamp)]) -> bool {
        self.entries.len() == stamps.len()
            && self
                .entries
                .iter()
                .zip(stamps)
                .all(|(e, (p, s))| &e.path == p && &e.stamp == s)
    }
}

fn walk(
    dir: &Path,
    limits: &DigestLimits,
    listing: Option<&mut Vec<ListedEntry>>,
) -> Result<String, DigestError> {
    let meta = fs::metadata(dir).map_err(|source| DigestError::Io {
        path: dir.to_owned(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(DigestError::NotADirectory {
            path: dir.to_owned(),
        });
    }
    let mut walk = Walk {
        root: dir,
        limits,
        hasher: Sha256::new(),
        entries: 0,
        bytes: 0,
        buf: vec![0; 64 * 1024],
        listing,
    };
    walk.hasher.update(DOMAIN);
    walk.dir(dir, &[], 0)?;
    Ok(format!(
        "{DIGEST_PREFIX}{}",
        hex::encode(walk.hasher.finalize())
    ))
}

struct Walk<'a> {
    root: &'a Path,
    limits: &'a DigestLimits,
    hasher: Sha256,
    entries: usize,
    bytes: u64,
    buf: Vec<u8>,
    listing: Option<&'a mut Vec<ListedEntry>>,
}

/// The entry names of directory `abs`, in byte order (the digest's order).
fn sorted_names(abs: &Path) -> Result<Vec<std::ffi::OsString>, DigestError> {
    let io_err = |source| DigestError::Io {
        path: abs.to_owned(),
        source,
    };
    let mut names = Vec::new();
    for entry in fs::read_dir(abs).map_err(io_err)? {
        names.push(entry.map_err(io_err)?.file_name());
    }
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names)
}

impl Walk<'_> {
    /// Hashes the children of `abs` (whose path relative to the root is `rel`, at `depth`).
    fn dir(&mut self, abs: &Path, rel: &[u8], depth: usize) -> Result<(), DigestError> {
        let names = sorted_names(abs)?;

        for name in names {
            let path = abs.join(&name);
            let mut child_rel = Vec::with_capacity(rel.len() + 1 + name.len());
            if !rel.is_empty() {
                child_rel.extend_from_slice(rel);
                child_rel.push(b'/');
            }
            child_rel.extend_from_slice(name.as_bytes());

            if depth + 1 > self.limits.max_depth {
                return Err(DigestError::TooDeep {
                    dir: self.root.to_owned(),
                    path,
                    limit: self.limits.max_depth,
                });
            }
            self.entries += 1;
            if self.entries > self.limits.max_files {
                return Err(DigestError::TooMany {
                    dir: self.root.to_owned(),
                    limit: self.limits.max_files,
                });
            }

            let meta = fs::symlink_metadata(&path).map_err(|source| DigestError::Io {
                path: path.clone(),
                source,
            })?;
            let ft = meta.file_type();
            if ft.is_symlink() {
                let target = fs::read_link(&path).map_err(|source| DigestError::Io {
                    path: path.clone(),
                    source,
                })?;
                self.hasher.update([TAG_SYMLINK]);
                self.framed(&child_rel);
                self.framed(target.as_os_str().as_bytes());
                self.list(
                    &child_rel,
                    "symlink",
                    false,
                    Some(target.to_string_lossy().into_owned()),
                    &meta,
                );
            } else if ft.is_dir() {
                self.hasher.update([TAG_DIR]);
                self.framed(&child_rel);
                self.list(&child_rel, "dir", false, None, &meta);
                self.dir(&path, &child_rel, depth + 1)?;
            } else if ft.is_file() {
                self.file(&path, &child_rel)?;
            } else {
                return Err(DigestError::Special {
                    path,
                    kind: special_kind(ft),
                });
            }
        }
        Ok(())
    }

    /// Hashes one regular file, streaming its bytes.
    fn file(&mut self, path: &Path, rel: &[u8]) -> Result<(), DigestError> {
        let io_err = |source| DigestError::Io {
            path: path.to_owned(),
            source,
        };
        // NOFOLLOW and NONBLOCK: if the entry was swapped for a symlink or a
        // fifo since we looked, opening fails or returns at once, never blocks.
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map_err(|e| io_err(e.into()))?;
        let mut file = File::from(fd);
        let meta = file.metadata().map_err(io_err)?;
        if !meta.file_type().is_file() {
            return Err(DigestError::Changed {
                path: path.to_owned(),
            });
        }
        let size = meta.len();
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > self.limits.max_bytes {
            return Err(DigestError::TooLarge {
                dir: self.root.to_owned(),
                limit: self.limits.max_bytes,
            });
        }
        let executable = meta.permissions().mode() & 0o111 != 0;

        self.hasher.update([TAG_FILE]);
        self.framed(rel);
        self.hasher.update([u8::from(executable)]);
        self.hasher.update(size.to_le_bytes());
        let mut own = self.listing.is_some().then(Sha256::new);
        let mut seen: u64 = 0;
        loop {
            let n = match file.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err(e)),
            };
            seen += n as u64;
            if seen > size {
                break;
            }
            self.hasher.update(&self.buf[..n]);
            if let Some(own) = own.as_mut() {
                own.update(&self.buf[..n]);
            }
        }
        if seen != size {
            return Err(DigestError::Changed {
                path: path.to_owned(),
            });
        }
        if let Some(own) = own {
            let content = format!("{DIGEST_PREFIX}{}", hex::encode(own.finalize()));
            // The stamp is the one taken before reading: a write during the
            // read moves the file's stamp away from it, never towards it.
            self.list(rel, "file", executable, Some(content), &meta);
        }
        Ok(())
    }

    /// Records one entry when a listing is being made.
    fn list(
        &mut self,
        rel: &[u8],
        kind: &str,
        executable: bool,
        content: Option<String>,
        meta: &fs::Metadata,
    ) {
        if let Some(listing) = self.listing.as_mut() {
            listing.push(ListedEntry {
                path: String::from_utf8_lossy(rel).into_owned(),
                kind: kind.to_owned(),
                executable,
                content,
                stamp: Stamp::of(meta),
            });
        }
    }

    /// Feeds `bytes` prefixed with their length.
    fn framed(&mut self, bytes: &[u8]) {
        self.hasher.update((bytes.len() as u64).to_le_bytes());
        self.hasher.update(bytes);
    }
}

fn special_kind(ft: fs::FileType) -> &'static str {
    if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_char_device() {
        "character device"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_digest_is_the_plain_digest_and_diffs_name_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        fs::create_dir(d.join("lib")).unwrap();
        fs::write(d.join("main.py"), "print(1)\n").unwrap();
        fs::write(d.join("lib/a.py"), "a").unwrap();
        std::os::unix::fs::symlink("main.py", d.join("link")).unwrap();
        let limits = DigestLimits::default();
        let then = plugin_listing(d, &limits).unwrap();
        assert_eq!(then.digest, plugin_digest(d, &limits).unwrap());
        let paths: Vec<&str> = then.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["lib", "lib/a.py", "link", "main.py"]);
        assert!(then.stamps_match(&plugin_stamps(d, &limits).unwrap()));

        fs::write(d.join("main.py"), "print(2)\n").unwrap();
        fs::remove_file(d.join("lib/a.py")).unwrap();
        fs::write(d.join("new.sh"), "x").unwrap();
        let now = plugin_listing(d, &limits).unwrap();
        assert!(!then.stamps_match(&plugin_stamps(d, &limits).unwrap()));
        let diff = ListingDiff::between(&then.entries, &now.entries);
        assert_eq!(
            diff.to_string(),
            "changed main.py; added new.sh; removed lib/a.py"
        );
    }

    #[test]
    fn a_rewrite_with_the_same_size_moves_the_stamp() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        fs::write(d.join("f"), "aaaa").unwrap();
        let limits = DigestLimits::default();
        let then = plugin_listing(d, &limits).unwrap();
        // Same size, content rewritten through a rename (new inode, new ctime).
        fs::write(d.join("g"), "bbbb").unwrap();
        fs::rename(d.join("g"), d.join("f")).unwrap();
        assert!(!then.stamps_match(&plugin_stamps(d, &limits).unwrap()));
    }
}
