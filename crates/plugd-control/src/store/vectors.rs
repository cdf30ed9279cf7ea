//! The built-in vector index: records, matches, errors and the [`VectorStore`] trait.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::StoreError;

/// Largest embedding accepted.
pub const MAX_DIMENSION: usize = 8192;

/// Most records in one upsert.
pub const MAX_BATCH: usize = 10_000;

/// Most matches one search returns.
pub const MAX_LIMIT: usize = 1000;

/// One record to store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VectorRecord {
    /// Its id within the collection (an upsert replaces a record of the same id).
    pub id: String,
    /// The text it stands for.
    #[serde(default)]
    pub content: String,
    /// The embedding.
    pub embedding: Vec<f32>,
    /// Opaque metadata (a JSON object), filterable by equality.
    #[serde(default)]
    pub metadata: Value,
}

/// One search result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VectorMatch {
    /// Record id.
    pub id: String,
    /// Record content.
    pub content: String,
    /// Cosine similarity, -1 to 1.
    pub score: f32,
    /// Record metadata.
    pub metadata: Value,
}

/// Why a vector operation failed (the nexo `-33301..-33304` cases).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VectorStoreError {
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
    Store(#[from] StoreError),
}

/// Collections of embeddings searched by cosine similarity.
#[async_trait]
pub trait VectorStore: Send + Sync {
    /// Inserts or replaces `records` in `collection`; how many.
    async fn vector_upsert(
        &self,
        collection: &str,
        records: &[VectorRecord],
    ) -> Result<usize, VectorStoreError>;
    /// The `limit` records nearest `embedding` whose metadata matches `filter`.
    async fn vector_search(
        &self,
        collection: &str,
        embedding: &[f32],
        limit: usize,
        filter: Option<&Value>,
    ) -> Result<Vec<VectorMatch>, VectorStoreError>;
    /// Deletes records by id; how many.
    async fn vector_delete(
        &self,
        collection: &str,
        ids: &[String],
    ) -> Result<usize, VectorStoreError>;
}
