//! Installed plugin packages and plugin bindings on PostgreSQL
//! (`plugd-control`'s `PackageStore` and `BindingStore` operations).
//!
//! Same rows as `plugd-store`'s `packages.rs` and `bindings.rs` (the JSON
//! `record` column byte-compatible). Installing a package relies on SQLite's
//! single writer there; here it is one `INSERT … ON CONFLICT DO NOTHING`
//! over both unique keys (digest; package id and version), so two nodes
//! installing at once get one `New` and one `Existing`/`VersionTaken`.

use std::path::PathBuf;

use plugd_control::bindings::{Binding, BindingFilter, BindingStatus};
use plugd_control::packages::{Digest, Inserted, Package, PackageExport, SignatureStatus};
use serde::{Deserialize, Serialize};

use crate::{PgError, PgStore};

/// The JSON part of a package row (as `plugd-store` writes it).
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

const ORDER: &str = "ORDER BY package_id, installed_at, digest";

impl PgStore {
    fn decode_package(&self, r: &tokio_postgres::Row) -> Result<Package, PgError> {
        let digest: String = r.get(0);
        let damaged = |detail: String| PgError::Damaged {
            db: self.label().to_owned(),
            what: format!("package {digest}"),
            detail,
        };
        let d = Digest::parse(&digest).map_err(|e| damaged(e.to_string()))?;
        let rec: Record = serde_json::from_str(r.get::<_, &str>(7))
            .map_err(|e| damaged(format!("record is not the expected JSON: {e}")))?;
        Ok(Package {
            package_id: r.get(1),
            version: r.get(2),
            digest: d,
            source: r.get(3),
            installed_at: r.get(4),
            installed_by: r.get(5),
            path: PathBuf::from(r.get::<_, String>(6)),
            manifest: rec.manifest,
            exports: rec.exports,
            signature: rec.signature,
            files: rec.files,
            size: rec.size,
            tree_digest: r.get(8),
        })
    }

    /// Records an installed package: `New`, or the row already holding its
    /// digest (`Existing`) or its version (`VersionTaken`), never both rows.
    pub async fn insert_package(&self, p: &Package) -> Result<Inserted, PgError> {
        let record = serde_json::to_string(&Record {
            manifest: p.manifest.clone(),
            exports: p.exports.clone(),
            signature: p.signature.clone(),
            files: p.files,
            size: p.size,
        })
        .map_err(|e| PgError::Damaged {
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
        let client = self.client().await?;
        // A conflicting row can only vanish if deleted (packages never are):
        // two rounds are plenty.
        for _ in 0..2 {
            let inserted = client
                .execute(
                    &format!(
                        "INSERT INTO packages ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                         ON CONFLICT DO NOTHING"
                    ),
                    &[
                        &p.digest.as_str(),
                        &p.package_id,
                        &p.version,
                        &p.source,
                        &p.installed_at,
                        &p.installed_by,
                        &path,
                        &record,
                        &p.tree_digest,
                    ],
                )
                .await
                .map_err(|e| self.query_error(action(), e))?;
            if inserted == 1 {
                return Ok(Inserted::New);
            }
            let existing = client
                .query_opt(
                    &format!(
                        "SELECT {COLUMNS} FROM packages WHERE digest = $1
                            OR (package_id = $2 AND version = $3)
                         ORDER BY digest = $1 DESC LIMIT 1"
                    ),
                    &[&p.digest.as_str(), &p.package_id, &p.version],
                )
                .await
                .map_err(|e| self.query_error(action(), e))?;
            if let Some(row) = existing {
                let found = self.decode_package(&row)?;
                return Ok(if found.digest == p.digest {
                    Inserted::Existing(found)
                } else {
                    Inserted::VersionTaken(found)
                });
            }
        }
        Err(PgError::Conflict(format!(
            "package {}@{} was installed and removed concurrently; install it again",
            p.package_id, p.version
        )))
    }

    /// The package with `digest`.
    pub async fn package(&self, digest: &Digest) -> Result<Option<Package>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {COLUMNS} FROM packages WHERE digest = $1"),
                &[&digest.as_str()],
            )
            .await
            .map_err(|e| self.query_error(format!("read package {digest}"), e))?;
        row.map(|r| self.decode_package(&r)).transpose()
    }

