//! The signature file `marketplace.signature.json` (format `plugd-signature/1`):
//! the file listing of a plugin directory, its canonical form, the signed
//! payload, signing, and verification that names what changed.
//!
//! docs/signatures.md is the normative description; the rules in short:
//!
//! * **Files.** Every regular file below the plugin directory except the
//!   top-level `marketplace.signature.json`, keyed by its path relative to the
//!   directory: UTF-8, `/` separators, no empty, `.` or `..` components, no
//!   control characters. Directories are not listed (an empty directory is
//!   not signed). A symlink, fifo, socket or device anywhere in the tree makes
//!   signing and verification fail: a signed plugin holds only regular files.
//!   Mode bits are not signed (the approval digest pins the executable bit).
//! * **Canonical listing.** For each file in byte order of its path, the line
//!   `sha256:<64 lower-case hex> <two spaces> <path> "\n"` (the `sha256sum`
//!   layout); `digest` is `sha256:` and the hex SHA-256 of those lines.
//! * **Payload.** The Ed25519 signature covers the UTF-8 bytes of
//!   `plugd-signature/1\ned25519\n<key_id>\n<signed_at>\n<digest>\n`.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use plugd_store::digest::DigestLimits;
use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::keys;

/// The signature file's name inside the plugin directory (the VAI marketplace's name).
pub const SIGNATURE_FILE: &str = "marketplace.signature.json";

/// The `format` this plugd writes and reads.
pub const FORMAT: &str = "plugd-signature/1";

/// The only `algorithm`.
pub const ALGORITHM: &str = "ed25519";

/// Largest signature file read (8 MiB: 20 000 files with long paths fit).
pub const MAX_SIGNATURE_BYTES: u64 = 8 * 1024 * 1024;

/// Longest `signed_at` accepted.
const MAX_SIGNED_AT: usize = 64;

/// `marketplace.signature.json`, field by field, in the order it is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureFile {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`ALGORITHM`].
    pub algorithm: String,
    /// The signer's public key, standard base64 of its 32 bytes.
    pub public_key: String,
    /// [`keys::key_id`] of `public_key`.
    pub key_id: String,
    /// When it was signed (RFC 3339, UTC); signed, so it cannot be changed.
    pub signed_at: String,
    /// `sha256:<hex>` of the canonical listing of `files`.
    pub digest: String,
    /// Relative path → `sha256:<hex>` of the file's bytes.
    pub files: BTreeMap<String, String>,
    /// Standard base64 of the 64-byte Ed25519 signature over [`payload`].
    pub signature: String,
}

/// How a file differs from what was signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "path", rename_all = "snake_case")]
pub enum FileChange {
    /// Its bytes differ.
    Changed(String),
    /// It is in the directory but was not signed.
    Added(String),
    /// It was signed but is gone.
    Removed(String),
}

impl std::fmt::Display for FileChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileChange::Changed(p) => write!(f, "{p} changed"),
            FileChange::Added(p) => write!(f, "{p} added"),
            FileChange::Removed(p) => write!(f, "{p} removed"),
        }
    }
}

