//! Reading a package directory: its manifest (validated by `plugd-manifest`),
//! its files within [`Limits`], and the secret check every file passes on
//! push and again on install.
//!
//! The secret check refuses, naming the file: `.env` and `.env.*` files
//! (any directory), and any file whose content holds a PEM private key
//! (`-----BEGIN … PRIVATE KEY-----`: RSA, EC, OpenSSH, PKCS#8, encrypted),
//! which covers `*.pem` and `id_*` key files. Symlinks, hard-linked
//! duplicates and special files are refused too: a package is regular files
//! and directories.

use std::path::{Path, PathBuf};

use plugd_control::PackageExport;
use plugd_manifest::{LoadOptions, PluginSpec};

use crate::{Limits, MANIFEST_FILES, PackageError};

/// One file of a package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageFile {
    /// Its path below the package root, `/`-separated.
    pub path: String,
    /// Its bytes.
    pub data: Vec<u8>,
    /// Whether it is executable (0755 rather than 0644).
    pub executable: bool,
}

/// A package directory, read and checked.
#[derive(Debug)]
pub struct PackageDir {
    /// The manifest file's name (one of [`MANIFEST_FILES`]).
    pub manifest_file: &'static str,
    /// The manifest's bytes.
    pub manifest: Vec<u8>,
    /// What the manifest declares.
    pub info: ManifestInfo,
    /// Every other file, sorted by path.
    pub files: Vec<PackageFile>,
}

impl PackageDir {
    /// Files including the manifest.
    pub fn file_count(&self) -> u64 {
        self.files.len() as u64 + 1
    }

    /// Their total size.
    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.data.len() as u64).sum::<u64>() + self.manifest.len() as u64
    }
}

/// What a validated manifest says of its package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestInfo {
    /// The package (plugin) id.
    pub package_id: String,
    /// Its version.
    pub version: String,
    /// Its exports.
    pub exports: Vec<PackageExport>,
}

/// Finds the manifest at `dir`'s root and validates it with the loaders of
/// `plugd-manifest` (which also check that the files it names exist inside
/// `dir`).
pub fn load_manifest(dir: &Path) -> Result<(&'static str, ManifestInfo), PackageError> {
    let opts = LoadOptions::default();
    for name in MANIFEST_FILES {
        let path = dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(PackageError::io(path, e)),
        }
        let spec = if name == plugd_manifest::vai::VAI_MANIFEST_FILE {
            plugd_manifest::vai::load_vai(&path, &opts)?
        } else {
            plugd_manifest::load_native(&path, &opts)?
        };
        return Ok((name, info_of(&spec)));
    }
    Err(PackageError::NoManifest {
        dir: dir.to_path_buf(),
    })
}

fn info_of(spec: &PluginSpec) -> ManifestInfo {
    let exports = match &spec.vai {
        Some(vai) => vai
            .exports
            .iter()
            .map(|e| PackageExport {
                id: e.id.clone(),
                kind: e.kind.as_str().to_owned(),
                display_name: e.display_name.clone(),
                execution_class: serde_json::to_value(e.execution_class)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned)),
            })
            .collect(),
        None => spec
            .declared_tools
            .iter()
            .map(|t| PackageExport {
                id: t.clone(),
                kind: "tool".to_owned(),
                display_name: None,
                execution_class: None,
            })
            .collect(),
    };
    ManifestInfo {
        package_id: spec.id.clone(),
        version: spec.version.clone(),
        exports,
    }
}

/// Reads the package in `dir`: validates its manifest, reads every other
/// file within `limits`, and refuses secrets, links and special files.
pub fn read_package_dir(dir: &Path, limits: &Limits) -> Result<PackageDir, PackageError> {
    let (manifest_file, info) = load_manifest(dir)?;
    let manifest_path = dir.join(manifest_file);
    let manifest =
        std::fs::read(&manifest_path).map_err(|e| PackageError::io(&manifest_path, e))?;
    check_secret(manifest_file, &manifest)?;
    let mut walk = Walk {
        limits,
        manifest_file,
        files: Vec::new(),
        total: manifest.len() as u64,
    };
    walk.dir(dir, "", 0)?;
    let mut files = walk.files;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(PackageDir {
        manifest_file,
        manifest,
        info,
        files,
    })
}

struct Walk<'a> {
    limits: &'a Limits,
    manifest_file: &'static str,
    files: Vec<PackageFile>,
    total: u64,
}

