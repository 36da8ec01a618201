//! The order in which request tasks' messages go to the proxy.
//!
//! All requests share one WebSocket, so whatever is queued for it delays everything behind it.
//! Each request task therefore reports through a short channel of its own (a *lane*) instead of
//! one shared queue:
//!
//! - a lane that has sent nothing yet is *fresh*: its first message (a stream's first chunk, or a
//!   whole non-streaming answer) goes out before any other request's later messages, because a
//!   client is waiting for its first byte and nothing of that request can be ahead of it; a
//!   request's own messages stay in order, since its next message is only taken once its first
//!   one is out;
//! - started lanes take turns, one message each, so one fast stream cannot hold back the others;
//!   the chunks a lane has waiting when its turn comes go out as one `response_chunk` (up to
//!   [`MERGE_LIMIT`]), since the proxy's cost is mostly per message (a parse, a wake-up, a write
//!   to the client), not per byte;
//! - a lane holds only [`LANE_CAPACITY`] messages: a request whose messages cannot go out stops
//!   reading its backend, which keeps the backlog per request (in the backend's socket) rather
//!   than in a queue every request waits behind.
//!
//! Started lanes are only read while the caller's flow window is open ([`super::window`]); fresh
//! ones always are. A lane the proxy asked to hold back (its client reads slower than the backend
//! writes) is *parked*: out of the turn, not read at all, so its task stops reading its backend
//! while the other lanes go on; it rejoins the turn when the proxy lets it go.

use std::collections::{HashMap, HashSet};
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, Stream, StreamExt, StreamFuture};
use futures_util::FutureExt;
use tokio::sync::mpsc;

use crate::backend::{BackendEvent, Events};

/// Messages one request task may have waiting. Its messages are already coalesced (every SSE
/// event that arrived in one backend read is one message), so a few are enough to keep it busy.
const LANE_CAPACITY: usize = 4;

/// Waiting chunks are merged into one message up to about this many bytes of SSE text.
const MERGE_LIMIT: usize = 32 * 1024;

/// One request task's messages.
struct Lane {
    request: Arc<str>,
    events: mpsc::Receiver<BackendEvent>,
    /// An event taken out while merging that could not be merged; it comes next.
    held: Option<BackendEvent>,
}

