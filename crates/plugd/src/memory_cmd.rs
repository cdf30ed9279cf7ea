//! `plugd memory add|search|list`: the agents' long-term memory in the state
//! store (what plugins read through `memory.recall`).

use anyhow::{Result, bail};
use clap::Subcommand;
use plugd_runtime::Runtime;
use plugd_store::memory::{DEFAULT_RECALL_LIMIT, MAX_RECALL_LIMIT, MemoryEntry};

/// `plugd memory …`.
#[derive(Subcommand, Debug)]
pub enum MemoryCmd {
    /// Store a memory for an agent and print its id.
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
    /// Full-text search of an agent's memories, best match first.
    Search {
        /// The agent whose memories to search.
        #[arg(long, value_name = "ID")]
        agent: String,
        /// Words to look for (any of them).
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
}

/// Runs `plugd memory …`.
pub fn run(rt: &Runtime, cmd: &MemoryCmd) -> Result<()> {
    let store = rt.store();
    match cmd {
        MemoryCmd::Add { agent, text, tags } => {
            let entry = store.memory_add(agent, text, tags)?;
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
            let hits = store.memory_search(agent, query, limit.or(Some(DEFAULT_RECALL_LIMIT)))?;
            print_entries(&hits, *json)?;
        }
        MemoryCmd::List { agent, limit, json } => {
            let entries = store.memory_list(agent, limit.unwrap_or(MAX_RECALL_LIMIT))?;
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
