//! Approval pins: the read-only, content-addressed copy of an approved plugin directory that every start runs from.
//!
//! At approval, [`Pins::create`] copies the plugin directory into a staging
//! directory under `.plugd/pins/`, refusing any symlink that resolves outside
//! it, computes the approval digest **on the copy**, rewrites symlinks that
//! stay inside into relative links inside the copy (an absolute link would
//! point back at the mutable source), makes the copy read-only (files
//! 0444/0555, directories 0555) and renames it to `.plugd/pins/<hex>/`, `<hex>`
//! being the copy's own content digest. When rewriting links changed the
//! content, `.plugd/pins/<approved hex>` is a symlink to the pin, so the pin of
//! an approval is always found from the approved directory digest.
//!
//! At every start, [`Pins::verify`] finds the pin of the digest the gate just
//! checked and re-digests it: a pin that is missing or whose content no longer
//! matches its name refuses the start (it is never re-created silently).
//!
//! `.plugd/pins/by-plugin/<id>` records which pin each approved plugin uses,
//! so a revocation or re-approval removes the plugin's old pin unless another
//! approved plugin still uses it (pins are shared by content). Creating,
//! publishing and removing pins hold `.plugd/pins/.lock` (`flock`), so two
//! processes never remove a pin the other is publishing.
//!
//! **Architecture invariant**: what starts is exactly what was digested at
//! approval; the source directory is only digested (to notice edits), never
//! executed from.

use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use crate::digest::{DigestError, DigestLimits, plugin_digest};

/// Directory of the pins, under the workspace's `.plugd/`.
pub const PINS_DIR: &str = "pins";

