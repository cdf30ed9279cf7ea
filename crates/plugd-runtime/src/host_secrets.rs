//! The operator's named secrets (`plugd secrets set NAME`): values plugd
//! itself uses, such as an LLM provider's API key (`api_key_secret:` in
//! plugd.yaml), sealed with the master key like plugins' secret settings.
//!
//! They are stored in the settings table under the reserved owner
//! [`HOST_SECRETS`] (not a valid plugin id, so no plugin can read or shadow
//! them), which also puts them under `plugd secrets rotate`. Values never
//! leave the process except to the service that uses them: listing shows
//! names only.

use plugd_store::secrets::{KeySource, StoredValue};

use crate::{Runtime, RuntimeError};

/// The owner id the operator's secrets are stored under.
pub const HOST_SECRETS: &str = "@secrets";

/// Longest secret name.
pub const MAX_NAME: usize = 128;

/// Largest secret value, in bytes.
pub const MAX_VALUE: usize = 64 * 1024;

/// `true` when `name` is one or two `/`-separated segments of
/// `A-Z a-z 0-9 _ . -` (`minimax_key`, `acme/openai`), at most
/// [`MAX_NAME`] characters, not starting with `.`.
pub fn valid_name(name: &str) -> bool {
    let segs: Vec<&str> = name.split('/').collect();
    name.len() <= MAX_NAME
        && segs.len() <= 2
        && segs.iter().all(|s| {
            !s.is_empty()
                && !s.starts_with('.')
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        })
}

fn invalid(name: &str) -> RuntimeError {
    RuntimeError::Workspace(format!(
        "{:?} is not a secret name: use letters, digits, _ . - (an optional ORG/ prefix), at most {MAX_NAME} characters",
        name.chars().take(MAX_NAME + 8).collect::<String>()
    ))
}

impl Runtime {
    /// Stores secret `name` (sealed with the master key, created when there
    /// is none yet), replacing any earlier value.
    pub async fn secret_set(&self, name: &str, value: &str) -> Result<(), RuntimeError> {
        if !valid_name(name) {
            return Err(invalid(name));
        }
        if value.is_empty() || value.len() > MAX_VALUE {
            return Err(RuntimeError::Workspace(format!(
                "secret {name:?}: the value must be 1 to {MAX_VALUE} bytes"
            )));
        }
        let master = KeySource::from_env()
            .and_then(|s| s.load_or_create())
            .map_err(|e| RuntimeError::Workspace(format!("cannot store secret {name:?}: {e}")))?;
        // Sealed here: the store only sees the sealed box.
        let sealed = master
            .seal(HOST_SECRETS, name, value.as_bytes())
            .map_err(plugd_store::StoreError::from)?;
        self.inner
            .state
            .put_sealed(HOST_SECRETS, name, &sealed)
            .await?;
        Ok(())
    }

    /// Removes secret `name`; `false` when it was not set.
    pub async fn secret_unset(&self, name: &str) -> Result<bool, RuntimeError> {
        if !valid_name(name) {
            return Err(invalid(name));
        }
        Ok(self.inner.state.config_unset(HOST_SECRETS, name).await?)
    }

    /// The names of the stored secrets, sorted.
    pub async fn secret_names(&self) -> Result<Vec<String>, RuntimeError> {
        let mut names: Vec<String> = self
            .inner
            .state
            .config_values(HOST_SECRETS)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        names.sort();
        Ok(names)
    }

    /// The value of secret `name`, decrypted; `Ok(None)` when it is not set.
    /// The error says why a stored value cannot be opened (no master key,
    /// another key, a tampered box).
    pub async fn secret(&self, name: &str) -> Result<Option<String>, String> {
        open_secret(&*self.inner.state, name).await
    }
}

/// [`Runtime::secret`] on a store (for a start, which has no runtime).
pub(crate) async fn open_secret(
    store: &dyn plugd_store::StateStore,
    name: &str,
) -> Result<Option<String>, String> {
    let stored = store
        .config_value(HOST_SECRETS, name)
        .await
        .map_err(|e| e.to_string())?;
    open_stored(name, stored)
}

/// Secret `name` as read from the store (`None`: not set), decrypted.
pub(crate) fn open_stored(
    name: &str,
    stored: Option<StoredValue>,
) -> Result<Option<String>, String> {
    let sealed = match stored {
        None => return Ok(None),
        Some(StoredValue::Secret(sealed)) => sealed,
        Some(StoredValue::Plain(_)) => {
            return Err(format!("secret {name:?} is stored unsealed; set it again"));
        }
    };
    let master = KeySource::from_env()
        .and_then(|s| s.require())
        .map_err(|e| format!("secret {name:?} cannot be decrypted: {e}"))?;
    let plain = master
        .open(HOST_SECRETS, name, &sealed)
        .map_err(|e| format!("secret {name:?} cannot be decrypted: {e}"))?;
    Ok(Some(plain.as_str().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugd_yaml_names_a_key_secret_and_the_schema_knows_it() {
        let text = "llm_providers:\n  mm:\n    provider: openai\n    base_url: http://x/v1\n    model: m\n    api_key_secret: acme/mm\n";
        assert!(crate::config::schema_violations(text).unwrap().is_empty());
        let c = crate::config::PlugdConfig::parse(
            text,
            std::path::Path::new("/ws/plugd.yaml"),
            std::path::Path::new("/ws"),
        )
        .unwrap();
        assert!(matches!(
            &c.llm_providers["mm"],
            crate::llm::LlmConfig::Openai { api_key_secret: Some(n), .. } if n == "acme/mm"
        ));
    }

    #[test]
    fn names_are_one_or_two_plain_segments() {
        for ok in ["minimax_key", "acme/openai", "a.b-c_d", "A1"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/x",
            "x/",
            "a/b/c",
            "../x",
            ".hidden",
            "a b",
            "a\0b",
            "ключ",
            &"x".repeat(MAX_NAME + 1),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
