//! `plugd marketplace list|show|install|sign`: the curated catalog of
//! plugd.yaml `marketplace:` on the workspace's state database (so a
//! running serve sees installs at once). Listing, checking and installing
//! are plugd-governance's ([`plugd_governance::marketplace_install`]), the
//! API's own code, so the CLI and the API agree;
//! `sign` signs an index document with a key `plugd plugin keygen` made.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use plugd_control::marketplace::MAX_INDEX_BYTES;
use plugd_governance::marketplace_install::{
    InstallRequest, Installer, catalog_view, entry_view, find, install, load,
};
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::signing::keys;
use serde_json::Value;

/// `plugd marketplace …`.
#[derive(Subcommand, Debug)]
pub enum MarketplaceCmd {
    /// List the catalog's entries and whether each installs.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one entry: publisher, review, signature, sources, OCI, exports.
    Show {
        /// The entry id.
        entry: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Pull an entry's package by its pinned digest and bind its exports in an org (or project).
    Install {
        /// The entry id.
        entry: String,
        /// The org.
        #[arg(long)]
        org: String,
        /// The project (default: the whole org).
        #[arg(long)]
        project: Option<String>,
        /// Config of each binding, a JSON object (checked against each export's config_schema).
        #[arg(long, value_name = "JSON")]
        config: Option<String>,
        /// A secret slot: SLOT=secret://ORG/NAME (repeat for several).
        #[arg(long = "secret", value_name = "SLOT=REF")]
        secrets: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Sign an index document (format plugd-marketplace/1) with an Ed25519 key.
    Sign {
        /// The index document; rewritten signed unless --out is given.
        index: PathBuf,
        /// The private key (PKCS#8 PEM, as `plugd plugin keygen` writes it).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// Where to write the signed index (default: over INDEX).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

/// Runs `plugd marketplace …` for the workspace `dir`.
pub async fn run(dir: &Path, cmd: &MarketplaceCmd) -> Result<()> {
    if let MarketplaceCmd::Sign { index, key, out } = cmd {
        return sign(index, key, out.as_deref());
    }
    let config = PlugdConfig::load(dir)?;
    match cmd {
        MarketplaceCmd::List { json } => {
            let index = load(config.marketplace.as_ref(), &config.signing)
                .await
                .map_err(api)?;
            let view = catalog_view(&config.signing, &index);
            if *json {
                println!("{}", serde_json::to_string_pretty(&view)?);
                return Ok(());
            }
            println!(
                "{} ({}; signed by {}, key {}; {} mode)",
                index.catalog.name, index.source, index.signed_by, index.key_id, index.mode
            );
            println!(
                "{:<24} {:<28} {:<16} {:<10} {:<10} INSTALL",
                "ENTRY", "NAME", "PUBLISHER", "REVIEW", "SIGNED"
            );
            for e in view["entries"].as_array().into_iter().flatten() {
                println!(
                    "{:<24} {:<28} {:<16} {:<10} {:<10} {}",
                    text(&e["id"]),
                    text(&e["name"]),
                    text(&e["publisher"]),
                    text(&e["review"]),
                    if e["signed_by"].is_string() {
                        "yes"
                    } else {
                        "no"
                    },
                    install_word(e)
                );
            }
        }
        MarketplaceCmd::Show { entry, json } => {
            let index = load(config.marketplace.as_ref(), &config.signing)
                .await
                .map_err(api)?;
            let e = entry_view(
                &config.signing,
                index.mode,
                find(&index, entry).map_err(api)?,
            );
            if *json {
                println!("{}", serde_json::to_string_pretty(&e)?);
            } else {
                show(&e);
            }
        }
        MarketplaceCmd::Install {
            entry,
            org,
            project,
            config: cfg,
            secrets,
            json,
        } => {
            let state = dir.join(".plugd");
            let store = crate::state::open(dir).await?;
            let by = plugd_store::users::user_name(rustix::process::geteuid().as_raw());
            let req = InstallRequest {
                org_id: org.clone(),
                project_id: project.clone(),
                config: cfg
                    .as_deref()
                    .map(|t| {
                        serde_json::from_str(t)
                            .with_context(|| format!("--config {t:?} is not JSON"))
                    })
                    .transpose()?,
                secrets: if secrets.is_empty() {
                    None
                } else {
                    Some(
                        secrets
                            .iter()
                            .map(|p| {
                                p.split_once('=')
                                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                                    .with_context(|| {
                                        format!("--secret {p:?}: write SLOT=secret://ORG/NAME")
                                    })
                            })
                            .collect::<Result<_>>()?,
                    )
                },
            };
            let installer = Installer {
                store: &*store,
                state_dir: &state,
                marketplace: config.marketplace.as_ref(),
                signing: &config.signing,
                by: &by,
                tenant: None,
            };
            let done = install(&installer, entry, req).await.map_err(api)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&done.to_json())?);
                return Ok(());
            }
            let p = &done.package;
            println!(
                "{} {} {} ({}); signature: {}",
                if done.package_new {
                    "installed"
                } else {
                    "already installed:"
                },
                p.package_id,
                p.version,
                p.digest,
                p.signature.summary()
            );
            for (b, created) in &done.bindings {
                println!(
                    "{} binding {} of {} in {}",
                    if *created { "created" } else { "updated" },
                    b.binding_id,
                    b.export_id,
                    b.scope
                );
            }
        }
        MarketplaceCmd::Sign { .. } => unreachable!("handled above"),
    }
    Ok(())
}

/// The message of a service's error, as `plugd` prints it.
fn api(e: plugd_control::ServiceError) -> anyhow::Error {
    anyhow::anyhow!("{}", e.message)
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

fn install_word(e: &Value) -> String {
    match e["installability"]["state"].as_str() {
        Some("installable") => "installable".into(),
        Some("contract_ready") => "contract-ready, not installable".into(),
        _ => format!(
            "refused: {}",
            e["installability"]["reason"].as_str().unwrap_or("?")
        ),
    }
}

fn show(e: &Value) {
    println!("entry:        {}", text(&e["id"]));
    println!("name:         {}", text(&e["name"]));
    println!("publisher:    {}", text(&e["publisher"]));
    if let Some(d) = e["description"].as_str() {
        println!("description:  {d}");
    }
    println!("review:       {}", text(&e["review"]));
    println!("signature:    {}", text(&e["signature"]));
    println!("policy:       {}", text(&e["install_policy"]));
    println!("oci:          {}", text(&e["oci"]));
    if let Some(c) = e["contract"].as_str() {
        println!("contract:     {c}");
    }
    for s in e["sources"].as_array().into_iter().flatten() {
        println!("source:       {}", text(s));
    }
    println!("install:      {}", install_word(e));
    println!("exports:");
    for x in e["exports"].as_array().into_iter().flatten() {
        println!("  {:<24} {}", text(&x["id"]), text(&x["kind"]));
    }
}

fn sign(index: &Path, key: &Path, out: Option<&Path>) -> Result<()> {
    let key = keys::read_private_key(key).map_err(anyhow::Error::msg)?;
    let mut bytes = Vec::new();
    std::fs::File::open(index)
        .and_then(|f| f.take(MAX_INDEX_BYTES + 1).read_to_end(&mut bytes))
        .with_context(|| format!("index {}", index.display()))?;
    if bytes.len() as u64 > MAX_INDEX_BYTES {
        bail!(
            "index {} is over the {MAX_INDEX_BYTES}-byte limit; split the catalog",
            index.display()
        );
    }
    let doc = plugd_runtime::marketplace::sign(&bytes, &key, &plugd_store::now_rfc3339())
        .map_err(|e| anyhow::anyhow!("cannot sign {}: {e}", index.display()))?;
    let target = out.unwrap_or(index);
    let mut text = serde_json::to_string_pretty(&doc)?;
    text.push('\n');
    let tmp = target.with_extension("signing.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, target))
        .with_context(|| format!("cannot write {}", target.display()))?;
    let public = key.verifying_key();
    println!(
        "signed {} ({} entries) with key {}; wrote {}",
        index.display(),
        doc.index["entries"].as_array().map_or(0, Vec::len),
        keys::key_id(&public),
        target.display()
    );
    println!(
        "trust it in plugd.yaml: trusted_publishers: [{{name: NAME, public_key: \"{}\"}}]",
        keys::public_key_string(&public)
    );
    Ok(())
}
