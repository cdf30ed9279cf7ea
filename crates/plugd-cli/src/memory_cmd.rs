//! `plugd memory add|search|list`: the agents' long-term memory in the state
//! store (what plugins read through `memory.recall`); add and search follow
//! `plugd.yaml`'s `memory:` section (keyword or semantic recall, see
//! `plugd_agent::recall`).

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use plugd_agent::recall::MemoryExt;
use plugd_agent::vector::VectorExt;
use plugd_runtime::Runtime;
use plugd_store::memory::{DEFAULT_RECALL_LIMIT, MAX_RECALL_LIMIT, MemoryEntry};
use plugd_store::vectors::VectorRecord;
use serde_json::{Value, json};

/// `plugd memory …`.
#[derive(Subcommand, Debug)]
pub enum MemoryCmd {
    /// Store a memory for an agent and print its id (and embed it when
    /// memory.embedder is set in plugd.yaml).
    Add {
        /// The agent it belongs to.
        #[arg(long, value_name = "ID")]
        agent: String,
        /// What to remember.
        #[arg(value_name = "TEXT")]
        text: String,
        /// A label (repeatable); labels are searched too.
        #[arg(long = "tag", value_name = "T")]
        tags: Vec<String>,
    },
    /// Search an agent's memories, best match first: semantic when
    /// memory.embedder is set in plugd.yaml, full-text otherwise.
    Search {
        /// The agent whose memories to search.
        #[arg(long, value_name = "ID")]
        agent: String,
        /// What to look for (full-text: any of its words).
        #[arg(value_name = "QUERY")]
        query: String,
        /// Most results (default 10, at most 1000).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Print a JSON array of entries (id, agent_id, content, tags, created_at).
        #[arg(long)]
        json: bool,
    },
    /// An agent's memories, newest first.
    List {
        /// The agent whose memories to list.
        #[arg(long, value_name = "ID")]
        agent: String,
        /// Most entries (default 1000).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Print a JSON array of entries.
        #[arg(long)]
        json: bool,
    },
    /// Vector memory: the built-in index or a backend plugin.
    #[command(subcommand)]
    Vector(VectorCmd),
}

