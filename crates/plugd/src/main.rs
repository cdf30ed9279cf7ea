//! The `plugd` command line: thin glue over `plugd-runtime` (and `plugd bench`).
//!
//! Exit codes: 0 on success, 1 with a one-line `plugd: error: …` on stderr
//! otherwise (2 for usage errors, from clap), 3 when `plugd run`'s turn was
//! blocked by a hook, 130 when interrupted; `tool call --json` exits 4..8 by
//! error class (see `tool_call_cmd`).
#![allow(clippy::print_stdout, clippy::print_stderr)] // the CLI's output is its job

mod agent_cmd;
mod approve_cmd;
mod binding_cmd;
mod bus_cmd;
mod chains_cmd;
mod channel_cmd;
mod config_cmd;
mod console_cmd;
mod hook_cmd;
mod invocations_cmd;
mod marketplace_cmd;
mod mcp_cmd;
mod memory_cmd;
mod outbox_cmd;
mod package_cmd;
mod plugin_ctl_cmd;
mod policy_cmd;
mod remote;
mod resource_cmd;
mod risk_cmd;
mod sign_cmd;
mod skill_cmd;
mod state_cmd;
mod storage_cmd;
mod token_cmd;
mod tool_call_cmd;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use plugd_host::HostConfig;
use plugd_runtime::{PluginInfo, Runtime};
use serde_json::Value;

/// plugd: a plugin runtime for AI agents.
#[derive(Parser, Debug)]
#[command(name = "plugd", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Workspace directory (default: $PLUGD_WORKSPACE, else the current directory).
    #[arg(long, short = 'w', global = true, value_name = "DIR")]
    workspace: Option<PathBuf>,

    /// Log filter for stderr, e.g. `info` or `plugd=debug` (default: $PLUGD_LOG, else `warn`; `info` for serve).
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Inspect, approve and control plugins.
    #[command(subcommand)]
    Plugin(PluginCmd),
    /// List and call tools.
    #[command(subcommand)]
    Tool(ToolCmd),
    /// Keep the workspace's approved plugins supervised and serve the HTTP API until Ctrl-C or SIGTERM.
    Serve(ServeArgs),
    /// Measure round trips, throughput, cold start and memory on this machine.
    Bench(plugd_bench::BenchArgs),
    /// Manifest helpers.
    #[command(subcommand)]
    Manifest(ManifestCmd),
    /// Record semantic events for the async (VAI) hooks.
    #[command(subcommand)]
    Events(outbox_cmd::EventsCmd),
    /// Inspect hook deliveries of the durable outbox; retry dead letters.
    #[command(subcommand)]
    Outbox(outbox_cmd::OutboxCmd),
    /// Run and check the hook pipeline of plugd.yaml.
    #[command(subcommand)]
    Hook(hook_cmd::HookCmd),
    /// Run one agent turn and print the reply (exit 3 when a hook blocks it).
    Run(agent_cmd::RunArgs),
    /// Chat with the agent: one turn per stdin line, replies streamed.
    Chat(agent_cmd::ChatArgs),
    /// Sessions (their chains, runs and compactions): list, show.
    #[command(subcommand)]
    Session(chains_cmd::SessionCmd),
    /// Chains of blocks: show one.
    #[command(subcommand)]
    Chain(chains_cmd::ChainCmd),
    /// The agents' long-term memory (what plugins recall through memory.recall).
    #[command(subcommand)]
    Memory(memory_cmd::MemoryCmd),
    /// Publish on and tail the bus of the running plugd serve.
    #[command(subcommand)]
    Bus(bus_cmd::BusCmd),
    /// List, approve or deny calls of high and critical tools waiting in plugd serve.
    #[command(subcommand)]
    Approvals(risk_cmd::ApprovalsCmd),
    /// The operator's named secrets (LLM keys) and the master key.
    #[command(subcommand)]
    Secrets(config_cmd::SecretsCmd),
    /// Secrets of one org, for bindings' `secret://ORG/NAME` references.
    #[command(subcommand)]
    Secret(binding_cmd::SecretCmd),
    /// Bindings of package exports to orgs and projects: create, list, show, update, validate.
    #[command(subcommand)]
    Binding(binding_cmd::BindingCmd),
    /// The agent's key-value storage (Dexto `context.agent.storage`).
    #[command(subcommand)]
    Storage(storage_cmd::StorageCmd),
    /// List channel adapters; send one message through one.
    #[command(subcommand)]
    Channel(channel_cmd::ChannelCmd),
    /// Bearer tokens for `plugd serve --listen` (create, list, revoke).
    #[command(subcommand)]
    Token(token_cmd::TokenCmd),
    /// The markdown skills of approved plugins (`.skills/*.md`).
    #[command(subcommand)]
    Skill(skill_cmd::SkillCmd),
    /// The resources of hosted MCP servers: list, templates, read.
    #[command(subcommand)]
    Resource(resource_cmd::ResourceCmd),
    /// The prompts of hosted MCP servers: list, get.
    #[command(subcommand)]
    Prompt(resource_cmd::PromptCmd),
    /// The workspace's state database: start it over on purpose.
    #[command(subcommand)]
    State(state_cmd::StateCmd),
    /// Plugin packages in OCI registries: push, pull (installed read-only by digest), list, show.
    #[command(subcommand)]
    Package(package_cmd::PackageCmd),
    /// Invocation records of tool calls: list, show.
    #[command(subcommand)]
    Invocations(invocations_cmd::InvocationsCmd),
    /// The curated marketplace catalog of plugd.yaml: list, show, install (package + bindings), sign an index.
    #[command(subcommand)]
    Marketplace(marketplace_cmd::MarketplaceCmd),
    /// Serve the approved plugins' tools to an MCP client on stdio (what Claude Desktop, Cursor and Codex spawn).
    Mcp(mcp_cmd::McpArgs),
    /// Print a one-time login link to the operator console of the running `plugd serve --listen`.
    Console,
    /// The plugd.yaml policy a running serve holds in force: status, the diff of a held (widening) change, approve it.
    #[command(subcommand)]
    Config(policy_cmd::PolicyCmd),
}

