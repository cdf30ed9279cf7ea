//! Reading a declaration file safely: a regular file, at most
//! [`MAX_MANIFEST_BYTES`], UTF-8, never buffered past the limit.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::ManifestError;

/// Largest manifest accepted, in bytes (1 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;

/// Reads `path` (whose metadata is `meta`) as UTF-8 text, refusing anything
/// that is not a regular file or is larger than [`MAX_MANIFEST_BYTES`].
pub(crate) fn read_limited(path: &Path, meta: &std::fs::Metadata) -> Result<String, ManifestError> {
    let io_err = |source| ManifestError::Io {
        path: path.to_path_buf(),
        source,
    };
    if !meta.is_file() {
        return Err(io_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a directory or special file is refused)",
        )));
    }
    let too_large = |size| ManifestError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit: MAX_MANIFEST_BYTES,
    };
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes))
        .map_err(io_err)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| ManifestError::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Reads a plugin directory's manifest: its text and the canonical directory
/// holding it.
pub(crate) fn read_manifest(manifest_path: &Path) -> Result<(String, PathBuf), ManifestError> {
    let io_err = |source| ManifestError::Io {
        path: manifest_path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(manifest_path).map_err(io_err)?;
    let text = read_limited(manifest_path, &meta)?;
    let parent = match manifest_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = std::fs::canonicalize(parent).map_err(io_err)?;
    Ok((text, dir))
}
