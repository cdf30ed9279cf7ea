//! Approval pins shared between the nodes of a cluster: a pin as a tar ([`Pins::archive`]), a pin fetched from that tar and verified by digest before use ([`Pins::adopt`]), and the blob store that carries them ([`PinBlobs`], from `plugd_control::blobs`).
//!
//! The approval in the store (PostgreSQL, the truth) names the digest of the
//! approved directory. A node that has no pin of it fetches the archive from
//! the cluster's blob store (NATS JetStream's Object Store), unpacks it into
//! a staging directory, digests the staging copy and publishes it as the pin
//! only if that digest is the approved one: the blob store is trusted for
//! nothing but availability. Unpacking refuses what a pin never holds
//! (hard links, devices, FIFOs, absolute or climbing paths, links that leave
//! the pin, a path through a link) and stops at the digest limits.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use crate::digest::{DigestLimits, plugin_digest};
use crate::pin::{PinError, Pins};

pub use plugd_control::blobs::PinBlobs;

/// Most bytes of a pin archive: the digest limit on content plus headers.
pub fn max_archive_bytes() -> u64 {
    let l = DigestLimits::default();
    l.max_bytes + (l.max_files as u64 + 2) * 1024
}

fn unpack_err(plugin: &str, reason: impl Into<String>) -> PinError {
    PinError::Fetched {
        plugin: plugin.to_owned(),
        reason: reason.into(),
    }
}

impl Pins {
    /// The blob name of the pin of a directory approved with `dir_digest`.
    pub fn blob_name(dir_digest: &str) -> String {
        dir_digest
            .strip_prefix(crate::digest::DIGEST_PREFIX)
            .unwrap_or(dir_digest)
            .to_owned()
    }

    /// The verified pin of `plugin` approved with `dir_digest`, as an
    /// uncompressed tar: directories, regular files (mode 0644 or 0755) and
    /// symlinks, sorted, owner 0, mtime 0.
    pub fn archive(&self, plugin: &str, dir_digest: &str) -> Result<Vec<u8>, PinError> {
        let pin = self.verify(plugin, dir_digest)?;
        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        append_tree(&mut b, &pin, Path::new(""))?;
        b.into_inner().map_err(|e| PinError::Io {
            path: pin.clone(),
            source: e,
        })
    }

    /// Publishes the pin of `plugin` from `archive` (fetched from the
    /// cluster) if its content digests to `dir_digest`, and records it as
    /// the plugin's pin; returns it. Nothing of a refused archive stays.
    pub fn adopt(
        &self,
        plugin: &str,
        dir_digest: &str,
        archive: &[u8],
    ) -> Result<PathBuf, PinError> {
        let staging = self.staging_dir()?;
        unpack_verified(&staging, plugin, dir_digest, "approved", archive)?;
        self.publish_staged(plugin, &staging, dir_digest)
    }
}

/// Unpacks `archive` into `staging` (made here) and makes it read-only if
/// its content digests to `digest` (the `kind` one: approved, installed);
/// on any failure nothing of it stays.
fn unpack_verified(
    staging: &Path,
    what: &str,
    digest: &str,
    kind: &str,
    archive: &[u8],
) -> Result<(), PinError> {
    fs::create_dir(staging).map_err(tar_err(staging))?;
    let result = unpack(what, archive, staging).and_then(|()| {
        let found = plugin_digest(staging, &DigestLimits::default())?;
        if found != digest {
            return Err(unpack_err(
                what,
                format!("the cluster's copy digests to {found}, not the {kind} {digest}"),
            ));
        }
        crate::pin::make_read_only(staging)
    });
    if result.is_err() {
        let _ = crate::pin::remove_tree(staging);
    }
    result
}

/// Directory `dir` as a tar, as [`Pins::archive`] makes one of a pin: for
/// an installed package's files shared with the other nodes.
pub fn archive_dir(dir: &Path) -> Result<Vec<u8>, PinError> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    append_tree(&mut b, dir, Path::new(""))?;
    b.into_inner().map_err(tar_err(dir))
}

