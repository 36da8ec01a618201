//! Attacks on the real `modelrelay` binary (issue "Safe by default"): each test runs the built
//! binary as a child process, attacks it the way a web page, a LAN peer or a malicious worker
//! would, and checks both the refusal and that nothing changed (config file bytes, processes,
//! secrets in answers).

#[path = "../common/binary.rs"]
mod binary;

mod control_plane;
mod discovery;
mod guessing;
mod passthrough;
mod reverse_proxy;
mod sign_in;
mod tenants;
mod tls;
