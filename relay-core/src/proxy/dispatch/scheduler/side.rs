//! Where a side request goes: Claude Code's titles and summaries (`claude-haiku-*` with the main
//! conversation's session), short and one-off, each keyed by its own prompt.
//!
//! Placed as new conversations they became homes of their own, one per title: the count of
//! conversations per slot that places real conversations filled with them, and on a box whose
//! slots all held conversations a title took the slot of one whose next turn then evaluated its
//! whole history again. A side request instead goes to the box with the most slots kept for no
//! conversation, and is nobody's home after (its worker keeps it out of the conversations' slots
//! the same way: `worker::slot_pins`). A turn whose home is full while a title runs there waits
//! for it a few seconds rather than move ([`Scheduler::home_wait`]); a title waits as long for a
//! slot kept for no conversation rather than take a conversation's ([`Scheduler::spare_wait`]),
//! or with cost routing for one on a faster box rather than queue behind long prompts on a slow
//! one ([`Scheduler::faster_spare_wait`]).

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use super::cost::CLEARLY_SOONER;
use super::wake::WakeWait;
use super::{Placement, Scheduler, Worker, WorkerId};

/// How long a turn waits for its conversation's own worker while a side request fills its last
/// slot ([`Scheduler::home_wait`]): a title on a slow box (a thousand prompt tokens at 600 a
/// second, thirty tokens of answer at 12) takes about five.
const HOME_WAIT: Duration = Duration::from_secs(5);

/// How long a side request waits for a slot kept for no conversation
/// ([`Scheduler::spare_wait`]).
const SPARE_WAIT: Duration = Duration::from_secs(5);

/// How long after the last side request boxes keep a slot for the next: Claude Code sends one
/// beside many of its turns, and its user's pauses between turns are minutes at most.
const SIDE_FLOW: Duration = Duration::from_secs(600);

/// When the last side request (or a turn of a client that sends them) arrived: while they flow, cost routing keeps a slot on each box
/// for them ([`Scheduler::leaves_no_side_slot`]).
#[derive(Debug, Default)]
pub(super) struct SideFlow {
    last: Option<Instant>,
}

impl SideFlow {
    /// A request with this `placement`, arrived `at`, was placed: a side request flows.
    pub(super) fn saw(&mut self, placement: &Placement, at: Instant) {
        if placement.side {
            self.flows_at(at);
        }
    }

    /// A request with this `placement` arrived `at`: a turn of a client known to send side
    /// requests says they flow before it is placed, so its own placement leaves them a slot.
    pub(super) fn expect(&mut self, placement: &Placement, at: Instant) {
        if placement.expects_side_requests && !placement.side {
            self.flows_at(at);
        }
    }

    fn flows_at(&mut self, at: Instant) {
        self.last = Some(self.last.map_or(at, |last| last.max(at)));
    }

    /// Whether a side request arrived within [`SIDE_FLOW`] of `now`.
    pub(super) fn flowing(&self, now: Instant) -> bool {
        self.last
            .is_some_and(|last| now.saturating_duration_since(last) < SIDE_FLOW)
    }
}

/// Whether `w` serves `model` and takes new work.
fn serves(w: &Worker, model: &str) -> bool {
    w.models.iter().any(|m| **m == *model) && !w.draining
}

impl Scheduler {
    /// The wait side requests cause a request the usual rules put on `picked`: a turn's for its
    /// home while a title fills it ([`Scheduler::home_wait`]), a title's for a slot kept for no
    /// conversation ([`Scheduler::spare_wait`]).
    pub(super) fn side_wait(
        &self,
        model: &str,
        placement: &Placement,
        picked: Option<WorkerId>,
        now: Instant,
    ) -> Option<WakeWait> {
        let picked = picked?;
        if placement.side {
            let tokens = placement.prompt_tokens;
            self.spare_wait(model, now)
                .or_else(|| self.faster_spare_wait(model, tokens, picked, now))
        } else {
            self.home_wait(model, placement.affinity?, picked, now)
        }
    }

