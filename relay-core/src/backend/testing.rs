//! A raw HTTP/1.1 backend on 127.0.0.1 for tests of how the backend client uses connections:
//! it counts the connections it accepts and can close some without answering.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads one request (head and `content-length` body) from `socket`; false at its end.
pub(crate) async fn read_request(socket: &mut TcpStream) -> bool {
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if seen.len() >= end + 4 + length {
                return true;
            }
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A backend whose first `unanswered` connections read a request and close without a word;
/// later ones answer every request with `{}` and stay open. Its base URL, and the number of
/// connections it has accepted.
pub(crate) async fn counting_backend(unanswered: usize) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let number = counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                while read_request(&mut socket).await {
                    if number < unanswered {
                        return;
                    }
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                    if socket.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (base_url, accepted)
}
