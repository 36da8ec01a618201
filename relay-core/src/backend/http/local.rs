//! The worker's own HTTP/1.1 client for its backends: plain HTTP on a local network, one
//! request per connection at a time, idle connections reused.
//!
//! Why not reqwest (which the proxy keeps for its upstreams, where TLS and proxies matter): a
//! burst of thousands of streams is a burst of thousands of backend connections, and two things
//! reqwest's hyper client cannot do decide how that burst goes.
//!
//! - **Connects are bounded until the backend's first byte.** A backend's listen queue (128 for
//!   llama-server) holds connections the kernel has established and the server has not yet
//!   accepted; when it overflows, SYNs are dropped and each costs its request a second. A bound
//!   on connects in flight ends at the handshake and cannot see that queue. Here a new
//!   connection holds one of its backend's [`CONNECTS_PER_BACKEND`] permits until the first
//!   byte of the answer arrives, which a backend only sends after accepting it; a request on a
//!   pooled connection needs no permit, and one waiting for a permit takes a connection that is
//!   given back first.
//! - **A stream costs a task and a small buffer.** hyper's client gives every connection a task,
//!   a request channel and 8 KiB read and write buffers (≈ 25 KB resident per open stream,
//!   BENCHMARKS.md); here the request's own task reads its socket into a buffer that starts at
//!   [`READ_START`] bytes and grows only for bodies that fill it.
//!
//! The head and body framing are in [`super::framing`]; this module only moves bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::framing::{self, BodyLength, ChunkedDecoder};
use super::HttpError;

/// New connections to one backend that may be waiting for its first byte at once (its listen
/// queue holds 128; a few dozen connects at a time open 2,000 connections in tens of
/// milliseconds on a local network).
pub const CONNECTS_PER_BACKEND: usize = 32;

/// A new connection gives its permit back after this long without an answer even so: a backend
/// that sends nothing until it has finished (a non-streamed answer) has long accepted it, and
/// holding the permit would limit such a backend to [`CONNECTS_PER_BACKEND`] requests at once
/// until the first answers end.
const ACCEPT_GRACE: Duration = Duration::from_secs(1);

/// A connect that takes longer than this fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The read buffer a request starts with: an SSE event or a response head fits.
const READ_START: usize = 2 * 1024;

/// The most a read buffer grows to, for long bodies read in full.
const READ_MOST: usize = 64 * 1024;

/// The worker's client for plain-HTTP backends. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct LocalClient {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Idle connections kept per backend at most.
    max_idle: usize,
    /// How long an idle connection may be reused.
    idle_reuse: Duration,
    backends: Mutex<HashMap<String, Arc<BackendPool>>>,
}

/// One backend's idle connections and connect permits.
#[derive(Debug)]
struct BackendPool {
    idle: Mutex<IdleConnections>,
    permits: Arc<Semaphore>,
    /// Wakes requests waiting for a permit when a connection is given back.
    given_back: Notify,
}

#[derive(Debug, Default)]
struct IdleConnections {
    /// Oldest first.
    connections: Vec<Idle>,
    /// Whether a task is closing the expired ones ([`reap`]).
    reaping: bool,
}

#[derive(Debug)]
struct Idle {
    stream: TcpStream,
    since: Instant,
}

impl LocalClient {
    /// A client keeping at most `max_idle` idle connections per backend, each reused for at most
    /// `idle_reuse` after its last answer.
    pub fn new(max_idle: usize, idle_reuse: Duration) -> Self {
        LocalClient {
            shared: Arc::new(Shared {
                max_idle,
                idle_reuse,
                backends: Mutex::default(),
            }),
        }
    }

    /// Idle connections kept for `authority` now (for tests and diagnostics).
    pub fn idle_connections(&self, authority: &str) -> usize {
        let pool = lock(&self.shared.backends).get(authority).cloned();
        pool.map_or(0, |pool| lock(&pool.idle).connections.len())
    }

