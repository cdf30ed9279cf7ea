//! The files layer: a deterministic tar of a package's files (written on
//! push), and its bounded extraction (on install).
//!
//! Extraction accepts regular files and directories only, each with a plain
//! relative path ([`check_path`]): a symlink, a hard link, a device, a path
//! with `..` or a leading `/` is refused naming the entry, before anything
//! of it is written. Entry count, each size and the total are checked
//! against [`Limits`] as the headers arrive; a name appearing twice is
//! refused (no entry overwrites another). Every file passes the secret check.

use std::io::{Cursor, Read, Write};
use std::path::Path;

use crate::scan::{PackageFile, check_path, check_secret, too_big, too_many_files};
use crate::{Limits, MANIFEST_FILES, PackageError, SIGNATURE_FILE};

/// Writes `files` as an uncompressed tar: GNU headers, sorted as given,
/// mode 0644 or 0755, owner 0, mtime 0, so the same files give the same bytes.
pub fn write_tar(files: &[PackageFile]) -> Result<Vec<u8>, PackageError> {
    let mut b = tar::Builder::new(Vec::new());
    for f in files {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(f.data.len() as u64);
        h.set_mode(if f.executable { 0o755 } else { 0o644 });
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        b.append_data(&mut h, &f.path, f.data.as_slice())
            .map_err(|e| PackageError::io(&f.path, e))?;
    }
    b.into_inner().map_err(|e| PackageError::io("tar", e))
}

/// What [`extract`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extracted {
    /// Regular files written.
    pub files: u64,
    /// Their total size.
    pub bytes: u64,
    /// Whether `marketplace.signature.json` is among them at the root.
    pub signature: bool,
}

/// Extracts the tar `data` into `dest` (an empty directory) within `limits`,
/// counting `already` files and `already_bytes` bytes as used (the manifest).
pub fn extract(
    data: &[u8],
    dest: &Path,
    limits: &Limits,
    already: u64,
    already_bytes: u64,
) -> Result<Extracted, PackageError> {
    extract_entries(data, dest, limits, already, already_bytes, false)
}

/// Extracts a whole package archive (an uploaded tar of a package
/// directory: the manifest among its files) into `dest` within `limits`,
/// under the rules of [`extract`]; entry names may start with `./`, as
/// `tar -C DIR -cf OUT .` writes them.
pub fn extract_package(
    data: &[u8],
    dest: &Path,
    limits: &Limits,
) -> Result<Extracted, PackageError> {
    extract_entries(data, dest, limits, 0, 0, true)
}

