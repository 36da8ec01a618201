//! Serves the node's router on its listener: HTTP/1.1 with upgrades (the worker WebSocket), a
//! graceful stop, and the peer address as axum's `ConnectInfo`.
//!
//! This replaces `axum::serve`, which hands every connection to hyper-util's HTTP/1-or-2
//! detector. The detector reads the first 24 bytes itself and replays them, so hyper's first
//! read returns a partial request head and its 8 KiB read buffer is regrown to 16 KiB on every
//! connection: about 9 KB more per open stream (BENCHMARKS.md). The proxy speaks HTTP/1 only
//! (axum's `http2` feature is off), so nothing needs detecting: hyper reads the head straight
//! from the socket.
//!
//! Bounds, so a few hundred slow or idle sockets cannot hold the node: a client must send a
//! request's whole head within [`ConnectionLimits::header_read_timeout`] (hyper's timer; it also
//! closes keep-alive connections left idle that long), and beyond
//! [`ConnectionLimits::max_connections`] open connections a new one is answered `503` with
//! `Retry-After` and closed.
//!
//! With TLS (`--tls-cert`/`--tls-key`, `--tls self-signed`) each connection's handshake runs in
//! that connection's task, never in the accept loop: a client that stalls mid-handshake holds only
//! its own task (until [`HANDSHAKE_TIMEOUT`]), and the loop keeps accepting.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tower_service::Service;

/// How long to wait after an accept error that is not about one connection (e.g. out of file
/// descriptors) before accepting again, so the loop does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// How long a TLS client may take to finish its handshake before the connection is dropped, so
/// idle half-open connections do not pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub use crate::settings::ConnectionLimits;

/// The answer to a connection beyond [`ConnectionLimits::max_connections`]: short, complete, and
/// in the OpenAI error shape every client here parses.
fn over_capacity() -> Vec<u8> {
    let body = crate::dialect::Dialect::OpenAi.error_body(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "too_many_connections",
        "the relay has as many open connections as it accepts (max_connections); retry shortly",
    );
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Descriptors kept for everything but client connections: workers' and upstreams' sockets,
/// the database, log and data files.
const RESERVED_DESCRIPTORS: u64 = 256;

/// `max_connections`, lowered to fit the process's open-files limit: past it, `accept` fails
/// (and keeps failing) instead of answering the 503 that tells a client to come back.
fn within_open_files(max_connections: usize) -> usize {
    let Some(limit) = crate::startup::open_files_limit() else {
        return max_connections;
    };
    let room =
        usize::try_from(limit.saturating_sub(RESERVED_DESCRIPTORS).max(1)).unwrap_or(usize::MAX);
    if room >= max_connections {
        return max_connections;
    }
    tracing::warn!(
        max_connections,
        open_files_limit = limit,
        "max_connections lowered to {room} to fit the open-files limit (raise it with \
         `ulimit -n` or LimitNOFILE= in the service unit)"
    );
    room
}

/// Serves `app` on `listener` (over TLS with `tls`) until `stop` resolves, then stops accepting,
/// asks every open connection to finish its current exchange (an idle keep-alive connection
/// closes at once; a streaming answer or an upgraded WebSocket runs on) and returns when all have
/// closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    limits: ConnectionLimits,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    // Connections watch `closing`; each holds a receiver, so `closed()` resolves when the last
    // connection task has ended.
    let (closing, _) = watch::channel(false);
    let open = Arc::new(Semaphore::new(within_open_files(limits.max_connections)));
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                // Small SSE chunks must leave at once, not wait for Nagle's algorithm.
                let _ = stream.set_nodelay(true);
                let Ok(permit) = open.clone().try_acquire_owned() else {
                    tokio::spawn(refuse_over_capacity(stream, peer));
                    continue;
                };
                let (app, closing) = (app.clone(), closing.subscribe());
                let http = Http {
                    header_read_timeout: limits.header_read_timeout,
                    _permit: permit,
                };
                match &tls {
                    None => {
                        tokio::spawn(serve_connection(stream, peer, app, http, closing));
                    }
                    Some(acceptor) => {
                        tokio::spawn(serve_tls_connection(
                            acceptor.clone(),
                            stream,
                            peer,
                            app,
                            http,
                            closing,
                        ));
                    }
                }
            }
            Err(error) if is_about_one_connection(&error) => {}
            Err(error) => {
                tracing::error!(%error, "accepting a connection failed; retrying in 1 s");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
    drop(listener);
    closing.send_replace(true);
    closing.closed().await;
    Ok(())
}

