//! Deno permissions for Salmex plugins with `interpreter: "deno"`: the
//! `deno run` command line gets flags derived from the plugin's effective
//! permissions (what `plugd plugin show` reports), so Deno's own permission
//! system enforces them too, inside or outside a sandbox.
//!
//! - `--no-prompt`: a missing permission is an error, never a prompt;
//! - `--allow-read=`: the plugin directory (the approval's pin), its state
//!   directory and, under a sandbox, the sandbox's read-only and writable
//!   paths;
//! - `--allow-write=`: the state directory and, under a sandbox, its
//!   writable paths (`${state_dir}` …). Without a sandbox the effective
//!   paths are all of `/`; Deno then narrows them to the plugin's own
//!   directory (read) and state directory (read and write);
//! - `--allow-net` only when the effective network is `host`; otherwise
//!   also `--no-remote` (no module fetched at start);
//! - nothing else: no env, run, ffi or sys access.
//!
//! Deno splits its allow lists at `,`: a path containing one would widen
//! the grant, so such a start is refused.

use std::path::{Path, PathBuf};

use plugd_manifest::PluginSpec;

use crate::containment::EffectivePermissions;

/// `spec` with its `deno run` arguments carrying the permission flags, or
/// `None` when it is not a Deno plugin. `state_dir` is the plugin's state
/// directory.
pub fn with_permissions(
    spec: &PluginSpec,
    perms: &EffectivePermissions,
    state_dir: &Path,
) -> Result<Option<PluginSpec>, String> {
    let deno = spec
        .salmex
        .as_ref()
        .is_some_and(|s| s.interpreter.as_deref() == Some("deno"));
    if !deno || spec.command.args.first().map(String::as_str) != Some("run") {
        return Ok(None);
    }
    let list = |paths: &[PathBuf]| -> Result<String, String> {
        let mut out: Vec<String> = Vec::new();
        for p in paths {
            let s = p.to_string_lossy().into_owned();
            if s.contains(',') {
                return Err(format!(
                    "the Deno permission path {s:?} contains a comma, which Deno would read as two paths; rename it"
                ));
            }
            if !out.contains(&s) {
                out.push(s);
            }
        }
        Ok(out.join(","))
    };
    // Without a sandbox the effective paths are `/`: Deno then narrows the
    // files to the plugin's own directory and state directory.
    let sandboxed = perms.mechanism != "none";
    let mut writable = if sandboxed {
        perms.writable.clone()
    } else {
        Vec::new()
    };
    writable.push(state_dir.to_path_buf());
    let mut readable = vec![spec.dir.clone()];
    if sandboxed {
        readable.extend(perms.read_only.iter().cloned());
    }
    readable.extend(writable.iter().cloned());
    let mut args = vec![
        "run".to_owned(),
        "--no-prompt".to_owned(),
        format!("--allow-read={}", list(&readable)?),
        format!("--allow-write={}", list(&writable)?),
    ];
    if perms.network == "host" {
        args.push("--allow-net".to_owned());
    } else {
        args.push("--no-remote".to_owned());
    }
    args.extend(spec.command.args.iter().skip(1).cloned());
    let mut out = spec.clone();
    out.command.args = args;
    Ok(Some(out))
}
