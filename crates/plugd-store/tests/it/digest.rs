//! Tests of `plugin_digest`: what changes the digest, what does not, limits and refused entries.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, SystemTime};

use plugd_store::digest::{DigestError, DigestLimits, plugin_digest};

fn digest(dir: &Path) -> String {
    plugin_digest(dir, &DigestLimits::default()).unwrap()
}

/// A small plugin tree: `plugin.json`, `bin/run` (executable), `lib/` with a symlink.
fn sample() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path();
    fs::write(p.join("plugin.json"), r#"{"id":"x"}"#).unwrap();
    fs::create_dir_all(p.join("bin")).unwrap();
    fs::write(p.join("bin/run"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(p.join("bin/run"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir_all(p.join("lib")).unwrap();
    fs::write(p.join("lib/a.txt"), "aaa").unwrap();
    symlink("a.txt", p.join("lib/current")).unwrap();
    tmp
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn digest_has_the_documented_shape() {
    let tmp = sample();
    let d = digest(tmp.path());
    let hex = d.strip_prefix("sha256:").unwrap();
    assert_eq!(hex.len(), 64);
    assert!(
        hex.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{d}"
    );
    assert_eq!(digest(tmp.path()), d);
}

#[test]
fn same_tree_built_in_another_order_has_the_same_digest() {
    let one = sample();
    let two = tempfile::tempdir().unwrap();
    let p = two.path();
    fs::create_dir_all(p.join("lib")).unwrap();
    symlink("a.txt", p.join("lib/current")).unwrap();
    fs::write(p.join("lib/a.txt"), "aaa").unwrap();
    fs::create_dir_all(p.join("bin")).unwrap();
    fs::write(p.join("bin/run"), "#!/bin/sh\necho hi\n").unwrap();
    chmod(&p.join("bin/run"), 0o700);
    fs::write(p.join("plugin.json"), r#"{"id":"x"}"#).unwrap();
    assert_eq!(digest(one.path()), digest(two.path()));
}

#[test]
fn empty_directory_has_a_digest() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(digest(tmp.path()).starts_with("sha256:"));
}

/// Applies `change` to a fresh sample and asserts the digest moved.
fn assert_changes(what: &str, change: impl FnOnce(&Path)) {
    let tmp = sample();
    let before = digest(tmp.path());
    change(tmp.path());
    assert_ne!(
        digest(tmp.path()),
        before,
        "{what} did not change the digest"
    );
}

#[test]
fn every_kind_of_change_changes_the_digest() {
    assert_changes("editing content", |p| {
        fs::write(p.join("lib/a.txt"), "aab").unwrap()
    });
    assert_changes("appending a byte", |p| {
        fs::write(p.join("lib/a.txt"), "aaaa").unwrap()
    });
    assert_changes("adding a file", |p| {
        fs::write(p.join("lib/b.txt"), "").unwrap()
    });
    assert_changes("adding an empty dir", |p| {
        fs::create_dir(p.join("lib/empty")).unwrap()
    });
    assert_changes("removing a file", |p| {
        fs::remove_file(p.join("plugin.json")).unwrap()
    });
    assert_changes("renaming a file", |p| {
        fs::rename(p.join("lib/a.txt"), p.join("lib/b.txt")).unwrap()
    });
    assert_changes("moving a file to another dir", |p| {
        fs::rename(p.join("lib/a.txt"), p.join("bin/a.txt")).unwrap()
    });
    assert_changes("chmod +x", |p| chmod(&p.join("lib/a.txt"), 0o755));
    assert_changes("chmod -x", |p| chmod(&p.join("bin/run"), 0o644));
    assert_changes("retargeting a symlink", |p| {
        fs::remove_file(p.join("lib/current")).unwrap();
        symlink("b.txt", p.join("lib/current")).unwrap();
    });
    assert_changes("replacing a symlink by a copy", |p| {
        fs::remove_file(p.join("lib/current")).unwrap();
        fs::write(p.join("lib/current"), "aaa").unwrap();
    });
}

#[test]
fn mtime_and_non_exec_mode_bits_do_not_change_the_digest() {
    let tmp = sample();
    let before = digest(tmp.path());
    let f = fs::File::options()
        .write(true)
        .open(tmp.path().join("lib/a.txt"))
        .unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(86_400))
        .unwrap();
    drop(f);
    chmod(&tmp.path().join("lib/a.txt"), 0o600);
    assert_eq!(digest(tmp.path()), before);
}

/// Digest of a tree given as (path, content) files.
fn tree_digest(files: &[(&str, &str)]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    for (path, content) in files {
        let path = tmp.path().join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }
    digest(tmp.path())
}

#[test]
fn framing_keeps_names_and_contents_apart() {
    assert_ne!(tree_digest(&[("a", "bc")]), tree_digest(&[("ab", "c")]));
    assert_ne!(
        tree_digest(&[("a", "b")]),
        tree_digest(&[("a", ""), ("b", "")])
    );
    assert_ne!(
        tree_digest(&[("a/b", "")]),
        tree_digest(&[("a", ""), ("b", "")])
    );
    assert_ne!(tree_digest(&[("a/b", "")]), tree_digest(&[("a_b", "")]));

    // A file and a symlink whose target equals the file's content.
    let file = tempfile::tempdir().unwrap();
    fs::write(file.path().join("x"), "target").unwrap();
    let link = tempfile::tempdir().unwrap();
    symlink("target", link.path().join("x")).unwrap();
    assert_ne!(digest(file.path()), digest(link.path()));

    // An empty file and an empty directory of the same name.
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("x")).unwrap();
    assert_ne!(tree_digest(&[("x", "")]), digest(dir.path()));
}

#[test]
fn symlinks_are_not_followed() {
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), "one").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    symlink(outside.path().join("secret"), tmp.path().join("file")).unwrap();
    symlink(outside.path(), tmp.path().join("dir")).unwrap();
    symlink("nowhere", tmp.path().join("dangling")).unwrap();
    let before = digest(tmp.path());
    fs::write(outside.path().join("secret"), "two").unwrap();
    fs::write(outside.path().join("more"), "x").unwrap();
    assert_eq!(digest(tmp.path()), before);
}

#[test]
fn root_reached_through_a_symlink_is_digested() {
    let tmp = sample();
    let parent = tempfile::tempdir().unwrap();
    let link = parent.path().join("plugin");
    symlink(tmp.path(), &link).unwrap();
    assert_eq!(digest(&link), digest(tmp.path()));
}

#[test]
fn not_a_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("f");
    fs::write(&file, "").unwrap();
    let err = plugin_digest(&file, &DigestLimits::default()).unwrap_err();
    assert!(matches!(err, DigestError::NotADirectory { .. }), "{err:?}");
    let err = plugin_digest(&tmp.path().join("missing"), &DigestLimits::default()).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn too_many_entries_names_the_dir_and_limit() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["a", "b", "c"] {
        fs::write(tmp.path().join(name), "").unwrap();
    }
    let limits = DigestLimits {
        max_files: 3,
        ..DigestLimits::default()
    };
    plugin_digest(tmp.path(), &limits).unwrap();
    fs::create_dir(tmp.path().join("d")).unwrap();
    let err = plugin_digest(tmp.path(), &limits).unwrap_err();
    assert!(
        matches!(err, DigestError::TooMany { limit: 3, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&tmp.path().display().to_string()) && msg.contains(" 3 "),
        "{msg}"
    );
}

#[test]
fn too_many_bytes_names_the_dir_and_limit() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("a"), "12345").unwrap();
    fs::write(tmp.path().join("b"), "12345").unwrap();
    let limits = DigestLimits {
        max_bytes: 10,
        ..DigestLimits::default()
    };
    plugin_digest(tmp.path(), &limits).unwrap();
    fs::write(tmp.path().join("c"), "1").unwrap();
    let err = plugin_digest(tmp.path(), &limits).unwrap_err();
    assert!(
        matches!(err, DigestError::TooLarge { limit: 10, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&tmp.path().display().to_string()) && msg.contains("10 bytes"),
        "{msg}"
    );
}