impl Walk<'_> {
    fn dir(&mut self, abs: &Path, rel: &str, depth: usize) -> Result<(), PackageError> {
        let entries = std::fs::read_dir(abs).map_err(|e| PackageError::io(abs, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| PackageError::io(abs, e))?;
            let name = entry.file_name();
            let child_abs: PathBuf = entry.path();
            let Some(name) = name.to_str() else {
                return Err(PackageError::BadEntry {
                    path: child_abs.display().to_string(),
                    why: "has a name that is not UTF-8; rename it".to_owned(),
                });
            };
            if rel.is_empty() && name == self.manifest_file {
                continue;
            }
            let child = if rel.is_empty() {
                name.to_owned()
            } else {
                format!("{rel}/{name}")
            };
            check_path(&child, self.limits)?;
            let meta = std::fs::symlink_metadata(&child_abs)
                .map_err(|e| PackageError::io(&child_abs, e))?;
            let kind = meta.file_type();
            if kind.is_dir() {
                if depth + 1 >= self.limits.max_depth {
                    return Err(too_deep(&child, self.limits));
                }
                self.dir(&child_abs, &child, depth + 1)?;
            } else if kind.is_file() {
                self.file(&child_abs, child, &meta)?;
            } else {
                let what = if kind.is_symlink() {
                    "a symlink"
                } else {
                    "not a regular file or directory"
                };
                return Err(PackageError::BadEntry {
                    path: child,
                    why: format!(
                        "is {what}; a package holds regular files and directories only: copy the target in instead"
                    ),
                });
            }
        }
        Ok(())
    }

    fn file(
        &mut self,
        abs: &Path,
        rel: String,
        meta: &std::fs::Metadata,
    ) -> Result<(), PackageError> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if meta.nlink() > 1 {
            return Err(PackageError::BadEntry {
                path: rel,
                why: "has other hard links; copy it so the package holds its own file".to_owned(),
            });
        }
        if self.files.len() as u64 + 2 > self.limits.max_files {
            return Err(too_many_files(self.limits));
        }
        self.total = self.total.saturating_add(meta.len());
        if self.total > self.limits.max_total_bytes {
            return Err(too_big(self.limits));
        }
        let data = std::fs::read(abs).map_err(|e| PackageError::io(abs, e))?;
        self.total = self.total - meta.len() + data.len() as u64;
        if self.total > self.limits.max_total_bytes {
            return Err(too_big(self.limits));
        }
        check_secret(&rel, &data)?;
        self.files.push(PackageFile {
            path: rel,
            data,
            executable: meta.permissions().mode() & 0o111 != 0,
        });
        Ok(())
    }
}

/// Refuses `path` (relative, `/`-separated) when it is not plain: empty,
/// absolute, `.` or `..` components, NUL or backslash, too long or too deep.
pub fn check_path(path: &str, limits: &Limits) -> Result<(), PackageError> {
    let bad = |why: &str| PackageError::BadEntry {
        path: path.to_owned(),
        why: why.to_owned(),
    };
    if path.len() > limits.max_path_bytes {
        return Err(bad(&format!(
            "has a path over {} bytes; shorten it",
            limits.max_path_bytes
        )));
    }
    if path.starts_with('/') {
        return Err(bad(
            "is an absolute path; package paths are relative to the package root",
        ));
    }
    if path.contains('\0') || path.contains('\\') {
        return Err(bad("has a NUL or backslash in its path"));
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(bad(
            "escapes or is not a plain path (empty, \".\" or \"..\" components); package paths stay inside the package",
        ));
    }
    if parts.len() > limits.max_depth {
        return Err(too_deep(path, limits));
    }
    Ok(())
}

/// Refuses a file that looks like a secret: `.env` / `.env.*` by name, or a
/// PEM private key in its content.
pub fn check_secret(path: &str, data: &[u8]) -> Result<(), PackageError> {
    let name = path.rsplit('/').next().unwrap_or(path);
    if name == ".env" || name.starts_with(".env.") {
        return Err(PackageError::Secret {
            path: path.to_owned(),
            why: "is an .env file (environment secrets)",
        });
    }
    if has_private_key(data) {
        return Err(PackageError::Secret {
            path: path.to_owned(),
            why: "holds a private key (-----BEGIN ... PRIVATE KEY-----)",
        });
    }
    Ok(())
}

