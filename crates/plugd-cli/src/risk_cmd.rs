//! The CLI side of the risk policy: `plugd tool enable|disable`, the tool
//! table with risk and state, `plugd approvals list|approve|deny`, and the
//! terminal [`Approver`] of `plugd tool call`, `run` and `chat`.
//!
//! The terminal approver asks on the controlling terminal (`/dev/tty`) when
//! standard input is a terminal: it shows the tool, its plugin, its risk and
//! the arguments, and runs the call only on `y`/`yes`. `--yes` approves
//! `high` calls without asking, never `critical` ones. With no terminal on
//! stdin the call is denied, with a message saying how to approve it.
//!
//! Tool state and call approvals live in the state store, so these commands
//! act on a running `plugd serve` too: it reads the disabled tools per call
//! and listing, and its waiting calls re-read their approval records.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use anyhow::Result;
use clap::Subcommand;
use plugd_runtime::Runtime;
use plugd_runtime::risk::{
    ApprovalRequest, Approver, CallApproval, Decision, DecisionFuture, RiskLevel, ToolView,
};

use crate::client::Client;
use crate::{approver, print_json};

/// `plugd approvals …`.
#[derive(Subcommand, Debug)]
pub enum ApprovalsCmd {
    /// List the calls of high and critical tools waiting for an operator (in plugd serve).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Approve a waiting call: it runs.
    Approve {
        /// Approval id (apr_…), as `plugd approvals list` shows it.
        id: String,
        /// Who approves (default: $USER).
        #[arg(long)]
        by: Option<String>,
        /// For an MCP server's question (tool elicitation/create): the
        /// answer, a JSON object matching its requested schema.
        #[arg(long)]
        content: Option<String>,
    },
    /// Deny a waiting call: it fails and never reaches the plugin (for an MCP
    /// server's question: decline, or cancel with `--reason cancel`).
    Deny {
        /// Approval id (apr_…).
        id: String,
        /// Who denies (default: $USER).
        #[arg(long)]
        by: Option<String>,
        /// Why (shown to the caller).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Who answers a call of a high-risk tool in this process.
#[derive(Debug, Clone, Copy)]
pub enum Approvals {
    /// Pending approvals an operator answers (`plugd approvals`): `plugd
    /// mcp`, whose stdin is the protocol.
    Queue,
    /// The terminal prompt; `yes` approves high-risk calls without asking
    /// (`plugd tool call --yes`).
    Terminal {
        /// `--yes`.
        yes: bool,
    },
}

/// Sets the runtime's approver: the approval queue or the terminal prompt.
pub fn install_approver(rt: &Runtime, approvals: Approvals) {
    match approvals {
        // stdin is the MCP protocol: no terminal prompt; pending approvals.
        Approvals::Queue => rt.use_approval_queue(),
        Approvals::Terminal { yes } => rt.set_approver(Arc::new(Terminal::new(yes))),
    }
}

/// Runs `plugd tool enable NAME` / `disable NAME`, here or through a running
/// serve (`POST /v1/tools/{name}:enable|disable`; serve records the socket
/// user as who did it).
pub async fn set_enabled(
    client: &Client<'_>,
    name: &str,
    enabled: bool,
    by: Option<&str>,
) -> Result<()> {
    let by = approver(by);
    let (plugin, changed) = client.set_tool_enabled(name, enabled, &by).await?;
    let via = client.via();
    match (enabled, changed) {
        (true, true) => println!("enabled tool {name} of plugin {plugin}{via}"),
        (true, false) => println!("tool {name} of plugin {plugin} was not disabled{via}"),
        (false, true) => println!(
            "disabled tool {name} of plugin {plugin}: hidden from agents and refused by `plugd tool call`; `plugd tool enable {name}` undoes it{via}"
        ),
        (false, false) => println!("tool {name} of plugin {plugin} was already disabled{via}"),
    }
    Ok(())
}

/// Runs `plugd tool list`: every tool with its effective risk and state.
pub fn list_tools(rt: &Runtime, json: bool) -> Result<()> {
    let tools = rt.tool_views()?;
    if json {
        return print_json(&tools, false);
    }
    if tools.is_empty() {
        println!("no tools (approve a plugin with `plugd plugin approve ID`)");
        return Ok(());
    }
    let width = tools
        .iter()
        .map(|t| t.entry.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let pw = tools
        .iter()
        .map(|t| t.entry.plugin.len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:width$}  {:pw$}  {:8}  {:8}  DESCRIPTION",
        "NAME", "PLUGIN", "RISK", "STATE"
    );
    for t in &tools {
        println!(
            "{:width$}  {:pw$}  {:8}  {:8}  {}",
            t.entry.name,
            t.entry.plugin,
            t.risk.as_str(),
            state(t),
            t.entry.description
        );
    }
    Ok(())
}

fn state(t: &ToolView) -> &'static str {
    if t.enabled { "enabled" } else { "disabled" }
}

/// The `plugin show` lines of each tool's risk and state.
pub fn print_tool_risks(p: &plugd_runtime::PluginInfo) {
    if p.tool_risks.is_empty() {
        return;
    }
    println!("risk:");
    for (name, r) in &p.tool_risks {
        let source = match r.source {
            plugd_runtime::risk::RiskSource::Config => "plugd.yaml",
            plugd_runtime::risk::RiskSource::Declared => "declared",
            plugd_runtime::risk::RiskSource::Annotations => "MCP annotations",
            plugd_runtime::risk::RiskSource::Default => "default",
        };
        let disabled = if r.enabled { "" } else { ", disabled" };
        println!("  {name}: {} ({source}{disabled})", r.risk);
    }
}

/// Runs `plugd approvals …` on the workspace's store.
pub async fn approvals(rt: &Runtime, cmd: &ApprovalsCmd) -> Result<()> {
    match cmd {
        ApprovalsCmd::List { json } => {
            let pending = rt.pending_approvals().await?;
            if *json {
                print_json(&pending, false)?;
            } else if pending.is_empty() {
                println!("no calls wait for approval");
            } else {
                println!(
                    "{:20}  {:24}  {:8}  {:20}  {:28}  ARGUMENTS",
                    "ID", "TOOL", "RISK", "REQUESTED", "ASKED BY"
                );
                for a in &pending {
                    let args: String = a.args_preview.chars().take(80).collect();
                    println!(
                        "{:20}  {:24}  {:8}  {:20}  {:28}  {args}",
                        a.id,
                        a.tool,
                        a.risk,
                        a.requested_at,
                        asked_by(a)
                    );
                }
            }
        }
        ApprovalsCmd::Approve { id, by, content } => {
            let a = rt
                .decide_approval(id, true, &approver(by.as_deref()), content.as_deref())
                .await?;
            report(&a);
        }
        ApprovalsCmd::Deny { id, by, reason } => {
            let reason = reason
                .clone()
                .unwrap_or_else(|| "denied by an operator with `plugd approvals deny`".into());
            let a = rt
                .decide_approval(id, false, &approver(by.as_deref()), Some(&reason))
                .await?;
            report(&a);
        }
    }
    Ok(())
}

/// Who asks for a call, for `approvals list`: the caller, its surface and
/// session (`token:demo via http`, `agent:a1 via agent, session s1`), `-`
/// when the call did not say.
fn asked_by(a: &CallApproval) -> String {
    let mut out = a
        .caller
        .clone()
        .or_else(|| a.agent_id.as_ref().map(|id| format!("agent:{id}")))
        .unwrap_or_else(|| "-".to_owned());
    if let Some(s) = &a.surface {
        out.push_str(&format!(" via {s}"));
    }
    if let Some(s) = &a.session_id {
        out.push_str(&format!(", session {s}"));
    }
    out
}

fn report(a: &CallApproval) {
    println!(
        "{} {}: call of {} (plugin {}, risk {})",
        a.state.as_str(),
        a.id,
        a.tool,
        a.plugin,
        a.risk
    );
}

/// The terminal approver.
struct Terminal {
    yes: bool,
    /// One prompt at a time.
    prompt: tokio::sync::Mutex<()>,
}

impl Terminal {
    fn new(yes: bool) -> Terminal {
        Terminal {
            yes,
            prompt: tokio::sync::Mutex::new(()),
        }
    }
}

impl Approver for Terminal {
    fn decide<'a>(&'a self, request: &'a ApprovalRequest) -> DecisionFuture<'a> {
        Box::pin(async move {
            if request.risk == RiskLevel::High && self.yes {
                return Decision::Approved { by: "--yes".into() };
            }
            if !std::io::stdin().is_terminal() {
                let how = if request.risk == RiskLevel::Critical {
                    "run it from a terminal and answer the prompt, or call it through `plugd serve` and approve it there (`plugd approvals approve ID`); --yes never covers critical-risk tools"
                } else {
                    "run it from a terminal and answer the prompt, pass --yes, or call it through `plugd serve` and approve it there (`plugd approvals approve ID`)"
                };
                return Decision::Unavailable {
                    reason: format!(
                        "standard input is not a terminal, so nobody could be asked; {how}"
                    ),
                };
            }
            let _one = self.prompt.lock().await;
            let request = request.clone();
            tokio::task::spawn_blocking(move || ask(&request))
                .await
                .unwrap_or_else(|e| Decision::Unavailable {
                    reason: format!("the approval prompt failed ({e})"),
                })
        })
    }
}

/// Asks on the controlling terminal; `y` or `yes` approves.
fn ask(request: &ApprovalRequest) -> Decision {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty");
    let mut tty = match tty {
        Ok(t) => t,
        Err(e) => {
            return Decision::Unavailable {
                reason: format!("the terminal could not be opened for the approval prompt ({e})"),
            };
        }
    };
    let question = format!(
        "\nplugd: tool {:?} of plugin {:?} is {} risk and needs your approval for this call.\n  arguments: {}\nRun it? [y/N] ",
        request.tool,
        request.plugin,
        request.risk,
        request.args_preview()
    );
    if let Err(e) = tty
        .write_all(question.as_bytes())
        .and_then(|()| tty.flush())
    {
        return Decision::Unavailable {
            reason: format!("the approval prompt could not be written ({e})"),
        };
    }
    let mut answer = String::new();
    let read = std::io::BufReader::new(&mut tty).read_line(&mut answer);
    let who = approver(None);
    match read {
        Ok(_) if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") => {
            Decision::Approved { by: who }
        }
        Ok(0) => Decision::Denied {
            by: who,
            reason: "the terminal closed at the approval prompt".into(),
        },
        Ok(_) => Decision::Denied {
            by: who,
            reason: format!("answered {:?} at the approval prompt", answer.trim()),
        },
        Err(e) => Decision::Unavailable {
            reason: format!("the approval answer could not be read ({e})"),
        },
    }
}