/// Why a plugin directory could not be signed or its signature verified.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// There is no signature file.
    #[error("{} has no {SIGNATURE_FILE}", dir.display())]
    Unsigned {
        /// The plugin directory.
        dir: PathBuf,
    },
    /// The signature file is not JSON of the expected shape, or a field is invalid.
    #[error("{}: {message}; sign the plugin again with `plugd plugin sign`", path.display())]
    Malformed {
        /// The signature file.
        path: PathBuf,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The signature file is JSON in another tool's format (its `format` is
    /// not `plugd-signature/…`, e.g. a `vai-plugin-sign` file, whose layout
    /// is not published): plugd can neither verify nor refute it.
    #[error("{}: {} is not a format plugd can verify (it reads {FORMAT:?})", path.display(), format.as_deref().map(|f| format!("format {f:?}")).unwrap_or_else(|| "a file without a format".into()))]
    Foreign {
        /// The signature file.
        path: PathBuf,
        /// Its `format`, when it names one.
        format: Option<String>,
    },
    /// The signature does not verify with the public key the file names.
    #[error(
        "{}: the signature does not verify with its public_key (key id {key_id}): the file was altered or signed by another key; do not run this plugin, ask its publisher for a correctly signed copy",
        path.display()
    )]
    BadSignature {
        /// The signature file.
        path: PathBuf,
        /// The key id the file claims.
        key_id: String,
    },
    /// The signature is good but the files differ from what was signed.
    #[error(
        "{}: files differ from what key {key_id} signed: {}; restore the signed files, or review the change and sign again",
        dir.display(),
        summarize(changes)
    )]
    Tampered {
        /// The plugin directory.
        dir: PathBuf,
        /// The signer's key id.
        key_id: String,
        /// What differs, in path order.
        changes: Vec<FileChange>,
    },
    /// The tree holds something a signed plugin may not (a symlink, a special
    /// file, a name that is not UTF-8), or could not be read.
    #[error("{message}")]
    Tree {
        /// The entry, relative to the plugin directory.
        path: String,
        /// What is wrong and what to do.
        message: String,
    },
}

fn summarize(changes: &[FileChange]) -> String {
    const SHOWN: usize = 10;
    let mut s: Vec<String> = changes.iter().take(SHOWN).map(|c| c.to_string()).collect();
    if changes.len() > SHOWN {
        s.push(format!("and {} more", changes.len() - SHOWN));
    }
    s.join(", ")
}

/// The canonical listing of `files` (see the module doc).
pub fn canonical_listing(files: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (path, hash) in files {
        out.push_str(hash);
        out.push_str("  ");
        out.push_str(path);
        out.push('\n');
    }
    out
}

/// `sha256:<hex>` of the canonical listing of `files`.
pub fn listing_digest(files: &BTreeMap<String, String>) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(canonical_listing(files).as_bytes()))
    )
}

/// The bytes the Ed25519 signature covers.
pub fn payload(key_id: &str, signed_at: &str, digest: &str) -> Vec<u8> {
    format!("{FORMAT}\n{ALGORITHM}\n{key_id}\n{signed_at}\n{digest}\n").into_bytes()
}

/// Lists and hashes every file of the plugin directory `dir` (the signature
/// file excepted), refusing symlinks and special files, within `limits`.
pub fn list_files(
    dir: &Path,
    limits: &DigestLimits,
) -> Result<BTreeMap<String, String>, SignatureError> {
    let mut walk = Walk {
        limits,
        files: BTreeMap::new(),
        entries: 0,
        bytes: 0,
        buf: vec![0; 64 * 1024],
    };
    walk.dir(dir, "", 0)?;
    Ok(walk.files)
}

struct Walk<'a> {
    limits: &'a DigestLimits,
    files: BTreeMap<String, String>,
    entries: usize,
    bytes: u64,
    buf: Vec<u8>,
}

fn tree(path: &str, message: String) -> SignatureError {
    SignatureError::Tree {
        path: path.to_owned(),
        message,
    }
}

