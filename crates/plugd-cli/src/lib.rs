//! plugd-cli: the commands of the `plugd` binary as a library: each
//! `*_cmd` module is one command group (its clap arguments and what it
//! prints), `plugin_view` the plugin table and detail, `remote` the way to a
//! running serve, `client` the one client of the commands that act
//! either through serve or here, and `errors` the CLI's table over the one
//! list of error codes (exit codes, the `--json` error object).
//!
//! **API boundary**: the binary parses the command line and calls in here;
//! this crate never depends on a surface crate (`plugd-server`): what it
//! does through serve goes over serve's socket. Errors are `anyhow`, as in
//! the binary: these are the binary's commands, their messages what `plugd`
//! prints.
#![allow(clippy::print_stdout, clippy::print_stderr)] // the CLI's output is its job

pub mod agent_cmd;
pub mod approve_cmd;
pub mod binding_cmd;
pub mod bus_cmd;
pub mod chains_cmd;
pub mod channel_cmd;
pub mod client;
pub mod cluster_cmd;
pub mod config_cmd;
pub mod console_cmd;
pub mod errors;
pub mod hook_cmd;
pub mod invocations_cmd;
pub mod marketplace_cmd;
pub mod mcp_cmd;
pub mod memory_cmd;
pub mod outbox_cmd;
pub mod package_cmd;
pub mod plugin_ctl_cmd;
pub mod plugin_view;
pub mod policy_check_cmd;
pub mod policy_cmd;
pub mod remote;
pub mod resource_cmd;
pub mod risk_cmd;
pub mod sign_cmd;
pub mod skill_cmd;
pub mod state;
pub mod state_cmd;
pub mod storage_cmd;
pub mod token_cmd;
pub mod tool_call_cmd;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Result;
use plugd_runtime::Runtime;
use plugd_runtime::config::PlugdConfig;
use serde_json::Value;

/// Serves the API that VAI invocations run by a CLI command (`plugd run`,
/// `plugd run --harness`) reach plugd through, on a loopback port of its
/// own until the receiver turns `true`. It is a surface, so this crate does
/// not build it: the binary passes `plugd_node::delegated_api`.
pub type DelegatedApi = for<'a> fn(
    &'a Runtime,
    Arc<PlugdConfig>,
    tokio::sync::watch::Receiver<bool>,
) -> Pin<Box<dyn Future<Output = Result<SocketAddr>> + 'a>>;

/// The manifest's non-fatal findings, after an approval: the operator sees
/// what was ignored in what they just approved.
pub fn print_approval_warnings<'a>(warnings: impl Iterator<Item = &'a str>) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

/// Who acts: `by`, else `$USER`, else `unknown`.
pub fn approver(by: Option<&str>) -> String {
    by.map(str::to_owned)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Prints `v` as JSON on one line, or indented.
pub fn print_json<T: serde::Serialize>(v: &T, pretty: bool) -> Result<()> {
    let text = if pretty {
        serde_json::to_string_pretty(v)?
    } else {
        serde_json::to_string(v)?
    };
    println!("{text}");
    Ok(())
}

/// One progress event as a line: `message (3/10)`, whatever the dialect's shape.
pub fn describe_progress(event: &Value) -> String {
    let message = ["message", "msg", "text", "status"]
        .iter()
        .find_map(|k| event.get(*k).and_then(Value::as_str))
        .map(str::to_owned);
    let done = event.get("progress").and_then(Value::as_f64);
    let total = event.get("total").and_then(Value::as_f64);
    let amount = match (done, total) {
        (Some(d), Some(t)) if t > 0.0 => Some(format!("{d}/{t} ({:.0}%)", d / t * 100.0)),
        (Some(d), _) => Some(format!("{d}")),
        _ => None,
    };
    match (message, amount) {
        (Some(m), Some(a)) => format!("{m} [{a}]"),
        (Some(m), None) => m,
        (None, Some(a)) => a,
        (None, None) => event.to_string(),
    }
}
