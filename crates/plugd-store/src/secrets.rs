//! Per-plugin configuration values, with secret values sealed by AES-256-GCM.
//!
//! A plugin's settings are rows of `(plugin_id, key)`. Plain values are stored
//! as JSON; secret values only as a [`Sealed`] box: the id of the master key
//! that sealed it, a fresh random 96-bit nonce and the AES-256-GCM ciphertext
//! (tag included). The associated data binds the box to its plugin and key
//! ([`aad`]), so a ciphertext copied to another field or plugin fails to open.
//!
//! The master key ([`MasterKey`]) comes from `PLUGD_MASTER_KEY` (64 hex
//! characters, 32 bytes) or from a key file created on first use with mode
//! 0600 in a 0700 directory: `$PLUGD_KEY_FILE`, else
//! `$XDG_CONFIG_HOME/plugd/master.key`, else `$HOME/.config/plugd/master.key`
//! ([`KeySource::from_env`]). [`Store::rotate_secrets`] re-seals every secret
//! under a new key in one transaction.
//!
//! **Architecture invariant**: plaintext secrets never reach the database or
//! any file; they exist only in memory ([`Zeroizing`] buffers) between
//! [`Store::open_secret`] and the plugin's handshake.
//!
//! **Why one file** (~810 product lines): the master key (sources, key
//! file, staged rotation) and the sealed settings rows it protects are kept
//! together so that the invariant above is checked in one place: no
//! function here hands a plaintext secret to SQLite or a file.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use rusqlite::{OptionalExtension, TransactionBehavior, params};
use serde_json::Value;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use plugd_control::store::secrets::check_config_names;

use crate::error::StoreError;
use crate::store::Store;

pub use plugd_control::store::secrets::{ConfigWrite, Rotation, Sealed, StoredValue};

/// Schema step: per-plugin configuration values and sealed secrets.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE plugin_config (
        plugin_id  TEXT NOT NULL,
        key        TEXT NOT NULL,
        value      TEXT,
        key_id     TEXT,
        nonce      BLOB,
        ciphertext BLOB,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (plugin_id, key),
        CHECK ((value IS NULL) = (ciphertext IS NOT NULL))
    ) STRICT;
";

/// Environment variable holding the master key as 64 hex characters.
pub const MASTER_KEY_ENV: &str = "PLUGD_MASTER_KEY";

/// Environment variable naming the key file (overrides the default location).
pub const KEY_FILE_ENV: &str = "PLUGD_KEY_FILE";

/// Environment variable with the new key for `plugd secrets rotate` when the
/// current key comes from [`MASTER_KEY_ENV`].
pub const NEW_MASTER_KEY_ENV: &str = "PLUGD_NEW_MASTER_KEY";

/// Length of an AES-GCM nonce in bytes (96 bits).
pub const NONCE_LEN: usize = 12;

/// Why a secret could not be sealed or opened, or the key not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The stored box was sealed by another master key than the one loaded.
    #[error(
        "secret {field:?} of plugin {plugin:?} was encrypted with master key {stored} but the current key is {current} ({source_desc}); use the key it was set with, or set it again with `plugd plugin config {plugin} set {field} -`"
    )]
    WrongKey {
        /// Plugin id.
        plugin: String,
        /// Config key.
        field: String,
        /// Key id stored beside the ciphertext.
        stored: String,
        /// Key id of the loaded key.
        current: String,
        /// Where the loaded key came from.
        source_desc: String,
    },
    /// The ciphertext failed authentication: tampered with or damaged.
    #[error(
        "secret {field:?} of plugin {plugin:?} cannot be decrypted: its ciphertext fails authentication (tampered with or damaged); set it again with `plugd plugin config {plugin} set {field} -`"
    )]
    Tampered {
        /// Plugin id.
        plugin: String,
        /// Config key.
        field: String,
    },
    /// `PLUGD_MASTER_KEY` or a key file does not hold a usable key.
    #[error("master key from {source_desc} is not usable: {problem}")]
    BadKey {
        /// `PLUGD_MASTER_KEY` or the key file path.
        source_desc: String,
        /// What is wrong and what to do.
        problem: String,
    },
    /// No key is configured and none may be created (reading secrets).
    #[error(
        "no master key: {source_desc} does not exist; set PLUGD_MASTER_KEY or restore the key file the secrets were set with"
    )]
    NoKey {
        /// Where the key was looked for.
        source_desc: String,
    },
    /// The key file or its directory could not be read or written.
    #[error("master key file {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// No place to keep a key file (no HOME, no XDG_CONFIG_HOME).
    #[error(
        "no place for the master key file: set PLUGD_MASTER_KEY, PLUGD_KEY_FILE, XDG_CONFIG_HOME or HOME"
    )]
    NoKeyLocation,
    /// The operating system's random number generator failed.
    #[error("the system random number generator failed: {0}")]
    Random(String),
    /// Rotation needs a new key that differs from the current one.
    #[error("{0}")]
    Rotate(String),
}