/// `plugd memory vector …`.
#[derive(Subcommand, Debug)]
pub enum VectorCmd {
    /// Insert or replace records; prints {"count": N}.
    Upsert {
        /// `builtin`, or a name a plugin declares in [plugin.extends].memory_backends.
        #[arg(long, default_value = "builtin")]
        backend: String,
        /// The collection.
        #[arg(long)]
        collection: String,
        /// The records, a JSON array of {id, content?, embedding, metadata?}.
        #[arg(long, value_name = "JSON", conflicts_with_all = ["id", "embedding"])]
        records: Option<String>,
        /// One record's id (with --embedding).
        #[arg(long, requires = "embedding")]
        id: Option<String>,
        /// One record's embedding, a JSON array of numbers.
        #[arg(long, value_name = "JSON")]
        embedding: Option<String>,
        /// One record's content.
        #[arg(long, default_value = "")]
        content: String,
        /// One record's metadata, a JSON object.
        #[arg(long, value_name = "JSON")]
        metadata: Option<String>,
    },
    /// The records most similar to an embedding, best first, as JSON.
    Search {
        /// `builtin`, or a plugin's backend name.
        #[arg(long, default_value = "builtin")]
        backend: String,
        /// The collection.
        #[arg(long)]
        collection: String,
        /// The query embedding, a JSON array of numbers.
        #[arg(long, value_name = "JSON")]
        embedding: String,
        /// Most matches (default 10).
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Metadata to match, a JSON object (the backend interprets it).
        #[arg(long, value_name = "JSON")]
        filter: Option<String>,
    },
    /// Delete records by id; prints {"count": N}.
    Delete {
        /// `builtin`, or a plugin's backend name.
        #[arg(long, default_value = "builtin")]
        backend: String,
        /// The collection.
        #[arg(long)]
        collection: String,
        /// Record ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

fn json_arg<T: serde::de::DeserializeOwned>(flag: &str, text: &str) -> Result<T> {
    serde_json::from_str(text)
        .with_context(|| format!("{flag} is not valid JSON of the expected shape: {text:?}"))
}

/// Runs `plugd memory vector …`.
pub async fn vector(rt: &Runtime, cmd: &VectorCmd) -> Result<()> {
    match cmd {
        VectorCmd::Upsert {
            backend,
            collection,
            records,
            id,
            embedding,
            content,
            metadata,
        } => {
            let records: Vec<VectorRecord> = match (records, id, embedding) {
                (Some(r), _, _) => json_arg("--records", r)?,
                (None, Some(id), Some(e)) => vec![VectorRecord {
                    id: id.clone(),
                    content: content.clone(),
                    embedding: json_arg("--embedding", e)?,
                    metadata: match metadata {
                        Some(m) => json_arg("--metadata", m)?,
                        None => json!({}),
                    },
                }],
                _ => bail!("give --records JSON, or --id with --embedding"),
            };
            let b = rt.vector_backend(backend)?;
            let n = b
                .upsert(collection, records)
                .await
                .with_context(|| format!("backend {backend:?}, collection {collection:?}"))?;
            println!("{}", json!({ "count": n }));
        }
        VectorCmd::Search {
            backend,
            collection,
            embedding,
            limit,
            filter,
        } => {
            let embedding: Vec<f32> = json_arg("--embedding", embedding)?;
            let filter: Option<Value> = filter
                .as_deref()
                .map(|f| json_arg("--filter", f))
                .transpose()?;
            let b = rt.vector_backend(backend)?;
            let matches = b
                .search(collection, embedding, *limit, filter)
                .await
                .with_context(|| format!("backend {backend:?}, collection {collection:?}"))?;
            println!("{}", serde_json::to_string_pretty(&matches)?);
        }
        VectorCmd::Delete {
            backend,
            collection,
            ids,
        } => {
            let b = rt.vector_backend(backend)?;
            let n = b
                .delete(collection, ids.clone())
                .await
                .with_context(|| format!("backend {backend:?}, collection {collection:?}"))?;
            println!("{}", json!({ "count": n }));
        }
    }
    Ok(())
}

/// Runs `plugd memory …`.
pub async fn run(rt: &Runtime, cmd: &MemoryCmd) -> Result<()> {
    let store = rt.state();
    match cmd {
        MemoryCmd::Vector(v) => vector(rt, v).await?,
        MemoryCmd::Add { agent, text, tags } => {
            let entry = rt.memory_add(agent, text, tags).await?;
            println!("{}", entry.id);
        }
        MemoryCmd::Search {
            agent,
            query,
            limit,
            json,
        } => {
            if *limit == Some(0) || limit.is_some_and(|n| n > MAX_RECALL_LIMIT) {
                bail!("--limit must be between 1 and {MAX_RECALL_LIMIT}");
            }
            let hits = rt
                .memory_recall(agent, query, limit.or(Some(DEFAULT_RECALL_LIMIT)))
                .await?;
            print_entries(&hits, *json)?;
        }
        MemoryCmd::List { agent, limit, json } => {
            let entries = store
                .memory_list(agent, limit.unwrap_or(MAX_RECALL_LIMIT))
                .await?;
            print_entries(&entries, *json)?;
        }
    }
    Ok(())
}

fn print_entries(entries: &[MemoryEntry], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(entries)?);
        return Ok(());
    }
    for e in entries {
        let tags = if e.tags.is_empty() {
            String::new()
        } else {
            format!(" [{}]", e.tags.join(", "))
        };
        println!(
            "{}  {}  {}{tags}",
            e.id,
            e.created_at,
            e.content.replace('\n', " ")
        );
    }
    Ok(())
}
