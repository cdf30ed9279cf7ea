//! plugd's governance: the operator's rules for what may run and with what,
//! read from `plugd.yaml` and checked the same way for every surface.
//!
//! * [`signing`]: Ed25519 signatures of plugin directories and packages
//!   (`marketplace.signature.json`, format `plugd-signature/1`) and the trust
//!   policy (`require_signatures`, `trusted_publishers`).
//! * [`containment`]: what a plugin runs inside — the manifest's sandbox
//!   narrowed by the operator's `sandbox:` section, VAI permissions with the
//!   operator's per-export grants, the baseline.
//! * [`marketplace`]: the signed marketplace index (`plugd-marketplace/1`),
//!   fetched, verified and judged installable per the mode.
//! * [`bindings`]: the binding service (create, update, validate, show,
//!   discover) with its tenancy rules, shared by the HTTP API and `plugd
//!   binding`.
//! * [`marketplace_install`]: installing a marketplace entry (pull the
//!   pinned package, then bind each of its exports through [`bindings`]),
//!   shared by the HTTP API and `plugd marketplace install`.
//! * [`plugd_yaml`]: the file these sections come from (name, bound,
//!   parsing, [`plugd_yaml::ConfigError`]), shared with plugd-runtime's
//!   other sections.
//!
//! **API boundary**: policy and verification, and the services that write
//! what the operator decided (bindings, marketplace installs) through the
//! state store. Nothing here starts a process or owns a plugin;
//! plugd-runtime asks these modules before it starts one. Services return
//! [`plugd_control::ServiceError`]; each surface maps its code.

pub mod bindings;
pub mod containment;
pub mod marketplace;
pub mod marketplace_install;
pub mod plugd_yaml;
pub mod signing;