impl Walk<'_> {
    fn dir(&mut self, abs: &Path, rel: &str, depth: usize) -> Result<(), SignatureError> {
        let shown = if rel.is_empty() { "." } else { rel };
        let io_err = |e: io::Error| tree(shown, format!("cannot read {}: {e}", abs.display()));
        let mut names = Vec::new();
        for entry in fs::read_dir(abs).map_err(io_err)? {
            names.push(entry.map_err(io_err)?.file_name());
        }
        names.sort();
        for name in names {
            let path = abs.join(&name);
            let Some(name) = name.to_str() else {
                return Err(tree(
                    &path.display().to_string(),
                    format!(
                        "{}: the name is not UTF-8; a signed plugin's paths must be UTF-8, rename it",
                        path.display()
                    ),
                ));
            };
            if rel.is_empty() && name == SIGNATURE_FILE {
                continue;
            }
            let child = if rel.is_empty() {
                name.to_owned()
            } else {
                format!("{rel}/{name}")
            };
            if name.chars().any(char::is_control) {
                return Err(tree(
                    &child,
                    format!("{child:?}: the name holds a control character; rename it"),
                ));
            }
            if depth + 1 > self.limits.max_depth {
                return Err(tree(
                    &child,
                    format!(
                        "{child} is nested more than {} levels deep; flatten the tree",
                        self.limits.max_depth
                    ),
                ));
            }
            self.entries += 1;
            if self.entries > self.limits.max_files {
                return Err(tree(
                    &child,
                    format!(
                        "{} has more than {} entries; remove files from it",
                        abs.display(),
                        self.limits.max_files
                    ),
                ));
            }
            let meta = fs::symlink_metadata(&path)
                .map_err(|e| tree(&child, format!("cannot read {}: {e}", path.display())))?;
            let ft = meta.file_type();
            if ft.is_symlink() {
                let target = fs::read_link(&path)
                    .map(|t| t.display().to_string())
                    .unwrap_or_else(|_| "?".into());
                return Err(tree(
                    &child,
                    format!(
                        "{child} is a symlink (to {target:?}); a signed plugin may hold only regular files and directories: replace it with a copy of what it points to"
                    ),
                ));
            } else if ft.is_dir() {
                self.dir(&path, &child, depth + 1)?;
            } else if ft.is_file() {
                let hash = self.hash(&path, &child)?;
                self.files.insert(child, hash);
            } else {
                let kind = if ft.is_fifo() {
                    "fifo"
                } else if ft.is_socket() {
                    "socket"
                } else {
                    "device"
                };
                return Err(tree(
                    &child,
                    format!(
                        "{child} is a {kind}; a signed plugin may hold only regular files and directories"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn hash(&mut self, path: &Path, rel: &str) -> Result<String, SignatureError> {
        let io_err = |e: io::Error| tree(rel, format!("cannot read {}: {e}", path.display()));
        // NOFOLLOW and NONBLOCK: an entry swapped for a symlink or a fifo since
        // we looked fails to open or returns at once, never blocks.
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map_err(|e| io_err(e.into()))?;
        let mut file = File::from(fd);
        let meta = file.metadata().map_err(io_err)?;
        let changed = || {
            tree(
                rel,
                format!("{rel} changed while it was being hashed; try again"),
            )
        };
        if !meta.is_file() {
            return Err(changed());
        }
        self.bytes = self.bytes.saturating_add(meta.len());
        if self.bytes > self.limits.max_bytes {
            return Err(tree(
                rel,
                format!(
                    "the plugin holds more than {} bytes of files; remove files from it",
                    self.limits.max_bytes
                ),
            ));
        }
        let mut hasher = Sha256::new();
        let mut seen: u64 = 0;
        loop {
            let n = match file.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err(e)),
            };
            seen += n as u64;
            if seen > meta.len() {
                return Err(changed());
            }
            hasher.update(&self.buf[..n]);
        }
        if seen != meta.len() {
            return Err(changed());
        }
        Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
    }
}

/// Signs the plugin directory `dir` as it is now with `key` at `signed_at`;
/// the caller writes the result to `dir/`[`SIGNATURE_FILE`].
pub fn sign(
    dir: &Path,
    key: &SigningKey,
    signed_at: &str,
    limits: &DigestLimits,
) -> Result<SignatureFile, SignatureError> {
    let files = list_files(dir, limits)?;
    let public = key.verifying_key();
    let key_id = keys::key_id(&public);
    let digest = listing_digest(&files);
    let signature = key.sign(&payload(&key_id, signed_at, &digest));
    Ok(SignatureFile {
        format: FORMAT.to_owned(),
        algorithm: ALGORITHM.to_owned(),
        public_key: B64.encode(public.as_bytes()),
        key_id,
        signed_at: signed_at.to_owned(),
        digest,
        files,
        signature: B64.encode(signature.to_bytes()),
    })
}

/// Writes `sig` to `dir/`[`SIGNATURE_FILE`] (through a temporary file and a rename).
pub fn write(dir: &Path, sig: &SignatureFile) -> Result<PathBuf, String> {
    let path = dir.join(SIGNATURE_FILE);
    let tmp = dir.join(format!(".{SIGNATURE_FILE}.tmp"));
    let mut text = serde_json::to_string_pretty(sig).map_err(|e| e.to_string())?;
    text.push('\n');
    fs::write(&tmp, text)
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| {
            let _ = fs::remove_file(&tmp);
            format!("cannot write {}: {e}", path.display())
        })?;
    Ok(path)
}

/// A signature that verified: who signed, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verified {
    /// The signer's public key (`ed25519:<base64>`).
    pub public_key: String,
    /// Its key id.
    pub key_id: String,
    /// When it was signed, as the signer said (covered by the signature).
    pub signed_at: String,
    /// How many files it covers.
    pub files: usize,
    /// The listing digest.
    pub digest: String,
}

/// Verifies the signature of the plugin directory `dir`: reads and checks the
/// signature file field by field, verifies the Ed25519 signature, then
/// compares every file with what was signed.
pub fn verify(dir: &Path, limits: &DigestLimits) -> Result<Verified, SignatureError> {
    let path = dir.join(SIGNATURE_FILE);
    let text = match read_signature_file(&path)? {
        Some(t) => t,
        None => {
            return Err(SignatureError::Unsigned {
                dir: dir.to_owned(),
            });
        }
    };
    let (sig, public, signature) = parse(&text, &path, limits)?;
    if public
        .verify_strict(
            &payload(&sig.key_id, &sig.signed_at, &sig.digest),
            &signature,
        )
        .is_err()
    {
        return Err(SignatureError::BadSignature {
            path,
            key_id: sig.key_id,
        });
    }
    let now = list_files(dir, limits)?;
    let changes = compare(&sig.files, &now);
    if !changes.is_empty() {
        return Err(SignatureError::Tampered {
            dir: dir.to_owned(),
            key_id: sig.key_id,
            changes,
        });
    }
    Ok(Verified {
        public_key: keys::public_key_string(&public),
        key_id: sig.key_id,
        signed_at: sig.signed_at,
        files: sig.files.len(),
        digest: sig.digest,
    })
}

/// Parses and checks the text of a signature file (named `path` in errors)
/// field by field; returns it with its public key and signature, not yet
/// verified.
pub fn parse(
    text: &[u8],
    path: &Path,
    limits: &DigestLimits,
) -> Result<(SignatureFile, VerifyingKey, Signature), SignatureError> {
    let malformed = |message: String| SignatureError::Malformed {
        path: path.to_owned(),
        message,
    };
    if let Ok(serde_json::Value::Object(doc)) = serde_json::from_slice::<serde_json::Value>(text) {
        let format = doc.get("format").and_then(serde_json::Value::as_str);
        if !format.is_some_and(|f| f.starts_with("plugd-signature/")) {
            return Err(SignatureError::Foreign {
                path: path.to_owned(),
                format: format.map(str::to_owned),
            });
        }
    }
    let sig: SignatureFile = serde_json::from_slice(text)
        .map_err(|e| malformed(format!("not a {FORMAT} signature file: {e}")))?;
    let (public, signature) = check_fields(&sig, limits).map_err(malformed)?;
    Ok((sig, public, signature))
}

/// Reads the signature file: `None` when absent; refuses a symlink, a
/// non-regular file and anything over [`MAX_SIGNATURE_BYTES`] without
/// buffering past the limit.
fn read_signature_file(path: &Path) -> Result<Option<Vec<u8>>, SignatureError> {
    let malformed = |message: String| SignatureError::Malformed {
        path: path.to_owned(),
        message,
    };
    let meta = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(malformed(format!("cannot read it: {e}"))),
        Ok(m) => m,
    };
    if meta.file_type().is_symlink() {
        return Err(malformed(
            "it is a symlink; the signature file must be a regular file".into(),
        ));
    }
    if !meta.is_file() {
        return Err(malformed("it is not a regular file".into()));
    }
    let too_big = |size: u64| {
        malformed(format!(
            "it is {size} bytes, over the {MAX_SIGNATURE_BYTES}-byte limit"
        ))
    };
    if meta.len() > MAX_SIGNATURE_BYTES {
        return Err(too_big(meta.len()));
    }
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| malformed(format!("cannot open it: {e}")))?;
    let mut bytes = Vec::new();
    File::from(fd)
        .take(MAX_SIGNATURE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| malformed(format!("cannot read it: {e}")))?;
    if bytes.len() as u64 > MAX_SIGNATURE_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(Some(bytes))
}