    fn pool(&self, authority: &str) -> Arc<BackendPool> {
        let mut backends = lock(&self.shared.backends);
        backends
            .entry(authority.to_string())
            .or_insert_with(|| {
                Arc::new(BackendPool {
                    idle: Mutex::default(),
                    permits: Arc::new(Semaphore::new(CONNECTS_PER_BACKEND)),
                    given_back: Notify::new(),
                })
            })
            .clone()
    }

    /// POSTs `request` (a whole request, [`framing::post_request`]) to `authority` and reads the
    /// answer's head. The body is read from the returned response.
    pub async fn send(&self, authority: &str, request: &[u8]) -> Result<LocalResponse, HttpError> {
        let pool = self.pool(authority);
        let mut connection = self.connection(authority, &pool).await?;
        connection.write_request(request).await?;
        let head = connection.read_head().await?;
        let length = framing::body_length(&head).map_err(HttpError::framing)?;
        Ok(LocalResponse {
            status: head.status,
            headers: head.headers,
            body: Body {
                framing: match length {
                    BodyLength::Empty => Framing::Done,
                    BodyLength::Exact(remaining) => Framing::Exact { remaining },
                    BodyLength::Chunked => Framing::Chunked(ChunkedDecoder::default()),
                    BodyLength::UntilClose => Framing::UntilClose,
                },
                reusable: head.keep_alive && length != BodyLength::UntilClose,
                connection: Some(connection),
                client: self.clone(),
                authority: authority.to_string(),
            },
        })
    }

    /// A pooled connection to `authority`, or a new one once a permit is free (whichever comes
    /// first).
    async fn connection(
        &self,
        authority: &str,
        pool: &Arc<BackendPool>,
    ) -> Result<Connection, HttpError> {
        loop {
            if let Some(stream) = self.checkout(pool) {
                return Ok(Connection::pooled(stream));
            }
            let given_back = pool.given_back.notified();
            tokio::select! {
                permit = pool.permits.clone().acquire_owned() => {
                    let permit = permit.expect("the permits are never closed");
                    // A connection given back while this request waited is used instead.
                    if let Some(stream) = self.checkout(pool) {
                        return Ok(Connection::pooled(stream));
                    }
                    return Connection::open(authority, permit).await;
                }
                () = given_back => continue,
            }
        }
    }

    /// The most recently used idle connection that is still open and within its reuse time.
    fn checkout(&self, pool: &BackendPool) -> Option<TcpStream> {
        let mut idle = lock(&pool.idle);
        while let Some(Idle { stream, since }) = idle.connections.pop() {
            if since.elapsed() < self.shared.idle_reuse && still_open(&stream) {
                return Some(stream);
            }
        }
        None
    }

    /// Keeps `stream`, whose answer was read to its end, for the next request to `authority`.
    fn give_back(&self, authority: &str, stream: TcpStream) {
        let pool = self.pool(authority);
        let start_reaper = {
            let mut idle = lock(&pool.idle);
            if idle.connections.len() >= self.shared.max_idle {
                return;
            }
            idle.connections.push(Idle {
                stream,
                since: Instant::now(),
            });
            !std::mem::replace(&mut idle.reaping, true)
        };
        pool.given_back.notify_one();
        if start_reaper {
            tokio::spawn(reap(pool, self.shared.idle_reuse));
        }
    }
}

/// Closes `pool`'s idle connections as they expire; runs only while there are some (an idle
/// worker wakes for nothing), and ends when none are left.
async fn reap(pool: Arc<BackendPool>, idle_reuse: Duration) {
    loop {
        let oldest = {
            let mut idle = lock(&pool.idle);
            idle.connections
                .retain(|connection| connection.since.elapsed() < idle_reuse);
            match idle.connections.first() {
                Some(oldest) => oldest.since,
                None => {
                    idle.reaping = false;
                    return;
                }
            }
        };
        tokio::time::sleep_until((oldest + idle_reuse).into()).await;
    }
}

