//! Signed plugins: the trust policy of `plugd.yaml` (`require_signatures`,
//! `trusted_publishers`), the signature status `plugd plugin show` prints, and
//! the check the runtime runs at approval and before every start.
//!
//! The rules ([`check`]):
//! * a plugin with a directory of its own (native, Salmex, VAI) that holds a
//!   `marketplace.signature.json` is verified whatever the policy: a
//!   malformed file, a bad signature, a changed, added or removed file, or a
//!   symlink or special file in the tree refuses it;
//! * with `require_signatures: true` an unsigned plugin, and one signed by a
//!   key that is not in `trusted_publishers`, is refused too; so are
//!   microapps and MCP servers, whose declaration (an `extensions.yaml` or
//!   `.mcp.json` entry) is a workspace file no publisher signature covers;
//! * without it, a good signature by an unknown key is shown as such and
//!   allowed.
//!
//! The file format is in [`format`] and docs/signatures.md; keys in [`keys`].

pub mod format;
pub mod keys;

use std::path::Path;

use plugd_manifest::PluginSpec;
use plugd_store::digest::DigestLimits;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use crate::plugd_yaml::{CONFIG_FILE, ConfigError};
pub use format::{FileChange, SIGNATURE_FILE, SignatureError, Verified};

/// The signing part of `plugd.yaml`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct SigningPolicy {
    /// `require_signatures`: refuse unsigned and untrusted plugins (default false).
    pub require_signatures: bool,
    /// `trusted_publishers`, in file order.
    pub trusted_publishers: Vec<TrustedPublisher>,
}

/// One `trusted_publishers` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrustedPublisher {
    /// `name`: shown as "signed by NAME".
    pub name: String,
    /// `public_key`: `ed25519:<base64>`.
    pub public_key: String,
    /// The key's id.
    pub key_id: String,
}

/// A `trusted_publishers` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPublisher {
    name: String,
    public_key: String,
}

impl SigningPolicy {
    /// Builds the policy from the two `plugd.yaml` keys as read; `path` names
    /// the file in errors, which carry the entry's line.
    pub fn from_raw(
        path: &Path,
        require: Option<bool>,
        publishers: Option<Vec<Spanned<RawPublisher>>>,
    ) -> Result<SigningPolicy, ConfigError> {
        let mut out = SigningPolicy {
            require_signatures: require.unwrap_or(false),
            trusted_publishers: Vec::new(),
        };
        for (i, entry) in publishers.unwrap_or_default().into_iter().enumerate() {
            let line = entry.referenced.line();
            let invalid = |field: &str, message: String| ConfigError::Invalid {
                path: path.to_path_buf(),
                field: format!("trusted_publishers[{i}].{field}"),
                line,
                message,
            };
            let raw = entry.value;
            let name = raw.name.trim().to_owned();
            if name.is_empty() {
                return Err(invalid(
                    "name",
                    "the name is empty; name the publisher, it is shown as \"signed by NAME\""
                        .into(),
                ));
            }
            let key = keys::parse_public_key(raw.public_key.trim())
                .map_err(|m| invalid("public_key", m))?;
            let key_id = keys::key_id(&key);
            if let Some(other) = out
                .trusted_publishers
                .iter()
                .find(|p| p.key_id == key_id || p.name == name)
            {
                return Err(invalid(
                    "name",
                    format!(
                        "publisher {name:?} (key {key_id}) repeats {:?} (key {}); list each publisher and each key once",
                        other.name, other.key_id
                    ),
                ));
            }
            out.trusted_publishers.push(TrustedPublisher {
                name,
                public_key: keys::public_key_string(&key),
                key_id,
            });
        }
        Ok(out)
    }

    /// Reads only the signing keys of `workspace/plugd.yaml` (the rest of the
    /// file is checked by the commands that use it). A missing file is the
    /// default policy; a file that does not parse is an error, because it may
    /// say `require_signatures: true` (fail closed).
    pub fn load(workspace: &Path) -> Result<SigningPolicy, ConfigError> {
        #[derive(Deserialize)]
        struct Doc {
            #[serde(default)]
            require_signatures: Option<bool>,
            #[serde(default)]
            trusted_publishers: Option<Vec<Spanned<RawPublisher>>>,
        }
        let path = workspace.join(CONFIG_FILE);
        let Some(text) = crate::plugd_yaml::read_text(workspace)? else {
            return Ok(SigningPolicy::default());
        };
        let doc: Option<Doc> =
            serde_saphyr::from_str_with_options(&text, crate::plugd_yaml::yaml_options())
                .map_err(|e| crate::plugd_yaml::yaml_error(&path, &e))?;
        match doc {
            None => Ok(SigningPolicy::default()),
            Some(d) => SigningPolicy::from_raw(&path, d.require_signatures, d.trusted_publishers),
        }
    }