/// Answers a connection beyond the cap with a 503 and closes it. The plain answer reaches plain
/// HTTP clients; a TLS client sees the connection close, which its SDK retries as well.
async fn refuse_over_capacity(mut stream: TcpStream, peer: SocketAddr) {
    tracing::warn!(%peer, "connection refused: max_connections reached");
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(&over_capacity()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// What every connection is served with: the head's deadline, and its place under the cap
/// (released when the connection's task ends).
struct Http {
    header_read_timeout: Duration,
    _permit: OwnedSemaphorePermit,
}

/// Errors that concern only the connection being accepted: the next accept is unaffected.
fn is_about_one_connection(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Completes the TLS handshake on one connection, then serves it like a plain one. A handshake
/// that fails, stalls past [`HANDSHAKE_TIMEOUT`] or is still under way when the server stops
/// ends the connection.
async fn serve_tls_connection(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    http: Http,
    mut closing: watch::Receiver<bool>,
) {
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
    let stream = tokio::select! {
        outcome = handshake => match outcome {
            Ok(Ok(stream)) => stream,
            // Port scanners, plain-HTTP clients and workers pinned to another certificate end
            // here: routine, so only at debug.
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        },
        _ = closing.wait_for(|closing| *closing) => return,
    };
    serve_connection(stream, peer, app, http, closing).await;
}

/// Runs HTTP/1.1 on one connection until it closes, starting a graceful close when `closing`
/// turns true.
async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    app: Router,
    http: Http,
    mut closing: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        // The router is always ready; `call` needs it mutably, and a clone shares its routes.
        app.clone().call(request)
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(http.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let closing = async {
        // A dropped sender means the server is gone: close as well.
        let _ = closing.wait_for(|closing| *closing).await;
    };
    let outcome = tokio::select! {
        outcome = connection.as_mut() => outcome,
        () = closing => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = outcome {
        // A client hanging up mid-exchange is routine; nothing to report above debug.
        tracing::debug!(%peer, %error, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::{oneshot, Notify};

    const BOUND: Duration = Duration::from_secs(10);

    /// Serves `app` on a fresh loopback port; returns its address, the stop switch and the
    /// server task.
    async fn start(
        app: Router,
    ) -> (
        SocketAddr,
        oneshot::Sender<()>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        start_limited(app, ConnectionLimits::default()).await
    }

    /// [`start`] with `limits`.
    async fn start_limited(
        app: Router,
        limits: ConnectionLimits,
    ) -> (
        SocketAddr,
        oneshot::Sender<()>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, app, None, limits, async {
            let _ = stopped.await;
        }));
        (addr, stop, task)
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_request_head_is_disconnected() {
        let app = Router::new().route("/", get(|| async { "hello" }));
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_millis(300),
            ..ConnectionLimits::default()
        };
        let (addr, _stop, _task) = start_limited(app, limits).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        let started = std::time::Instant::now();
        // A slowloris: the head trickles in and never ends.
        slow.write_all(b"GET / HTTP/1.1\r\nhost: relay\r\n")
            .await
            .unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(BOUND, slow.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "the connection stayed open");
        assert!(started.elapsed() >= Duration::from_millis(250));
        // Others are served as usual.
        let mut fine = TcpStream::connect(addr).await.unwrap();
        assert!(get_on(&mut fine, "/").await.ends_with("hello"));
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_get_a_503_and_a_freed_place_is_reused() {
        let app = Router::new().route("/", get(|| async { "hello" }));
        let limits = ConnectionLimits {
            max_connections: 2,
            ..ConnectionLimits::default()
        };
        let (addr, _stop, _task) = start_limited(app, limits).await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        assert!(get_on(&mut first, "/").await.ends_with("hello"));
        assert!(get_on(&mut second, "/").await.ends_with("hello"));
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut refused = Vec::new();
        tokio::time::timeout(BOUND, third.read_to_end(&mut refused))
            .await
            .expect("refused in time")
            .unwrap();
        let refused = String::from_utf8_lossy(&refused);
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(refused.contains("too_many_connections"), "{refused}");
        assert!(
            refused.to_ascii_lowercase().contains("retry-after: 1"),
            "{refused}"
        );
        drop(first);
        // The closed connection's place frees as its task ends.
        let deadline = std::time::Instant::now() + BOUND;
        loop {
            let mut next = TcpStream::connect(addr).await.unwrap();
            let answer = get_on(&mut next, "/").await;
            if answer.ends_with("hello") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{answer}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends one keep-alive GET on `stream` and reads until the answer's body is complete.
    async fn get_on(stream: &mut TcpStream, path: &str) -> String {
        let request = format!("GET {path} HTTP/1.1\r\nhost: relay\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&answer).contains("\r\n\r\n") || !answer_complete(&answer) {
            let n = tokio::time::timeout(BOUND, stream.read(&mut buf))
                .await
                .expect("answer in time")
                .unwrap();
            assert!(n > 0, "connection closed before the answer was complete");
            answer.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(answer).unwrap()
    }

    fn answer_complete(answer: &[u8]) -> bool {
        let text = String::from_utf8_lossy(answer);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            return false;
        };
        let length = head
            .lines()
            .find_map(|line| {
                line.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(str::to_string)
            })
            .and_then(|value| value.trim().parse::<usize>().ok())
            .unwrap_or(0);
        body.len() >= length
    }

    #[tokio::test]
    async fn handlers_see_the_peer_address_as_connect_info() {
        let app = Router::new().route(
            "/peer",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
        );
        let (addr, _stop, _task) = start(app).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let answer = get_on(&mut stream, "/peer").await;
        let local = stream.local_addr().unwrap().to_string();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with(&local), "{answer} should name {local}");
    }

    #[tokio::test]
    async fn stopping_closes_idle_keep_alive_connections_and_returns() {
        let app = Router::new().route("/", get(|| async { "hello" }));
        let (addr, stop, task) = start(app).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // Two exchanges on one connection: it is kept alive.
        assert!(get_on(&mut stream, "/").await.ends_with("hello"));
        assert!(get_on(&mut stream, "/").await.ends_with("hello"));
        stop.send(()).unwrap();
        tokio::time::timeout(BOUND, task)
            .await
            .expect("server returned in time")
            .unwrap()
            .unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(BOUND, stream.read_to_end(&mut rest)).await;
        assert!(
            matches!(read, Ok(Ok(0))),
            "idle connection closed: {read:?}"
        );
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "no longer accepting"
        );
    }

    #[tokio::test]
    async fn a_request_in_flight_when_stopping_still_gets_its_answer() {
        let release = std::sync::Arc::new(Notify::new());
        let entered = std::sync::Arc::new(Notify::new());
        let app = Router::new().route(
            "/slow",
            get({
                let (release, entered) = (release.clone(), entered.clone());
                || async move {
                    entered.notify_one();
                    release.notified().await;
                    "done"
                }
            }),
        );
        let (addr, stop, task) = start(app).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let client = tokio::spawn(async move { get_on(&mut stream, "/slow").await });
        entered.notified().await;
        stop.send(()).unwrap();
        let mut task = task;
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut task)
                .await
                .is_err(),
            "the server waits for the exchange in flight"
        );
        release.notify_one();
        let answer = tokio::time::timeout(BOUND, client).await.unwrap().unwrap();
        assert!(answer.ends_with("done"), "{answer}");
        tokio::time::timeout(BOUND, task)
            .await
            .expect("server returned once the answer was sent")
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn over_tls_a_stalled_handshake_does_not_hold_up_other_connections() {
        let dir = std::env::temp_dir().join(format!(
            "modelrelay-serve-tls-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let tls = crate::tls::ServerTls::self_signed(&dir, &["localhost".to_string()]).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let app = Router::new().route("/", get(|| async { "hello" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(
            listener,
            app,
            Some(tls.acceptor().clone()),
            ConnectionLimits::default(),
            async {
                let _ = stopped.await;
            },
        ));
        // Connected, but never says a word: its handshake waits in its own task.
        let _stalled = TcpStream::connect(addr).await.unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let connector =
            tokio_rustls::TlsConnector::from(crate::tls::pinned::client_config(tls.fingerprint()));
        let mut stream = tokio::time::timeout(BOUND, connector.connect(name, tcp))
            .await
            .expect("handshake in time")
            .expect("handshake");
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: relay\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(BOUND, stream.read_to_string(&mut answer))
            .await
            .expect("answer in time")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("hello"), "{answer}");
        // Stopping ends the stalled handshake too.
        stop.send(()).unwrap();
        tokio::time::timeout(BOUND, task)
            .await
            .expect("server returned in time")
            .unwrap()
            .unwrap();
    }

    #[test]
    fn only_errors_about_one_connection_keep_the_loop_accepting_at_once() {
        use std::io::{Error, ErrorKind};
        assert!(is_about_one_connection(&Error::from(
            ErrorKind::ConnectionAborted
        )));
        assert!(is_about_one_connection(&Error::from(
            ErrorKind::ConnectionReset
        )));
        // Out of descriptors: pausing lets the condition clear instead of spinning.
        assert!(!is_about_one_connection(&Error::from_raw_os_error(
            libc::EMFILE
        )));
    }
}