#[derive(Subcommand, Debug)]
enum PluginCmd {
    /// List every plugin in the workspace.
    List(JsonFlag),
    /// Show one plugin: state, approval, the exact command and environment that run.
    Show {
        /// Plugin id.
        id: String,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Approve plugins as their files are now (starts each once to cache its tools).
    Approve(approve_cmd::ApproveArgs),
    /// Withdraw approval: the plugin stops and its tools disappear.
    Revoke {
        /// Plugin id.
        id: String,
    },
    /// Clear a failed state and the restart budget.
    Restart {
        /// Plugin id.
        id: String,
    },
    /// Stop a plugin and keep it stopped (its calls fail) until `plugd plugin start`.
    Stop {
        /// Plugin id.
        id: String,
    },
    /// Start a plugin now, clearing an operator stop or a failure.
    Start {
        /// Plugin id.
        id: String,
    },
    #[command(flatten)]
    Signing(sign_cmd::SigningCmd),
    /// Read and change a plugin's settings (secrets are stored encrypted).
    Config(config_cmd::ConfigArgs),
}

#[derive(Subcommand, Debug)]
enum ToolCmd {
    /// List the tools of approved plugins.
    List(JsonFlag),
    /// Call a tool and print its result as JSON. With `--org`, NAME is an
    /// export id of an installed package, called through the binding of
    /// that org (and project) as `POST /v1/plugin-tools/NAME:invoke` does
    /// (through a running serve when there is one).
    Call {
        /// Tool name, as `plugd tool list` shows it (with `--org`: the export id).
        name: String,
        /// Arguments as a JSON object.
        #[arg(long, default_value = "{}", value_name = "JSON")]
        args: String,
        /// Agent id passed to the plugin.
        #[arg(long, conflicts_with = "org")]
        agent: Option<String>,
        /// Call through the bindings of this org.
        #[arg(long)]
        org: Option<String>,
        /// The project the call is made for (its bindings before the org's).
        #[arg(long, requires = "org")]
        project: Option<String>,
        /// The session: the rollout key (a fresh one per call without it).
        #[arg(long, requires = "org")]
        session: Option<String>,
        #[command(flatten)]
        json: JsonFlag,
        /// Approve a high-risk call without asking (never covers critical ones).
        #[arg(long)]
        yes: bool,
    },
    /// Enable a disabled tool again.
    Enable {
        /// Tool name, as `plugd tool list` shows it.
        name: String,
    },
    /// Disable one tool: hidden from agents and refused by `tool call`; the rest of its plugin is unaffected.
    Disable {
        /// Tool name, as `plugd tool list` shows it.
        name: String,
        /// Who disables it (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum ManifestCmd {
    /// Print the JSON Schema of `nexo-plugin.toml`.
    Schema,
}

#[derive(Args, Debug, Clone)]
struct ServeArgs {
    /// Also serve the HTTP API on this TCP address (loopback only; every
    /// request but GET /healthz needs a bearer token from `plugd token
    /// create`). Without it, serve listens on .plugd/serve.sock only.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
}

#[derive(Args, Debug, Clone, Copy)]
struct JsonFlag {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() {
    // Inside a sandbox with egress through plugd: the bridge, before any
    // thread exists (it forks), then the plugin in its place.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv
        .get(1)
        .is_some_and(|a| a == plugd_host::sandbox::egress::BRIDGE_SUBCOMMAND)
    {
        std::process::exit(plugd_host::sandbox::egress::bridge::main(&argv[2..]));
    }
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    init_logging(
        cli.log.as_deref(),
        matches!(cli.command, Command::Serve(_)),
        matches!(cli.command, Command::Serve(_) | Command::Bench(_)),
    );
    // Not dumpable (its environment and memory are root-only), subreaper
    // for orphaned plugin processes, and their tracker.
    plugd_host::procs::init_daemon();
    // `plugd mcp` bridges one client to plugins: one thread runs it with no
    // hand-offs between threads (measured in BENCHMARKS.md); everything
    // else, `serve` first, gets a worker per core.
    let mut builder = if matches!(cli.command, Command::Mcp(_)) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => fail(&anyhow::anyhow!("cannot start the async runtime: {e}")),
    };
    // OpenTelemetry traces when an OTLP endpoint is set (plugd-telemetry).
    let traces = plugd_telemetry::Telemetry::from_env(rt.handle()).unwrap_or_else(|e| {
        tracing::warn!("traces are off: {e}");
        plugd_telemetry::Telemetry::default()
    });
    let outcome = rt.block_on(run(cli));
    // The last spans leave while the runtime that sends them still runs.
    traces.shutdown(std::time::Duration::from_secs(5));
    let code = outcome.unwrap_or_else(|e| fail(&e));
    drop(rt);
    // Orphans the subreaper brought back and no plugin handle owns.
    plugd_host::procs::kill_orphans();
    plugd_node::log_writer::flush(std::time::Duration::from_secs(2));
    std::process::exit(code);
}

/// `plugd tool list | head` closes stdout early: `println!` then panics with
/// EPIPE. That is the reader's choice, not a failure: exit quietly with the
/// shell's code for SIGPIPE (141) instead of a panic report. plugd keeps
/// SIGPIPE ignored (Rust's default), so a plugin that closes its stdin gives
/// an error on that pipe, never a signal that kills plugd.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn fail(e: &anyhow::Error) -> ! {
    // A failing command leaves no orphan and no cgroup behind either.
    plugd_host::procs::kill_orphans();
    plugd_node::log_writer::flush(std::time::Duration::from_secs(2));
    let msg = format!("{e:#}").replace('\n', " ");
    eprintln!("plugd: error: {msg}");
    std::process::exit(1);
}

/// `non_blocking`: log through the bounded queue of [`log_writer`] (serve,
/// and bench, which measures serve's paths).
fn init_logging(flag: Option<&str>, serve: bool, non_blocking: bool) {
    let filter = flag
        .map(str::to_owned)
        .or_else(|| std::env::var("PLUGD_LOG").ok())
        .unwrap_or_else(|| if serve { "info" } else { "warn" }.to_owned());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    // serve's log never blocks it: a bounded queue that drops and counts.
    match non_blocking.then(plugd_node::log_writer::LogWriter::start) {
        Some(Ok(writer)) => fmt.with_writer(writer).init(),
        Some(Err(e)) => {
            eprintln!(
                "plugd: warning: cannot start the log writer thread ({e}); logging to stderr directly"
            );
            fmt.with_writer(std::io::stderr).init();
        }
        None => fmt.with_writer(std::io::stderr).init(),
    }
}

fn open(cli: &Cli) -> Result<Runtime> {
    let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
    let config = HostConfig::from_env().map_err(anyhow::Error::msg)?;
    Ok(Runtime::open(&dir, config)?)
}

/// Runs `fut`; on Ctrl-C or SIGTERM shuts the plugins down and exits 130.
async fn interruptible<T>(rt: &Runtime, fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::select! {
        r = fut => r,
        _ = shutdown_signal() => {
            eprintln!("plugd: interrupted; shutting plugins down");
            rt.shutdown().await;
            std::process::exit(130);
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}

async fn run(cli: Cli) -> Result<i32> {
    match &cli.command {
        // For serve, Ctrl-C is the normal way out: it shuts down and exits 0.
        Command::Serve(args) => {
            let config = plugd_node::NodeConfig {
                workspace: cli.workspace.clone(),
                listen: args.listen,
            };
            return plugd_node::run(config, plugd_node::Backends::local())
                .await
                .map(|()| 0);
        }
        Command::Bench(args) => return plugd_bench::run(args).await.map(|()| 0),
        Command::Token(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return token_cmd::run(&dir, cmd).map(|()| 0);
        }
        Command::Bus(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return bus_cmd::run(&dir, cmd).await.map(|()| 0);
        }
        Command::Package(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return package_cmd::run(&dir, cmd).await.map(|()| 0);
        }
        Command::Binding(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return binding_cmd::run(&dir, cmd).map(|()| 0);
        }
        Command::Marketplace(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return marketplace_cmd::run(&dir, cmd).await.map(|()| 0);
        }
        Command::Secret(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return binding_cmd::secret(&dir, cmd).map(|()| 0);
        }
        Command::Invocations(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return invocations_cmd::run(&dir, cmd).map(|()| 0);
        }
        Command::Session(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return chains_cmd::session(&dir, cmd).map(|()| 0);
        }
        Command::Chain(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return chains_cmd::chain(&dir, cmd).map(|()| 0);
        }
        Command::Run(agent_cmd::RunArgs { cmd: Some(cmd), .. }) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return chains_cmd::run_cmd(&dir, cmd).map(|()| 0);
        }
        Command::Console => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return console_cmd::run(&dir).await.map(|()| 0);
        }
        Command::Config(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return policy_cmd::run(&dir, cmd).await.map(|()| 0);
        }
        Command::Manifest(ManifestCmd::Schema) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&plugd_manifest::native_manifest_schema())?
            );
            return Ok(0);
        }
        Command::State(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            state_cmd::run(&dir, cmd)?;
            return Ok(0);
        }
        Command::Plugin(PluginCmd::Signing(cmd)) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            sign_cmd::run(cmd, &dir)?;
            return Ok(0);
        }
        Command::Plugin(
            cmd @ (PluginCmd::Approve(_)
            | PluginCmd::Revoke { .. }
            | PluginCmd::Restart { .. }
            | PluginCmd::Stop { .. }
            | PluginCmd::Start { .. }),
        ) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            if plugin_ctl_cmd::through_serve(&dir, cmd).await? {
                return Ok(0);
            }
        }
        _ => {}
    }
    let rt = open(&cli)?;
    risk_cmd::install_approver(&rt, &cli.command);
    tool_call_cmd::install_elicitor(&rt, &cli.command);
    let result = interruptible(&rt, dispatch(&rt, &cli.command)).await;
    rt.shutdown().await;
    if let (Err(e), Command::Tool(ToolCmd::Call { json, .. })) = (&result, &cli.command)
        && json.json
    {
        return Ok(tool_call_cmd::report(e));
    }
    result.map(|()| 0)
}

