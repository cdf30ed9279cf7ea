//! The `plugd` command line: parses the arguments and dispatches to
//! `plugd-cli` (the commands), `plugd-node` (`serve`) and `plugd-bench`.
//!
//! Exit codes: 0 on success, 1 with a one-line `plugd: error: …` on stderr
//! otherwise (2 for usage errors, from clap), 3 when `plugd run`'s turn was
//! blocked by a hook, 130 when interrupted; `tool call --json` exits 4..8 by
//! error class (see `plugd_cli::tool_call_cmd`).
#![allow(clippy::print_stdout, clippy::print_stderr)] // the CLI's output is its job

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use plugd_cli::client::Client;
use plugd_cli::plugin_ctl_cmd::{self, PluginAction};
use plugd_cli::remote::Remote;
use plugd_cli::risk_cmd::{self, Approvals};
use plugd_cli::{
    agent_cmd, approve_cmd, binding_cmd, bus_cmd, chains_cmd, channel_cmd, cluster_cmd, config_cmd,
    console_cmd, hook_cmd, invocations_cmd, marketplace_cmd, mcp_cmd, memory_cmd, outbox_cmd,
    package_cmd, plugin_view, policy_check_cmd, policy_cmd, resource_cmd, sign_cmd, skill_cmd,
    state_cmd, storage_cmd, token_cmd, tool_call_cmd,
};
use plugd_host::HostConfig;
use plugd_runtime::Runtime;

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
    /// The workspace's state database: start it over on purpose, export it into a cluster.
    #[command(subcommand)]
    State(state_cmd::StateCmd),
    /// A cluster of nodes sharing one PostgreSQL state: init.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCmd),
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
    /// plugd.yaml's per-tool `policy:` rules: check which rule decides a call.
    #[command(subcommand)]
    Policy(policy_check_cmd::PolicyCheckCmd),
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
    /// Keep the state in this PostgreSQL database (`postgres://…`, made a
    /// cluster by `plugd cluster init`) instead of .plugd/state.db; also
    /// PLUGD_STATE, else plugd.yaml's `state:`.
    #[arg(long, value_name = "URL", env = "PLUGD_STATE")]
    state: Option<String>,
    /// Join the cluster's NATS (`nats://HOST:PORT`): the bus reaches every
    /// node of the cluster (needs `--state postgres://…`); also PLUGD_NATS.
    #[arg(long, value_name = "URL", env = "PLUGD_NATS")]
    nats: Option<String>,
    /// This node's id in the cluster (default: a fresh one per start);
    /// also PLUGD_NODE_ID.
    #[arg(long, value_name = "ID", env = "PLUGD_NODE_ID")]
    node_id: Option<String>,
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

async fn open(cli: &Cli) -> Result<Runtime> {
    let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
    let config = HostConfig::from_env().map_err(anyhow::Error::msg)?;
    // The state as serve would keep it: PLUGD_STATE, plugd.yaml's `state:`,
    // else the workspace's SQLite file.
    let state = plugd_cli::state::open(&dir).await?;
    Ok(Runtime::open_on(&dir, state, config, plugd_agent::parts()).await?)
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
                state: args.state.clone(),
                nats: args.nats.clone(),
                node_id: args.node_id.clone(),
            };
            return plugd_node::run(config, plugd_node::Backends::local())
                .await
                .map(|()| 0);
        }
        Command::Bench(args) => return plugd_bench::run(args).await.map(|()| 0),
        Command::Token(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return token_cmd::run(&dir, cmd).await.map(|()| 0);
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
            return binding_cmd::run(&dir, cmd).await.map(|()| 0);
        }
        Command::Marketplace(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return marketplace_cmd::run(&dir, cmd).await.map(|()| 0);
        }
        Command::Secret(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return binding_cmd::secret(&dir, cmd).await.map(|()| 0);
        }
        Command::Invocations(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return invocations_cmd::run(&dir, cmd).await.map(|()| 0);
        }
        Command::Session(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return chains_cmd::session(&dir, cmd).await.map(|()| 0);
        }
        Command::Chain(cmd) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return chains_cmd::chain(&dir, cmd).await.map(|()| 0);
        }
        Command::Run(agent_cmd::RunArgs { cmd: Some(cmd), .. }) => {
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            return chains_cmd::run_cmd(&dir, cmd).await.map(|()| 0);
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
            state_cmd::run(&dir, cmd).await?;
            return Ok(0);
        }
        Command::Cluster(cmd) => {
            return cluster_cmd::run(cmd, cli.workspace.as_deref())
                .await
                .map(|()| 0);
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
            // Whenever serve runs, through it: never beside it.
            let dir = plugd_runtime::workspace::resolve_dir(cli.workspace.as_deref())?;
            if let Some(serve) = Remote::running(&dir).await? {
                plugin_ctl_cmd::run(&Client::Serve(serve), plugin_action(cmd)).await?;
                return Ok(0);
            }
        }
        _ => {}
    }
    let rt = open(&cli).await?;
    risk_cmd::install_approver(
        &rt,
        match &cli.command {
            Command::Mcp(_) => Approvals::Queue,
            Command::Tool(ToolCmd::Call { yes, .. }) => Approvals::Terminal { yes: *yes },
            _ => Approvals::Terminal { yes: false },
        },
    );
    tool_call_cmd::install_elicitor(
        &rt,
        matches!(cli.command, Command::Serve(_) | Command::Mcp(_)),
    );
    let result = interruptible(&rt, dispatch(&rt, &cli.command)).await;
    rt.shutdown().await;
    if let (Err(e), Command::Tool(ToolCmd::Call { json, .. })) = (&result, &cli.command)
        && json.json
    {
        return Ok(plugd_cli::errors::report(e));
    }
    result.map(|()| 0)
}

