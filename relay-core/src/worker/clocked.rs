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
//! A request that found its model unloaded by the backend ([`super::resting`]) waited for the
//! load: its clock is no speed. It measures the load instead, when it ran alone: its time to the
//! end less the work its timings report, or, from a backend without timings, its time to the
//! first event less its prompt at the speed last measured there.
//!
//! Bookkeeping: the session calls it as requests start and end.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::resting::Resting;
use crate::backend::{Answer, BackendEvent};
use crate::protocol::Timings;

/// Conversations remembered as seen; past it the memory starts again (a conversation then
/// looks new once: one sample whose prompt its cache may have held).
const SEEN_CONVERSATIONS: usize = 4096;

/// Fewest new prompt tokens an answer must have evaluated for its prompt speed to be kept for
/// telling a load from a prompt: under it, the connection's time weighs too much.
const RATE_MIN_TOKENS: u32 = 32;

/// Backend models whose prompt speed is remembered at most; past it the memory starts again.
const MAX_PROMPT_RATES: usize = 256;

/// A backend's model, by (base URL, model name).
type Served = (String, String);

/// What was true when a request started.
#[derive(Debug, Clone)]
struct Start {
    /// Requests this worker had started, this one included.
    seq: u64,
    /// Nothing else of this worker was running.
    alone: bool,
    /// Its conversation was not seen before (or it has none).
    new_conversation: bool,
    /// When it started.
    at: Instant,
    /// The backend and model it went to (not a model of the model map).
    backend: Option<Served>,
    /// The backend had unloaded the model: it waits for the load.
    unloaded: bool,
    /// It has sent its first event (after the load, if it waited for one).
    answering: bool,
}

/// The session's record of its requests' starts.
#[derive(Debug, Default)]
pub struct Clocks {
    started: u64,
    starts: HashMap<String, Start>,
    seen: HashSet<u64>,
    /// The prompt speed (tokens a second) each backend's model last showed.
    prompt_rates: HashMap<Served, f64>,
    /// Requests waiting for a load that have sent no event yet (so the other requests' events
    /// cost no lookup).
    loading: usize,
    resting: Resting,
}

impl Clocks {
    /// The clocks of a worker whose backends' unloaded models `resting` knows.
    pub fn new(resting: Resting) -> Self {
        Clocks {
            resting,
            ..Clocks::default()
        }
    }

    /// Request `id` of `conversation` starts; `alone`: no other request of the worker is
    /// running; `backend`: the (base URL, model) it goes to, when not the model map's.
    pub fn begin(
        &mut self,
        id: &str,
        conversation: Option<u64>,
        alone: bool,
        backend: Option<(&str, &str)>,
    ) {
        self.started += 1;
        if self.seen.len() >= SEEN_CONVERSATIONS {
            self.seen.clear();
        }
        let new_conversation = conversation.is_none_or(|key| self.seen.insert(key));
        let unloaded = backend.is_some_and(|(url, model)| self.resting.is_unloaded(url, model));
        self.loading += usize::from(unloaded);
        if self.prompt_rates.len() >= MAX_PROMPT_RATES {
            self.prompt_rates.clear();
        }
        // (A second start of one id replaces the first, which then never ends here.)
        self.end(id);
        self.starts.insert(
            id.to_string(),
            Start {
                seq: self.started,
                alone,
                new_conversation,
                at: Instant::now(),
                backend: backend.map(|(url, model)| (url.to_string(), model.to_string())),
                unloaded,
                answering: false,
            },
        );
    }

    /// Request `id` sent an event: a model it found unloaded is loaded now. The worker's next
    /// pong says so, as the proxy saw when the answer began; the load's time is measured when
    /// the answer ends ([`Clocks::finish`]).
    fn answering(&mut self, id: &str) {
        if self.loading == 0 {
            return;
        }
        let Some(start) = self.starts.get_mut(id) else {
            return;
        };
        if start.unloaded && !start.answering {
            start.answering = true;
            self.loading -= 1;
            if let Some((url, model)) = &start.backend {
                self.resting.loaded(url, model, None);
            }
        }
    }

    /// Request `id` ends: forgets its start.
    fn end(&mut self, id: &str) -> Option<Start> {
        let start = self.starts.remove(id)?;
        if start.unloaded && !start.answering {
            self.loading -= 1;
        }
        Some(start)
    }

