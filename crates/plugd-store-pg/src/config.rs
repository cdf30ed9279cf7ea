//! Per-plugin configuration values and org secrets on PostgreSQL: plain
//! values as JSON text, secrets only as the sealed boxes the master key made
//! (key id, nonce, ciphertext as `bytea`), exactly as `plugd-store`'s
//! `secrets.rs` stores them, so a copied workspace keeps its secrets sealed.
//!
//! A rotation re-seals every secret in one transaction holding their rows
//! (`FOR UPDATE`): two nodes rotating at once cannot leave a mix of keys
//! (the second finds the rows sealed under the new key and fails whole).
//! An org secret is sealed with the configured master key, never a key
//! created on the spot (several nodes would mint several keys).

use plugd_control::bindings::check_org_secret;
use plugd_control::store::secrets::{
    ConfigWrite, Rotation, Sealed, StoredValue, check_config_names,
};
use plugd_store::bindings::org_secret_owner;
// The master key and where it is configured are plugd-store's (shared with SQLite).
use plugd_store::secrets::{KeySource, MasterKey};
use serde_json::Value;

use crate::clock::NOW_RFC3339;
use crate::{PgError, PgStore};

fn secret(e: impl std::error::Error + Send + Sync + 'static) -> PgError {
    PgError::Secret(Box::new(e))
}

/// Upserts one plain value (`$1` plugin, `$2` key, `$3` JSON text).
fn upsert_plain() -> String {
    format!(
        "INSERT INTO plugin_config (plugin_id, key, value, key_id, nonce, ciphertext, updated_at)
         VALUES ($1, $2, $3, NULL, NULL, NULL, {NOW_RFC3339})
         ON CONFLICT (plugin_id, key) DO UPDATE SET value = excluded.value, key_id = NULL,
            nonce = NULL, ciphertext = NULL, updated_at = excluded.updated_at"
    )
}

/// Upserts one sealed secret (`$1` plugin, `$2` key, `$3` key id, `$4`
/// nonce, `$5` ciphertext).
fn upsert_sealed() -> String {
    format!(
        "INSERT INTO plugin_config (plugin_id, key, value, key_id, nonce, ciphertext, updated_at)
         VALUES ($1, $2, NULL, $3, $4, $5, {NOW_RFC3339})
         ON CONFLICT (plugin_id, key) DO UPDATE SET value = NULL, key_id = excluded.key_id,
            nonce = excluded.nonce, ciphertext = excluded.ciphertext,
            updated_at = excluded.updated_at"
    )
}

impl PgStore {
    /// Stores a plain value for `key` of `plugin`, replacing any earlier one.
    pub async fn config_set_plain(
        &self,
        plugin: &str,
        key: &str,
        value: &Value,
    ) -> Result<(), PgError> {
        check_config_names(plugin, key)?;
        let client = self.client().await?;
        client
            .execute(&upsert_plain(), &[&plugin, &key, &value.to_string()])
            .await
            .map_err(|e| self.query_error(format!("set config {key:?} of plugin {plugin:?}"), e))?;
        Ok(())
    }

    /// Seals `plaintext` with `master` and stores it for `key` of `plugin`.
    pub async fn config_set_secret(
        &self,
        plugin: &str,
        key: &str,
        plaintext: &str,
        master: &MasterKey,
    ) -> Result<(), PgError> {
        check_config_names(plugin, key)?;
        let sealed = master
            .seal(plugin, key, plaintext.as_bytes())
            .map_err(secret)?;
        self.put_sealed(plugin, key, &sealed).await
    }

    /// Stores an already sealed box for `key` of `plugin`.
    pub async fn put_sealed(
        &self,
        plugin: &str,
        key: &str,
        sealed: &Sealed,
    ) -> Result<(), PgError> {
        check_config_names(plugin, key)?;
        let client = self.client().await?;
        client
            .execute(
                &upsert_sealed(),
                &[
                    &plugin,
                    &key,
                    &sealed.key_id,
                    &sealed.nonce,
                    &sealed.ciphertext,
                ],
            )
            .await
            .map_err(|e| self.query_error(format!("set secret {key:?} of plugin {plugin:?}"), e))?;
        Ok(())
    }

