//! Ed25519 keys for plugin signatures: the private key file (PKCS#8 PEM,
//! mode 0600), the public key form `plugd.yaml` takes (`ed25519:<base64>`),
//! and the short key id shown everywhere.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

/// Prefix of a public key in `plugd.yaml` (`ed25519:<base64 of 32 bytes>`).
pub const PUBLIC_KEY_PREFIX: &str = "ed25519:";

/// Largest private key file read (a PKCS#8 PEM Ed25519 key is 119 bytes).
pub const MAX_KEY_FILE_BYTES: u64 = 16 * 1024;

/// The short id of a public key: the first 8 bytes of its SHA-256, as 16
/// lower-case hex digits.
pub fn key_id(key: &VerifyingKey) -> String {
    let hash = Sha256::digest(key.as_bytes());
    hex::encode(&hash[..8])
}

/// A public key as `plugd.yaml` takes it: `ed25519:<standard base64>`.
pub fn public_key_string(key: &VerifyingKey) -> String {
    format!("{PUBLIC_KEY_PREFIX}{}", B64.encode(key.as_bytes()))
}

/// Decodes the standard base64 of a 32-byte Ed25519 public key.
pub fn decode_public_key(b64: &str) -> Result<VerifyingKey, String> {
    let bytes = B64
        .decode(b64.trim())
        .map_err(|e| format!("{b64:?} is not standard base64 ({e})"))?;
    let bytes: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
        format!(
            "{b64:?} decodes to {} bytes; an Ed25519 public key is 32 bytes",
            bytes.len()
        )
    })?;
    VerifyingKey::from_bytes(&bytes)
        .map_err(|_| format!("{b64:?} is not a valid Ed25519 public key (not a curve point)"))
}

/// Parses `ed25519:<base64>` (the `plugd.yaml` form).
pub fn parse_public_key(s: &str) -> Result<VerifyingKey, String> {
    let Some(b64) = s.strip_prefix(PUBLIC_KEY_PREFIX) else {
        return Err(format!(
            "{s:?} does not start with {PUBLIC_KEY_PREFIX:?}; write the key as `plugd plugin keygen` prints it, \"ed25519:<base64>\""
        ));
    };
    decode_public_key(b64)
}

/// A fresh signing key from the operating system's random source.
pub fn generate() -> Result<SigningKey, String> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| format!("cannot read random bytes: {e}"))?;
    let key = SigningKey::from_bytes(&seed);
    zeroize::Zeroize::zeroize(&mut seed);
    Ok(key)
}

/// Writes `key` to a new file `path` as PKCS#8 PEM with mode 0600; an existing
/// file is never overwritten.
pub fn write_private_key(path: &Path, key: &SigningKey) -> Result<(), String> {
    let pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| format!("cannot encode the key: {e}"))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => format!(
                "{} already exists; plugd never overwrites a key: choose another --out or remove it",
                path.display()
            ),
            _ => format!("cannot create {}: {e}", path.display()),
        })?;
    file.write_all(pem.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Reads a private key file written by [`write_private_key`] (or by
/// `openssl genpkey -algorithm ed25519`): PKCS#8 PEM, a regular file that only
/// its owner can read, at most [`MAX_KEY_FILE_BYTES`].
pub fn read_private_key(path: &Path) -> Result<SigningKey, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("key {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("key {shown}: not a regular file"));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "key {shown} can be read by other users (mode {mode:04o}); run `chmod 600 {shown}`"
        ));
    }
    if meta.len() > MAX_KEY_FILE_BYTES {
        return Err(format!(
            "key {shown} is {} bytes, over the {MAX_KEY_FILE_BYTES}-byte limit; it is not an Ed25519 key file",
            meta.len()
        ));
    }
    // The PEM text holds the secret: wiped when it is dropped.
    let mut text = zeroize::Zeroizing::new(String::new());
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_KEY_FILE_BYTES).read_to_string(&mut text))
        .map_err(|e| format!("key {shown}: {e}"))?;
    SigningKey::from_pkcs8_pem(&text).map_err(|e| {
        format!(
            "key {shown} is not an Ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----): {e}; create one with `plugd plugin keygen --out FILE`"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_keys_round_trip_and_bad_ones_say_why() {
        let key = SigningKey::from_bytes(&[7; 32]).verifying_key();
        let s = public_key_string(&key);
        assert!(s.starts_with("ed25519:"), "{s}");
        assert_eq!(parse_public_key(&s).unwrap(), key);
        assert_eq!(key_id(&key).len(), 16);

        let err = parse_public_key("AAAA").unwrap_err();
        assert!(err.contains("does not start with \"ed25519:\""), "{err}");
        let err = parse_public_key("ed25519:not base64!").unwrap_err();
        assert!(err.contains("not standard base64"), "{err}");
        let err = parse_public_key("ed25519:AAAA").unwrap_err();
        assert!(err.contains("decodes to 3 bytes"), "{err}");
    }

    #[test]
    fn a_key_file_is_private_and_never_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("k.pem");
        let key = generate().unwrap();
        write_private_key(&path, &key).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            read_private_key(&path).unwrap().verifying_key(),
            key.verifying_key()
        );
        let err = write_private_key(&path, &key).unwrap_err();
        assert!(err.contains("already exists"), "{err}");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_private_key(&path).unwrap_err();
        assert!(
            err.contains("mode 0644") && err.contains("chmod 600"),
            "{err}"
        );

        let junk = tmp.path().join("junk.pem");
        std::fs::write(&junk, "hello").unwrap();
        std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = read_private_key(&junk).unwrap_err();
        assert!(err.contains("not an Ed25519 private key"), "{err}");

        let huge = tmp.path().join("huge.pem");
        std::fs::write(&huge, vec![b'A'; MAX_KEY_FILE_BYTES as usize + 1]).unwrap();
        std::fs::set_permissions(&huge, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = read_private_key(&huge).unwrap_err();
        assert!(err.contains("over the 16384-byte limit"), "{err}");
    }
}
