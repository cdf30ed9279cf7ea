//! The one integration-test binary of plugd-store: the SQLite store and the plugin digest.

mod digest;
mod identity;
mod store;
