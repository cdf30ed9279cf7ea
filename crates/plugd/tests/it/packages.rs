//! Plugin packages against a real OCI registry: Debian's `docker-registry`
//! (distribution 2.8), started by each test on a loopback port with its
//! storage in a temp dir, and killed at the end. Push, pull by tag and by
//! digest, list and show; a tampered layer, a moved tag, secrets and a tar
//! that escapes; the HTTP API with each role.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http::{Serve, make_token, request_as};
use crate::support::{Ws, copy_dir, ok, stderr};

/// A registry's answer: status, headers (names lower-case), body.
type RawResp = (u16, Vec<(String, String)>, Vec<u8>);

/// A `docker-registry` on `127.0.0.1:PORT`, killed on drop.
pub(crate) struct Registry {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

fn registry_binary() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("docker-registry"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "docker-registry is not installed: the package tests need Debian's registry; install it with `apt-get install -y docker-registry` (scripts/test does)"
        )
    })
}

impl Registry {
    pub(crate) fn start() -> Registry {
        let bin = registry_binary();
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: false\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.path().join("storage").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        #[allow(clippy::disallowed_methods)] // the registry under test
        let child = std::process::Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut reg = Registry { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while reg.raw("GET", "/v2/", &[], b"").map(|r| r.0) != Some(200) {
            if Instant::now() > deadline || reg.child.try_wait().unwrap().is_some() {
                panic!(
                    "docker-registry did not answer on 127.0.0.1:{port} within 20 s; its log:\n{}",
                    std::fs::read_to_string(reg.dir.path().join("registry.log"))
                        .unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        reg
    }

    pub(crate) fn reference(&self, repo_and_tag: &str) -> String {
        format!("oci://127.0.0.1:{}/{repo_and_tag}", self.port)
    }

    /// The file holding blob `digest` in the registry's storage.
    pub(crate) fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The OCI manifest stored as `digest`.
    fn manifest(&self, digest: &str) -> Value {
        serde_json::from_slice(&std::fs::read(self.blob_file(digest)).unwrap()).unwrap()
    }

    /// One HTTP request to the registry: status, headers, body.
    fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Option<RawResp> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.port,
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).ok()?;
        s.write_all(body).ok()?;
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).ok()?;
        let status = line.split_whitespace().nth(1)?.parse().ok()?;
        let mut hs = Vec::new();
        loop {
            line.clear();
            r.read_line(&mut line).ok()?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':')?;
            hs.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
        let mut rest = Vec::new();
        let _ = r.read_to_end(&mut rest);
        Some((status, hs, rest))
    }

    /// Uploads `data` as a blob of `repo` (POST, then PUT with the digest).
    fn put_blob(&self, repo: &str, data: &[u8]) -> String {
        let digest = plugd_packages::sha256_digest(data).to_string();
        let (status, headers, _) = self
            .raw("POST", &format!("/v2/{repo}/blobs/uploads/"), &[], b"")
            .unwrap();
        assert_eq!(status, 202);
        let location = &headers.iter().find(|(k, _)| k == "location").unwrap().1;
        let path = match location.find("/v2/") {
            Some(i) => &location[i..],
            None => location.as_str(),
        };
        let sep = if path.contains('?') { '&' } else { '?' };
        let (status, _, body) = self
            .raw(
                "PUT",
                &format!("{path}{sep}digest={digest}"),
                &[("Content-Type", "application/octet-stream")],
                data,
            )
            .unwrap();
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        digest
    }

    /// Pushes an artifact of plugd's shape by hand, with `files` as its
    /// files layer (so a test can send what plugd would never push).
    fn push_raw(&self, repo: &str, tag: &str, manifest_toml: &str, files: &[u8]) {
        let config = serde_json::to_vec(&json!({
            "package_id": "acme/devkit", "version": "0.1.0", "manifest": "vai-plugin.toml",
        }))
        .unwrap();
        let desc = |media: &str, data: &[u8], digest: String| json!({"mediaType": media, "digest": digest, "size": data.len()});
        let c = self.put_blob(repo, &config);
        let m = self.put_blob(repo, manifest_toml.as_bytes());
        let f = self.put_blob(repo, files);
        let mut manifest_layer = desc(
            plugd_packages::MANIFEST_LAYER_MEDIA_TYPE,
            manifest_toml.as_bytes(),
            m,
        );
        manifest_layer["annotations"] =
            json!({"org.opencontainers.image.title": "vai-plugin.toml"});
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": plugd_packages::OCI_MANIFEST_MEDIA_TYPE,
            "artifactType": plugd_packages::ARTIFACT_TYPE,
            "config": desc(plugd_packages::CONFIG_MEDIA_TYPE, &config, c),
            "layers": [manifest_layer, desc(plugd_packages::FILES_LAYER_MEDIA_TYPE, files, f)],
        });
        let (status, _, body) = self
            .raw(
                "PUT",
                &format!("/v2/{repo}/manifests/{tag}"),
                &[("Content-Type", plugd_packages::OCI_MANIFEST_MEDIA_TYPE)],
                &serde_json::to_vec(&manifest).unwrap(),
            )
            .unwrap();
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn manifest(version: &str) -> String {
    format!(
        r#"api_version = "vai.plugin.v1"
package_id = "acme/devkit"
version = "{version}"
name = "Acme Dev Kit"

[runtime]
protocol = "vai.rpc.v1"
transport = "stdio"
entrypoint = ["./bin/plugin"]

[[exports]]
id = "jira_search"
kind = "tool"
display_name = "Jira Search"

[exports.tool]
effect_class = "read_only"

[[exports]]
id = "slack_notify"
kind = "hook"

[exports.hook]
subscribes_to = ["run.completed"]
"#
    )
}

/// A package directory `acme/devkit` at `version` in `parent/name`.
fn package(parent: &Path, name: &str, version: &str) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::write(dir.join("vai-plugin.toml"), manifest(version)).unwrap();
    let bin = dir.join("bin/plugin");
    std::fs::write(&bin, format!("#!/bin/sh\n# {version}\nexit 0\n")).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("schemas/input.json"), "{\"type\": \"object\"}").unwrap();
    std::fs::write(dir.join("README.md"), "Acme Dev Kit\n").unwrap();
    dir
}

