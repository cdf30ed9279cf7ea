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

/// The per-directory manifest forms, in the order they are looked for.
pub const MANIFEST_FILES: &[&str] = &[
    NATIVE_MANIFEST,
    plugd_manifest::salmex::SALMEX_MANIFEST_FILE,
    plugd_manifest::vai::VAI_MANIFEST_FILE,
];

type EntryLoader = fn(
    &Path,
    &LoadOptions,
) -> Result<
    Vec<Result<PluginSpec, plugd_manifest::EntryError>>,
    plugd_manifest::ManifestError,
>;

/// The workspace files that declare several plugins each.
const ENTRY_FILES: [(&str, EntryLoader); 2] = [
    (
        plugd_manifest::microapp::EXTENSIONS_FILE,
        plugd_manifest::microapp::load_extensions,
    ),
    (plugd_manifest::mcp::MCP_FILE, plugd_manifest::mcp::load_mcp),
];

/// A cheap fingerprint of what [`discover`] reads: each `.plugins/` entry
/// with its directory's modification time and the size and modification
/// time of each manifest file in it, and the same for `extensions.yaml` and
/// `.mcp.json`. Serve rescans when it changes. The manifests are stamped
/// one by one because the clock the kernel stamps files with is coarse: a
/// directory created and given its manifest within one tick keeps the
/// modification time a scan in between saw, but not the manifest's size.
pub fn fingerprint(workspace: &Path) -> Vec<(String, Option<std::time::SystemTime>, u64)> {
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| (m.modified().ok(), m.len()))
            .unwrap_or((None, 0))
    };
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(workspace.join(".plugins")) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let (t, _) = stamp(&e.path());
            out.push((name.clone(), t, 0));
            for manifest in MANIFEST_FILES {
                let (t, len) = stamp(&e.path().join(manifest));
                out.push((format!("{name}/{manifest}"), t, len));
            }
        }
    }
    out.sort();
    for (file, _) in ENTRY_FILES {
        let (t, len) = stamp(&workspace.join(file));
        out.push((file.to_owned(), t, len));
    }
    out
}

/// Scans `DIR/.plugins/` (one plugin per directory: `nexo-plugin.toml`,
/// `plugin.json` or `vai-plugin.toml`), the workspace files
/// `extensions.yaml` (microapps) and `.mcp.json` (MCP servers), and the
/// pins taken from the cluster for plugins approved on another node.
pub fn discover(workspace: &Path, opts: &LoadOptions) -> Discovery {
    let mut found = Discovery::default();
    let mut by_id: BTreeMap<String, Vec<Arc<PluginSpec>>> = BTreeMap::new();
    for dir in plugin_dirs(workspace, &mut found.broken) {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match load_dir(&dir, opts) {
            Ok(spec) => by_id
                .entry(spec.id.clone())
                .or_default()
                .push(Arc::new(spec)),
            Err(error) => found.broken.push(BrokenPlugin { name, dir, error }),
        }
    }
    for (file, load) in ENTRY_FILES {
        match load(workspace, opts) {
            Ok(entries) => {
                for entry in entries {
                    match entry {
                        Ok(spec) => by_id
                            .entry(spec.id.clone())
                            .or_default()
                            .push(Arc::new(spec)),
                        Err(e) => found.broken.push(BrokenPlugin {
                            name: e.name,
                            dir: workspace.join(file),
                            error: e.error.to_string(),
                        }),
                    }
                }
            }
            Err(e) => found.broken.push(BrokenPlugin {
                name: file.to_owned(),
                dir: workspace.join(file),
                error: e.to_string(),
            }),
        }
    }
    // Plugins this node has no copy of, taken from the cluster's pins
    // (`cluster_pins`): loaded from their read-only pin; a copy in the
    // workspace wins.
    let pins = plugd_store::pin::Pins::new(&workspace.join(".plugd"));
    for (marker, pin) in pins.adopted() {
        match load_dir(&pin, opts) {
            Ok(spec) => {
                by_id
                    .entry(spec.id.clone())
                    .or_insert_with(|| vec![Arc::new(spec)]);
            }
            Err(error) => found.broken.push(BrokenPlugin {
                name: marker
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                dir: pin,
                error: format!("taken from the cluster, but {error}"),
            }),
        }
    }
    for (id, mut specs) in by_id {
        if specs.len() == 1 {
            found.plugins.insert(id, specs.pop().expect("one spec"));
            continue;
        }
        let places: Vec<String> = specs
            .iter()
            .map(|s| s.manifest_path.display().to_string())
            .collect();
        for spec in specs {
            found.broken.push(BrokenPlugin {
                name: id.clone(),
                dir: spec.dir.clone(),
                error: format!(
                    "plugin id {id:?} is declared more than once ({}); ids must be unique",
                    places.join(", ")
                ),
            });
        }
    }
    found
}

