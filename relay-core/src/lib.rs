//! ModelRelay core: a proxy that exposes OpenAI- and Anthropic-compatible endpoints, workers that
//! connect out to it over WebSocket and forward requests to local model servers, and discovery of
//! those servers. The `modelrelay` binary and the desktop app are thin shells over this crate.
//!
//! Start with `ARCHITECTURE.md` at the repository root for the map.

pub mod adapter;
pub mod affinity;
pub mod app;
pub mod backend;
pub mod cli;
pub mod dialect;
pub mod discovery;
pub mod endpoint;
pub mod fingerprint;
pub mod hardware;
pub mod lan;
pub mod lifecycle;
pub mod listen;
pub mod node;
pub mod open_dashboard;
pub mod paths;
pub mod protocol;
pub mod proxy;
pub mod resident;
pub mod settings;
pub mod startup;
pub mod store;
pub mod tls;
pub mod wake;
pub mod worker;

#[cfg(test)]
mod typescript;