    /// Applies every write of `writes` to the settings of `plugin` in one
    /// transaction: all of them are stored, or none.
    pub async fn config_write_all(
        &self,
        plugin: &str,
        writes: &[(String, ConfigWrite)],
    ) -> Result<(), PgError> {
        for (key, _) in writes {
            check_config_names(plugin, key)?;
        }
        let action = || format!("set the config of plugin {plugin:?}");
        let err = |e| self.query_error(action(), e);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(err)?;
        for (key, write) in writes {
            match write {
                ConfigWrite::Plain(v) => {
                    tx.execute(&upsert_plain(), &[&plugin, key, &v.to_string()])
                        .await
                }
                ConfigWrite::Sealed(s) => {
                    tx.execute(
                        &upsert_sealed(),
                        &[&plugin, key, &s.key_id, &s.nonce, &s.ciphertext],
                    )
                    .await
                }
                ConfigWrite::Unset => {
                    tx.execute(
                        "DELETE FROM plugin_config WHERE plugin_id = $1 AND key = $2",
                        &[&plugin, key],
                    )
                    .await
                }
            }
            .map_err(err)?;
        }
        tx.commit().await.map_err(err)
    }

    /// Removes the value of `key`; `false` if none was set.
    pub async fn config_unset(&self, plugin: &str, key: &str) -> Result<bool, PgError> {
        check_config_names(plugin, key)?;
        let client = self.client().await?;
        let n = client
            .execute(
                "DELETE FROM plugin_config WHERE plugin_id = $1 AND key = $2",
                &[&plugin, &key],
            )
            .await
            .map_err(|e| {
                self.query_error(format!("unset config {key:?} of plugin {plugin:?}"), e)
            })?;
        Ok(n > 0)
    }

