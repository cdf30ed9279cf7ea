//! The serving sequence of a node on an open runtime: what starts in which
//! order, the serving lines, and the one shutdown sequence.
#![allow(clippy::print_stdout)] // the serving lines: tests and scripts read the socket and port from them

use anyhow::{Context, Result};
use plugd_runtime::Runtime;
use plugd_runtime::outbox::{OutboxConfig, OutboxWorker};

use plugd_runtime::serve_record;

use crate::{NodeConfig, eager, log_writer};

pub(crate) async fn serve(
    rt: &Runtime,
    args: &NodeConfig,
    forwarder: Option<std::sync::Arc<plugd_nats::NatsForwarder>>,
) -> Result<()> {
    // Refuse a non-loopback address before anything starts.
    if let Some(addr) = args.listen {
        plugd_server::check_listen(addr)?;
    }
    // From here on this process reads plugd.yaml through the gate: the file
    // as it is now is in force; a later change that widens a plugin's reach
    // waits for an operator (`plugd config approve`).
    let gate = plugd_runtime::config_gate::ConfigGate::start(rt)?;
    let config = plugd_runtime::config::PlugdConfig::load(rt.dir())?;
    rt.set_risk_config(config.risk.clone());
    let plugins = rt.plugin_list().await?;
    let approved = plugins.iter().filter(|p| p.approved).count();
    let _log_report = log_writer::spawn_reporter();
    let eager_extra = config.eager.clone();
    // Fail fast: every configured hook handler must load before plugd serves.
    let pipeline =
        std::sync::Arc::new(plugd_agent::hooks::build::build_pipeline(&config, rt).await?);
    let _outbox = start_outbox(rt)?;
    let _retention =
        plugd_runtime::invocations::spawn_retention(rt, config.invocations.retention_days);
    // The HTTP API shares that pipeline (Dexto modules load once).
    let agent = plugd_server::agent_for(rt, &pipeline, &config).await?;
    let channel_agent = agent.clone().map(|a| {
        std::sync::Arc::new(a) as std::sync::Arc<dyn plugd_runtime::channels::ChannelTurn>
    });
    let limits = plugd_server::listen::Limits::from_config(&config.http);
    let state = plugd_server::AppState::new(
        rt.clone(),
        pipeline.clone(),
        std::sync::Arc::new(config),
        agent,
    )
    .with_config_gate(gate.clone());
    // On a cluster: what another node must act on goes there, and what
    // another node hands here reaches this node's MCP sessions.
    let state = match &forwarder {
        Some(f) => {
            let state = state.with_forwarder(f.clone());
            f.set_taker(std::sync::Arc::new(plugd_server::mcp::McpTaker::new(
                state.clone(),
            )));
            state
        }
        None => state,
    };
    let console = state.clone();
    let app = plugd_server::router(state);
    // The socket first: the CLI reaches serve there, checked by peer uid.
    let mut socket = plugd_server::listen::UnixSocket::bind(&rt.dir().join(".plugd"))?;
    let (stop_http, http_stopped) = tokio::sync::watch::channel(false);
    let mut listeners = vec![plugd_server::listen::Listener::Unix(
        socket
            .take()
            .context("the socket listener was taken twice")?,
    )];
    let mut bound = None;
    if let Some(addr) = args.listen {
        let tcp = plugd_server::bind(addr).await?;
        bound = Some(
            tcp.local_addr()
                .with_context(|| format!("cannot read the address bound for {addr}"))?,
        );
        listeners.push(plugd_server::listen::Listener::Tcp(tcp));
    }
    // Plugins reach the API with their delegation tokens (VAI
    // `context.gateway.base_url`) on a loopback port of their own, which
    // serves the delegated routes to delegation tokens only: without
    // --listen there is no TCP listener of the whole API.
    let (_delegated, _delegated_task) =
        plugd_server::serve_delegated(rt, app.clone(), limits, http_stopped.clone()).await?;
    let servers: Vec<_> = listeners
        .into_iter()
        .map(|l| plugd_server::listen::run(l, app.clone(), limits, http_stopped.clone()))
        .collect();
    let mut http = tokio::spawn(async move {
        futures_util::future::try_join_all(servers)
            .await
            .map(|_| ())
    });
    // Eager plugins start once the API is up, a bounded number at a time.
    let started = eager::start(rt, &eager_extra).await?;
    tracing::info!(
        workspace = %rt.dir().display(),
        plugins = plugins.len(),
        approved,
        eager = started.len(),
        "plugd serving; Ctrl-C or SIGTERM stops"
    );
    for p in plugins.iter().filter(|p| !p.approved) {
        tracing::warn!(plugin = %p.id, state = %p.state, "not serving: {}", p.error.as_deref().unwrap_or("not approved"));
    }
    // The handlers are installed before the serving line, so a SIGTERM sent
    // as soon as it is read is a clean shutdown.
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle Ctrl-C")?;
    // The CLI's plugin commands find this serve through .plugd/serve.json;
    // dropping the record (every way out of this function) removes it.
    let _record = serve_record::ServeFile::write(rt.dir(), socket.path(), bound)?;
    // This node's row in the store: `GET /v1/cluster`, `/readyz`.
    let presence = crate::presence::Presence::start(rt, gate.clone(), bound);
    // A change to an approved plugin's files stops it and withholds its tools.
    let watcher = rt.watch(plugd_runtime::watch::WatchOptions::from_env());
    // Channel adapters: channel.start, inbound events → before_message → turn → reply.
    let channels =
        plugd_agent::channels::ChannelService::start(rt, channel_agent, pipeline.clone()).await;
    // Microapps get agents/updated (and a tools/list refresh) when plugd.yaml's agent changes.
    let agents_watch = tokio::spawn(rt.clone().watch_config(gate));
    // A changed Dexto module file is reloaded; a broken new version is not.
    let modules_watch = tokio::spawn(plugd_runtime::config_watch::watch_modules(pipeline.clone()));
    // Tests and scripts read the socket and the bound port from these lines.
    println!("plugd serving on unix:{}", socket.path().display());
    if let Some(bound) = bound {
        // A one-time link for whoever started serve (the code is good once,
        // for 10 minutes; `plugd console` prints another), only on a
        // terminal: a live credential never goes to a log file or a pipe
        // (nor through tracing). Before the serving line, which is the last
        // one readers wait for: a reader that stops there has read it.
        use std::io::IsTerminal as _;
        let mut out = std::io::stdout();
        if out.is_terminal() {
            if let Ok(path) = console.console_link_path().await {
                use std::io::Write as _;
                let _ = writeln!(out, "plugd console: http://{bound}{path}");
            }
        } else {
            println!("the console: http://{bound}/console/ (`plugd console` prints a login link)");
        }
        println!("plugd serving on http://{bound}");
    }
    let listening = bound.map_or_else(
        || format!("unix:{}", socket.path().display()),
        |b| format!("http://{b}"),
    );
    let failure = tokio::select! {
        _ = term.recv() => None,
        _ = int.recv() => None,
        r = &mut http => {
            // The server stopped on its own: an accept loop failure.
            Some(match r {
                Ok(Ok(())) => anyhow::anyhow!("the HTTP server on {listening} stopped unexpectedly"),
                Ok(Err(e)) => anyhow::anyhow!("the HTTP server on {listening} failed: {e}"),
                Err(e) => anyhow::anyhow!("the HTTP server on {listening} crashed: {e}"),
            })
        }
    };
    if failure.is_none() {
        tracing::info!("stopping the HTTP API");
        let _ = stop_http.send(true);
        // Requests in flight (a streaming turn) get a bounded grace period.
        if tokio::time::timeout(std::time::Duration::from_secs(10), &mut http)
            .await
            .is_err()
        {
            tracing::warn!("HTTP requests still running after 10 s; closing them");
            http.abort();
        }
        tracing::info!("shutting plugins down");
    }
    // The one shutdown sequence: watchers, channels, hook handlers, plugins.
    agents_watch.abort();
    modules_watch.abort();
    presence.leave().await;
    watcher.shutdown().await;
    channels.shutdown().await;
    pipeline.cleanup().await;
    rt.shutdown().await;
    match failure {
        Some(err) => Err(err),
        None => {
            tracing::info!("all plugins stopped");
            Ok(())
        }
    }
}

/// Starts the outbox worker (`PLUGD_OUTBOX_*` overrides applied); it runs
/// until the returned handle is dropped.
fn start_outbox(rt: &Runtime) -> Result<OutboxWorker> {
    let config = OutboxConfig::from_env()?;
    tracing::info!(
        poll_ms = config.poll.as_millis() as u64,
        lease_ms = config.lease.as_millis() as u64,
        max_attempts = config.retry.max_attempts,
        "outbox worker delivering hook events"
    );
    Ok(OutboxWorker::spawn(rt, config))
}
