//! `plugd binding create|list|show|update|validate` and `plugd secret
//! set|list`: bindings of installed package exports to orgs and projects,
//! and the per-org secrets they reference, on the workspace's state
//! database (so a running serve sees them at once). The checks are
//! plugd-governance's binding service ([`plugd_governance::bindings`]), the
//! API's own, so the CLI and the API accept the same.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use plugd_control::{Binding, BindingFilter, BindingPatch, BindingStatus, Rollout};
use plugd_governance::bindings::{NewBinding, create, update, validate, visible};

use crate::errors::Failure;

/// What `create` and `update` may set.
#[derive(Args, Debug)]
pub struct Settings {
    /// The config, a JSON object (checked against the export's config_schema).
    #[arg(long, value_name = "JSON")]
    config: Option<String>,
    /// A secret slot: SLOT=secret://ORG/NAME (repeat for several; `update`
    /// replaces the whole map when given).
    #[arg(long = "secret", value_name = "SLOT=REF")]
    secrets: Vec<String>,
    /// Its share of the scope's traffic, 0 to 100.
    #[arg(long, value_name = "PERCENT")]
    traffic: Option<u8>,
    /// active or disabled.
    #[arg(long)]
    status: Option<BindingStatus>,
    /// The delegated gateway scopes the export gets at most, comma-separated
    /// (a policy override; default: what the export asks for).
    #[arg(long, value_name = "SCOPE,…", value_delimiter = ',')]
    scopes: Option<Vec<String>>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `plugd binding …`.
#[derive(Subcommand, Debug)]
pub enum BindingCmd {
    /// Bind an export of an installed package to an org (or a project).
    Create {
        /// PUBLISHER/NAME or PUBLISHER/NAME@VERSION (default: the highest installed).
        #[arg(long)]
        package: String,
        /// The export's id.
        #[arg(long)]
        export: String,
        /// The org.
        #[arg(long)]
        org: String,
        /// The project (default: the whole org).
        #[arg(long)]
        project: Option<String>,
        #[command(flatten)]
        settings: Settings,
    },
    /// List bindings.
    List {
        /// Only this org's.
        #[arg(long)]
        org: Option<String>,
        /// Only this export's.
        #[arg(long)]
        export: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one binding.
    Show {
        /// Its id (bind_…).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change a binding's config, secrets, share, status or version.
    Update {
        /// Its id (bind_…).
        id: String,
        /// Another installed version of the same package.
        #[arg(long)]
        package_version: Option<String>,
        #[command(flatten)]
        settings: Settings,
    },
    /// Check a binding against its export's contract and the stored secrets.
    Validate {
        /// Its id (bind_…).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `plugd secret …`: secrets of one org, for `secret://ORG/NAME`.
#[derive(Subcommand, Debug)]
pub enum SecretCmd {
    /// Store ORG/NAME, read from standard input (never the command line),
    /// sealed with the master key.
    Set {
        /// ORG/NAME.
        name: String,
    },
    /// Remove ORG/NAME; bindings that still reference it fail their next
    /// call naming the slot.
    Delete {
        /// ORG/NAME.
        name: String,
    },
    /// The names of an org's secrets (never their values).
    List {
        /// The org.
        org: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn who() -> String {
    plugd_store::users::user_name(rustix::process::geteuid().as_raw())
}

fn parse_secrets(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("--secret {p:?}: write SLOT=secret://ORG/NAME"))
        })
        .collect()
}

fn parse_config(text: Option<&str>) -> Result<Option<serde_json::Value>> {
    text.map(|t| serde_json::from_str(t).with_context(|| format!("--config {t:?} is not JSON")))
        .transpose()
}

fn print(b: &Binding, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(b)?);
    } else {
        println!("binding:   {}", b.binding_id);
        println!("package:   {}@{}", b.package_id, b.package_version);
        println!("export:    {}", b.export_id);
        println!("scope:     {}", b.scope);
        println!("status:    {}", b.status.as_str());
        println!("traffic:   {}%", b.rollout.traffic_percent);
        println!("config:    {}", b.config);
        for (slot, r) in &b.secrets {
            println!("secret:    {slot} = {r}");
        }
    }
    Ok(())
}

/// Runs `plugd binding …` for the workspace `dir` (as its operator).
pub async fn run(dir: &Path, cmd: &BindingCmd) -> Result<()> {
    let store = crate::state::open(dir).await?;
    match cmd {
        BindingCmd::Create {
            package,
            export,
            org,
            project,
            settings,
        } => {
            let (package_id, package_version) = match package.rsplit_once('@') {
                Some((id, v)) => (id.to_owned(), Some(v.to_owned())),
                None => (package.clone(), None),
            };
            let req = NewBinding {
                package_id,
                package_version,
                export_id: export.clone(),
                scope: plugd_control::Scope {
                    org_id: org.clone(),
                    project_id: project.clone(),
                },
                config: parse_config(settings.config.as_deref())?,
                secrets: parse_secrets(&settings.secrets)?,
                status: settings.status,
                rollout: settings
                    .traffic
                    .map(|traffic_percent| Rollout { traffic_percent }),
                gateway_api_scopes: settings.scopes.clone(),
            };
            let b = create(&*store, req, &who()).await.map_err(Failure::from)?;
            print(&b, settings.json)?;
        }
        BindingCmd::List { org, export, json } => {
            let all = store
                .bindings(&BindingFilter {
                    org_id: org.clone(),
                    export_id: export.clone(),
                    ..BindingFilter::default()
                })
                .await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else if all.is_empty() {
                println!("no bindings; make one with `plugd binding create`");
            } else {
                println!(
                    "{:<21} {:<16} {:<24} {:<28} {:<8} TRAFFIC",
                    "BINDING", "SCOPE", "EXPORT", "PACKAGE", "STATUS"
                );
                for b in &all {
                    println!(
                        "{:<21} {:<16} {:<24} {:<28} {:<8} {}%",
                        b.binding_id,
                        b.scope.to_string(),
                        b.export_id,
                        format!("{}@{}", b.package_id, b.package_version),
                        b.status.as_str(),
                        b.rollout.traffic_percent
                    );
                }
            }
        }
        BindingCmd::Show { id, json } => print(
            &visible(&*store, None, id).await.map_err(Failure::from)?,
            *json,
        )?,
        BindingCmd::Update {
            id,
            package_version,
            settings,
        } => {
            let patch = BindingPatch {
                package_version: package_version.clone(),
                config: parse_config(settings.config.as_deref())?,
                secrets: (!settings.secrets.is_empty())
                    .then(|| parse_secrets(&settings.secrets))
                    .transpose()?,
                status: settings.status,
                rollout: settings
                    .traffic
                    .map(|traffic_percent| Rollout { traffic_percent }),
                gateway_api_scopes: settings.scopes.clone(),
            };
            if patch == BindingPatch::default() {
                bail!(
                    "nothing to change; give --config, --secret, --traffic, --status, --scopes or --package-version"
                );
            }
            print(
                &update(&*store, None, id, &patch)
                    .await
                    .map_err(Failure::from)?,
                settings.json,
            )?;
        }
        BindingCmd::Validate { id, json } => {
            let v = validate(&*store, None, id, None)
                .await
                .map_err(Failure::from)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if v["valid"] == true {
                println!("binding {id} is valid");
            } else {
                for p in v["problems"].as_array().into_iter().flatten() {
                    println!(
                        "{}: {}",
                        p["path"].as_str().unwrap_or("/"),
                        p["message"].as_str().unwrap_or("")
                    );
                }
                bail!("binding {id} has problems");
            }
        }
    }
    Ok(())
}

/// Runs `plugd secret …` for the workspace `dir`.
pub async fn secret(dir: &Path, cmd: &SecretCmd) -> Result<()> {
    let store = crate::state::open(dir).await?;
    match cmd {
        SecretCmd::Set { name } => {
            let Some((org, secret)) = name.split_once('/') else {
                bail!(
                    "{name:?} names no org; write ORG/NAME (plugd secrets set NAME is for plugd's own secrets)"
                );
            };
            let value = crate::config_cmd::read_stdin_value()?;
            store.org_secret_set(org, secret, &value).await?;
            println!(
                "stored secret {org}/{secret} (sealed with the master key); bind it as secret://{org}/{secret}"
            );
        }
        SecretCmd::Delete { name } => {
            let Some((org, secret)) = name.split_once('/') else {
                bail!("{name:?} names no org; write ORG/NAME");
            };
            if store.org_secret_delete(org, secret).await? {
                println!("deleted secret {org}/{secret}");
            } else {
                bail!(
                    "org {org} has no secret {secret:?}; `plugd secret list {org}` shows its secrets"
                );
            }
        }
        SecretCmd::List { org, json } => {
            let names = store.org_secret_names(org).await?;
            if *json {
                println!("{}", serde_json::json!(names));
            } else if names.is_empty() {
                println!(
                    "org {org} has no secrets; `plugd secret set {org}/NAME` stores one from standard input"
                );
            } else {
                for n in names {
                    println!("{n}");
                }
            }
        }
    }
    Ok(())
}
