//! `plugd policy check`: explains what plugd.yaml's `policy:` rules decide
//! for one caller and one tool, offline (the workspace's plugd.yaml and the
//! tool's definition from the catalog, no serve needed); see
//! `plugd_runtime::tool_policy`.

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use plugd_runtime::Runtime;
use plugd_runtime::tool_policy::{Effect, Outcome, PolicyCaller, Stage, tool_value};
use serde_json::{Value, json};

/// `plugd policy …`.
#[derive(Subcommand, Debug)]
pub enum PolicyCheckCmd {
    /// Which `policy:` rule decides a call of TOOL by a caller, and how each rule came out.
    Check(CheckArgs),
}

/// `plugd policy check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The caller's subject: `token:NAME` for a plugd token (its `caller.token`), a Unix user, `cli:USER`.
    #[arg(long = "as", value_name = "SUBJECT")]
    pub subject: String,
    /// The caller's groups, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub groups: Vec<String>,
    /// The caller's role.
    #[arg(long)]
    pub role: Option<String>,
    /// The caller's org.
    #[arg(long)]
    pub org: Option<String>,
    /// The caller's project.
    #[arg(long)]
    pub project: Option<String>,
    /// The tool, as `plugd tool list` names it.
    pub tool: String,
    /// The call's arguments as a JSON object (without: the decision when listing).
    #[arg(long)]
    pub args: Option<String>,
    /// Print the explanation as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `plugd policy check`.
pub fn run(rt: &Runtime, cmd: &PolicyCheckCmd) -> Result<()> {
    let PolicyCheckCmd::Check(a) = cmd;
    let policy = rt.risk_config()?;
    let Some(entry) = rt.tool(&a.tool) else {
        bail!(
            "no tool {:?}; `plugd tool list` shows the tools of the approved plugins",
            a.tool
        );
    };
    let args: Option<Value> = match &a.args {
        None => None,
        Some(text) => {
            let v: Value = serde_json::from_str(text)
                .map_err(|e| anyhow::anyhow!("--args {text:?} is not JSON: {e}"))?;
            if !v.is_object() {
                bail!("--args must be a JSON object, got {text:?}");
            }
            Some(v)
        }
    };
    let caller = PolicyCaller {
        groups: a.groups.iter().filter(|g| !g.is_empty()).cloned().collect(),
        role: a.role.clone().unwrap_or_default(),
        org: a.org.clone().unwrap_or_default(),
        project: a.project.clone().unwrap_or_default(),
        ..PolicyCaller::named(&a.subject)
    };
    let stage = if args.is_some() {
        Stage::Call
    } else {
        Stage::List
    };
    let tool = tool_value(&entry, &policy);
    let ex = policy
        .rules
        .explain(&caller, tool.clone(), args.as_ref(), stage);
    let meaning = match (ex.effect, stage) {
        (Effect::Allow, _) => "allowed",
        (Effect::Deny, Stage::List) => {
            "hidden from the tool lists; a call is refused like an unknown tool"
        }
        (Effect::Deny, Stage::Call) => "refused like an unknown tool",
        (Effect::RequireApproval, _) => "the call waits for an operator (GET /v1/approvals)",
    };
    if a.json {
        let rules: Vec<Value> = ex
            .rules
            .iter()
            .map(|(name, effect, outcome)| {
                let mut r =
                    json!({"name": name, "effect": effect, "outcome": outcome_name(outcome)});
                if let Outcome::Error(e) = outcome {
                    r["error"] = json!(e);
                }
                r
            })
            .collect();
        let out = json!({
            "caller": caller,
            "tool": tool,
            "args": args,
            "stage": if stage == Stage::Call { "call" } else { "list" },
            "rule": ex.rule,
            "effect": ex.effect,
            "meaning": meaning,
            "rules": rules,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "tool {} (plugin {}, risk {}) called by {}{}",
        entry.name,
        entry.plugin,
        tool["risk"].as_str().unwrap_or("?"),
        caller.subject,
        match &args {
            Some(v) => format!(" with {v}"),
            None => " (listing: no arguments)".to_owned(),
        }
    );
    if ex.rules.is_empty() {
        println!("no policy rules in plugd.yaml");
    }
    for (i, (name, effect, outcome)) in ex.rules.iter().enumerate() {
        let how = match outcome {
            Outcome::Error(e) if *effect == Effect::Deny && stage == Stage::Call => {
                format!("error (a deny rule that errors denies): {e}")
            }
            Outcome::Error(e) => format!("error (counts as not matching): {e}"),
            o => outcome_name(o).to_owned(),
        };
        println!("  {}. {name} [{effect}]: {how}", i + 1);
    }
    match &ex.rule {
        Some(rule) => println!("decision: {} by rule {rule:?}: {meaning}", ex.effect),
        None => println!("decision: allow (no rule matched): {meaning}"),
    }
    Ok(())
}

fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Matched => "matched",
        Outcome::NotMatched => "not matched",
        Outcome::Error(_) => "error",
        Outcome::NotEvaluated => "not evaluated (an earlier rule decided)",
    }
}
