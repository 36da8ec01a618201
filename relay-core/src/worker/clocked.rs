//! Which answers timed by the clock may teach the proxy a box's speed.
//!
//! llama-server says how long it evaluated a prompt and generated an answer (`timings`). Ollama,
//! vLLM and LM Studio do not, so the backend module times their streams: the time from sending
//! a request to its first event, and from there to its end, beside the usage they report
//! ([`crate::backend::sse::UsageTracker::clocked`]). That time also counts what the backend did
//! for anything else meanwhile, and a prompt its cache held. So a clocked answer is sent as the
//! answer's timings only when
//!
//! - no other request of this worker ran while it did (its prompt waited for nothing the relay
//!   sent), and
//! - the backend said how much of the prompt its cache held (current Ollama, vLLM with
//!   `--enable-prompt-tokens-details`), or the conversation is new to this worker, so no earlier
//!   turn of it can have left its prompt in the cache.
//!
//! Pure bookkeeping: the session calls it as requests start and end.

use std::collections::{HashMap, HashSet};

use crate::backend::{Answer, BackendEvent};

/// Conversations remembered as seen; past it the memory starts again (a conversation then
/// looks new once: one sample whose prompt its cache may have held).
const SEEN_CONVERSATIONS: usize = 4096;

/// What was true when a request started.
#[derive(Debug, Clone, Copy)]
struct Start {
    /// Requests this worker had started, this one included.
    seq: u64,
    /// Nothing else of this worker was running.
    alone: bool,
    /// Its conversation was not seen before (or it has none).
    new_conversation: bool,
}

/// The session's record of its requests' starts.
#[derive(Debug, Default)]
pub struct Clocks {
    started: u64,
    starts: HashMap<String, Start>,
    seen: HashSet<u64>,
}

impl Clocks {
    /// Request `id` of `conversation` starts; `alone`: no other request of the worker is
    /// running.
    pub fn begin(&mut self, id: &str, conversation: Option<u64>, alone: bool) {
        self.started += 1;
        if self.seen.len() >= SEEN_CONVERSATIONS {
            self.seen.clear();
        }
        let new_conversation = conversation.is_none_or(|key| self.seen.insert(key));
        self.starts.insert(
            id.to_string(),
            Start {
                seq: self.started,
                alone,
                new_conversation,
            },
        );
    }

    /// Request `id` ends with `answer`: its clocked time becomes its timings where it may
    /// (see the module), and is dropped otherwise.
    pub fn finish(&mut self, id: &str, answer: &mut Answer) {
        let start = self.starts.remove(id);
        let Some(clocked) = answer.clocked.take() else {
            return;
        };
        let trusted = start.is_some_and(|start| {
            start.alone
                && start.seq == self.started
                && (clocked.cached_tokens.is_some() || start.new_conversation)
        });
        if trusted && answer.timings.is_none() {
            answer.timings = Some(clocked);
        }
    }

    /// Request `id` sent `event`: [`Clocks::finish`] for its answer, [`Clocks::forget`] for
    /// its failure.
    pub fn on_event(&mut self, id: &str, event: &mut BackendEvent) {
        match event {
            BackendEvent::Complete(answer) => self.finish(id, answer),
            BackendEvent::Failed(_) => self.forget(id),
            BackendEvent::Chunk(_) => {}
        }
    }

    /// Request `id` ended without an answer (failed, cancelled).
    pub fn forget(&mut self, id: &str) {
        self.starts.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Timings;
    use axum::http::StatusCode;

    fn clocked(cached: Option<u32>) -> Answer {
        Answer {
            status: StatusCode::OK,
            headers: Default::default(),
            body: None,
            token_counts: None,
            timings: None,
            clocked: Some(Timings {
                prompt_tokens: 1000,
                prompt_ms: 500.0,
                cached_tokens: cached,
                generated_tokens: 40,
                generation_ms: 800.0,
            }),
        }
    }

    /// Whether request `id`'s clocked answer became its timings.
    fn taken(clocks: &mut Clocks, id: &str, cached: Option<u32>) -> bool {
        let mut answer = clocked(cached);
        clocks.finish(id, &mut answer);
        assert!(answer.clocked.is_none(), "never sent as it is");
        answer.timings.is_some()
    }

    #[test]
    fn a_request_alone_on_its_worker_in_a_new_conversation_is_a_speed() {
        let mut clocks = Clocks::default();
        clocks.begin("a", Some(1), true);
        assert!(taken(&mut clocks, "a", None));
        // Without a conversation nothing can have been cached for it either.
        clocks.begin("b", None, true);
        assert!(taken(&mut clocks, "b", None));
    }

    #[test]
    fn a_request_beside_another_is_not() {
        let mut clocks = Clocks::default();
        // Another was running when it started.
        clocks.begin("a", Some(1), true);
        clocks.begin("b", Some(2), false);
        assert!(!taken(&mut clocks, "b", None));
        // Another started while it ran.
        assert!(!taken(&mut clocks, "a", None));
        clocks.begin("c", Some(3), true);
        assert!(taken(&mut clocks, "c", None));
    }

    #[test]
    fn a_later_turn_is_a_speed_only_where_the_backend_said_what_its_cache_held() {
        let mut clocks = Clocks::default();
        clocks.begin("turn 1", Some(7), true);
        assert!(taken(&mut clocks, "turn 1", None));
        clocks.begin("turn 2", Some(7), true);
        assert!(!taken(&mut clocks, "turn 2", None));
        clocks.begin("turn 3", Some(7), true);
        assert!(taken(&mut clocks, "turn 3", Some(900)));
    }

    #[test]
    fn reported_timings_win_and_unknown_or_forgotten_requests_take_nothing() {
        let mut clocks = Clocks::default();
        clocks.begin("a", Some(1), true);
        let mut answer = clocked(None);
        let reported = Timings {
            prompt_tokens: 10,
            prompt_ms: 1.0,
            cached_tokens: None,
            generated_tokens: 1,
            generation_ms: 1.0,
        };
        answer.timings = Some(reported);
        clocks.finish("a", &mut answer);
        assert_eq!(answer.timings, Some(reported));
        assert!(!taken(&mut clocks, "never begun", None));
        clocks.begin("b", Some(2), true);
        clocks.forget("b");
        assert!(!taken(&mut clocks, "b", None));
    }

    #[test]
    fn the_memory_of_conversations_stays_bounded() {
        let mut clocks = Clocks::default();
        for key in 0..(SEEN_CONVERSATIONS as u64 * 3) {
            clocks.begin("r", Some(key), true);
            clocks.forget("r");
        }
        assert!(clocks.seen.len() <= SEEN_CONVERSATIONS);
        assert!(clocks.starts.is_empty());
    }
}
