//! Turning a request's answer events into an HTTP response: waiting for the first event under the
//! queue and request deadlines, passing non-streaming answers through, and bridging streams to SSE.
//! The events come from a worker through the hub, or from an upstream called in-process (the
//! backend module's events); either way the client gets the same coalescing, deadline,
//! cancellation and dashboard accounting.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};

use crate::proxy::edge::passthrough;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::{sleep_until, Instant, Sleep};

use crate::backend::BackendEvent;
use crate::dialect::{ApiError, Dialect};
use crate::protocol::{CancelReason, ResponseCompleteMessage};
use crate::proxy::dispatch::hub::{fail_error, Hub, ResponseEvent, WaitingBytes};
use crate::proxy::dispatch::hub::{FailReason, RequestId, Telemetry, TrackedRequest};

/// Chunks already waiting are merged into one write up to this size.
const COALESCE_LIMIT: usize = 64 * 1024;

/// How long a stream whose `data: [DONE]` went out waits, once its client hung up, for the
/// worker's `response_complete` (which follows at once) before cancelling as usual.
const AFTER_DONE_WAIT: Duration = Duration::from_secs(2);

/// A streaming waiter as its body holds it: dropping the body (the stream ended, or the client
/// hung up) goes through [`Waiter::body_dropped`].
struct Streaming(Option<Waiter>);

impl Drop for Streaming {
    fn drop(&mut self) {
        if let Some(waiter) = self.0.take() {
            waiter.body_dropped();
        }
    }
}

/// Cancels its request when dropped while armed: the HTTP future or stream body is dropped
/// exactly when the client disconnects, so this is where cancellation starts.
pub struct CancelGuard {
    target: CancelTarget,
    armed: bool,
}

/// What a cancel stops.
enum CancelTarget {
    /// A request of the hub (queued, or on a worker).
    Hub { hub: Arc<Hub>, request: RequestId },
    /// The task calling an upstream: aborting it closes the upstream connection. The hub
    /// counts its own cancels; these are counted here.
    Task(AbortHandle, Arc<Telemetry>),
}

impl CancelGuard {
    /// Arms a guard for the hub's `request`.
    pub fn new(hub: Arc<Hub>, request: RequestId) -> Self {
        CancelGuard {
            target: CancelTarget::Hub { hub, request },
            armed: true,
        }
    }

    /// Arms a guard that aborts `task`, counting the cancel in `telemetry`.
    pub fn task(task: AbortHandle, telemetry: Arc<Telemetry>) -> Self {
        CancelGuard {
            target: CancelTarget::Task(task, telemetry),
            armed: true,
        }
    }

    /// The request ended normally: nothing to cancel.
    pub fn disarm(&mut self) {
        self.armed = false;
    }

    /// Cancels now for `reason` (and not again on drop).
    pub fn cancel(&mut self, reason: CancelReason) {
        if self.armed {
            self.armed = false;
            match &self.target {
                CancelTarget::Hub { hub, request } => hub.cancel(*request, reason),
                CancelTarget::Task(task, telemetry) => {
                    task.abort();
                    telemetry.cancelled(reason);
                }
            }
        }
    }

    /// Takes the request out of the queue if it still waits there (then it is over): the error
    /// to answer.
    fn expire_queued(&mut self) -> Option<ApiError> {
        let expired = match &self.target {
            CancelTarget::Hub { hub, request } => hub.expire_queued(*request),
            CancelTarget::Task(..) => None,
        };
        if expired.is_some() {
            self.disarm();
        }
        expired
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.cancel(CancelReason::ClientDisconnect);
    }
}

/// Where a waiting client's answer comes from.
pub enum AnswerSource {
    /// A worker, through the hub (which may also requeue the request); `waiting` counts the
    /// stream bytes in the channel, taken off here as the client reads them.
    Hub {
        /// The answer's events.
        events: mpsc::UnboundedReceiver<ResponseEvent>,
        /// Stream bytes sent and not yet read.
        waiting: WaitingBytes,
    },
    /// An upstream called in-process. The channel is short, so a slow client slows the upstream
    /// read instead of filling memory; the stream is bounded by `limit` bytes (the hub path
    /// bounds worker streams where they arrive).
    Upstream {
        /// The upstream's name, for errors.
        name: String,
        /// The backend module's events.
        events: mpsc::Receiver<BackendEvent>,
        /// Stream bytes so far.
        sent: u64,
        /// The most stream bytes passed on.
        limit: u64,
        /// Whether the channel ended (its end was reported once).
        ended: bool,
    },
}

