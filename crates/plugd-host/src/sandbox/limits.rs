//! Resource limits of a plugin process: `setrlimit` in the child before `exec`.
//!
//! The limits hold for the whole process tree the plugin starts (they are
//! inherited across `fork` and `exec`; under bwrap they are set on bwrap and
//! inherited by the sandboxed program). cgroup v2 would also bound a tree's
//! total memory and process count; it is not used (not available on the
//! machines plugd is tested on).

use serde::Serialize;

/// Per-plugin resource limits (native `[plugin.limits]`, plugd.yaml
/// `limits:`). `None` leaves the limit inherited from plugd.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// `address_space_mb`: `RLIMIT_AS`, in MiB.
    pub address_space_mb: Option<u64>,
    /// `open_files`: `RLIMIT_NOFILE`.
    pub open_files: Option<u64>,
    /// `processes`: `RLIMIT_NPROC`. Linux counts every process of the real
    /// user and does not enforce it for root.
    pub processes: Option<u64>,
    /// `cpu_seconds`: `RLIMIT_CPU` (soft; `SIGXCPU` at the limit, `SIGKILL`
    /// one second later).
    pub cpu_seconds: Option<u64>,
}

impl Limits {
    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// Each limit over `other`'s, the tighter one where both set one.
    pub fn narrowed_by(&self, other: &Limits) -> Limits {
        fn min(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        Limits {
            address_space_mb: min(self.address_space_mb, other.address_space_mb),
            open_files: min(self.open_files, other.open_files),
            processes: min(self.processes, other.processes),
            cpu_seconds: min(self.cpu_seconds, other.cpu_seconds),
        }
    }

    /// The `setrlimit` calls, computed before the fork (no allocation after).
    pub(crate) fn plan(&self) -> [Option<(rustix::process::Resource, u64, u64)>; 4] {
        use rustix::process::Resource;
        [
            self.address_space_mb.map(|mb| {
                let b = mb.saturating_mul(1024 * 1024);
                (Resource::As, b, b)
            }),
            self.open_files.map(|n| (Resource::Nofile, n, n)),
            self.processes.map(|n| (Resource::Nproc, n, n)),
            // The hard limit one second later: SIGXCPU first, then SIGKILL
            // for a plugin that ignores it.
            self.cpu_seconds
                .map(|s| (Resource::Cpu, s, s.saturating_add(1))),
        ]
    }
}

/// Applies a [`Limits::plan`] in the child. Async-signal-safe: raw
/// `setrlimit` syscalls only.
pub(crate) fn apply(
    plan: &[Option<(rustix::process::Resource, u64, u64)>; 4],
) -> std::io::Result<()> {
    for (resource, soft, hard) in plan.iter().flatten() {
        rustix::process::setrlimit(
            *resource,
            rustix::process::Rlimit {
                current: Some(*soft),
                maximum: Some(*hard),
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowing_keeps_the_tighter_limit() {
        let manifest = Limits {
            cpu_seconds: Some(10),
            open_files: Some(64),
            ..Limits::default()
        };
        let operator = Limits {
            cpu_seconds: Some(2),
            address_space_mb: Some(512),
            ..Limits::default()
        };
        assert_eq!(
            manifest.narrowed_by(&operator),
            Limits {
                cpu_seconds: Some(2),
                open_files: Some(64),
                address_space_mb: Some(512),
                processes: None,
            }
        );
    }
}
