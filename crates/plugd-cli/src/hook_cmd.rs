//! `plugd hook run|check`: run one hook point's pipeline from the command
//! line, or load `plugd.yaml` and print every point's chain.
//!
//! `plugd hook run POINT --payload JSON [--context JSON]` prints one JSON
//! line `{"outcome": "continue"|"blocked", "payload", "message", "notices",
//! "handler"}` (`handler`: the one that blocked, only when blocked) and
//! exits 0 either way; a bad POINT, JSON or configuration exits 1 with
//! one line on stderr.

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use plugd_agent::hooks::build::build_pipeline;
use plugd_runtime::Runtime;
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::hooks::{HookContext, HookPoint};
use serde_json::Value;

/// `plugd hook …`.
#[derive(Subcommand, Debug)]
pub enum HookCmd {
    /// Run the pipeline of one point over a payload and print the outcome as JSON.
    Run {
        /// The point: before_message, before_llm_request, before_tool_call,
        /// after_tool_result or before_response.
        point: String,
        /// The payload as a JSON object with Dexto's field names,
        /// e.g. '{"toolName": "x", "args": {}}' or '{"text": "hi"}'.
        #[arg(long, value_name = "JSON")]
        payload: String,
        /// Context fields as a JSON object (session_id, tenant_id, user_id,
        /// agent_id, channel, account_id, trace_id, deadline_ms); plugd.yaml's
        /// tenant section fills the rest.
        #[arg(long, value_name = "JSON")]
        context: Option<String>,
    },
    /// Load plugd.yaml, build the pipeline (starting hook plugins) and print each point's chain.
    Check,
}

fn point_names() -> String {
    HookPoint::ALL.map(HookPoint::name).join(", ")
}

/// Runs one `plugd hook` command on the opened workspace.
pub async fn run(rt: &Runtime, cmd: &HookCmd) -> Result<()> {
    match cmd {
        HookCmd::Run {
            point,
            payload,
            context,
        } => {
            let point = HookPoint::parse(point).with_context(|| {
                format!(
                    "unknown hook point {point:?}; use one of: {}",
                    point_names()
                )
            })?;
            let payload: Value = serde_json::from_str(payload)
                .with_context(|| format!("--payload is not valid JSON: {payload:?}"))?;
            if !payload.is_object() {
                bail!(
                    "--payload must be a JSON object with the payload fields of {point}, got {payload}"
                );
            }
            let given: HookContext = match context {
                None => HookContext::default(),
                Some(text) => serde_json::from_str(text)
                    .with_context(|| format!("--context is not a valid context: {text:?}"))?,
            };
            let config = PlugdConfig::load(rt.dir())?;
            let pipeline = build_pipeline(&config, rt).await?;
            let ctx = config.context(&given);
            let outcome = pipeline.run(point, payload, &ctx).await;
            pipeline.cleanup().await;
            // Every field is always present: `message` is null when not blocked.
            let mut out = serde_json::to_value(&outcome)?;
            if let Some(map) = out.as_object_mut() {
                map.entry("message").or_insert(Value::Null);
            }
            println!("{}", serde_json::to_string(&out)?);
        }
        HookCmd::Check => {
            let config = PlugdConfig::load(rt.dir())?;
            let pipeline = build_pipeline(&config, rt).await?;
            match &config.path {
                Some(p) => println!("{}: ok", p.display()),
                None => println!("no plugd.yaml in {}: no hook handlers", rt.dir().display()),
            }
            for point in HookPoint::ALL {
                let chain = pipeline.chain(point);
                let chain = if chain.is_empty() {
                    "-".to_owned()
                } else {
                    chain.join(" -> ")
                };
                println!("{:20}  {chain}", point.name());
            }
            pipeline.cleanup().await;
        }
    }
    Ok(())
}