/// Whether `data` holds a PEM private-key header: `-----BEGIN `, up to 64
/// upper-case letters, digits and spaces ending in `PRIVATE KEY`, `-----`.
pub fn has_private_key(data: &[u8]) -> bool {
    const BEGIN: &[u8] = b"-----BEGIN ";
    let mut from = 0;
    while let Some(at) = find(&data[from..], BEGIN) {
        let label_start = from + at + BEGIN.len();
        let rest = &data[label_start..];
        let len = rest
            .iter()
            .take(64)
            .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || **b == b' ')
            .count();
        if rest[..len].ends_with(b"PRIVATE KEY") && rest[len..].starts_with(b"-----") {
            return true;
        }
        from = label_start;
    }
    false
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        match hay[i..].iter().position(|b| *b == first) {
            None => return None,
            Some(p) => i += p,
        }
        if hay[i..].starts_with(needle) {
            return Some(i);
        }
        i += 1;
    }
    None
}

pub(crate) fn too_many_files(limits: &Limits) -> PackageError {
    PackageError::TooLarge {
        what: "the package's file count".to_owned(),
        limit: format!("{} files", limits.max_files),
        hint: "ship fewer files (an archive of assets counts as one)",
    }
}

pub(crate) fn too_big(limits: &Limits) -> PackageError {
    PackageError::TooLarge {
        what: "the package's total size".to_owned(),
        limit: format!("{} MiB", limits.max_total_bytes >> 20),
        hint: "leave build outputs and data sets out of the package",
    }
}

fn too_deep(path: &str, limits: &Limits) -> PackageError {
    PackageError::BadEntry {
        path: path.to_owned(),
        why: format!(
            "is nested over {} directories deep; flatten the package",
            limits.max_depth
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_header(kind: &str) -> String {
        // Built at run time so this source file holds no key header itself.
        format!("-----BEGIN {kind}PRIVATE KEY-----\nMIIE\n")
    }

    #[test]
    fn env_files_and_private_keys_are_refused_by_name() {
        for p in [".env", "config/.env", ".env.production", "a/b/.env.local"] {
            let e = check_secret(p, b"X=1").unwrap_err().to_string();
            assert!(e.contains(&format!("{p:?}")) && e.contains(".env"), "{e}");
        }
        for kind in ["", "RSA ", "EC ", "OPENSSH ", "ENCRYPTED "] {
            let data = format!("junk\n{}", key_header(kind));
            let e = check_secret("keys/server.pem", data.as_bytes()).unwrap_err();
            assert!(e.to_string().contains("\"keys/server.pem\""), "{e}");
        }
        for ok in [
            "env",
            ".envrc.d/x",
            "README.md",
            "-----BEGIN PUBLIC KEY-----",
            "-----BEGIN CERTIFICATE-----",
        ] {
            check_secret(ok, ok.as_bytes()).unwrap();
        }
        assert!(!has_private_key(b"-----BEGIN PRIVATE KEY"));
        assert!(!has_private_key(b"-----BEGIN "));
    }

    #[test]
    fn paths_that_are_not_plain_are_refused() {
        let l = Limits::default();
        for bad in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "a//b",
            "./a",
            "a/.",
            "a\\b",
            "",
        ] {
            assert!(check_path(bad, &l).is_err(), "{bad:?}");
        }
        check_path("bin/plugin", &l).unwrap();
        let deep = vec!["d"; l.max_depth + 1].join("/");
        assert!(
            check_path(&deep, &l)
                .unwrap_err()
                .to_string()
                .contains("deep")
        );
        let long = "x".repeat(l.max_path_bytes + 1);
        assert!(check_path(&long, &l).is_err());
    }

    #[test]
    fn a_directory_with_a_symlink_or_too_many_files_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(
            dir.join("nexo-plugin.toml"),
            "[plugin]\nid = \"p\"\nversion = \"0.1.0\"\n[plugin.entrypoint]\ncommand = \"/bin/true\"\n",
        )
        .unwrap();
        std::fs::write(dir.join("a.txt"), "a").unwrap();
        let pkg = read_package_dir(dir, &Limits::default()).unwrap();
        assert_eq!(pkg.files.len(), 1);
        assert_eq!(pkg.info.package_id, "p");
        let few = Limits {
            max_files: 1,
            ..Limits::default()
        };
        let e = read_package_dir(dir, &few).unwrap_err().to_string();
        assert!(e.contains("1 files"), "{e}");
        let small = Limits {
            max_total_bytes: 10,
            ..Limits::default()
        };
        let e = read_package_dir(dir, &small).unwrap_err().to_string();
        assert!(e.contains("total size"), "{e}");
        std::os::unix::fs::symlink("/etc/passwd", dir.join("link")).unwrap();
        let e = read_package_dir(dir, &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"link\" is a symlink"), "{e}");
    }
}