/// Takes a chunk's bytes off the count of those waiting for the client.
fn taken(waiting: &WaitingBytes, event: &Option<ResponseEvent>) {
    if let Some(ResponseEvent::Chunk(bytes)) = event {
        waiting.fetch_sub(bytes.len(), std::sync::atomic::Ordering::Relaxed);
    }
}

impl AnswerSource {
    /// The next event; `None` when there is nothing more.
    async fn recv(&mut self) -> Option<ResponseEvent> {
        match self {
            AnswerSource::Hub { events, waiting } => {
                let event = events.recv().await;
                taken(waiting, &event);
                event
            }
            AnswerSource::Upstream { events, .. } => {
                let event = events.recv().await;
                self.upstream_event(event)
            }
        }
    }

    /// An event that is already waiting.
    fn try_recv(&mut self) -> Option<ResponseEvent> {
        match self {
            AnswerSource::Hub { events, waiting } => {
                let event = events.try_recv().ok();
                taken(waiting, &event);
                event
            }
            AnswerSource::Upstream { events, .. } => match events.try_recv() {
                Ok(event) => self.upstream_event(Some(event)),
                Err(mpsc::error::TryRecvError::Disconnected) => self.upstream_event(None),
                Err(mpsc::error::TryRecvError::Empty) => None,
            },
        }
    }

    /// An upstream's event as the client's: a failure, an overlong stream or a task that ended
    /// without an answer becomes the relay's error naming the upstream.
    fn upstream_event(&mut self, event: Option<BackendEvent>) -> Option<ResponseEvent> {
        let AnswerSource::Upstream {
            name,
            sent,
            limit,
            ended,
            ..
        } = self
        else {
            unreachable!("only called for upstreams")
        };
        if *ended {
            return None;
        }
        let failed = |why: &str| {
            ResponseEvent::Failed(Box::new(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                format!("upstream {name} failed: {why}"),
            )))
        };
        Some(match event {
            Some(BackendEvent::Chunk(text)) => {
                *sent += text.len() as u64;
                if *sent > *limit {
                    *ended = true;
                    return Some(ResponseEvent::Failed(Box::new(ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        "stream_too_large",
                        format!("the upstream's answer exceeds {limit} bytes"),
                    ))));
                }
                ResponseEvent::Chunk(Bytes::from(text))
            }
            Some(BackendEvent::Complete(answer)) => ResponseEvent::Complete(
                Box::new(ResponseCompleteMessage {
                    request_id: String::new(),
                    status_code: answer.status.as_u16(),
                    headers: answer.headers,
                    body: answer.body,
                    token_counts: answer.token_counts,
                    timings: answer.timings,
                }),
                None,
            ),
            Some(BackendEvent::Failed(failure)) => failed(&failure.message),
            None => {
                *ended = true;
                failed("no answer")
            }
        })
    }
}

/// Watches an answer on its way to the client; the Responses store records completed answers
/// this way. Only requests that set one pay anything for it.
pub trait AnswerObserver: Send {
    /// A whole (non-streaming) answer, before it is sent; it may be rewritten.
    fn complete(&mut self, complete: &mut ResponseCompleteMessage);
    /// Bytes of a streaming answer, as they are sent.
    fn chunk(&mut self, bytes: &[u8]);
}

/// A request in flight, from the client's side.
pub struct Waiter {
    guard: CancelGuard,
    events: AnswerSource,
    /// The end of the request's life, fixed at arrival.
    deadline: Instant,
    /// A timer for `deadline`, made once: a stream waits on it for every chunk, and a timer made
    /// per wait would be registered with the runtime's timer wheel and removed again each time.
    deadline_timer: Pin<Box<Sleep>>,
    /// While queued: when to give up waiting.
    queue_deadline: Option<Instant>,
    dialect: Dialect,
    /// A terminal event found while coalescing chunks, handled on the next poll.
    pending_terminal: Option<ResponseEvent>,
    /// Sees the answer as it goes out.
    observer: Option<Box<dyn AnswerObserver>>,
    /// Records time to first byte, tokens and the outcome for the dashboard.
    tracked: Option<TrackedRequest>,
}

