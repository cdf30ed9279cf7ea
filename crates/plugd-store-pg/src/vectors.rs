//! The built-in vector index on PostgreSQL: a plain table (no pgvector, not
//! in Debian 12), exact cosine search scored in Rust.
//!
//! Same operations, limits and meaning as `plugd-store`'s `vectors.rs`,
//! embeddings stored as the same little-endian `f32` bytes (`bytea`). A
//! collection's dimension is fixed by its first record; the upsert creates
//! the collection row and checks the dimension inside its transaction (the
//! collection row locked `FOR SHARE`), so two nodes creating one collection
//! with different dimensions at once cannot both succeed.

use plugd_control::store::vectors::{
    MAX_LIMIT, VectorMatch, VectorRecord, VectorStoreError, check_name, check_search, check_upsert,
    cosine, from_blob, matches_filter, to_blob,
};
use serde_json::Value;

use crate::{PgError, PgStore};

/// Why a vector operation failed (the nexo `-33301..-33304` cases), as
/// `plugd_control::store::VectorStoreError` says them (`store_impl.rs` maps one to the other).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VectorError {
    /// No such collection (`-33301`).
    #[error("collection {collection:?} not found")]
    CollectionNotFound {
        /// The collection.
        collection: String,
    },
    /// The embedding's dimension is not the collection's (`-33302`).
    #[error("dimension mismatch: expected {expected}, got {got}")]
    DimensionMismatch {
        /// The collection's dimension.
        expected: usize,
        /// The one given.
        got: usize,
    },
    /// Bad input (`-32602`).
    #[error("{0}")]
    Invalid(String),
    /// The store failed (`-33304`).
    #[error("write failed: {0}")]
    Store(#[from] PgError),
}

/// A shared check's refusal as this module's error.
fn checked(e: VectorStoreError) -> VectorError {
    match e {
        VectorStoreError::Invalid(m) => VectorError::Invalid(m),
        other => VectorError::Invalid(other.to_string()),
    }
}

impl PgStore {
    async fn collection_dimension(&self, collection: &str) -> Result<Option<usize>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT dimension FROM vector_collections WHERE name = $1",
                &[&collection],
            )
            .await
            .map_err(|e| self.query_error(format!("read vector collection {collection:?}"), e))?;
        Ok(row.map(|r| r.get::<_, i64>(0) as usize))
    }

    /// Inserts or replaces `records` in `collection` (created on first use
    /// with the first record's dimension), in one transaction. Returns how
    /// many were written.
    pub async fn vector_upsert(
        &self,
        collection: &str,
        records: &[VectorRecord],
    ) -> Result<usize, VectorError> {
        check_upsert(collection, records).map_err(checked)?;
        let Some(first) = records.first() else {
            return Ok(0);
        };
        let action = || format!("upsert into vector collection {collection:?}");
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        tx.execute(
            "INSERT INTO vector_collections (name, dimension) VALUES ($1, $2)
             ON CONFLICT (name) DO NOTHING",
            &[&collection, &(first.embedding.len() as i64)],
        )
        .await
        .map_err(|e| self.query_error(action(), e))?;
        let expected = tx
            .query_one(
                "SELECT dimension FROM vector_collections WHERE name = $1 FOR SHARE",
                &[&collection],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?
            .get::<_, i64>(0) as usize;
        if let Some(bad) = records.iter().find(|r| r.embedding.len() != expected) {
            return Err(VectorError::DimensionMismatch {
                expected,
                got: bad.embedding.len(),
            });
        }
        let stmt = tx
            .prepare(
                "INSERT INTO vector_records (collection, id, content, embedding, metadata)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (collection, id) DO UPDATE SET
                   content = excluded.content, embedding = excluded.embedding,
                   metadata = excluded.metadata",
            )
            .await
            .map_err(|e| self.query_error(action(), e))?;
        for r in records {
            let meta = if r.metadata.is_null() {
                "{}".to_owned()
            } else {
                r.metadata.to_string()
            };
            tx.execute(
                &stmt,
                &[
                    &collection,
                    &r.id,
                    &r.content,
                    &to_blob(&r.embedding),
                    &meta,
                ],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?;
        }
        tx.commit()
            .await
            .map_err(|e| self.query_error(action(), e))?;
        Ok(records.len())
    }

    /// The `limit` records of `collection` most similar to `embedding`
    /// (cosine, best first) whose metadata matches `filter`.
    pub async fn vector_search(
        &self,
        collection: &str,
        embedding: &[f32],
        limit: usize,
        filter: Option<&Value>,
    ) -> Result<Vec<VectorMatch>, VectorError> {
        let filter = check_search(collection, embedding, filter).map_err(checked)?;
        let expected = self
            .collection_dimension(collection)
            .await?
            .ok_or_else(|| VectorError::CollectionNotFound {
                collection: collection.to_owned(),
            })?;
        if embedding.len() != expected {
            return Err(VectorError::DimensionMismatch {
                expected,
                got: embedding.len(),
            });
        }
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, content, embedding, metadata FROM vector_records WHERE collection = $1",
                &[&collection],
            )
            .await
            .map_err(|e| self.query_error(format!("search vector collection {collection:?}"), e))?;
        let mut scored: Vec<VectorMatch> = Vec::new();
        for r in &rows {
            let metadata: Value = serde_json::from_str(r.get::<_, &str>(3)).unwrap_or(Value::Null);
            if !matches_filter(&metadata, &filter) {
                continue;
            }
            scored.push(VectorMatch {
                id: r.get(0),
                content: r.get(1),
                score: cosine(embedding, &from_blob(r.get::<_, &[u8]>(2))),
                metadata,
            });
        }
        scored.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
        scored.truncate(limit.clamp(1, MAX_LIMIT));
        Ok(scored)
    }

    /// Deletes the records `ids` of `collection`; returns how many existed.
    pub async fn vector_delete(
        &self,
        collection: &str,
        ids: &[String],
    ) -> Result<usize, VectorError> {
        check_name(collection, "collection").map_err(checked)?;
        if self.collection_dimension(collection).await?.is_none() {
            return Err(VectorError::CollectionNotFound {
                collection: collection.to_owned(),
            });
        }
        let client = self.client().await?;
        let n = client
            .execute(
                "DELETE FROM vector_records WHERE collection = $1 AND id = ANY($2)",
                &[&collection, &ids],
            )
            .await
            .map_err(|e| {
                self.query_error(format!("delete from vector collection {collection:?}"), e)
            })?;
        Ok(n as usize)
    }
}
