//! One `plugd serve` per workspace: an exclusive `flock` on `.plugd/serve.lock`
//! held by an open file for serve's whole life.
//!
//! The lock is taken before the state database opens or any plugin starts.
//! The kernel drops it when the process ends, however it ends (`kill -9`
//! included), so a crashed serve never blocks the next one. The holder writes
//! its pid into the file so a refused serve can say whom it lost to.
//! `plugd-node` takes it; the CLI reads who holds it and takes it for
//! `plugd state reset`.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The lock file, inside the workspace's state directory.
pub const SERVE_LOCK_FILE: &str = "serve.lock";

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error(
        "another plugd serve ({holder}) already runs on workspace {}; stop it first, or use it: the CLI's plugin commands reach it",
        workspace.display()
    )]
    Held {
        /// The workspace.
        workspace: PathBuf,
        /// `pid N` as the holder recorded it, or why the pid is unknown.
        holder: String,
    },
    /// The lock file could not be created, read or locked.
    #[error("cannot take the serve lock {}: {source}; check the permissions of .plugd/", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct ServeLock {
    _file: File,
}

impl ServeLock {
    /// Takes the lock of `workspace` without waiting and records this pid.
    pub fn acquire(workspace: &Path) -> Result<ServeLock, LockError> {
        let dir = workspace.join(".plugd");
        let path = dir.join(SERVE_LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = match text.trim().parse::<u32>() {
                    Ok(pid) => format!("pid {pid}"),
                    // Taken an instant ago, its pid not written yet.
                    Err(_) => "pid not recorded yet".to_owned(),
                };
                return Err(LockError::Held {
                    workspace: workspace.to_owned(),
                    holder,
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        // Ours now: replace whatever an earlier holder wrote.
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(ServeLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_pid() {
        let ws = tempfile::tempdir().unwrap();
        let first = ServeLock::acquire(ws.path()).unwrap();
        let err = ServeLock::acquire(ws.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(first);
        ServeLock::acquire(ws.path()).expect("free again once dropped");
    }
}