/// The directories under `DIR/.plugins/`, sorted, at most [`MAX_PLUGINS`].
fn plugin_dirs(workspace: &Path, broken: &mut Vec<BrokenPlugin>) -> Vec<PathBuf> {
    let root = workspace.join(".plugins");
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            broken.push(BrokenPlugin {
                name: ".plugins".into(),
                dir: root.clone(),
                error: format!("cannot read {}: {e}", root.display()),
            });
            return Vec::new();
        }
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    if dirs.len() > MAX_PLUGINS {
        broken.push(BrokenPlugin {
            name: ".plugins".into(),
            dir: root,
            error: format!(
                "{} plugin directories, more than the {MAX_PLUGINS} plugd scans; only the first {MAX_PLUGINS} were loaded",
                dirs.len()
            ),
        });
        dirs.truncate(MAX_PLUGINS);
    }
    dirs
}

/// Loads the one manifest in a plugin directory.
fn load_dir(dir: &Path, opts: &LoadOptions) -> Result<PluginSpec, String> {
    let present: Vec<&str> = MANIFEST_FILES
        .iter()
        .copied()
        .filter(|f| dir.join(f).exists())
        .collect();
    match present.as_slice() {
        [] => Err(format!(
            "no plugin manifest in {} (expected one of {})",
            dir.display(),
            MANIFEST_FILES.join(", ")
        )),
        [one] => {
            let path = dir.join(one);
            let loaded = if *one == NATIVE_MANIFEST {
                plugd_manifest::load_native(&path, opts)
            } else if *one == plugd_manifest::salmex::SALMEX_MANIFEST_FILE {
                plugd_manifest::salmex::load_salmex(&path, opts)
            } else {
                plugd_manifest::vai::load_vai(&path, opts)
            };
            loaded.map_err(|e| e.to_string())
        }
        several => Err(format!(
            "{} holds several manifests ({}); keep exactly one",
            dir.display(),
            several.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest written after a scan, within the same tick of the file
    /// clock (here: every modification time set back by hand), still
    /// changes the fingerprint through its size.
    #[test]
    fn a_manifest_written_in_the_same_tick_as_its_directory_changes_the_fingerprint() {
        let ws = tempfile::tempdir().unwrap();
        let dir = ws.path().join(".plugins/late");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("main.py"), "").unwrap();
        let manifest = dir.join(plugd_manifest::salmex::SALMEX_MANIFEST_FILE);
        std::fs::write(&manifest, "").unwrap();
        let before = fingerprint(ws.path());
        let stamp = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
        let (dir_t, file_t) = (stamp(&dir), stamp(&manifest));
        std::fs::write(&manifest, r#"{"name":"late"}"#).unwrap();
        let set = |p: &Path, t| {
            std::fs::File::options()
                .write(true)
                .open(p)
                .or_else(|_| std::fs::File::open(p))
                .unwrap()
                .set_modified(t)
                .unwrap()
        };
        set(&manifest, file_t);
        set(&dir, dir_t);
        assert_eq!(stamp(&dir), dir_t);
        assert_ne!(fingerprint(ws.path()), before);
    }
}
