//! The registry side: `oci://` references, pushing a package directory as
//! an OCI artifact, and fetching its manifest and blobs with every digest
//! and size checked (`oci-client` speaks the distribution protocol).
//!
//! A registry on loopback (`127.0.0.0/8`, `localhost`, `[::1]`) is spoken to
//! over plain HTTP; any other over HTTPS unless `insecure` is set. Requests
//! give up after 10 s without a connection or 30 s without a byte read.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use plugd_control::Digest;
use serde_json::json;
use sha2::Digest as _;

use crate::archive::write_tar;
use crate::scan::read_package_dir;
use crate::{
    ARTIFACT_TYPE, CONFIG_MEDIA_TYPE, FILES_LAYER_MEDIA_TYPE, Limits, MANIFEST_FILES,
    MANIFEST_LAYER_MEDIA_TYPE, OCI_MANIFEST_MEDIA_TYPE, PackageError, TITLE_ANNOTATION,
    sha256_digest,
};

/// How to reach a registry.
#[derive(Debug, Clone, Copy, Default)]
pub struct RegistryOptions {
    /// Plain HTTP to a registry that is not on loopback.
    pub insecure: bool,
    /// The package bounds.
    pub limits: Limits,
}

/// `oci://HOST[:PORT]/REPO[:TAG][@sha256:…]`, parsed.
#[derive(Debug, Clone)]
pub struct OciRef {
    input: String,
    reference: Reference,
}

impl OciRef {
    /// Parses `input`; the registry must be named (a host with a dot or a
    /// port, or `localhost`).
    pub fn parse(input: &str) -> Result<OciRef, PackageError> {
        let bad = |problem: &str| PackageError::Reference {
            input: input.to_owned(),
            problem: problem.to_owned(),
        };
        let shape = "write oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:DIGEST";
        let Some(rest) = input.strip_prefix("oci://") else {
            return Err(bad(&format!("it does not start with oci://; {shape}")));
        };
        let Some((host, _)) = rest.split_once('/') else {
            return Err(bad(&format!("it names no repository; {shape}")));
        };
        if !(host.contains('.') || host.contains(':') || host == "localhost") {
            return Err(bad(&format!(
                "{host:?} is not a registry host (it needs a dot or a port, or is localhost); {shape}"
            )));
        }
        let reference: Reference = rest.parse().map_err(|e| bad(&format!("{e}; {shape}")))?;
        if reference.registry() != host {
            return Err(bad(&format!(
                "the registry reads as {:?}; {shape}",
                reference.registry()
            )));
        }
        if let Some(d) = reference.digest() {
            Digest::parse(d).map_err(|e| bad(&e.to_string()))?;
        }
        Ok(OciRef {
            input: input.to_owned(),
            reference,
        })
    }

    /// The registry, `HOST[:PORT]`.
    pub fn registry(&self) -> &str {
        self.reference.registry()
    }

    /// The digest it pins, if any.
    pub fn digest(&self) -> Option<&str> {
        self.reference.digest()
    }

    /// Whether the registry is on loopback.
    pub fn is_loopback(&self) -> bool {
        let reg = self.registry();
        let host = match reg.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(v6),
            None => reg.split(':').next().unwrap_or(reg),
        };
        host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    /// `oci://REGISTRY/REPO[:TAG]@DIGEST`: where a pulled package came from,
    /// pinned.
    pub fn pinned(&self, digest: &Digest) -> String {
        let r = &self.reference;
        match r.tag() {
            Some(tag) if r.digest().is_none() => {
                format!("oci://{}/{}:{tag}@{digest}", r.registry(), r.repository())
            }
            _ => format!("oci://{}/{}@{digest}", r.registry(), r.repository()),
        }
    }
}

impl std::fmt::Display for OciRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.input)
    }
}

/// What [`push`] sent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pushed {
    /// The package id.
    pub package_id: String,
    /// Its version.
    pub version: String,
    /// Where it went.
    pub reference: String,
    /// The digest of its OCI manifest (what `pull …@DIGEST` takes).
    pub digest: Digest,
    /// Files, the manifest included.
    pub files: u64,
    /// Their total size.
    pub size: u64,
}

