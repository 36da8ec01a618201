//! Cost routing: among the workers with a free slot, the one where a request's first token
//! comes soonest, from what each box was measured to do.
//!
//! Each answer's timings (llama-server's own, carried in `response_complete.timings`) teach the
//! proxy a worker's prompt-processing speed per model ([`Speed`], a moving average; a prompt
//! evaluated beside another reports the box slower than it is, and only ever raises it). For a
//! request the proxy then estimates, per candidate, the seconds until its first token: the
//! prompt tokens that box would have to evaluate (all of them, or only those beyond what the
//! conversation's home still holds) plus what the box is still evaluating for requests that have
//! not started answering, at its measured speed, and what placing it there delays those
//! requests by (a box evaluates its prompts together). The soonest wins when it is clearly sooner than
//! what the usual rules chose ([`CLEARLY_SOONER`]); missing measurements, unknown prompt sizes
//! and near ties keep the usual choice, so a fleet of equal boxes is routed as before. In a
//! quiet fleet ([`QUIET_FLEET`]) the answer's time counts too, where boxes generate at clearly
//! different speeds: with room for everyone, a box five times slower at generating should not
//! answer anyone.

use super::{RequestId, Scheduler, Worker, WorkerId};
use crate::protocol::Timings;

/// How much one new sample moves a speed estimate.
const SAMPLE_WEIGHT: f64 = 0.3;

/// A sample of fewer prompt tokens than this says more about a backend's overhead than its
/// speed, and is not learnt from.
const MIN_PROMPT_SAMPLE: u32 = 64;

/// Generated tokens a generation-speed sample needs.
const MIN_GENERATION_SAMPLE: u32 = 8;

/// Another worker replaces the usual choice only when its estimate is below this share of the
/// usual one's: estimates are rough, and the usual rules keep caches warm. On the fleet bench 0.6
/// kept cost routing within 5% of the best other policy in every cell; 0.8 and 0.9 did not.
pub(super) const CLEARLY_SOONER: f64 = 0.6;

/// A fleet with at least this share of its slots free is quiet: a request there goes where its
/// answer would end first, not only where its first token would come. At a home's load (a few
/// users) on a fast box and one five times slower, conversations on the slow box answered at a
/// fifth of the speed for all their turns. With 0.5 the rule also reached the fleet bench's busy
/// fleets and moved their cells; with 0.75 it leaves every busy cell as it was (BENCHMARKS.md,
/// 2026-11-28).
const QUIET_FLEET: f64 = 0.75;

/// Prompt tokens llama-server evaluates in one batch by default (`-b 2048`). A side request on
/// a box that evaluates side requests first ([`Scheduler::evaluates_side_first`]) waits for
/// about one batch of others' prompt tokens: the rest of the batch under way, and what fills
/// its own.
const BATCH_TOKENS: u32 = 2048;

/// The tokens an answer is taken to have where none of the model was measured on either box
/// weighed: a warm-up's (it generates sixteen), shorter than a title (twenty to thirty) and
/// far shorter than a turn. A first run then weighs the boxes' generation speeds by no more
/// than any answer surely costs: with no length at all, titles sent beside new sessions' first
/// turns went to a box five times slower at generating (BENCHMARKS.md, 2026-11-30, "a first
/// run's titles").
const UNMEASURED_ANSWER_TOKENS: f64 = 16.0;

/// A worker's measured speed on one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Speed {
    /// Prompt tokens evaluated per second.
    pub prompt_tps: Option<f64>,
    /// Tokens generated per second.
    pub generation_tps: Option<f64>,
    /// Tokens an answer generates, on average: with the generation speed, how long an answer
    /// holds its slot (what a queued request waits for).
    pub typical_output: Option<f64>,
    /// Tokens a conversation's turn generates, on average (side requests' answers, titles a few
    /// words long, not counted): what a conversation waits for on the box it lives on. A slow
    /// box that answers mostly titles measures a typical answer a fraction of a turn's, and a
    /// conversation weighing that box against a faster one would see almost no difference.
    pub typical_turn_output: Option<f64>,
}

// Rates are finite positive numbers by construction: each compares equal to itself.
impl Eq for Speed {}

impl Speed {
    /// Takes the rates of a warm-up (a prompt evaluated and a few tokens generated alone, when
    /// the worker started) where none were measured: traffic's own timings are what it learns
    /// from, and a warm-up's answer is nobody's, so its length is not learnt.
    pub fn observe_warm_up(&mut self, timings: &Timings) {
        let mut sample = Speed::default();
        sample.observe(timings, true, false);
        self.prompt_tps = self.prompt_tps.or(sample.prompt_tps);
        self.generation_tps = self.generation_tps.or(sample.generation_tps);
    }

    /// Learns from one answer's `timings`: a conversation's turn's, or a side request's (`side`);
    /// `shared`: another prompt was evaluated on the box while this one was, so its prompt rate
    /// is only a floor of the box's ([`Scheduler::note_shared_prefill`]).
    pub fn observe(&mut self, timings: &Timings, side: bool, shared: bool) {
        let rate = |tokens: u32, ms: f64, least: u32| {
            // A time of a few subnormal milliseconds (a worker's report is network input)
            // would make the rate infinite.
            (tokens >= least && ms > 0.0)
                .then(|| f64::from(tokens) * 1000.0 / ms)
                .filter(|rate| rate.is_finite())
        };
        let blend = |old: Option<f64>, new: f64| {
            Some(old.map_or(new, |old| old + SAMPLE_WEIGHT * (new - old)))
        };
        if let Some(new) = rate(timings.prompt_tokens, timings.prompt_ms, MIN_PROMPT_SAMPLE) {
            if !shared || self.prompt_tps.is_none_or(|old| new > old) {
                self.prompt_tps = blend(self.prompt_tps, new);
            }
        }
        if let Some(new) = rate(
            timings.generated_tokens,
            timings.generation_ms,
            MIN_GENERATION_SAMPLE,
        ) {
            self.generation_tps = blend(self.generation_tps, new);
        }
        if timings.generated_tokens > 0 {
            let tokens = f64::from(timings.generated_tokens);
            self.typical_output = blend(self.typical_output, tokens);
            if !side {
                self.typical_turn_output = blend(self.typical_turn_output, tokens);
            }
        }
    }
}

/// Prompt tokens a box evaluates at `prompt_tps` in the time since `at` (none without a time).
fn tokens_since(at: Option<std::time::Instant>, prompt_tps: f64, now: std::time::Instant) -> u32 {
    let secs = at.map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
    (secs * prompt_tps).min(f64::from(u32::MAX)) as u32
}

/// What cost routing weighed for a request: the usual choice against the best other worker
/// (a faster box, a sleeping one to wake), whichever it went to. The dashboard shows it beside
/// the reason, so a placement that looks wrong — a conversation kept on a slow box, one moved
/// off its cache — can be read, not guessed at.
#[derive(Debug, Clone, PartialEq)]
pub struct Weighed {
    /// It stayed with the usual choice: the other was not clearly sooner.
    pub kept: bool,
    /// Seconds until the first token where it went (a woken box's wake included), plus what
    /// its prompt delays the prompts evaluated beside it there.
    pub first_token_secs: f64,
    /// The worker weighed against: the usual choice where it moved, the best other where it
    /// stayed (`None`: it moved to a waking box while no worker was free).
    pub other: Option<String>,
    /// The same estimate there (with no worker free, the wait for a slot included).
    pub other_secs: f64,
    /// Seconds its answer takes where it went beyond the other (below zero: sooner), where a
    /// quiet fleet weighed answers; zero where it did not.
    pub answer_secs: f64,
    /// Seconds charged for the conversation evicted on the worker that is not the usual
    /// choice (it evicts one there, or would have); zero where it evicts none.
    pub eviction_secs: f64,
}

