//! TLS for LAN joins without a certificate authority: the proxy serves its own certificate
//! ([`server`]), everyone shows its SHA-256 fingerprint ([`crate::fingerprint`]), and a worker
//! given the fingerprint trusts that certificate and no other ([`pinned`]).

pub mod pinned;
pub mod server;

use std::sync::Arc;

pub use server::{ServerTls, TlsSetting};

/// The crypto provider, named rather than taken from the process default: ring, the one reqwest
/// and tokio-tungstenite are built with here, so the binary carries one TLS implementation.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
