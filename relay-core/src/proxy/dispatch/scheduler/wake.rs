//! Waking a sleeping box as one more way to serve a request, weighed like the others.
//!
//! A box that went to sleep is remembered by name with what was measured of it: its speeds (the
//! [`cost`](super::cost) module's, kept when it left) and how long it took to come back the last
//! times it was woken (from the first Wake-on-LAN packet to its worker registering again). With
//! cost routing on, a request whose first token would come clearly sooner on such a box, once
//! awake, than on any awake one (its wake time plus its prompt at its speed, against the awake
//! estimate) waits for that box while the hub wakes it, kept from other workers for at most
//! twice the box's measured wake time (plus [`WAKE_GRACE`]): a box that does not come back
//! leaves the request to the awake ones, never to a timeout. A request that would queue anyway
//! (no awake box has a free slot) wakes such a box too when the measured wait for an awake slot
//! is clearly longer than the wake, and takes whichever slot comes first; so does one that
//! queues behind requests that have already waited, together, as long as the box takes to wake
//! (a house full for a while: the box is worth waking for the queue, not for one request,
//! whatever its size). Boxes never measured waking follow the usual rules, which wake a box only
//! when nothing awake serves the model; so do requests of unknown size, but for the queue's.

use std::time::{Duration, Instant};

use super::cost::{Weighed, CLEARLY_SOONER};
use super::{Action, AsleepBox, Phase, Placement, Request, RequestId, Scheduler, WorkerId};

/// Added to twice a box's measured wake time before a request waiting for it gives up on it.
pub const WAKE_GRACE: Duration = Duration::from_secs(5);

/// Wake times longer than this are not learnt from: the box was woken by hand, or was off.
pub(super) const LONGEST_WAKE: Duration = Duration::from_secs(600);

/// How much one new wake moves a box's wake-time estimate.
const WAKE_SAMPLE_WEIGHT: f64 = 0.5;

/// Why a sleeping box is woken: the dashboard and the log say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeCause {
    /// A request for a model that no awake box serves.
    NothingAwake,
    /// A request whose first token comes clearly sooner there, once awake, than on any awake box.
    FirstTokenSooner,
    /// A request that would queue, and would wait for an awake slot clearly longer than the wake.
    SlotWait,
    /// Requests queued for a slot have waited, together, as long as the box takes to wake.
    QueueWaited,
}

impl WakeCause {
    /// Every cause, in the order `/metrics` lists them.
    pub const ALL: [WakeCause; 4] = [
        WakeCause::NothingAwake,
        WakeCause::FirstTokenSooner,
        WakeCause::SlotWait,
        WakeCause::QueueWaited,
    ];

    /// Its name in the status API and the log.
    pub fn as_str(self) -> &'static str {
        match self {
            WakeCause::NothingAwake => "nothing_awake",
            WakeCause::FirstTokenSooner => "first_token_sooner",
            WakeCause::SlotWait => "slot_wait",
            WakeCause::QueueWaited => "queue_waited",
        }
    }
}

/// A request waiting for a sleeping box to wake (or, with no `cause`, for a slot a side
/// request holds or would take: [`Scheduler::side_wait`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct WakeWait {
    /// The box woken for it, or the one it waits for (a turn's home, a faster box's slot kept
    /// for no conversation); `None`: any box of its model (nothing awake serves it, or a side
    /// request waits for a slot kept for no conversation on any box).
    pub(super) for_box: Option<String>,
    /// When it stops waiting for the box and takes an awake one, or waits for one like any
    /// queued request; `None`: it is queued like any request meanwhile.
    pub(super) give_up_at: Option<Instant>,
    /// Why the box is woken. `None`: not a wake, a turn waiting for its conversation's own
    /// worker, full while a side request runs there ([`Scheduler::home_wait`]); nothing is
    /// woken for it, and where it ends up says why as any placement does.
    pub(super) cause: Option<WakeCause>,
    /// A side request waiting for a slot kept for no conversation ([`Scheduler::spare_wait`],
    /// [`Scheduler::faster_spare_wait`]): until `give_up_at` it takes no slot where it would
    /// evict a conversation.
    pub(super) spare_slot: bool,
    /// A box woken because its first token comes clearly sooner: the two estimates.
    pub(super) weighed: Option<Weighed>,
}