impl From<SecretError> for StoreError {
    fn from(e: SecretError) -> StoreError {
        StoreError::Secret(Box::new(e))
    }
}

/// A 256-bit master key and its id. The bytes are wiped on drop.
pub struct MasterKey {
    bytes: Zeroizing<[u8; 32]>,
    id: String,
    source_desc: String,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterKey")
            .field("id", &self.id)
            .field("source", &self.source_desc)
            .finish_non_exhaustive()
    }
}

impl MasterKey {
    /// A key from raw bytes; `source_desc` says where it came from (for errors).
    pub fn from_bytes(bytes: [u8; 32], source_desc: impl Into<String>) -> MasterKey {
        let bytes = Zeroizing::new(bytes);
        let mut h = Sha256::new();
        h.update(b"plugd-master-key-id-v1\0");
        h.update(&bytes[..]);
        let id = format!("k-{}", &hex::encode(h.finalize())[..16]);
        MasterKey {
            bytes,
            id,
            source_desc: source_desc.into(),
        }
    }

    /// A fresh random key from the operating system.
    pub fn generate(source_desc: impl Into<String>) -> Result<MasterKey, SecretError> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| SecretError::Random(e.to_string()))?;
        let k = MasterKey::from_bytes(b, source_desc);
        b.fill(0);
        Ok(k)
    }

    /// Parses 64 hex characters (surrounding whitespace ignored).
    pub fn from_hex(text: &str, source_desc: impl Into<String>) -> Result<MasterKey, SecretError> {
        let source_desc = source_desc.into();
        let t = text.trim();
        let bad = |problem: String| SecretError::BadKey {
            source_desc: source_desc.clone(),
            problem,
        };
        if t.len() != 64 {
            return Err(bad(format!(
                "expected 64 hex characters (32 bytes), found {} characters; generate one with `openssl rand -hex 32`",
                t.len()
            )));
        }
        let mut b = Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(t, &mut b[..]).map_err(|e| {
            bad(format!(
                "not hex ({e}); generate one with `openssl rand -hex 32`"
            ))
        })?;
        Ok(MasterKey::from_bytes(*b, source_desc))
    }

    /// The key's id (`k-` and 16 hex digits of a hash of the key), stored
    /// beside every ciphertext it seals. Not secret.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where the key came from (`PLUGD_MASTER_KEY` or the key file path).
    pub fn source_desc(&self) -> &str {
        &self.source_desc
    }

    fn hex(&self) -> Zeroizing<String> {
        Zeroizing::new(hex::encode(&self.bytes[..]))
    }

    /// Seals `plaintext` as the value of config key `field` of `plugin`.
    pub fn seal(&self, plugin: &str, field: &str, plaintext: &[u8]) -> Result<Sealed, SecretError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| SecretError::Random(e.to_string()))?;
        let cipher = self.cipher();
        let aad = aad(plugin, field);
        let ciphertext = cipher
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: plaintext,
                    aad: &aad,
                },
            )
            .map_err(|_| SecretError::Random("AES-GCM refused to encrypt".to_owned()))?;
        Ok(Sealed {
            key_id: self.id.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
        })
    }

    /// Opens a box sealed for `field` of `plugin`.
    pub fn open(
        &self,
        plugin: &str,
        field: &str,
        sealed: &Sealed,
    ) -> Result<Zeroizing<String>, SecretError> {
        if sealed.key_id != self.id {
            return Err(SecretError::WrongKey {
                plugin: plugin.to_owned(),
                field: field.to_owned(),
                stored: sealed.key_id.clone(),
                current: self.id.clone(),
                source_desc: self.source_desc.clone(),
            });
        }
        let tampered = || SecretError::Tampered {
            plugin: plugin.to_owned(),
            field: field.to_owned(),
        };
        let nonce: [u8; NONCE_LEN] = sealed.nonce.as_slice().try_into().map_err(|_| tampered())?;
        let aad = aad(plugin, field);
        let plain = self
            .cipher()
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: &sealed.ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| tampered())?;
        let plain = Zeroizing::new(plain);
        String::from_utf8(plain.to_vec())
            .map(Zeroizing::new)
            .map_err(|_| tampered())
    }

    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(&(*self.bytes).into())
    }

    /// A key for another purpose, derived from this one and `label`
    /// (HMAC-SHA256 under the master key): the nodes of a cluster, which
    /// share the master key, derive the same key for their envelopes
    /// without ever using the master key itself for anything but sealing.
    pub fn derive(&self, label: &str) -> Zeroizing<[u8; 32]> {
        use hmac::{Hmac, Mac};
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.bytes[..])
            .expect("HMAC takes any key length");
        mac.update(b"plugd-derive-v1\0");
        mac.update(label.as_bytes());
        Zeroizing::new(mac.finalize().into_bytes().into())
    }
}