#[test]
fn too_deep_names_the_entry_and_limit() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join("a/b")).unwrap();
    fs::write(tmp.path().join("a/b/c"), "").unwrap();
    let limits = |max_depth| DigestLimits {
        max_depth,
        ..DigestLimits::default()
    };
    plugin_digest(tmp.path(), &limits(3)).unwrap();
    let err = plugin_digest(tmp.path(), &limits(2)).unwrap_err();
    assert!(
        matches!(err, DigestError::TooDeep { limit: 2, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("a/b/c") && msg.contains("2 levels"), "{msg}");
}

#[test]
fn default_depth_limit_stops_a_deep_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let deep: std::path::PathBuf = (0..40).map(|_| "d").collect();
    fs::create_dir_all(tmp.path().join(deep)).unwrap();
    let err = plugin_digest(tmp.path(), &DigestLimits::default()).unwrap_err();
    assert!(
        matches!(err, DigestError::TooDeep { limit: 32, .. }),
        "{err:?}"
    );
}

#[test]
fn fifo_is_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("a"), "").unwrap();
    let fifo = tmp.path().join("pipe");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let err = plugin_digest(tmp.path(), &DigestLimits::default()).unwrap_err();
    assert!(
        matches!(err, DigestError::Special { kind: "fifo", .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&fifo.display().to_string()),
        "{err}"
    );
}

