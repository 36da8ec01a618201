//! Trusting one certificate by its fingerprint: how a worker joins a proxy that serves a
//! self-signed certificate, with no certificate authority involved.
//!
//! The verifier accepts exactly the certificate whose SHA-256 matches the pin. It checks neither
//! a chain, nor the host name, nor the validity dates: the pin names one certificate, which is a
//! stronger statement than any of those (and the proxy's address on a LAN is often a bare IP
//! that changes). It still checks the handshake signature, which is what proves the server holds
//! the private key of that certificate rather than replaying a copy of it.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};

use crate::fingerprint::Fingerprint;

/// The server presented another certificate than the pinned one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the proxy presented certificate {presented}, but this worker is pinned to {pinned}")]
pub struct PinMismatch {
    /// What the server sent.
    pub presented: Fingerprint,
    /// What the worker trusts.
    pub pinned: Fingerprint,
}

/// A rustls verifier that trusts the one certificate with the pinned fingerprint.
#[derive(Debug)]
pub struct PinnedVerifier {
    pin: Fingerprint,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinnedVerifier {
    /// Trusts only the certificate with fingerprint `pin`.
    pub fn new(pin: Fingerprint) -> Self {
        PinnedVerifier {
            pin,
            algorithms: super::provider().signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = Fingerprint::of_der(end_entity);
        if presented.matches(&self.pin) {
            return Ok(ServerCertVerified::assertion());
        }
        // Carried as the error's source so the caller can say which certificate was seen.
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            OtherError(Arc::new(PinMismatch {
                presented,
                pinned: self.pin,
            })),
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A client configuration that trusts only the certificate with fingerprint `pin`.
pub fn client_config(pin: Fingerprint) -> Arc<rustls::ClientConfig> {
    let config = rustls::ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedVerifier::new(pin)))
        .with_no_client_auth();
    Arc::new(config)
}

/// The pin mismatch behind a failed TLS connection, if that is why it failed (tokio-rustls
/// reports rustls errors as I/O errors wrapping them).
pub fn mismatch_in(error: &std::io::Error) -> Option<PinMismatch> {
    let rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(inner))) =
        error.get_ref()?.downcast_ref::<rustls::Error>()?
    else {
        return None;
    };
    inner.downcast_ref::<PinMismatch>().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::server::ServerTls;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A TLS server on loopback that answers "hello" to one connection after another.
    async fn server() -> (std::net::SocketAddr, Fingerprint) {
        let dir = std::env::temp_dir().join(format!(
            "modelrelay-pinned-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let tls = ServerTls::self_signed(&dir, &["localhost".to_string()]).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fingerprint = tls.fingerprint();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = tls.acceptor().clone();
                tokio::spawn(async move {
                    if let Ok(mut stream) = acceptor.accept(stream).await {
                        let _ = stream.write_all(b"hello").await;
                        let _ = stream.shutdown().await;
                    }
                });
            }
        });
        (addr, fingerprint)
    }

    async fn connect(
        addr: std::net::SocketAddr,
        pin: Fingerprint,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        // Any name: the pin ignores it.
        let name = ServerName::try_from("not-the-certificates-name.example").unwrap();
        tokio_rustls::TlsConnector::from(client_config(pin))
            .connect(name, tcp)
            .await
    }

    #[tokio::test]
    async fn the_pinned_certificate_is_accepted_whatever_the_host_name() {
        let (addr, fingerprint) = server().await;
        let mut stream = connect(addr, fingerprint).await.expect("pinned handshake");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        assert_eq!(answer, "hello");
    }

    #[tokio::test]
    async fn another_certificate_is_refused_naming_both_fingerprints() {
        let (addr, fingerprint) = server().await;
        let wrong = Fingerprint::of_der(b"some other certificate");
        let error = connect(addr, wrong).await.expect_err("refused");
        let mismatch = mismatch_in(&error).expect("the error says the pin did not match");
        assert_eq!(
            mismatch,
            PinMismatch {
                presented: fingerprint,
                pinned: wrong
            }
        );
        let message = mismatch.to_string();
        assert!(message.contains(&fingerprint.to_string()), "{message}");
        assert!(message.contains(&wrong.to_string()), "{message}");
    }

    #[test]
    fn other_io_errors_are_no_mismatch() {
        let error = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(mismatch_in(&error), None);
    }
}