/// The associated data of a sealed value: a version tag, the plugin id and
/// the config key, each NUL-terminated (neither may contain NUL).
pub fn aad(plugin: &str, field: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(32 + plugin.len() + field.len());
    v.extend_from_slice(b"plugd-secret-v1\0");
    v.extend_from_slice(plugin.as_bytes());
    v.push(0);
    v.extend_from_slice(field.as_bytes());
    v.push(0);
    v
}

/// Where the master key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `PLUGD_MASTER_KEY` (64 hex characters).
    Env(String),
    /// A key file (created on first use).
    File(PathBuf),
}

impl KeySource {
    /// `PLUGD_MASTER_KEY` if set, else the key file (`PLUGD_KEY_FILE`, else
    /// `$XDG_CONFIG_HOME/plugd/master.key`, else `$HOME/.config/plugd/master.key`).
    pub fn from_env() -> Result<KeySource, SecretError> {
        if let Some(v) = std::env::var_os(MASTER_KEY_ENV) {
            return Ok(KeySource::Env(v.to_string_lossy().into_owned()));
        }
        let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        if let Some(p) = nonempty(KEY_FILE_ENV) {
            return Ok(KeySource::File(PathBuf::from(p)));
        }
        if let Some(x) = nonempty("XDG_CONFIG_HOME") {
            return Ok(KeySource::File(
                PathBuf::from(x).join("plugd").join("master.key"),
            ));
        }
        if let Some(h) = nonempty("HOME") {
            return Ok(KeySource::File(
                PathBuf::from(h)
                    .join(".config")
                    .join("plugd")
                    .join("master.key"),
            ));
        }
        Err(SecretError::NoKeyLocation)
    }

    /// Every place a key file may be, whatever is set now: `$PLUGD_KEY_FILE`,
    /// `$XDG_CONFIG_HOME/plugd/master.key`, `$HOME/.config/plugd/master.key`
    /// (the containment baseline hides all of them from plugins).
    pub fn file_candidates() -> Vec<PathBuf> {
        let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let mut out = Vec::new();
        if let Some(p) = nonempty(KEY_FILE_ENV) {
            out.push(PathBuf::from(p));
        }
        if let Some(x) = nonempty("XDG_CONFIG_HOME") {
            out.push(PathBuf::from(x).join("plugd").join("master.key"));
        }
        if let Some(h) = nonempty("HOME") {
            out.push(
                PathBuf::from(h)
                    .join(".config")
                    .join("plugd")
                    .join("master.key"),
            );
        }
        out
    }