async fn dispatch(rt: &Runtime, command: &Command) -> Result<()> {
    match command {
        Command::Plugin(PluginCmd::List(f)) => {
            let plugins = rt.plugin_list()?;
            if f.json {
                print_json(&plugin_rows(&plugins), false)?;
            } else {
                print_plugin_table(&plugins);
            }
        }
        Command::Plugin(PluginCmd::Show { id, json }) => {
            let mut info = rt.plugin(id)?;
            let mut via = None;
            let mut live_json = None;
            // The live counters belong to the process running the plugin.
            if let Some(serve) = remote::Remote::find(rt.dir()).await {
                match serve
                    .get(&format!("/v1/plugins/{id}"), format!("plugin show {id}"))
                    .await
                {
                    Ok(live) => {
                        info.stats = serde_json::from_value(live["stats"].clone()).unwrap_or(None);
                        info.broker =
                            serde_json::from_value(live["broker"].clone()).unwrap_or(None);
                        if let Some(state) = live["state"].as_str() {
                            // State and its reason from one source: serve
                            // knows a failure before the store records it.
                            info.state = state.to_owned();
                            info.error = live["error"].as_str().map(str::to_owned);
                            via = Some(serve.pid());
                        }
                        live_json = Some(live);
                    }
                    Err(e) => tracing::warn!("cannot read the live state from plugd serve: {e}"),
                }
            }
            if json.json {
                // Serve's whole view of it when serve runs, else ours.
                match &live_json {
                    Some(live) => print_json(live, true)?,
                    None => print_json(&info, true)?,
                }
            } else {
                if let Some(pid) = via {
                    info.state = format!("{} (in plugd serve pid {pid})", info.state);
                }
                print_plugin_detail(&info);
            }
        }
        Command::Plugin(PluginCmd::Approve(args)) => {
            let by = approver(args.by.as_deref());
            approve_cmd::local(rt, args, &by).await?;
        }
        Command::Plugin(PluginCmd::Revoke { id }) => {
            if rt.revoke(id).await? {
                println!("revoked {id}");
            } else {
                println!("{id} was not approved");
            }
        }
        Command::Plugin(PluginCmd::Restart { id }) => {
            rt.restart(id).await?;
            println!("restarted {id}: failure cleared, restart budget reset");
        }
        Command::Plugin(PluginCmd::Stop { id }) => {
            plugin_ctl_cmd::stop_local(rt, id, &approver(None)).await?
        }
        Command::Plugin(PluginCmd::Start { id }) => plugin_ctl_cmd::start_local(rt, id).await?,
        Command::Tool(ToolCmd::List(f)) => risk_cmd::list_tools(rt, f.json)?,
        // A running serve toggles the tool itself: its agents, gateway and
        // event stream see the change at once.
        Command::Tool(ToolCmd::Enable { name }) => match remote::Remote::find(rt.dir()).await {
            Some(serve) => risk_cmd::set_enabled_via(&serve, name, true).await?,
            None => risk_cmd::set_enabled(rt, name, true, None)?,
        },
        Command::Tool(ToolCmd::Disable { name, by }) => {
            match remote::Remote::find(rt.dir()).await {
                Some(serve) => risk_cmd::set_enabled_via(&serve, name, false).await?,
                None => risk_cmd::set_enabled(rt, name, false, by.as_deref())?,
            }
        }
        Command::Approvals(c) => risk_cmd::approvals(rt, c)?,
        Command::Tool(ToolCmd::Call {
            name,
            args,
            org: Some(org),
            project,
            session,
            json,
            ..
        }) => {
            let scope = tool_call_cmd::BoundScope {
                org,
                project: project.as_deref(),
                session: session.as_deref(),
            };
            tool_call_cmd::run_bound(rt, name, args, &scope, json.json).await?
        }
        Command::Tool(ToolCmd::Call {
            name,
            args,
            agent,
            json,
            ..
        }) => tool_call_cmd::run(rt, name, args, agent.as_deref(), json.json).await?,
        Command::Events(c) => outbox_cmd::events(rt, c)?,
        Command::Outbox(c) => outbox_cmd::outbox(rt, c)?,
        Command::Hook(cmd) => hook_cmd::run(rt, cmd).await?,
        Command::Run(args) => agent_cmd::run(rt, args).await?,
        Command::Chat(args) => agent_cmd::chat(rt, args).await?,
        Command::Memory(c) => memory_cmd::run(rt, c).await?,
        Command::Plugin(PluginCmd::Config(args)) => config_cmd::run(rt, args).await?,
        Command::Secrets(cmd) => config_cmd::secrets(rt, cmd)?,
        Command::Storage(cmd) => storage_cmd::run(rt, cmd)?,
        Command::Channel(cmd) => channel_cmd::run(rt, cmd).await?,
        Command::Skill(cmd) => skill_cmd::run(rt, cmd)?,
        Command::Mcp(args) => mcp_cmd::run(rt, args).await?,
        Command::Resource(cmd) => resource_cmd::resource(rt, cmd).await?,
        Command::Prompt(cmd) => resource_cmd::prompt(rt, cmd).await?,
        Command::Serve(_)
        | Command::Bench(_)
        | Command::Manifest(_)
        | Command::Bus(_)
        | Command::Token(_)
        | Command::Package(_)
        | Command::Binding(_)
        | Command::Marketplace(_)
        | Command::Secret(_)
        | Command::Invocations(_)
        | Command::Session(_)
        | Command::Chain(_)
        | Command::Console
        | Command::Config(_)
        | Command::State(_)
        | Command::Plugin(PluginCmd::Signing(_)) => {
            unreachable!("handled before the workspace opens")
        }
    }
    Ok(())
}