    /// Whether a turn of conversation `key` the usual rules would move off its home (`picked`:
    /// the worker they chose instead) waits for the home instead: the home is full, and a side
    /// request is among what it runs. A title's answer is seconds away; moving costs the turn
    /// its whole prompt on the other box, and the conversation it evicts there its history (the
    /// affinity bench on real llama-servers lost 4 of 150 turns this way in a run: a title
    /// beside one conversation's turn filled their worker, and another conversation's next
    /// turn moved). It waits at most [`HOME_WAIT`], kept from other workers, then is placed as
    /// it would have been. A turn that would queue anyway (`picked` is `None`) takes whatever
    /// frees first, as before.
    fn home_wait(&self, model: &str, key: u64, picked: WorkerId, now: Instant) -> Option<WakeWait> {
        let home = self.affinity.home(key, now)?;
        let w = self.workers.get(&home).filter(|_| home != picked)?;
        let full = serves(w, model) && !w.has_capacity();
        let title_there = w
            .in_flight
            .iter()
            .filter_map(|request| self.requests.get(request))
            .any(|request| request.placement.side);
        (full && title_there).then(|| WakeWait {
            for_box: Some(w.name.clone()),
            give_up_at: Some(now + HOME_WAIT),
            cause: None,
            spare_slot: false,
            weighed: None,
        })
    }

    /// Whether a side request waits for a slot kept for no conversation rather than take the
    /// slot of one (whose next turn then evaluates its whole history again): no box serving the
    /// model has such a slot free now, and some box will have one when the requests it runs for
    /// no conversation end. It waits at most [`SPARE_WAIT`], then is placed as it would have
    /// been. (A box with one free now that the usual rules passed up, cost routing passed up on
    /// purpose: [`Scheduler::roomy`].)
    fn spare_wait(&self, model: &str, now: Instant) -> Option<WakeWait> {
        let spare_now = self
            .workers
            .iter()
            .any(|(id, w)| serves(w, model) && w.has_capacity() && self.spare_slots(*id, now) > 0);
        let frees = self
            .workers
            .iter()
            .any(|(id, w)| serves(w, model) && self.keeps_a_slot_for_none(*id, w));
        if spare_now || !frees {
            return None;
        }
        Some(WakeWait {
            for_box: None,
            give_up_at: Some(now + SPARE_WAIT),
            cause: None,
            spare_slot: true,
            weighed: None,
        })
    }

    /// Whether `worker` (`w`) has a slot its conversations' homes (and the load it carries
    /// beside us) leave free: one that side requests free when they end.
    fn keeps_a_slot_for_none(&self, worker: WorkerId, w: &Worker) -> bool {
        self.affinity.homes_of(worker) + (w.external_load as usize) < w.max_concurrent as usize
    }

