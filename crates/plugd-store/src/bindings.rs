//! Bindings and tenancy on SQLite: `plugd-control`'s [`BindingStore`] for
//! [`Store`], the org (and projects) an API token is bound to, and the
//! per-org secrets that `secret://ORG/NAME` references resolve to.
//!
//! One row per binding; the columns a listing filters on (org, export,
//! package, status) are columns, the rest of the record is one JSON
//! document. Org secrets are sealed settings like every other secret
//! (`crate::secrets`), stored under the reserved owner `@org:ORG`
//! ([`org_secret_owner`]): the AES-GCM associated data binds each box to
//! its org and name, so a ciphertext copied into another org fails to open,
//! and no plugin id can start with `@`.

use plugd_control::bindings::{Binding, BindingFilter, BindingStatus};
use rusqlite::params;

use crate::error::StoreError;
use crate::secrets::KeySource;
use crate::store::Store;

/// Schema step: bindings, and tokens bound to an org and projects.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE bindings (
        binding_id TEXT PRIMARY KEY NOT NULL,
        org_id     TEXT NOT NULL,
        export_id  TEXT NOT NULL,
        package_id TEXT NOT NULL,
        status     TEXT NOT NULL,
        record     TEXT NOT NULL
    ) STRICT;
    CREATE INDEX bindings_scope ON bindings (org_id, export_id);
    ALTER TABLE api_tokens ADD COLUMN org_id TEXT;
    ALTER TABLE api_tokens ADD COLUMN project_ids TEXT;
";

pub use plugd_control::bindings::MAX_SECRET_BYTES;

/// A fresh binding id: `bind_` and 16 hex digits from the OS RNG.
pub fn new_binding_id() -> Result<String, StoreError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| StoreError::Random(e.to_string()))?;
    Ok(format!("bind_{}", hex::encode(b)))
}

/// The settings owner org `org_id`'s secrets are sealed under.
pub fn org_secret_owner(org_id: &str) -> String {
    format!("@org:{org_id}")
}

impl Store {
    /// Runs `sql` with `b`'s columns as `?1..?6` (id, org, export, package,
    /// status, record); the rows it changed.
    fn write_binding(&self, sql: &str, b: &Binding) -> rusqlite::Result<usize> {
        let record = serde_json::to_string(b)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        self.lock().execute(
            sql,
            params![
                b.binding_id,
                b.scope.org_id,
                b.export_id,
                b.package_id,
                b.status.as_str(),
                record
            ],
        )
    }

    /// The names of org `org_id`'s secrets, sorted (never their values).
    pub fn org_secret_names(&self, org_id: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .config_values(&org_secret_owner(org_id))?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// Stores org `org_id`'s secret `name`, sealed with the master key
    /// (created when there is none yet, as `plugd secrets set` does),
    /// replacing an earlier value.
    pub fn org_secret_set(&self, org_id: &str, name: &str, value: &str) -> Result<(), StoreError> {
        plugd_control::bindings::check_org_secret(org_id, name, value)?;
        let master = KeySource::from_env().and_then(|s| s.load_or_create())?;
        self.config_set_secret(&org_secret_owner(org_id), name, value, &master)
    }

    /// Removes org `org_id`'s secret `name`; `false` when it had none. A
    /// binding that still references it fails its next call with the slot
    /// named (and its `:validate` says so).
    pub fn org_secret_delete(&self, org_id: &str, name: &str) -> Result<bool, StoreError> {
        self.config_unset(&org_secret_owner(org_id), name)
    }

    /// Whether org `org_id` has a secret `name`.
    pub fn org_secret_exists(&self, org_id: &str, name: &str) -> Result<bool, StoreError> {
        Ok(self
            .config_value(&org_secret_owner(org_id), name)?
            .is_some())
    }
}

impl Store {
    pub fn insert_binding(&self, b: &Binding) -> Result<(), StoreError> {
        let result = self.write_binding(
            "INSERT INTO bindings (binding_id, org_id, export_id, package_id, status, record)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            b,
        );
        match result {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(StoreError::Conflict(format!(
                    "binding {:?} exists already",
                    b.binding_id
                )))
            }
            Err(e) => Err(self.query_error(format!("create binding {}", b.binding_id), e)),
        }
    }