    /// Request `id` ends with `answer`: its clocked time becomes its timings where it may
    /// (see the module), and is dropped otherwise; the load it waited for is measured.
    pub fn finish(&mut self, id: &str, answer: &mut Answer) {
        let start = self.end(id);
        let clocked = answer.clocked.take();
        let Some(start) = start else {
            return;
        };
        if start.unloaded && answer.status.is_success() {
            let load_ms = self.load_ms(&start, answer, clocked.as_ref());
            if let Some((url, model)) = &start.backend {
                self.resting.loaded(url, model, load_ms);
            }
        }
        let trusted = clocked.is_some_and(|clocked| {
            start.alone
                && !start.unloaded
                && start.seq == self.started
                && (clocked.cached_tokens.is_some() || start.new_conversation)
        });
        if trusted && answer.timings.is_none() {
            answer.timings = clocked;
        }
        if let (Some(backend), Some(timings)) = (start.backend, &answer.timings) {
            if timings.prompt_tokens >= RATE_MIN_TOKENS && timings.prompt_ms > 0.0 {
                let rate = f64::from(timings.prompt_tokens) * 1000.0 / timings.prompt_ms;
                self.prompt_rates.insert(backend, rate);
            }
        }
    }

    /// How long the load took that request `start` waited for (see the module); `None` when
    /// it did not run alone, or its answer says neither its timings nor its clock.
    fn load_ms(&self, start: &Start, answer: &Answer, clocked: Option<&Timings>) -> Option<u64> {
        if !start.alone {
            return None;
        }
        let ms = match (&answer.timings, clocked) {
            (Some(work), _) => {
                start.at.elapsed().as_secs_f64() * 1000.0 - work.prompt_ms - work.generation_ms
            }
            (None, Some(clocked)) => {
                let rate = start
                    .backend
                    .as_ref()
                    .and_then(|b| self.prompt_rates.get(b));
                let prompt_ms =
                    rate.map_or(0.0, |tps| f64::from(clocked.prompt_tokens) * 1000.0 / tps);
                clocked.prompt_ms - prompt_ms
            }
            (None, None) => return None,
        };
        Some(ms.max(0.0).round() as u64)
    }

    /// Request `id` sent `event`: [`Clocks::finish`] for its answer, [`Clocks::forget`] for
    /// its failure.
    pub fn on_event(&mut self, id: &str, event: &mut BackendEvent) {
        match event {
            BackendEvent::Complete(answer) => self.finish(id, answer),
            BackendEvent::Failed(_) => self.forget(id),
            BackendEvent::Chunk(_) => self.answering(id),
        }
    }