/// Checks every field; returns the public key and the signature.
fn check_fields(
    sig: &SignatureFile,
    limits: &DigestLimits,
) -> Result<(VerifyingKey, Signature), String> {
    if sig.format != FORMAT {
        return Err(format!(
            "format: {:?} is not supported; this plugd reads {FORMAT:?}",
            sig.format
        ));
    }
    if sig.algorithm != ALGORITHM {
        return Err(format!(
            "algorithm: {:?} is not supported; only {ALGORITHM:?}",
            sig.algorithm
        ));
    }
    let public =
        keys::decode_public_key(&sig.public_key).map_err(|e| format!("public_key: {e}"))?;
    let id = keys::key_id(&public);
    if sig.key_id != id {
        return Err(format!(
            "key_id: {:?} is not the id of the file's public_key (that key's id is {id:?}); the file misstates who signed it",
            sig.key_id
        ));
    }
    if sig.signed_at.is_empty()
        || sig.signed_at.len() > MAX_SIGNED_AT
        || sig.signed_at.chars().any(char::is_control)
    {
        return Err(format!(
            "signed_at: {:?} is not a timestamp (RFC 3339, at most {MAX_SIGNED_AT} characters)",
            sig.signed_at
        ));
    }
    if sig.files.len() > limits.max_files {
        return Err(format!(
            "files: {} entries, over the limit of {}",
            sig.files.len(),
            limits.max_files
        ));
    }
    for (path, hash) in &sig.files {
        check_path(path).map_err(|m| format!("files: {path:?} {m}"))?;
        if !is_sha256(hash) {
            return Err(format!(
                "files: {path:?}: {hash:?} is not \"sha256:\" and 64 lower-case hex digits"
            ));
        }
    }
    let digest = listing_digest(&sig.files);
    if sig.digest != digest {
        return Err(format!(
            "digest: {:?} is not the digest of the files listed ({digest:?})",
            sig.digest
        ));
    }
    let bytes = B64
        .decode(&sig.signature)
        .map_err(|e| format!("signature: not standard base64 ({e})"))?;
    let bytes: [u8; 64] = bytes.as_slice().try_into().map_err(|_| {
        format!(
            "signature: decodes to {} bytes; an Ed25519 signature is 64 bytes",
            bytes.len()
        )
    })?;
    Ok((public, Signature::from_bytes(&bytes)))
}