/// The copy of `what` (a package) in `root/name`, unpacked from `archive`
/// (fetched from the cluster) only if its content digests to `digest`;
/// made read-only. Unpacked beside its place and renamed into it, so a
/// half-written or refused copy is never found there; if another process
/// put it there first, that copy is returned (its user checks its digest
/// before each start, as for any installed package).
pub fn adopt_dir(
    root: &Path,
    name: &str,
    what: &str,
    digest: &str,
    archive: &[u8],
) -> Result<PathBuf, PinError> {
    fs::create_dir_all(root).map_err(tar_err(root))?;
    let target = root.join(name);
    if target.is_dir() {
        return Ok(target);
    }
    let staging = root.join(format!(
        ".staging-{}-{}",
        std::process::id(),
        crate::pin::random_suffix()
    ));
    unpack_verified(&staging, what, digest, "installed", archive)?;
    match fs::rename(&staging, &target) {
        Ok(()) => Ok(target),
        Err(_) if target.is_dir() => {
            let _ = crate::pin::remove_tree(&staging);
            Ok(target)
        }
        Err(e) => {
            let _ = crate::pin::remove_tree(&staging);
            Err(PinError::Io {
                path: target,
                source: e,
            })
        }
    }
}

/// Where the pins a node took from the cluster for plugins it has no copy
/// of are listed (`<pins>/adopted/<id>`, holding the pin's name).
const ADOPTED: &str = "adopted";

impl Pins {
    /// Records that plugin `id` runs here from the pin of `dir_digest`,
    /// taken from the cluster (this node has no copy of its directory):
    /// discovery then loads it from the pin.
    pub fn mark_adopted(&self, id: &str, dir_digest: &str) -> Result<(), PinError> {
        let dir = self.root().join(ADOPTED);
        fs::create_dir_all(&dir).map_err(tar_err(&dir))?;
        let path = dir.join(crate::pin::encode_id(id));
        let tmp = dir.join(format!(".tmp-{}", std::process::id()));
        fs::write(&tmp, format!("{}\n", Pins::blob_name(dir_digest))).map_err(tar_err(&tmp))?;
        fs::rename(&tmp, &path).map_err(tar_err(&path))
    }

    /// Forgets that plugin `id` was taken from the cluster; `true` if it was.
    pub fn unmark_adopted(&self, id: &str) -> bool {
        fs::remove_file(self.root().join(ADOPTED).join(crate::pin::encode_id(id))).is_ok()
    }

    /// The pins of the plugins taken from the cluster: (marker file, pin
    /// directory), sorted. A marker naming no valid pin is skipped.
    pub fn adopted(&self) -> Vec<(PathBuf, PathBuf)> {
        let dir = self.root().join(ADOPTED);
        let Ok(entries) = fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out: Vec<(PathBuf, PathBuf)> = entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| {
                let name = fs::read_to_string(e.path()).ok()?;
                let name = name.trim();
                (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
                    .then(|| (e.path(), self.root().join(name)))
            })
            .collect();
        out.sort();
        out
    }
}

fn tar_err(path: &Path) -> impl FnOnce(io::Error) -> PinError + '_ {
    move |source| PinError::Io {
        path: path.to_owned(),
        source,
    }
}

fn append_tree(b: &mut tar::Builder<Vec<u8>>, root: &Path, rel: &Path) -> Result<(), PinError> {
    let dir = root.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .map_err(tar_err(&dir))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(tar_err(&dir))?;
    names.sort();
    for name in names {
        let child = rel.join(&name);
        let path = root.join(&child);
        let meta = fs::symlink_metadata(&path).map_err(tar_err(&path))?;
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        let ft = meta.file_type();
        if ft.is_symlink() {
            let target = fs::read_link(&path).map_err(tar_err(&path))?;
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_mode(0o777);
            b.append_link(&mut h, &child, &target)
                .map_err(tar_err(&path))?;
        } else if ft.is_dir() {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            h.set_mode(0o755);
            b.append_data(&mut h, &child, io::empty())
                .map_err(tar_err(&path))?;
            append_tree(b, root, &child)?;
        } else if ft.is_file() {
            use std::os::unix::fs::PermissionsExt;
            let exec = meta.permissions().mode() & 0o111 != 0;
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(meta.len());
            h.set_mode(if exec { 0o755 } else { 0o644 });
            let f = fs::File::open(&path).map_err(tar_err(&path))?;
            b.append_data(&mut h, &child, f).map_err(tar_err(&path))?;
        } else {
            return Err(PinError::Special { path });
        }
    }
    Ok(())
}