fn client(r: &OciRef, insecure: bool) -> Client {
    // HTTPS registries need rustls' provider; plugd uses ring everywhere.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let protocol = if r.is_loopback() || insecure {
        ClientProtocol::Http
    } else {
        ClientProtocol::Https
    };
    Client::new(ClientConfig {
        protocol,
        platform_resolver: None,
        connect_timeout: Some(Duration::from_secs(10)),
        read_timeout: Some(Duration::from_secs(30)),
        user_agent: concat!("plugd/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    })
}

fn registry_error(r: &OciRef, e: OciDistributionError) -> PackageError {
    PackageError::Registry {
        reference: r.to_string(),
        detail: e.to_string(),
    }
}

fn descriptor(media_type: &str, data: &[u8], title: Option<&str>) -> serde_json::Value {
    let mut d = json!({
        "mediaType": media_type,
        "digest": sha256_digest(data).to_string(),
        "size": data.len(),
    });
    if let Some(t) = title {
        d["annotations"] = json!({ TITLE_ANNOTATION: t });
    }
    d
}

/// A package as the blobs of its OCI artifact: what [`push`] uploads, and
/// what an uploaded archive is installed as, so both give one digest.
#[derive(Debug, Clone)]
pub struct Blobs {
    /// The package id.
    pub package_id: String,
    /// Its version.
    pub version: String,
    /// The config blob.
    pub config: Vec<u8>,
    /// The manifest file's name (one of [`MANIFEST_FILES`]).
    pub manifest_file: &'static str,
    /// The manifest layer: the manifest's bytes.
    pub manifest: Vec<u8>,
    /// The files layer: every other file, as [`write_tar`] writes them.
    pub files_tar: Vec<u8>,
    /// The OCI image manifest naming the three.
    pub oci_manifest: Vec<u8>,
    /// The digest of `oci_manifest`: the package's digest.
    pub digest: Digest,
    /// Files, the manifest included.
    pub files: u64,
    /// Their total size.
    pub size: u64,
}

/// The artifact of a package read by [`read_package_dir`].
pub fn artifact(pkg: crate::scan::PackageDir) -> Result<Blobs, PackageError> {
    let files_tar = write_tar(&pkg.files)?;
    let (files, size) = (pkg.file_count(), pkg.total_size());
    let config = serde_json::to_vec(&json!({
        "package_id": pkg.info.package_id,
        "version": pkg.info.version,
        "manifest": pkg.manifest_file,
        "files": files,
        "size": size,
    }))
    .map_err(|e| PackageError::io("config", e.into()))?;
    let oci_manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": descriptor(CONFIG_MEDIA_TYPE, &config, None),
        "layers": [
            descriptor(MANIFEST_LAYER_MEDIA_TYPE, &pkg.manifest, Some(pkg.manifest_file)),
            descriptor(FILES_LAYER_MEDIA_TYPE, &files_tar, None),
        ],
        "annotations": {
            "org.opencontainers.image.title": pkg.info.package_id,
            "org.opencontainers.image.version": pkg.info.version,
        },
    });
    let oci_manifest =
        serde_json::to_vec(&oci_manifest).map_err(|e| PackageError::io("manifest", e.into()))?;
    Ok(Blobs {
        digest: sha256_digest(&oci_manifest),
        package_id: pkg.info.package_id,
        version: pkg.info.version,
        config,
        manifest_file: pkg.manifest_file,
        manifest: pkg.manifest,
        files_tar,
        oci_manifest,
        files,
        size,
    })
}

/// Reads the package in `dir` ([`read_package_dir`]: manifest validated,
/// secrets refused, bounds checked) and pushes it to `target`, a tag.
pub async fn push(
    dir: &Path,
    target: &OciRef,
    opts: &RegistryOptions,
) -> Result<Pushed, PackageError> {
    if target.digest().is_some() {
        return Err(PackageError::Reference {
            input: target.to_string(),
            problem: "a push goes to a tag, not a digest; write oci://HOST[:PORT]/REPO:TAG"
                .to_owned(),
        });
    }
    let blobs = artifact(read_package_dir(dir, &opts.limits)?)?;
    let digest = blobs.digest.clone();
    let c = client(target, opts.insecure);
    let r = &target.reference;
    c.store_auth_if_needed(r.resolve_registry(), &RegistryAuth::Anonymous)
        .await;
    let Blobs {
        package_id,
        version,
        config,
        manifest,
        files_tar,
        oci_manifest,
        files,
        size,
        ..
    } = blobs;
    for blob in [config, manifest, files_tar] {
        let d = sha256_digest(&blob).to_string();
        c.push_blob(r, blob, &d)
            .await
            .map_err(|e| registry_error(target, e))?;
    }
    c.push_manifest_raw(
        r,
        oci_manifest,
        http::HeaderValue::from_static(OCI_MANIFEST_MEDIA_TYPE),
    )
    .await
    .map_err(|e| registry_error(target, e))?;
    Ok(Pushed {
        package_id,
        version,
        reference: target.to_string(),
        digest,
        files,
        size,
    })
}

