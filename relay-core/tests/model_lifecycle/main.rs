//! Model lifecycle process tests: a real `LifecycleManager` starting, probing, idling, switching
//! and killing real child processes (a fake llama-server built by the harness), and the same
//! end to end through a real proxy and the real worker (`through_relay`). Everything binds
//! 127.0.0.1, every test is bounded in time and checks that no process outlives it.

#[path = "../common/inprocess.rs"]
mod inprocess;

mod dashboard;
mod failures;
mod orphans;
mod relay;
mod sessions;
mod start;
mod supervision;
mod support;
mod switching;
mod through_relay;
mod vram;