/// Why a pin could not be made, found or trusted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PinError {
    /// A symlink in the plugin directory resolves outside it.
    #[error(
        "symlink {link:?} points outside the plugin directory (to {target:?}); plugd refuses links that leave the plugin: copy the file into the plugin directory or remove the link, then approve again"
    )]
    SymlinkEscape {
        /// The link, in the source directory.
        link: PathBuf,
        /// Where it resolves to (or its target as written, when dangling).
        target: PathBuf,
    },
    /// An entry that a plugin must not ship (fifo, socket, device).
    #[error("{path:?} is not a file, directory or symlink; remove it from the plugin directory")]
    Special {
        /// The entry.
        path: PathBuf,
    },
    /// The directory is too big to pin.
    #[error(
        "plugin directory {dir:?} has more than {limit} entries or bytes to pin; remove files from it"
    )]
    TooBig {
        /// The plugin directory.
        dir: PathBuf,
        /// The limit exceeded.
        limit: u64,
    },
    /// The file system failed.
    #[error("pin {path:?}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The copy could not be digested.
    #[error(transparent)]
    Digest(#[from] DigestError),
    /// The pin of the approval is not there.
    #[error(
        "its approval's pin {pin:?} is missing (plugd does not re-create it silently); review the plugin and run `plugd plugin approve {plugin}`"
    )]
    Missing {
        /// Plugin id.
        plugin: String,
        /// Where the pin should be.
        pin: PathBuf,
    },
    /// The pin could not be taken from the cluster's copy (see
    /// [`crate::pin_share`]).
    #[error("its approval's pin could not be taken from the cluster: {reason}; it is not started")]
    Fetched {
        /// Plugin id.
        plugin: String,
        /// Why.
        reason: String,
    },
    /// The pin's content does not match its name.
    #[error(
        "its approval's pin {pin:?} was modified ({found} now); it is not started. Review the plugin and run `plugd plugin approve {plugin}`"
    )]
    Tampered {
        /// Plugin id.
        plugin: String,
        /// The pin.
        pin: PathBuf,
        /// Its digest now.
        found: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PinError + '_ {
    move |source| PinError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A freshly made pin.
#[derive(Debug, Clone)]
pub struct Pin {
    /// The approval digest of the plugin directory (computed on the copy
    /// before links were rewritten, so it equals the source's digest).
    pub dir_digest: String,
    /// The pin directory.
    pub path: PathBuf,
    /// The pin the plugin used before, still on disk until
    /// [`Pins::forget`] (approval recorded) or [`Pins::restore`] (approval
    /// abandoned) decides.
    pub previous: Option<String>,
}

/// The pins of one workspace (`DIR/.plugd/pins/`).
#[derive(Debug, Clone)]
pub struct Pins {
    root: PathBuf,
}

/// Holds `.plugd/pins/.lock` while alive.
struct Locked {
    _file: fs::File,
}

impl Pins {
    /// The pins of the workspace whose state directory is `state_dir` (`DIR/.plugd`).
    pub fn new(state_dir: &Path) -> Pins {
        Pins {
            root: state_dir.join(PINS_DIR),
        }
    }

    /// The pins directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn lock(&self) -> Result<Locked, PinError> {
        fs::create_dir_all(self.root.join("by-plugin")).map_err(io_err(&self.root))?;
        let path = self.root.join(".lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_err(&path))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).map_err(|e| {
            PinError::Io {
                path: path.clone(),
                source: e.into(),
            }
        })?;
        Ok(Locked { _file: file })
    }

    /// Where the pin of a directory approved with `dir_digest` is (it may be
    /// an alias symlink to the real pin).
    pub fn path_of(&self, dir_digest: &str) -> PathBuf {
        self.root.join(hex_of(dir_digest))
    }

    /// Snapshots `src` (plugin `plugin`) into a pin and records it as the
    /// plugin's pin; returns it. The plugin's previous pin stays until
    /// [`Pins::forget`] or [`Pins::restore`].
    pub fn create(&self, plugin: &str, src: &Path) -> Result<Pin, PinError> {
        let staging = self.staging_dir()?;
        let result = self.build(src, &staging);
        let (dir_digest, pin_digest) = match result {
            Ok(d) => d,
            Err(e) => {
                let _ = remove_tree(&staging);
                return Err(e);
            }
        };
        let _guard = self.lock()?;
        let (target, previous) = self.publish(plugin, &staging, &dir_digest, &pin_digest)?;
        Ok(Pin {
            dir_digest,
            path: target,
            previous,
        })
    }

    /// A fresh staging directory path under the pins (not created: the
    /// caller creates it), swept if its process dies.
    pub(crate) fn staging_dir(&self) -> Result<PathBuf, PinError> {
        fs::create_dir_all(&self.root).map_err(io_err(&self.root))?;
        let staging = self.root.join(format!(
            ".staging-{}-{}",
            std::process::id(),
            random_suffix()
        ));
        Ok(staging)
    }

    /// Publishes the read-only `staging` copy (made by this process, whose
    /// content digest is `dir_digest`) as plugin `plugin`'s pin; returns it.
    pub(crate) fn publish_staged(
        &self,
        plugin: &str,
        staging: &Path,
        dir_digest: &str,
    ) -> Result<PathBuf, PinError> {
        let _guard = self.lock()?;
        let (target, previous) = self.publish(plugin, staging, dir_digest, dir_digest)?;
        if let Some(old) = previous {
            self.collect(&old)?;
        }
        Ok(target)
    }

    /// Moves `staging` to the pin named by `pin_digest` (keeping an intact
    /// one already there), aliases `dir_digest` to it, and points the
    /// plugin's record at it; returns the pin and the plugin's previous pin.
    /// Caller holds the lock.
    fn publish(
        &self,
        plugin: &str,
        staging: &Path,
        dir_digest: &str,
        pin_digest: &str,
    ) -> Result<(PathBuf, Option<String>), PinError> {
        self.sweep_abandoned();
        let name = hex_of(pin_digest);
        let target = self.root.join(&name);
        let published = match fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => {
                // Shared by content with another approval: keep the one
                // there if it is intact, else replace it.
                if plugin_digest(&target, &DigestLimits::default())
                    .ok()
                    .as_deref()
                    == Some(pin_digest)
                {
                    remove_tree(staging)?;
                    false
                } else {
                    remove_tree(&target)?;
                    true
                }
            }
            Ok(_) => {
                fs::remove_file(&target).map_err(io_err(&target))?;
                true
            }
            Err(_) => true,
        };
        if published {
            fs::rename(staging, &target).map_err(io_err(&target))?;
        }
        if dir_digest != pin_digest {
            replace_symlink(&name, &self.path_of(dir_digest))?;
        }
        let previous = self
            .set_ref(plugin, Some(&name))?
            .filter(|old| *old != name);
        Ok((target, previous))
    }

    /// The approval of `pin` was recorded: removes the plugin's previous pin
    /// unless another plugin uses it.
    pub fn forget(&self, pin: &Pin) -> Result<(), PinError> {
        let Some(old) = &pin.previous else {
            return Ok(());
        };
        let _guard = self.lock()?;
        self.collect(old)
    }

    /// The approval of `pin` was abandoned: the plugin's record points at
    /// its previous pin again (its previous approval still stands) and the
    /// new pin is removed unless another plugin uses it.
    pub fn restore(&self, plugin: &str, pin: &Pin) -> Result<(), PinError> {
        let _guard = self.lock()?;
        let new = self.set_ref(plugin, pin.previous.as_deref())?;
        if let Some(new) = new
            && Some(&new) != pin.previous.as_ref()
        {
            self.collect(&new)?;
        }
        Ok(())
    }

    /// Forgets plugin `plugin`'s pin (revocation) and removes it unless
    /// another plugin uses it.
    pub fn release(&self, plugin: &str) -> Result<(), PinError> {
        if !self.root.exists() {
            return Ok(());
        }
        let _guard = self.lock()?;
        if let Some(old) = self.set_ref(plugin, None)? {
            self.collect(&old)?;
        }
        Ok(())
    }

    /// The pin of `plugin` approved with `dir_digest`, checked: it exists,
    /// is a directory, and its content digest equals its name.
    pub fn verify(&self, plugin: &str, dir_digest: &str) -> Result<PathBuf, PinError> {
        let entry = self.path_of(dir_digest);
        let missing = || PinError::Missing {
            plugin: plugin.to_owned(),
            pin: entry.clone(),
        };
        let meta = fs::symlink_metadata(&entry).map_err(|_| missing())?;
        let real = if meta.file_type().is_symlink() {
            let name = fs::read_link(&entry).map_err(|_| missing())?;
            let name = name
                .to_str()
                .filter(|n| is_hex_name(n))
                .ok_or_else(missing)?;
            self.root.join(name)
        } else {
            entry.clone()
        };
        let meta = fs::symlink_metadata(&real).map_err(|_| PinError::Missing {
            plugin: plugin.to_owned(),
            pin: real.clone(),
        })?;
        let tampered = |found: String| PinError::Tampered {
            plugin: plugin.to_owned(),
            pin: real.clone(),
            found,
        };
        if !meta.is_dir() {
            return Err(tampered("not a directory".to_owned()));
        }
        let found = plugin_digest(&real, &DigestLimits::default())
            .map_err(|e| tampered(format!("unreadable: {e}")))?;
        let name = real.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if hex_of(&found) != name {
            return Err(tampered(found));
        }
        Ok(real)
    }

    /// The pin plugin `plugin` was last approved into (as recorded, not
    /// verified), for `plugd plugin show`.
    pub fn current(&self, plugin: &str) -> Option<PathBuf> {
        let link = self.root.join("by-plugin").join(encode_id(plugin));
        let name = fs::read_link(link).ok()?;
        let name = name.file_name()?.to_str()?;
        is_hex_name(name).then(|| self.root.join(name))
    }

    /// Removes staging directories and temporary links left by a process
    /// that died mid-approval (their name carries its pid). Caller holds
    /// the lock.
    fn sweep_abandoned(&self) {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name
                .strip_prefix(".staging-")
                .or_else(|| name.strip_prefix(".tmp-"))
            else {
                continue;
            };
            let pid = rest.split('-').next().unwrap_or("");
            let alive = pid.parse::<u32>().is_ok_and(|p| {
                p == std::process::id() || Path::new(&format!("/proc/{p}")).exists()
            });
            if !alive {
                let _ = remove_tree(&e.path())
                    .or_else(|_| fs::remove_file(e.path()).map_err(io_err(&e.path())));
            }
        }
    }

    /// Points `by-plugin/<id>` at pin `name` (or removes it); returns the
    /// pin it pointed at before. Caller holds the lock.
    fn set_ref(&self, plugin: &str, name: Option<&str>) -> Result<Option<String>, PinError> {
        let link = self.root.join("by-plugin").join(encode_id(plugin));
        let old = fs::read_link(&link)
            .ok()
            .and_then(|t| t.file_name().and_then(|n| n.to_str()).map(str::to_owned));
        match name {
            Some(name) => replace_symlink(&format!("../{name}"), &link)?,
            None => match fs::remove_file(&link) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&link)(e)),
            },
        }
        Ok(old)
    }

    /// Removes pin `name` and its aliases unless a plugin still refers to
    /// it. Caller holds the lock.
    fn collect(&self, name: &str) -> Result<(), PinError> {
        if !is_hex_name(name) {
            return Ok(());
        }
        let refs = self.root.join("by-plugin");
        for entry in fs::read_dir(&refs).map_err(io_err(&refs))? {
            let entry = entry.map_err(io_err(&refs))?;
            if let Ok(t) = fs::read_link(entry.path())
                && t.file_name().and_then(|n| n.to_str()) == Some(name)
            {
                return Ok(());
            }
        }
        for entry in fs::read_dir(&self.root).map_err(io_err(&self.root))? {
            let entry = entry.map_err(io_err(&self.root))?;
            let is_link = entry.file_type().map(|t| t.is_symlink()).unwrap_or(false);
            if is_link
                && fs::read_link(entry.path())
                    .ok()
                    .is_some_and(|t| t.as_os_str() == name)
            {
                let _ = fs::remove_file(entry.path());
            }
        }
        let pin = self.root.join(name);
        if pin.exists() {
            remove_tree(&pin)?;
        }
        Ok(())
    }

    /// Copies `src` to `staging`, digests the copy, rewrites inside links,
    /// makes it read-only; returns (approval digest, pin content digest).
    fn build(&self, src: &Path, staging: &Path) -> Result<(String, String), PinError> {
        let src_real = src.canonicalize().map_err(io_err(src))?;
        let mut copy = Copy {
            src_root: src,
            src_real: &src_real,
            dst_root: staging,
            rewrites: Vec::new(),
            entries: 0,
            bytes: 0,
            limits: DigestLimits::default(),
        };
        fs::create_dir(staging).map_err(io_err(staging))?;
        copy.dir(Path::new(""))?;
        let limits = DigestLimits::default();
        let dir_digest = plugin_digest(staging, &limits)?;
        let rewritten = !copy.rewrites.is_empty();
        for (link, target) in &copy.rewrites {
            fs::remove_file(link).map_err(io_err(link))?;
            symlink(target, link).map_err(io_err(link))?;
        }
        let pin_digest = if rewritten {
            plugin_digest(staging, &limits)?
        } else {
            dir_digest.clone()
        };
        make_read_only(staging)?;
        Ok((dir_digest, pin_digest))
    }
}