/// The manifest's non-fatal findings, after an approval: the operator sees
/// what was ignored in what they just approved.
fn print_approval_warnings<'a>(warnings: impl Iterator<Item = &'a str>) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

fn approver(by: Option<&str>) -> String {
    by.map(str::to_owned)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "unknown".into())
}

fn print_json<T: serde::Serialize>(v: &T, pretty: bool) -> Result<()> {
    let text = if pretty {
        serde_json::to_string_pretty(v)?
    } else {
        serde_json::to_string(v)?
    };
    println!("{text}");
    Ok(())
}

#[derive(serde::Serialize)]
struct PluginRow<'a> {
    id: &'a str,
    dialect: &'a str,
    state: &'a str,
    approved: bool,
    version: Option<&'a str>,
    tools: &'a [String],
    dir: &'a std::path::Path,
    error: Option<&'a str>,
}

fn plugin_rows(plugins: &[PluginInfo]) -> Vec<PluginRow<'_>> {
    plugins
        .iter()
        .map(|p| PluginRow {
            id: &p.id,
            dialect: &p.dialect,
            state: &p.state,
            approved: p.approved,
            version: p.version.as_deref(),
            tools: &p.tools,
            dir: &p.dir,
            error: p.error.as_deref(),
        })
        .collect()
}