    /// The trusted publisher holding `key_id`, if any.
    pub fn publisher(&self, key_id: &str) -> Option<&TrustedPublisher> {
        self.trusted_publishers.iter().find(|p| p.key_id == key_id)
    }
}

/// A plugin's signature as `plugd plugin show` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum SignatureStatus {
    /// Signatures do not apply (microapps, MCP servers, unloadable plugins).
    NotApplicable {
        /// Why.
        reason: String,
    },
    /// No `marketplace.signature.json`.
    Unsigned,
    /// A good signature, by a trusted publisher (`publisher` set) or by a key
    /// `plugd.yaml` does not list (`publisher` empty).
    Signed {
        /// The trusted publisher's name, when the key is trusted.
        publisher: Option<String>,
        /// Signer key id.
        key_id: String,
        /// Signer public key (`ed25519:<base64>`).
        public_key: String,
        /// When it was signed.
        signed_at: String,
    },
    /// The signature file is malformed, the signature is bad, or the files
    /// differ from what was signed (`changes`).
    Invalid {
        /// The whole explanation.
        message: String,
        /// What differs, when that is the reason.
        changes: Vec<FileChange>,
    },
}

impl SignatureStatus {
    /// One line for `plugd plugin show`.
    pub fn summary(&self) -> String {
        match self {
            SignatureStatus::NotApplicable { reason } => format!("not applicable ({reason})"),
            SignatureStatus::Unsigned => "unsigned".into(),
            SignatureStatus::Signed {
                publisher: Some(name),
                key_id,
                signed_at,
                ..
            } => format!("signed by {name} (key {key_id}) at {signed_at}"),
            SignatureStatus::Signed {
                publisher: None,
                key_id,
                public_key,
                ..
            } => format!(
                "signed by untrusted key {key_id} ({public_key}, not in plugd.yaml trusted_publishers)"
            ),
            SignatureStatus::Invalid { changes, .. } if !changes.is_empty() => {
                let list: Vec<String> = changes.iter().map(ToString::to_string).collect();
                format!(
                    "tampered: {} since it was signed; it will not start",
                    list.join(", ")
                )
            }
            SignatureStatus::Invalid { message, .. } => format!("invalid: {message}"),
        }
    }
}

/// The signature status of `spec`'s plugin directory under `policy`.
pub fn status(policy: &SigningPolicy, spec: &PluginSpec) -> SignatureStatus {
    if let Some(reason) = plugd_dialects::of(spec.dialect).capabilities().unsigned {
        return SignatureStatus::NotApplicable {
            reason: reason.into(),
        };
    }
    match format::verify(&spec.dir, &DigestLimits::default()) {
        Ok(v) => SignatureStatus::Signed {
            publisher: policy.publisher(&v.key_id).map(|p| p.name.clone()),
            key_id: v.key_id,
            public_key: v.public_key,
            signed_at: v.signed_at,
        },
        Err(SignatureError::Unsigned { .. }) => SignatureStatus::Unsigned,
        Err(e) => SignatureStatus::Invalid {
            changes: match &e {
                SignatureError::Tampered { changes, .. } => changes.clone(),
                _ => Vec::new(),
            },
            message: e.to_string(),
        },
    }
}

/// Whether `spec` may be approved or started under `policy`; the error says
/// why not (which file changed, that it is unsigned, which key signed it).
pub fn check(policy: &SigningPolicy, spec: &PluginSpec) -> Result<SignatureStatus, String> {
    let status = status(policy, spec);
    let required = policy.require_signatures;
    let fix = "or set require_signatures: false in plugd.yaml";
    match &status {
        SignatureStatus::Invalid { message, .. } => {
            Err(format!("its signature check failed: {message}"))
        }
        SignatureStatus::NotApplicable { reason } if required => Err(format!(
            "plugd.yaml sets require_signatures: true and {reason}; remove the entry {fix}"
        )),
        SignatureStatus::Unsigned if required => Err(format!(
            "it is unsigned ({} has no {SIGNATURE_FILE}) and plugd.yaml sets require_signatures: true; get a signed release from its publisher, or review it and sign it with `plugd plugin sign DIR --key KEY` and a key in trusted_publishers",
            spec.dir.display()
        )),
        SignatureStatus::Signed {
            publisher: None,
            key_id,
            public_key,
            ..
        } if required => Err(format!(
            "it is signed by key {key_id}, which is not in plugd.yaml trusted_publishers; if you trust its publisher, add {{name: NAME, public_key: \"{public_key}\"}} there"
        )),
        _ => Ok(status),
    }
}