    /// Every installed version of `package_id`.
    pub async fn package_versions(&self, package_id: &str) -> Result<Vec<Package>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!("SELECT {COLUMNS} FROM packages WHERE package_id = $1 {ORDER}"),
                &[&package_id],
            )
            .await
            .map_err(|e| self.query_error(format!("read package {package_id:?}"), e))?;
        rows.iter().map(|r| self.decode_package(r)).collect()
    }

    /// Every installed package.
    pub async fn packages(&self) -> Result<Vec<Package>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(&format!("SELECT {COLUMNS} FROM packages {ORDER}"), &[])
            .await
            .map_err(|e| self.query_error("list packages", e))?;
        rows.iter().map(|r| self.decode_package(r)).collect()
    }

    /// Records a new binding; an existing id is [`PgError::Conflict`].
    pub async fn insert_binding(&self, b: &Binding) -> Result<(), PgError> {
        let record = self.binding_record(b)?;
        let client = self.client().await?;
        let result = client
            .execute(
                "INSERT INTO bindings (binding_id, org_id, export_id, package_id, status, record)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &b.binding_id,
                    &b.scope.org_id,
                    &b.export_id,
                    &b.package_id,
                    &b.status.as_str(),
                    &record,
                ],
            )
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => Err(
                PgError::Conflict(format!("binding {:?} exists already", b.binding_id)),
            ),
            Err(e) => Err(self.query_error(format!("create binding {}", b.binding_id), e)),
        }
    }

    /// The binding `binding_id`.
    pub async fn binding(&self, binding_id: &str) -> Result<Option<Binding>, PgError> {
        let mut rows = self
            .select_bindings(
                "WHERE binding_id = $1",
                &[&binding_id],
                &format!("read binding {binding_id:?}"),
            )
            .await?;
        Ok(rows.pop())
    }

    /// The bindings matching `filter`, by org, export and id.
    pub async fn bindings(&self, filter: &BindingFilter) -> Result<Vec<Binding>, PgError> {
        let status = filter.status.map(BindingStatus::as_str);
        self.select_bindings(
            "WHERE ($1::text IS NULL OR org_id = $1) AND ($2::text IS NULL OR export_id = $2)
               AND ($3::text IS NULL OR package_id = $3) AND ($4::text IS NULL OR status = $4)",
            &[
                &filter.org_id,
                &filter.export_id,
                &filter.package_id,
                &status,
            ],
            "list bindings",
        )
        .await
    }

    /// Replaces the stored binding with `b`'s id; `false` if there is none.
    pub async fn update_binding(&self, b: &Binding) -> Result<bool, PgError> {
        let record = self.binding_record(b)?;
        let client = self.client().await?;
        let n = client
            .execute(
                "UPDATE bindings SET org_id = $2, export_id = $3, package_id = $4, status = $5,
                 record = $6 WHERE binding_id = $1",
                &[
                    &b.binding_id,
                    &b.scope.org_id,
                    &b.export_id,
                    &b.package_id,
                    &b.status.as_str(),
                    &record,
                ],
            )
            .await
            .map_err(|e| self.query_error(format!("update binding {}", b.binding_id), e))?;
        Ok(n == 1)
    }

    fn binding_record(&self, b: &Binding) -> Result<String, PgError> {
        serde_json::to_string(b).map_err(|e| PgError::Damaged {
            db: self.label().to_owned(),
            what: format!("binding {}", b.binding_id),
            detail: format!("cannot encode its record: {e}"),
        })
    }

    async fn select_bindings(
        &self,
        filter: &str,
        args: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        action: &str,
    ) -> Result<Vec<Binding>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT binding_id, record FROM bindings {filter}
                     ORDER BY org_id, export_id, binding_id"
                ),
                args,
            )
            .await
            .map_err(|e| self.query_error(action, e))?;
        rows.iter()
            .map(|r| {
                let id: &str = r.get(0);
                serde_json::from_str(r.get::<_, &str>(1)).map_err(|e| PgError::Damaged {
                    db: self.label().to_owned(),
                    what: format!("binding {id}"),
                    detail: format!("record is not the expected JSON: {e}"),
                })
            })
            .collect()
    }
}