/// The plugin action `cmd` names (only approve, revoke, restart, start
/// and stop are actions).
fn plugin_action(cmd: &PluginCmd) -> PluginAction<'_> {
    match cmd {
        PluginCmd::Approve(args) => PluginAction::Approve(args),
        PluginCmd::Revoke { id } => PluginAction::Revoke(id),
        PluginCmd::Restart { id } => PluginAction::Restart(id),
        PluginCmd::Stop { id } => PluginAction::Stop(id),
        PluginCmd::Start { id } => PluginAction::Start(id),
        PluginCmd::List(_)
        | PluginCmd::Show { .. }
        | PluginCmd::Signing(_)
        | PluginCmd::Config(_) => unreachable!("not a plugin action"),
    }
}

async fn dispatch(rt: &Runtime, command: &Command) -> Result<()> {
    match command {
        Command::Plugin(PluginCmd::List(f)) => plugin_view::list(rt, f.json).await?,
        Command::Plugin(PluginCmd::Show { id, json }) => {
            plugin_view::show(rt, id, json.json).await?
        }
        Command::Plugin(
            cmd @ (PluginCmd::Approve(_)
            | PluginCmd::Revoke { .. }
            | PluginCmd::Restart { .. }
            | PluginCmd::Stop { .. }
            | PluginCmd::Start { .. }),
        ) => plugin_ctl_cmd::run(&Client::Local(rt), plugin_action(cmd)).await?,
        Command::Tool(ToolCmd::List(f)) => risk_cmd::list_tools(rt, f.json)?,
        Command::Policy(cmd) => policy_check_cmd::run(rt, cmd)?,
        // A running serve toggles the tool itself: its agents, gateway and
        // event stream see the change at once.
        Command::Tool(ToolCmd::Enable { name }) => {
            let client = Remote::find(rt.dir())
                .await
                .map_or(Client::Local(rt), Client::Serve);
            risk_cmd::set_enabled(&client, name, true, None).await?
        }
        Command::Tool(ToolCmd::Disable { name, by }) => {
            let client = Remote::find(rt.dir())
                .await
                .map_or(Client::Local(rt), Client::Serve);
            risk_cmd::set_enabled(&client, name, false, by.as_deref()).await?
        }
        Command::Approvals(c) => risk_cmd::approvals(rt, c).await?,
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
        Command::Events(c) => outbox_cmd::events(rt, c).await?,
        Command::Outbox(c) => outbox_cmd::outbox(rt, c).await?,
        Command::Hook(cmd) => hook_cmd::run(rt, cmd).await?,
        Command::Run(args) => agent_cmd::run(rt, args, plugd_node::delegated_api).await?,
        Command::Chat(args) => agent_cmd::chat(rt, args).await?,
        Command::Memory(c) => memory_cmd::run(rt, c).await?,
        Command::Plugin(PluginCmd::Config(args)) => config_cmd::run(rt, args).await?,
        Command::Secrets(cmd) => config_cmd::secrets(rt, cmd).await?,
        Command::Storage(cmd) => storage_cmd::run(rt, cmd).await?,
        Command::Channel(cmd) => channel_cmd::run(rt, cmd).await?,
        Command::Skill(cmd) => skill_cmd::run(rt, cmd).await?,
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
        | Command::Cluster(_)
        | Command::Plugin(PluginCmd::Signing(_)) => {
            unreachable!("handled before the workspace opens")
        }
    }
    Ok(())
}
