//! `plugd console`: a one-time login link to the operator console of the
//! workspace's running `plugd serve`, asked for over the workspace socket
//! (so only serve's own user, or root, gets one).

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::remote::Remote;

/// Prints the link (stdout) and how long it lasts (stderr).
pub async fn run(workspace: &Path) -> Result<()> {
    let Some(serve) = Remote::find(workspace).await else {
        bail!(
            "no plugd serve runs on {}; start one with `plugd serve --listen 127.0.0.1:7878` (it prints a login link too)",
            workspace.display()
        );
    };
    let Some(addr) = serve.addr() else {
        bail!(
            "plugd serve (pid {}) has no HTTP listener, and the console is served there; restart it with `plugd serve --listen 127.0.0.1:7878`",
            serve.pid()
        );
    };
    let answer = serve
        .post("/console/links", &json!({}), "a console login link".into())
        .await?;
    let path = answer["path"]
        .as_str()
        .context("plugd serve answered a login link without a path")?;
    println!("http://{addr}{path}");
    eprintln!("a one-time login link: it works once, within 10 minutes");
    Ok(())
}
