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
        let stream = TcpStream::connect(addr).await.expect("connect to proxy");
        RawHttpClient::send_post(stream, addr, path, body).await
    }

    /// Like [`RawHttpClient::post`], with the socket's receive buffer fixed at `bytes` (no
    /// autotuning), so little of an answer the client does not read waits in its kernel.
    pub async fn post_with_receive_buffer(
        addr: SocketAddr,
        path: &str,
        body: &Value,
        bytes: u32,
    ) -> RawHttpClient {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
        let stream = socket.connect(addr).await.expect("connect to proxy");
        RawHttpClient::send_post(stream, addr, path, body).await
    }

    async fn send_post(
        mut stream: TcpStream,
        addr: SocketAddr,
        path: &str,
        body: &Value,
    ) -> RawHttpClient {
        use tokio::io::AsyncWriteExt;
        let body = body.to_string();
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

    /// Reads until the bytes received so far contain `needle`; returns them as text. Each read
    /// searches only the new bytes (and the needle's length before them): a stream of megabytes
    /// read 64 KiB at a time stays linear, not a rescan of everything per read.
    pub async fn read_until(&mut self, needle: &str) -> String {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + WAIT;
        let needle_bytes = needle.as_bytes();
        let mut searched: usize = 0;
        loop {
            let from = searched.saturating_sub(needle_bytes.len());
            if self.received[from..]
                .windows(needle_bytes.len().max(1))
                .any(|window| window == needle_bytes)
            {
                return String::from_utf8_lossy(&self.received).into_owned();
            }
            searched = self.received.len();
            let mut buf = vec![0u8; 64 * 1024];
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "timed out waiting for {needle:?}; {} bytes, ending {:?}",
                        self.received.len(),
                        self.tail()
                    )
                })
                .expect("read");
            assert!(
                n > 0,
                "connection closed before {needle:?}; {} bytes, ending {:?}",
                self.received.len(),
                self.tail()
            );
            self.received.extend_from_slice(&buf[..n]);
        }
    }

    /// The last 2 KiB received, as text (for failure messages: a stream can be megabytes).
    fn tail(&self) -> String {
        let from = self.received.len().saturating_sub(2048);
        String::from_utf8_lossy(&self.received[from..]).into_owned()
    }

    /// Reads a chunked answer to its last chunk, within `within`; returns the body, de-chunked.
    pub async fn read_chunked_body(&mut self, within: Duration) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + within;
        let mut buf = vec![0u8; 64 * 1024];
        while !self.received.ends_with(b"\r\n0\r\n\r\n") {
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "timed out after {} bytes of the answer",
                        self.received.len()
                    )
                })
                .expect("read");
            assert!(
                n > 0,
                "connection closed after {} bytes",
                self.received.len()
            );
            self.received.extend_from_slice(&buf[..n]);
        }
        dechunk(&self.received)
    }

    /// Reads at most one byte, as the slowest client would; false once the connection closed.
    pub async fn read_one_byte(&mut self) -> bool {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        let n = tokio::time::timeout(WAIT, self.stream.read(&mut byte))
            .await
            .map_or(0, |read| read.unwrap_or(0));
        self.received.extend_from_slice(&byte[..n]);
        n == 1
    }

    /// The answer's status code, once its head arrived.
    pub fn status(&self) -> Option<u16> {
        let code = self.received.strip_prefix(b"HTTP/1.1 ")?.get(..3)?;
        std::str::from_utf8(code).ok()?.parse().ok()
    }

    /// Closes the connection, as a client that gives up would.
    pub fn disconnect(self) {
        drop(self.stream);
    }
}

// --- protocol adapter (issue 3): a backend that speaks only OpenAI chat completions ---

/// The body of an HTTP/1.1 answer with chunked transfer encoding (head included in `raw`).
fn dechunk(raw: &[u8]) -> Vec<u8> {
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    let mut rest = &raw[head_end..];
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a size line");
        let size_text = std::str::from_utf8(&rest[..line_end]).expect("ASCII size");
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .expect("hex size");
        rest = &rest[line_end + 2..];
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&rest[..size]);
        assert_eq!(&rest[size..size + 2], b"\r\n", "a chunk ends with CRLF");
        rest = &rest[size + 2..];
    }
}
