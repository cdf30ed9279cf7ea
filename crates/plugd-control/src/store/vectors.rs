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

/// Checks an embedding: 1 to [`MAX_DIMENSION`] finite numbers (`what` names it in the message).
pub fn check_embedding(e: &[f32], what: &str) -> Result<(), VectorStoreError> {
    if e.is_empty() || e.len() > MAX_DIMENSION {
        return Err(VectorStoreError::Invalid(format!(
            "{what}: an embedding has 1 to {MAX_DIMENSION} numbers, got {}",
            e.len()
        )));
    }
    if e.iter().any(|x| !x.is_finite()) {
        return Err(VectorStoreError::Invalid(format!(
            "{what}: an embedding holds finite numbers only"
        )));
    }
    Ok(())
}

/// Checks a collection name or record id: 1-128 characters, no control character.
pub fn check_name(name: &str, what: &str) -> Result<(), VectorStoreError> {
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(VectorStoreError::Invalid(format!(
            "{what} {:?}: use 1-128 characters without control characters",
            name.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// Checks an upsert before any write: the collection, the batch size, and
/// each record's id, content (no NUL: PostgreSQL's text holds none, so
/// neither backend takes one), embedding and metadata (a JSON object or null).
pub fn check_upsert(collection: &str, records: &[VectorRecord]) -> Result<(), VectorStoreError> {
    check_name(collection, "collection")?;
    if records.len() > MAX_BATCH {
        return Err(VectorStoreError::Invalid(format!(
            "at most {MAX_BATCH} records per upsert, got {}",
            records.len()
        )));
    }
    for r in records {
        check_name(&r.id, "record id")?;
        if r.content.contains('\0') {
            return Err(VectorStoreError::Invalid(format!(
                "record {:?}: content must not contain NUL",
                r.id
            )));
        }
        check_embedding(&r.embedding, &format!("record {:?}", r.id))?;
        if !(r.metadata.is_object() || r.metadata.is_null()) {
            return Err(VectorStoreError::Invalid(format!(
                "record {:?}: metadata must be a JSON object",
                r.id
            )));
        }
    }
    Ok(())
}

/// Checks a search (collection and query embedding) and returns its filter
/// as a map (empty for none).
pub fn check_search(
    collection: &str,
    embedding: &[f32],
    filter: Option<&Value>,
) -> Result<serde_json::Map<String, Value>, VectorStoreError> {
    check_name(collection, "collection")?;
    check_embedding(embedding, "query")?;
    match filter {
        None | Some(Value::Null) => Ok(serde_json::Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(_) => Err(VectorStoreError::Invalid(
            "filter must be a JSON object of metadata keys and values".into(),
        )),
    }
}

/// An embedding as stored: little-endian `f32`s.
pub fn to_blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An embedding read back from [`to_blob`]'s bytes.
pub fn from_blob(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The cosine similarity of `a` and `b` (0 when either is all zeros).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    (dot / (na.sqrt() * nb.sqrt())) as f32
}

/// Whether `metadata` has every key of `filter` with the same value.
pub fn matches_filter(metadata: &Value, filter: &serde_json::Map<String, Value>) -> bool {
    filter
        .iter()
        .all(|(k, v)| metadata.get(k).is_some_and(|m| m == v))
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
