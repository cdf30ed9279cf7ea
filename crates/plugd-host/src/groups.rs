//! Execution classes of a VAI package: which process serves each export.
//!
//! A VAI package runs as several supervised processes, its *process groups*
//! (seed 003, "Execution Classes"):
//!
//! * `worker`: one long-lived process shared by every `worker` export (and
//!   by the `inline` exports of a package the operator trusts); its sandbox
//!   is the union of those exports' granted permissions alone. It is also
//!   the process the package's handshake check (approval, `plugd plugin
//!   start`) starts.
//! * `isolated:<export>`: one long-lived process per `isolated` export (and
//!   per `inline` export of an untrusted package), sandboxed with that
//!   export's granted permissions only.
//! * an `isolated` export granted `filesystem = "scratch"` runs in a
//!   short-lived process per invocation (the seed's "isolated execution
//!   plane"): its sandbox makes only that invocation's scratch directory
//!   writable, and the process is stopped when the invocation ends.
//!
//! The [`GroupPlan`] is computed by the host's [`crate::Observer`] (the
//! operator's trust and grants decide it) and cached by the package's
//! [`crate::Supervised`] until its next reset; the containment of every
//! start is computed again from the role its spec carries
//! ([`plugd_manifest::vai::ProcessRole`]), so a stale plan can only narrow
//! what a process gets, never widen it.

use plugd_manifest::PluginSpec;
use plugd_manifest::vai::{
    ExecutionClass, FilesystemPermission, ISOLATED_PREFIX, VaiExport, WORKER_GROUP,
};
use serde::Serialize;

/// Short-lived processes of one per-invocation export running at once when
/// the export declares no `max_concurrency` (`PLUGD_ISOLATED_MAX_PROCS`);
/// further invocations wait for one to end, within their deadline.
pub const DEFAULT_PER_INVOCATION_PROCS: usize = 16;

/// Where one export runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// Export id.
    pub export: String,
    /// Its kind (`tool`, `hook`, `compactor`, `harness`).
    pub kind: &'static str,
    /// `execution_class` as the manifest asks (or the kind's default).
    pub requested: ExecutionClass,
    /// The class plugd runs it with.
    pub effective: ExecutionClass,
    /// Its process group: `worker` or `isolated:<export>`.
    pub group: String,
    /// One process per invocation (isolated, scratch granted).
    pub per_invocation: bool,
    /// Why the effective class differs from the requested one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Which process group serves each export of a package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct GroupPlan {
    /// Whether the operator trusts the package (`inline` honoured).
    pub trusted: bool,
    /// One placement per export, in manifest order.
    pub exports: Vec<Placement>,
}

/// The group name of isolated export `export`.
pub fn isolated_group(export: &str) -> String {
    format!("{ISOLATED_PREFIX}{export}")
}

fn class_name(c: ExecutionClass) -> &'static str {
    match c {
        ExecutionClass::Inline => "inline",
        ExecutionClass::Worker => "worker",
        ExecutionClass::Isolated => "isolated",
    }
}

impl GroupPlan {
    /// The plan of `spec`: `trusted` says whether the operator trusts the
    /// package; `scratch` whether an export is granted `scratch`. Empty for
    /// a spec that is not a VAI package.
    pub fn compute(
        spec: &PluginSpec,
        trusted: bool,
        scratch: &dyn Fn(&VaiExport) -> bool,
    ) -> GroupPlan {
        let Some(v) = &spec.vai else {
            return GroupPlan::default();
        };
        let exports = v
            .exports
            .iter()
            .map(|e| {
                let requested = e.execution_class;
                let (effective, note) = match requested {
                    ExecutionClass::Inline if trusted => (ExecutionClass::Inline, None),
                    ExecutionClass::Inline => (
                        ExecutionClass::Isolated,
                        Some(format!(
                            "inline needs an operator's trust (plugd.yaml sandbox.plugins.{}.trusted: true); it runs isolated",
                            spec.id
                        )),
                    ),
                    other => (other, None),
                };
                let (group, per_invocation) = match effective {
                    ExecutionClass::Isolated => (isolated_group(&e.id), scratch(e)),
                    _ => (WORKER_GROUP.to_owned(), false),
                };
                Placement {
                    export: e.id.clone(),
                    kind: e.kind.as_str(),
                    requested,
                    effective,
                    group,
                    per_invocation,
                    note,
                }
            })
            .collect();
        GroupPlan { trusted, exports }
    }

    /// The plan from the manifest alone: nothing trusted, the requested
    /// filesystem permission taken as granted (what a host without an
    /// operator policy runs).
    pub fn from_manifest(spec: &PluginSpec) -> GroupPlan {
        GroupPlan::compute(spec, false, &|e| {
            e.permissions.filesystem == FilesystemPermission::Scratch
        })
    }

    /// Where `export` runs.
    pub fn placement(&self, export: &str) -> Option<&Placement> {
        self.exports.iter().find(|p| p.export == export)
    }

    /// The exports of group `group`.
    pub fn members(&self, group: &str) -> Vec<&Placement> {
        self.exports.iter().filter(|p| p.group == group).collect()
    }