/// Unpacks `archive` into the empty directory `dst`, refusing anything a
/// pin cannot hold (see the module).
fn unpack(plugin: &str, archive: &[u8], dst: &Path) -> Result<(), PinError> {
    let limits = DigestLimits::default();
    let mut entries = 0usize;
    let mut bytes = 0u64;
    let mut tar = tar::Archive::new(archive);
    let iter = tar
        .entries()
        .map_err(|e| unpack_err(plugin, format!("not a tar: {e}")))?;
    for entry in iter {
        let mut entry = entry.map_err(|e| unpack_err(plugin, format!("damaged tar: {e}")))?;
        entries += 1;
        if entries > limits.max_files {
            return Err(unpack_err(
                plugin,
                format!("more than {} entries", limits.max_files),
            ));
        }
        let raw = entry
            .path()
            .map_err(|e| unpack_err(plugin, format!("bad entry name: {e}")))?
            .into_owned();
        let rel = plain_relative(&raw).ok_or_else(|| {
            unpack_err(
                plugin,
                format!("entry {raw:?} is not a plain relative path"),
            )
        })?;
        if rel.components().count() > limits.max_depth {
            return Err(unpack_err(
                plugin,
                format!("entry {raw:?} is nested too deep"),
            ));
        }
        let parent = rel.parent().unwrap_or(Path::new(""));
        // Every ancestor must be a real directory made by this unpacking:
        // a path through a symlink could land outside the pin.
        let mut at = dst.to_path_buf();
        for c in parent.components() {
            at.push(c);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(unpack_err(
                        plugin,
                        format!("entry {raw:?} passes through a link or a file"),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(&at).map_err(tar_err(&at))?;
                }
                Err(e) => return Err(tar_err(&at)(e)),
            }
        }
        let out = dst.join(&rel);
        let exists = fs::symlink_metadata(&out).is_ok();
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                if !exists {
                    fs::create_dir(&out).map_err(tar_err(&out))?;
                } else if !fs::symlink_metadata(&out)
                    .map(|m| m.is_dir())
                    .unwrap_or(false)
                {
                    return Err(unpack_err(plugin, format!("entry {raw:?} appears twice")));
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if exists {
                    return Err(unpack_err(plugin, format!("entry {raw:?} appears twice")));
                }
                let size = entry.header().size().unwrap_or(u64::MAX);
                bytes = bytes.saturating_add(size);
                if bytes > limits.max_bytes {
                    return Err(unpack_err(
                        plugin,
                        format!("more than {} bytes", limits.max_bytes),
                    ));
                }
                let exec = entry.header().mode().unwrap_or(0) & 0o111 != 0;
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(if exec { 0o700 } else { 0o600 })
                    .open(&out)
                    .map_err(tar_err(&out))?;
                let copied =
                    io::copy(&mut (&mut entry).take(size), &mut f).map_err(tar_err(&out))?;
                if copied != size {
                    return Err(unpack_err(plugin, format!("entry {raw:?} is truncated")));
                }
            }
            tar::EntryType::Symlink => {
                if exists {
                    return Err(unpack_err(plugin, format!("entry {raw:?} appears twice")));
                }
                let target = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| unpack_err(plugin, format!("link {raw:?} has no target")))?;
                if target.is_absolute() || !crate::pin::lexically_inside(parent, &target) {
                    return Err(unpack_err(
                        plugin,
                        format!("link {raw:?} points outside the pin (to {target:?})"),
                    ));
                }
                symlink(&target, &out).map_err(tar_err(&out))?;
            }
            other => {
                return Err(unpack_err(
                    plugin,
                    format!("entry {raw:?} is a {other:?}, which a pin never holds"),
                ));
            }
        }
    }
    Ok(())
}

