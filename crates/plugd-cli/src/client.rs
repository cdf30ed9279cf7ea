//! One client for the commands that act either through a running `plugd
//! serve` or in this process: [`Client::Serve`] sends the action over the
//! workspace socket (see [`crate::remote`]), [`Client::Local`] calls the
//! runtime this command opened. Each command is written once over it and
//! prints the same line either way, with `(via plugd serve pid N)` added when
//! serve did it. The tool-call methods (`call_tool`, `call_export`) are in
//! [`crate::tool_call_cmd`], beside the terminal they print progress on.

use anyhow::Result;
use plugd_runtime::Runtime;
use serde_json::{Value, json};

use crate::remote::Remote;

/// Where a command acts.
#[derive(Debug)]
pub enum Client<'a> {
    /// Through the running serve of the workspace.
    Serve(Remote),
    /// In this process, on the runtime the command opened.
    Local(&'a Runtime),
}

/// What [`Client::approve`] reports.
#[derive(Debug)]
pub struct Approved {
    /// The digest approved (`?` when not reported).
    pub digest: String,
    /// The plugin's tools.
    pub tools: Vec<String>,
    /// Its state after the approval.
    pub state: String,
    /// Why it is in that state, if it is not running.
    pub error: Option<String>,
    /// The manifest's non-fatal findings.
    pub warnings: Vec<String>,
}

/// What [`Client::start`] reports.
#[derive(Debug)]
pub enum Started {
    /// Started here: the stop was cleared and the handshake done.
    Here,
    /// Started by serve, which reports the plugin's state.
    InServe {
        /// The state serve reports.
        state: String,
    },
}

impl<'a> Client<'a> {
    /// Serve when it runs for `rt`'s workspace, else `rt` itself.
    pub async fn of(rt: &'a Runtime) -> Result<Client<'a>> {
        Ok(crate::remote::Remote::running(rt.dir())
            .await?
            .map_or(Client::Local(rt), Client::Serve))
    }

    /// ` (via plugd serve pid N)` when serve acts, else nothing: the suffix
    /// of every line a command prints about what it did.
    pub fn via(&self) -> String {
        match self {
            Client::Serve(serve) => format!(" (via plugd serve pid {})", serve.pid()),
            Client::Local(_) => String::new(),
        }
    }

    /// The plugins not approved as they are now.
    pub async fn unapproved(&self) -> Result<Vec<String>> {
        Ok(match self {
            Client::Serve(serve) => {
                let rows = serve.get("/v1/plugins", "plugin list".into()).await?;
                rows.as_array()
                    .into_iter()
                    .flatten()
                    .filter(|r| !r["approved"].as_bool().unwrap_or(false))
                    .filter_map(|r| r["id"].as_str().map(str::to_owned))
                    .collect()
            }
            Client::Local(rt) => rt
                .plugin_list()
                .await?
                .into_iter()
                .filter(|p| !p.approved)
                .map(|p| p.id)
                .collect(),
        })
    }

    /// Approves `id` as its files are now (serve records the socket user as
    /// who approved; here it is `by`).
    pub async fn approve(&self, id: &str, by: &str) -> Result<Approved> {
        Ok(match self {
            Client::Serve(serve) => {
                let row = serve.plugin_action(id, "approve").await?;
                let strings = |k: &str| -> Vec<String> {
                    row[k]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default()
                };
                Approved {
                    digest: row["digest"].as_str().unwrap_or("?").to_owned(),
                    tools: strings("tools"),
                    state: row["state"].as_str().unwrap_or_default().to_owned(),
                    error: row["error"].as_str().map(str::to_owned),
                    warnings: strings("warnings"),
                }
            }
            Client::Local(rt) => {
                let info = rt.approve(id, by).await?;
                Approved {
                    digest: info
                        .approval
                        .as_ref()
                        .map_or("?", |a| a.digest.as_str())
                        .to_owned(),
                    tools: info.tools,
                    state: info.state,
                    error: info.error,
                    warnings: info.warnings,
                }
            }
        })
    }

    /// Withdraws `id`'s approval; `false` when it was not approved.
    pub async fn revoke(&self, id: &str) -> Result<bool> {
        Ok(match self {
            Client::Serve(serve) => {
                let row = serve.plugin_action(id, "revoke").await?;
                row["was_approved"].as_bool().unwrap_or(true)
            }
            Client::Local(rt) => rt.revoke(id).await?,
        })
    }

    /// Clears `id`'s failure and restart budget.
    pub async fn restart(&self, id: &str) -> Result<()> {
        match self {
            Client::Serve(serve) => {
                serve.plugin_action(id, "restart").await?;
            }
            Client::Local(rt) => rt.restart(id).await?,
        }
        Ok(())
    }

    /// Stops `id` and keeps it stopped (serve records the socket user as
    /// who stopped it; here it is `by`).
    pub async fn stop(&self, id: &str, by: &str) -> Result<()> {
        match self {
            Client::Serve(serve) => {
                serve.plugin_action(id, "stop").await?;
            }
            Client::Local(rt) => rt.stop(id, by).await?,
        }
        Ok(())
    }

    /// Starts `id` now, clearing an operator stop or a failure.
    pub async fn start(&self, id: &str) -> Result<Started> {
        Ok(match self {
            Client::Serve(serve) => {
                let row = serve.plugin_action(id, "start").await?;
                Started::InServe {
                    state: row["state"].as_str().unwrap_or("?").to_owned(),
                }
            }
            Client::Local(rt) => {
                rt.start(id).await?;
                Started::Here
            }
        })
    }

    /// Enables or disables tool `name`; returns its plugin and whether
    /// anything changed (serve records the socket user as who did it; here
    /// it is `by`).
    pub async fn set_tool_enabled(
        &self,
        name: &str,
        enabled: bool,
        by: &str,
    ) -> Result<(String, bool)> {
        Ok(match self {
            Client::Serve(serve) => {
                let action = if enabled { "enable" } else { "disable" };
                let row = serve
                    .post(
                        &format!("/v1/tools/{name}:{action}"),
                        &json!({}),
                        format!("tool {action} {name}"),
                    )
                    .await?;
                (
                    row["plugin"].as_str().unwrap_or("?").to_owned(),
                    row["changed"].as_bool().unwrap_or(true),
                )
            }
            Client::Local(rt) => {
                let (view, changed) = rt.set_tool_enabled(name, enabled, by).await?;
                (view.entry.plugin.clone(), changed)
            }
        })
    }
}