    /// Every group, `worker` first, then the isolated ones in manifest
    /// order, each with its exports and whether it runs per invocation.
    pub fn groups(&self) -> Vec<(String, Vec<String>, bool)> {
        let mut out: Vec<(String, Vec<String>, bool)> =
            vec![(WORKER_GROUP.to_owned(), Vec::new(), false)];
        for p in &self.exports {
            match out.iter_mut().find(|(g, _, _)| *g == p.group) {
                Some((_, exports, _)) => exports.push(p.export.clone()),
                None => out.push((p.group.clone(), vec![p.export.clone()], p.per_invocation)),
            }
        }
        out
    }

    /// One warning per export whose class plugd does not honour, for the log.
    pub fn notes(&self) -> impl Iterator<Item = String> + '_ {
        self.exports.iter().filter_map(|p| {
            p.note.as_ref().map(|n| {
                format!(
                    "export {:?} asks for execution class {}: {n}",
                    p.export,
                    class_name(p.requested)
                )
            })
        })
    }
}

/// The name of a class as the manifest writes it.
pub fn class_str(c: ExecutionClass) -> &'static str {
    class_name(c)
}

/// One process (group) of a package, as `plugd plugin show` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessInfo {
    /// `worker`, `isolated:<export>`, or the plugin's only process (`main`)
    /// for a plugin that is not a VAI package.
    pub group: String,
    /// The exports it serves.
    pub exports: Vec<String>,
    /// Started for each invocation and stopped after it.
    pub per_invocation: bool,
    /// `idle`, `running`, `backoff`, `failed`, … (for a per-invocation
    /// group: `running` while an invocation runs, else `idle`).
    pub state: String,
    /// The pids running now (one for a long-lived group; one per running
    /// invocation otherwise).
    pub pids: Vec<u32>,
    /// Restarts of this group after a crash or a failed start.
    pub restarts: u64,
    /// Why it failed or is backing off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A valid per-invocation directory name: the invocation id when it is a
/// plain name, else `None` (the caller makes a fresh one).
pub fn safe_invocation_id(id: &str) -> Option<&str> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    ok.then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugd_manifest::vai::{ExportKind, VaiSpec};

    fn export(id: &str, kind: ExportKind, class: ExecutionClass, scratch: bool) -> VaiExport {
        let mut permissions = plugd_manifest::vai::Permissions::default();
        if scratch {
            permissions.filesystem = FilesystemPermission::Scratch;
        }
        VaiExport {
            id: id.into(),
            kind,
            display_name: None,
            description: None,
            execution_class: class,
            default_timeout: None,
            max_concurrency: None,
            config_schema: None,
            permissions,
            tool: None,
            hook: None,
            compactor: None,
            harness: None,
        }
    }

    fn spec() -> PluginSpec {
        PluginSpec {
            id: "acme/kit".into(),
            vai: Some(VaiSpec {
                exports: vec![
                    export("t", ExportKind::Tool, ExecutionClass::Isolated, false),
                    export("s", ExportKind::Tool, ExecutionClass::Isolated, true),
                    export("h", ExportKind::Hook, ExecutionClass::Worker, true),
                    export("i", ExportKind::Tool, ExecutionClass::Inline, false),
                ],
                ..VaiSpec::default()
            }),
            ..PluginSpec::base()
        }
    }

    #[test]
    fn classes_become_groups_and_inline_needs_trust() {
        let plan = GroupPlan::from_manifest(&spec());
        let group = |e: &str| plan.placement(e).unwrap().group.clone();
        assert_eq!(
            [group("t"), group("s"), group("h"), group("i")],
            ["isolated:t", "isolated:s", "worker", "isolated:i"]
        );
        assert!(plan.placement("s").unwrap().per_invocation);
        assert!(!plan.placement("h").unwrap().per_invocation, "worker");
        assert_eq!(
            plan.placement("i").unwrap().effective,
            ExecutionClass::Isolated
        );
        assert_eq!(plan.notes().count(), 1);
        assert_eq!(
            plan.groups(),
            vec![
                ("worker".to_owned(), vec!["h".to_owned()], false),
                ("isolated:t".to_owned(), vec!["t".to_owned()], false),
                ("isolated:s".to_owned(), vec!["s".to_owned()], true),
                ("isolated:i".to_owned(), vec!["i".to_owned()], false),
            ]
        );
        let trusted = GroupPlan::compute(&spec(), true, &|_| false);
        let i = trusted.placement("i").unwrap();
        assert_eq!(
            (i.effective, i.group.as_str()),
            (ExecutionClass::Inline, "worker")
        );
        assert_eq!(trusted.notes().count(), 0);
        assert!(
            !trusted.placement("s").unwrap().per_invocation,
            "scratch not granted"
        );
        assert_eq!(
            GroupPlan::from_manifest(&PluginSpec::base()),
            GroupPlan::default()
        );
    }

    #[test]
    fn invocation_ids_that_are_not_plain_names_are_refused() {
        assert_eq!(safe_invocation_id("inv_12ab"), Some("inv_12ab"));
        for bad in ["", "..", "../x", "a/b", ".hidden", "a\0b", &"x".repeat(129)] {
            assert_eq!(safe_invocation_id(bad), None, "{bad:?}");
        }
    }
}
