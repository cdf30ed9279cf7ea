//! `plugd token create|list|revoke`: the bearer tokens `plugd serve --listen`
//! accepts. They live in the workspace's state database (hashes only), so a
//! running serve sees a new or revoked token at its next request.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Subcommand;

use plugd_store::tokens::{self, Role, TokenInfo};

/// `plugd token …`.
#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Make a token and print its secret once (only a hash is kept).
    Create {
        /// A name for it (unique among live tokens); requests are recorded under it.
        #[arg(long)]
        name: String,
        /// admin (everything), operator (approve, revoke, restart, config,
        /// decide calls), agent (invoke tools, run turns, publish) or viewer
        /// (read only).
        #[arg(long)]
        role: Role,
        /// How long it works, e.g. 30m, 12h, 90d, 2w (default: until revoked).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        expires: Option<Duration>,
        /// Limit it to these MCP gateway profiles (repeat for several): it
        /// then reaches only `/mcp/PROFILE` of them, and reads.
        #[arg(long = "mcp-profile", value_name = "NAME")]
        mcp_profiles: Vec<String>,
        /// Bind it to an org: it then sees only that org's bindings,
        /// packages in use and secrets (default: the whole workspace).
        #[arg(long, value_name = "ORG")]
        org: Option<String>,
        /// Limit an org token to these projects (repeat for several).
        #[arg(long = "project", value_name = "PROJECT", requires = "org")]
        projects: Vec<String>,
        /// Print `{"id","name","role","token","expires_at","mcp_profiles"}`.
        #[arg(long)]
        json: bool,
    },
    /// List tokens (never their secrets).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by id (or by name): serve refuses it from its next request.
    Revoke {
        /// The token's id (as `plugd token list` shows it) or name.
        id: String,
    },
}

/// `30s`, `15m`, `12h`, `90d`, `2w`: a positive number and one unit (the
/// rule `POST /v1/tokens` applies to `expires_in` too:
/// [`plugd_store::tokens::parse_lifetime`]).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    plugd_store::tokens::parse_lifetime(s).map_err(|e| e.message)
}

fn who() -> String {
    plugd_store::users::user_name(rustix::process::geteuid().as_raw())
}

/// Runs `plugd token …` on the workspace's state database.
pub async fn run(workspace: &Path, cmd: &TokenCmd) -> Result<()> {
    let store = crate::state::open(workspace).await?;
    match cmd {
        TokenCmd::Create {
            name,
            role,
            expires,
            mcp_profiles,
            org,
            projects,
            json,
        } => {
            // The checks `POST /v1/tokens` makes too (plugd-control's tokens).
            let tenancy = tokens::check_scope(org.as_deref(), projects).map_err(|e| {
                anyhow::anyhow!("--{}: {}", e.field.trim_end_matches('s'), e.message)
            })?;
            for p in mcp_profiles {
                if !plugd_manifest::mcp::is_valid_server_name(p) {
                    bail!("--mcp-profile {p:?} is not a profile name (1-64 of A-Z a-z 0-9 _ -)");
                }
            }
            tokens::check_token_name(name).map_err(|e| anyhow::anyhow!(e.message))?;
            let expires_at_ms =
                expires.map(|d| tokens::expires_at_ms(plugd_store::outbox::now_ms(), d));
            let limited = (!mcp_profiles.is_empty()).then_some(mcp_profiles.as_slice());
            let t = store
                .token_create_scoped(
                    name,
                    *role,
                    expires_at_ms,
                    &who(),
                    limited,
                    tenancy.as_ref(),
                )
                .await?;
            if *json {
                let v = serde_json::json!({
                    "id": t.info.id,
                    "name": t.info.name,
                    "role": t.info.role,
                    "token": t.token,
                    "expires_at": t.info.expires_at,
                    "mcp_profiles": t.info.mcp_profiles,
                    "org_id": t.info.org_id,
                    "project_ids": t.info.project_ids,
                });
                println!("{v}");
            } else {
                println!("{}", t.token);
                eprintln!(
                    "token {} ({}, role {}{}) created; it is shown only now. Send it as `Authorization: Bearer TOKEN` to plugd serve --listen",
                    t.info.id,
                    t.info.name,
                    t.info.role,
                    t.info
                        .expires_at
                        .as_deref()
                        .map(|e| format!(", expires {e}"))
                        .unwrap_or_default()
                );
            }
        }
        TokenCmd::List { json } => {
            let tokens = store.token_list().await?;
            if *json {
                println!("{}", serde_json::to_string(&tokens)?);
            } else {
                print_table(&tokens);
            }
        }
        TokenCmd::Revoke { id } => match store.token_revoke(id).await? {
            Some(t) => println!(
                "revoked token {} ({}) at {}",
                t.id,
                t.name,
                t.revoked_at.as_deref().unwrap_or("?")
            ),
            None => bail!("no live token with id or name {id:?}; see `plugd token list`"),
        },
    }
    Ok(())
}

fn print_table(tokens: &[TokenInfo]) {
    println!(
        "{:<16}  {:<20}  {:<8}  {:<20}  {:<20}  {:<7}  SCOPE",
        "ID", "NAME", "ROLE", "CREATED", "EXPIRES", "STATE"
    );
    let now = plugd_store::now_rfc3339();
    for t in tokens {
        let state = match (&t.revoked_at, &t.expires_at) {
            (Some(_), _) => "revoked",
            (None, Some(e)) if *e <= now => "expired",
            _ => "live",
        };
        let scope = match (&t.org_id, t.project_ids.is_empty()) {
            (None, _) => "workspace".to_owned(),
            (Some(o), true) => o.clone(),
            (Some(o), false) => format!("{o} ({})", t.project_ids.join(", ")),
        };
        println!(
            "{:<16}  {:<20}  {:<8}  {:<20}  {:<20}  {state:<7}  {scope}",
            t.id,
            t.name,
            t.role.as_str(),
            t.created_at,
            t.expires_at.as_deref().unwrap_or("never")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_need_a_number_and_a_unit() {
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2w"), Ok(Duration::from_secs(14 * 86_400)));
        for bad in [
            "",
            "30",
            "m",
            "0h",
            "5y",
            "-1h",
            "99999999999999999999d",
            "1.5h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