    /// With cost routing, a side request's estimate on a worker: the seconds until its first
    /// token of `tokens` there, plus what it delays the prompts evaluated there; `None` without
    /// cost routing or a prompt size.
    fn side_first_token<'a>(
        &'a self,
        model: &'a str,
        tokens: Option<u32>,
        now: Instant,
    ) -> Option<impl Fn(WorkerId) -> Option<f64> + 'a> {
        let tokens = tokens.filter(|_| self.cost_routing)?;
        Some(move |id: WorkerId| {
            // Counted behind every prompt waiting, even where the box evaluates side requests
            // first: these waits weigh busy boxes, whose slot 0 a conversation may hold, so the
            // slot kept for side requests can lie above the turns waiting. Counted behind one
            // batch there, titles stopped waiting for the fast box and queued on the slow one
            // (the fleet bench's busy agent sessions, 2.01 → 4.56 s p90; BENCHMARKS.md,
            // 2026-11-30).
            let (secs, delay) = self.first_token_secs(id, model, false, None, tokens, now)?;
            Some(secs + delay)
        })
    }

    /// With cost routing, whether a side request of `tokens` the usual rules put on `picked`
    /// waits instead for a slot kept for no conversation on a box that has none free now: one
    /// whose slots but one hold conversations, the last taken by side requests that end in
    /// seconds, where its first token comes clearly sooner even after the whole [`SPARE_WAIT`].
    /// New sessions fill the fast box with their first turns and leave titles the slow box
    /// alone, where they wait in slot order behind those sessions' long first turns: 40 s and
    /// more on the fleet bench's busy fast + 5× slower pair, where the fast box's side slot
    /// frees in about one.
    fn faster_spare_wait(
        &self,
        model: &str,
        tokens: Option<u32>,
        picked: WorkerId,
        now: Instant,
    ) -> Option<WakeWait> {
        let first_token = self.side_first_token(model, tokens, now)?;
        let on_picked = first_token(picked)?;
        let waited = SPARE_WAIT.as_secs_f64();
        let (_, faster) = self
            .workers
            .iter()
            .filter(|(id, w)| {
                **id != picked
                    && serves(w, model)
                    && self.keeps_a_slot_for_none(**id, w)
                    && self.spare_slots(**id, now) <= 0
            })
            .filter_map(|(id, w)| Some((first_token(*id)? + waited, w)))
            .filter(|(secs, _)| *secs < on_picked * CLEARLY_SOONER)
            .min_by(|a, b| a.0.total_cmp(&b.0))?;
        Some(WakeWait {
            for_box: Some(faster.name.clone()),
            give_up_at: Some(now + SPARE_WAIT),
            cause: None,
            spare_slot: true,
            weighed: None,
        })
    }

    /// The candidates a side request of `tokens` may go to: the `eligible` ones with a spare
    /// slot, when any has one — none of the others, whatever cost routing would say (a faster
    /// box whose slots all hold conversations answers the title sooner, and the conversation it
    /// evicts pays for it) — unless that faster box answers it clearly sooner even counting what
    /// the evicted conversation evaluates again ([`Scheduler::sooner_despite_eviction`]).
    pub(super) fn roomy(
        &self,
        model: &str,
        candidates: &[WorkerId],
        eligible: &dyn Fn(&Worker) -> bool,
        tokens: Option<u32>,
        now: Instant,
    ) -> Option<Vec<WorkerId>> {
        let roomy: Vec<WorkerId> = candidates
            .iter()
            .copied()
            .filter(|id| eligible(&self.workers[id]) && self.spare_slots(*id, now) > 0)
            .collect();
        if roomy.is_empty() {
            return None;
        }
        let sooner = self.sooner_despite_eviction(model, candidates, &roomy, eligible, tokens, now);
        Some(sooner.map_or(roomy, |id| vec![id]))
    }

    /// With cost routing, the `eligible` candidate without a spare slot where a side request's
    /// first token, plus what the conversation it evicts there evaluates again (the one holding
    /// the fewest tokens, which our worker gives up), comes clearly sooner than on any `roomy`
    /// one. A slow box evaluating the long first turns of new sessions kept titles waiting for
    /// them, in slot order, for 40 s and more, where the fast box would have cost the evicted
    /// conversation four (the fleet bench's busy agent sessions on a fast and a 5× slower box).
    fn sooner_despite_eviction(
        &self,
        model: &str,
        candidates: &[WorkerId],
        roomy: &[WorkerId],
        eligible: &dyn Fn(&Worker) -> bool,
        tokens: Option<u32>,
        now: Instant,
    ) -> Option<WorkerId> {
        let first_token = self.side_first_token(model, tokens, now)?;
        let roomy_secs = roomy
            .iter()
            .map(|id| first_token(*id))
            .try_fold(f64::INFINITY, |best, secs| Some(best.min(secs?)))?;
        candidates
            .iter()
            .copied()
            .filter(|id| !roomy.contains(id) && eligible(&self.workers[id]))
            .filter_map(|id| {
                let evicted = self.affinity.least_context_of(id, now)?;
                let prompt_tps = self.speed(id, model)?.prompt_tps?;
                Some((first_token(id)? + f64::from(evicted) / prompt_tps, id))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .filter(|(secs, _)| *secs < roomy_secs * CLEARLY_SOONER)
            .map(|(_, id)| id)
    }

    /// The `eligible` candidate with the most spare slots ([`Scheduler::spare_slots`]), then
    /// the least loaded, then the lowest id.
    pub(super) fn pick_side_slot(
        &self,
        candidates: &[WorkerId],
        eligible: &dyn Fn(&Worker) -> bool,
        now: Instant,
    ) -> Option<WorkerId> {
        candidates
            .iter()
            .filter(|id| eligible(&self.workers[*id]))
            .max_by_key(|id| {
                let w = &self.workers[*id];
                (
                    self.spare_slots(**id, now),
                    Reverse(w.load()),
                    Reverse(**id),
                )
            })
            .copied()
    }

    /// Whether conversation `key` would leave `worker` no slot for side requests: homes there,
    /// with this one, fill all its slots but none (a conversation already homed there adds
    /// nothing). Side requests that run there now are not counted: they end in seconds, and
    /// the conversations stay.
    pub(super) fn leaves_no_side_slot(&self, worker: WorkerId, key: u64, now: Instant) -> bool {
        let Some(w) = self.workers.get(&worker) else {
            return false;
        };
        if self.affinity.home(key, now) == Some(worker) {
            return false;
        }
        // The homes there, this conversation, and one slot for side requests.
        self.affinity.homes_of(worker) + 2 > w.max_concurrent as usize
    }

    /// [`Scheduler::spare_slots`] when a slot of `worker` frees, for a side request queued
    /// there waiting for one ([`Scheduler::spare_wait`], [`Scheduler::faster_spare_wait`]);
    /// `None` when no side request waits so (an answer's end, every one of them, pays nothing
    /// for it). As of the latest request's arrival, since an answer's end brings no clock (and
    /// what a time would change, a home that expired meanwhile, only frees a slot).
    pub(super) fn spare_slots_as_one_frees(&self, worker: WorkerId) -> Option<i64> {
        let waiting = |r: &super::Request| r.wake.as_ref().is_some_and(|w| w.wants_spare_slot());
        if !self.requests.values().any(waiting) {
            return None;
        }
        let latest = self.requests.values().map(|r| r.arrived).max()?;
        Some(self.spare_slots(worker, latest))
    }

    /// `worker`'s slots less those kept for conversations: one per conversation homed there,
    /// whether it runs now or waits for its user's next turn, and one per request it runs for
    /// no conversation of its own (side requests, requests without a conversation, a
    /// conversation's request while its home is elsewhere). Negative when conversations
    /// outnumber the slots.
    pub(super) fn spare_slots(&self, worker: WorkerId, now: Instant) -> i64 {
        let Some(w) = self.workers.get(&worker) else {
            return 0;
        };
        let homed_here = |request: &super::RequestId| {
            self.requests.get(request).is_some_and(|r| {
                !r.placement.side
                    && r.placement
                        .affinity
                        .is_some_and(|key| self.affinity.home(key, now) == Some(worker))
            })
        };
        let strangers = w.in_flight.iter().filter(|r| !homed_here(r)).count();
        let kept = self.affinity.homes_of(worker) + strangers + w.external_load as usize;
        i64::from(w.max_concurrent) - kept as i64
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::tests::register;
    use super::super::{Action, Placement, ProviderLimits, Reason, Submitted};
    use super::*;
    use crate::protocol::Timings;

    /// Boxes of these (prompt tokens per second, slots), ids in order, each holding the
    /// conversations `homes` gives it; cost routing `on`.
    fn fleet(on: bool, boxes: &[(f64, u32, u64)], now: Instant) -> (Scheduler, Vec<WorkerId>) {
        let mut s = Scheduler::new(vec![("local".to_string(), ProviderLimits::default())]);
        s.set_cost_routing(on);
        let mut conversation = 1000;
        let ids = boxes
            .iter()
            .enumerate()
            .map(|(i, &(tps, slots, homes))| {
                let id = register(&mut s, &format!("box-{i}"), &["m"], slots).worker;
                let second = Timings {
                    prompt_tokens: tps as u32,
                    prompt_ms: 1000.0,
                    cached_tokens: None,
                    generated_tokens: 40,
                    generation_ms: 1000.0,
                };
                s.observe_timings(id, "m", &second);
                for _ in 0..homes {
                    conversation += 1;
                    s.affinity.record(conversation, id, now);
                }
                id
            })
            .collect();
        (s, ids)
    }

    fn place(s: &mut Scheduler, id: RequestId, tokens: u32, side: bool, now: Instant) -> WorkerId {
        let placement = Placement {
            affinity: Some(7),
            prompt_tokens: Some(tokens),
            side,
            ..Placement::default()
        };
        match s.submit(id, "m", placement, now).expect("accepted") {
            Submitted::Dispatched { worker, .. } => worker,
            other => panic!("not placed: {other:?}"),
        }
    }

    use super::super::RequestId;

    /// Whether `actions` dispatch `request` to `worker`.
    fn dispatches(actions: &[Action], request: RequestId, worker: WorkerId) -> bool {
        actions.contains(&Action::Dispatch { request, worker })
    }

    /// Whether `finished` ending on `worker` hands `waiting` that worker's freed slot.
    fn frees_for(
        s: &mut Scheduler,
        worker: WorkerId,
        finished: RequestId,
        waiting: RequestId,
    ) -> bool {
        let mut actions = Vec::new();
        assert!(s.finish(worker, finished, &mut actions));
        dispatches(&actions, waiting, worker)
    }

    #[test]
    fn a_turn_whose_home_a_title_fills_waits_for_it_and_moves_only_when_the_wait_runs_out() {
        let t = Instant::now();
        let turn = |conversation, side| Placement {
            affinity: Some(conversation),
            prompt_tokens: Some(3_000),
            side,
            ..Placement::default()
        };
        // A box of two slots holding conversations 1 and 2, and one of one slot. While the small
        // box answers a new conversation, conversation 1's turn and its title fill the first
        // box; then the small box frees, and conversation 2's next turn comes.
        let setup = |title: bool| {
            let (mut s, ids) = fleet(false, &[(2000.0, 2, 0), (2000.0, 1, 0)], t);
            for conversation in [1, 2, 3] {
                s.affinity.record(conversation, ids[0], t);
            }
            let mut placed = |id, placement| match s.submit(id, "m", placement, t) {
                Ok(Submitted::Dispatched { worker, .. }) => worker,
                other => panic!("not placed: {other:?}"),
            };
            assert_eq!(placed(1, turn(1, false)), ids[0]);
            assert_eq!(placed(10, turn(9, false)), ids[1], "a new conversation");
            // The title, or a turn of conversation 3 at home there.
            let beside = if title { turn(1, true) } else { turn(3, false) };
            assert_eq!(placed(2, beside), ids[0]);
            assert!(s.finish(ids[1], 10, &mut Vec::new()));
            (s, ids)
        };
        let (mut s, ids) = setup(true);
        let queued = s.submit(3, "m", turn(2, false), t).expect("accepted");
        let Submitted::Queued { queue_deadline, .. } = queued else {
            panic!("the turn waits for its home: {queued:?}");
        };
        assert_eq!(queue_deadline, t + HOME_WAIT, "for a bounded time");
        assert_eq!(s.box_to_wake(3), None, "nothing is woken for it");
        // The title ends: the turn goes home.
        assert!(frees_for(&mut s, ids[0], 2, 3));
        assert_eq!(s.reason_of(3), Some(Reason::CacheHit));

        // The title outlasts the wait: the turn moves as it would have.
        let (mut s, ids) = setup(true);
        s.submit(3, "m", turn(2, false), t).expect("accepted");
        let mut actions = Vec::new();
        assert!(s.stop_waiting_for_wake(3, t + HOME_WAIT, &mut actions));
        assert!(dispatches(&actions, 3, ids[1]), "{actions:?}");
        assert_eq!(s.reason_of(3), Some(Reason::HomeBusy));

        // A home full of turns (no title): the turn moves at once, as before.
        let (mut s, ids) = setup(false);
        match s.submit(3, "m", turn(2, false), t).expect("accepted") {
            Submitted::Dispatched { worker, .. } => assert_eq!(worker, ids[1]),
            other => panic!("moves at once: {other:?}"),
        }
    }

    #[test]
    fn a_title_waits_for_a_slot_kept_for_no_conversation_rather_than_take_a_conversations() {
        let t = Instant::now();
        // Two boxes of two slots: the first keeps both for conversations 1001 and 1002 (between
        // turns, so both are free), the second one for conversation 1003 and the other runs a
        // title. Every free slot is some conversation's.
        let setup = || {
            let (mut s, ids) = fleet(false, &[(2000.0, 2, 2), (2000.0, 2, 1)], t);
            assert_eq!(
                place(&mut s, 1, 1000, true, t),
                ids[1],
                "the slot kept for none"
            );
            (s, ids)
        };
        let (mut s, ids) = setup();
        let queued = s.submit(2, "m", title(), t).expect("accepted");
        let Submitted::Queued { queue_deadline, .. } = queued else {
            panic!("the second title waits: {queued:?}");
        };
        assert_eq!(queue_deadline, t + SPARE_WAIT, "for a bounded time");
        assert_eq!(s.box_to_wake(2), None, "nothing is woken for it");
        // A turn at home on the first box ends there: that slot is still its conversation's.
        assert_eq!(turn(&mut s, 3, 1001, 1000, t), ids[0]);
        assert!(!frees_for(&mut s, ids[0], 3, 2));
        // The first title ends: its slot, kept for none, takes the second.
        assert!(frees_for(&mut s, ids[1], 1, 2));
        assert_eq!(s.reason_of(2), Some(Reason::SideRequest));

        // The first title outlasts the wait: the second is placed as it would have been.
        let (mut s, ids) = setup();
        s.submit(2, "m", title(), t).expect("accepted");
        let mut actions = Vec::new();
        assert!(s.stop_waiting_for_wake(2, t + SPARE_WAIT, &mut actions));
        assert!(dispatches(&actions, 2, ids[0]), "{actions:?}");

        // Conversations keep every slot of every box: no slot will come free for it, so it
        // does not wait.
        let (mut s, ids) = fleet(false, &[(2000.0, 2, 2), (2000.0, 2, 2)], t);
        assert!(matches!(
            s.submit(2, "m", title(), t),
            Ok(Submitted::Dispatched { worker, .. }) if ids.contains(&worker)
        ));
    }

    #[test]
    fn with_cost_routing_a_title_takes_a_conversations_slot_on_the_fast_box_rather_than_wait_long_on_the_slow_one(
    ) {
        let now = Instant::now();
        // A slow box with a slot kept for none, a fast one whose two slots hold conversations
        // of 3,000 tokens each (1 s to evaluate again there).
        let setup = || {
            let (mut s, ids) = fleet(true, &[(600.0, 2, 0), (3000.0, 2, 2)], now);
            for key in [1001, 1002] {
                s.affinity.set_context(key, 3_000);
            }
            (s, ids)
        };
        // The slow box idle: the title there (1.7 s) beats the fast box's 0.3 s plus the
        // evicted conversation's 1 s once counted.
        let (mut s, ids) = setup();
        assert_eq!(place(&mut s, 1, 1000, true, now), ids[0]);
        // The slow box evaluating a first turn of 12,000 tokens (placed there by the usual
        // rules): 21.7 s there.
        let busy_slow_box = |cost_routing: bool| {
            let (mut s, ids) = setup();
            s.set_cost_routing(false);
            assert_eq!(turn(&mut s, 1, 1, 12_000, now), ids[0]);
            s.set_cost_routing(cost_routing);
            (s, ids)
        };
        let (mut s, ids) = busy_slow_box(true);
        assert_eq!(place(&mut s, 2, 1000, true, now), ids[1]);
        assert_eq!(
            s.affinity.homes_of(ids[1]),
            2,
            "the title is still nobody's home"
        );
        // Without cost routing, the slot kept for none.
        let (mut s, ids) = busy_slow_box(false);
        assert_eq!(place(&mut s, 2, 1000, true, now), ids[0]);
    }

    /// Places request `id`, a turn of conversation `key` with a prompt of `tokens`: where it went.
    fn turn(s: &mut Scheduler, id: RequestId, key: u64, tokens: u32, now: Instant) -> WorkerId {
        let placement = Placement {
            affinity: Some(key),
            prompt_tokens: Some(tokens),
            ..Placement::default()
        };
        match s.submit(id, "m", placement, now) {
            Ok(Submitted::Dispatched { worker, .. }) => worker,
            other => panic!("not placed: {other:?}"),
        }
    }

    /// A side request of conversation 7.
    fn title() -> Placement {
        Placement {
            affinity: Some(7),
            prompt_tokens: Some(1000),
            side: true,
            ..Placement::default()
        }
    }

    #[test]
    fn with_cost_routing_a_title_waits_for_the_fast_boxs_side_slot_rather_than_queue_behind_long_first_turns(
    ) {
        let t = Instant::now();
        // A fast box and one five times slower, four slots each, three kept for conversations
        // (1001–1003 on the fast box, 1004–1006 on the slow one). The fast box runs a title and
        // its three conversations' turns; the slow one evaluates three long prompts, `long`
        // tokens each.
        let setup = |on: bool, long: u32| {
            let (mut s, ids) = fleet(on, &[(3000.0, 4, 3), (600.0, 4, 3)], t);
            assert_eq!(
                place(&mut s, 4, 1000, true, t),
                ids[0],
                "its slot kept for none"
            );
            for (id, key) in [(1, 1001), (2, 1002), (3, 1003)] {
                assert_eq!(turn(&mut s, id, key, 500, t), ids[0]);
            }
            for (id, key) in [(5, 1004), (6, 1005), (7, 1006)] {
                assert_eq!(turn(&mut s, id, key, long, t), ids[1]);
            }
            (s, ids)
        };
        // The slow box's free slot would answer a second title in a minute; the fast box's
        // side slot frees when its title ends, seconds away. The title waits for that.
        let (mut s, ids) = setup(true, 12_000);
        let queued = s.submit(8, "m", title(), t).expect("accepted");
        let Submitted::Queued { queue_deadline, .. } = queued else {
            panic!("the title waits for the fast box: {queued:?}");
        };
        assert_eq!(queue_deadline, t + SPARE_WAIT, "for a bounded time");
        // A conversation's turn ending there frees a slot still kept for it: no title there.
        assert!(!frees_for(&mut s, ids[0], 1, 8));
        // Nor does the slow box take it while it waits.
        assert!(!frees_for(&mut s, ids[1], 5, 8));
        // The first title ends: its slot takes the second.
        assert!(frees_for(&mut s, ids[0], 4, 8));

        // The first title outlasts the wait: the second is placed as it would have been.
        let (mut s, ids) = setup(true, 12_000);
        s.submit(8, "m", title(), t).expect("accepted");
        let mut actions = Vec::new();
        assert!(s.stop_waiting_for_wake(8, t + SPARE_WAIT, &mut actions));
        assert!(dispatches(&actions, 8, ids[1]), "{actions:?}");

        // Short prompts on the slow box: its free slot answers sooner than the fast box would
        // after a wait, and takes the title at once.
        let (mut s, ids) = setup(true, 500);
        match s.submit(8, "m", title(), t).expect("accepted") {
            Submitted::Dispatched { worker, .. } => assert_eq!(worker, ids[1]),
            other => panic!("placed at once: {other:?}"),
        }
        // Without cost routing, nothing is weighed: the slow box's free slot takes it.
        let (mut s, ids) = setup(false, 12_000);
        match s.submit(8, "m", title(), t).expect("accepted") {
            Submitted::Dispatched { worker, .. } => assert_eq!(worker, ids[1]),
            other => panic!("placed at once: {other:?}"),
        }
    }

    #[test]
    fn a_side_request_takes_the_box_with_the_most_slots_kept_for_no_conversation() {
        let now = Instant::now();
        // Four slots and one conversation against two slots and none: a new conversation goes
        // where conversations per slot are fewest (the second), a title where the most slots
        // are kept for none (the first).
        let (mut s, ids) = fleet(false, &[(2000.0, 4, 1), (2000.0, 2, 0)], now);
        assert_eq!(place(&mut s, 1, 1000, false, now), ids[1]);
        let (mut s, ids) = fleet(false, &[(2000.0, 4, 1), (2000.0, 2, 0)], now);
        assert_eq!(place(&mut s, 1, 1000, true, now), ids[0]);
        assert_eq!(s.reason_of(1), Some(Reason::SideRequest));
        assert_eq!(
            (s.affinity.homes_of(ids[0]), s.affinity.homes_of(ids[1])),
            (1, 0),
            "the title is nobody's home"
        );
        assert_eq!(s.affinity.home(7, now), None);
        // Running, it holds a slot kept for none.
        assert_eq!(s.spare_slots(ids[0], now), 2);
        assert_eq!(
            place(&mut s, 2, 1000, true, now),
            ids[1],
            "2 and 2: less loaded"
        );
        assert_eq!(
            place(&mut s, 3, 1000, true, now),
            ids[0],
            "2 spare against 1"
        );
    }

    #[test]
    fn with_cost_routing_a_side_request_keeps_off_a_faster_box_whose_slots_all_hold_conversations()
    {
        let now = Instant::now();
        let (mut s, ids) = fleet(true, &[(600.0, 2, 0), (3000.0, 2, 2)], now);
        assert_eq!(place(&mut s, 1, 1000, true, now), ids[0]);
        assert_eq!(s.reason_of(1), Some(Reason::SideRequest));
        // With a slot kept for none there, the faster box takes it.
        let (mut s, ids) = fleet(true, &[(600.0, 2, 0), (3000.0, 2, 1)], now);
        assert_eq!(place(&mut s, 1, 1000, true, now), ids[1]);
        assert_eq!(s.reason_of(1), Some(Reason::FasterBox));
        // And so does every title after it: while titles flow, that slot is kept for them, and
        // a title is nobody's home, so it crowds nothing there.
        assert!(s.finish(ids[1], 1, &mut Vec::new()));
        assert_eq!(place(&mut s, 2, 1000, true, now), ids[1]);
        assert_eq!(s.reason_of(2), Some(Reason::FasterBox));
        assert_eq!(s.affinity.homes_of(ids[1]), 1);
    }

    #[test]
    fn a_conversation_moves_to_a_faster_box_whose_slots_all_hold_conversations_only_when_sooner_counting_the_ones_it_evicts(
    ) {
        let now = Instant::now();
        // 12,000 tokens: 20 s on the slow box, 9.2 s on one 2.2x faster — clearly sooner, so
        // it goes there while a slot is kept for none there.
        let (mut s, ids) = fleet(true, &[(600.0, 2, 0), (1300.0, 4, 2)], now);
        assert_eq!(place(&mut s, 1, 12_000, false, now), ids[1]);
        assert_eq!(s.reason_of(1), Some(Reason::FasterBox));
        // The same box with its two slots both kept for conversations: the evicted ones would
        // evaluate about as much again (27.7 s in all), not clearly sooner; nor on one five
        // times faster (12 s, not under 60% of 20 s).
        let (mut s, ids) = fleet(true, &[(600.0, 2, 0), (1300.0, 2, 2)], now);
        assert_eq!(place(&mut s, 1, 12_000, false, now), ids[0]);
        assert_eq!(s.reason_of(1), Some(Reason::NewConversation));
        let (mut s, ids) = fleet(true, &[(600.0, 2, 0), (3000.0, 2, 2)], now);
        assert_eq!(place(&mut s, 1, 12_000, false, now), ids[0]);
        // Ten times faster, it is still worth it (6 s).
        let (mut s, ids) = fleet(true, &[(600.0, 2, 0), (6000.0, 2, 2)], now);
        assert_eq!(place(&mut s, 1, 12_000, false, now), ids[1]);
    }

    #[test]
    fn while_side_requests_flow_a_new_conversation_leaves_every_box_a_slot_for_them() {
        let now = Instant::now();
        // A fast box with four slots holding three conversations, a slow one holding one.
        // 12,000 tokens: 4 s on the fast box, 20 s on the slow one. No side request yet: the
        // fast box still has a slot to spare, and takes the conversation.
        let boxes = [(600.0, 4, 1), (3000.0, 4, 3)];
        let (mut s, ids) = fleet(true, &boxes, now);
        assert_eq!(place(&mut s, 1, 12_000, false, now), ids[1]);
        assert_eq!(s.reason_of(1), Some(Reason::FasterBox));
        // After a side request (Claude Code's title) it would fill the fast box's slots, and
        // every later title there would evict a conversation: it stays on the slow box.
        let (mut s, ids) = fleet(true, &boxes, now);
        let title = place(&mut s, 1, 900, true, now);
        assert!(s.finish(title, 1, &mut Vec::new()));
        assert_eq!(place(&mut s, 2, 12_000, false, now), ids[0]);
        assert_eq!(s.reason_of(2), Some(Reason::NewConversation));
        // So does the first turn of a Claude Code session, before any title came: its client
        // is known to send them (the first turn's own slot counts as the fast box's third).
        let (mut s, ids) = fleet(true, &boxes, now);
        let claude_code = Placement {
            affinity: Some(8),
            prompt_tokens: Some(12_000),
            expects_side_requests: true,
            ..Placement::default()
        };
        let placed = s.submit(1, "m", claude_code, now).expect("accepted");
        assert!(
            matches!(placed, Submitted::Dispatched { worker, .. } if worker == ids[0]),
            "{placed:?}"
        );
        assert!(s.side_flow.flowing(now));
        // A conversation the fast box is already home to takes nothing new there.
        let (mut s, ids) = fleet(true, &boxes, now);
        let title = place(&mut s, 1, 900, true, now);
        assert!(s.finish(title, 1, &mut Vec::new()));
        assert!(!s.leaves_no_side_slot(ids[1], 1002, now));
        assert!(s.leaves_no_side_slot(ids[1], 70, now));
        // Ten minutes without one, the flow has stopped.
        let later = now + Duration::from_secs(601);
        assert!(!s.side_flow.flowing(later));
        assert!(s.side_flow.flowing(now + Duration::from_secs(599)));
    }
}
