//! Holding back one stream of a worker whose client reads slower than the backend writes.
//!
//! Every stream's bytes that wait for their client are counted ([`crate::proxy::dispatch::hub::WaitingBytes`]).
//! Above a high-water mark the worker's connection asks the worker to stop reading that request's
//! backend for now (the `paused_requests` field of `ping`); once the client has caught up below a
//! low-water mark it lets the stream go again. The backlog then waits in the backend's socket
//! instead of the proxy's memory, and the worker's other streams keep their pace, which the
//! worker's connection-wide flow window could not give: it holds back every stream alike.
//!
//! A worker that ignores the field (the published one) is still bounded: past
//! `max_buffered_stream_bytes` its stream is ended.

use std::collections::HashSet;

use crate::proxy::dispatch::scheduler::{request_wire_id, RequestId};

/// The most a stream may have waiting before it is paused, whatever the hard bound: a few
/// hundred kilobytes are seconds of tokens, plenty to ride out a client's hiccup, and every
/// paused stream costs the proxy no more than this (plus what was already on its way).
const PAUSE_ABOVE_AT_MOST: usize = 256 * 1024;

/// The paused streams of one worker connection.
#[derive(Debug)]
pub struct StreamPauses {
    /// A stream with more than this waiting is paused.
    pause_above: usize,
    /// A paused stream with less than this waiting is resumed.
    resume_below: usize,
    paused: HashSet<RequestId>,
    /// The set changed since the worker was last told.
    changed: bool,
}

impl StreamPauses {
    /// Pauses well before `max_buffered_stream_bytes` ends a stream: what the worker had already
    /// sent when the pause reaches it (its window and one merged message) must still fit.
    pub fn new(max_buffered_stream_bytes: usize) -> StreamPauses {
        let pause_above = (max_buffered_stream_bytes / 4).min(PAUSE_ABOVE_AT_MOST);
        StreamPauses {
            pause_above,
            resume_below: pause_above / 4,
            paused: HashSet::new(),
            changed: false,
        }
    }

    /// A chunk of `request` arrived and `waiting` of its bytes now wait for the client.
    pub fn after_chunk(&mut self, request: RequestId, waiting: usize) {
        if waiting > self.pause_above && self.paused.insert(request) {
            self.changed = true;
        }
    }

    /// Resumes every paused stream whose client caught up; `waiting` gives a stream's bytes
    /// still waiting, `None` for one that ended.
    pub fn resume_caught_up(&mut self, waiting: impl Fn(RequestId) -> Option<usize>) {
        let resume_below = self.resume_below;
        let before = self.paused.len();
        self.paused
            .retain(|&request| waiting(request).is_some_and(|bytes| bytes >= resume_below));
        self.changed |= self.paused.len() != before;
    }

    /// `request` ended. The worker drops it from its own set when the request ends there, so
    /// this does not need telling.
    pub fn forget(&mut self, request: RequestId) {
        self.paused.remove(&request);
    }

    /// Whether any stream is paused (the connection then checks for clients that caught up).
    pub fn any(&self) -> bool {
        !self.paused.is_empty()
    }

    /// The whole set as wire ids, when the worker has not been told of it yet.
    pub fn take_update(&mut self) -> Option<Vec<String>> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        let mut ids: Vec<String> = self.paused.iter().map(|&r| request_wire_id(r)).collect();
        ids.sort();
        Some(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_stream_is_paused_above_the_high_mark_and_resumed_below_the_low_one() {
        let mut pauses = StreamPauses::new(16 * 1024 * 1024);
        assert_eq!(pauses.pause_above, PAUSE_ABOVE_AT_MOST);
        let (a, b): (RequestId, RequestId) = (1, 2);
        pauses.after_chunk(a, 1000);
        assert!(!pauses.any() && pauses.take_update().is_none());
        pauses.after_chunk(a, PAUSE_ABOVE_AT_MOST + 1);
        pauses.after_chunk(b, PAUSE_ABOVE_AT_MOST + 1);
        let told = pauses.take_update().expect("changed");
        assert_eq!(told, vec![request_wire_id(a), request_wire_id(b)]);
        pauses.after_chunk(a, PAUSE_ABOVE_AT_MOST * 2);
        assert!(
            pauses.take_update().is_none(),
            "already paused: nothing new"
        );

        // Between the marks nothing changes; below the low one a stream resumes.
        let mut waiting = HashMap::from([(a, PAUSE_ABOVE_AT_MOST / 2), (b, 100)]);
        pauses.resume_caught_up(|r| waiting.get(&r).copied());
        assert_eq!(
            pauses.take_update().expect("b resumed"),
            vec![request_wire_id(a)]
        );
        waiting.remove(&a);
        pauses.resume_caught_up(|r| waiting.get(&r).copied());
        assert_eq!(pauses.take_update().expect("a ended"), Vec::<String>::new());
        assert!(!pauses.any());
    }

    #[test]
    fn a_forgotten_stream_leaves_the_set_without_telling_the_worker() {
        let mut pauses = StreamPauses::new(64 * 1024);
        assert_eq!(pauses.pause_above, 16 * 1024, "a quarter of a small bound");
        pauses.after_chunk(7, 20 * 1024);
        assert!(pauses.take_update().is_some());
        pauses.forget(7);
        assert!(!pauses.any());
        assert!(pauses.take_update().is_none());
    }
}