fn extract_entries(
    data: &[u8],
    dest: &Path,
    limits: &Limits,
    already: u64,
    already_bytes: u64,
    whole: bool,
) -> Result<Extracted, PackageError> {
    let mut archive = tar::Archive::new(Cursor::new(data));
    let entries = archive
        .entries()
        .map_err(|e| not_a_tar(format!("cannot read it: {e}")))?;
    let mut out = Extracted {
        files: 0,
        bytes: 0,
        signature: false,
    };
    let mut seen = 0u64;
    for entry in entries {
        let mut entry = entry.map_err(|e| not_a_tar(format!("a damaged entry: {e}")))?;
        seen += 1;
        if already + seen > limits.max_files {
            return Err(too_many_files(limits));
        }
        let raw = entry.path_bytes().into_owned();
        let path = String::from_utf8(raw).map_err(|e| PackageError::BadEntry {
            path: String::from_utf8_lossy(e.as_bytes()).into_owned(),
            why: "has a name that is not UTF-8".to_owned(),
        })?;
        let kind = entry.header().entry_type();
        let path = if kind.is_dir() {
            path.trim_end_matches('/').to_owned()
        } else {
            path
        };
        let path = match path.strip_prefix("./") {
            Some(rest) if whole => rest.to_owned(),
            _ => path,
        };
        if whole && kind.is_dir() && (path.is_empty() || path == ".") {
            // The root itself (`./`).
            continue;
        }
        check_path(&path, limits)?;
        let target = dest.join(&path);
        if kind.is_dir() {
            std::fs::create_dir_all(&target).map_err(|e| PackageError::io(&target, e))?;
            continue;
        }
        if !kind.is_file() {
            return Err(PackageError::BadEntry {
                path,
                why: format!(
                    "is a {} in the files layer; a package holds regular files and directories only",
                    kind_name(kind)
                ),
            });
        }
        if !whole && MANIFEST_FILES.contains(&path.as_str()) {
            return Err(PackageError::BadEntry {
                path,
                why: "is in the files layer, but the manifest travels in its own layer".to_owned(),
            });
        }
        let size = entry.size();
        if already_bytes.saturating_add(out.bytes).saturating_add(size) > limits.max_total_bytes {
            return Err(too_big(limits));
        }
        let mut content = Vec::with_capacity(usize::try_from(size.min(1 << 20)).unwrap_or(0));
        (&mut entry)
            .take(size)
            .read_to_end(&mut content)
            .map_err(|e| not_a_tar(format!("entry {path:?} cannot be read: {e}")))?;
        if content.len() as u64 != size {
            return Err(not_a_tar(format!("entry {path:?} is truncated")));
        }
        check_secret(&path, &content)?;
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| PackageError::io(parent, e))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&target)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => PackageError::BadEntry {
                    path: path.clone(),
                    why: "appears twice in the files layer".to_owned(),
                },
                _ => PackageError::io(&target, e),
            })?;
        f.write_all(&content)
            .map_err(|e| PackageError::io(&target, e))?;
        let exec = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
        if exec {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(0o755))
                .map_err(|e| PackageError::io(&target, e))?;
        }
        out.files += 1;
        out.bytes += size;
        out.signature |= path == SIGNATURE_FILE;
    }
    Ok(out)
}

fn kind_name(kind: tar::EntryType) -> &'static str {
    match kind {
        tar::EntryType::Symlink => "symlink",
        tar::EntryType::Link => "hard link",
        tar::EntryType::Char | tar::EntryType::Block => "device",
        tar::EntryType::Fifo => "FIFO",
        _ => "special entry",
    }
}

fn not_a_tar(detail: String) -> PackageError {
    PackageError::BadEntry {
        path: "(files layer)".to_owned(),
        why: format!("is not a usable tar: {detail}"),
    }
}