    /// Request `id` ended without an answer (failed, cancelled).
    pub fn forget(&mut self, id: &str) {
        self.end(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        clocks.begin("a", Some(1), true, None);
        assert!(taken(&mut clocks, "a", None));
        // Without a conversation nothing can have been cached for it either.
        clocks.begin("b", None, true, None);
        assert!(taken(&mut clocks, "b", None));
    }

    #[test]
    fn a_request_beside_another_is_not() {
        let mut clocks = Clocks::default();
        // Another was running when it started.
        clocks.begin("a", Some(1), true, None);
        clocks.begin("b", Some(2), false, None);
        assert!(!taken(&mut clocks, "b", None));
        // Another started while it ran.
        assert!(!taken(&mut clocks, "a", None));
        clocks.begin("c", Some(3), true, None);
        assert!(taken(&mut clocks, "c", None));
    }

    #[test]
    fn a_later_turn_is_a_speed_only_where_the_backend_said_what_its_cache_held() {
        let mut clocks = Clocks::default();
        clocks.begin("turn 1", Some(7), true, None);
        assert!(taken(&mut clocks, "turn 1", None));
        clocks.begin("turn 2", Some(7), true, None);
        assert!(!taken(&mut clocks, "turn 2", None));
        clocks.begin("turn 3", Some(7), true, None);
        assert!(taken(&mut clocks, "turn 3", Some(900)));
    }

    #[test]
    fn reported_timings_win_and_unknown_or_forgotten_requests_take_nothing() {
        let mut clocks = Clocks::default();
        clocks.begin("a", Some(1), true, None);
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
        clocks.begin("b", Some(2), true, None);
        clocks.forget("b");
        assert!(!taken(&mut clocks, "b", None));
    }

    /// A worker whose backend `http://b` serves `m` and has unloaded it.
    fn unloaded() -> (Clocks, Resting) {
        let resting = Resting::default();
        let served = vec!["m".to_string()];
        resting.watch(vec![(
            "http://b".into(),
            crate::discovery::Unloads::Ollama,
            served,
        )]);
        resting.mark_unloaded("http://b", "m");
        (Clocks::new(resting.clone()), resting)
    }

    fn state(resting: &Resting) -> (String, Option<u64>) {
        let states = resting.states();
        (states[0].state.clone(), states[0].load_ms)
    }

    #[test]
    fn a_request_that_found_its_model_unloaded_measures_the_load_from_its_reported_work() {
        let (mut clocks, resting) = unloaded();
        clocks.begin("a", Some(1), true, Some(("http://b", "m")));
        std::thread::sleep(std::time::Duration::from_millis(60));
        // 20 ms of the 60 were its prompt and answer, as the backend says.
        let mut answer = clocked(None);
        answer.timings = Some(Timings {
            prompt_tokens: 100,
            prompt_ms: 10.0,
            cached_tokens: Some(0),
            generated_tokens: 4,
            generation_ms: 10.0,
        });
        clocks.finish("a", &mut answer);
        let (now, load) = state(&resting);
        assert_eq!(now, "loaded");
        let load = load.expect("measured");
        assert!((40..1000).contains(&load), "{load} ms");
    }

    #[test]
    fn without_timings_the_load_is_the_wait_for_the_first_event_less_the_prompt_at_its_last_speed()
    {
        let (mut clocks, resting) = unloaded();
        // Loaded, it evaluated 1,000 tokens in 500 ms (a new conversation, alone: a speed).
        resting.loaded("http://b", "m", None);
        clocks.begin("warm", Some(1), true, Some(("http://b", "m")));
        assert!(taken(&mut clocks, "warm", None));
        // Unloaded again, the next 1,000 tokens took 2,500 ms to the first event: 2 s of load.
        resting.mark_unloaded("http://b", "m");
        clocks.begin("cold", Some(2), true, Some(("http://b", "m")));
        let mut answer = clocked(None);
        answer.clocked.as_mut().unwrap().prompt_ms = 2500.0;
        clocks.finish("cold", &mut answer);
        assert_eq!(answer.timings, None, "a wait for a load is no speed");
        assert_eq!(state(&resting), ("loaded".to_string(), Some(2000)));
    }

    #[test]
    fn a_model_is_loaded_from_the_first_event_of_the_request_that_loaded_it() {
        let (mut clocks, resting) = unloaded();
        clocks.begin("cold", Some(1), true, Some(("http://b", "m")));
        let mut event = BackendEvent::Chunk("data: {}\n\n".into());
        clocks.on_event("cold", &mut event);
        assert_eq!(state(&resting), ("loaded".to_string(), None));
        assert_eq!(clocks.loading, 0);
        // Its end measures the load.
        let mut answer = clocked(None);
        answer.clocked.as_mut().unwrap().prompt_ms = 900.0;
        clocks.finish("cold", &mut answer);
        assert_eq!(state(&resting), ("loaded".to_string(), Some(900)));
        // A request that ends without an event leaves the count right too.
        resting.mark_unloaded("http://b", "m");
        clocks.begin("gone", Some(2), true, Some(("http://b", "m")));
        assert_eq!(clocks.loading, 1);
        clocks.forget("gone");
        assert_eq!(clocks.loading, 0);
    }

    #[test]
    fn a_load_shared_with_another_request_is_not_measured_and_a_failed_answer_wakes_nothing() {
        let (mut clocks, resting) = unloaded();
        clocks.begin("other", Some(1), true, None);
        clocks.begin("cold", Some(2), false, Some(("http://b", "m")));
        let mut failed = clocked(None);
        failed.status = StatusCode::SERVICE_UNAVAILABLE;
        clocks.finish("cold", &mut failed);
        assert_eq!(state(&resting), ("unloaded".to_string(), None));
        clocks.begin("cold", Some(2), false, Some(("http://b", "m")));
        assert!(!taken(&mut clocks, "cold", Some(0)));
        assert_eq!(state(&resting), ("loaded".to_string(), None));
    }

    #[test]
    fn the_memory_of_conversations_stays_bounded() {
        let mut clocks = Clocks::default();
        for key in 0..(SEEN_CONVERSATIONS as u64 * 3) {
            clocks.begin("r", Some(key), true, None);
            clocks.forget("r");
        }
        assert!(clocks.seen.len() <= SEEN_CONVERSATIONS);
        assert!(clocks.starts.is_empty());
    }
}