impl WakeWait {
    /// Whether, while it waits, it is kept from the worker named `name`: a request that passed
    /// up a free awake slot for the box goes to no other until its wait ends (a box that would
    /// have queued it anyway takes it whenever it frees).
    pub(super) fn keeps_from(&self, name: &str) -> bool {
        self.give_up_at.is_some() && !self.met_by(name)
    }

    /// Whether, while it waits, it takes only a slot kept for no conversation.
    pub(super) fn wants_spare_slot(&self) -> bool {
        self.spare_slot && self.give_up_at.is_some()
    }

    /// Whether a placement on the worker named `name` is the one it waited for.
    pub(super) fn met_by(&self, name: &str) -> bool {
        self.for_box.as_deref().is_none_or(|wanted| wanted == name)
    }
}

impl Scheduler {
    /// Whether `request` waited for a box to wake and `worker` is that box (its reason is then
    /// "waking"). The waiter of a request waiting for one is first woken at `give_up_at`.
    pub(super) fn waited_for(&self, request: &Request, worker: WorkerId) -> bool {
        let name = self.workers.get(&worker).map_or("", |w| w.name.as_str());
        request
            .wake
            .as_ref()
            .is_some_and(|w| w.cause.is_some() && w.met_by(name))
    }

    /// Replaces the boxes asleep: their models are claimed like listed ones until the box wakes
    /// or is forgotten (requests for them queue at their provider, and aliases and upstreams
    /// leave them alone), and cost routing may wake them. Unknown providers are ignored.
    pub fn set_asleep(&mut self, boxes: &[AsleepBox]) {
        for p in &mut self.providers {
            p.asleep.clear();
        }
        for b in boxes {
            if let Some(index) = self.provider_index(&b.provider) {
                let asleep = &mut self.providers[index].asleep;
                asleep.extend(b.models.iter().map(|m| std::sync::Arc::from(m.as_str())));
            }
        }
        self.known_speeds.set_asleep(boxes.to_vec());
    }

    /// Box `name` came back `took` after the first packet that woke it.
    pub fn learn_wake(&mut self, name: &str, took: Duration) {
        if took <= LONGEST_WAKE {
            self.known_speeds
                .learn_wake(name, took.as_secs_f64(), WAKE_SAMPLE_WEIGHT);
        }
    }

    /// How long box `name` was measured to take to wake, if it was.
    pub fn wake_time(&self, name: &str) -> Option<Duration> {
        self.known_speeds
            .wake_secs(name)
            .map(Duration::from_secs_f64)
    }

    /// Whether the hub should wake a box for queued `request`, and why: `Some(Some(name))`
    /// that box, `Some(None)` every sleeping box of its model.
    pub fn box_to_wake(&self, request: RequestId) -> Option<(Option<&str>, WakeCause)> {
        let wait = self.requests.get(&request)?.wake.as_ref()?;
        Some((wait.for_box.as_deref(), wait.cause?))
    }

    /// Whether a request for `model` at `provider`, which the usual rules (and cost routing
    /// among awake boxes) would place on `picked` (`None`: it would queue), should wait for a
    /// sleeping box instead (see the module).
    pub(super) fn wake_plan(
        &self,
        provider: usize,
        model: &str,
        placement: &Placement,
        picked: Option<WorkerId>,
        now: Instant,
    ) -> Option<WakeWait> {
        let p = &self.providers[provider];
        if p.asleep.contains(model) && p.model_workers.get(model).is_none_or(|w| w.is_empty()) {
            // Only a sleeping box serves the model: the request waits while the hub wakes it.
            return Some(WakeWait {
                for_box: None,
                give_up_at: None,
                cause: Some(WakeCause::NothingAwake),
                spare_slot: false,
                weighed: None,
            });
        }
        if !self.cost_routing {
            return None;
        }
        let soonest = placement.prompt_tokens.and_then(|tokens| {
            self.sooner_once_awake(provider, model, (tokens, placement.affinity), picked, now)
        });
        match picked {
            None => soonest.or_else(|| self.wake_for_queue(provider, model, now)),
            Some(_) => soonest,
        }
    }

