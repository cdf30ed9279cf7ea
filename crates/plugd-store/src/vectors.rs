//! The built-in vector index: records with dense embeddings in collections,
//! searched by exact cosine similarity.
//!
//! **Scaling limit**: a search reads every record of the collection and
//! scores it in Rust (no ANN index), so it is linear in the collection size:
//! fine for thousands to tens of thousands of records of a few hundred
//! dimensions, not for millions; use a vector-backend plugin beyond that.
//!
//! A collection's dimension is fixed by its first record; later records and
//! queries of another dimension are refused ([`VectorStoreError::DimensionMismatch`]).
//! A filter is a JSON object whose keys must all equal the same keys of a
//! record's metadata.

use rusqlite::{OptionalExtension, TransactionBehavior, params};
use serde_json::Value;

use plugd_control::store::vectors::{
    check_name, check_search, check_upsert, cosine, from_blob, matches_filter, to_blob,
};

use crate::error::StoreError;
use crate::store::Store;

pub use plugd_control::store::vectors::{
    MAX_BATCH, MAX_DIMENSION, MAX_LIMIT, VectorMatch, VectorRecord, VectorStoreError,
};

/// Schema step: vector collections and records.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE vector_collections (
        name      TEXT PRIMARY KEY NOT NULL,
        dimension INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE vector_records (
        collection TEXT NOT NULL REFERENCES vector_collections (name),
        id         TEXT NOT NULL,
        content    TEXT NOT NULL,
        embedding  BLOB NOT NULL,
        metadata   TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (collection, id)
    ) STRICT;
";

impl Store {
    fn collection_dimension(&self, collection: &str) -> Result<Option<usize>, StoreError> {
        self.lock()
            .query_row(
                "SELECT dimension FROM vector_collections WHERE name = ?1",
                params![collection],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map(|d| d.map(|d| d as usize))
            .map_err(|e| self.query_error(format!("read vector collection {collection:?}"), e))
    }

    /// Inserts or replaces `records` in `collection` (created on first use
    /// with the first record's dimension). Returns how many were written.
    pub fn vector_upsert(
        &self,
        collection: &str,
        records: &[VectorRecord],
    ) -> Result<usize, VectorStoreError> {
        check_upsert(collection, records)?;
        let Some(first) = records.first() else {
            return Ok(0);
        };
        let expected = self
            .collection_dimension(collection)?
            .unwrap_or(first.embedding.len());
        if let Some(bad) = records.iter().find(|r| r.embedding.len() != expected) {
            return Err(VectorStoreError::DimensionMismatch {
                expected,
                got: bad.embedding.len(),
            });
        }
        let action = || format!("upsert into vector collection {collection:?}");
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.query_error(action(), e))?;
        let write = || -> rusqlite::Result<()> {
            tx.execute(
                "INSERT INTO vector_collections (name, dimension) VALUES (?1, ?2)
                 ON CONFLICT (name) DO NOTHING",
                params![collection, expected as i64],
            )?;
            let mut stmt = tx.prepare(
                "INSERT INTO vector_records (collection, id, content, embedding, metadata)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (collection, id) DO UPDATE SET
                   content = excluded.content, embedding = excluded.embedding,
                   metadata = excluded.metadata",
            )?;
            for r in records {
                let meta = if r.metadata.is_null() {
                    "{}".to_owned()
                } else {
                    r.metadata.to_string()
                };
                stmt.execute(params![
                    collection,
                    r.id,
                    r.content,
                    to_blob(&r.embedding),
                    meta
                ])?;
            }
            Ok(())
        };
        write().map_err(|e| self.query_error(action(), e))?;
        tx.commit().map_err(|e| self.query_error(action(), e))?;
        Ok(records.len())
    }

    /// The `limit` records of `collection` most similar to `embedding`
    /// (cosine, best first) whose metadata matches `filter`.
    pub fn vector_search(
        &self,
        collection: &str,
        embedding: &[f32],
        limit: usize,
        filter: Option<&Value>,
    ) -> Result<Vec<VectorMatch>, VectorStoreError> {
        let filter = check_search(collection, embedding, filter)?;
        let expected = self.collection_dimension(collection)?.ok_or_else(|| {
            VectorStoreError::CollectionNotFound {
                collection: collection.to_owned(),
            }
        })?;
        if embedding.len() != expected {
            return Err(VectorStoreError::DimensionMismatch {
                expected,
                got: embedding.len(),
            });
        }
        let action = || format!("search vector collection {collection:?}");
        let conn = self.lock();
        let mut stmt = conn
            .prepare_cached(
                "SELECT id, content, embedding, metadata FROM vector_records WHERE collection = ?1",
            )
            .map_err(|e| self.query_error(action(), e))?;
        let mut scored: Vec<VectorMatch> = Vec::new();
        let rows = stmt
            .query_map(params![collection], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })
            .map_err(|e| self.query_error(action(), e))?;
        for row in rows {
            let (id, content, blob, meta) = row.map_err(|e| self.query_error(action(), e))?;
            let metadata: Value = serde_json::from_str(&meta).unwrap_or(Value::Null);
            if !matches_filter(&metadata, &filter) {
                continue;
            }
            let score = cosine(embedding, &from_blob(&blob));
            scored.push(VectorMatch {
                id,
                content,
                score,
                metadata,
            });
        }
        scored.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
        scored.truncate(limit.clamp(1, MAX_LIMIT));
        Ok(scored)
    }

    /// Deletes the records `ids` of `collection`; returns how many existed.
    pub fn vector_delete(
        &self,
        collection: &str,
        ids: &[String],
    ) -> Result<usize, VectorStoreError> {
        check_name(collection, "collection")?;
        if self.collection_dimension(collection)?.is_none() {
            return Err(VectorStoreError::CollectionNotFound {
                collection: collection.to_owned(),
            });
        }
        let action = || format!("delete from vector collection {collection:?}");
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.query_error(action(), e))?;
        let mut n = 0;
        {
            let mut stmt = tx
                .prepare("DELETE FROM vector_records WHERE collection = ?1 AND id = ?2")
                .map_err(|e| self.query_error(action(), e))?;
            for id in ids {
                n += stmt
                    .execute(params![collection, id])
                    .map_err(|e| self.query_error(action(), e))?;
            }
        }
        tx.commit().map_err(|e| self.query_error(action(), e))?;
        Ok(n)
    }
}
