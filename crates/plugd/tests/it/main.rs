//! plugd's integration tests: real child processes (Python, Node, Bash, Rust,
//! and the third-party `nexoai` SDK) driven through the runtime and the CLI.
//! One test binary, so the workspace links it once.

mod access;
mod agent;
mod baseline;
mod broker;
mod cgroup;
mod channels;
mod cli;
mod ctl;
mod deno;
mod dexto;
mod gateway;
mod gateway_http;
mod gateway_vai;
mod hooks;
mod hostile;
mod http;
mod invocations;
mod llm;
mod mcp;
mod mcp_remote;
mod mcp_requests;
mod mcp_resources;
mod mcp_stateless;
mod mcp_tasks;
mod memory;
mod microapp;
mod nexo;
mod outbox;
mod packages;
mod pinning;
mod resilience;
mod risk;
mod salmex;
mod salmex_lifecycle;
mod sandbox;
mod secrets;
mod semantic;
mod signatures;
mod skills;
mod support;
mod typed_errors;
mod vai;
mod vector;
mod watching;