/// Why a request went where it went, for the dashboard and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Its conversation's home, whose cache holds the conversation's prompt.
    CacheHit,
    /// Its conversation's home had no free slot (or left): a new home with a free slot.
    HomeBusy,
    /// A new conversation: where conversations per slot are fewest.
    NewConversation,
    /// No conversation: the least loaded worker.
    LeastLoaded,
    /// Cost routing: a faster box answers sooner than the usual choice would.
    FasterBox,
    /// Only a sleeping box served its model: it waited while the box was woken.
    Waking,
    /// A side request (a title, a summary): where a slot is kept for no conversation.
    SideRequest,
}

impl Reason {
    /// Every reason, in the order `/metrics` lists them.
    pub const ALL: [Reason; 7] = [
        Reason::CacheHit,
        Reason::HomeBusy,
        Reason::NewConversation,
        Reason::LeastLoaded,
        Reason::FasterBox,
        Reason::Waking,
        Reason::SideRequest,
    ];

    /// Why a request went to `worker`, given its conversation's home before the placement
    /// (`None`: no conversation; `Some(None)`: none yet), whether cost routing chose it and
    /// whether it waited for `worker` to wake.
    pub(super) fn of(
        home: Option<Option<WorkerId>>,
        worker: WorkerId,
        faster_box: bool,
        waking: bool,
    ) -> Reason {
        match (faster_box, home) {
            _ if waking => Reason::Waking,
            (true, _) => Reason::FasterBox,
            (false, None) => Reason::LeastLoaded,
            (false, Some(None)) => Reason::NewConversation,
            (false, Some(Some(home))) if home == worker => Reason::CacheHit,
            (false, Some(Some(_))) => Reason::HomeBusy,
        }
    }

    /// Its place in [`Reason::ALL`].
    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// Its name on the dashboard and in `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::CacheHit => "cache_hit",
            Reason::HomeBusy => "home_busy",
            Reason::NewConversation => "new_conversation",
            Reason::LeastLoaded => "least_loaded",
            Reason::FasterBox => "faster_box",
            Reason::Waking => "waking",
            Reason::SideRequest => "side_request",
        }
    }
}

impl Scheduler {
    /// Learns `worker`'s speed on `model` from one answer's `timings` (not a side request's).
    pub fn observe_timings(&mut self, worker: WorkerId, model: &str, timings: &Timings) {
        self.observe_answer(worker, model, timings, false, false);
    }