struct Copy<'a> {
    src_root: &'a Path,
    src_real: &'a Path,
    dst_root: &'a Path,
    /// (link in the copy, relative target it gets after digesting).
    rewrites: Vec<(PathBuf, PathBuf)>,
    entries: u64,
    bytes: u64,
    limits: DigestLimits,
}

impl Copy<'_> {
    fn too_big(&self, limit: u64) -> PinError {
        PinError::TooBig {
            dir: self.src_root.to_owned(),
            limit,
        }
    }

    /// Copies the children of `rel` (relative to the roots).
    fn dir(&mut self, rel: &Path) -> Result<(), PinError> {
        let from = self.src_root.join(rel);
        let depth = rel.components().count();
        if depth > self.limits.max_depth {
            return Err(self.too_big(self.limits.max_depth as u64));
        }
        let mut names = Vec::new();
        for e in fs::read_dir(&from).map_err(io_err(&from))? {
            names.push(e.map_err(io_err(&from))?.file_name());
        }
        names.sort();
        for name in names {
            self.entries += 1;
            if self.entries > self.limits.max_files as u64 {
                return Err(self.too_big(self.limits.max_files as u64));
            }
            let child = rel.join(&name);
            let s = self.src_root.join(&child);
            let d = self.dst_root.join(&child);
            let meta = fs::symlink_metadata(&s).map_err(io_err(&s))?;
            let ft = meta.file_type();
            if ft.is_symlink() {
                self.link(&child, &s, &d)?;
            } else if ft.is_dir() {
                fs::create_dir(&d).map_err(io_err(&d))?;
                self.dir(&child)?;
            } else if ft.is_file() {
                self.bytes += meta.len();
                if self.bytes > self.limits.max_bytes {
                    return Err(self.too_big(self.limits.max_bytes));
                }
                let mut input = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc_nofollow())
                    .open(&s)
                    .map_err(io_err(&s))?;
                let exec = input
                    .metadata()
                    .map(|m| m.permissions().mode() & 0o111 != 0)
                    .map_err(io_err(&s))?;
                let mut out = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(if exec { 0o700 } else { 0o600 })
                    .open(&d)
                    .map_err(io_err(&d))?;
                io::copy(&mut input, &mut out).map_err(io_err(&d))?;
            } else {
                return Err(PinError::Special { path: s });
            }
        }
        Ok(())
    }

    /// Copies the symlink `s` (at `rel`) verbatim to `d`, after checking it
    /// resolves inside the plugin directory; records a rewrite when its
    /// target is absolute or leaves the directory on the way.
    fn link(&mut self, rel: &Path, s: &Path, d: &Path) -> Result<(), PinError> {
        let target = fs::read_link(s).map_err(io_err(s))?;
        let parent_rel = rel.parent().unwrap_or(Path::new(""));
        let escape = |t: PathBuf| PinError::SymlinkEscape {
            link: s.to_owned(),
            target: t,
        };
        // Where it ends up, relative to the plugin root.
        let inside_rel: PathBuf = match s.canonicalize() {
            Ok(real) => match real.strip_prefix(self.src_real) {
                Ok(r) => r.to_owned(),
                Err(_) => return Err(escape(real)),
            },
            Err(_) => {
                // Dangling: judge the target as written.
                let joined = if target.is_absolute() {
                    target.clone()
                } else {
                    self.src_real.join(parent_rel).join(&target)
                };
                let norm = normalize(&joined);
                match norm
                    .strip_prefix(self.src_real)
                    .or_else(|_| norm.strip_prefix(self.src_root))
                {
                    Ok(r) => r.to_owned(),
                    Err(_) => return Err(escape(norm)),
                }
            }
        };
        symlink(&target, d).map_err(io_err(d))?;
        let stays = !target.is_absolute() && lexically_inside(parent_rel, &target);
        if !stays {
            let up = parent_rel.components().count();
            let mut new = PathBuf::new();
            for _ in 0..up {
                new.push("..");
            }
            new.push(&inside_rel);
            if new.as_os_str().is_empty() {
                new.push(".");
            }
            self.rewrites.push((d.to_owned(), new));
        }
        Ok(())
    }
}

