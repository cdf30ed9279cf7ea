//! `plugd run` and `plugd chat`: one agent turn, or an interactive session, from the command line.
//!
//! `plugd run "PROMPT" [--session ID] [--json] [--context JSON]` runs one
//! turn and prints the reply on stdout (with `--json`, the whole
//! `TurnOutcome` as one JSON line). Without `--session` a new session is
//! made; its id is printed on stderr (`plugd: session ID`) so the next run
//! can continue it. A turn a hook blocked prints `plugd: blocked at POINT:
//! MESSAGE` and `plugd: notices: CODE, …` on stderr and exits **3** (with
//! `--json` the outcome is printed on stdout first). Errors exit 1.
//!
//! `plugd chat [--session ID] [--context JSON]` reads one message per line
//! from stdin (a terminal or a pipe) and runs a turn for each. The reply's
//! text streams to stdout as the model produces it, ending with a newline;
//! everything else goes to stderr as it happens, one prefixed line each:
//! `[tool] NAME ARGS`, `[tool result] NAME ok|failed: RESULT`,
//! `[notice POINT] CODE: MESSAGE`, `[blocked at POINT] MESSAGE`. When the
//! hooks changed the streamed text (e.g. truncation or redaction by
//! `before_response`), the final reply follows on stdout as
//! `[reply after hooks] TEXT`. `/exit` or end of input ends the session.

use std::io::{IsTerminal, Write};

use anyhow::{Context, Result};
use clap::Args;
use plugd_agent::agent::{Agent, TurnEvent, TurnOutcome, TurnStatus, new_session_id};
use plugd_runtime::Runtime;
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::hooks::HookContext;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

use crate::DelegatedApi;

/// Exit code of `plugd run` when a hook blocked the turn.
pub const EXIT_BLOCKED: i32 = 3;

/// `plugd run`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RunArgs {
    /// `list` or `show` runs (a prompt that is one of these words: `plugd run -- list`).
    #[command(subcommand)]
    pub cmd: Option<crate::chains_cmd::RunCmd>,
    /// The user's message.
    #[arg(required_unless_present = "harness")]
    prompt: Option<String>,
    /// Run this harness export (PACKAGE/EXPORT) with `harness.run` instead of an agent turn; needs --session.
    #[arg(
        long,
        value_name = "PACKAGE/EXPORT",
        requires = "session",
        conflicts_with = "prompt"
    )]
    harness: Option<String>,
    /// The harness's input text (its trigger).
    #[arg(long, value_name = "TEXT", requires = "harness")]
    input: Option<String>,
    /// The harness mode: start or continue.
    #[arg(long, default_value = "start", requires = "harness")]
    mode: String,
    /// The harness run's policy: deepest child run.
    #[arg(long, default_value_t = 4, requires = "harness")]
    max_depth: u32,
    /// The harness run's policy: most child runs.
    #[arg(long, default_value_t = 12, requires = "harness")]
    max_child_runs: u32,
    /// The harness run's policy: forbid compactions.
    #[arg(long, requires = "harness")]
    no_compaction: bool,
    /// Continue this session (1-128 of letters, digits, '-', '_', '.'); default: a new one.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Print the turn's outcome as JSON.
    #[arg(long)]
    json: bool,
    /// Hook context fields as a JSON object (tenant_id, user_id, agent_id,
    /// channel, account_id, trace_id, deadline_ms); plugd.yaml's tenant section fills the rest.
    #[arg(long, value_name = "JSON")]
    context: Option<String>,
}

/// `plugd chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Continue this session; default: a new one.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Hook context fields as a JSON object (see `plugd run --help`).
    #[arg(long, value_name = "JSON")]
    context: Option<String>,
}

fn context(text: Option<&str>) -> Result<HookContext> {
    match text {
        None => Ok(HookContext::default()),
        Some(text) => serde_json::from_str(text)
            .with_context(|| format!("--context is not a valid context object: {text:?}")),
    }
}

async fn agent(rt: &Runtime) -> Result<Agent> {
    let config = PlugdConfig::load(rt.dir())?;
    Ok(Agent::from_config(rt, &config).await?)
}

fn session(given: Option<&String>) -> String {
    match given {
        Some(id) => id.clone(),
        None => {
            let id = new_session_id();
            eprintln!("plugd: session {id}");
            id
        }
    }
}

fn report_block(outcome: &TurnOutcome) {
    let point = outcome
        .blocked_at
        .map(|p| p.name().to_owned())
        .unwrap_or_else(|| "?".into());
    eprintln!(
        "plugd: blocked at {point}: {}",
        outcome.message.as_deref().unwrap_or("(no message)")
    );
    let codes: Vec<&str> = outcome
        .notices
        .iter()
        .filter_map(|n| n.code.as_deref())
        .collect();
    if !codes.is_empty() {
        eprintln!("plugd: notices: {}", codes.join(", "));
    }
}