    /// `worker`'s warm-up on `model` (measured alone when it started, carried in `register` or
    /// `models_update`): its rates, where none were measured ([`Speed::observe_warm_up`]).
    pub fn observe_warm_up(&mut self, worker: WorkerId, model: &str, timings: &Timings) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        let Some(model) = w.models.iter().find(|m| &***m == model).cloned() else {
            return;
        };
        w.speeds.entry(model).or_default().observe_warm_up(timings);
    }

    fn observe_answer(
        &mut self,
        worker: WorkerId,
        model: &str,
        timings: &Timings,
        side: bool,
        shared: bool,
    ) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        let Some(model) = w.models.iter().find(|m| &***m == model).cloned() else {
            return;
        };
        w.speeds
            .entry(model)
            .or_default()
            .observe(timings, side, shared);
    }

    /// Placements so far, by why they went where they did.
    pub fn reason_counts(&self) -> Vec<(Reason, u64)> {
        Reason::ALL
            .iter()
            .map(|reason| (*reason, self.reasons[reason.index()]))
            .collect()
    }

    /// Why `request` went to its worker (none while it waits).
    pub fn reason_of(&self, request: RequestId) -> Option<Reason> {
        self.requests.get(&request)?.reason
    }

    /// What cost routing weighed for `request`, placed: the usual choice against the best
    /// other (`None`: nothing was weighed — cost routing off, a single candidate, one not
    /// measured).
    pub fn weighed_of(&self, request: RequestId) -> Option<&Weighed> {
        self.requests.get(&request)?.weighed.as_ref()
    }

    /// Learns `worker`'s speed on the model of `request`, which it just answered in `timings`.
    pub fn learn(&mut self, worker: WorkerId, request: RequestId, timings: &Timings) {
        if let Some(r) = self.requests.get(&request) {
            let (model, side, shared) = (r.model.clone(), r.placement.side, r.shared_prefill);
            self.observe_answer(worker, &model, timings, side, shared);
        }
    }

    /// `request` is placed on `worker`: when the worker is still evaluating the prompt of
    /// another request, the two share its batches, and the time each reports for its prompt
    /// counts some of the other's tokens (llama-server fills each batch from its slots in
    /// order). Learnt as they come, the fast box of the fleet bench measured 1,500–2,400 prompt
    /// tokens a second for its 3,000, and titles went to the slow box.
    pub(super) fn note_shared_prefill(&mut self, worker: WorkerId, request: RequestId) {
        let Some(w) = self.workers.get(&worker) else {
            return;
        };
        let mut shared = false;
        for id in &w.in_flight {
            if let Some(r) = self.requests.get_mut(id).filter(|r| !r.started) {
                r.shared_prefill = true;
                shared = true;
            }
        }
        if let Some(r) = self.requests.get_mut(&request).filter(|_| shared) {
            r.shared_prefill = true;
        }
    }

    /// `worker`'s measured speed on `model`, if any was measured.
    pub fn speed(&self, worker: WorkerId, model: &str) -> Option<Speed> {
        self.workers.get(&worker)?.speeds.get(model).copied()
    }

    /// Prompt tokens of conversation `affinity` that `worker` would have to evaluate for a prompt
    /// of `tokens`: beyond what it still holds when it is the conversation's home.
    pub(super) fn tokens_to_evaluate(
        &self,
        worker: WorkerId,
        affinity: Option<u64>,
        tokens: u32,
        now: std::time::Instant,
    ) -> u32 {
        let held = affinity
            .filter(|key| self.affinity.home(*key, now) == Some(worker))
            .map_or(0, |key| self.affinity.context(key));
        tokens.saturating_sub(held)
    }

    /// Seconds until the first token of a prompt of `tokens` of conversation `affinity` on
    /// worker `id` — loading the model if it is not loaded there, then the prompt tokens it has
    /// to evaluate, its own and what is left of those it is still evaluating for others
    /// ([`Scheduler::evaluated_since_placed`]), at its measured speed —
    /// and the seconds the prompt would delay those others: a box evaluates its prompts
    /// together, so each waits longer by as much of this one as it has left itself. A
    /// `pinned_side` request (a side request whose endpoint takes the slot hint) where the box
    /// evaluates side requests first waits for about one batch of the others' prompts, not all
    /// of them. `None` when its speed (or a load it needs) is not measured.
    pub(super) fn first_token_secs(
        &self,
        id: WorkerId,
        model: &str,
        pinned_side: bool,
        affinity: Option<u64>,
        tokens: u32,
        now: std::time::Instant,
    ) -> Option<(f64, f64)> {
        let w = self.workers.get(&id)?;
        let prompt_tps = w.speeds.get(model)?.prompt_tps?;
        // A model loaded again holds no prompt of any conversation; one a request placed there
        // is loading costs what is left of its load.
        let (load_secs, own) = match w.cold.get(model) {
            None => (0.0, self.tokens_to_evaluate(id, affinity, tokens, now)),
            Some(load) => {
                let since = w
                    .loading
                    .get(model)
                    .map(|at| now.saturating_duration_since(*at));
                let begun = since.map_or(0.0, |d| d.as_secs_f64());
                (((*load)? - begun).max(0.0), tokens)
            }
        };
        let own = own.max(1);
        // Prompt tokens of requests placed there that have not started answering, as estimated
        // when they were placed, less what the box has evaluated of them since.
        let mut waiting: Vec<&super::Request> = w
            .in_flight
            .iter()
            .filter_map(|r: &RequestId| self.requests.get(r))
            .filter(|r| !r.started)
            .collect();
        let mut done = self.evaluated_since_placed(w, &waiting, prompt_tps, now);
        // In the order they were placed: llama-server evaluates its slots' prompts in turn.
        waiting.sort_by_key(|r| r.assigned_at);
        // Never more of one than its own time there allows: a request not streamed starts
        // answering, as far as the proxy sees, only when it ends, so the time since the first
        // was placed may have gone to its answer rather than to the prompts after it.
        let (ahead, delayed) = waiting.iter().fold((0u32, 0u32), |(ahead, delayed), r| {
            let evaluated =
                done.min(r.prefill_tokens)
                    .min(tokens_since(r.assigned_at, prompt_tps, now));
            done -= evaluated;
            let left = r.prefill_tokens - evaluated;
            (
                ahead.saturating_add(left),
                delayed.saturating_add(left.min(own)),
            )
        });
        let ahead = if pinned_side && self.evaluates_side_first(id, model, now) {
            ahead.min(BATCH_TOKENS)
        } else {
            ahead
        };
        let first_token = load_secs + f64::from(own.saturating_add(ahead)) / prompt_tps;
        Some((first_token, f64::from(delayed) / prompt_tps))
    }

    /// Whether worker `id` evaluates a side request of `model` before the turns waiting there:
    /// its worker gives side requests the lowest free slot kept for no conversation (and said
    /// so, `sides_first`), it has such a slot, and llama-server fills each batch in slot order,
    /// so the side request's prompt goes into the next batch. Without a slot kept for no
    /// conversation it takes a conversation's, which may lie above the turns waiting.
    fn evaluates_side_first(&self, id: WorkerId, model: &str, now: std::time::Instant) -> bool {
        let Some(w) = self.workers.get(&id) else {
            return false;
        };
        w.sides_first.iter().any(|m| **m == *model) && self.spare_slots(id, now) > 0
    }

    /// Prompt tokens worker `w` has evaluated of its `waiting` prompts (placed, not answering
    /// yet) since the first of them was placed: its measured rate for the time since — only
    /// while it evaluates prompts alone. Answers decoding beside them take part of each of
    /// llama-server's batches, so the box evaluates slower than its measured rate then, and
    /// crediting that rate made a busy fast box look freer than it was (the fleet bench's busy
    /// agent sessions, 2.01 → 2.76 s p90; BENCHMARKS.md, 2026-11-30). A prompt placed when a
    /// slot freed has no time of placement and is credited nothing of its own.
    fn evaluated_since_placed(
        &self,
        w: &Worker,
        waiting: &[&super::Request],
        prompt_tps: f64,
        now: std::time::Instant,
    ) -> u32 {
        let answering = w.in_flight.len() > waiting.len() || w.external_load > 0;
        // `None` (nothing credited) when any was placed without a time: `None` is the least.
        let first = waiting.iter().map(|r| r.assigned_at).min().flatten();
        if answering {
            return 0;
        }
        tokens_since(first, prompt_tps, now)
    }

    /// With cost routing on, a worker with a free slot among `candidates` (those that serve
    /// `model` and hold the prompt, `fits`) whose first token, for a prompt of `tokens` of
    /// conversation `affinity`, comes clearly sooner than on `usual`; `None` keeps `usual`.
    /// `pinned_side`: a side request whose endpoint takes the slot hint
    /// ([`Scheduler::first_token_secs`]).
    ///
    /// Only free workers are weighed. Holding a request for a busy fast box (its slot frees
    /// soon, and it evaluates the prompt five times faster) was tried on the fleet bench and
    /// lost: a slot's wait is an answer of unknown length, and the estimates of it were wrong
    /// often enough to make the 90th percentile worse than never waiting (BENCHMARKS.md).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sooner_than(
        &self,
        model: &str,
        candidates: &[WorkerId],
        eligible: &dyn Fn(&Worker) -> bool,
        pinned_side: bool,
        affinity: Option<u64>,
        tokens: Option<u32>,
        usual: WorkerId,
        now: std::time::Instant,
    ) -> Option<(Option<WorkerId>, Weighed)> {
        let tokens = tokens.filter(|_| self.cost_routing)?;
        let estimate = |id| {
            let (first_token, delay) =
                self.first_token_secs(id, model, pinned_side, affinity, tokens, now)?;
            Some(first_token + delay)
        };
        let usual_secs = estimate(usual)?;
        // A conversation that would start on or move to a box whose slots are all kept for
        // conversations, while the usual choice has one to spare, is charged twice the cache it
        // evicts there ([`Scheduler::eviction_secs`]): the conversation evicted evaluates it
        // again on its next turn, and evicts another (with more conversations than slots the
        // evictions chain). On the fleet bench (when the charge was the new prompt's own size)
        // once was not enough (agent sessions lost more of their cache on the fast box) and four
        // times kept short chats on the slow box.
        //
        // While side requests flow (Claude Code), a box is crowded once conversations would fill
        // all its slots but one, and is not chosen at all over a usual choice that is not: a box
        // filled with conversations turns every side request into an eviction, and the
        // conversation evicted evaluates its whole history again on its next turn (the fleet
        // bench's fast + 5× slower agent sessions lost 4 points of reuse and doubled their p90
        // that way; BENCHMARKS.md, "2026-11-27, night").
        let side_flow = self.side_flow.flowing(now);
        let crowded = |id| match affinity {
            Some(key) if side_flow => self.leaves_no_side_slot(id, key, now),
            Some(_) => self.spare_slots(id, now) <= 0,
            None => false,
        };
        let usual_roomy = !crowded(usual);
        // In a quiet fleet (see [`QUIET_FLEET`]) a request goes where its answer would end
        // first: each candidate is also charged the time its answer takes beyond the usual
        // choice's. A conversation with a home moves for that only where it crowds nobody and
        // no side requests flow: moving agent sessions to the fast box for their answers filled
        // it, and their evictions cost more than the answers gained (BENCHMARKS.md, 2026-11-28).
        let homeless = affinity.is_none_or(|key| self.affinity.home(key, now).is_none());
        let quiet = self.quiet(candidates);
        let answer_gap = |id, crowded_there: bool| {
            let movable = homeless || (!side_flow && !crowded_there);
            (quiet && movable)
                .then(|| self.longer_answer_secs(id, usual, model, affinity.is_some()))
                .flatten()
                .unwrap_or(0.0)
        };
        // The best other: its estimate, answer gap and eviction charge.
        let mut best: Option<(f64, WorkerId, (f64, f64, f64))> = None;
        for &id in candidates {
            if id == usual || !self.workers.get(&id).is_some_and(eligible) {
                continue;
            }
            let crowded_there = crowded(id);
            // Every candidate measured, or the comparison is not fair to the unmeasured.
            let first_token = estimate(id)?;
            let answer = answer_gap(id, crowded_there);
            let mut eviction = 0.0;
            if usual_roomy && crowded_there {
                if side_flow {
                    continue;
                }
                eviction = 2.0 * self.eviction_secs(id, model, tokens, now)?;
            }
            let secs = first_token + answer + eviction;
            if best.is_none_or(|(b, _, _)| secs < b) {
                best = Some((secs, id, (first_token, answer, eviction)));
            }
        }
        let (secs, id, (first_token, answer, eviction)) = best?;
        let name = |id| self.workers.get(&id).map(|w| w.name.clone());
        let moved = secs < usual_secs * CLEARLY_SOONER;
        let weighed = if moved {
            Weighed {
                kept: false,
                first_token_secs: first_token,
                other: name(usual),
                other_secs: usual_secs,
                answer_secs: answer,
                eviction_secs: eviction,
            }
        } else {
            Weighed {
                kept: true,
                first_token_secs: usual_secs,
                other: name(id),
                other_secs: first_token,
                answer_secs: -answer,
                eviction_secs: eviction,
            }
        };
        Some((moved.then_some(id), weighed))
    }

    /// Seconds of prompt evaluation that placing a new prompt of `tokens` on worker `id`, whose
    /// slots are all kept for conversations, costs the conversation it evicts: our worker's slot
    /// table gives up the slot cheapest to lose, so the conversation holding the fewest tokens
    /// there evaluates them again — never more than this prompt itself costs there (with more
    /// conversations than slots, the newcomer is evicted in turn when it is the cheapest). A
    /// long document placed among short chats costs one chat's prompt, not its own twice over:
    /// charged its own size, documents queued on the slow box for minutes (BENCHMARKS.md,
    /// 2026-11-28, "what an eviction costs").
    fn eviction_secs(
        &self,
        id: WorkerId,
        model: &str,
        tokens: u32,
        now: std::time::Instant,
    ) -> Option<f64> {
        let own = self
            .first_token_secs(id, model, false, None, tokens, now)?
            .0;
        let prompt_tps = self.speed(id, model)?.prompt_tps?;
        let cheapest = self.affinity.least_context_of(id, now);
        Some(cheapest.map_or(own, |held| own.min(f64::from(held) / prompt_tps)))
    }

    /// Seconds longer a typical answer of `model` takes on worker `id` than on `usual` (less
    /// than zero where it is faster): the answer's length as measured on the two (a property of
    /// the workload, so one length for both: their mean, or the one measured) — a
    /// conversation's `turn`'s where one was measured, any answer's otherwise, a short one
    /// ([`UNMEASURED_ANSWER_TOKENS`]) where none was — at each worker's measured generation
    /// speed. Zero where the two generate alike (one within [`CLEARLY_SOONER`] of the other:
    /// measured speeds wander with the load); `None` where a generation speed is not measured.
    fn longer_answer_secs(
        &self,
        id: WorkerId,
        usual: WorkerId,
        model: &str,
        turn: bool,
    ) -> Option<f64> {
        let (there, here) = (self.speed(id, model)?, self.speed(usual, model)?);
        let (there_tps, here_tps) = (there.generation_tps?, here.generation_tps?);
        if there_tps.min(here_tps) >= CLEARLY_SOONER * there_tps.max(here_tps) {
            return Some(0.0);
        }
        // The mean of the two, not the usual box's alone: which box served which answers is
        // an accident of routing (a slow box that answered only titles measures a title's
        // length), and a proxy whose first day went otherwise would route its second otherwise.
        let both = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some((a + b) / 2.0),
            (a, b) => a.or(b),
        };
        let turn_tokens = turn
            .then(|| both(here.typical_turn_output, there.typical_turn_output))
            .flatten();
        let tokens = turn_tokens
            .or(both(here.typical_output, there.typical_output))
            .unwrap_or(UNMEASURED_ANSWER_TOKENS);
        Some(tokens / there_tps - tokens / here_tps)
    }

    /// Whether at least [`QUIET_FLEET`] of the `candidates`' slots are free.
    fn quiet(&self, candidates: &[WorkerId]) -> bool {
        let (free, slots) = candidates
            .iter()
            .filter_map(|id| self.workers.get(id))
            .fold((0, 0), |(free, slots), w| {
                (
                    free + w.max_concurrent.saturating_sub(w.load()),
                    slots + w.max_concurrent,
                )
            });
        f64::from(free) >= QUIET_FLEET * f64::from(slots)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::HashMap;
    use std::time::Instant;

    use super::super::tests::register;
    use super::super::{Placement, ProviderLimits, Submitted};
    use super::*;
    use crate::protocol::ModelStateReport;

    /// A scheduler with cost routing `on` and workers of these prompt speeds (tokens/s), 4 slots
    /// each, ids in order; speeds of `None` are not measured.
    pub(in super::super) fn fleet(on: bool, speeds: &[Option<f64>]) -> (Scheduler, Vec<WorkerId>) {
        let mut s = Scheduler::new(vec![("local".to_string(), ProviderLimits::default())]);
        s.set_cost_routing(on);
        let ids = speeds
            .iter()
            .enumerate()
            .map(|(i, speed)| {
                let id = register(&mut s, &format!("box-{i}"), &["m"], 4).worker;
                if let Some(tps) = speed {
                    let ms = 1000.0 * 1000.0 / tps;
                    s.observe_timings(id, "m", &timings(1000, ms, 100, 2000.0));
                }
                id
            })
            .collect();
        (s, ids)
    }

    pub(in super::super) fn place(
        s: &mut Scheduler,
        id: RequestId,
        conversation: u64,
        tokens: u32,
        now: Instant,
    ) -> WorkerId {
        let placement = Placement {
            affinity: Some(conversation),
            prompt_tokens: Some(tokens),
            ..Placement::default()
        };
        placed(s, id, placement, now)
    }

    /// Submits request `id` of `placement` at `now`: the worker it was dispatched to.
    fn placed(s: &mut Scheduler, id: RequestId, placement: Placement, now: Instant) -> WorkerId {
        match s.submit(id, "m", placement, now).expect("accepted") {
            Submitted::Dispatched { worker, .. } => worker,
            other => panic!("not placed: {other:?}"),
        }
    }

    #[test]
    fn a_new_conversation_goes_to_the_box_that_evaluates_its_prompt_sooner() {
        let now = Instant::now();
        // The usual rule takes the lowest id among equally empty workers: the slow one.
        let (mut s, ids) = fleet(true, &[Some(600.0), Some(3000.0)]);
        assert_eq!(place(&mut s, 1, 7, 12_000, now), ids[1]);
        assert_eq!(s.reason_of(1), Some(Reason::FasterBox));
        // What the dashboard shows: 4 s to the first token here against 20 s on box-0, and
        // answers alike on both (equal generation speeds).
        let weighed = s.weighed_of(1).expect("weighed").clone();
        assert!(!weighed.kept);
        assert!((weighed.first_token_secs - 4.0).abs() < 0.01, "{weighed:?}");
        assert!((weighed.other_secs - 20.0).abs() < 0.01, "{weighed:?}");
        assert_eq!(weighed.other.as_deref(), Some("box-0"));
        assert_eq!((weighed.answer_secs, weighed.eviction_secs), (0.0, 0.0));
        let (mut off, ids) = fleet(false, &[Some(600.0), Some(3000.0)]);
        assert_eq!(
            place(&mut off, 1, 7, 12_000, now),
            ids[0],
            "off: the usual rule"
        );
        assert_eq!(off.reason_of(1), Some(Reason::NewConversation));
    }

    /// A proxy's first run: a box of 600 prompt tokens/s generating 12 a second and one five
    /// times faster, known only by their warm-ups (no answer's length measured), whose worker
    /// says whether it evaluates side requests first; and a session's 12,000-token first turn
    /// placed on the fast box.
    fn first_run_with_a_first_turn(sides_first: bool) -> (Scheduler, Vec<WorkerId>, Instant) {
        let now = Instant::now();
        let (mut s, ids) = fleet(true, &[None, None]);
        s.observe_warm_up(
            ids[0],
            "m",
            &timings(1000, 1000.0 / 0.6, 16, 16_000.0 / 12.0),
        );
        s.observe_warm_up(
            ids[1],
            "m",
            &timings(1000, 1000.0 / 3.0, 16, 16_000.0 / 60.0),
        );
        let models = ["m".to_string()];
        for id in &ids {
            s.set_sides_first(*id, sides_first.then_some(&models[..]));
        }
        assert_eq!(place(&mut s, 1, 7, 12_000, now), ids[1]);
        (s, ids, now)
    }

    /// A title of 1,000 tokens, on a route the worker pins (`slot_hinted`: chat completions,
    /// Claude Code's `/v1/messages`) or on one it does not (the Responses API).
    fn title(s: &mut Scheduler, id: RequestId, slot_hinted: bool, now: Instant) -> WorkerId {
        let placement = Placement {
            affinity: Some(1000 + id),
            prompt_tokens: Some(1000),
            side: true,
            slot_hinted,
            ..Placement::default()
        };
        placed(s, id, placement, now)
    }

    #[test]
    fn a_title_beside_a_first_turn_goes_to_the_box_that_evaluates_side_requests_first() {
        // The title goes into the fast box's lowest slot, which llama-server evaluates first:
        // one batch ahead of it (2,048 tokens) rather than the whole first turn, 1 s, plus
        // the 0.3 s it delays that turn, against 1.7 s on the idle slow box. And its answer,
        // of a length not measured yet, is taken as a warm-up's 16 tokens: 0.27 s here
        // against 1.33 s there.
        let (mut s, ids, now) = first_run_with_a_first_turn(true);
        assert_eq!(title(&mut s, 2, true, now), ids[1]);
        assert_eq!(s.reason_of(2), Some(Reason::FasterBox));
        let weighed = s.weighed_of(2).expect("weighed").clone();
        assert!(
            (weighed.first_token_secs - 1.35).abs() < 0.01,
            "{weighed:?}"
        );
        assert!((weighed.other_secs - 1.67).abs() < 0.01, "{weighed:?}");
        assert!((weighed.answer_secs + 1.07).abs() < 0.01, "{weighed:?}");
        // Sent on a route the worker does not pin (the Responses API), llama-server places the
        // title itself: it may wait behind the whole first turn there (4.7 s), and goes to the
        // slow box.
        let (mut s, ids, now) = first_run_with_a_first_turn(true);
        assert_eq!(title(&mut s, 2, false, now), ids[0]);
        // Nor from a worker that does not say it evaluates side requests first.
        let (mut s, ids, now) = first_run_with_a_first_turn(false);
        assert_eq!(title(&mut s, 2, true, now), ids[0]);
        // Nor where the fast box keeps no slot for side requests (nor the slow one: else the
        // title would go there anyway): a title there takes a conversation's slot, which may
        // lie above the turns waiting.
        let (mut s, ids, now) = first_run_with_a_first_turn(true);
        for conversation in 8..15 {
            s.affinity
                .record(conversation, ids[usize::from(conversation < 11)], now);
        }
        assert_eq!(title(&mut s, 2, true, now), ids[0]);
    }

    #[test]
    fn a_prompt_ahead_counts_what_a_box_evaluating_prompts_alone_has_done_of_it_since() {
        let start = Instant::now();
        let later = start + std::time::Duration::from_millis(1300);
        // Two sessions' first turns, 1.3 s apart: the fast box has evaluated 3,900 of the
        // first one's 12,000 tokens when the second arrives. Its estimate is 4 s of its own,
        // 2.7 s left of the other and the 2.7 s it delays that one: 9.4 s against 20 s on the
        // slow box. Counted whole, the prompt ahead made it 12 s: not clearly sooner, and the
        // session lived on the slow box (the fleet bench's first runs; BENCHMARKS.md).
        let (mut s, ids) = fleet(true, &[Some(600.0), Some(3000.0)]);
        assert_eq!(place(&mut s, 1, 7, 12_000, start), ids[1]);
        assert_eq!(place(&mut s, 2, 8, 12_000, later), ids[1]);
        let weighed = s.weighed_of(2).expect("weighed");
        assert!((weighed.first_token_secs - 9.4).abs() < 0.01, "{weighed:?}");
        // Beside an answer the box evaluates slower than its measured rate: nothing is
        // counted done, and the slow box keeps the usual choice.
        let (mut s, ids) = fleet(true, &[Some(600.0), Some(3000.0)]);
        assert_eq!(place(&mut s, 3, 9, 300, start), ids[1]);
        s.mark_started(3);
        assert_eq!(place(&mut s, 1, 7, 12_000, start), ids[1]);
        assert_eq!(place(&mut s, 2, 8, 12_000, later), ids[0]);
        let weighed = s.weighed_of(2).expect("weighed");
        assert!(weighed.kept, "{weighed:?}");
        assert!((weighed.other_secs - 12.0).abs() < 0.01, "{weighed:?}");
    }

    #[test]
    fn equal_or_unmeasured_boxes_are_routed_by_the_usual_rules() {
        let now = Instant::now();
        let (mut even, ids) = fleet(true, &[Some(2000.0), Some(2100.0)]);
        assert_eq!(place(&mut even, 1, 7, 12_000, now), ids[0], "a near tie");
        let (mut unknown, ids) = fleet(true, &[Some(600.0), None]);
        assert_eq!(
            place(&mut unknown, 1, 7, 12_000, now),
            ids[0],
            "one unmeasured"
        );
    }

    #[test]
    fn a_conversation_stays_where_its_prompt_is_cached_unless_another_box_is_clearly_sooner() {
        let now = Instant::now();
        let (mut s, ids) = fleet(true, &[Some(600.0), Some(3000.0)]);
        // Its home is the slow box (the fast one was full when it started).
        let off = |s: &mut Scheduler, on| s.set_cost_routing(on);
        off(&mut s, false);
        assert_eq!(place(&mut s, 1, 7, 12_000, now), ids[0]);
        let mut actions = Vec::new();
        assert!(s.finish(ids[0], 1, &mut actions));
        off(&mut s, true);
        // Turn 2 adds 300 tokens: 0.5 s at home against 4.1 s for all of it on the fast box.
        assert_eq!(place(&mut s, 2, 7, 12_300, now), ids[0]);
        assert_eq!(s.reason_of(2), Some(Reason::CacheHit));
        // The dashboard says so: kept at home, the fast box weighed and not clearly sooner.
        let weighed = s.weighed_of(2).expect("weighed").clone();
        assert!(weighed.kept);
        assert!((weighed.first_token_secs - 0.5).abs() < 0.01, "{weighed:?}");
        assert!((weighed.other_secs - 4.1).abs() < 0.01, "{weighed:?}");
        assert_eq!(weighed.other.as_deref(), Some("box-1"));
        assert!(s.finish(ids[0], 2, &mut actions));
        // A turn that pastes a long document is evaluated sooner on the fast box, which then
        // becomes the conversation's home.
        assert_eq!(place(&mut s, 3, 7, 40_000, now), ids[1]);
        assert_eq!(s.reason_of(3), Some(Reason::FasterBox));
    }

    #[test]
    fn a_burst_of_new_conversations_is_not_queued_on_the_fast_box_alone() {
        let now = Instant::now();
        let (mut s, ids) = fleet(true, &[Some(600.0), Some(3000.0)]);
        // 12,000 tokens: 4 s on the fast box, 20 s on the slow one.
        assert_eq!(place(&mut s, 1, 1, 12_000, now), ids[1]);
        // The fast box would give the second its first token in 8 s (clearly sooner than 20),
        // but it evaluates prompts together: the first would wait 4 s longer for it. 12 s in
        // all is not clearly sooner.
        assert_eq!(place(&mut s, 2, 2, 12_000, now), ids[0]);
        assert_eq!(s.reason_of(2), Some(Reason::NewConversation));
        // Once the first answers, the fast box is clearly sooner again.
        s.mark_started(1);
        assert_eq!(place(&mut s, 3, 3, 12_000, now), ids[1]);
    }

    #[test]
    fn a_long_document_among_short_chats_is_charged_one_chats_cache_not_its_own_twice() {
        let now = Instant::now();
        let (mut s, ids) = fleet(true, &[Some(1000.0), Some(3000.0)]);
        // Four short chats make the fast box their home, all its slots; their users type.
        let mut actions = Vec::new();
        for chat in 1..=4 {
            assert_eq!(place(&mut s, chat, chat, 500, now), ids[1]);
            assert!(s.finish(ids[1], chat, &mut actions));
        }
        // A 12,000-token document: 12 s on the slow box, which has every slot to spare; 4 s on
        // the fast one, where it evicts a chat of 500 tokens (0.17 s to evaluate again). Charged
        // its own 4 s twice more, it would wait the 12 s.
        assert_eq!(place(&mut s, 5, 5, 12_000, now), ids[1]);
        assert_eq!(s.reason_of(5), Some(Reason::FasterBox));
        assert!(s.finish(ids[1], 5, &mut actions));
        // A new short chat still goes where a slot is spare: evicting another chat costs as much
        // as its own prompt there.
        assert_eq!(place(&mut s, 6, 6, 600, now), ids[0]);
        assert_eq!(s.reason_of(6), Some(Reason::NewConversation));
    }

    #[test]
    fn in_a_quiet_fleet_a_request_goes_where_its_answer_ends_first() {
        let now = Instant::now();
        // Prompts evaluated alike; box 1 generates five times faster (typical answer 100
        // tokens: 2 s there, 10 s on box 0).
        let (mut s, ids) = fleet(true, &[Some(2000.0), Some(2000.0)]);
        s.observe_timings(ids[0], "m", &timings(1000, 500.0, 100, 10_000.0));
        s.observe_timings(ids[1], "m", &timings(1000, 500.0, 100, 2_000.0));
        for _ in 0..20 {
            s.observe_timings(ids[0], "m", &timings(1000, 500.0, 100, 10_000.0));
        }
        assert_eq!(place(&mut s, 1, 7, 1_000, now), ids[1]);
        assert_eq!(s.reason_of(1), Some(Reason::FasterBox));
        // The dashboard says why: first tokens alike (0.5 s), the answer about 8 s sooner.
        let weighed = s.weighed_of(1).expect("weighed");
        assert!((weighed.first_token_secs - weighed.other_secs).abs() < 0.01);
        assert!((weighed.answer_secs + 8.0).abs() < 0.5, "{weighed:?}");
        // Its next turn stays home, whatever the other box generates.
        let mut actions = Vec::new();
        assert!(s.finish(ids[1], 1, &mut actions));
        assert_eq!(place(&mut s, 2, 7, 1_200, now), ids[1]);
        // A conversation at home on the box that answers slower moves to one with room, but
        // not while side requests flow (agent sessions: the moves crowd the faster box).
        let at_home_on_the_slower_box = |side_requests: bool| {
            let (mut s, ids) = fleet(false, &[Some(2000.0), Some(2000.0)]);
            s.observe_timings(ids[1], "m", &timings(1000, 500.0, 100, 500.0));
            let mut actions = Vec::new();
            if side_requests {
                let worker = place_title(&mut s, 30, 100, now);
                assert!(s.finish(worker, 30, &mut actions));
            }
            assert_eq!(place(&mut s, 1, 8, 1_000, now), ids[0]);
            assert!(s.finish(ids[0], 1, &mut actions));
            s.set_cost_routing(true);
            let placed = place(&mut s, 2, 8, 1_200, now);
            (placed == ids[1], s.reason_of(2))
        };
        assert_eq!(
            at_home_on_the_slower_box(false),
            (true, Some(Reason::FasterBox))
        );
        assert_eq!(
            at_home_on_the_slower_box(true),
            (false, Some(Reason::CacheHit))
        );
        // In a busy fleet (six of eight slots taken) the first token alone decides: a tie, so
        // the usual rule's choice, as with cost routing off.
        let busy = |on| {
            let (mut s, ids) = fleet(false, &[Some(2000.0), Some(2000.0)]);
            s.observe_timings(ids[1], "m", &timings(1000, 500.0, 100, 500.0));
            for request in 10..16 {
                place(&mut s, request, 100 + request, 50, now);
            }
            s.set_cost_routing(on);
            (s, ids)
        };
        let (mut usual, _) = busy(false);
        let (mut s, ids) = busy(true);
        let placed = place(&mut s, 1, 9, 1_000, now);
        assert_eq!(placed, place(&mut usual, 1, 9, 1_000, now));
        assert_eq!(placed, ids[0], "not the box that answers faster");
    }

    /// Places side request `id` (a title of `tokens`) and returns where it went.
    fn place_title(s: &mut Scheduler, id: RequestId, tokens: u32, now: Instant) -> WorkerId {
        let title = Placement {
            affinity: Some(99),
            prompt_tokens: Some(tokens),
            side: true,
            ..Placement::default()
        };
        match s.submit(id, "m", title, now).expect("accepted") {
            Submitted::Dispatched { worker, .. } => worker,
            other => panic!("the title was not placed: {other:?}"),
        }
    }

    fn timings(prompt_tokens: u32, prompt_ms: f64, generated: u32, generation_ms: f64) -> Timings {
        Timings {
            prompt_tokens,
            prompt_ms,
            cached_tokens: None,
            generated_tokens: generated,
            generation_ms,
        }
    }

    #[test]
    fn a_request_that_waited_for_a_sleeping_box_says_it_waited_for_the_wake() {
        let now = Instant::now();
        let mut s = Scheduler::new(vec![("local".to_string(), ProviderLimits::default())]);
        // Only a box that fell asleep serves "m": the request queues while the hub wakes it.
        s.set_asleep(&[super::super::AsleepBox {
            provider: "local".to_string(),
            name: "box".to_string(),
            models: vec!["m".to_string()],
        }]);
        let placement = Placement {
            affinity: Some(7),
            ..Placement::default()
        };
        let queued = s.submit(1, "m", placement.clone(), now).expect("claimed");
        assert!(matches!(queued, Submitted::Queued { .. }), "{queued:?}");
        assert_eq!(s.reason_of(1), None, "no reason while queued");
        // The box wakes and registers: the request goes to it, and says why it took a while.
        let woken = register(&mut s, "box", &["m"], 4).worker;
        assert_eq!(s.reason_of(1), Some(Reason::Waking));
        // Once awake, the next turn of the same conversation is an ordinary cache hit.
        let mut actions = Vec::new();
        assert!(s.finish(woken, 1, &mut actions));
        let next = s.submit(2, "m", placement, now).expect("accepted");
        assert!(matches!(next, Submitted::Dispatched { worker, .. } if worker == woken));
        assert_eq!(s.reason_of(2), Some(Reason::CacheHit));
        let counts: HashMap<_, _> = s.reason_counts().into_iter().collect();
        assert_eq!((counts[&Reason::Waking], counts[&Reason::CacheHit]), (1, 1));
    }

    #[test]
    fn a_box_that_must_load_the_model_first_pays_the_time_its_last_load_took() {
        let now = Instant::now();
        let states = |state: &str, load_ms| {
            vec![ModelStateReport {
                model: "m".into(),
                state: state.into(),
                load_ms,
            }]
        };
        // Equal boxes; the usual rule takes box-0, whose model map unloaded the model (its last
        // load took 20 s): box-1 has it loaded and answers 20 s sooner.
        let (mut s, ids) = fleet(true, &[Some(2000.0), Some(2000.0)]);
        s.set_model_states(ids[0], &states("idle", Some(20_000)));
        assert_eq!(place(&mut s, 1, 7, 2_000, now), ids[1]);
        assert_eq!(s.reason_of(1), Some(Reason::FasterBox));
        // A load never timed: the usual rules.
        let (mut s, ids) = fleet(true, &[Some(2000.0), Some(2000.0)]);
        s.set_model_states(ids[0], &states("idle", None));
        assert_eq!(place(&mut s, 1, 7, 2_000, now), ids[0]);
        // Loaded again: nothing to pay.
        let (mut s, ids) = fleet(true, &[Some(2000.0), Some(2000.0)]);
        s.set_model_states(ids[0], &states("idle", Some(20_000)));
        s.set_model_states(ids[0], &states("loaded", Some(20_000)));
        assert_eq!(place(&mut s, 1, 7, 2_000, now), ids[0]);
    }

    #[test]
    fn a_conversation_whose_home_unloaded_the_model_pays_its_whole_prompt_there() {
        let now = Instant::now();
        let states = |state: &str| {
            vec![ModelStateReport {
                model: "m".into(),
                state: state.into(),
                load_ms: Some(500),
            }]
        };
        // The slow box is the conversation's home: 12,000 tokens cached there.
        let (mut s, ids) = fleet(true, &[Some(600.0), Some(3000.0)]);
        s.set_cost_routing(false);
        assert_eq!(place(&mut s, 1, 7, 12_000, now), ids[0]);
        let mut actions = Vec::new();
        assert!(s.finish(ids[0], 1, &mut actions));
        s.set_cost_routing(true);
        // Its backend slept and freed the model (a load of 0.5 s): turn 2 would evaluate all
        // 12,300 tokens there (21 s), not 300 (1 s). The fast box takes it.
        s.set_model_states(ids[0], &states("unloaded"));
        assert_eq!(place(&mut s, 2, 7, 12_300, now), ids[1]);
        let weighed = s.weighed_of(2).expect("weighed").clone();
        assert!((weighed.other_secs - 21.0).abs() < 0.01, "{weighed:?}");
    }

    #[test]
    fn a_load_under_way_costs_what_is_left_of_it_and_ends_with_the_first_answer() {
        let now = Instant::now();
        let at = |secs: u64| now + std::time::Duration::from_secs(secs);
        let unloaded = vec![ModelStateReport {
            model: "m".into(),
            state: "unloaded".into(),
            load_ms: Some(20_000),
        }];
        let (mut s, ids) = fleet(true, &[Some(2000.0), Some(2000.0)]);
        s.set_model_states(ids[0], &unloaded);
        let secs = |s: &Scheduler, t| s.first_token_secs(ids[0], "m", false, None, 2_000, t);
        assert!((secs(&s, now).unwrap().0 - 21.0).abs() < 0.01);
        // A request placed there (by the usual rules) begins the load.
        s.set_cost_routing(false);
        assert_eq!(place(&mut s, 1, 1, 2_000, now), ids[0]);
        // 15 s later, 5 s of it are left: the next request's first token is about 6 s away.
        let left = secs(&s, at(15)).unwrap().0;
        assert!((5.9..7.1).contains(&left), "{left}");
        // The worker's pong still says unloaded (it says loaded once an answer began): the
        // load under way is kept.
        s.set_model_states(ids[0], &unloaded);
        assert_eq!(secs(&s, at(15)).unwrap().0, left);
        // The first answer begins: the model is loaded, whatever the last pong said.
        s.mark_started(1);
        assert!((secs(&s, at(16)).unwrap().0 - 1.0).abs() < 0.01);
    }

    #[test]
    fn every_reason_counts_in_its_own_place() {
        for (i, reason) in Reason::ALL.iter().enumerate() {
            assert_eq!(reason.index(), i, "{}", reason.as_str());
        }
    }

    #[test]
    fn a_prompt_evaluated_beside_another_only_ever_raises_the_speed_learnt() {
        let now = Instant::now();
        let (mut s, ids) = fleet(true, &[Some(3000.0)]);
        let tps = |s: &Scheduler| s.speed(ids[0], "m").and_then(|speed| speed.prompt_tps);
        // A long first turn, and a title placed while its prompt is evaluated: the two share
        // the box's batches, and each reports a slower prompt than the box's.
        place(&mut s, 1, 7, 12_000, now);
        place_title(&mut s, 2, 1_000, now);
        place(&mut s, 3, 8, 1_000, now);
        s.learn(ids[0], 1, &timings(12_000, 6_000.0, 100, 2000.0));
        s.learn(ids[0], 3, &timings(1_000, 500.0, 100, 2000.0));
        assert_eq!(
            tps(&s),
            Some(3000.0),
            "2,000 a second beside others is a floor"
        );
        // A shared sample above the estimate is learnt: the box is at least that fast.
        s.learn(ids[0], 2, &timings(1_000, 200.0, 20, 400.0));
        assert_eq!(tps(&s), Some(3600.0));
        for id in [1, 2, 3] {
            assert!(s.finish(ids[0], id, &mut Vec::new()));
        }
        // A prompt evaluated alone says what the box does, slower or not; so does one placed
        // after the others began answering.
        place(&mut s, 4, 7, 13_000, now);
        s.mark_started(4);
        place(&mut s, 5, 8, 1_000, now);
        s.learn(ids[0], 4, &timings(1_000, 500.0, 100, 2000.0));
        let alone = tps(&s).expect("measured");
        assert!((alone - 3120.0).abs() < 1e-9, "{alone}");
        s.learn(ids[0], 5, &timings(1_000, 500.0, 100, 2000.0));
        let after = tps(&s).expect("measured");
        assert!((after - 2784.0).abs() < 1e-9, "{after}");
    }

    #[test]
    fn a_speed_is_learnt_from_samples_big_enough_to_mean_something() {
        let mut speed = Speed::default();
        speed.observe(&timings(10, 5.0, 2, 10.0), false, false);
        assert_eq!(
            (speed.prompt_tps, speed.generation_tps),
            (None, None),
            "too small to learn a speed from"
        );
        assert_eq!(speed.typical_output, Some(2.0), "but an answer of 2 tokens");
        speed.observe(&timings(1000, 500.0, 100, 2000.0), false, false);
        assert_eq!(speed.prompt_tps, Some(2000.0));
        assert_eq!(speed.generation_tps, Some(50.0));
        let typical = speed.typical_output.unwrap();
        assert!((typical - 31.4).abs() < 1e-9, "{typical}");
        speed.observe(&timings(1000, 1000.0, 100, 2000.0), false, false);
        let blended = speed.prompt_tps.unwrap();
        assert!(
            (blended - 1700.0).abs() < 1e-9,
            "moves 30% towards the new sample: {blended}"
        );
        // A side request's answer (a title) is an answer, not a turn's.
        let (turn, answer) = (speed.typical_turn_output, speed.typical_output);
        assert_eq!(turn, answer, "every answer so far was a turn's");
        speed.observe(&timings(1000, 500.0, 20, 400.0), true, false);
        assert_eq!(speed.typical_turn_output, turn, "a title is not a turn");
        assert!(speed.typical_output < answer, "but it is an answer");
    }

    #[test]
    fn a_warm_up_gives_a_box_its_rates_where_none_were_measured_and_never_an_answer_length() {
        let now = Instant::now();
        let (mut s, ids) = fleet(true, &[None, None]);
        // Both boxes warmed up when their workers started: 1,000 prompt tokens in 2 s (slow)
        // and in 0.4 s (fast); 16 tokens generated at 10 and 80 a second.
        s.observe_warm_up(ids[0], "m", &timings(1000, 2000.0, 16, 1600.0));
        s.observe_warm_up(ids[1], "m", &timings(1000, 400.0, 16, 200.0));
        let fast = s.speed(ids[1], "m").expect("warmed up");
        assert_eq!(
            (fast.prompt_tps, fast.generation_tps),
            (Some(2500.0), Some(80.0))
        );
        assert_eq!(fast.typical_output, None, "a warm-up's answer is nobody's");
        assert_eq!(fast.typical_turn_output, None);
        // So the very first conversation goes to the fast box: 0.5 s there against 2.5 s on
        // the box the usual rule picks.
        assert_eq!(place(&mut s, 1, 7, 5_000, now), ids[1]);
        assert_eq!(s.reason_of(1), Some(Reason::FasterBox));
        // Traffic teaches the rest, and a later warm-up (the worker reconnecting) changes
        // nothing measured.
        s.learn(ids[1], 1, &timings(5_000, 2500.0, 100, 2000.0));
        let learnt = s.speed(ids[1], "m").unwrap();
        s.observe_warm_up(ids[1], "m", &timings(1000, 100.0, 16, 100.0));
        assert_eq!(s.speed(ids[1], "m"), Some(learnt));
        // A model the worker does not serve, or a worker that left, is no one's speed.
        s.observe_warm_up(ids[0], "other", &timings(1000, 100.0, 16, 100.0));
        assert_eq!(s.speed(ids[0], "other"), None);
    }

    #[test]
    fn warm_ups_come_with_register_or_with_a_later_models_update() {
        let now = Instant::now();
        let warm_up = |model: &str, prompt_ms| crate::protocol::WarmUp {
            model: model.to_string(),
            timings: timings(1000, prompt_ms, 16, 200.0),
        };
        let mut s = Scheduler::new(vec![("local".to_string(), ProviderLimits::default())]);
        let registered = s
            .register_worker(
                "local",
                &crate::protocol::RegisterMessage {
                    worker_name: "gpu".to_string(),
                    models: vec!["m".to_string(), "n".to_string()],
                    max_concurrent: 2,
                    protocol_version: None,
                    current_load: None,
                    mac_address: None,
                    sleeps_when_idle: None,
                    context_windows: None,
                    warm_ups: Some(vec![warm_up("m", 400.0), warm_up("elsewhere", 100.0)]),
                    sides_first: None,
                },
            )
            .expect("registered");
        let id = registered.worker;
        let tps = |s: &Scheduler, model| s.speed(id, model).and_then(|speed| speed.prompt_tps);
        assert_eq!(tps(&s, "m"), Some(2500.0));
        assert_eq!(tps(&s, "n"), None, "measured later");
        assert_eq!(tps(&s, "elsewhere"), None, "a model it does not serve");
        let models = ["m".to_string(), "n".to_string()];
        let update = [warm_up("n", 500.0)];
        s.update_models(id, &models, 0, None, Some(&update), now);
        assert_eq!(tps(&s, "n"), Some(2000.0));
        assert_eq!(tps(&s, "m"), Some(2500.0));
    }

    #[test]
    fn a_time_too_small_to_give_a_finite_rate_is_not_learnt() {
        let mut speed = Speed::default();
        speed.observe(
            &timings(1000, f64::MIN_POSITIVE / 1e10, 100, 5e-324),
            false,
            false,
        );
        assert_eq!((speed.prompt_tps, speed.generation_tps), (None, None));
        speed.observe_warm_up(&timings(1000, 5e-324, 16, 5e-324));
        assert_eq!((speed.prompt_tps, speed.generation_tps), (None, None));
    }

    #[test]
    fn an_answers_length_is_the_mean_of_what_both_boxes_measured_not_the_usual_ones_alone() {
        // Box 0 generates at 10 tokens a second and answered only titles (20 tokens); box 1
        // at 50 and answered turns (200 tokens). One length for both: 110 tokens, 11 s on
        // box 0 against 2.2 s on box 1.
        let (mut s, ids) = fleet(true, &[None, None]);
        s.observe_timings(ids[1], "m", &timings(1000, 500.0, 200, 4000.0));
        s.observe_answer(ids[0], "m", &timings(1000, 500.0, 20, 2000.0), true, false);
        let longer = |id, usual| s.longer_answer_secs(id, usual, "m", false).unwrap();
        assert!((longer(ids[0], ids[1]) - 8.8).abs() < 1e-9);
        assert!(
            (longer(ids[1], ids[0]) + 8.8).abs() < 1e-9,
            "the same either way"
        );
        // A turn: box 0 measured none, so box 1's 200.
        let turn = s.longer_answer_secs(ids[0], ids[1], "m", true).unwrap();
        assert!((turn - 16.0).abs() < 1e-9, "{turn}");
    }

    #[test]
    fn a_new_conversation_weighs_a_turns_answer_not_the_titles_a_slower_box_answered() {
        let now = Instant::now();
        // Equal prompt speeds; box 1 answered turns (200 tokens, 50 tokens/s), box 0 only
        // titles (20 tokens, 10 tokens/s: five times slower).
        let (mut s, ids) = fleet(true, &[None, None]);
        s.observe_timings(ids[1], "m", &timings(1000, 500.0, 200, 4000.0));
        let worker = place_title(&mut s, 30, 1000, now);
        assert_eq!(worker, ids[0], "an unmeasured box: the usual rule");
        s.learn(ids[0], 30, &timings(1000, 500.0, 20, 2000.0));
        let mut actions = Vec::new();
        assert!(s.finish(ids[0], 30, &mut actions));
        assert_eq!(s.speed(ids[0], "m").unwrap().typical_turn_output, None);
        // A new conversation of 12,000 tokens: 6 s to its first token on either box. Its
        // turns' answers take 4 s on box 1 and 20 s on box 0 (the titles' would take 0.4 and
        // 2 s: not clearly different once the prompt's 6 s are counted).
        assert_eq!(place(&mut s, 1, 7, 12_000, now), ids[1]);
        assert_eq!(s.reason_of(1), Some(Reason::FasterBox));
    }
}