    /// Loads the key; `None` when it is a key file that does not exist yet.
    pub fn load(&self) -> Result<Option<MasterKey>, SecretError> {
        match self {
            KeySource::Env(v) => MasterKey::from_hex(v, MASTER_KEY_ENV).map(Some),
            KeySource::File(p) => read_key_file(p),
        }
    }

    /// Loads the key, failing with [`SecretError::NoKey`] when there is none.
    pub fn require(&self) -> Result<MasterKey, SecretError> {
        self.load()?.ok_or_else(|| SecretError::NoKey {
            source_desc: self.describe(),
        })
    }

    /// Loads the key, creating the key file (0600, directory 0700) if needed.
    pub fn load_or_create(&self) -> Result<MasterKey, SecretError> {
        if let Some(k) = self.load()? {
            return Ok(k);
        }
        let KeySource::File(path) = self else {
            return Err(SecretError::NoKey {
                source_desc: self.describe(),
            });
        };
        let key = MasterKey::generate(path.display().to_string())?;
        // Written in full under a private name, then linked into place, so
        // a concurrent reader never sees a half-written key file.
        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let _ = fs::remove_file(&tmp);
        write_key_file(&tmp, &key)?;
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(key),
            // Another process created it first: use theirs.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => self.require(),
            Err(source) => Err(SecretError::Io {
                path: path.clone(),
                source,
            }),
        }
    }

    /// `PLUGD_MASTER_KEY` or the key file path, for messages.
    pub fn describe(&self) -> String {
        match self {
            KeySource::Env(_) => MASTER_KEY_ENV.to_owned(),
            KeySource::File(p) => format!("key file {}", p.display()),
        }
    }
}

