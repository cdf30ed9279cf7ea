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
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
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
}

impl Walk<'_> {
    /// Hashes the children of `abs` (whose path relative to the root is `rel`, at `depth`).
    fn dir(&mut self, abs: &Path, rel: &[u8], depth: usize) -> Result<(), DigestError> {
        let io_err = |source| DigestError::Io {
            path: abs.to_owned(),
            source,
        };
        let mut names = Vec::new();
        for entry in fs::read_dir(abs).map_err(io_err)? {
            names.push(entry.map_err(io_err)?.file_name());
        }
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));

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
            } else if ft.is_dir() {
                self.hasher.update([TAG_DIR]);
                self.framed(&child_rel);
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
        }
        if seen != size {
            return Err(DigestError::Changed {
                path: path.to_owned(),
            });
        }
        Ok(())
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
