//! Workspace discovery: which plugins live in `DIR/.plugins/`, and which of
//! them could not be read.
//!
//! A workspace is a directory. Plugins are discovered in
//! `DIR/.plugins/<name>/` (one per directory, by manifest file name); plugd's
//! own state lives in `DIR/.plugd/`. A plugin that fails to load is reported,
//! never fatal for the others.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use plugd_manifest::{LoadOptions, PluginSpec};

/// Manifest file of a native (nexo-contract) plugin.
pub const NATIVE_MANIFEST: &str = "nexo-plugin.toml";

/// Most plugin directories scanned in one workspace.
pub const MAX_PLUGINS: usize = 1000;

/// A plugin directory that could not be loaded.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BrokenPlugin {
    /// The directory name under `.plugins/` (stands in for the id).
    pub name: String,
    /// The directory.
    pub dir: PathBuf,
    /// Why it was refused.
    pub error: String,
}

/// What discovery found.
#[derive(Debug, Default)]
pub struct Discovery {
    /// Valid plugins by id.
    pub plugins: BTreeMap<String, Arc<PluginSpec>>,
    /// Directories that could not be loaded.
    pub broken: Vec<BrokenPlugin>,
}

/// Resolves the workspace directory: `--workspace DIR`, else
/// `PLUGD_WORKSPACE`, else the current directory.
pub fn resolve_dir(flag: Option<&Path>) -> std::io::Result<PathBuf> {
    let dir = match flag {
        Some(d) => d.to_path_buf(),
        None => match std::env::var_os("PLUGD_WORKSPACE") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => std::env::current_dir()?,
        },
    };
    dir.canonicalize()
        .map_err(|e| std::io::Error::new(e.kind(), format!("workspace {}: {e}", dir.display())))
}

/// Scans `DIR/.plugins/`.
pub fn discover(workspace: &Path, opts: &LoadOptions) -> Discovery {
    let mut found = Discovery::default();
    let root = workspace.join(".plugins");
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return found,
        Err(e) => {
            found.broken.push(BrokenPlugin {
                name: ".plugins".into(),
                dir: root.clone(),
                error: format!("cannot read {}: {e}", root.display()),
            });
            return found;
        }
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    if dirs.len() > MAX_PLUGINS {
        found.broken.push(BrokenPlugin {
            name: ".plugins".into(),
            dir: root.clone(),
            error: format!("{} plugin directories, more than the {MAX_PLUGINS} plugd scans; only the first {MAX_PLUGINS} were loaded", dirs.len()),
        });
        dirs.truncate(MAX_PLUGINS);
    }
    let mut by_id: BTreeMap<String, Vec<Arc<PluginSpec>>> = BTreeMap::new();
    for dir in dirs {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let manifest = dir.join(NATIVE_MANIFEST);
        if !manifest.exists() {
            found.broken.push(BrokenPlugin {
                name,
                dir: dir.clone(),
                error: format!(
                    "no plugin manifest in {} (expected {NATIVE_MANIFEST})",
                    dir.display()
                ),
            });
            continue;
        }
        match plugd_manifest::load_native(&manifest, opts) {
            Ok(spec) => by_id
                .entry(spec.id.clone())
                .or_default()
                .push(Arc::new(spec)),
            Err(e) => found.broken.push(BrokenPlugin {
                name,
                dir,
                error: e.to_string(),
            }),
        }
    }
    for (id, mut specs) in by_id {
        if specs.len() == 1 {
            found.plugins.insert(id, specs.pop().expect("one spec"));
            continue;
        }
        let dirs: Vec<String> = specs.iter().map(|s| s.dir.display().to_string()).collect();
        for spec in specs {
            found.broken.push(BrokenPlugin {
                name: id.clone(),
                dir: spec.dir.clone(),
                error: format!(
                    "plugin id {id:?} is claimed by several directories ({}); ids must be unique",
                    dirs.join(", ")
                ),
            });
        }
    }
    found
}
