//! Models a box must load before it answers: reported by its worker (the model map's, and
//! those its backends unloaded by themselves), timed there, and weighed by cost routing
//! ([`super::cost`]) as a load plus the whole prompt, the cache having gone with the model. A
//! request the usual rules would send to such a box may wait a while for one that has the model
//! loaded and only lacks a free slot ([`Scheduler::load_wait`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cost::CLEARLY_SOONER;
use super::wake::WakeWait;
use super::{Placement, RequestId, Scheduler, Weighed, WorkerId};
use crate::protocol::ModelStateReport;

/// The longest a request waits for a loaded box's slot rather than load the model elsewhere,
/// whatever the estimates say: a slot's wait is an answer of unknown length.
const LOAD_WAIT_CAP: Duration = Duration::from_secs(30);

/// The window over which the rate of arrivals is taken ([`Arrivals`]).
const ARRIVALS_WINDOW: Duration = Duration::from_secs(60);

/// The shortest span a rate of arrivals is taken over: two requests a second apart are not a
/// rate of one a second.
const MIN_ARRIVALS_SPAN: Duration = Duration::from_secs(10);

/// The most arrivals kept: beyond this many in [`ARRIVALS_WINDOW`] the fleet is busy anyway.
const MAX_ARRIVALS: usize = 256;

/// A loaded box is waited for only while requests arrive at under this share of the rate its
/// slots free: above it, the box that must load the model is needed soon anyway, and every
/// request after this one waits for its load the longer ([`Scheduler::load_wait`]).
const LOAD_WAIT_UTILISATION: f64 = 0.5;

/// When requests arrived in the last [`ARRIVALS_WINDOW`], oldest first.
#[derive(Debug, Default)]
pub(super) struct Arrivals {
    at: std::collections::VecDeque<Instant>,
}

impl Arrivals {
    /// A request arrived `at`.
    pub(super) fn saw(&mut self, at: Instant) {
        while self.at.len() >= MAX_ARRIVALS
            || (self.at.front())
                .is_some_and(|first| at.saturating_duration_since(*first) > ARRIVALS_WINDOW)
        {
            self.at.pop_front();
        }
        self.at.push_back(at);
    }

    /// Requests per second before `now`: over the last [`ARRIVALS_WINDOW`], or since the first
    /// arrival kept when that is later ([`MIN_ARRIVALS_SPAN`] at least) — the first minute of a
    /// burst is a burst, not a sixtieth of one.
    fn rate(&self, now: Instant) -> f64 {
        let recent: Vec<&Instant> = (self.at.iter())
            .filter(|at| now.saturating_duration_since(**at) <= ARRIVALS_WINDOW)
            .collect();
        // The earliest, not the first kept: callers' clocks may be read a little out of order.
        let span = (recent.iter().min())
            .map_or(ARRIVALS_WINDOW, |first| {
                now.saturating_duration_since(**first)
            })
            .max(MIN_ARRIVALS_SPAN);
        recent.len() as f64 / span.as_secs_f64()
    }
}

