//! The workspace's state identity: a random id kept both inside `state.db` and
//! in a marker file beside it (`.plugd/state.id`), so a database that vanished,
//! was emptied or swapped for another workspace's is noticed at open instead
//! of being silently recreated, and [`reset`] moves the old state aside.
//!
//! The first open of a fresh workspace (no marker, no database) creates both.
//! A database from before the marker existed is adopted: it gets an id and the
//! marker is written. Deleting the marker on purpose adopts whatever database
//! is there.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;

/// The marker file beside the database.
pub const STATE_ID_FILE: &str = "state.id";

/// The table holding the id inside the database (created outside the
/// numbered migrations, idempotently).
const ID_TABLE: &str = "CREATE TABLE IF NOT EXISTS plugd_workspace (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) STRICT;";

/// What the marker records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// The random id also stored inside the database.
    pub id: String,
    /// When the database was first created (or adopted), RFC 3339 UTC.
    pub created_at: String,
}

/// What is wrong with the database the marker vouches for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// The file is gone.
    Missing,
    /// The file is there but has zero bytes.
    Empty,
    /// A valid SQLite file without any plugd state in it.
    Blank,
    /// plugd state without a workspace id (older than the marker, or foreign).
    NoId,
    /// plugd state of another workspace (another id).
    Other,
}

impl Lost {
    /// The finding, for people.
    pub fn describe(self) -> &'static str {
        match self {
            Lost::Missing => "is missing",
            Lost::Empty => "is empty (0 bytes)",
            Lost::Blank => "is a blank database with no plugd state in it",
            Lost::NoId => "carries no workspace id",
            Lost::Other => "belongs to another workspace",
        }
    }
}

/// Reads the marker of `state_dir`, if there is one.
pub fn read_marker(state_dir: &Path) -> Result<Option<Marker>, StoreError> {
    let path = state_dir.join(STATE_ID_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| StoreError::Io {
                path: path.clone(),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the state marker is damaged ({e}); restore it from a backup, or delete it to adopt the database that is there"
                    ),
                ),
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StoreError::Io { path, source }),
    }
}

/// Before SQLite touches anything: with a marker, the database file must
/// exist and must not be empty (SQLite would otherwise create a new one).
pub(crate) fn check_file(state_dir: &Path, db: &Path, marker: &Marker) -> Result<(), StoreError> {
    match fs::metadata(db) {
        Ok(m) if m.len() == 0 => Err(lost(state_dir, db, marker, Lost::Empty, None)),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(lost(state_dir, db, marker, Lost::Missing, None))
        }
        Err(source) => Err(StoreError::Io {
            path: db.to_owned(),
            source,
        }),
    }
}

/// After the database opened, before migrations write to it: with a marker,
/// it must hold plugd state carrying the marker's id.
pub(crate) fn check_db(
    conn: &Connection,
    state_dir: &Path,
    db: &Path,
    marker: &Marker,
) -> Result<(), StoreError> {
    let q = |e: rusqlite::Error| StoreError::Open {
        path: db.to_owned(),
        source: crate::error::BackendError::new(e),
    };
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(q)?;
    if version == 0 {
        return Err(lost(state_dir, db, marker, Lost::Blank, None));
    }
    match stored_id(conn).map_err(q)? {
        Some(id) if id == marker.id => Ok(()),
        Some(id) => Err(lost(state_dir, db, marker, Lost::Other, Some(id))),
        None => Err(lost(state_dir, db, marker, Lost::NoId, None)),
    }
}

/// After migrations: makes sure the database carries an id and the marker
/// records it (creating both on a fresh workspace, adopting an old database).
pub(crate) fn settle(
    conn: &Connection,
    state_dir: &Path,
    db: &Path,
    marker: Option<&Marker>,
) -> Result<(), StoreError> {
    if marker.is_some() {
        // `check_db` found the marker's id in the database: nothing to write.
        return Ok(());
    }
    let q = |e: rusqlite::Error| StoreError::Open {
        path: db.to_owned(),
        source: crate::error::BackendError::new(e),
    };
    conn.execute_batch(ID_TABLE).map_err(q)?;
    // Two processes opening a fresh workspace at once agree on the first id.
    conn.execute(
        "INSERT OR IGNORE INTO plugd_workspace (key, value) VALUES ('id', ?1), ('created_at', ?2)",
        params![new_id()?, crate::now_rfc3339()],
    )
    .map_err(q)?;
    let id = stored_id(conn).map_err(q)?.unwrap_or_default();
    let created_at: String = conn
        .query_row(
            "SELECT value FROM plugd_workspace WHERE key = 'created_at'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(q)?
        .unwrap_or_else(crate::now_rfc3339);
    write_marker(state_dir, &Marker { id, created_at })
}

fn stored_id(conn: &Connection) -> rusqlite::Result<Option<String>> {
    let has_table: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'plugd_workspace')",
        [],
        |r| r.get(0),
    )?;
    if !has_table {
        return Ok(None);
    }
    conn.query_row(
        "SELECT value FROM plugd_workspace WHERE key = 'id'",
        [],
        |r| r.get(0),
    )
    .optional()
}