/// `p` if it is made of plain names only (no root, `.`, `..`), else `None`.
fn plain_relative(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn plugin_dir(root: &Path) -> PathBuf {
        let src = root.join("p");
        fs::create_dir_all(src.join("lib")).unwrap();
        fs::write(src.join("main.py"), "print(1)\n").unwrap();
        fs::write(src.join("run.sh"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(src.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(src.join("lib/util.py"), "x = 1\n").unwrap();
        symlink("lib/util.py", src.join("rel.py")).unwrap();
        src
    }

    #[test]
    fn a_pin_travels_to_another_workspace_and_verifies_there() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let src = plugin_dir(a.path());
        let pins_a = Pins::new(&a.path().join(".plugd"));
        let pin = pins_a.create("p", &src).unwrap();
        let tar = pins_a.archive("p", &pin.dir_digest).unwrap();
        let pins_b = Pins::new(&b.path().join(".plugd"));
        assert!(matches!(
            pins_b.verify("p", &pin.dir_digest),
            Err(PinError::Missing { .. })
        ));
        let adopted = pins_b.adopt("p", &pin.dir_digest, &tar).unwrap();
        assert_eq!(pins_b.verify("p", &pin.dir_digest).unwrap(), adopted);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&adopted.join("run.sh")), 0o555);
        assert_eq!(mode(&adopted.join("main.py")), 0o444);
        assert_eq!(pins_b.current("p").unwrap(), adopted);
        // Adopting again (another node raced it) keeps the intact pin.
        assert_eq!(pins_b.adopt("p", &pin.dir_digest, &tar).unwrap(), adopted);
    }

    #[test]
    fn a_package_directory_travels_and_only_its_own_digest_is_accepted() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let src = plugin_dir(a.path());
        let digest = plugin_digest(&src, &DigestLimits::default()).unwrap();
        let tar = archive_dir(&src).unwrap();
        let root = b.path().join("cluster-packages");
        // A lying blob (one byte changed) is refused and leaves nothing.
        let mut lie = tar.clone();
        let at = lie.windows(9).position(|w| w == b"print(1)\n").unwrap();
        lie[at + 6] = b'2';
        let e = adopt_dir(&root, "pkg-x", "package p", &digest, &lie).unwrap_err();
        assert!(e.to_string().contains("not the installed"), "{e}");
        assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
        // The true one lands read-only under its name, and again is a no-op.
        let dir = adopt_dir(&root, "pkg-x", "package p", &digest, &tar).unwrap();
        assert_eq!(dir, root.join("pkg-x"));
        assert_eq!(
            plugin_digest(&dir, &DigestLimits::default()).unwrap(),
            digest
        );
        let mode = fs::metadata(dir.join("main.py"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o444);
        assert_eq!(
            adopt_dir(&root, "pkg-x", "package p", &digest, &tar).unwrap(),
            dir
        );
        assert_eq!(fs::read_dir(&root).unwrap().count(), 1, "no staging left");
    }

    #[test]
    fn a_copy_that_is_not_the_approved_one_is_refused_and_leaves_nothing() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let src = plugin_dir(a.path());
        let pins_a = Pins::new(&a.path().join(".plugd"));
        let pin = pins_a.create("p", &src).unwrap();
        let mut tar = pins_a.archive("p", &pin.dir_digest).unwrap();
        // Flip one byte of main.py's content (the blob store lied).
        let at = tar.windows(9).position(|w| w == b"print(1)\n").unwrap();
        tar[at + 6] = b'2';
        let pins_b = Pins::new(&b.path().join(".plugd"));
        let e = pins_b.adopt("p", &pin.dir_digest, &tar).unwrap_err();
        assert!(e.to_string().contains("not the approved"), "{e}");
        let left: Vec<_> = fs::read_dir(pins_b.root())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "by-plugin" && n != ".lock")
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(pins_b.current("p").is_none());
    }

    fn raw(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            if *kind == tar::EntryType::Symlink || *kind == tar::EntryType::Link {
                h.set_size(0);
                b.append_link(&mut h, name, data).unwrap();
            } else {
                h.set_size(data.len() as u64);
                // Bypass the builder's own path checks: write the name raw.
                let bytes = name.as_bytes();
                h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
                h.set_cksum();
                b.append(&h, data.as_bytes()).unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn hostile_archives_are_refused_naming_the_entry() {
        use tar::EntryType as K;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (raw(&[("../evil", K::Regular, "x")]), "plain relative"),
            (raw(&[("/etc/evil", K::Regular, "x")]), "plain relative"),
            (raw(&[("l", K::Symlink, "/etc/passwd")]), "outside the pin"),
            (raw(&[("l", K::Symlink, "../x")]), "outside the pin"),
            // A link to the root, then a file written through it.
            (
                raw(&[("d", K::Symlink, "."), ("d/x", K::Regular, "x")]),
                "through a link",
            ),
            (raw(&[("h", K::Link, "main.py")]), "never holds"),
            (raw(&[("f", K::Fifo, "")]), "never holds"),
            (
                raw(&[("a", K::Regular, "1"), ("a", K::Regular, "2")]),
                "twice",
            ),
            (b"not a tar at all, just bytes that go on".repeat(40), "tar"),
        ];
        for (i, (tar, want)) in cases.into_iter().enumerate() {
            let b = tempfile::tempdir().unwrap();
            let pins = Pins::new(&b.path().join(".plugd"));
            let e = pins
                .adopt("p", "sha256:00", &tar)
                .expect_err(&format!("case {i} must be refused"));
            assert!(e.to_string().contains(want), "case {i}: {e}");
            assert!(!b.path().join("evil").exists());
        }
    }
}