    /// The sleeping box of `model` whose first token for a request of `tokens` (of conversation
    /// `affinity`), once awake, comes clearly sooner than the awake estimate (`picked`'s, or,
    /// when every slot is taken, the wait for a slot and the soonest an awake worker would
    /// evaluate the prompt). Needs the box's measured wake time and speed.
    fn sooner_once_awake(
        &self,
        provider: usize,
        model: &str,
        (tokens, affinity): (u32, Option<u64>),
        picked: Option<WorkerId>,
        now: Instant,
    ) -> Option<WakeWait> {
        let p = &self.providers[provider];
        let (asleep_secs, name, wake_secs) = self
            .sleepers_of(provider, model)
            .filter_map(|(name, wake)| {
                let speed = self.known_speeds.speed(name, model)?.prompt_tps?;
                Some((wake + f64::from(tokens.max(1)) / speed, name, wake))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))?;
        let awake_secs = match picked {
            Some(worker) => self
                .first_token_secs(worker, model, false, affinity, tokens, now)
                .map(|(secs, _)| secs),
            None => p.model_workers.get(model).and_then(|workers| {
                let prompt = workers
                    .iter()
                    .filter_map(|w| {
                        self.first_token_secs(*w, model, false, affinity, tokens, now)
                            .map(|(secs, _)| secs)
                    })
                    .min_by(f64::total_cmp)?;
                Some(self.slot_wait_secs(workers, model, p.queue.len())? + prompt)
            }),
        }?;
        if asleep_secs >= awake_secs * CLEARLY_SOONER {
            return None;
        }
        // A request that passes up a free awake slot waits for the box a bounded time; one that
        // would queue anyway waits like any queued request.
        let give_up_after = Duration::from_secs_f64(wake_secs * 2.0) + WAKE_GRACE;
        Some(WakeWait {
            for_box: Some(name.to_string()),
            give_up_at: picked.map(|_| now + give_up_after),
            cause: Some(if picked.is_some() {
                WakeCause::FirstTokenSooner
            } else {
                WakeCause::SlotWait
            }),
            spare_slot: false,
            weighed: Some(Weighed {
                kept: false,
                first_token_secs: asleep_secs,
                other: picked
                    .and_then(|id| self.workers.get(&id))
                    .map(|w| w.name.clone()),
                other_secs: awake_secs,
                answer_secs: 0.0,
                eviction_secs: 0.0,
            }),
        })
    }

    /// A full house whose queued requests have lost, together, as long waiting as a sleeping
    /// box of `model` takes to wake: the quickest such box is woken for the queue, whatever
    /// this request's size (it takes whichever slot frees first, as queued requests do).
    fn wake_for_queue(&self, provider: usize, model: &str, now: Instant) -> Option<WakeWait> {
        let (name, wake_secs) = self
            .sleepers_of(provider, model)
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        (self.queued_wait_secs(provider, model, now) >= wake_secs).then(|| WakeWait {
            for_box: Some(name.to_string()),
            give_up_at: None,
            cause: Some(WakeCause::QueueWaited),
            spare_slot: false,
            weighed: None,
        })
    }

