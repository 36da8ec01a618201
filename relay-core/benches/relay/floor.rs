//! The floor under any relay in the `burst` scenario: a bare TCP forwarder that, for each
//! client connection, connects to the backend, hands the request over and copies bytes back.
//! It does strictly less than the relay (one hop instead of two plus a WebSocket, no HTTP
//! parsing, one process), but what no relay can skip: a backend connection per concurrent stream
//! (HTTP/1.1, as llama-server speaks) and the extra socket each way. Like the worker's connector
//! it bounds the backend connections opened and not yet answered; without a bound the backend's
//! listen queue of 128 overflows and SYNs wait a second. Its first-byte times tell how much of
//! the relay's burst is the machine's and how much is ours.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;

/// Backend connections opened and not yet answered at once: the forwarder's best of those
/// tried (2,000 streams, p99: 32 → 95–109 ms, 100 → 85–90 ms, unbounded → 1,060–1,089 ms with
/// 157–293 listen-queue overflows), so the floor is as low as this design gets.
const CONNECTS_IN_FLIGHT: usize = 100;

/// Starts the forwarder on its own two-thread runtime (as a separate process would run) and
/// returns its port. It runs until the bench process ends.
pub fn start(backend_port: u16) -> u16 {
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("forwarder runtime");
        runtime.block_on(async move {
            let socket = TcpSocket::new_v4().expect("socket");
            socket
                .bind(([127, 0, 0, 1], 0).into())
                .expect("bind the forwarder");
            let listener: TcpListener = socket.listen(4096).expect("listen");
            let port = listener.local_addr().expect("address").port();
            port_tx.send(port).expect("report the port");
            let permits = Arc::new(Semaphore::new(CONNECTS_IN_FLIGHT));
            while let Ok((client, _)) = listener.accept().await {
                let permits = permits.clone();
                tokio::spawn(forward(client, backend_port, permits));
            }
        });
    });
    port_rx.recv().expect("the forwarder listens")
}

/// One client connection: its first read is the request (the load generator writes it whole).
async fn forward(mut client: TcpStream, backend_port: u16, permits: Arc<Semaphore>) {
    let _ = client.set_nodelay(true);
    let mut request = vec![0u8; 2048];
    let Ok(read) = client.read(&mut request).await else {
        return;
    };
    if read == 0 {
        return;
    }
    let Ok(permit) = permits.acquire_owned().await else {
        return;
    };
    let mut permit = Some(permit);
    let Ok(mut backend) = TcpStream::connect(("127.0.0.1", backend_port)).await else {
        return;
    };
    let _ = backend.set_nodelay(true);
    if backend.write_all(&request[..read]).await.is_err() {
        return;
    }
    let mut buffer = vec![0u8; 2048];
    loop {
        let Ok(read) = backend.read(&mut buffer).await else {
            return;
        };
        // The backend has answered: the connection is out of its listen queue.
        permit.take();
        if read == 0 || client.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