    pub fn binding(&self, binding_id: &str) -> Result<Option<Binding>, StoreError> {
        let mut rows = self.select_bindings(
            "WHERE binding_id = ?1",
            &[&binding_id],
            &format!("read binding {binding_id:?}"),
        )?;
        Ok(rows.pop())
    }

    pub fn bindings(&self, filter: &BindingFilter) -> Result<Vec<Binding>, StoreError> {
        let status = filter.status.map(BindingStatus::as_str);
        let rows = self.select_bindings(
            "WHERE (?1 IS NULL OR org_id = ?1) AND (?2 IS NULL OR export_id = ?2)
               AND (?3 IS NULL OR package_id = ?3) AND (?4 IS NULL OR status = ?4)",
            &[
                &filter.org_id,
                &filter.export_id,
                &filter.package_id,
                &status,
            ],
            "list bindings",
        )?;
        Ok(rows)
    }

    pub fn update_binding(&self, b: &Binding) -> Result<bool, StoreError> {
        let n = self
            .write_binding(
                "UPDATE bindings SET org_id = ?2, export_id = ?3, package_id = ?4, status = ?5,
                 record = ?6 WHERE binding_id = ?1",
                b,
            )
            .map_err(|e| self.query_error(format!("update binding {}", b.binding_id), e))?;
        Ok(n == 1)
    }
}

impl Store {
    fn select_bindings(
        &self,
        filter: &str,
        args: &[&dyn rusqlite::ToSql],
        action: &str,
    ) -> Result<Vec<Binding>, StoreError> {
        let conn = self.lock();
        let rows = conn
            .prepare_cached(&format!(
                "SELECT binding_id, record FROM bindings {filter} ORDER BY org_id, export_id, binding_id"
            ))
            .and_then(|mut s| {
                s.query_map(args, |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| self.query_error(action.to_owned(), e))?;
        drop(conn);
        rows.into_iter()
            .map(|(id, record)| {
                serde_json::from_str(&record).map_err(|e| StoreError::Damaged {
                    db: self.label().to_owned(),
                    what: format!("binding {id}"),
                    detail: format!("record is not the expected JSON: {e}"),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_ids_are_fresh_and_shaped() {
        let (x, y) = (new_binding_id().unwrap(), new_binding_id().unwrap());
        assert_ne!(x, y);
        assert!(x.starts_with("bind_") && x.len() == 21, "{x}");
    }

    #[test]
    fn tokens_keep_their_org_and_projects_and_old_tokens_stay_unscoped() {
        use crate::tokens::{Role, Tenancy};
        let store = Store::open_in_memory().unwrap();
        let plain = store
            .token_create("ops", Role::Operator, None, "root")
            .unwrap();
        let t = Tenancy {
            org_id: "org_a".into(),
            project_ids: vec!["p1".into(), "p2".into()],
        };
        let scoped = store
            .token_create_scoped("a", Role::Viewer, None, "root", None, Some(&t))
            .unwrap();
        let seen = store.token_verify(&scoped.token).unwrap().unwrap();
        assert_eq!(seen.org_id.as_deref(), Some("org_a"));
        assert_eq!(seen.project_ids, ["p1", "p2"]);
        let seen = store.token_verify(&plain.token).unwrap().unwrap();
        assert_eq!((seen.org_id, seen.project_ids.len()), (None, 0));
        // Both made in the same millisecond: find them by name, not place.
        let listed = store.token_list().unwrap();
        let by_name = |n: &str| listed.iter().find(|t| t.name == n).unwrap();
        assert_eq!(by_name("a").org_id.as_deref(), Some("org_a"));
        let v = serde_json::to_value(by_name("ops")).unwrap();
        assert!(v.get("org_id").is_none(), "{v}");
    }
}