impl Scheduler {
    /// `worker` reported its models' states (in its pongs: our worker's model map, and the models
    /// its other backends unloaded by themselves): a model not loaded there costs the time its
    /// last load took, and its whole prompt, before a first token; one whose load was never
    /// timed leaves that box to the usual rules.
    pub fn set_model_states(&mut self, worker: WorkerId, states: &[ModelStateReport]) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        w.cold = states
            .iter()
            .filter(|s| s.state != "loaded")
            .map(|s| {
                let load_secs = s.load_ms.map(|ms| ms as f64 / 1000.0);
                (Arc::from(s.model.as_str()), load_secs)
            })
            .collect();
        let cold = &w.cold;
        w.loading.retain(|model, _| cold.contains_key(model));
    }

    /// `request` was placed on `worker` at `at`: where its model is not loaded there, the load
    /// begins, and a request placed there later waits only for what is left of it.
    pub(super) fn load_begins(
        &mut self,
        worker: WorkerId,
        request: RequestId,
        at: Option<std::time::Instant>,
    ) {
        let (Some(entry), Some(at)) = (self.requests.get(&request), at) else {
            return;
        };
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        if w.cold.contains_key(&entry.model) {
            w.loading.entry(entry.model.clone()).or_insert(at);
        }
    }

    /// `request`'s answer began: its model is loaded where it runs, before the worker's next
    /// pong can say so.
    pub(super) fn loaded_by(&mut self, request: RequestId) {
        let Some(entry) = self.requests.get(&request) else {
            return;
        };
        let super::Phase::Assigned { worker } = entry.phase else {
            return;
        };
        if let Some(w) = self.workers.get_mut(&worker) {
            w.cold.remove(&entry.model);
            w.loading.remove(&entry.model);
        }
    }

    /// With cost routing, whether a request of `model` the usual rules (or cost routing among
    /// the free boxes) put on `picked`, which must load the model first, waits instead for a
    /// box that has it loaded and no slot free: there its first token — once a slot frees, at
    /// the rate that box's answers free them ([`Scheduler::slot_wait_secs`]) — comes clearly
    /// sooner than after the load. Only free boxes are weighed otherwise
    /// ([`Scheduler::sooner_than`]), and a turn whose home unloaded the model while the fast box
    /// was full loaded it on a box five times slower: 8 s and its whole prompt, where the fast
    /// box freed a slot in two (the fleet bench with `FLEET_UNLOADS`).
    ///
    /// Not while other requests of the provider are queued, nor while requests (of any model)
    /// arrive at [`LOAD_WAIT_UTILISATION`] of the rate the loaded box frees slots or more: then
    /// the box that must load is needed soon anyway, and each request held keeps it unloaded
    /// for the next (the fleet bench's busy chat, 6.74 → 7.58 s p90 without these two gates).
    /// A slot's wait is an answer of unknown length, so the wait is bounded: the request goes
    /// to `picked` once half of what waiting could save has gone by, so that a wrong guess
    /// costs at most half again.
    pub(super) fn load_wait(
        &self,
        provider: usize,
        model: &str,
        placement: &Placement,
        picked: Option<WorkerId>,
        now: Instant,
    ) -> Option<WakeWait> {
        let (picked, tokens) = (picked?, placement.prompt_tokens?);
        if !self.cost_routing || placement.side {
            return None;
        }
        let w = self.workers.get(&picked)?;
        let p = &self.providers[provider];
        if !w.cold.contains_key(model) || p.queue.len() > 0 {
            return None;
        }
        let affinity = placement.affinity;
        let first_token = |id| {
            self.first_token_secs(id, model, false, affinity, tokens, now)
                .map(|(secs, _)| secs)
        };
        let on_picked = first_token(picked)?;
        let (secs, prompt_there, slot_wait, id) = p
            .model_workers
            .get(model)?
            .iter()
            .filter(|id| **id != picked)
            .filter(|id| {
                // A window too small for the prompt would never take it from the queue.
                self.workers.get(id).is_some_and(|w| {
                    let loaded = !w.cold.contains_key(model) && w.fits(model, Some(tokens));
                    loaded && !w.draining && !w.has_capacity()
                })
            })
            .filter_map(|id| {
                let prompt = first_token(*id)?;
                let wait = self.slot_wait_secs(&[*id], model, 0)?;
                Some((wait + prompt, prompt, wait, *id))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))?;
        if secs >= on_picked * CLEARLY_SOONER {
            return None;
        }
        if self.arrivals.rate(now) * slot_wait >= LOAD_WAIT_UTILISATION {
            return None;
        }
        let worth_waiting = ((on_picked - prompt_there) / 2.0).max(0.0);
        let give_up_after = Duration::from_secs_f64(worth_waiting).min(LOAD_WAIT_CAP);
        let name = self.workers.get(&id)?.name.clone();
        Some(WakeWait {
            for_box: Some(name),
            give_up_at: Some(now + give_up_after),
            cause: None,
            spare_slot: false,
            weighed: Some(Weighed {
                kept: false,
                first_token_secs: secs,
                other: Some(w.name.clone()),
                other_secs: on_picked,
                answer_secs: 0.0,
                eviction_secs: 0.0,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::cost::tests::{fleet, place};
    use super::super::{Action, Placement, Reason, Submitted};
    use super::*;

    /// A fast box (3,000 prompt tokens/s) full of four answering conversations, and a box five
    /// times slower whose backend unloaded the model (its last load took 8 s); each answers in
    /// about 2 s, so a slot of the fast box frees about every half second.
    fn fast_box_full_slow_box_unloaded(now: Instant) -> (Scheduler, Vec<WorkerId>) {
        let (mut s, ids) = fleet(true, &[Some(3000.0), Some(600.0)]);
        s.set_model_states(
            ids[1],
            &[ModelStateReport {
                model: "m".into(),
                state: "unloaded".into(),
                load_ms: Some(8_000),
            }],
        );
        for request in 1..=4 {
            assert_eq!(place(&mut s, request, request, 1_000, now), ids[0]);
            s.mark_started(request);
        }
        (s, ids)
    }

    fn turn(s: &mut Scheduler, request: RequestId, now: Instant) -> Submitted {
        let placement = Placement {
            affinity: Some(request),
            prompt_tokens: Some(1_000),
            ..Placement::default()
        };
        s.submit(request, "m", placement, now).expect("accepted")
    }

    #[test]
    fn a_request_waits_for_a_loaded_box_whose_slot_frees_sooner_than_a_load_elsewhere() {
        let now = Instant::now();
        let (mut s, ids) = fast_box_full_slow_box_unloaded(now);
        // The slow box would answer after its 8 s load and the whole prompt (9.7 s); the fast
        // box frees a slot in about half a second and evaluates the prompt in a third.
        assert!(matches!(turn(&mut s, 5, now), Submitted::Queued { .. }));
        let mut actions = Vec::new();
        assert!(s.finish(ids[0], 1, &mut actions));
        let dispatched: Vec<_> = (actions.iter())
            .filter_map(|a| match a {
                Action::Dispatch { request, worker } => Some((*request, *worker)),
                _ => None,
            })
            .collect();
        assert_eq!(dispatched, vec![(5, ids[0])]);
        // It says why, and what it was weighed against.
        assert_eq!(s.reason_of(5), Some(Reason::FasterBox));
        let weighed = s.weighed_of(5).expect("weighed");
        assert_eq!(weighed.other.as_deref(), Some("box-1"));
        assert!(
            weighed.other_secs > 9.0 && weighed.first_token_secs < 1.5,
            "{weighed:?}"
        );
    }

    #[test]
    fn a_request_waiting_for_a_loaded_box_loads_the_model_elsewhere_once_waiting_cannot_win() {
        let now = Instant::now();
        let (mut s, ids) = fast_box_full_slow_box_unloaded(now);
        assert!(matches!(turn(&mut s, 5, now), Submitted::Queued { .. }));
        let mut actions = Vec::new();
        // Half of what the load would have saved (9.7 s less the fast box's third) is about
        // 4.7 s: still waiting at 4, placed at 5.
        assert!(!s.stop_waiting_for_wake(5, now + Duration::from_secs(4), &mut actions));
        assert!(s.stop_waiting_for_wake(5, now + Duration::from_secs(5), &mut actions));
        assert!(actions.contains(&Action::Dispatch {
            request: 5,
            worker: ids[1]
        }));
    }

    #[test]
    fn no_request_waits_for_a_loaded_box_while_others_queue_or_arrive_faster_than_it_frees() {
        let now = Instant::now();
        // One waits; the next, arriving while it waits, loads the model on the slow box: two
        // requests at once are demand the slow box is needed for.
        let (mut s, ids) = fast_box_full_slow_box_unloaded(now);
        assert!(matches!(turn(&mut s, 5, now), Submitted::Queued { .. }));
        let second = turn(&mut s, 6, now + Duration::from_millis(100));
        assert!(matches!(second, Submitted::Dispatched { worker, .. } if worker == ids[1]));
        // Requests arriving at two a second, where the fast box frees a slot every half second:
        // none waits.
        let (mut s, ids) = fast_box_full_slow_box_unloaded(now);
        for tenth in 0..20 {
            s.arrivals.saw(now - Duration::from_millis(500 * tenth));
        }
        let placed = turn(&mut s, 5, now);
        assert!(matches!(placed, Submitted::Dispatched { worker, .. } if worker == ids[1]));
        // A box whose model is loaded is not waited for; nor is one whose load was never timed.
        let (mut s, ids) = fast_box_full_slow_box_unloaded(now);
        let loaded = ModelStateReport {
            model: "m".into(),
            state: "loaded".into(),
            load_ms: Some(8_000),
        };
        s.set_model_states(ids[1], &[loaded]);
        assert!(
            matches!(turn(&mut s, 5, now), Submitted::Dispatched { worker, .. } if worker == ids[1])
        );
        let (mut s, ids) = fast_box_full_slow_box_unloaded(now);
        let untimed = ModelStateReport {
            model: "m".into(),
            state: "unloaded".into(),
            load_ms: None,
        };
        s.set_model_states(ids[1], &[untimed]);
        assert!(
            matches!(turn(&mut s, 5, now), Submitted::Dispatched { worker, .. } if worker == ids[1])
        );
        // Nor one whose window cannot hold the prompt: it would never take it from the queue.
        let (mut s, ids) = fast_box_full_slow_box_unloaded(now);
        let fast = s.workers.get_mut(&ids[0]).expect("registered");
        fast.windows.insert(Arc::from("m"), 800);
        assert!(
            matches!(turn(&mut s, 5, now), Submitted::Dispatched { worker, .. } if worker == ids[1])
        );
    }

    #[test]
    fn arrivals_are_a_rate_over_the_last_minute_or_since_the_first_and_stay_bounded() {
        let now = Instant::now();
        let mut arrivals = Arrivals::default();
        assert_eq!(arrivals.rate(now), 0.0);
        // Two a second apart are not a rate of two a second: ten seconds at least.
        arrivals.saw(now);
        arrivals.saw(now + Duration::from_secs(1));
        assert!((arrivals.rate(now + Duration::from_secs(1)) - 0.2).abs() < 1e-9);
        // Thirty over thirty seconds: one a second.
        let mut arrivals = Arrivals::default();
        for second in 0..30 {
            arrivals.saw(now + Duration::from_secs(second));
        }
        let rate = arrivals.rate(now + Duration::from_secs(30));
        assert!((rate - 1.0).abs() < 1e-9, "{rate}");
        // Two minutes on, those have left the window.
        assert_eq!(arrivals.rate(now + Duration::from_secs(120)), 0.0);
        // A flood keeps the newest few hundred.
        for n in 0..10_000u64 {
            arrivals.saw(now + Duration::from_millis(40 + n));
        }
        assert_eq!(arrivals.at.len(), MAX_ARRIVALS);
    }
}