fn libc_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// `true` if `target`, taken from directory `parent` (both relative to the
/// plugin root), never climbs above the root.
pub(crate) fn lexically_inside(parent: &Path, target: &Path) -> bool {
    let mut depth = parent.components().count() as i64;
    for c in target.components() {
        match c {
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// `p` with `.` and `..` resolved lexically.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

pub(crate) fn make_read_only(dir: &Path) -> Result<(), PinError> {
    for e in fs::read_dir(dir).map_err(io_err(dir))? {
        let e = e.map_err(io_err(dir))?;
        let p = e.path();
        let ft = e.file_type().map_err(io_err(&p))?;
        if ft.is_dir() {
            make_read_only(&p)?;
        } else if ft.is_file() {
            let exec = e
                .metadata()
                .map(|m| m.permissions().mode() & 0o111 != 0)
                .map_err(io_err(&p))?;
            let mode = if exec { 0o555 } else { 0o444 };
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).map_err(io_err(&p))?;
        }
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o555)).map_err(io_err(dir))
}

/// Removes a (read-only) tree: directories are made writable first.
pub(crate) fn remove_tree(p: &Path) -> Result<(), PinError> {
    fn writable(p: &Path) {
        if let Ok(m) = fs::symlink_metadata(p)
            && m.is_dir()
        {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o700));
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    writable(&e.path());
                }
            }
        }
    }
    writable(p);
    match fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(p)(e)),
    }
}

