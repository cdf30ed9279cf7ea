//! plugd-store-pg's integration tests, one binary, against a real PostgreSQL 15
//! started by `TestPg` (one server per run, one fresh database per test).

mod harness;
mod migrate;
mod shape;
