//! `plugd state reset`: start a workspace's state over on purpose, moving the
//! old database and its marker aside (never deleting them); `plugd state
//! export --to URL`: copy it into an empty PostgreSQL cluster.

use std::path::Path;

use anyhow::{Result, bail};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum StateCmd {
    /// Move the state database (approvals, secrets, sessions) and its marker
    /// into `.plugd/reset-<time>/`; the next command starts a fresh workspace.
    Reset {
        /// Really do it (without it, only says what would be moved).
        #[arg(long)]
        yes: bool,
    },
    /// Copy the workspace's state (approvals, tokens, secrets still sealed,
    /// audit, sessions, memory, packages, bindings, …) into an initialised
    /// and empty cluster database, in one transaction; the workspace is only read.
    Export {
        /// The cluster's PostgreSQL database (see `plugd cluster init`).
        #[arg(long, value_name = "URL")]
        to: String,
    },
}

pub async fn run(workspace: &Path, cmd: &StateCmd) -> Result<()> {
    match cmd {
        StateCmd::Reset { yes } => reset(workspace, *yes),
        StateCmd::Export { to } => export(workspace, to).await,
    }
}

/// Copies the workspace's state into the cluster at `url`.
async fn export(workspace: &Path, url: &str) -> Result<()> {
    let dump = plugd_store::dump::read_workspace(&workspace.join(".plugd"))?;
    let store = crate::cluster_cmd::connect(url)?;
    // A cluster made by an older plugd gets this build's schema first; an
    // uninitialised database is refused by the import, untouched.
    if store.cluster_info().await?.is_some() {
        store.migrate().await?;
    }
    let report = store.import_workspace(&dump).await?;
    println!(
        "exported {} into cluster {} ({})",
        dump.path.display(),
        report.cluster_id,
        store.label()
    );
    let width = report
        .tables
        .iter()
        .map(|(t, _)| t.len())
        .max()
        .unwrap_or(0);
    for (table, rows) in &report.tables {
        println!("  {table:<width$}  {rows}");
    }
    let total: u64 = report.tables.iter().map(|(_, n)| n).sum();
    println!(
        "{total} rows in {} tables; the workspace's own state is unchanged",
        report.tables.len()
    );
    Ok(())
}

fn reset(workspace: &Path, yes: bool) -> Result<()> {
    let state_dir = workspace.join(".plugd");
    if !yes {
        let present: Vec<&str> = plugd_store::identity::STATE_FILES
            .iter()
            .copied()
            .filter(|f| std::fs::symlink_metadata(state_dir.join(f)).is_ok())
            .collect();
        bail!(
            "`plugd state reset` moves {} of {} aside and starts the workspace over (every approval, secret and session); run `plugd state reset --yes` to do it",
            if present.is_empty() {
                "nothing (no state files)".to_owned()
            } else {
                present.join(", ")
            },
            state_dir.display()
        );
    }
    // No serve may hold the database while it moves: a live serve would
    // keep writing the moved file and the next one would start over.
    let _lock = match plugd_runtime::serve_lock::ServeLock::acquire(workspace) {
        Ok(lock) => lock,
        Err(plugd_runtime::serve_lock::LockError::Held { holder, .. }) => bail!(
            "plugd serve ({holder}) runs on workspace {} and holds its state database; stop it first (Ctrl-C or SIGTERM), then run `plugd state reset --yes` again",
            workspace.display()
        ),
        Err(e) => return Err(e.into()),
    };
    match plugd_store::identity::reset(&state_dir)? {
        Some((aside, moved)) => println!(
            "moved {} to {}; the next plugd command starts a fresh workspace: approve the plugins and set their secrets again",
            moved.join(", "),
            aside.display()
        ),
        None => println!(
            "nothing to reset: {} holds no state files",
            state_dir.display()
        ),
    }
    Ok(())
}
