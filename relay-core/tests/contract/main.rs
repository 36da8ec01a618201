//! The contract suite: one test per behavior of the behavior contract (seed 002) and per scenario
//! of the protocol walkthrough (seed 001), each driving a real proxy over real sockets.
//!
//! One test binary with modules keeps link time down on small machines.

#[path = "../common/inprocess.rs"]
mod inprocess;
#[path = "../common/postgres.rs"]
mod postgres_server;

mod adapter_e2e;
mod affinity;
mod anthropic_upstream;
mod backend_connections;
mod bad_input;
mod claude_code;
mod client_keys;
mod context_windows;
mod control;
mod dispatch;
mod fair_turns;
mod hardware;
mod lifecycle;
mod metrics;
mod registration;
mod responses_api;
mod resting_backends;
mod routing;
mod shared_database;
mod sleeping_boxes;
mod slot_hints;
mod streaming;
mod support;
mod upstreams;
mod waiting_for_a_worker;
mod walkthrough;
mod wire_fixtures;