impl Waiter {
    /// Waits on `events` for `guard`'s request until `deadline`; `queue_deadline` is set while
    /// the request is queued.
    pub fn new(
        guard: CancelGuard,
        events: AnswerSource,
        deadline: Instant,
        queue_deadline: Option<Instant>,
        dialect: Dialect,
    ) -> Self {
        Waiter {
            guard,
            events,
            deadline,
            deadline_timer: Box::pin(sleep_until(deadline)),
            queue_deadline,
            dialect,
            pending_terminal: None,
            observer: None,
            tracked: None,
        }
    }

    /// Records the request's progress in `tracked`.
    pub fn track(mut self, tracked: TrackedRequest) -> Self {
        self.tracked = Some(tracked);
        self
    }

    /// The relay answers with `error` instead of the backend.
    fn relay_error(&mut self, error: ApiError) -> Response {
        if let Some(tracked) = self.tracked.as_mut() {
            tracked.fail(error.status.as_u16());
        }
        error.into_response(self.dialect)
    }

    /// The same, mid-stream: the error as an SSE event that ends the stream.
    fn relay_error_sse(&mut self, error: &ApiError) -> Bytes {
        if let Some(tracked) = self.tracked.as_mut() {
            tracked.fail(error.status.as_u16());
        }
        error.to_sse(self.dialect)
    }

    /// Lets `observer` see the answer as it goes out.
    pub fn observe(mut self, observer: Option<Box<dyn AnswerObserver>>) -> Self {
        self.observer = observer;
        self
    }

    /// Waits for the answer's first event and builds the response.
    pub async fn respond(mut self) -> Response {
        let first = loop {
            tokio::select! {
                event = self.events.recv() => match event {
                    Some(ResponseEvent::Requeued { queue_deadline }) => {
                        self.queue_deadline = Some(Instant::from_std(queue_deadline));
                    }
                    Some(event) => break event,
                    None => break ResponseEvent::Failed(Box::new(lost_request())),
                },
                _ = sleep_until(self.queue_deadline.unwrap_or(self.deadline)), if self.queue_deadline.is_some() => {
                    if let Some(timeout) = self.guard.expire_queued() {
                        return self.relay_error(timeout);
                    }
                    self.queue_deadline = None;
                }
                _ = self.deadline_timer.as_mut() => {
                    self.guard.cancel(CancelReason::Timeout);
                    return self.relay_error(fail_error(FailReason::RequestTimeout));
                }
            }
        };
        match first {
            ResponseEvent::Chunk(bytes) => self.stream(bytes),
            ResponseEvent::Complete(mut complete, worker) => {
                self.guard.disarm();
                if let Some(observer) = self.observer.as_mut() {
                    observer.complete(&mut complete);
                }
                if let Some(tracked) = self.tracked.as_mut() {
                    tracked.complete(complete.status_code, complete.token_counts.as_ref(), worker);
                }
                match pass_through(*complete) {
                    Ok(response) => response,
                    Err(refused) => self.relay_error(refused),
                }
            }
            ResponseEvent::Failed(error) => {
                self.guard.disarm();
                self.relay_error(*error)
            }
            ResponseEvent::Requeued { .. } => unreachable!("handled in the loop"),
        }
    }

    fn stream(self, first: Bytes) -> Response {
        let body = futures_util::stream::unfold(
            (Streaming(Some(self)), Some(first), false),
            |(mut streaming, first, done)| async move {
                if done {
                    return None;
                }
                let waiter = streaming.0.as_mut()?;
                let (bytes, done) = match first {
                    Some(first) => (waiter.coalesce(first), false),
                    None => waiter.next_piece().await?,
                };
                if let Some(observer) = waiter.observer.as_mut() {
                    observer.chunk(&bytes);
                }
                if let Some(tracked) = waiter.tracked.as_mut() {
                    tracked.chunk(&bytes);
                }
                Some((Ok::<_, Infallible>(bytes), (streaming, None, done)))
            },
        );
        sse_response(Body::from_stream(body))
    }

    /// The stream's body was dropped: it ended, or its client hung up. A client that reads an
    /// OpenAI stream to `data: [DONE]` often hangs up (the OpenAI SDK does) before the worker's
    /// `response_complete` is read: then the answer is whole and the request as good as over,
    /// so instead of a cancel it gets a moment for that report, which carries the backend's
    /// status and usage for the metrics. Every other hang-up cancels at once, as before.
    fn body_dropped(self) {
        let delivered =
            self.guard.armed && self.tracked.as_ref().is_some_and(TrackedRequest::delivered);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if delivered {
            runtime.spawn(async move {
                let mut waiter = self;
                let _ = tokio::time::timeout(AFTER_DONE_WAIT, waiter.await_end()).await;
                // Dropped here: a guard still armed (no report in time) cancels.
            });
        }
    }