fn read_key_file(path: &Path) -> Result<Option<MasterKey>, SecretError> {
    match fs::read_to_string(path) {
        Ok(text) => {
            let text = Zeroizing::new(text);
            MasterKey::from_hex(&text, path.display().to_string()).map(Some)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SecretError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Creates `path` (which must not exist) with mode 0600 holding `key` as hex,
/// creating its directory with mode 0700.
fn write_key_file(path: &Path, key: &MasterKey) -> Result<(), SecretError> {
    let io_err = |p: &Path| {
        let p = p.to_owned();
        move |source| SecretError::Io { path: p, source }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let mut b = fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir).map_err(io_err(dir))?;
    }
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path).map_err(io_err(path))?;
    let mut text = key.hex();
    text.push('\n');
    f.write_all(text.as_bytes()).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

impl Store {
    /// Stores a plain value for `key` of `plugin`, replacing any earlier one.
    pub fn config_set_plain(
        &self,
        plugin: &str,
        key: &str,
        value: &Value,
    ) -> Result<(), StoreError> {
        check_config_names(plugin, key)?;
        self.lock()
            .execute(
                "INSERT OR REPLACE INTO plugin_config
                 (plugin_id, key, value, key_id, nonce, ciphertext, updated_at)
                 VALUES (?1, ?2, ?3, NULL, NULL, NULL, ?4)",
                params![plugin, key, value.to_string(), crate::now_rfc3339()],
            )
            .map(drop)
            .map_err(|e| self.query_error(format!("set config {key:?} of plugin {plugin:?}"), e))
    }

    /// Seals `plaintext` with `master` and stores it for `key` of `plugin`.
    pub fn config_set_secret(
        &self,
        plugin: &str,
        key: &str,
        plaintext: &str,
        master: &MasterKey,
    ) -> Result<(), StoreError> {
        check_config_names(plugin, key)?;
        let sealed = master.seal(plugin, key, plaintext.as_bytes())?;
        self.put_sealed(plugin, key, &sealed)
    }

    /// Stores an already sealed box (used by tests to tamper with boxes).
    pub fn put_sealed(&self, plugin: &str, key: &str, sealed: &Sealed) -> Result<(), StoreError> {
        check_config_names(plugin, key)?;
        self.lock()
            .execute(
                "INSERT OR REPLACE INTO plugin_config
                 (plugin_id, key, value, key_id, nonce, ciphertext, updated_at)
                 VALUES (?1, ?2, NULL, ?3, ?4, ?5, ?6)",
                params![
                    plugin,
                    key,
                    sealed.key_id,
                    sealed.nonce,
                    sealed.ciphertext,
                    crate::now_rfc3339()
                ],
            )
            .map(drop)
            .map_err(|e| self.query_error(format!("set secret {key:?} of plugin {plugin:?}"), e))
    }

    /// Applies every write of `writes` to the settings of `plugin` in one
    /// transaction: all of them are stored, or none (`PUT
    /// /v1/plugins/{id}/config`).
    pub fn config_write_all(
        &self,
        plugin: &str,
        writes: &[(String, ConfigWrite)],
    ) -> Result<(), StoreError> {
        for (key, _) in writes {
            check_config_names(plugin, key)?;
        }
        let action = || format!("set the config of plugin {plugin:?}");
        let mut conn = self.lock();
        let tx = conn
            .transaction()
            .map_err(|e| self.query_error(action(), e))?;
        let now = crate::now_rfc3339();
        for (key, write) in writes {
            let r = match write {
                ConfigWrite::Plain(v) => tx.execute(
                    "INSERT OR REPLACE INTO plugin_config
                     (plugin_id, key, value, key_id, nonce, ciphertext, updated_at)
                     VALUES (?1, ?2, ?3, NULL, NULL, NULL, ?4)",
                    params![plugin, key, v.to_string(), now],
                ),
                ConfigWrite::Sealed(sealed) => tx.execute(
                    "INSERT OR REPLACE INTO plugin_config
                     (plugin_id, key, value, key_id, nonce, ciphertext, updated_at)
                     VALUES (?1, ?2, NULL, ?3, ?4, ?5, ?6)",
                    params![
                        plugin,
                        key,
                        sealed.key_id,
                        sealed.nonce,
                        sealed.ciphertext,
                        now
                    ],
                ),
                ConfigWrite::Unset => tx.execute(
                    "DELETE FROM plugin_config WHERE plugin_id = ?1 AND key = ?2",
                    params![plugin, key],
                ),
            };
            r.map_err(|e| self.query_error(action(), e))?;
        }
        tx.commit().map_err(|e| self.query_error(action(), e))
    }

    /// Removes the value of `key`; `false` if none was set.
    pub fn config_unset(&self, plugin: &str, key: &str) -> Result<bool, StoreError> {
        check_config_names(plugin, key)?;
        self.lock()
            .execute(
                "DELETE FROM plugin_config WHERE plugin_id = ?1 AND key = ?2",
                params![plugin, key],
            )
            .map(|n| n > 0)
            .map_err(|e| self.query_error(format!("unset config {key:?} of plugin {plugin:?}"), e))
    }

    /// Every stored value of `plugin`, by key (secrets still sealed).
    pub fn config_values(&self, plugin: &str) -> Result<Vec<(String, StoredValue)>, StoreError> {
        let conn = self.lock();
        let action = || format!("read config of plugin {plugin:?}");
        // Cached: `plugd plugin list` / GET /v1/plugins read this per plugin.
        let mut stmt = conn
            .prepare_cached(
                "SELECT key, value, key_id, nonce, ciphertext FROM plugin_config
                 WHERE plugin_id = ?1 ORDER BY key",
            )
            .map_err(|e| self.query_error(action(), e))?;
        let rows = stmt
            .query_map(params![plugin], raw_row)
            .map_err(|e| self.query_error(action(), e))?;
        let mut out = Vec::new();
        for r in rows {
            let r = r.map_err(|e| self.query_error(action(), e))?;
            out.push(self.decode_row(plugin, r)?);
        }
        Ok(out)
    }

    /// The stored value of one key, if any.
    pub fn config_value(&self, plugin: &str, key: &str) -> Result<Option<StoredValue>, StoreError> {
        let raw = self
            .lock()
            .query_row(
                "SELECT key, value, key_id, nonce, ciphertext FROM plugin_config
                 WHERE plugin_id = ?1 AND key = ?2",
                params![plugin, key],
                raw_row,
            )
            .optional()
            .map_err(|e| {
                self.query_error(format!("read config {key:?} of plugin {plugin:?}"), e)
            })?;
        raw.map(|r| self.decode_row(plugin, r).map(|(_, v)| v))
            .transpose()
    }

    /// Re-seals every secret of every plugin from `old` to `new` in one
    /// transaction: either all move to the new key or none does.
    pub fn rotate_secrets(&self, old: &MasterKey, new: &MasterKey) -> Result<Rotation, StoreError> {
        if old.id() == new.id() {
            return Err(SecretError::Rotate(
                "the new master key is the same as the current one; use a fresh key".to_owned(),
            )
            .into());
        }
        self.reseal_secrets(
            old.id(),
            new.id(),
            &|plugin: &str, key: &str, sealed: &Sealed| {
                let plain = old.open(plugin, key, sealed)?;
                Ok(new.seal(plugin, key, plain.as_bytes())?)
            },
        )
    }

    /// Re-seals every stored secret with `reseal` in one transaction
    /// (`ConfigStore::reseal_secrets`).
    pub fn reseal_secrets(
        &self,
        old_key_id: &str,
        new_key_id: &str,
        reseal: &plugd_control::store::Reseal<'_>,
    ) -> Result<Rotation, StoreError> {
        let mut conn = self.lock();
        let action = || "rotate the master key".to_owned();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.query_error(action(), e))?;
        let rows: Vec<(String, String, Sealed)> = {
            let mut stmt = tx
                .prepare(
                    "SELECT plugin_id, key, key_id, nonce, ciphertext FROM plugin_config
                     WHERE ciphertext IS NOT NULL",
                )
                .map_err(|e| self.query_error(action(), e))?;
            let it = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        Sealed {
                            key_id: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                            nonce: r.get::<_, Option<Vec<u8>>>(3)?.unwrap_or_default(),
                            ciphertext: r.get::<_, Option<Vec<u8>>>(4)?.unwrap_or_default(),
                        },
                    ))
                })
                .map_err(|e| self.query_error(action(), e))?;
            it.collect::<Result<_, _>>()
                .map_err(|e| self.query_error(action(), e))?
        };
        let mut resealed = 0;
        for (plugin, key, sealed) in rows {
            let fresh = reseal(&plugin, &key, &sealed)?;
            tx.execute(
                "UPDATE plugin_config SET key_id = ?3, nonce = ?4, ciphertext = ?5
                 WHERE plugin_id = ?1 AND key = ?2",
                params![plugin, key, fresh.key_id, fresh.nonce, fresh.ciphertext],
            )
            .map_err(|e| self.query_error(action(), e))?;
            resealed += 1;
        }
        tx.commit().map_err(|e| self.query_error(action(), e))?;
        Ok(Rotation {
            resealed,
            old_key_id: old_key_id.to_owned(),
            new_key_id: new_key_id.to_owned(),
        })
    }

    /// Ids of the keys the stored secrets are sealed with.
    pub fn secret_key_ids(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.lock();
        let action = || "list secret key ids".to_owned();
        let mut stmt = conn
            .prepare(
                "SELECT DISTINCT key_id FROM plugin_config WHERE ciphertext IS NOT NULL ORDER BY 1",
            )
            .map_err(|e| self.query_error(action(), e))?;
        let ids = stmt
            .query_map([], |r| r.get::<_, Option<String>>(0))
            .map_err(|e| self.query_error(action(), e))?
            .filter_map(|r| r.ok().flatten())
            .collect();
        Ok(ids)
    }

    fn decode_row(&self, plugin: &str, r: RawRow) -> Result<(String, StoredValue), StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt {
            db: self.label().to_owned(),
            plugin_id: plugin.to_owned(),
            detail,
        };
        let v = match (r.value, r.ciphertext) {
            (Some(text), None) => StoredValue::Plain(
                serde_json::from_str(&text)
                    .map_err(|e| corrupt(format!("config {:?} is not JSON ({e})", r.key)))?,
            ),
            (None, Some(ciphertext)) => StoredValue::Secret(Sealed {
                key_id: r.key_id.unwrap_or_default(),
                nonce: r.nonce.unwrap_or_default(),
                ciphertext,
            }),
            _ => return Err(corrupt(format!("config {:?} has no value", r.key))),
        };
        Ok((r.key, v))
    }
}