/// Whether an idle connection is still open: the backend may have closed it (its own idle
/// timeout) or, against the protocol, sent bytes nobody asked for.
fn still_open(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A connection carrying one request, and what of its answer has arrived.
#[derive(Debug)]
struct Connection {
    stream: TcpStream,
    /// A new connection's permit, held until the backend's first byte (or [`ACCEPT_GRACE`]
    /// after the connect).
    permit: Option<OwnedSemaphorePermit>,
    connected: tokio::time::Instant,
    /// Whether it was reused from the pool (a close before any answer is then the backend's
    /// idle timeout racing the request, and the request may be sent again).
    reused: bool,
    buffer: BytesMut,
}

impl Connection {
    fn pooled(stream: TcpStream) -> Self {
        Connection {
            stream,
            permit: None,
            connected: tokio::time::Instant::now(),
            reused: true,
            buffer: BytesMut::new(),
        }
    }

    async fn open(authority: &str, permit: OwnedSemaphorePermit) -> Result<Self, HttpError> {
        let connect = TcpStream::connect(authority);
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                return Err(HttpError::io(
                    format!("connecting to {authority} failed"),
                    error,
                ))
            }
            Err(_) => {
                return Err(HttpError::message(format!(
                    "connecting to {authority} timed out after {}s",
                    CONNECT_TIMEOUT.as_secs()
                )))
            }
        };
        // Small writes (a request, then nothing) go out at once.
        let _ = stream.set_nodelay(true);
        Ok(Connection {
            stream,
            permit: Some(permit),
            connected: tokio::time::Instant::now(),
            reused: false,
            buffer: BytesMut::new(),
        })
    }

    async fn write_request(&mut self, request: &[u8]) -> Result<(), HttpError> {
        self.stream
            .write_all(request)
            .await
            .map_err(|error| self.unanswered("sending the request failed", error))
    }

    /// A failure before any byte of the answer: one the caller may send again when the
    /// connection was a reused one.
    fn unanswered(&self, what: &str, error: std::io::Error) -> HttpError {
        HttpError::io(what.to_string(), error).unanswered_if(self.reused)
    }

    /// Reads more of the answer into the buffer: the bytes read (0 at the end of the
    /// connection). Cancel-safe: nothing is read unless it is kept.
    async fn fill(&mut self) -> std::io::Result<usize> {
        if self.buffer.capacity() - self.buffer.len() < READ_START / 2 {
            let grow = if self.buffer.capacity() >= READ_START {
                self.buffer.capacity().min(READ_MOST)
            } else {
                READ_START
            };
            self.buffer.reserve(grow);
        }
        let read = self.stream.read_buf(&mut self.buffer).await?;
        if read > 0 {
            // The backend accepted this connection and answered: it no longer sits in its
            // listen queue.
            self.permit = None;
        }
        Ok(read)
    }

    async fn read_head(&mut self) -> Result<framing::ResponseHead, HttpError> {
        loop {
            if !self.buffer.is_empty() {
                match framing::parse_head(&self.buffer).map_err(HttpError::framing)? {
                    Some(head) if is_interim(head.status) => {
                        let _ = self.buffer.split_to(head.len);
                        continue;
                    }
                    Some(head) => {
                        let _ = self.buffer.split_to(head.len);
                        return Ok(head);
                    }
                    None => {}
                }
            }
            let first = self.buffer.is_empty();
            let filled = if self.permit.is_some() {
                let grace_ends = self.connected + ACCEPT_GRACE;
                match tokio::time::timeout_at(grace_ends, self.fill()).await {
                    Ok(filled) => filled,
                    Err(_) => {
                        self.permit = None;
                        continue;
                    }
                }
            } else {
                self.fill().await
            };
            match filled {
                Ok(0) if first => {
                    return Err(HttpError::message(
                        "the backend closed the connection before answering".to_string(),
                    )
                    .unanswered_if(true))
                }
                Ok(0) => {
                    return Err(HttpError::message(
                        "the backend closed the connection in the middle of its response head"
                            .to_string(),
                    ))
                }
                Ok(_) => {}
                Err(error) if first => {
                    return Err(self.unanswered("reading the backend's answer failed", error))
                }
                Err(error) => {
                    return Err(HttpError::io(
                        "reading the backend's answer failed".to_string(),
                        error,
                    ))
                }
            }
        }
    }
}

