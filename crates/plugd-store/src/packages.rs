//! The installed-package inventory on SQLite: `plugd-control`'s
//! [`PackageStore`] for [`Store`].
//!
//! One row per OCI manifest digest (the primary key), with
//! `(package_id, version)` unique as well, so a second artifact claiming an
//! installed version is refused rather than replacing it. The columns a
//! query filters on are columns; the rest of the record (exports, signature,
//! counts) is one JSON document.
//!
//! The trait lives in `plugd-control` and this crate implements it (not the
//! other way round): the domain stays free of SQLite, and a PostgreSQL
//! backend is another implementation of the same trait.

use std::path::PathBuf;

use plugd_control::packages::{
    Digest, Inserted, Package, PackageExport, PackageSelector, SignatureStatus,
};
use rusqlite::{OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::store::Store;

/// Schema step: installed packages.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE packages (
        digest       TEXT PRIMARY KEY NOT NULL,
        package_id   TEXT NOT NULL,
        version      TEXT NOT NULL,
        source       TEXT NOT NULL,
        installed_at TEXT NOT NULL,
        installed_by TEXT NOT NULL,
        path         TEXT NOT NULL,
        record       TEXT NOT NULL
    ) STRICT;
    CREATE UNIQUE INDEX packages_version ON packages (package_id, version);
";

/// Schema step: the tree digest of a package's directory as installed,
/// checked before every start of its process. NULL for rows written before
/// this step (development builds only): those are digested at first load.
pub(crate) const TREE_DIGEST_MIGRATION: &str = "ALTER TABLE packages ADD COLUMN tree_digest TEXT;";

/// The JSON part of a row.
#[derive(Serialize, Deserialize)]
struct Record {
    manifest: String,
    exports: Vec<PackageExport>,
    signature: SignatureStatus,
    files: u64,
    size: u64,
}

const COLUMNS: &str =
    "digest, package_id, version, source, installed_at, installed_by, path, record, tree_digest";

/// A row's columns in [`COLUMNS`] order (the nullable `tree_digest` last).
type Raw = ([String; 8], Option<String>);

fn raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    let mut out = <[String; 8]>::default();
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = r.get(i)?;
    }
    Ok((out, r.get(8)?))
}

impl Store {
    fn decode_package(&self, (r, tree_digest): Raw) -> Result<Package, StoreError> {
        let [
            digest,
            package_id,
            version,
            source,
            installed_at,
            installed_by,
            path,
            record,
        ] = r;
        let damaged = |detail: String| StoreError::Damaged {
            db: self.label().to_owned(),
            what: format!("package {digest}"),
            detail,
        };
        let d = Digest::parse(&digest).map_err(|e| damaged(e.to_string()))?;
        let rec: Record = serde_json::from_str(&record)
            .map_err(|e| damaged(format!("record is not the expected JSON: {e}")))?;
        Ok(Package {
            package_id,
            version,
            digest: d,
            source,
            installed_at,
            installed_by,
            path: PathBuf::from(path),
            manifest: rec.manifest,
            exports: rec.exports,
            signature: rec.signature,
            files: rec.files,
            size: rec.size,
            tree_digest,
        })
    }

    fn select_packages(
        &self,
        filter: &str,
        args: &[&dyn rusqlite::ToSql],
        action: &str,
    ) -> Result<Vec<Package>, StoreError> {
        let conn = self.lock();
        let rows = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM packages {filter} ORDER BY package_id, installed_at, digest"
            ))
            .and_then(|mut s| {
                s.query_map(args, raw)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| self.query_error(action.to_owned(), e))?;
        drop(conn);
        rows.into_iter().map(|r| self.decode_package(r)).collect()
    }
}

impl Store {
    /// The install `sel` names (`PackageStore::find_package`, answered synchronously).
    pub fn find_package(&self, sel: &PackageSelector) -> Result<Option<Package>, StoreError> {
        match sel {
            PackageSelector::Digest(d) => self.package(d),
            PackageSelector::Version {
                package_id,
                version,
            } => Ok(self
                .package_versions(package_id)?
                .into_iter()
                .find(|p| &p.version == version)),
            PackageSelector::Latest(id) => {
                Ok(plugd_control::packages::latest(self.package_versions(id)?))
            }
        }
    }
}

impl Store {
    pub fn insert_package(&self, p: &Package) -> Result<Inserted, StoreError> {
        let record = serde_json::to_string(&Record {
            manifest: p.manifest.clone(),
            exports: p.exports.clone(),
            signature: p.signature.clone(),
            files: p.files,
            size: p.size,
        })
        .map_err(|e| StoreError::Damaged {
            db: self.label().to_owned(),
            what: format!("package {}", p.digest),
            detail: format!("cannot encode its record: {e}"),
        })?;
        let path = plugd_control::packages::package_path(p)?;
        let action = || {
            format!(
                "install package {}@{} ({})",
                p.package_id, p.version, p.digest
            )
        };
        let mut conn = self.lock();
        let write = |conn: &mut rusqlite::Connection| -> rusqlite::Result<Result<(), Raw>> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let existing = tx
                .query_row(
                    &format!(
                        "SELECT {COLUMNS} FROM packages WHERE digest = ?1
                         OR (package_id = ?2 AND version = ?3)
                         ORDER BY digest = ?1 DESC LIMIT 1"
                    ),
                    params![p.digest.as_str(), p.package_id, p.version],
                    raw,
                )
                .optional()?;
            if let Some(row) = existing {
                return Ok(Err(row));
            }
            tx.execute(
                &format!(
                    "INSERT INTO packages ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
                ),
                params![
                    p.digest.as_str(),
                    p.package_id,
                    p.version,
                    p.source,
                    p.installed_at,
                    p.installed_by,
                    path,
                    record,
                    p.tree_digest
                ],
            )?;
            tx.commit()?;
            Ok(Ok(()))
        };
        let outcome = write(&mut conn).map_err(|e| self.query_error(action(), e))?;
        drop(conn);
        match outcome {
            Ok(()) => Ok(Inserted::New),
            Err(row) => {
                let found = self.decode_package(row)?;
                Ok(if found.digest == p.digest {
                    Inserted::Existing(found)
                } else {
                    Inserted::VersionTaken(found)
                })
            }
        }
    }

    pub fn package(&self, digest: &Digest) -> Result<Option<Package>, StoreError> {
        let mut rows = self.select_packages(
            "WHERE digest = ?1",
            &[&digest.as_str()],
            &format!("read package {digest}"),
        )?;
        Ok(rows.pop())
    }

    pub fn package_versions(&self, package_id: &str) -> Result<Vec<Package>, StoreError> {
        self.select_packages(
            "WHERE package_id = ?1",
            &[&package_id],
            &format!("read package {package_id:?}"),
        )
    }

    pub fn packages(&self) -> Result<Vec<Package>, StoreError> {
        self.select_packages("", &[], "list packages")
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    use plugd_control::samples::package as pkg;

    #[test]
    fn a_damaged_record_names_the_package() {
        let store = Store::open_in_memory().unwrap();
        let a = pkg("0.1.0", 1);
        store.insert_package(&a).unwrap();
        store
            .lock()
            .execute("UPDATE packages SET record = 'nope'", [])
            .unwrap();
        let err = store.packages().unwrap_err().to_string();
        assert!(err.contains(a.digest.as_str()), "{err}");
    }
}