struct RawRow {
    key: String,
    value: Option<String>,
    key_id: Option<String>,
    nonce: Option<Vec<u8>>,
    ciphertext: Option<Vec<u8>>,
}

fn raw_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(RawRow {
        key: r.get(0)?,
        value: r.get(1)?,
        key_id: r.get(2)?,
        nonce: r.get(3)?,
        ciphertext: r.get(4)?,
    })
}

/// Where [`stage_key_file`] writes the next key: `master.key.new` beside
/// the key file.
pub fn staged_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".new");
    path.with_file_name(name)
}

/// Writes `key` to [`staged_path`] (0600, synced), replacing a stale one.
/// Rotation stages the new key *before* the database commits, so the key
/// the secrets need is on disk whatever happens next.
pub fn stage_key_file(path: &Path, key: &MasterKey) -> Result<(), SecretError> {
    let tmp = staged_path(path);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(SecretError::Io { path: tmp, source }),
    }
    write_key_file(&tmp, key)
}

/// Moves the staged key over the key file (an atomic rename).
pub fn commit_key_file(path: &Path) -> Result<(), SecretError> {
    fs::rename(staged_path(path), path).map_err(|source| SecretError::Io {
        path: path.to_owned(),
        source,
    })?;
    if let Some(dir) = path.parent()
        && let Ok(d) = fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Replaces the key file at `path` with `key`, atomically: staged beside it,
/// synced, then renamed over it.
pub fn replace_key_file(path: &Path, key: &MasterKey) -> Result<(), SecretError> {
    stage_key_file(path, key)?;
    commit_key_file(path)
}

/// The staged key of an interrupted rotation, if any.
pub fn load_staged(path: &Path) -> Result<Option<MasterKey>, SecretError> {
    read_key_file(&staged_path(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> MasterKey {
        MasterKey::from_bytes([b; 32], "test")
    }

    #[test]
    fn seal_open_round_trip() {
        let k = key(1);
        let s = k.seal("p", "api_key", b"hunter2").unwrap();
        assert_eq!(s.key_id, k.id());
        assert_eq!(s.nonce.len(), NONCE_LEN);
        assert!(!s.ciphertext.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(k.open("p", "api_key", &s).unwrap().as_str(), "hunter2");
    }

    #[test]
    fn every_seal_uses_a_fresh_nonce() {
        let k = key(1);
        let mut nonces = std::collections::HashSet::new();
        let mut cts = std::collections::HashSet::new();
        for _ in 0..200 {
            let s = k.seal("p", "f", b"same").unwrap();
            assert!(nonces.insert(s.nonce.clone()), "nonce reused");
            assert!(cts.insert(s.ciphertext.clone()), "ciphertext repeated");
        }
    }

    #[test]
    fn aad_binds_plugin_and_field() {
        let k = key(1);
        let s = k.seal("p", "a", b"v").unwrap();
        let e = k.open("p", "b", &s).unwrap_err().to_string();
        assert!(e.contains("secret \"b\" of plugin \"p\""), "{e}");
        assert!(e.contains("fails authentication"), "{e}");
        assert!(matches!(
            k.open("q", "a", &s),
            Err(SecretError::Tampered { .. })
        ));
    }

    #[test]
    fn wrong_key_and_tampering_are_told_apart() {
        let s = key(1).seal("p", "f", b"v").unwrap();
        let e = key(2).open("p", "f", &s).unwrap_err();
        assert!(matches!(e, SecretError::WrongKey { .. }), "{e}");
        // Same id, other bytes: claims the right key but fails the tag.
        let mut t = s.clone();
        t.ciphertext[0] ^= 1;
        assert!(matches!(
            key(1).open("p", "f", &t),
            Err(SecretError::Tampered { .. })
        ));
        let mut n = s.clone();
        n.nonce.pop();
        assert!(matches!(
            key(1).open("p", "f", &n),
            Err(SecretError::Tampered { .. })
        ));
    }

    #[test]
    fn hex_keys_are_checked() {
        let k = MasterKey::from_hex(&"ab".repeat(32), "env").unwrap();
        assert_eq!(k.id(), MasterKey::from_bytes([0xab; 32], "x").id());
        // Derived keys: stable, per label, per master key.
        let same = MasterKey::from_bytes([0xab; 32], "y");
        assert_eq!(*k.derive("envelopes"), *same.derive("envelopes"));
        assert_ne!(*k.derive("envelopes"), *k.derive("other"));
        assert_ne!(
            *k.derive("envelopes"),
            *MasterKey::from_bytes([0xac; 32], "z").derive("envelopes")
        );
        let e = MasterKey::from_hex("abc", "PLUGD_MASTER_KEY")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PLUGD_MASTER_KEY") && e.contains("64 hex"),
            "{e}"
        );
        let e = MasterKey::from_hex(&"zz".repeat(32), "f")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not hex"), "{e}");
    }

    #[test]
    fn key_file_is_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cfg").join("plugd").join("master.key");
        let src = KeySource::File(path.clone());
        assert!(src.load().unwrap().is_none());
        let k = src.load_or_create().unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);
        assert_eq!(src.load_or_create().unwrap().id(), k.id());
        let k2 = MasterKey::generate("new").unwrap();
        replace_key_file(&path, &k2).unwrap();
        assert_eq!(src.require().unwrap().id(), k2.id());
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_staged_key_survives_until_it_is_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugd").join("master.key");
        let src = KeySource::File(path.clone());
        let old = src.load_or_create().unwrap();
        let new = MasterKey::generate("new").unwrap();
        stage_key_file(&path, &new).unwrap();
        // Until the rename, the key file still holds the old key and the
        // staged one is found beside it.
        assert_eq!(src.require().unwrap().id(), old.id());
        assert_eq!(load_staged(&path).unwrap().unwrap().id(), new.id());
        commit_key_file(&path).unwrap();
        assert_eq!(src.require().unwrap().id(), new.id());
        assert!(load_staged(&path).unwrap().is_none());
        // No temporary files are left beside the key.
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("master.key")]);
    }

    #[test]
    fn store_round_trip_and_rotation() {
        let s = Store::open_in_memory().unwrap();
        let (a, b) = (key(1), key(2));
        s.config_set_plain("p", "units", &serde_json::json!("metric"))
            .unwrap();
        s.config_set_secret("p", "api_key", "sekrit", &a).unwrap();
        let vals = s.config_values("p").unwrap();
        assert_eq!(vals.len(), 2);
        let Some(StoredValue::Secret(sealed)) = s.config_value("p", "api_key").unwrap() else {
            panic!("not sealed");
        };
        assert_eq!(sealed.key_id, a.id());
        let r = s.rotate_secrets(&a, &b).unwrap();
        assert_eq!(r.resealed, 1);
        let Some(StoredValue::Secret(sealed)) = s.config_value("p", "api_key").unwrap() else {
            panic!("not sealed");
        };
        assert_eq!(b.open("p", "api_key", &sealed).unwrap().as_str(), "sekrit");
        assert!(matches!(
            a.open("p", "api_key", &sealed),
            Err(SecretError::WrongKey { .. })
        ));
        // A rotation with the wrong old key changes nothing.
        assert!(s.rotate_secrets(&a, &key(3)).is_err());
        assert_eq!(s.secret_key_ids().unwrap(), vec![b.id().to_owned()]);
        assert!(s.config_unset("p", "api_key").unwrap());
        assert!(!s.config_unset("p", "api_key").unwrap());
    }
}