#[test]
fn socket_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("sub/sock");
    fs::create_dir(tmp.path().join("sub")).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let err = plugin_digest(tmp.path(), &DigestLimits::default()).unwrap_err();
    assert!(
        matches!(err, DigestError::Special { kind: "socket", .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&sock.display().to_string()),
        "{err}"
    );
}

#[test]
fn device_node_is_refused_where_one_can_be_made() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("null");
    // Making a device node needs CAP_MKNOD; without it the refusal cannot be staged.
    let made = rustix::fs::mknodat(
        rustix::fs::CWD,
        &dev,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o644),
        rustix::fs::makedev(1, 3),
    );
    if made.is_err() {
        return;
    }
    let err = plugin_digest(tmp.path(), &DigestLimits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            DigestError::Special {
                kind: "character device",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&dev.display().to_string()),
        "{err}"
    );
}

/// Runs `f` in a thread whose credentials are an unprivileged user when the
/// test runs as root, so permission bits apply (Linux credentials are per thread;
/// rustix changes only the calling thread's).
fn as_unprivileged<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        if rustix::process::geteuid().is_root() {
            let nobody = rustix::process::Uid::from_raw(65_534);
            rustix::thread::set_thread_res_uid(nobody, nobody, nobody).unwrap();
        }
        f()
    })
    .join()
    .unwrap()
}

#[test]
fn unreadable_file_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    chmod(tmp.path(), 0o755);
    fs::create_dir(tmp.path().join("sub")).unwrap();
    chmod(&tmp.path().join("sub"), 0o755);
    let file = tmp.path().join("sub/secret");
    fs::write(&file, "x").unwrap();
    chmod(&file, 0o000);
    let root = tmp.path().to_owned();
    let err = as_unprivileged(move || plugin_digest(&root, &DigestLimits::default())).unwrap_err();
    assert!(matches!(err, DigestError::Io { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&file.display().to_string()), "{msg}");
    assert!(msg.contains("ermission denied"), "{msg}");
}

#[test]
fn unreadable_directory_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    chmod(tmp.path(), 0o755);
    let sub = tmp.path().join("sub");
    fs::create_dir(&sub).unwrap();
    chmod(&sub, 0o000);
    let root = tmp.path().to_owned();
    let err = as_unprivileged(move || plugin_digest(&root, &DigestLimits::default())).unwrap_err();
    chmod(&sub, 0o755);
    assert!(matches!(err, DigestError::Io { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&sub.display().to_string()),
        "{err}"
    );
}