impl Lane {
    /// `event`, with the chunks waiting behind it appended when it is a chunk.
    fn merge_waiting(&mut self, mut event: BackendEvent) -> BackendEvent {
        let BackendEvent::Chunk(first) = &mut event else {
            return event;
        };
        while first.len() < MERGE_LIMIT {
            match self.events.try_recv() {
                Ok(BackendEvent::Chunk(more)) => first.push_str(&more),
                Ok(other) => {
                    self.held = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        event
    }
}

impl Stream for Lane {
    type Item = BackendEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<BackendEvent>> {
        let lane = self.get_mut();
        match lane.held.take() {
            Some(event) => Poll::Ready(Some(event)),
            None => lane.events.poll_recv(cx),
        }
    }
}

/// What a lane produced.
pub struct Pulled {
    /// The wire id of the lane's request.
    pub request: Arc<str>,
    /// Its next event, or `None` when its task ended (finished, aborted or panicked).
    pub event: Option<BackendEvent>,
}

/// Every running request's lane.
#[derive(Default)]
pub struct Outbox {
    fresh: FuturesUnordered<StreamFuture<Lane>>,
    started: FuturesUnordered<StreamFuture<Lane>>,
    /// Requests the proxy asked to hold back.
    paused: HashSet<Arc<str>>,
    /// Lanes of paused requests, out of the turn (a lane is parked when it next produces a
    /// message, so at most one more message of a paused request goes out).
    parked: HashMap<Arc<str>, Lane>,
}

impl Outbox {
    /// Opens a lane for `request`; its task reports through the returned sender.
    pub fn open(&mut self, request: &str) -> Events {
        let (sender, events) = mpsc::channel(LANE_CAPACITY);
        let lane = Lane {
            request: Arc::from(request),
            events,
            held: None,
        };
        self.fresh.push(lane.into_future());
        sender
    }

    /// Holds back exactly the lanes of `requests` from now on; lanes no longer in it rejoin the
    /// turn. Called by the loop between two polls, like [`Outbox::open`].
    pub fn set_paused(&mut self, requests: HashSet<Arc<str>>) {
        self.paused = requests;
        let resumed: Vec<Arc<str>> = self
            .parked
            .keys()
            .filter(|request| !self.paused.contains(*request))
            .cloned()
            .collect();
        for request in resumed {
            self.unpark(&request);
        }
    }

    /// Lets `request`'s lane go again (it was cancelled, so its end must be seen).
    pub fn resume(&mut self, request: &str) {
        self.paused.remove(request);
        self.unpark(request);
    }

    fn unpark(&mut self, request: &str) {
        if let Some(lane) = self.parked.remove(request) {
            self.started.push(lane.into_future());
        }
    }

    /// Waits for the next message to write: a fresh lane's first message, else (when `bulk` is
    /// allowed) a started lane's next one.
    ///
    /// Lanes are only opened by the loop that polls this, between two polls, so an empty outbox
    /// can wait without a waker: the loop polls again after opening one.
    pub async fn next(&mut self, bulk: bool) -> Pulled {
        poll_fn(|cx| self.poll_pull(cx, bulk)).await
    }

    /// The next message if one is ready now.
    pub fn try_next(&mut self, bulk: bool) -> Option<Pulled> {
        self.next(bulk).now_or_never()
    }

    fn poll_pull(&mut self, cx: &mut Context<'_>, bulk: bool) -> Poll<Pulled> {
        if let Poll::Ready(Some((event, lane))) = self.fresh.poll_next_unpin(cx) {
            return Poll::Ready(self.requeue(event, lane));
        }
        if bulk {
            if let Poll::Ready(Some((event, lane))) = self.started.poll_next_unpin(cx) {
                return Poll::Ready(self.requeue(event, lane));
            }
        }
        Poll::Pending
    }

    /// Puts a lane that produced a message at the back of the started lanes' turn, or parks it
    /// when its request is held back; a lane that ended is dropped.
    fn requeue(&mut self, event: Option<BackendEvent>, mut lane: Lane) -> Pulled {
        let request = Arc::clone(&lane.request);
        let event = event.map(|event| lane.merge_waiting(event));
        if event.is_none() {
            self.paused.remove(&request);
        } else if self.paused.contains(&request) {
            self.parked.insert(Arc::clone(&request), lane);
        } else {
            self.started.push(lane.into_future());
        }
        Pulled { request, event }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::answer;
    use axum::http::StatusCode;

    fn chunk(text: &str) -> BackendEvent {
        BackendEvent::Chunk(text.to_string())
    }

    fn done() -> BackendEvent {
        answer::json(StatusCode::OK, String::new())
    }

    fn text_of(pulled: Pulled) -> String {
        match pulled.event {
            Some(BackendEvent::Chunk(chunk)) => format!("{}:{chunk}", pulled.request),
            Some(BackendEvent::Complete(_)) => format!("{}:done", pulled.request),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_fresh_lane_goes_before_started_lanes_and_each_lane_stays_in_order() {
        let mut outbox = Outbox::default();
        let a = outbox.open("a");
        a.send(chunk("1")).await.unwrap();
        assert_eq!(text_of(outbox.try_next(true).unwrap()), "a:1");
        a.send(chunk("2")).await.unwrap();
        let b = outbox.open("b");
        b.send(chunk("1")).await.unwrap();
        // b's first chunk overtakes a's backlog.
        assert_eq!(text_of(outbox.try_next(true).unwrap()), "b:1");
        b.send(chunk("2")).await.unwrap();
        a.send(chunk("3")).await.unwrap();
        // Then the two take turns, each sending what it has waiting as one message.
        let order: Vec<String> =
            std::iter::from_fn(|| outbox.try_next(true).map(text_of)).collect();
        assert_eq!(order, ["a:23", "b:2"]);
    }

    #[tokio::test]
    async fn started_lanes_wait_for_bulk_and_fresh_ones_do_not() {
        let mut outbox = Outbox::default();
        let a = outbox.open("a");
        a.send(chunk("1")).await.unwrap();
        assert_eq!(text_of(outbox.try_next(false).unwrap()), "a:1");
        a.send(chunk("2")).await.unwrap();
        assert!(outbox.try_next(false).is_none());
        let b = outbox.open("b");
        b.send(chunk("1")).await.unwrap();
        assert_eq!(text_of(outbox.try_next(false).unwrap()), "b:1");
        assert_eq!(text_of(outbox.try_next(true).unwrap()), "a:2");
    }

    #[tokio::test]
    async fn merging_stops_at_an_event_that_is_not_a_chunk_which_comes_next() {
        let mut outbox = Outbox::default();
        let a = outbox.open("a");
        a.send(chunk("1")).await.unwrap();
        a.send(chunk("2")).await.unwrap();
        a.send(done()).await.unwrap();
        a.send(chunk("late")).await.unwrap();
        assert_eq!(text_of(outbox.try_next(true).unwrap()), "a:12");
        assert_eq!(text_of(outbox.try_next(true).unwrap()), "a:done");
        assert_eq!(text_of(outbox.try_next(true).unwrap()), "a:late");
    }

    fn set(requests: &[&str]) -> HashSet<Arc<str>> {
        requests.iter().map(|r| Arc::from(*r)).collect()
    }

    #[tokio::test]
    async fn a_paused_lane_is_not_read_while_the_others_go_on_and_resumes_in_order() {
        let mut outbox = Outbox::default();
        let a = outbox.open("a");
        let b = outbox.open("b");
        a.send(chunk("1")).await.unwrap();
        b.send(chunk("1")).await.unwrap();
        outbox.set_paused(set(&["a"]));
        // a's first message was already taken from its task: it goes out, then a is parked.
        let mut first: Vec<String> =
            std::iter::from_fn(|| outbox.try_next(true).map(text_of)).collect();
        first.sort();
        assert_eq!(first, ["a:1", "b:1"]);
        for n in 2..=(LANE_CAPACITY + 1) {
            b.send(chunk(&n.to_string())).await.unwrap();
            assert_eq!(text_of(outbox.try_next(true).unwrap()), format!("b:{n}"));
        }
        // a's task fills its lane and then waits, which stops it reading its backend.
        for n in 2..2 + LANE_CAPACITY {
            a.send(chunk(&n.to_string())).await.unwrap();
        }
        assert!(a.try_send(chunk("over")).is_err(), "a's task is held back");
        assert!(outbox.try_next(true).is_none(), "nothing of a goes out");
        outbox.set_paused(set(&[]));
        assert_eq!(text_of(outbox.try_next(true).unwrap()), "a:2345");
        assert!(a.try_send(chunk("6")).is_ok(), "a's task goes on");
    }

    #[tokio::test]
    async fn a_cancelled_paused_lane_is_let_go_so_its_end_is_seen() {
        let mut outbox = Outbox::default();
        let a = outbox.open("a");
        outbox.set_paused(set(&["a"]));
        a.send(chunk("1")).await.unwrap();
        assert_eq!(text_of(outbox.try_next(true).unwrap()), "a:1");
        a.send(chunk("2")).await.unwrap();
        drop(a);
        assert!(outbox.try_next(true).is_none(), "parked");
        outbox.resume("a");
        assert_eq!(text_of(outbox.try_next(true).unwrap()), "a:2");
        assert!(outbox.try_next(true).unwrap().event.is_none());
        assert!(outbox.paused.is_empty() && outbox.parked.is_empty());
    }

    #[tokio::test]
    async fn a_lane_whose_task_ended_reports_its_request_once_then_is_gone() {
        let mut outbox = Outbox::default();
        let a = outbox.open("a");
        a.send(done()).await.unwrap();
        drop(a);
        assert_eq!(text_of(outbox.try_next(true).unwrap()), "a:done");
        let closed = outbox.try_next(true).unwrap();
        assert_eq!(&*closed.request, "a");
        assert!(closed.event.is_none());
        assert!(outbox.fresh.is_empty() && outbox.started.is_empty());
        assert!(outbox.try_next(true).is_none());
    }
}
