//! `plugd plugin keygen | sign | verify`: Ed25519 keys and plugin signatures
//! (`marketplace.signature.json`, see docs/signatures.md). They work on a
//! directory, not on the runtime, so they run before the workspace opens.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use plugd_runtime::signing::{SigningPolicy, format, keys};
use plugd_store::digest::DigestLimits;

/// The signing subcommands of `plugd plugin`.
#[derive(Subcommand, Debug)]
pub enum SigningCmd {
    /// Create an Ed25519 signing key (PKCS#8 PEM, mode 0600) and print its public key.
    Keygen {
        /// Where to write the private key; an existing file is never overwritten.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Sign every file of a plugin directory: writes DIR/marketplace.signature.json.
    Sign {
        /// The plugin directory.
        dir: PathBuf,
        /// The private key (PKCS#8 PEM, as `plugd plugin keygen` or `openssl genpkey -algorithm ed25519` writes it).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
    },
    /// Verify a plugin directory's signature against its files and the workspace's trusted publishers.
    Verify {
        /// The plugin directory.
        dir: PathBuf,
    },
}

/// Runs one signing command; `workspace` is where `plugd.yaml` (the trusted
/// publishers) is looked up for `verify`.
pub fn run(cmd: &SigningCmd, workspace: &Path) -> Result<()> {
    match cmd {
        SigningCmd::Keygen { out } => keygen(out),
        SigningCmd::Sign { dir, key } => sign(dir, key),
        SigningCmd::Verify { dir } => verify(dir, workspace),
    }
}

fn keygen(out: &Path) -> Result<()> {
    let key = keys::generate().map_err(anyhow::Error::msg)?;
    keys::write_private_key(out, &key).map_err(anyhow::Error::msg)?;
    let public = key.verifying_key();
    let public_key = keys::public_key_string(&public);
    println!("wrote private key {} (mode 0600)", out.display());
    println!("public key: {public_key}");
    println!("key id:     {}", keys::key_id(&public));
    println!("trust it in plugd.yaml:");
    println!("  trusted_publishers:");
    println!("    - {{name: NAME, public_key: \"{public_key}\"}}");
    Ok(())
}

fn plugin_dir(dir: &Path) -> Result<PathBuf> {
    let canonical = dir
        .canonicalize()
        .with_context(|| format!("plugin directory {}", dir.display()))?;
    if !canonical.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    Ok(canonical)
}

fn sign(dir: &Path, key: &Path) -> Result<()> {
    let dir = plugin_dir(dir)?;
    let key = keys::read_private_key(key).map_err(anyhow::Error::msg)?;
    let sig = format::sign(
        &dir,
        &key,
        &plugd_store::now_rfc3339(),
        &DigestLimits::default(),
    )
    .map_err(|e| anyhow::anyhow!("cannot sign {}: {e}", dir.display()))?;
    let path = format::write(&dir, &sig).map_err(anyhow::Error::msg)?;
    println!(
        "signed {} files of {} with key {} ({})",
        sig.files.len(),
        dir.display(),
        sig.key_id,
        sig.digest
    );
    println!("wrote {}", path.display());
    Ok(())
}

fn verify(dir: &Path, workspace: &Path) -> Result<()> {
    let dir = plugin_dir(dir)?;
    let policy = SigningPolicy::load(workspace)?;
    let ok = format::verify(&dir, &DigestLimits::default())
        .map_err(|e| anyhow::anyhow!("verification failed: {e}"))?;
    let files = ok.files;
    match policy.publisher(&ok.key_id) {
        Some(p) => println!(
            "OK: {} is signed by {} (key {}) at {}; {files} files unchanged",
            dir.display(),
            p.name,
            ok.key_id,
            ok.signed_at
        ),
        None if policy.require_signatures => bail!(
            "{} is signed by key {} ({}), which is not in plugd.yaml trusted_publishers; plugd will refuse it while require_signatures is true",
            dir.display(),
            ok.key_id,
            ok.public_key
        ),
        None => println!(
            "OK: {} is signed by key {} ({}) at {}; {files} files unchanged; the key is not in plugd.yaml trusted_publishers",
            dir.display(),
            ok.key_id,
            ok.public_key,
            ok.signed_at
        ),
    }
    Ok(())
}