/// Runs `plugd run`; a blocked turn exits the process with [`EXIT_BLOCKED`]
/// after shutting the plugins down.
pub async fn run(rt: &Runtime, args: &RunArgs, api: DelegatedApi) -> Result<()> {
    if let Some(cmd) = &args.cmd {
        return crate::chains_cmd::run_cmd(rt.dir(), cmd).await;
    }
    if let (Some(harness), Some(session)) = (&args.harness, &args.session) {
        return crate::chains_cmd::harness(
            rt,
            crate::chains_cmd::HarnessArgs {
                harness,
                session,
                input: args.input.as_deref(),
                mode: &args.mode,
                policy: plugd_runtime::runs::RunPolicy {
                    max_depth: args.max_depth,
                    max_child_runs: args.max_child_runs,
                    allow_compaction: !args.no_compaction,
                },
                json: args.json,
            },
            api,
        )
        .await;
    }
    let Some(prompt) = &args.prompt else {
        anyhow::bail!("give a prompt, --harness PACKAGE/EXPORT --session ID, or list|show");
    };
    let ctx = context(args.context.as_deref())?;
    let agent = agent(rt).await?;
    let id = session(args.session.as_ref());
    // VAI exports called during the turn (tools, the compactor) reach the
    // API through their delegation tokens on a loopback port.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let config = std::sync::Arc::new(PlugdConfig::load(rt.dir())?);
    api(rt, config, stopped).await?;
    let result = agent.turn(&id, prompt, &ctx, None).await;
    let _ = stop.send(true);
    agent.pipeline().cleanup().await;
    let outcome = result?;
    if args.json {
        println!("{}", serde_json::to_string(&outcome)?);
    } else if let Some(reply) = &outcome.reply {
        println!("{reply}");
    }
    if outcome.status == TurnStatus::Blocked {
        report_block(&outcome);
        rt.shutdown().await;
        std::process::exit(EXIT_BLOCKED);
    }
    Ok(())
}

fn short(v: &Value) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    const MAX: usize = 500;
    if text.chars().count() > MAX {
        format!("{}…", text.chars().take(MAX).collect::<String>())
    } else {
        text
    }
}

/// Prints one turn's events as they come; returns when `Done` arrives or the sender goes.
async fn show(mut events: tokio::sync::mpsc::UnboundedReceiver<TurnEvent>) {
    let mut streamed = String::new();
    let mut out = std::io::stdout();
    while let Some(event) = events.recv().await {
        match event {
            TurnEvent::Delta { text } => {
                streamed.push_str(&text);
                let _ = write!(out, "{text}");
                let _ = out.flush();
            }
            TurnEvent::ToolCall { tool, args, .. } => {
                if !streamed.is_empty() && !streamed.ends_with('\n') {
                    let _ = writeln!(out);
                }
                streamed.clear();
                eprintln!("[tool] {tool} {args}");
            }
            TurnEvent::ToolResult {
                tool, ok, result, ..
            } => {
                let status = if ok { "ok" } else { "failed" };
                eprintln!("[tool result] {tool} {status}: {}", short(&result));
            }
            TurnEvent::Notice { point, notice } => {
                eprintln!(
                    "[notice {point}] {}: {}",
                    notice.code.as_deref().unwrap_or("-"),
                    notice.message
                );
            }
            TurnEvent::Done { outcome } => {
                match (&outcome.status, &outcome.reply) {
                    (TurnStatus::Completed, Some(reply)) => {
                        if streamed.is_empty() {
                            let _ = writeln!(out, "{reply}");
                        } else {
                            let _ = writeln!(out);
                            if &streamed != reply {
                                let _ = writeln!(out, "[reply after hooks] {reply}");
                            }
                        }
                    }
                    _ => {
                        if !streamed.is_empty() {
                            let _ = writeln!(out);
                        }
                        eprintln!(
                            "[blocked at {}] {}",
                            outcome.blocked_at.map(|p| p.name()).unwrap_or("?"),
                            outcome.message.as_deref().unwrap_or("(no message)")
                        );
                    }
                }
                let _ = out.flush();
                return;
            }
        }
    }
}

/// Runs `plugd chat` until `/exit` or end of input.
pub async fn chat(rt: &Runtime, args: &ChatArgs) -> Result<()> {
    let ctx = context(args.context.as_deref())?;
    let agent = agent(rt).await?;
    let id = session(args.session.as_ref());
    if args.session.is_some() {
        eprintln!("plugd: session {id}");
    }
    let interactive = std::io::stdin().is_terminal();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        if interactive {
            eprint!("you> ");
        }
        let Some(line) = lines.next_line().await.context("reading stdin")? else {
            break;
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line == "/exit" {
            break;
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let printer = tokio::spawn(show(rx));
        let result = agent.turn(&id, line, &ctx, Some(tx)).await;
        let _ = printer.await;
        if let Err(e) = result {
            eprintln!("plugd: error: {e}");
        }
    }
    agent.pipeline().cleanup().await;
    Ok(())
}