/// Makes `link` a symlink to `target`, atomically replacing what was there.
fn replace_symlink(target: &str, link: &Path) -> Result<(), PinError> {
    let tmp = link.with_file_name(format!(".tmp-{}-{}", std::process::id(), random_suffix()));
    symlink(target, &tmp).map_err(io_err(&tmp))?;
    fs::rename(&tmp, link).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err(link)(e)
    })
}

pub(crate) fn random_suffix() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    hex::encode(b)
}

/// The hex part of a `sha256:<hex>` digest (the whole string otherwise).
fn hex_of(digest: &str) -> String {
    digest
        .strip_prefix(crate::digest::DIGEST_PREFIX)
        .unwrap_or(digest)
        .to_owned()
}

fn is_hex_name(n: &str) -> bool {
    n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A plugin id as a file name: `[A-Za-z0-9_.-]` kept, every other byte
/// (`/` of VAI ids) as `%XX`.
pub(crate) fn encode_id(id: &str) -> String {
    let mut out = String::new();
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-') || (b == b'.' && !out.is_empty()) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_escape_is_seen() {
        assert!(lexically_inside(Path::new("a"), Path::new("../b")));
        assert!(!lexically_inside(Path::new("a"), Path::new("../../b")));
        assert!(!lexically_inside(Path::new(""), Path::new("../x/b")));
        assert!(lexically_inside(Path::new(""), Path::new("./b/../c")));
    }

    #[test]
    fn ids_become_file_names() {
        assert_eq!(encode_id("acme/devkit"), "acme%2Fdevkit");
        assert_eq!(encode_id("hello_py"), "hello_py");
        assert_eq!(encode_id(".."), "%2E.");
    }

    #[test]
    fn a_pin_is_read_only_content_addressed_and_links_stay_inside() {
        let ws = tempfile::tempdir().unwrap();
        let src = ws.path().join("p");
        fs::create_dir_all(src.join("lib")).unwrap();
        fs::write(src.join("main.py"), "print(1)\n").unwrap();
        fs::write(src.join("lib/util.py"), "x = 1\n").unwrap();
        symlink("lib/util.py", src.join("rel.py")).unwrap();
        symlink(src.join("main.py"), src.join("lib/abs.py")).unwrap();
        let pins = Pins::new(&ws.path().join(".plugd"));
        let pin = pins.create("p", &src).unwrap();
        assert_eq!(
            pin.dir_digest,
            plugin_digest(&src, &DigestLimits::default()).unwrap()
        );
        // The absolute link became relative, inside the pin.
        assert_eq!(
            fs::read_link(pin.path.join("lib/abs.py")).unwrap(),
            Path::new("../main.py")
        );
        assert_eq!(
            fs::read_link(pin.path.join("rel.py")).unwrap(),
            Path::new("lib/util.py")
        );
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&pin.path), 0o555);
        assert_eq!(mode(&pin.path.join("main.py")), 0o444);
        // Found from the approved digest (through the alias), and verified.
        assert_eq!(pins.verify("p", &pin.dir_digest).unwrap(), pin.path);
        // Tampering is noticed.
        fs::set_permissions(&pin.path, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(pin.path.join("extra"), "x").unwrap();
        let e = pins.verify("p", &pin.dir_digest).unwrap_err();
        assert!(matches!(e, PinError::Tampered { .. }), "{e}");
        // Release removes it.
        pins.release("p").unwrap();
        assert!(!pin.path.exists());
        assert!(matches!(
            pins.verify("p", &pin.dir_digest),
            Err(PinError::Missing { .. })
        ));
    }

    #[test]
    fn shared_pins_survive_one_release() {
        let ws = tempfile::tempdir().unwrap();
        let src = ws.path().join("p");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("main.py"), "print(1)\n").unwrap();
        let pins = Pins::new(&ws.path().join(".plugd"));
        let a = pins.create("a", &src).unwrap();
        let b = pins.create("b", &src).unwrap();
        assert_eq!(a.path, b.path);
        pins.release("a").unwrap();
        assert!(b.path.exists());
        // Re-approving b with new content drops its old pin.
        fs::write(src.join("main.py"), "print(2)\n").unwrap();
        let b2 = pins.create("b", &src).unwrap();
        assert!(a.path.exists(), "kept until the approval is recorded");
        pins.forget(&b2).unwrap();
        assert!(!a.path.exists());
        assert!(b2.path.exists());
    }

    #[test]
    fn staging_left_by_a_dead_process_is_swept() {
        let ws = tempfile::tempdir().unwrap();
        let src = ws.path().join("p");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("main.py"), "print(1)\n").unwrap();
        let pins = Pins::new(&ws.path().join(".plugd"));
        fs::create_dir_all(pins.root().join(".staging-999999999-ab/sub")).unwrap();
        let mine = pins
            .root()
            .join(format!(".staging-{}-cd", std::process::id()));
        fs::create_dir_all(&mine).unwrap();
        pins.create("p", &src).unwrap();
        assert!(!pins.root().join(".staging-999999999-ab").exists());
        assert!(mine.exists(), "a live process's staging stays");
    }

    #[test]
    fn an_abandoned_approval_keeps_the_previous_pin() {
        let ws = tempfile::tempdir().unwrap();
        let src = ws.path().join("p");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("main.py"), "print(1)\n").unwrap();
        let pins = Pins::new(&ws.path().join(".plugd"));
        let first = pins.create("p", &src).unwrap();
        pins.forget(&first).unwrap();
        fs::write(src.join("main.py"), "print(2)\n").unwrap();
        let second = pins.create("p", &src).unwrap();
        pins.restore("p", &second).unwrap();
        assert!(first.path.exists() && !second.path.exists());
        assert_eq!(pins.current("p").unwrap(), first.path);
    }

    #[test]
    fn a_link_out_of_the_plugin_is_refused_naming_link_and_target() {
        let ws = tempfile::tempdir().unwrap();
        let src = ws.path().join("p");
        fs::create_dir_all(&src).unwrap();
        fs::write(ws.path().join("outside.py"), "x\n").unwrap();
        symlink(ws.path().join("outside.py"), src.join("helper.py")).unwrap();
        let pins = Pins::new(&ws.path().join(".plugd"));
        let e = pins.create("p", &src).unwrap_err().to_string();
        assert!(e.contains("helper.py") && e.contains("outside.py"), "{e}");
        // Nothing is left behind.
        let left: Vec<_> = fs::read_dir(pins.root())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().starts_with(".staging"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // A relative link climbing out is refused too, even dangling.
        fs::remove_file(src.join("helper.py")).unwrap();
        symlink("../../nowhere", src.join("dangling")).unwrap();
        let e = pins.create("p", &src).unwrap_err().to_string();
        assert!(e.contains("dangling"), "{e}");
    }
}
