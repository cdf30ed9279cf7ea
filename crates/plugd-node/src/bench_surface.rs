//! The HTTP surface started on its own, without the rest of a node, for
//! plugd-bench: the runtime's API on the workspace socket
//! ([`api_on_socket`]), and serve's listener around another router
//! ([`listener_floor`]), so the benchmarks depend on no surface crate.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use plugd_runtime::Runtime;

/// Serves `rt`'s HTTP API on the workspace's Unix socket, as serve does
/// (plugd.yaml's hooks and agent, its HTTP limits); the socket's path and
/// the server task. The task runs until aborted; the socket file goes with
/// it.
pub async fn api_on_socket(rt: &Runtime) -> Result<(PathBuf, tokio::task::JoinHandle<()>)> {
    let config = plugd_runtime::config::PlugdConfig::load(rt.dir())?;
    let pipeline = Arc::new(plugd_agent::hooks::build::build_pipeline(&config, rt).await?);
    let agent = plugd_server::agent_for(rt, &pipeline, &config).await?;
    let limits = plugd_server::listen::Limits::from_config(&config.http);
    let state = plugd_server::AppState::new(rt.clone(), pipeline, Arc::new(config), agent);
    let mut socket = plugd_server::listen::UnixSocket::bind(&rt.dir().join(".plugd"))?;
    let path = socket.path().to_owned();
    let listener = socket.take().context("the socket listener was taken")?;
    let task = tokio::spawn(async move {
        // Never stopped: the task is aborted; `socket` removes the file.
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        let _socket = socket;
        let _ = plugd_server::listen::run(
            plugd_server::listen::Listener::Unix(listener),
            plugd_server::router(state),
            limits,
            stopped,
        )
        .await;
    });
    Ok((path, task))
}

/// Serves `app` on `listener` with serve's own listener (hyper, its
/// timeouts and connection cap, default HTTP limits) and no auth quota:
/// the floor under plugd's HTTP API. Runs until the listener fails.
pub async fn listener_floor(listener: tokio::net::TcpListener, app: axum::Router) -> Result<()> {
    use plugd_server::listen;
    let limits = listen::Limits::from_config(&plugd_runtime::config::HttpConfig::default())
        .without_auth_quota();
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    listen::run(listen::Listener::Tcp(listener), app, limits, shutdown)
        .await
        .context("the HTTP floor server stopped")
}