    /// The sleeping boxes of `provider` that serve `model` and were measured waking: names and
    /// wake times (seconds).
    fn sleepers_of<'a>(
        &'a self,
        provider: usize,
        model: &'a str,
    ) -> impl Iterator<Item = (&'a str, f64)> + 'a {
        let provider = self.providers[provider].name.as_str();
        self.known_speeds
            .asleep()
            .iter()
            .filter(move |b| b.provider == provider && b.models.iter().any(|m| m == model))
            .filter_map(|b| Some((b.name.as_str(), self.known_speeds.wake_secs(&b.name)?)))
    }

    /// The seconds the requests for `model` queued at `provider` have waited for a slot, added
    /// up. Requests held for one box (one being woken, or their home) are not counted: every
    /// slot being taken is not what keeps them; those that asked for a wake but take whichever
    /// slot frees first are, so a box that does not come is asked again while the queue waits.
    fn queued_wait_secs(&self, provider: usize, model: &str, now: Instant) -> f64 {
        let held = |r: &Request| r.wake.as_ref().is_some_and(|w| w.give_up_at.is_some());
        self.requests
            .values()
            .filter(|r| r.provider == provider && r.phase == Phase::Queued && !held(r))
            .filter(|r| &*r.model == model)
            .map(|r| now.saturating_duration_since(r.arrived).as_secs_f64())
            .sum()
    }

    /// Seconds until a slot frees for a request behind `queued` others, when every slot of
    /// `workers` is taken: each slot frees once per answer (its box's typical answer length at
    /// its generation speed), so slots free at the sum of slots over answer times. `None` when
    /// some worker's answers are not measured.
    pub(super) fn slot_wait_secs(
        &self,
        workers: &[WorkerId],
        model: &str,
        queued: usize,
    ) -> Option<f64> {
        let mut slots_per_sec = 0.0;
        for id in workers {
            let w = self.workers.get(id)?;
            let speed = w.speeds.get(model)?;
            let answer_secs = speed.typical_output? / speed.generation_tps?;
            slots_per_sec += f64::from(w.max_concurrent.max(1)) / answer_secs.max(0.001);
        }
        (slots_per_sec > 0.0).then(|| (queued as f64 + 1.0) / slots_per_sec)
    }

    /// The waiter of `request` was woken at its wait's end (`give_up_at`): a request still
    /// queued for a box that has not woken (or for its conversation's home, still full) takes a
    /// free worker now, or waits like any queued request until its own queue deadline (its
    /// waiter is told, `Action::Requeued`). False when the request was not waiting for a box
    /// past its wait.
    pub fn stop_waiting_for_wake(
        &mut self,
        request: RequestId,
        now: Instant,
        actions: &mut Vec<Action>,
    ) -> bool {
        let Some(r) = self.requests.get_mut(&request) else {
            return false;
        };
        let waited_out = r.phase == Phase::Queued
            && r.wake
                .as_ref()
                .and_then(|w| w.give_up_at)
                .is_some_and(|at| at <= now);
        if !waited_out {
            return false;
        }
        // Still the box's if it wakes before an awake slot frees: the reason stays "waking".
        if let Some(wait) = r.wake.as_mut() {
            wait.give_up_at = None;
        }
        self.dequeue(request);
        self.place_again(request, now, actions);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::register;
    use super::super::{ProviderLimits, Reason, Submitted};
    use super::*;
    use crate::protocol::Timings;

    /// A slow box awake (600 prompt tok/s) and a box "fast" (3,000 tok/s) measured, then gone
    /// to sleep; `wake` is its measured wake time, if any. Cost routing `on`.
    fn fleet(on: bool, wake: Option<u64>) -> (Scheduler, WorkerId) {
        let mut s = Scheduler::new(vec![("local".to_string(), ProviderLimits::default())]);
        s.set_cost_routing(on);
        let measure = |s: &mut Scheduler, id, tps: f64| {
            let timings = Timings {
                prompt_tokens: 1000,
                prompt_ms: 1000.0 * 1000.0 / tps,
                cached_tokens: None,
                generated_tokens: 100,
                generation_ms: 2000.0,
            };
            s.observe_timings(id, "m", &timings);
        };
        let slow = register(&mut s, "slow", &["m"], 4).worker;
        measure(&mut s, slow, 600.0);
        let fast = register(&mut s, "fast", &["m"], 4).worker;
        measure(&mut s, fast, 3000.0);
        s.worker_gone(fast, Instant::now());
        s.set_asleep(&[AsleepBox {
            provider: "local".to_string(),
            name: "fast".to_string(),
            models: vec!["m".to_string()],
        }]);
        if let Some(secs) = wake {
            s.learn_wake("fast", Duration::from_secs(secs));
        }
        (s, slow)
    }

    fn submit(s: &mut Scheduler, id: RequestId, tokens: u32, now: Instant) -> Submitted {
        let placement = Placement {
            affinity: Some(id),
            prompt_tokens: Some(tokens),
            ..Placement::default()
        };
        s.submit(id, "m", placement, now).expect("accepted")
    }

    /// Requests 1–4, short prompts, take the slow box's four slots (each sooner there than a
    /// wake).
    fn fill_slow_box(s: &mut Scheduler, now: Instant) {
        for id in 1..=4 {
            assert!(matches!(
                submit(s, id, 300, now),
                Submitted::Dispatched { .. }
            ));
        }
    }

    #[test]
    fn a_long_prompt_waits_for_a_faster_box_to_wake_when_its_first_token_comes_clearly_sooner() {
        let now = Instant::now();
        let (mut s, slow) = fleet(true, Some(4));
        // 12,000 tokens: 20 s on the slow box, 4 s to wake + 4 s on the fast one.
        match submit(&mut s, 1, 12_000, now) {
            Submitted::Queued { queue_deadline, .. } => {
                assert_eq!(
                    queue_deadline,
                    now + Duration::from_secs(13),
                    "2 × 4 s + 5 s"
                );
            }
            other => panic!("should wait for the wake: {other:?}"),
        }
        assert_eq!(
            s.box_to_wake(1),
            Some((Some("fast"), WakeCause::FirstTokenSooner))
        );
        // While it waits, a slot freeing on the slow box does not take it.
        let short = submit(&mut s, 2, 300, now);
        assert!(matches!(short, Submitted::Dispatched { worker, .. } if worker == slow));
        let mut actions = Vec::new();
        assert!(s.finish(slow, 2, &mut actions));
        assert_eq!(actions, [], "kept for the fast box");
        let woken = register(&mut s, "fast", &["m"], 4);
        assert_eq!(
            woken.actions,
            [Action::Dispatch {
                request: 1,
                worker: woken.worker
            }]
        );
        assert_eq!(s.reason_of(1), Some(Reason::Waking));
        // The dashboard shows what was weighed: 4 s to wake and 4 s of prompt, against 20 s
        // on the slow box.
        let weighed = s.weighed_of(1).expect("weighed");
        assert!((weighed.first_token_secs - 8.0).abs() < 0.01, "{weighed:?}");
        assert!((weighed.other_secs - 20.0).abs() < 0.01, "{weighed:?}");
        assert_eq!(weighed.other.as_deref(), Some("slow"));
        assert_eq!(
            s.weighed_of(2),
            None,
            "the only awake box: nothing to weigh"
        );
    }

    #[test]
    fn a_short_prompt_is_not_worth_a_wake() {
        let now = Instant::now();
        let (mut s, slow) = fleet(true, Some(4));
        // 300 tokens: 0.5 s on the slow box against 4.1 s.
        assert!(
            matches!(submit(&mut s, 1, 300, now), Submitted::Dispatched { worker, .. } if worker == slow)
        );
        assert_eq!(s.box_to_wake(1), None);
    }

    #[test]
    fn an_unmeasured_wake_or_cost_routing_off_leaves_the_box_asleep() {
        let now = Instant::now();
        for (on, wake) in [(true, None), (false, Some(4))] {
            let (mut s, slow) = fleet(on, wake);
            let placed = submit(&mut s, 1, 12_000, now);
            assert!(
                matches!(placed, Submitted::Dispatched { worker, .. } if worker == slow),
                "cost routing {on}, wake {wake:?}: {placed:?}"
            );
            assert_eq!(s.wake_time("fast"), wake.map(Duration::from_secs));
        }
    }

    #[test]
    fn a_box_that_does_not_wake_leaves_the_request_to_the_awake_ones() {
        let now = Instant::now();
        let (mut s, slow) = fleet(true, Some(4));
        assert!(matches!(
            submit(&mut s, 1, 12_000, now),
            Submitted::Queued { .. }
        ));
        let mut actions = Vec::new();
        let early = now + Duration::from_secs(12);
        assert!(!s.stop_waiting_for_wake(1, early, &mut actions), "not yet");
        let due = now + Duration::from_secs(13);
        assert!(s.stop_waiting_for_wake(1, due, &mut actions));
        assert_eq!(
            actions,
            [Action::Dispatch {
                request: 1,
                worker: slow
            }]
        );
        assert_eq!(s.reason_of(1), Some(Reason::NewConversation));
        assert!(!s.stop_waiting_for_wake(1, due, &mut actions), "once");
    }

    #[test]
    fn a_short_request_that_would_queue_wakes_a_box_only_when_the_slots_free_slowly() {
        let now = Instant::now();
        for long_answers in [false, true] {
            let (mut s, slow) = fleet(true, Some(4));
            if long_answers {
                // The slow box's answers are measured at ~1,000 tokens, 10 tokens a second: a
                // slot frees every ~25 s.
                for _ in 0..20 {
                    let timings = Timings {
                        prompt_tokens: 1000,
                        prompt_ms: 1000.0 * 1000.0 / 600.0,
                        cached_tokens: None,
                        generated_tokens: 1000,
                        generation_ms: 100_000.0,
                    };
                    s.observe_timings(slow, "m", &timings);
                }
            }
            fill_slow_box(&mut s, now);
            // 300 tokens: 0.5 s on the slow box once a slot frees, 4.1 s with the wake.
            assert!(matches!(
                submit(&mut s, 5, 300, now),
                Submitted::Queued { .. }
            ));
            let woken = long_answers.then_some((Some("fast"), WakeCause::SlotWait));
            assert_eq!(s.box_to_wake(5), woken, "long answers: {long_answers}");
        }
    }

    #[test]
    fn a_request_that_would_queue_wakes_a_measured_box_and_takes_whichever_frees_first() {
        let now = Instant::now();
        let (mut s, slow) = fleet(true, Some(4));
        fill_slow_box(&mut s, now);
        // The next, a long one, would queue: the fast box is woken to add its slots. Its waiter
        // keeps the usual queue deadline.
        let limits = ProviderLimits::default();
        match submit(&mut s, 5, 12_000, now) {
            Submitted::Queued { queue_deadline, .. } => {
                assert_eq!(queue_deadline, now + limits.queue_timeout)
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.box_to_wake(5), Some((Some("fast"), WakeCause::SlotWait)));
        // A slot of the slow box frees first: the request takes it, and says why it went there.
        let mut actions = Vec::new();
        assert!(s.finish(slow, 1, &mut actions));
        assert_eq!(
            actions,
            [Action::Dispatch {
                request: 5,
                worker: slow
            }]
        );
        assert_ne!(s.reason_of(5), Some(Reason::Waking));
    }

    #[test]
    fn a_house_whose_queue_has_waited_as_long_as_a_wake_wakes_the_sleeping_box() {
        let now = Instant::now();
        // Answers of 100 tokens in 2 s: a slot of the slow box frees every half second, so no
        // short request alone is worth a 4 s wake.
        let (mut s, slow) = fleet(true, Some(4));
        fill_slow_box(&mut s, now);
        for id in 5..=8 {
            assert!(matches!(
                submit(&mut s, id, 300, now),
                Submitted::Queued { .. }
            ));
            assert_eq!(s.box_to_wake(id), None, "one request does not gain by it");
        }
        // Half a second later the four have waited 2 s together: not yet.
        let soon = now + Duration::from_millis(500);
        assert!(matches!(
            submit(&mut s, 9, 300, soon),
            Submitted::Queued { .. }
        ));
        assert_eq!(s.box_to_wake(9), None);
        // At 1.5 s the five queued have waited 6.5 s together, none of them 4 s: the box is
        // woken for the queue, and the request still takes whichever slot frees first.
        let later = now + Duration::from_millis(1500);
        match submit(&mut s, 10, 300, later) {
            Submitted::Queued { queue_deadline, .. } => {
                assert_eq!(
                    queue_deadline,
                    later + ProviderLimits::default().queue_timeout
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            s.box_to_wake(10),
            Some((Some("fast"), WakeCause::QueueWaited))
        );
        // Whatever the request's size: one of unknown size wakes it for the queue too.
        let unsized_request = Placement {
            affinity: Some(11),
            ..Placement::default()
        };
        assert!(matches!(
            s.submit(11, "m", unsized_request, later),
            Ok(Submitted::Queued { .. })
        ));
        assert_eq!(
            s.box_to_wake(11),
            Some((Some("fast"), WakeCause::QueueWaited))
        );
        // The box does not come; the slow box's slots serve 5–9, and 10 and 11 (which asked for
        // the wake) still wait for a slot: their waits count, and a later request asks again.
        for id in 1..=5 {
            assert!(s.finish(slow, id, &mut Vec::new()));
        }
        let much_later = later + Duration::from_secs(3);
        assert!(matches!(
            submit(&mut s, 12, 300, much_later),
            Submitted::Queued { .. }
        ));
        assert_eq!(
            s.box_to_wake(12),
            Some((Some("fast"), WakeCause::QueueWaited)),
            "10 and 11 have waited 6 s together"
        );
    }

    #[test]
    fn a_queue_does_not_wake_a_box_never_measured_waking_or_with_cost_routing_off() {
        let now = Instant::now();
        let later = now + Duration::from_secs(30);
        for (on, wake) in [(true, None), (false, Some(4))] {
            let (mut s, _slow) = fleet(on, wake);
            for id in 1..=6 {
                submit(&mut s, id, 300, now);
            }
            assert!(matches!(
                submit(&mut s, 7, 300, later),
                Submitted::Queued { .. }
            ));
            assert_eq!(s.box_to_wake(7), None, "cost routing {on}, wake {wake:?}");
        }
    }
}
