//! Sandbox path safety: the hard denylist and the canonical-path check for allowlist entries.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// Host paths a sandbox allowlist may never equal, contain or lie inside
/// (seed §2.2, "hard denylist"). Binding `/etc` or `/` would expose
/// `/etc/shadow`, so ancestors are refused too.
pub const SANDBOX_DENYLIST: &[&str] = &[
    "/etc/shadow",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/proc/sys",
    "/proc/kcore",
    "/proc/kallsyms",
    "/sys/firmware",
    "/sys/kernel",
    "/dev/mem",
    "/dev/kmem",
    "/dev/port",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/private/var/run/docker.sock",
    "/root",
    "/boot",
];

/// Most symlinks followed while resolving one path (as Linux `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// Why [`check_sandbox_path`] refused a path.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxPathError {
    /// The path is not absolute.
    #[error("{:?} is not an absolute path; use an absolute path", entry.display().to_string())]
    Relative {
        /// The path as given.
        entry: PathBuf,
    },
    /// Resolving the path followed too many symlinks (a loop).
    #[error("{:?} follows more than {MAX_SYMLINKS} symlinks (a loop?); bind the real path", entry.display().to_string())]
    SymlinkLoop {
        /// The path as given.
        entry: PathBuf,
    },
    /// The canonical path equals, contains or lies inside a denylisted path.
    #[error("{:?} (resolves to {:?}) touches the denylisted path {denied:?}; bind a narrower path", entry.display().to_string(), resolved.display().to_string())]
    Denylisted {
        /// The path as given.
        entry: PathBuf,
        /// Its canonical form.
        resolved: PathBuf,
        /// The [`SANDBOX_DENYLIST`] entry it touches.
        denied: &'static str,
    },
}

/// Checks one sandbox allowlist path against [`SANDBOX_DENYLIST`] and returns
/// its canonical form.
///
/// The path must be absolute. It is resolved with [`resolve_path`] (symlinks
/// followed, `..` resolved, missing tail components appended lexically) and
/// refused when the result equals a denylisted path, is an ancestor of one,
/// or lies inside one. Both the lexical and the canonical form of the path are
/// compared, against both the literal and the canonical form of each denied
/// path (e.g. `/var/run` is often a symlink to `/run`).
///
/// ```
/// use std::path::Path;
/// use plugd_manifest::check_sandbox_path;
/// assert!(check_sandbox_path(Path::new("/usr/share")).is_ok());
/// assert!(check_sandbox_path(Path::new("/usr/../etc/shadow")).is_err());
/// assert!(check_sandbox_path(Path::new("/")).is_err());
/// assert!(check_sandbox_path(Path::new("/root/.ssh")).is_err());
/// ```
pub fn check_sandbox_path(p: &Path) -> Result<PathBuf, SandboxPathError> {
    if !p.is_absolute() {
        return Err(SandboxPathError::Relative {
            entry: p.to_path_buf(),
        });
    }
    let resolved = resolve_path(p).ok_or_else(|| SandboxPathError::SymlinkLoop {
        entry: p.to_path_buf(),
    })?;
    let lexical = lexical_normalize(p);
    for &denied in SANDBOX_DENYLIST {
        let denied_path = Path::new(denied);
        let denied_forms = [
            Some(denied_path.to_path_buf()),
            resolve_path(denied_path).filter(|d| d != denied_path),
        ];
        for d in denied_forms.iter().flatten() {
            for candidate in [&resolved, &lexical] {
                if touches(candidate, d) {
                    return Err(SandboxPathError::Denylisted {
                        entry: p.to_path_buf(),
                        resolved: resolved.clone(),
                        denied,
                    });
                }
            }
        }
    }
    Ok(resolved)
}

/// True when `a` equals, contains, or lies inside `b` (component-wise).
fn touches(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Resolves an absolute path the way the kernel would, without requiring it
/// to exist: every existing symlink along the way is followed (also dangling
/// ones, whose target is then resolved the same way), `.` is dropped, `..`
/// pops the already-resolved prefix, and components that do not exist are
/// appended as they are.
///
/// For a fully existing path this equals [`std::fs::canonicalize`]. Returns
/// `None` after 40 symlinks (a loop). A relative `p` is
/// resolved against `/`.
pub fn resolve_path(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::from("/");
    let mut queue: VecDeque<OsString> = VecDeque::new();
    push_components(&mut queue, p, false);
    let mut links = 0usize;
    while let Some(c) = queue.pop_front() {
        if c == "." {
            continue;
        }
        if c == ".." {
            // `out` never contains a symlink, so its lexical parent is its
            // real parent.
            out.pop();
            continue;
        }
        let candidate = out.join(&c);
        match std::fs::symlink_metadata(&candidate) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return None;
                }
                let Ok(target) = std::fs::read_link(&candidate) else {
                    out = candidate;
                    continue;
                };
                if target.is_absolute() {
                    out = PathBuf::from("/");
                }
                push_components(&mut queue, &target, true);
            }
            _ => out = candidate,
        }
    }
    Some(out)
}

/// Splits `p` into name/`.`/`..` components (root and prefixes dropped) and
/// adds them to the back of `queue`, or to the front when `front` is set.
fn push_components(queue: &mut VecDeque<OsString>, p: &Path, front: bool) {
    let parts: Vec<OsString> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::CurDir => Some(OsString::from(".")),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect();
    if front {
        for part in parts.into_iter().rev() {
            queue.push_front(part);
        }
    } else {
        queue.extend(parts);
    }
}

/// Resolves `.` and `..` without touching the filesystem (`/a/../b` → `/b`).
pub(crate) fn lexical_normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    out
}