/// A `files` key must be a plain relative path inside the plugin.
fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("is empty");
    }
    if path.starts_with('/') {
        return Err("is an absolute path; entries are relative to the plugin directory");
    }
    if path.chars().any(char::is_control) || path.contains('\\') {
        return Err("holds a control character or a backslash");
    }
    if path
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(
            "has an empty, \".\" or \"..\" component; entries stay inside the plugin directory",
        );
    }
    if path == SIGNATURE_FILE {
        return Err("is the signature file itself, which is never listed");
    }
    Ok(())
}

fn is_sha256(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// What differs between the signed listing and the directory now, in path order.
pub fn compare(
    signed: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<FileChange> {
    let mut out = Vec::new();
    for (path, hash) in signed {
        match now.get(path) {
            None => out.push(FileChange::Removed(path.clone())),
            Some(h) if h != hash => out.push(FileChange::Changed(path.clone())),
            Some(_) => {}
        }
    }
    for path in now.keys() {
        if !signed.contains_key(path) {
            out.push(FileChange::Added(path.clone()));
        }
    }
    out.sort_by(|a, b| change_path(a).cmp(change_path(b)));
    out
}

fn change_path(c: &FileChange) -> &str {
    match c {
        FileChange::Changed(p) | FileChange::Added(p) | FileChange::Removed(p) => p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(p, h)| (p.to_string(), h.to_string()))
            .collect()
    }

    const H1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const H2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn the_canonical_listing_is_sorted_by_path_bytes_whatever_the_insert_order() {
        let a = files(&[("b.py", H1), ("a/z.txt", H2), ("A.md", H1), ("é", H2)]);
        let b = files(&[("é", H2), ("A.md", H1), ("b.py", H1), ("a/z.txt", H2)]);
        assert_eq!(canonical_listing(&a), canonical_listing(&b));
        assert_eq!(
            canonical_listing(&a),
            format!("{H1}  A.md\n{H2}  a/z.txt\n{H1}  b.py\n{H2}  é\n")
        );
        // Stable across releases: this value is part of every signature.
        assert_eq!(
            listing_digest(&files(&[("plugin.py", H1)])),
            format!(
                "sha256:{}",
                hex::encode(Sha256::digest(format!("{H1}  plugin.py\n")))
            )
        );
        assert_eq!(
            String::from_utf8(payload("00ff", "2026-01-02T03:04:05Z", "sha256:ab")).unwrap(),
            "plugd-signature/1\ned25519\n00ff\n2026-01-02T03:04:05Z\nsha256:ab\n"
        );
    }

    #[test]
    fn a_listing_differs_when_a_path_or_a_hash_does() {
        let base = listing_digest(&files(&[("a", H1), ("b", H2)]));
        assert_ne!(base, listing_digest(&files(&[("a", H2), ("b", H1)])));
        assert_ne!(base, listing_digest(&files(&[("a", H1), ("c", H2)])));
        assert_ne!(base, listing_digest(&files(&[("a", H1)])));
    }

    #[test]
    fn sign_then_verify_in_a_temporary_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::create_dir(dir.join("lib")).unwrap();
        std::fs::write(dir.join("main.py"), "print('hi')\n").unwrap();
        std::fs::write(dir.join("lib/util.py"), "x = 1\n").unwrap();
        let key = SigningKey::from_bytes(&[9; 32]);
        let limits = DigestLimits::default();
        let sig = sign(dir, &key, "2026-01-02T03:04:05Z", &limits).unwrap();
        assert_eq!(
            sig.files.keys().collect::<Vec<_>>(),
            ["lib/util.py", "main.py"]
        );
        write(dir, &sig).unwrap();
        let ok = verify(dir, &limits).unwrap();
        assert_eq!(ok.key_id, keys::key_id(&key.verifying_key()));
        assert_eq!(ok.files, 2);

        std::fs::write(dir.join("lib/util.py"), "x = 2\n").unwrap();
        std::fs::remove_file(dir.join("main.py")).unwrap();
        std::fs::write(dir.join("new.sh"), "rm -rf /\n").unwrap();
        match verify(dir, &limits).unwrap_err() {
            SignatureError::Tampered { changes, .. } => assert_eq!(
                changes,
                [
                    FileChange::Changed("lib/util.py".into()),
                    FileChange::Removed("main.py".into()),
                    FileChange::Added("new.sh".into()),
                ]
            ),
            e => panic!("{e}"),
        }
    }

    #[test]
    fn files_entries_must_stay_inside_the_plugin() {
        for bad in [
            "../x",
            "/etc/passwd",
            "a/../../b",
            "a//b",
            "./a",
            "",
            "a\nb",
            SIGNATURE_FILE,
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        check_path("a/b/c.txt").unwrap();
        check_path("..hidden").unwrap();
    }

    /// A signature made by this format's first release: if the listing,
    /// payload or key id rules change, old signatures stop verifying and
    /// this test says so.
    const KNOWN: &str = r#"{
  "format": "plugd-signature/1",
  "algorithm": "ed25519",
  "public_key": "iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w=",
  "key_id": "34750f98bd59fcfc",
  "signed_at": "2026-01-02T03:04:05Z",
  "digest": "sha256:f26a057c479cbd149ffb4e25405ba06cc11ab79c42c2eef8109aca6318849dd8",
  "files": {
    "bin/run.sh": "sha256:299001868fb8c02fd431c336c6d058f5558c5dff5b5af5e6fe04b870a6a9cbba",
    "plugin.json": "sha256:ca3d163bab055381827226140568f3bef7eaac187cebd76878e0b63e9e442356"
  },
  "signature": "SEp/9SSCL/vERwmlQY9BK0HKxHjVlTYGqdbf/fS5+CDByUik5cYaBoa+W6omHNZCM88gIw5QWPGxIJODEssNDg=="
}
"#;

    fn known_tree() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("bin")).unwrap();
        std::fs::write(tmp.path().join("bin/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
        std::fs::write(tmp.path().join("plugin.json"), "{}\n").unwrap();
        tmp
    }

    #[test]
    fn a_known_signature_still_verifies_and_signing_is_deterministic() {
        let tmp = known_tree();
        std::fs::write(tmp.path().join(SIGNATURE_FILE), KNOWN).unwrap();
        let ok = verify(tmp.path(), &DigestLimits::default()).unwrap();
        assert_eq!(ok.key_id, "34750f98bd59fcfc");
        std::fs::remove_file(tmp.path().join(SIGNATURE_FILE)).unwrap();
        let key = SigningKey::from_bytes(&[1; 32]);
        let again = sign(
            tmp.path(),
            &key,
            "2026-01-02T03:04:05Z",
            &DigestLimits::default(),
        )
        .unwrap();
        let known: SignatureFile = serde_json::from_str(KNOWN).unwrap();
        assert_eq!(again, known);
        assert_eq!(serde_json::to_string_pretty(&again).unwrap() + "\n", KNOWN);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn parse_never_panics_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let _ = parse(&bytes, Path::new("x.json"), &DigestLimits::default());
            }

            /// Any one field of a good file replaced by any JSON value: an
            /// error naming the file or a signature that fails, unless the
            /// value is the same; never a panic.
            #[test]
            fn a_mutated_field_is_refused_with_the_file_named(
                field in proptest::sample::select(vec![
                    "format", "algorithm", "public_key", "key_id", "signed_at",
                    "digest", "files", "signature",
                ]),
                value in prop_oneof![
                    any::<i64>().prop_map(serde_json::Value::from),
                    ".{0,40}".prop_map(serde_json::Value::from),
                    Just(serde_json::json!(null)),
                    Just(serde_json::json!({"../x": "sha256:00"})),
                    Just(serde_json::json!([])),
                ],
            ) {
                let mut v: serde_json::Value = serde_json::from_str(KNOWN).unwrap();
                let same = v[field] == value;
                v[field] = value;
                let r = parse(v.to_string().as_bytes(), Path::new("x.json"), &DigestLimits::default());
                match r {
                    // Well-formed: then the signature must fail unless nothing changed.
                    Ok((sig, public, signature)) => {
                        let p = payload(&sig.key_id, &sig.signed_at, &sig.digest);
                        prop_assert_eq!(public.verify_strict(&p, &signature).is_ok(), same);
                    }
                    Err(e) => prop_assert!(e.to_string().starts_with("x.json: "), "{}", e),
                }
            }

            /// The listing depends on the set of (path, hash) pairs only.
            #[test]
            fn the_listing_is_independent_of_insert_order(
                entries in proptest::collection::vec(("[a-z/._-]{1,12}", "[0-9a-f]{64}"), 0..20),
            ) {
                let forward: BTreeMap<String, String> = entries.iter().cloned().collect();
                let backward: BTreeMap<String, String> = entries.iter().rev().cloned().collect();
                // Later duplicates win in a map; keep the pairs unique.
                prop_assume!(forward.len() == entries.len());
                prop_assert_eq!(canonical_listing(&forward), canonical_listing(&backward));
                prop_assert_eq!(listing_digest(&forward), listing_digest(&backward));
            }
        }
    }
}