/// A 1xx answer other than 101: informational, the real one follows.
fn is_interim(status: StatusCode) -> bool {
    status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS
}

/// A backend's answer: its head, and its body to read.
#[derive(Debug)]
pub struct LocalResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Body,
}

/// A response body being read. Dropped before its end, it closes the connection: the backend
/// sees the cancel.
#[derive(Debug)]
pub struct Body {
    framing: Framing,
    reusable: bool,
    connection: Option<Connection>,
    client: LocalClient,
    authority: String,
}

#[derive(Debug)]
enum Framing {
    Exact { remaining: u64 },
    Chunked(ChunkedDecoder),
    UntilClose,
    Done,
}

impl Body {
    /// The next piece of the body; `None` at its end. Cancel-safe: a piece is either returned
    /// or still buffered.
    pub async fn chunk(&mut self) -> Option<Result<Bytes, HttpError>> {
        loop {
            let connection = self.connection.as_mut()?;
            if matches!(self.framing, Framing::Done) {
                self.finish();
                return None;
            }
            if !connection.buffer.is_empty() {
                match Self::take(&mut self.framing, &mut connection.buffer) {
                    Ok(Some(piece)) => return Some(Ok(piece)),
                    Ok(None) => continue,
                    Err(error) => return Some(Err(self.fail(error))),
                }
            }
            match connection.fill().await {
                Ok(0) if matches!(self.framing, Framing::UntilClose) => {
                    self.framing = Framing::Done;
                }
                Ok(0) => {
                    let error = HttpError::message(
                        "the backend closed the connection in the middle of its answer".into(),
                    );
                    return Some(Err(self.fail(error)));
                }
                Ok(_) => {}
                Err(error) => {
                    let error = HttpError::io("reading the backend's answer failed".into(), error);
                    return Some(Err(self.fail(error)));
                }
            }
        }
    }

    /// The body's data in `buffer` (all of it buffered, or `None` when the bytes were only
    /// framing).
    fn take(framing: &mut Framing, buffer: &mut BytesMut) -> Result<Option<Bytes>, HttpError> {
        match framing {
            Framing::Exact { remaining } => {
                let take = buffer
                    .len()
                    .min(usize::try_from(*remaining).unwrap_or(usize::MAX));
                *remaining -= take as u64;
                if *remaining == 0 {
                    *framing = Framing::Done;
                }
                Ok(Some(buffer.split_to(take).freeze()))
            }
            Framing::UntilClose => Ok(Some(buffer.split().freeze())),
            Framing::Chunked(decoder) => {
                let mut data = Vec::new();
                let taken = decoder
                    .decode(buffer, &mut data)
                    .map_err(HttpError::framing)?;
                let _ = buffer.split_to(taken);
                if decoder.is_done() {
                    *framing = Framing::Done;
                }
                Ok((!data.is_empty()).then(|| Bytes::from(data)))
            }
            Framing::Done => Ok(None),
        }
    }

    /// The body ended: its connection goes back to the pool when it can carry another request
    /// (nothing unasked-for was sent after the body).
    fn finish(&mut self) {
        if let Some(connection) = self.connection.take() {
            if self.reusable && connection.buffer.is_empty() {
                self.client.give_back(&self.authority, connection.stream);
            }
        }
    }

    fn fail(&mut self, error: HttpError) -> HttpError {
        self.connection = None;
        error
    }
}
