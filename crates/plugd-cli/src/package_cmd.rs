//! `plugd package push|pull|list|show|restart`: plugin packages as OCI
//! artifacts, installed read-only under `.plugd/packages/` and recorded in
//! the state database (so a running serve lists them at once); `restart`
//! clears a failed package process in the running serve.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use plugd_control::{Package, PackageSelector};
use plugd_packages::{OciRef, RegistryOptions};
use plugd_store::StateStore;

/// How to reach the registry.
#[derive(Args, Debug)]
pub struct RegistryFlags {
    /// Use plain HTTP with a registry that is not on loopback. Registries on
    /// 127.0.0.0/8 or localhost always get plain HTTP; every other one gets
    /// HTTPS unless this is given (packages then cross the network in clear).
    #[arg(long)]
    insecure: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `plugd package …`.
#[derive(Subcommand, Debug)]
pub enum PackageCmd {
    /// Push a package directory (a plugin manifest at its root) to a registry.
    ///
    /// Refuses .env files and private keys in it, symlinks and special
    /// files, and more than 10,000 files or 256 MiB.
    Push {
        /// The package directory (vai-plugin.toml or nexo-plugin.toml at its root).
        dir: PathBuf,
        /// Where: oci://HOST[:PORT]/REPO:TAG.
        reference: String,
        #[command(flatten)]
        flags: RegistryFlags,
    },
    /// Pull a package and install it read-only, pinned by its digest.
    ///
    /// A digest installed already changes nothing; a tag that moved installs
    /// the new digest beside the old version.
    Pull {
        /// oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:DIGEST.
        reference: String,
        #[command(flatten)]
        flags: RegistryFlags,
    },
    /// Install a package from a directory or a tar of one, without a
    /// registry (as `POST /v1/plugin-packages` with an application/x-tar
    /// body does).
    ///
    /// It gets the digest `plugd package push` would give the same
    /// directory, and passes the checks a pull passes (bounds, secrets,
    /// signature per the trust policy); its source reads `upload:sha256:…`.
    Install {
        /// The package directory, or a .tar of it (the manifest at its root).
        path: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List installed packages.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Clear the failed state and restart budget of an installed package's
    /// process in the running plugd serve; its next call starts it again,
    /// after the check that its files are as installed.
    ///
    /// Without a running serve there is no process to clear: every process
    /// starts afresh with the next serve.
    Restart {
        /// sha256:DIGEST, PUBLISHER/NAME@VERSION, or PUBLISHER/NAME (its highest version).
        id: String,
    },
    /// Show one installed package.
    Show {
        /// sha256:DIGEST, PUBLISHER/NAME@VERSION, or PUBLISHER/NAME (its highest version).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `plugd package …` for the workspace `dir`.
pub async fn run(dir: &Path, cmd: &PackageCmd) -> Result<()> {
    let state = dir.join(".plugd");
    match cmd {
        PackageCmd::Push {
            dir: pkg,
            reference,
            flags,
        } => {
            let target = OciRef::parse(reference)?;
            let opts = RegistryOptions {
                insecure: flags.insecure,
                ..RegistryOptions::default()
            };
            let pushed = plugd_packages::push(pkg, &target, &opts).await?;
            if flags.json {
                println!("{}", serde_json::to_string_pretty(&pushed)?);
            } else {
                println!(
                    "pushed {} {} to {} ({}, {} files, {} bytes)",
                    pushed.package_id,
                    pushed.version,
                    pushed.reference,
                    pushed.digest,
                    pushed.files,
                    pushed.size
                );
            }
        }
        PackageCmd::Pull { reference, flags } => {
            let source = OciRef::parse(reference)?;
            let opts = RegistryOptions {
                insecure: flags.insecure,
                ..RegistryOptions::default()
            };
            let (store, by, at, verify) = installer(dir).await?;
            let req = plugd_packages::Request {
                source: &source,
                opts: &opts,
                by: &by,
                at: &at,
                verify: &*verify,
            };
            let done = plugd_packages::install(&*store, &state, &req).await?;
            report(&done, flags.json)?;
        }
        PackageCmd::Install { path, json } => {
            let (store, by, at, verify) = installer(dir).await?;
            let how = plugd_packages::Local {
                limits: plugd_packages::Limits::default(),
                by: &by,
                at: &at,
                verify: &*verify,
            };
            let done = if path.is_dir() {
                plugd_packages::install_dir(&*store, &state, path, &how).await?
            } else {
                let data = std::fs::read(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                plugd_packages::install_archive(&*store, &state, data, &how).await?
            };
            report(&done, *json)?;
        }
        PackageCmd::List { json } => {
            let store = crate::state::open(dir).await?;
            let all = store.packages().await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else if all.is_empty() {
                println!("no packages installed; install one with `plugd package pull oci://…`");
            } else {
                println!(
                    "{:<32} {:<12} {:<19} {:<8} {:<11} INSTALLED",
                    "PACKAGE", "VERSION", "DIGEST", "EXPORTS", "SIGNATURE"
                );
                for p in &all {
                    println!(
                        "{:<32} {:<12} {:<19} {:<8} {:<11} {}",
                        p.package_id,
                        p.version,
                        &p.digest.as_str()[..19],
                        p.exports.len(),
                        p.signature.word(),
                        p.installed_at
                    );
                }
            }
        }
        PackageCmd::Restart { id } => {
            let store = crate::state::open(dir).await?;
            let sel = PackageSelector::parse(id)?;
            let Some(p) = store.find_package(&sel).await? else {
                bail!("no installed package {id:?}; `plugd package list` shows what is installed");
            };
            drop(store);
            let Some(serve) = crate::remote::Remote::find(dir).await else {
                println!(
                    "plugd serve is not running here: {} {} ({}) has no process to clear; it starts at its first call under the next serve",
                    p.package_id, p.version, p.digest
                );
                return Ok(());
            };
            let v = serve
                .post(
                    &format!("/v1/plugin-packages/{}:restart", p.digest),
                    &serde_json::json!({}),
                    format!("package restart {id}"),
                )
                .await?;
            let via = format!("(via plugd serve pid {})", serve.pid());
            if v["had_process"].as_bool().unwrap_or(false) {
                println!(
                    "restarted {} {} ({}): failure cleared, restart budget reset; its next call starts it {via}",
                    p.package_id, p.version, p.digest
                );
            } else {
                println!(
                    "{} {} ({}) has no process yet; it starts at its next call {via}",
                    p.package_id, p.version, p.digest
                );
            }
        }
        PackageCmd::Show { id, json } => {
            let store = crate::state::open(dir).await?;
            let sel = PackageSelector::parse(id)?;
            let Some(p) = store.find_package(&sel).await? else {
                bail!("no installed package {id:?}; `plugd package list` shows what is installed");
            };
            // Where each export runs and with which sandbox, as a call
            // through a binding would start it in this workspace.
            let perms = plugd_runtime::bindings_rt::package_permissions(&p, dir);
            if *json {
                let mut v = serde_json::to_value(&p)?;
                v["permissions"] = match &perms {
                    Ok(r) => serde_json::to_value(r)?,
                    Err(e) => serde_json::json!({"error": e}),
                };
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                show(&p);
                match perms {
                    Ok(r) => {
                        for line in r.text_lines() {
                            println!("{line}");
                        }
                    }
                    Err(e) => println!("permissions: cannot be computed: {e}"),
                }
            }
        }
    }
    Ok(())
}

fn show(p: &Package) {
    println!("package:      {}", p.package_id);
    println!("version:      {}", p.version);
    println!("digest:       {}", p.digest);
    println!("source:       {}", p.source);
    println!("installed:    {} by {}", p.installed_at, p.installed_by);
    println!("path:         {}", p.path.display());
    println!("manifest:     {}", p.manifest);
    println!("files:        {} ({} bytes)", p.files, p.size);
    println!("signature:    {}", p.signature.summary());
    println!("exports:");
    for e in &p.exports {
        let class = e.execution_class.as_deref().unwrap_or("-");
        println!("  {:<24} {:<10} {class}", e.id, e.kind);
    }
}

/// Prints what a pull or an install did.
fn report(done: &plugd_packages::Installed, json: bool) -> Result<()> {
    let p = &done.package;
    if json {
        let mut v = serde_json::to_value(p)?;
        v["new"] = done.new.into();
        v["restored"] = done.restored.into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if done.restored {
        println!(
            "{} {} ({}) is installed already; its files had changed and are restored in {}",
            p.package_id,
            p.version,
            p.digest,
            p.path.display()
        );
    } else if done.new {
        println!(
            "installed {} {} ({}) in {}; signature: {}",
            p.package_id,
            p.version,
            p.digest,
            p.path.display(),
            p.signature.summary()
        );
    } else {
        println!(
            "{} {} ({}) is installed already; nothing changed",
            p.package_id, p.version, p.digest
        );
    }
    Ok(())
}

/// What a pull and an install share: the store, who installs (this Unix
/// user), when, and plugd.yaml's trust policy as the package verifier (as
/// for `.plugins/`).
async fn installer(
    dir: &Path,
) -> Result<(
    std::sync::Arc<dyn StateStore>,
    String,
    String,
    Box<plugd_packages::SignatureCheck>,
)> {
    let store = crate::state::open(dir).await?;
    let by = plugd_store::users::user_name(rustix::process::geteuid().as_raw());
    let policy = plugd_runtime::signing::SigningPolicy::load(dir)?;
    let verify = plugd_runtime::signing::package_verifier(policy);
    Ok((store, by, plugd_store::now_rfc3339(), Box::new(verify)))
}