/// A package artifact's manifest, checked against plugd's shape.
#[derive(Debug, Clone)]
pub struct Artifact {
    /// The digest of the manifest bytes.
    pub digest: Digest,
    /// The config blob's descriptor.
    pub config: OciDescriptor,
    /// The manifest layer's descriptor.
    pub manifest_layer: OciDescriptor,
    /// The manifest file it holds (one of [`MANIFEST_FILES`]).
    pub manifest_file: &'static str,
    /// The files layer's descriptor.
    pub files_layer: OciDescriptor,
}

/// A registry holding one reference, for pulling.
pub struct Remote {
    client: Client,
    r: OciRef,
    limits: Limits,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("ref", &self.r.input)
            .finish()
    }
}

impl Remote {
    /// A client for `r`.
    pub fn new(r: &OciRef, opts: &RegistryOptions) -> Remote {
        Remote {
            client: client(r, opts.insecure),
            r: r.clone(),
            limits: opts.limits,
        }
    }

    fn not_a_package(&self, detail: String) -> PackageError {
        PackageError::NotAPackage {
            reference: self.r.to_string(),
            detail,
        }
    }

    fn tampered(&self, what: &'static str, expected: String, actual: String) -> PackageError {
        PackageError::Tampered {
            what,
            expected,
            actual,
            reference: self.r.to_string(),
        }
    }

    /// Fetches and checks the OCI manifest: its digest (against the
    /// reference's, when it pins one), its size, and plugd's artifact shape.
    pub async fn artifact(&self) -> Result<Artifact, PackageError> {
        let r = &self.r.reference;
        let fetched = self
            .client
            .pull_manifest_raw(r, &RegistryAuth::Anonymous, &[OCI_MANIFEST_MEDIA_TYPE])
            .await;
        let (body, _) = match fetched {
            Ok(v) => v,
            Err(OciDistributionError::DigestError(
                oci_client::errors::DigestError::VerificationError { expected, actual },
            )) => return Err(self.tampered("manifest", expected, actual)),
            Err(e) => return Err(registry_error(&self.r, e)),
        };
        if body.len() as u64 > self.limits.max_document_bytes {
            return Err(PackageError::TooLarge {
                what: format!("the OCI manifest of {}", self.r),
                limit: format!("{} KiB", self.limits.max_document_bytes >> 10),
                hint: "a plugd package's manifest is a few hundred bytes; check the reference",
            });
        }
        let digest = sha256_digest(&body);
        if let Some(pinned) = self.r.digest()
            && pinned != digest.as_str()
        {
            return Err(self.tampered("manifest", pinned.to_owned(), digest.to_string()));
        }
        let m: OciImageManifest = serde_json::from_slice(&body).map_err(|e| {
            self.not_a_package(format!("its manifest is not an OCI image manifest ({e})"))
        })?;
        if m.artifact_type.as_deref() != Some(ARTIFACT_TYPE)
            && m.config.media_type != CONFIG_MEDIA_TYPE
        {
            return Err(self.not_a_package(format!(
                "its artifactType is {:?} and its config is {:?}, not {ARTIFACT_TYPE:?}; push packages with `plugd package push`",
                m.artifact_type.as_deref().unwrap_or("(none)"),
                m.config.media_type
            )));
        }
        let [manifest_layer, files_layer] = m.layers.as_slice() else {
            return Err(self.not_a_package(format!(
                "it has {} layers; a package has two (its manifest, then its files)",
                m.layers.len()
            )));
        };
        if manifest_layer.media_type != MANIFEST_LAYER_MEDIA_TYPE
            || files_layer.media_type != FILES_LAYER_MEDIA_TYPE
        {
            return Err(self.not_a_package(format!(
                "its layers are {:?} and {:?}, not {MANIFEST_LAYER_MEDIA_TYPE:?} and {FILES_LAYER_MEDIA_TYPE:?}",
                manifest_layer.media_type, files_layer.media_type
            )));
        }
        let title = manifest_layer
            .annotations
            .as_ref()
            .and_then(|a| a.get(TITLE_ANNOTATION))
            .map(String::as_str);
        let Some(manifest_file) = MANIFEST_FILES.into_iter().find(|f| Some(*f) == title) else {
            return Err(self.not_a_package(format!(
                "its manifest layer is titled {title:?}; expected one of {MANIFEST_FILES:?}"
            )));
        };
        Ok(Artifact {
            digest,
            config: m.config.clone(),
            manifest_layer: manifest_layer.clone(),
            manifest_file,
            files_layer: files_layer.clone(),
        })
    }