    /// Every stored value of `plugin`, by key (secrets still sealed).
    pub async fn config_values(&self, plugin: &str) -> Result<Vec<(String, StoredValue)>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT key, value, key_id, nonce, ciphertext FROM plugin_config
                 WHERE plugin_id = $1 ORDER BY key",
                &[&plugin],
            )
            .await
            .map_err(|e| self.query_error(format!("read config of plugin {plugin:?}"), e))?;
        rows.iter().map(|r| self.decode_config(plugin, r)).collect()
    }

    /// The stored value of one key, if any.
    pub async fn config_value(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<Option<StoredValue>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT key, value, key_id, nonce, ciphertext FROM plugin_config
                 WHERE plugin_id = $1 AND key = $2",
                &[&plugin, &key],
            )
            .await
            .map_err(|e| {
                self.query_error(format!("read config {key:?} of plugin {plugin:?}"), e)
            })?;
        row.map(|r| self.decode_config(plugin, &r).map(|(_, v)| v))
            .transpose()
    }

    /// Re-seals every secret of every plugin from `old` to `new` in one
    /// transaction holding their rows: all move to the new key or none does.
    pub async fn rotate_secrets(
        &self,
        old: &MasterKey,
        new: &MasterKey,
    ) -> Result<Rotation, PgError> {
        if old.id() == new.id() {
            return Err(PgError::Invalid {
                what: "the new master key".to_owned(),
                problem: "it is the same as the current one; use a fresh key",
            });
        }
        let reseal = |plugin: &str, key: &str, sealed: &Sealed| {
            let plain = old.open(plugin, key, sealed)?;
            new.seal(plugin, key, plain.as_bytes())
        };
        self.reseal_secrets(old.id(), new.id(), &reseal).await
    }

    /// Re-seals every stored secret with `reseal` (plugin, key, the box as
    /// stored → the new box) in one transaction holding their rows: all
    /// move or none does (a failing `reseal` rolls back every one).
    /// `old_key_id` and `new_key_id` are reported back in the [`Rotation`].
    pub async fn reseal_secrets<E>(
        &self,
        old_key_id: &str,
        new_key_id: &str,
        reseal: &(dyn Fn(&str, &str, &Sealed) -> Result<Sealed, E> + Send + Sync),
    ) -> Result<Rotation, PgError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let action = || "rotate the master key".to_owned();
        let err = |e| self.query_error(action(), e);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(err)?;
        let rows = tx
            .query(
                "SELECT plugin_id, key, key_id, nonce, ciphertext FROM plugin_config
                 WHERE ciphertext IS NOT NULL ORDER BY plugin_id, key FOR UPDATE",
                &[],
            )
            .await
            .map_err(err)?;
        let update = tx
            .prepare(
                "UPDATE plugin_config SET key_id = $3, nonce = $4, ciphertext = $5
                 WHERE plugin_id = $1 AND key = $2",
            )
            .await
            .map_err(err)?;
        for r in &rows {
            let (plugin, key): (&str, &str) = (r.get(0), r.get(1));
            let sealed = Sealed {
                key_id: r.get::<_, Option<String>>(2).unwrap_or_default(),
                nonce: r.get::<_, Option<Vec<u8>>>(3).unwrap_or_default(),
                ciphertext: r.get(4),
            };
            let fresh = reseal(plugin, key, &sealed).map_err(secret)?;
            tx.execute(
                &update,
                &[
                    &plugin,
                    &key,
                    &fresh.key_id,
                    &fresh.nonce,
                    &fresh.ciphertext,
                ],
            )
            .await
            .map_err(err)?;
        }
        // The cluster's record names the new key in the same transaction:
        // every node must then start with it (one with the old key is
        // refused, naming both ids).
        // (A database never made a cluster has no record.)
        let clustered: bool = tx
            .query_one("SELECT to_regclass('plugd_cluster') IS NOT NULL", &[])
            .await
            .map_err(err)?
            .get(0);
        if clustered {
            tx.execute(
                "UPDATE plugd_cluster SET key_id = $2 WHERE id = 1 AND key_id = $1",
                &[&old_key_id, &new_key_id],
            )
            .await
            .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(Rotation {
            resealed: rows.len(),
            old_key_id: old_key_id.to_owned(),
            new_key_id: new_key_id.to_owned(),
        })
    }

    /// Ids of the keys the stored secrets are sealed with.
    pub async fn secret_key_ids(&self) -> Result<Vec<String>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT DISTINCT key_id FROM plugin_config
                 WHERE ciphertext IS NOT NULL AND key_id IS NOT NULL ORDER BY 1",
                &[],
            )
            .await
            .map_err(|e| self.query_error("list secret key ids", e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// The names of org `org_id`'s secrets, sorted (never their values).
    pub async fn org_secret_names(&self, org_id: &str) -> Result<Vec<String>, PgError> {
        Ok(self
            .config_values(&org_secret_owner(org_id))
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// Stores org `org_id`'s secret `name`, sealed with the configured
    /// master key (`PLUGD_MASTER_KEY` or its key file; never created here).
    pub async fn org_secret_set(
        &self,
        org_id: &str,
        name: &str,
        value: &str,
    ) -> Result<(), PgError> {
        check_org_secret(org_id, name, value)?;
        let master = KeySource::from_env()
            .and_then(|s| s.require())
            .map_err(secret)?;
        self.config_set_secret(&org_secret_owner(org_id), name, value, &master)
            .await
    }

    /// Removes org `org_id`'s secret `name`; `false` when it had none.
    pub async fn org_secret_delete(&self, org_id: &str, name: &str) -> Result<bool, PgError> {
        self.config_unset(&org_secret_owner(org_id), name).await
    }

    /// Whether org `org_id` has a secret `name`.
    pub async fn org_secret_exists(&self, org_id: &str, name: &str) -> Result<bool, PgError> {
        Ok(self
            .config_value(&org_secret_owner(org_id), name)
            .await?
            .is_some())
    }

    fn decode_config(
        &self,
        plugin: &str,
        r: &tokio_postgres::Row,
    ) -> Result<(String, StoredValue), PgError> {
        let key: String = r.get(0);
        let damaged = |detail: String| PgError::Damaged {
            db: self.label().to_owned(),
            what: format!("config {key:?} of plugin {plugin:?}"),
            detail,
        };
        let value: Option<&str> = r.get(1);
        let ciphertext: Option<Vec<u8>> = r.get(4);
        let v = match (value, ciphertext) {
            (Some(text), None) => StoredValue::Plain(
                serde_json::from_str(text).map_err(|e| damaged(format!("it is not JSON ({e})")))?,
            ),
            (None, Some(ciphertext)) => StoredValue::Secret(Sealed {
                key_id: r.get::<_, Option<String>>(2).unwrap_or_default(),
                nonce: r.get::<_, Option<Vec<u8>>>(3).unwrap_or_default(),
                ciphertext,
            }),
            _ => return Err(damaged("it has no value".to_owned())),
        };
        Ok((key, v))
    }
}
