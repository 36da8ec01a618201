//! An HTTP/1.1 client on a raw socket, so a test controls exactly when it disconnects.

use std::net::SocketAddr;

use serde_json::Value;
use tokio::net::TcpStream;

use super::*;

/// An HTTP/1.1 client on a raw TCP socket, so a test controls exactly when it disconnects.
pub struct RawHttpClient {
    stream: TcpStream,
    received: Vec<u8>,
}

impl RawHttpClient {
    /// Connects to `addr` and sends a JSON POST to `path`.
    pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> RawHttpClient {
        use tokio::io::AsyncWriteExt;
        let body = body.to_string();
        let mut stream = TcpStream::connect(addr).await.expect("connect to proxy");
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.expect("write head");
        stream.write_all(body.as_bytes()).await.expect("write body");
        RawHttpClient {
            stream,
            received: Vec::new(),
        }
    }

    /// Reads until the bytes received so far contain `needle`; returns them as text.
    pub async fn read_until(&mut self, needle: &str) -> String {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + WAIT;
        while !String::from_utf8_lossy(&self.received).contains(needle) {
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "timed out waiting for {needle:?}; got {:?}",
                        String::from_utf8_lossy(&self.received)
                    )
                })
                .expect("read");
            assert!(
                n > 0,
                "connection closed before {needle:?}; got {:?}",
                String::from_utf8_lossy(&self.received)
            );
            self.received.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&self.received).into_owned()
    }

    /// Closes the connection, as a client that gives up would.
    pub fn disconnect(self) {
        drop(self.stream);
    }
}

// --- protocol adapter (issue 3): a backend that speaks only OpenAI chat completions ---