fn new_id() -> Result<String, StoreError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| StoreError::Io {
        path: PathBuf::from(STATE_ID_FILE),
        source: io::Error::other(format!("no randomness for the workspace id: {e}")),
    })?;
    Ok(hex::encode(bytes))
}

fn write_marker(state_dir: &Path, marker: &Marker) -> Result<(), StoreError> {
    let path = state_dir.join(STATE_ID_FILE);
    let tmp = state_dir.join(format!(".{STATE_ID_FILE}.{}", std::process::id()));
    let err = |source| StoreError::Io {
        path: path.clone(),
        source,
    };
    let text = serde_json::to_string_pretty(marker).map_err(|e| err(e.into()))?;
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp).map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.write_all(b"\n").map_err(err)?;
    f.sync_all().map_err(err)?;
    fs::rename(&tmp, &path).map_err(err)
}

fn lost(
    state_dir: &Path,
    db: &Path,
    marker: &Marker,
    what: Lost,
    found: Option<String>,
) -> StoreError {
    StoreError::Lost(Box::new(LostDb {
        db: db.to_owned(),
        marker: state_dir.join(STATE_ID_FILE),
        what,
        expected: marker.id.clone(),
        created_at: marker.created_at.clone(),
        found,
    }))
}

/// A database the marker vouches for that is not there as it should be.
#[derive(Debug)]
pub struct LostDb {
    /// The database file.
    pub db: PathBuf,
    /// The marker file.
    pub marker: PathBuf,
    /// What is wrong.
    pub what: Lost,
    /// The id the marker records.
    pub expected: String,
    /// When the marker says the database was created.
    pub created_at: String,
    /// The id found in the database, if any.
    pub found: Option<String>,
}

impl std::error::Error for LostDb {}

impl std::fmt::Display for LostDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "state database {} {}",
            self.db.display(),
            self.what.describe()
        )?;
        if let Some(id) = &self.found {
            write!(f, " (its id is {id})")?;
        }
        write!(
            f,
            ", but {} says this workspace has one (id {}, created {}): every approval, secret and session lived in it; plugd created nothing. Restore state.db (with state.db-wal if there is one) from a backup, or start over with `plugd state reset --yes` (moves the old files aside)",
            self.marker.display(),
            self.expected,
            self.created_at
        )?;
        if matches!(self.what, Lost::NoId | Lost::Other) {
            write!(
                f,
                "; if it is the right database after all, delete {} to adopt it",
                self.marker.display()
            )?;
        }
        Ok(())
    }
}

/// The files [`reset`] moves aside, in `state_dir`: the database, its
/// marker, and the `plugd.yaml` text the last serve had in force (see
/// `plugd_runtime::config_gate`), so a reset serve starts from the file.
pub const STATE_FILES: &[&str] = &[
    "state.db",
    "state.db-wal",
    "state.db-shm",
    STATE_ID_FILE,
    "plugd.yaml.in-force",
];

/// Moves the state database (with its `-wal`/`-shm` files) and the marker
/// into a new directory `state_dir/reset-<UTC time>/`, deleting nothing; the
/// next open starts a fresh workspace. Returns that directory and the files
/// moved (empty when there was nothing to move; the directory is then not
/// created and `None` is returned).
pub fn reset(state_dir: &Path) -> Result<Option<(PathBuf, Vec<String>)>, StoreError> {
    let present: Vec<&str> = STATE_FILES
        .iter()
        .copied()
        .filter(|f| fs::symlink_metadata(state_dir.join(f)).is_ok())
        .collect();
    if present.is_empty() {
        return Ok(None);
    }
    let stamp: String = crate::now_rfc3339()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let mut aside = state_dir.join(format!("reset-{stamp}"));
    let mut n = 1;
    while aside.exists() {
        n += 1;
        aside = state_dir.join(format!("reset-{stamp}-{n}"));
    }
    let mut builder = fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(&aside).map_err(|source| StoreError::Io {
        path: aside.clone(),
        source,
    })?;
    let mut moved = Vec::new();
    for f in present {
        fs::rename(state_dir.join(f), aside.join(f)).map_err(|source| StoreError::Io {
            path: state_dir.join(f),
            source,
        })?;
        moved.push(f.to_owned());
    }
    Ok(Some((aside, moved)))
}