pub(crate) fn json_out(out: &std::process::Output) -> Value {
    serde_json::from_str(&ok(out)).unwrap()
}

/// `plugd package push --json`: the digest pushed.
pub(crate) fn push(ws: &Ws, dir: &Path, reference: &str) -> String {
    let out = ws.plugd(&[
        "package",
        "push",
        dir.to_str().unwrap(),
        reference,
        "--json",
    ]);
    json_out(&out)["digest"].as_str().unwrap().to_owned()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn push_then_pull_by_tag_and_by_digest_installs_read_only() {
    let reg = Registry::start();
    let ws = Ws::new();
    let dir = package(ws.dir(), "src", "0.1.0");
    // Signed with a real key plugd.yaml does not trust: installed (the
    // policy does not require signatures) and recorded as such.
    let key = crate::marketplace::keygen(&ws, "publisher");
    ok(&ws.plugd(&[
        "plugin",
        "sign",
        dir.to_str().unwrap(),
        "--key",
        key.path.to_str().unwrap(),
    ]));
    let reference = reg.reference("acme/devkit:0.1.0");
    let digest = push(&ws, &dir, &reference);
    let stored = reg.manifest(&digest);
    assert_eq!(stored["artifactType"], plugd_packages::ARTIFACT_TYPE);
    assert_eq!(stored["layers"].as_array().unwrap().len(), 2);

    let pulled = json_out(&ws.plugd(&["package", "pull", &reference, "--json"]));
    assert_eq!(pulled["new"], true);
    assert_eq!(pulled["digest"], digest);
    let list = json_out(&ws.plugd(&["package", "list", "--json"]));
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    let p = &list[0];
    assert_eq!(p["package_id"], "acme/devkit");
    assert_eq!(p["version"], "0.1.0");
    assert_eq!(p["digest"], digest);
    assert_eq!(p["source"], format!("{reference}@{digest}"));
    assert_eq!(p["manifest"], "vai-plugin.toml");
    assert_eq!(p["files"], 5);
    assert_eq!(
        p["signature"],
        json!({"status": "untrusted_key", "key_id": key.id, "public_key": key.public})
    );
    assert_eq!(
        p["exports"],
        json!([
            {"id": "jira_search", "kind": "tool", "display_name": "Jira Search", "execution_class": "isolated"},
            {"id": "slack_notify", "kind": "hook", "execution_class": "worker"},
        ])
    );
    assert!(p["installed_at"].as_str().unwrap().ends_with('Z'));
    let path = PathBuf::from(p["path"].as_str().unwrap());
    assert_eq!(
        path,
        ws.dir()
            .join(".plugd/packages/sha256")
            .join(digest.strip_prefix("sha256:").unwrap())
    );
    assert_eq!(mode(&path), 0o555);
    assert_eq!(mode(&path.join("vai-plugin.toml")), 0o444);
    assert_eq!(mode(&path.join("bin/plugin")), 0o555);
    assert_eq!(
        std::fs::read_to_string(path.join("vai-plugin.toml")).unwrap(),
        manifest("0.1.0")
    );

    // show by id, by id@version and by digest agree; text names the digest.
    for id in ["acme/devkit", "acme/devkit@0.1.0", digest.as_str()] {
        let mut shown = json_out(&ws.plugd(&["package", "show", id, "--json"]));
        // The record, plus where each export would run and with what.
        let perms = shown
            .as_object_mut()
            .unwrap()
            .remove("permissions")
            .unwrap();
        assert_eq!(perms["vai"][0]["group"], "isolated:jira_search", "{perms}");
        assert_eq!(&shown, p, "{id}");
    }
    let text = ok(&ws.plugd(&["package", "show", "acme/devkit"]));
    assert!(
        text.contains(&digest) && text.contains("jira_search"),
        "{text}"
    );
    let out = ws.plugd(&["package", "show", "acme/nothing"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no installed package"),
        "{}",
        stderr(&out)
    );

    // The same digest again, by digest: nothing changes.
    let by_digest = reg.reference(&format!("acme/devkit@{digest}"));
    let again = ok(&ws.plugd(&["package", "pull", &by_digest]));
    assert!(again.contains("installed already"), "{again}");
    // A fresh workspace pulls by digest alone.
    let other = Ws::new();
    let fresh = json_out(&other.plugd(&["package", "pull", &by_digest, "--json"]));
    assert_eq!(
        (&fresh["new"], &fresh["digest"]),
        (&json!(true), &json!(digest))
    );
    assert_eq!(fresh["source"], by_digest);
}

#[test]
fn a_tampered_layer_is_refused_naming_its_digest() {
    let reg = Registry::start();
    let ws = Ws::new();
    let dir = package(ws.dir(), "src", "0.1.0");
    let reference = reg.reference("acme/devkit:0.1.0");
    let digest = push(&ws, &dir, &reference);
    let files_layer = reg.manifest(&digest)["layers"][1]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    // One byte changed, same size: only the digest can tell.
    let blob = reg.blob_file(&files_layer);
    let mut data = std::fs::read(&blob).unwrap();
    data[600] ^= 0x20;
    std::fs::write(&blob, data).unwrap();

    let out = ws.plugd(&["package", "pull", &reference]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("blob {files_layer}")) && err.contains("tampered"),
        "{err}"
    );
    assert_eq!(
        json_out(&ws.plugd(&["package", "list", "--json"])),
        json!([])
    );
    assert!(!ws.dir().join(".plugd/packages/sha256").exists());
}

#[test]
fn a_moved_tag_does_not_change_the_installed_version() {
    let reg = Registry::start();
    let ws = Ws::new();
    let latest = reg.reference("acme/devkit:latest");
    let first = push(&ws, &package(ws.dir(), "v1", "0.1.0"), &latest);
    ok(&ws.plugd(&["package", "pull", &latest]));
    let installed = ws
        .dir()
        .join(".plugd/packages/sha256")
        .join(first.strip_prefix("sha256:").unwrap());

    // The tag moves to 0.2.0: what is installed stays 0.1.0, byte for byte.
    let second = push(&ws, &package(ws.dir(), "v2", "0.2.0"), &latest);
    assert_ne!(first, second);
    assert_eq!(
        std::fs::read_to_string(installed.join("vai-plugin.toml")).unwrap(),
        manifest("0.1.0")
    );
    let shown = json_out(&ws.plugd(&["package", "show", "acme/devkit@0.1.0", "--json"]));
    assert_eq!(shown["digest"], first);

    // Pulling the moved tag installs the new digest beside the old one.
    let pulled = json_out(&ws.plugd(&["package", "pull", &latest, "--json"]));
    assert_eq!(
        (&pulled["new"], &pulled["version"]),
        (&json!(true), &json!("0.2.0"))
    );
    let list = json_out(&ws.plugd(&["package", "list", "--json"]));
    let digests: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["digest"].as_str().unwrap())
        .collect();
    assert_eq!(digests, [first.as_str(), second.as_str()]);
    let newest = json_out(&ws.plugd(&["package", "show", "acme/devkit", "--json"]));
    assert_eq!(newest["digest"], second);

    // Other bytes claiming the installed 0.1.0 are refused, naming both.
    let changed = package(ws.dir(), "v1b", "0.1.0");
    std::fs::write(changed.join("README.md"), "changed\n").unwrap();
    let third = push(&ws, &changed, &latest);
    let out = ws.plugd(&["package", "pull", &latest]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("acme/devkit@0.1.0 is installed already")
            && err.contains(&first)
            && err.contains(&third),
        "{err}"
    );
    assert_eq!(
        json_out(&ws.plugd(&["package", "list", "--json"]))
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn env_files_and_private_keys_are_refused_naming_the_file() {
    // Refused while reading the directory, before any registry is contacted.
    let ws = Ws::new();
    let target = "oci://127.0.0.1:9/acme/devkit:0.1.0";
    let dir = package(ws.dir(), "env", "0.1.0");
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::write(dir.join("config/.env"), "JIRA_TOKEN=hunter2\n").unwrap();
    let out = ws.plugd(&["package", "push", dir.to_str().unwrap(), target]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("\"config/.env\"") && err.contains(".env file"),
        "{err}"
    );

    let dir = package(ws.dir(), "key", "0.1.0");
    let pem = format!("-----BEGIN RSA {}-----\nMIIE...\n", "PRIVATE KEY");
    std::fs::write(dir.join("server.pem"), pem).unwrap();
    let out = ws.plugd(&["package", "push", dir.to_str().unwrap(), target]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("\"server.pem\"") && err.contains("private key"),
        "{err}"
    );
}

/// A one-entry ustar archive with a raw name and type (what plugd never writes).
fn hostile_tar(name: &str, kind: u8, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = kind;
    if kind == b'2' || kind == b'1' {
        h[157..168].copy_from_slice(b"/etc/passwd");
    }
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

#[test]
fn a_files_layer_that_escapes_or_links_out_is_refused() {
    let reg = Registry::start();
    let ws = Ws::new();
    let cases = [
        (
            "escape",
            hostile_tar("../../evil.sh", b'0', b"echo pwned\n"),
            "escapes",
        ),
        (
            "absolute",
            hostile_tar("/tmp/plugd-evil", b'0', b"x"),
            "absolute",
        ),
        ("symlink", hostile_tar("bin/plugin", b'2', b""), "symlink"),
        (
            "hardlink",
            hostile_tar("bin/plugin", b'1', b""),
            "hard link",
        ),
    ];
    for (tag, tar, why) in cases {
        reg.push_raw("acme/devkit", tag, &manifest("0.1.0"), &tar);
        let out = ws.plugd(&[
            "package",
            "pull",
            &reg.reference(&format!("acme/devkit:{tag}")),
        ]);
        assert!(!out.status.success(), "{tag}");
        let err = stderr(&out);
        assert!(err.contains(why), "{tag}: {err}");
    }
    assert!(!ws.dir().join(".plugd/evil.sh").exists());
    assert!(!ws.dir().join(".plugd/packages/evil.sh").exists());
    assert!(!Path::new("/tmp/plugd-evil").exists());
    assert!(!ws.dir().join(".plugd/packages/sha256").exists());
    assert_eq!(
        json_out(&ws.plugd(&["package", "list", "--json"])),
        json!([])
    );
}

#[test]
fn the_http_api_pulls_for_operators_and_lists_for_viewers() {
    let reg = Registry::start();
    let ws = Ws::new();
    let reference = reg.reference("acme/devkit:0.1.0");
    let digest = push(&ws, &package(ws.dir(), "src", "0.1.0"), &reference);
    let serve = Serve::start_with_env(&ws, &[]);
    let viewer = make_token(&ws, "viewer");
    let operator = make_token(&ws, "operator");
    let body = json!({"source": reference}).to_string();
    let post = |token: &str, body: &str| {
        request_as(
            &serve,
            token,
            "POST",
            "/v1/plugin-packages",
            &[("Content-Type", "application/json")],
            Some(body.as_bytes()),
        )
    };
    let get = |token: &str, path: &str| request_as(&serve, token, "GET", path, &[], None);

    // No token: 401; a viewer may not pull: 403.
    let mut s = TcpStream::connect(serve.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET /v1/plugin-packages HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        serve.addr
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    post(&viewer, &body).error(403, "forbidden");
    assert_eq!(get(&viewer, "/v1/plugin-packages").json(), json!([]));

    // An operator pulls (201); the admin again finds it installed (200).
    let r = post(&operator, &body);
    assert_eq!(r.status, 201, "{}", r.text());
    let created = r.json();
    assert_eq!(
        (&created["new"], &created["digest"]),
        (&json!(true), &json!(digest))
    );
    assert!(
        created["installed_by"]
            .as_str()
            .unwrap()
            .starts_with("token:")
    );
    let r = post(&serve.token, &body);
    assert_eq!((r.status, &r.json()["new"]), (200, &json!(false)));

    // Reads for the viewer: the list, and one package by each of its names.
    let list = get(&viewer, "/v1/plugin-packages").json();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    for path in [
        "/v1/plugin-packages/acme/devkit".to_owned(),
        "/v1/plugin-packages/acme%2Fdevkit".to_owned(),
        "/v1/plugin-packages/acme/devkit@0.1.0".to_owned(),
        format!("/v1/plugin-packages/{digest}"),
    ] {
        let r = get(&viewer, &path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.json(), list[0], "{path}");
    }
    get(&viewer, "/v1/plugin-packages/acme/nothing").error(404, "unknown_package");
    get(&viewer, "/v1/plugin-packages/sha256:nope").error(400, "invalid_package_id");
    post(
        &serve.token,
        &json!({"source": "acme/devkit:1"}).to_string(),
    )
    .error(400, "invalid_source");
    // The CLI sees what the API installed.
    let cli = json_out(&ws.plugd(&["package", "list", "--json"]));
    assert_eq!(cli, list);
}

/// `tar -C dir -cf out .` with GNU tar: entries named `./…`, as people make them.
fn gnu_tar(dir: &Path, out: &Path) {
    #[allow(clippy::disallowed_methods)] // the test runs Debian's tar
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(dir)
        .arg("-cf")
        .arg(out)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success());
}

/// Seed 003's "Upload a plugin package": a tar of the package directory
/// POSTed as `application/x-tar` installs the very package a push and pull
/// of that directory would (same digest), for operators only; the CLI
/// installs a directory or a tar the same way; hostile archives are refused
/// naming the entry, and nothing of them is installed.
#[test]
fn an_uploaded_archive_installs_the_package_a_push_and_pull_would() {
    let reg = Registry::start();
    let ws = Ws::new();
    let src = package(ws.dir(), "src", "0.1.0");
    let reference = reg.reference("acme/devkit:0.1.0");
    let pushed = push(&ws, &src, &reference);
    let archive = ws.dir().join("devkit.tar");
    gnu_tar(&src, &archive);
    let data = std::fs::read(&archive).unwrap();

    let serve = Serve::start_with_env(&ws, &[]);
    let operator = make_token(&ws, "operator");
    let viewer = make_token(&ws, "viewer");
    let upload = |token: &str, body: &[u8], content_type: &str| {
        request_as(
            &serve,
            token,
            "POST",
            "/v1/plugin-packages",
            &[("Content-Type", content_type)],
            Some(body),
        )
    };
    upload(&viewer, &data, "application/x-tar").error(403, "forbidden");
    let r = upload(&operator, &data, "application/x-tar");
    assert_eq!(r.status, 201, "{}", r.text());
    let p = r.json();
    assert_eq!(p["digest"], json!(pushed), "{p}");
    assert_eq!(p["source"], json!(format!("upload:{pushed}")), "{p}");
    assert_eq!(p["new"], json!(true));
    let path = PathBuf::from(p["path"].as_str().unwrap());
    assert_eq!(mode(&path.join("bin/plugin")), 0o555);
    assert_eq!(mode(&path.join("vai-plugin.toml")), 0o444);
    // Files changed under the install: uploading the same archive again
    // puts them back (the record, and so the digest, stay).
    let readme = path.join("README.md");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&readme, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&readme, "changed under the install\n").unwrap();
    let r = upload(&operator, &data, "application/x-tar");
    assert_eq!(
        (r.status, &r.json()["restored"]),
        (200, &json!(true)),
        "{}",
        r.text()
    );
    assert_eq!(std::fs::read_to_string(&readme).unwrap(), "Acme Dev Kit\n");
    // Again: installed already. The registry's copy is the same package.
    let r = upload(&operator, &data, "application/x-tar");
    assert_eq!((r.status, &r.json()["new"]), (200, &json!(false)));
    let pulled = json_out(&ws.plugd(&["package", "pull", &reference, "--json"]));
    assert_eq!(
        (&pulled["digest"], &pulled["new"]),
        (&json!(pushed), &json!(false))
    );

    // Hostile archives: refused naming what, nothing installed.
    let env = ws.dir().join("with-env");
    copy_dir(&src, &env);
    std::fs::write(env.join(".env"), "API_KEY=sk-live-1\n").unwrap();
    gnu_tar(&env, &ws.dir().join("env.tar"));
    let v = upload(
        &operator,
        &std::fs::read(ws.dir().join("env.tar")).unwrap(),
        "application/x-tar",
    )
    .error(422, "package_refused");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(".env"),
        "{v}"
    );
    let escape = hostile_tar("../../evil.sh", b'0', b"#!/bin/sh\n");
    let v = upload(&operator, &escape, "application/x-tar").error(422, "package_refused");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("evil.sh"),
        "{v}"
    );
    assert!(!ws.dir().join(".plugd/evil.sh").exists());
    let link = hostile_tar("bin/run", b'2', b"");
    let v = upload(&operator, &link, "application/x-tar").error(422, "package_refused");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("bin/run"),
        "{v}"
    );
    upload(
        &operator,
        b"not a tar at all, just bytes",
        "application/x-tar",
    )
    .error(422, "package_refused");
    let v =
        upload(&operator, &data, "application/octet-stream").error(415, "unsupported_media_type");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("application/x-tar"),
        "{v}"
    );
    // A declared length over the bound is refused before a byte is read.
    let mut s = TcpStream::connect(serve.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /v1/plugin-packages HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {operator}\r\nContent-Type: application/x-tar\r\nContent-Length: 999999999999\r\nConnection: close\r\n\r\n",
        serve.addr
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let list = json_out(&ws.plugd(&["package", "list", "--json"]));
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    drop(serve);

    // The CLI: a directory and a tar give the pushed digest in a new workspace.
    for from in [&src, &archive] {
        let other = Ws::new();
        let out = json_out(&other.plugd(&["package", "install", from.to_str().unwrap(), "--json"]));
        assert_eq!(
            (&out["digest"], &out["new"]),
            (&json!(pushed), &json!(true)),
            "{out}"
        );
    }
}