    /// Fetches the blob `d` whole, refusing it over `limit` bytes, longer or
    /// shorter than `d.size`, or not matching `d.digest`.
    pub async fn blob(&self, d: &OciDescriptor, limit: u64) -> Result<Vec<u8>, PackageError> {
        let expected = Digest::parse(&d.digest)
            .map_err(|e| self.not_a_package(format!("a descriptor's digest: {e}")))?;
        let size = u64::try_from(d.size)
            .map_err(|_| self.not_a_package(format!("blob {expected} has a negative size")))?;
        if size > limit {
            return Err(PackageError::TooLarge {
                what: format!("blob {expected} of {} ({size} bytes)", self.r),
                limit: format!("{limit} bytes"),
                hint: "a package over plugd's limits cannot be installed",
            });
        }
        let mut stream = self
            .client
            .pull_blob_stream(&self.r.reference, d)
            .await
            .map_err(|e| registry_error(&self.r, e))?;
        let mut data = Vec::with_capacity(usize::try_from(size.min(1 << 20)).unwrap_or(0));
        let mut hasher = sha2::Sha256::new();
        let mut failed = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    if data.len() as u64 + bytes.len() as u64 > size {
                        return Err(self.tampered(
                            "blob",
                            expected.to_string(),
                            format!(
                                "something longer than the {size} bytes its descriptor declares"
                            ),
                        ));
                    }
                    hasher.update(&bytes);
                    data.extend_from_slice(&bytes);
                }
                // oci-client's own digest check ends the stream with an
                // error; ours below names the blob either way.
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let actual = Digest::from_sha256_hex(&hex::encode(hasher.finalize()))
            .map_err(|e| self.not_a_package(e.to_string()))?;
        if data.len() as u64 == size && actual != expected {
            return Err(self.tampered("blob", expected.to_string(), actual.to_string()));
        }
        if let Some(e) = failed {
            return Err(PackageError::Registry {
                reference: self.r.to_string(),
                detail: format!("reading blob {expected}: {e}"),
            });
        }
        if data.len() as u64 != size {
            return Err(self.tampered(
                "blob",
                expected.to_string(),
                format!(
                    "{} bytes instead of the {size} its descriptor declares",
                    data.len()
                ),
            ));
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_a_registry_and_pin_digests() {
        let r = OciRef::parse("oci://127.0.0.1:5000/acme/devkit:0.1.0").unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert!(r.is_loopback());
        let d = Digest::parse(&format!("sha256:{}", "ab".repeat(32))).unwrap();
        assert_eq!(
            r.pinned(&d),
            format!("oci://127.0.0.1:5000/acme/devkit:0.1.0@{d}")
        );
        let by_digest = OciRef::parse(&format!("oci://localhost:5000/acme/devkit@{d}")).unwrap();
        assert_eq!(by_digest.digest(), Some(d.as_str()));
        assert!(by_digest.is_loopback());
        assert!(
            !OciRef::parse("oci://ghcr.io/acme/devkit:1")
                .unwrap()
                .is_loopback()
        );
        assert!(
            !OciRef::parse("oci://127.0.0.1.example.com/a:1")
                .unwrap()
                .is_loopback()
        );
        for bad in [
            "127.0.0.1:5000/acme/devkit:1",
            "oci://acme/devkit:1",
            "oci://127.0.0.1:5000",
            "oci://127.0.0.1:5000/acme/devkit@sha256:00",
            "oci://127.0.0.1:5000/Acme:1",
        ] {
            assert!(OciRef::parse(bad).is_err(), "{bad}");
        }
    }
}