/// The signature status of the package directory `dir` (staged or
/// installed) under `policy`, as the package record keeps it: the same
/// [`format::verify`] `.plugins/` use.
pub fn package_status(policy: &SigningPolicy, dir: &Path) -> plugd_control::SignatureStatus {
    use plugd_control::SignatureStatus as S;
    match format::verify(dir, &DigestLimits::default()) {
        Ok(v) => match policy.publisher(&v.key_id) {
            Some(p) => S::Verified {
                key_id: v.key_id,
                publisher: Some(p.name.clone()),
                signed_at: Some(v.signed_at),
            },
            None => S::UntrustedKey {
                key_id: v.key_id,
                public_key: v.public_key,
            },
        },
        Err(SignatureError::Unsigned { .. }) => S::Unsigned,
        // Another tool's signature (seed 003 names vai-plugin-sign but not
        // its layout): recorded as present and unverified, not refused.
        Err(SignatureError::Foreign { .. }) => S::Unverified {
            file: SIGNATURE_FILE.to_owned(),
        },
        Err(e) => S::Invalid {
            reason: e.to_string(),
        },
    }
}

/// Whether a package may be installed: a signature that is present must
/// verify (always); with `require` (plugd.yaml `require_signatures: true`,
/// or a production marketplace install) it must also be by a trusted key.
/// Returns the status to record, or why the install is refused.
pub fn check_package(
    policy: &SigningPolicy,
    dir: &Path,
    require: bool,
) -> Result<plugd_control::SignatureStatus, String> {
    use plugd_control::SignatureStatus as S;
    let status = package_status(policy, dir);
    match &status {
        S::Invalid { reason } => Err(format!("its {SIGNATURE_FILE} does not verify: {reason}")),
        S::Unverified { .. } if require => Err(format!(
            "its {SIGNATURE_FILE} is in a format plugd cannot verify (not plugd-signature/1), and a trusted Ed25519 signature is required (plugd.yaml require_signatures: true, or a production marketplace); sign it with `plugd plugin sign DIR --key KEY`"
        )),
        S::Unsigned if require => Err(format!(
            "it is unsigned (no {SIGNATURE_FILE}) and a trusted Ed25519 signature is required (plugd.yaml require_signatures: true, or a production marketplace); ask its publisher for a signed release"
        )),
        S::UntrustedKey { key_id, public_key } if require => Err(format!(
            "it is signed by key {key_id}, which is not in plugd.yaml trusted_publishers, and a trusted signature is required; if you trust its publisher, add {{name: NAME, public_key: \"{public_key}\"}} there"
        )),
        _ => Ok(status),
    }
}

/// The package signature check of `plugd package pull` and
/// `POST /v1/plugin-packages`: [`check_package`] with the policy's own
/// `require_signatures`.
pub fn package_verifier(
    policy: SigningPolicy,
) -> impl Fn(&Path) -> Result<plugd_control::SignatureStatus, String> + Send + Sync {
    move |dir| check_package(&policy, dir, policy.require_signatures)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 003's packages may carry another tool's signature file: by
    /// default it is recorded unverified, never refused; a policy that
    /// requires signatures refuses it; a broken plugd signature is refused
    /// always.
    #[test]
    fn a_foreign_signature_file_is_unverified_not_refused_by_default() {
        use plugd_control::SignatureStatus as S;
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("vai-plugin.toml"), "package_id = \"a/b\"\n").unwrap();
        let sig = tmp.path().join(SIGNATURE_FILE);
        let policy = SigningPolicy::default();
        for foreign in [
            r#"{"format": "vai-plugin-sign/1", "signature": "AAAA"}"#,
            r#"{"signature": "AAAA", "key": "ed25519:AAAA"}"#,
        ] {
            std::fs::write(&sig, foreign).unwrap();
            assert_eq!(
                check_package(&policy, tmp.path(), false).unwrap(),
                S::Unverified {
                    file: SIGNATURE_FILE.into()
                }
            );
            let err = check_package(&policy, tmp.path(), true).unwrap_err();
            assert!(err.contains("cannot verify"), "{err}");
        }
        for broken in [
            r#"{"format": "plugd-signature/1", "signature": "AAAA"}"#,
            "not json at all",
        ] {
            std::fs::write(&sig, broken).unwrap();
            let err = check_package(&policy, tmp.path(), false).unwrap_err();
            assert!(err.contains("does not verify"), "{err}");
        }
    }

    #[test]
    fn the_runtime_reads_only_the_signing_keys_and_fails_closed_on_bad_yaml() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(
            SigningPolicy::load(tmp.path()).unwrap(),
            SigningPolicy::default()
        );
        let file = tmp.path().join(CONFIG_FILE);
        std::fs::write(
            &file,
            "llm: {provider: nonsense}\nrequire_signatures: true\n",
        )
        .unwrap();
        assert!(SigningPolicy::load(tmp.path()).unwrap().require_signatures);
        std::fs::write(&file, "require_signatures: [\n").unwrap();
        let err = SigningPolicy::load(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("plugd.yaml"), "{err}");
        std::fs::write(&file, "require_signatures: yes\n").unwrap();
        let err = SigningPolicy::load(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
    }
}
