//! `plugd tool call`: calls one tool and prints its result; with `--json`, a
//! failure is one JSON object on stderr and the exit code says its class.
//!
//! The object is `{"code", "message", "details"?, "http_status"}`, the same
//! code and details `plugd serve` answers over HTTP (plugd-server's error
//! mapping), so a script reads one vocabulary whichever way it calls.
//!
//! Exit codes with `--json` (docs/contracts/errors.md):
//! 0 success; 1 any other failure; 4 not found (`unknown_tool`,
//! `unknown_plugin`, `tool_not_found`); 5 invalid arguments
//! (`invalid_arguments`, `invalid_config`); 6 the tool failed (`tool_failed`,
//! `plugin_error`); 7 unavailable, retry later (`tool_unavailable`,
//! `plugin_unavailable`, `plugin_timeout`, `plugin_stopped`,
//! `plugin_changed`); 8 refused (`tool_denied`, `tool_disabled`,
//! `call_denied`, `approval_*`). Without `--json`, every failure is exit 1
//! with the one-line `plugd: error: …` as before.

use anyhow::{Context, Result, bail};
use plugd_host::dialect::CallContext;
use plugd_runtime::Runtime;
use plugd_server::error::ApiError;
use serde_json::{Value, json};

/// `plugd tool call NAME --args JSON [--agent ID] [--json]`.
pub async fn run(
    rt: &Runtime,
    name: &str,
    args: &str,
    agent: Option<&str>,
    json_out: bool,
) -> Result<()> {
    let args: Value = serde_json::from_str(args)
        .with_context(|| format!("--args is not valid JSON: {args:?}"))?;
    if !args.is_object() {
        bail!("--args must be a JSON object, got {args}");
    }
    let (progress, mut events) = tokio::sync::mpsc::unbounded_channel();
    let printer = tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            eprintln!("progress: {}", crate::describe_progress(&event));
        }
    });
    let ctx = CallContext {
        agent_id: agent.map(str::to_owned),
        progress: Some(progress),
        ..CallContext::default()
    };
    let result = rt.call_tool_with(name, args, &ctx).await;
    drop(ctx);
    let _ = printer.await;
    match result {
        Ok(v) => crate::print_json(&v, !json_out),
        // Typed, so `report` finds it after the plugins shut down.
        Err(e) if json_out => Err(ApiError::from(e).into()),
        Err(e) => Err(e.into()),
    }
}

/// The exit code of one error class (see the module docs).
pub fn exit_code(code: &str) -> i32 {
    use plugd_server::error::code as c;
    match code {
        c::UNKNOWN_TOOL | c::UNKNOWN_PLUGIN | c::TOOL_NOT_FOUND => 4,
        c::INVALID_ARGUMENTS | c::INVALID_CONFIG => 5,
        c::TOOL_FAILED | c::PLUGIN_ERROR => 6,
        c::TOOL_UNAVAILABLE
        | c::PLUGIN_UNAVAILABLE
        | c::PLUGIN_TIMEOUT
        | c::PLUGIN_STOPPED
        | c::PLUGIN_CHANGED => 7,
        c::TOOL_DENIED
        | c::TOOL_DISABLED
        | c::CALL_DENIED
        | c::APPROVAL_TIMED_OUT
        | c::APPROVAL_REQUIRED => 8,
        _ => 1,
    }
}

/// For `tool call --json`: prints `err` as one JSON object on stderr and
/// returns its exit code. Errors before the call (bad `--args`, no
/// workspace) have no HTTP class: code `error`, exit 1.
pub fn report(err: &anyhow::Error) -> i32 {
    let (object, code) = match err.downcast_ref::<ApiError>() {
        Some(api) => {
            let mut o = json!({
                "code": api.code,
                "message": api.message,
                "http_status": api.status.as_u16(),
            });
            if let Some(d) = &api.details {
                o["details"] = d.clone();
            }
            (o, exit_code(api.code))
        }
        None => (
            json!({"code": "error", "message": format!("{err:#}").replace('\n', " ")}),
            1,
        ),
    };
    eprintln!("{object}");
    code
}