/// Makes everything under `root` read-only: files 0444 (0555 when
/// executable), directories 0555, `root` included.
pub fn make_read_only(root: &Path) -> Result<(), PackageError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(root).map_err(|e| PackageError::io(root, e))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(root).map_err(|e| PackageError::io(root, e))? {
            let entry = entry.map_err(|e| PackageError::io(root, e))?;
            make_read_only(&entry.path())?;
        }
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o555))
    } else {
        let mode = if meta.permissions().mode() & 0o111 != 0 {
            0o555
        } else {
            0o444
        };
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(mode))
    }
    .map_err(|e| PackageError::io(root, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar entry with a raw name (the tar crate's own writer refuses `..`).
    fn raw_entry(b: &mut tar::Builder<Vec<u8>>, name: &str, kind: tar::EntryType, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        if matches!(kind, tar::EntryType::Symlink | tar::EntryType::Link) {
            h.set_link_name("/etc/passwd").unwrap();
        }
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            raw_entry(&mut b, name, *kind, data);
        }
        b.into_inner().unwrap()
    }

    fn try_extract(
        data: &[u8],
        limits: &Limits,
    ) -> (tempfile::TempDir, Result<Extracted, PackageError>) {
        let dest = tempfile::tempdir().unwrap();
        let r = extract(data, dest.path(), limits, 1, 0);
        (dest, r)
    }

    const FILE: tar::EntryType = tar::EntryType::Regular;

    #[test]
    fn a_written_tar_extracts_to_the_same_files_and_is_deterministic() {
        let files = vec![
            PackageFile {
                path: "bin/plugin".into(),
                data: b"#!/bin/sh\n".to_vec(),
                executable: true,
            },
            PackageFile {
                path: format!("{}/long.json", "d".repeat(150)),
                data: b"{}".to_vec(),
                executable: false,
            },
        ];
        let tar = write_tar(&files).unwrap();
        assert_eq!(tar, write_tar(&files).unwrap());
        let (dest, r) = try_extract(&tar, &Limits::default());
        let r = r.unwrap();
        assert_eq!((r.files, r.bytes, r.signature), (2, 12, false));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dest.path().join("bin/plugin"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111);
        make_read_only(dest.path()).unwrap();
        let mode = std::fs::metadata(dest.path().join("bin"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o555);
    }

    #[test]
    fn entries_that_escape_are_refused_and_nothing_lands_outside() {
        let outside = tempfile::tempdir().unwrap();
        let escape = format!(
            "../{}/pwned",
            outside.path().file_name().unwrap().to_str().unwrap()
        );
        for (name, why) in [
            (escape.as_str(), "escapes"),
            ("a/../../pwned", "escapes"),
            ("/tmp/pwned-abs", "absolute"),
        ] {
            let (_d, r) = try_extract(&tar_of(&[(name, FILE, b"x")]), &Limits::default());
            let e = r.unwrap_err().to_string();
            assert!(e.contains(&format!("{name:?}")) && e.contains(why), "{e}");
        }
        assert!(!Path::new("/tmp/pwned-abs").exists());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn links_and_devices_are_refused() {
        for (kind, word) in [
            (tar::EntryType::Symlink, "symlink"),
            (tar::EntryType::Link, "hard link"),
            (tar::EntryType::Char, "device"),
            (tar::EntryType::Fifo, "FIFO"),
        ] {
            let (d, r) = try_extract(&tar_of(&[("bin/x", kind, b"")]), &Limits::default());
            let e = r.unwrap_err().to_string();
            assert!(e.contains("\"bin/x\"") && e.contains(word), "{e}");
            assert!(!d.path().join("bin/x").exists());
        }
    }

    #[test]
    fn counts_and_sizes_are_bounded() {
        let limits = Limits {
            max_files: 3,
            max_total_bytes: 10,
            ..Limits::default()
        };
        let three = tar_of(&[("a", FILE, b"1"), ("b", FILE, b"2"), ("c", FILE, b"3")]);
        let (_d, r) = try_extract(&three, &limits);
        assert!(r.unwrap_err().to_string().contains("3 files"));
        let big = tar_of(&[("a", FILE, b"0123456789x")]);
        let (_d, r) = try_extract(&big, &limits);
        assert!(r.unwrap_err().to_string().contains("total size"));
        let deep = vec!["d"; 40].join("/");
        let (_d, r) = try_extract(&tar_of(&[(&deep, FILE, b"")]), &Limits::default());
        assert!(r.unwrap_err().to_string().contains("deep"));
    }

    #[test]
    fn duplicates_manifests_and_secrets_in_the_layer_are_refused() {
        let twice = tar_of(&[("a", FILE, b"1"), ("a", FILE, b"2")]);
        let (d, r) = try_extract(&twice, &Limits::default());
        assert!(r.unwrap_err().to_string().contains("twice"));
        assert_eq!(std::fs::read(d.path().join("a")).unwrap(), b"1");
        let manifest = tar_of(&[("vai-plugin.toml", FILE, b"")]);
        let (_d, r) = try_extract(&manifest, &Limits::default());
        assert!(r.unwrap_err().to_string().contains("own layer"));
        let env = tar_of(&[("conf/.env", FILE, b"TOKEN=1")]);
        let (d, r) = try_extract(&env, &Limits::default());
        assert!(r.unwrap_err().to_string().contains("\"conf/.env\""));
        assert!(!d.path().join("conf/.env").exists());
        let (_d, r) = try_extract(b"not a tar at all, just some bytes", &Limits::default());
        assert!(r.is_err());
    }
}
