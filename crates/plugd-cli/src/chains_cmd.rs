//! `plugd session list|show`, `plugd chain show`, `plugd run list|show` and
//! `plugd run --harness`: sessions, chains and runs (seed 003), read from
//! the workspace's state database directly (what a running serve and
//! earlier commands wrote), and harness runs started from the command line.

use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use plugd_control::chains::{Block, ChainStatus, Run, RunStatus, ScopeFilter};
use plugd_runtime::Runtime;
use plugd_runtime::runs::{HarnessStart, RunPolicy};
use serde_json::{Value, json};

use crate::DelegatedApi;

/// `plugd session …`.
#[derive(Subcommand, Debug)]
pub enum SessionCmd {
    /// List sessions, newest first.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a session: its chains (with lineage), runs and compactions.
    Show {
        /// The session id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `plugd chain …`.
#[derive(Subcommand, Debug)]
pub enum ChainCmd {
    /// Show a chain and its blocks.
    Show {
        /// The chain id (`ch_…`).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `plugd run list|show`.
#[derive(Subcommand, Debug)]
pub enum RunCmd {
    /// List runs (turns and harness runs), newest first.
    List {
        /// Only this session's.
        #[arg(long)]
        session: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one run.
    Show {
        /// The run id (`run_…`).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

async fn open(dir: &Path) -> Result<std::sync::Arc<dyn plugd_store::StateStore>> {
    crate::state::open(dir).await
}

fn print_json(v: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        format!("{}…", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}

fn run_line(r: &Run) -> String {
    let what = r
        .harness
        .clone()
        .unwrap_or_else(|| format!("{:?}", r.kind).to_lowercase());
    let summary = r
        .summary
        .get("text")
        .and_then(Value::as_str)
        .or(r.error.as_deref())
        .unwrap_or("");
    format!(
        "{}  {:<17} {:<8} {}  depth {}  {}  {}",
        r.id,
        r.status.as_str(),
        what,
        r.session_id,
        r.depth,
        r.created_at,
        one_line(summary, 60)
    )
}

/// Runs `plugd session …`.
pub async fn session(dir: &Path, cmd: &SessionCmd) -> Result<()> {
    let store = open(dir).await?;
    match cmd {
        SessionCmd::List { limit, json } => {
            let list = store
                .sessions(&ScopeFilter::default(), (*limit).clamp(1, 10_000), None)
                .await?;
            if *json {
                return print_json(&json!({"sessions": list}));
            }
            if list.is_empty() {
                println!("no sessions yet; `plugd run PROMPT` starts one");
            }
            for s in list {
                let scope = match (&s.org_id, &s.project_id) {
                    (Some(o), Some(p)) => format!("{o}/{p}"),
                    (Some(o), None) => o.clone(),
                    _ => "workspace".into(),
                };
                println!(
                    "{}  {}  {}  head {}",
                    s.id,
                    s.created_at,
                    scope,
                    s.head_chain_id.as_deref().unwrap_or("-")
                );
            }
        }
        SessionCmd::Show { id, json } => {
            let Some(info) = store.session_info(id).await? else {
                bail!("no session {id:?}; `plugd session list` lists them");
            };
            let chains = store.session_chains(id).await?;
            let runs = store.runs(&ScopeFilter::default(), Some(id), 1000).await?;
            let compactions = store.compactions(id).await?;
            if *json {
                return print_json(
                    &json!({"session": info, "chains": chains, "runs": runs, "compactions": compactions}),
                );
            }
            println!("session {}  created {}", info.id, info.created_at);
            if let Some(o) = &info.org_id {
                println!(
                    "org {o}  project {}",
                    info.project_id.as_deref().unwrap_or("-")
                );
            }
            println!("chains (oldest first; lineage: derived ← source):");
            for c in &chains {
                let head = if info.head_chain_id.as_deref() == Some(c.id.as_str()) {
                    " (head)"
                } else {
                    ""
                };
                let status = match c.status {
                    ChainStatus::Active => "active",
                    ChainStatus::Superseded => "superseded",
                };
                let from = c
                    .parent_chain_id
                    .as_ref()
                    .map(|p| format!("  ← {p} by {}", c.compaction_id.as_deref().unwrap_or("?")))
                    .unwrap_or_default();
                println!("  {}{head}  {status}  {} blocks{from}", c.id, c.blocks);
            }
            if !compactions.is_empty() {
                println!("compactions (newest first):");
                for c in &compactions {
                    println!(
                        "  {}  {}  {}  {} → {}  ~{} tokens{}",
                        c.id,
                        c.status,
                        c.compactor,
                        c.source_chain_id,
                        c.derived_chain_id.as_deref().unwrap_or("-"),
                        c.token_estimate,
                        c.error
                            .as_deref()
                            .map(|e| format!("  {}", one_line(e, 80)))
                            .unwrap_or_default()
                    );
                }
            }
            println!("runs (newest first):");
            for r in &runs {
                println!("  {}", run_line(r));
            }
        }
    }
    Ok(())
}

fn block_line(b: &Block) -> String {
    let mut text = b.text();
    if let Some(tool) = b.extra.get("tool").and_then(Value::as_str) {
        text = format!(
            "{tool} {}",
            b.extra
                .get("arguments")
                .map(Value::to_string)
                .unwrap_or_default()
        );
    }
    let note = if b.extra.get("note").and_then(Value::as_bool) == Some(true) {
        " (note)"
    } else {
        ""
    };
    format!(
        "{:>4}  {:<11}{note} {}",
        b.seq,
        b.kind.as_str(),
        one_line(&text, 100)
    )
}

/// Runs `plugd chain …`.
pub async fn chain(dir: &Path, cmd: &ChainCmd) -> Result<()> {
    let store = open(dir).await?;
    match cmd {
        ChainCmd::Show { id, json } => {
            let Some(chain) = store.chain(id).await? else {
                bail!("no chain {id:?}; `plugd session show SESSION` lists a session's chains");
            };
            let blocks = store.chain_blocks(id, 0, usize::MAX).await?;
            if *json {
                let mut v = serde_json::to_value(&chain)?;
                v["blocks"] = json!(blocks);
                return print_json(&v);
            }
            println!(
                "chain {}  session {}  {:?}  {} blocks",
                chain.id, chain.session_id, chain.status, chain.blocks
            );
            if let Some(p) = &chain.parent_chain_id {
                println!(
                    "derived from {p} by compaction {}",
                    chain.compaction_id.as_deref().unwrap_or("?")
                );
            }
            for b in &blocks {
                println!("{}", block_line(b));
            }
        }
    }
    Ok(())
}

/// Runs `plugd run list|show`.
pub async fn run_cmd(dir: &Path, cmd: &RunCmd) -> Result<()> {
    let store = open(dir).await?;
    match cmd {
        RunCmd::List {
            session,
            limit,
            json,
        } => {
            let runs = store
                .runs(
                    &ScopeFilter::default(),
                    session.as_deref(),
                    (*limit).clamp(1, 10_000),
                )
                .await?;
            if *json {
                return print_json(&json!({"runs": runs}));
            }
            if runs.is_empty() {
                println!("no runs yet");
            }
            for r in &runs {
                println!("{}", run_line(r));
            }
        }
        RunCmd::Show { id, json } => {
            let Some(run) = store.run(id).await? else {
                bail!("no run {id:?}; `plugd run list` lists them");
            };
            if *json {
                return print_json(&run);
            }
            print_run(&run);
        }
    }
    Ok(())
}

fn print_run(run: &Run) {
    println!("run {}  {}", run.id, run.status.as_str());
    println!("kind {:?}  session {}", run.kind, run.session_id);
    if let Some(h) = &run.harness {
        println!(
            "harness {h}  mode {}",
            run.mode.as_deref().unwrap_or("start")
        );
    }
    if let Some(c) = &run.chain_id {
        println!("chain {c}");
    }
    if let Some(p) = &run.parent_run_id {
        println!("parent {p}  depth {}", run.depth);
    }
    println!(
        "started {}  ended {}",
        run.created_at,
        run.ended_at.as_deref().unwrap_or("-")
    );
    println!("by {}", run.created_by);
    if let Some(t) = run.summary.get("text").and_then(Value::as_str) {
        println!("summary: {t}");
    }
    if !run.checkpoint.is_null() {
        println!("checkpoint: {}", run.checkpoint);
    }
    if run.artifacts.as_array().is_some_and(|a| !a.is_empty()) {
        println!("artifacts: {}", run.artifacts);
    }
    if let Some(e) = &run.error {
        println!("error: {e}");
    }
}

/// What `plugd run --harness` was given.
#[derive(Debug)]
pub struct HarnessArgs<'a> {
    /// `PACKAGE/EXPORT`.
    pub harness: &'a str,
    /// The session.
    pub session: &'a str,
    /// The user's text.
    pub input: Option<&'a str>,
    /// `start` or `continue`.
    pub mode: &'a str,
    /// The policy.
    pub policy: RunPolicy,
    /// Print the run as JSON.
    pub json: bool,
}

/// Runs a harness: its events on stderr as they come, the run at the end.
/// Exits 1 (after printing the run) when the run did not succeed.
pub async fn harness(rt: &Runtime, args: HarnessArgs<'_>, api: DelegatedApi) -> Result<()> {
    let config = std::sync::Arc::new(plugd_runtime::config::PlugdConfig::load(rt.dir())?);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    api(rt, config, stopped)
        .await
        .context("cannot serve the API the harness acts through")?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let printer = tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            let kind = ev.get("type").and_then(Value::as_str).unwrap_or("event");
            let msg = ev
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| ev.to_string());
            eprintln!("[{kind}] {}", one_line(&msg, 300));
        }
    });
    let user = std::env::var("USER").unwrap_or_else(|_| "cli".into());
    let start = HarnessStart {
        harness: args.harness.to_owned(),
        session_id: args.session.to_owned(),
        mode: args.mode.to_owned(),
        input: args.input.map(str::to_owned),
        trigger_type: None,
        policy: args.policy,
        parent_run_id: None,
        org_id: None,
        project_id: None,
        created_by: format!("cli:{user}"),
        scope_ceiling: None,
    };
    let result = rt.run_harness(start, Some(tx)).await;
    let _ = printer.await;
    let _ = stop.send(true);
    let run = result?;
    if args.json {
        print_json(&run)?;
    } else {
        print_run(&run);
    }
    if run.status != RunStatus::Succeeded {
        rt.shutdown().await;
        std::process::exit(1);
    }
    Ok(())
}