fn print_plugin_table(plugins: &[PluginInfo]) {
    if plugins.is_empty() {
        println!("no plugins in .plugins/ of this workspace");
        return;
    }
    let width = plugins.iter().map(|p| p.id.len()).max().unwrap_or(2).max(2);
    println!(
        "{:width$}  {:8}  {:10}  {:8}  NOTE",
        "ID", "DIALECT", "STATE", "APPROVED"
    );
    for p in plugins {
        let note = p
            .error
            .clone()
            .unwrap_or_else(|| format!("{} tools", p.tools.len()));
        let note: String = note.chars().take(100).collect();
        println!(
            "{:width$}  {:8}  {:10}  {:8}  {note}",
            p.id,
            p.dialect,
            p.state,
            if p.approved { "yes" } else { "no" }
        );
    }
}

fn print_plugin_detail(p: &PluginInfo) {
    println!("id:        {}", p.id);
    println!("dialect:   {}", p.dialect);
    println!("version:   {}", p.version.as_deref().unwrap_or("-"));
    println!("state:     {}", p.state);
    if let Some(e) = &p.error {
        println!("error:     {e}");
    }
    println!("dir:       {}", p.dir.display());
    println!("signature: {}", p.signature.summary());
    println!("digest:    {}", p.digest.as_deref().unwrap_or("-"));
    match &p.approval {
        Some(a) if p.approved => {
            println!("approved:  yes, by {} at {}", a.approved_by, a.approved_at)
        }
        Some(a) => println!(
            "approved:  no (approval covers {}, files changed since)",
            a.digest
        ),
        None => println!("approved:  no"),
    }
    if let Some(start) = &p.start {
        println!("start:     {start}");
    }
    let remote_url = (p.details.get("transport").and_then(Value::as_str) == Some("http"))
        .then(|| p.details.get("url").and_then(Value::as_str))
        .flatten();
    if let Some(url) = remote_url {
        // What approving sends where: the URL and, per header, the operator
        // secrets its value names (`${NAME}`; never the values).
        println!("remote:    {url} (Streamable HTTP, runs inside plugd)");
        if let Some(headers) = p.details.get("headers").and_then(Value::as_object) {
            for (k, v) in headers {
                let v = v.as_str().unwrap_or_default();
                let names = plugd_manifest::mcp::placeholders(v);
                let secrets = if names.is_empty() {
                    String::new()
                } else {
                    format!(" (sends secret {})", names.join(", "))
                };
                println!("header:    {k}: {v}{secrets}");
            }
        }
    } else if !p.command.is_empty() {
        println!(
            "command:   {}",
            p.command
                .iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" ")
        );
        if let Some(cwd) = &p.cwd {
            println!("cwd:       {}", cwd.display());
        }
        println!("env:       (cleared, then exactly these)");
        for (k, v) in &p.env {
            println!("  {k}={}", shell_quote(v));
        }
    }
    for line in p.permissions.iter().flat_map(|e| e.text_lines()) {
        println!("{line}");
    }
    if !p.processes.is_empty() {
        println!("processes:");
        for g in &p.processes {
            let pids = if g.pids.is_empty() {
                String::new()
            } else {
                format!(
                    " pid {}",
                    g.pids
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                )
            };
            println!(
                "  {}{}: {}{pids}, restarts {}; exports {}{}",
                g.group,
                if g.per_invocation {
                    " (a process per invocation)"
                } else {
                    ""
                },
                g.state,
                g.restarts,
                if g.exports.is_empty() {
                    "-".to_owned()
                } else {
                    g.exports.join(", ")
                },
                g.error
                    .as_deref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            );
        }
    }
    println!(
        "tools:     {}",
        if p.tools.is_empty() {
            "-".into()
        } else {
            p.tools.join(", ")
        }
    );
    for c in &p.config {
        let v = match &c.value {
            Value::Null => "(unset)".to_owned(),
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        println!("config:    {} = {v} ({})", c.key, c.source);
    }
    if let Some(s) = &p.stats {
        println!(
            "counters:  shed={} junk={} unknown_ids={} oversized={}",
            s.shed_notifications, s.junk_frames, s.unknown_ids, s.oversized_frames
        );
    }
    if let Some(b) = &p.broker {
        println!(
            "broker:    published={} dropped={} delivered={} shed={}",
            b.published, b.dropped, b.delivered, b.shed
        );
    }
    if let Some(exports) = p.details.get("exports").and_then(Value::as_array) {
        println!("exports:");
        for e in exports {
            let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("-").to_owned();
            let perms = e.get("permissions").cloned().unwrap_or(Value::Null);
            let perm = |k: &str| {
                perms
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_owned()
            };
            let id = field("id");
            // The class plugd runs it with, when it differs from the
            // manifest's, and its process group.
            let placed = p
                .permissions
                .iter()
                .flat_map(|r| &r.vai)
                .find(|x| x.export == id);
            let class = match placed {
                Some(x) if x.effective_class != x.requested_class => format!(
                    "{} -> {}",
                    field("execution_class"),
                    plugd_host::groups::class_str(x.effective_class)
                ),
                _ => field("execution_class"),
            };
            let group = placed
                .map(|x| format!(" in {}", x.group))
                .unwrap_or_default();
            println!(
                "  {id} ({}, {class}{group}): network={} filesystem={}",
                field("kind"),
                perm("network"),
                perm("filesystem")
            );
            let words = |v: Option<&Value>| -> Vec<String> {
                v.and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let scopes = words(perms.get("gateway_api_scopes"));
            if !scopes.is_empty() {
                println!("    delegated scopes: {}", scopes.join(", "));
            }
            if let Some(h) = e.get("harness").filter(|h| h.is_object()) {
                let supports = words(h.get("supports"));
                println!(
                    "    harness: fidelity={} supports=[{}]",
                    h.get("fidelity").and_then(Value::as_str).unwrap_or("-"),
                    supports.join(", ")
                );
            }
        }
    } else if !p.details.is_null() {
        println!("{}:  {}", p.dialect, p.details);
    }
    risk_cmd::print_tool_risks(p);
    for w in &p.warnings {
        println!("warning:   {w}");
    }
}

/// One progress event as a line: `message (3/10)`, whatever the dialect's shape.
fn describe_progress(event: &Value) -> String {
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

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