    /// Waits for the end of an answer whose client left after the whole of it: the worker's
    /// report ends it normally.
    async fn await_end(&mut self) {
        loop {
            let event = match self.pending_terminal.take() {
                Some(event) => Some(event),
                None => self.events.recv().await,
            };
            match event {
                Some(ResponseEvent::Chunk(_)) => continue,
                Some(ResponseEvent::Complete(complete, worker)) => {
                    self.guard.disarm();
                    if let Some(tracked) = self.tracked.as_mut() {
                        tracked.complete(
                            complete.status_code,
                            complete.token_counts.as_ref(),
                            worker,
                        );
                    }
                    return;
                }
                Some(ResponseEvent::Failed(_) | ResponseEvent::Requeued { .. }) | None => return,
            }
        }
    }

    /// Appends chunks that are already waiting, so a burst becomes one write.
    fn coalesce(&mut self, first: Bytes) -> Bytes {
        let mut merged: Option<BytesMut> = None;
        while merged.as_ref().map_or(first.len(), |m| m.len()) < COALESCE_LIMIT {
            match self.events.try_recv() {
                Some(ResponseEvent::Chunk(more)) => {
                    merged
                        .get_or_insert_with(|| BytesMut::from(&first[..]))
                        .extend_from_slice(&more);
                }
                Some(other) => {
                    self.pending_terminal = Some(other);
                    break;
                }
                None => break,
            }
        }
        merged.map_or(first, BytesMut::freeze)
    }

    /// The next bytes of the stream and whether the stream ends after them; `None` when it has
    /// ended cleanly.
    async fn next_piece(&mut self) -> Option<(Bytes, bool)> {
        let event = match self.pending_terminal.take() {
            Some(event) => Some(event),
            None => tokio::select! {
                event = self.events.recv() => event,
                _ = self.deadline_timer.as_mut() => {
                    self.guard.cancel(CancelReason::Timeout);
                    return Some((self.relay_error_sse(&fail_error(FailReason::RequestTimeout)), true));
                }
            },
        };
        match event {
            Some(ResponseEvent::Chunk(bytes)) => Some((self.coalesce(bytes), false)),
            Some(ResponseEvent::Complete(mut complete, worker)) => {
                // The protocol lets a worker send a stream's tail as `response_complete`'s body:
                // it goes out as the last piece (counted like any chunk), then the completion
                // ends the stream.
                if let Some(tail) = complete.body.take().filter(|tail| !tail.is_empty()) {
                    self.pending_terminal = Some(ResponseEvent::Complete(complete, worker));
                    return Some((Bytes::from(tail), false));
                }
                self.guard.disarm();
                if let Some(tracked) = self.tracked.as_mut() {
                    tracked.complete(complete.status_code, complete.token_counts.as_ref(), worker);
                }
                None
            }
            Some(ResponseEvent::Failed(error)) => {
                self.guard.disarm();
                Some((self.relay_error_sse(&error), true))
            }
            Some(ResponseEvent::Requeued { .. }) | None => {
                Some((self.relay_error_sse(&lost_request()), true))
            }
        }
    }
}

fn lost_request() -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "request_lost",
        "the relay lost track of this request; retry it",
    )
}

/// A streaming answer: SSE headers, and `X-Accel-Buffering: no` so reverse proxies such as nginx
/// pass each chunk on at once instead of buffering the stream.
pub fn sse_response(body: Body) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    response
}

/// The backend's status, headers and body, as the worker reported them, through the relay's
/// filter ([`passthrough`]): an answer it refuses (a status outside 200–599, a content type no
/// inference API returns) is the error to send instead.
pub fn pass_through(complete: ResponseCompleteMessage) -> Result<Response, ApiError> {
    let status = passthrough::status(complete.status_code)?;
    let content_type = complete
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| value.as_str());
    passthrough::content_type(content_type, complete.status_code)?;
    let mut response = Response::new(Body::from(complete.body.unwrap_or_default()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in &complete.headers {
        if let Some((name, value)) = passthrough::allowed_header(name, value) {
            headers.append(name, value);
        }
    }
    headers
        .entry(header::CONTENT_TYPE)
        .or_insert(HeaderValue::from_static("application/json"));
    passthrough::harden(headers);
    Ok(response)
}
