//! Registry, queues and dispatch as a plain state machine: no I/O, no tokio, time as an input.
//!
//! Events come in as method calls (a worker registered, a request arrived, a request finished, a
//! worker left); decisions come out as [`Action`]s that the async layer ([`crate::proxy::dispatch::hub`]) carries
//! out. Every rule of the behavior contract is a small unit test in `scheduler/tests.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::protocol::{RegisterMessage, WarmUp};

mod cost;
mod events;
mod homes;
mod known;
mod loads;
mod names;
mod registry;
mod side;
mod turns;
mod views;
mod wake;

pub use cost::{Reason, Speed, Weighed};
pub use events::*;
pub use known::KnownBox;
use names::*;
pub use names::{
    parse_request_wire_id, parse_worker_wire_id, request_wire_id, sanitize_models, unusable_name,
    worker_wire_id, MAX_NAME_BYTES,
};
pub use wake::WakeCause;

pub use crate::affinity::{AffinityCounts, Outcome as AffinityOutcome};

/// Conversation → the worker that served it last.
pub type AffinityTable = crate::affinity::AffinityTable<WorkerId>;
pub use turns::BATCH_AGEING_TURNS;
use turns::{Seat, Turns};

/// Id of one worker connection.
pub type WorkerId = u64;
/// Id of one client request, allocated by the caller in arrival order: the FIFO order, so ids grow.
pub type RequestId = u64;

/// A request is put back in the queue at most this many times after its worker dies.
pub const MAX_REQUEUE_COUNT: u32 = 3;

pub use crate::settings::ProviderLimits;

#[derive(Debug)]
struct Provider {
    name: String,
    limits: ProviderLimits,
    /// Queued requests, by priority, client and model, in arrival order (request ids grow
    /// with arrival): who a freed slot serves next is [`Turns`]' decision.
    queue: Turns,
    /// Workers serving each model: the routing index.
    model_workers: HashMap<Arc<str>, Vec<WorkerId>>,
    /// Models whose last worker left recently: requests for them queue instead of 404ing while
    /// the worker restarts.
    lingering: HashMap<Arc<str>, Instant>,
    /// Models of boxes that went to sleep on this provider: requests for them queue here while
    /// the hub wakes a box (see `sleepers.rs`).
    asleep: HashSet<Arc<str>>,
    round_robin: usize,
}

impl Provider {
    /// It lists `model`, `model`'s last worker left it less than a queue timeout ago, or a
    /// sleeping box of it serves `model`.
    fn claims(&self, model: &str, now: Instant) -> bool {
        self.limits.models.iter().any(|m| m == model)
            || self.lingering.get(model).is_some_and(|until| *until > now)
            || self.asleep.contains(model)
    }
}

#[derive(Debug)]
struct Worker {
    provider: usize,
    name: String,
    models: Vec<Arc<str>>,
    max_concurrent: u32,
    in_flight: HashSet<RequestId>,
    external_load: u32,
    draining: bool,
    /// The tokens one request may hold, per model, where the worker reported it.
    windows: HashMap<Arc<str>, u32>,
    /// How fast it was measured to be, per model.
    speeds: HashMap<Arc<str>, Speed>,
    /// Models its backend reports not loaded, with how long loading took last (seconds).
    cold: HashMap<Arc<str>, Option<f64>>,
    /// Of those, the ones a request placed here is loading, since when.
    loading: HashMap<Arc<str>, Instant>,
    /// Models whose backend evaluates its side requests before the turns waiting there (the
    /// worker said so: `register` / `models_update.sides_first`).
    sides_first: Vec<Arc<str>>,
}

impl Worker {
    /// Whether a prompt of `tokens` fits its context window for `model` (an unknown window
    /// or size fits).
    fn fits(&self, model: &str, tokens: Option<u32>) -> bool {
        tokens.is_none_or(|tokens| {
            self.windows
                .get(model)
                .is_none_or(|window| *window >= tokens)
        })
    }

    fn load(&self) -> u32 {
        self.in_flight.len() as u32 + self.external_load
    }

    fn has_capacity(&self) -> bool {
        !self.draining && self.load() < self.max_concurrent
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting in its provider's queue until the request's `queue_deadline`.
    Queued,
    Assigned {
        worker: WorkerId,
    },
    Cancelling {
        worker: WorkerId,
    },
}

#[derive(Debug)]
struct Request {
    provider: usize,
    model: Arc<str>,
    deadline: Instant,
    /// When it stops waiting for a worker, fixed at arrival: a requeue keeps it (the contract:
    /// "keyed by original queue time so requeue does not grant infinite timeout extensions").
    queue_deadline: Instant,
    requeues: u32,
    /// When it arrived: the time its conversation's home is recorded at.
    arrived: Instant,
    /// What placement weighs besides the model.
    placement: Placement,
    /// Some byte of the answer reached the client: never requeue it.
    started: bool,
    phase: Phase,
    /// The prompt tokens its worker has to evaluate, as estimated when it was placed.
    prefill_tokens: u32,
    /// When it was placed on its worker, where the placement knew the time (a slot freeing
    /// brings no clock): its prompt has been evaluated since ([`cost`]).
    assigned_at: Option<Instant>,
    /// Why it went to its worker.
    reason: Option<Reason>,
    /// What cost routing weighed for it: the usual choice against the best other.
    weighed: Option<Weighed>,
    /// The sleeping box it waits for, when one is woken for it ([`wake`]).
    wake: Option<wake::WakeWait>,
    /// Another prompt was evaluated on its worker while its own was ([`cost`]).
    shared_prefill: bool,
}

impl Request {
    /// Where it waits while queued.
    fn seat(&self) -> Seat<'_> {
        Seat {
            model: &self.model,
            client: &self.placement.client,
            priority: self.placement.priority,
            weight: self.placement.weight,
        }
    }
}

/// The proxy's routing state.
#[derive(Debug)]
pub struct Scheduler {
    providers: Vec<Provider>,
    workers: HashMap<WorkerId, Worker>,
    requests: HashMap<RequestId, Request>,
    /// Each conversation's home worker.
    affinity: AffinityTable,
    /// Placements by why they went where they did (indexed by [`Reason::index`]).
    reasons: [u64; Reason::ALL.len()],
    /// When side requests last arrived ([`side`]).
    side_flow: side::SideFlow,
    /// When requests arrived lately ([`loads`]).
    arrivals: loads::Arrivals,
    /// Whether measured speeds may override the usual rules ([`cost`]).
    cost_routing: bool,
    /// Speeds of boxes that left, by worker name: a box that reconnects keeps what was measured.
    known_speeds: known::KnownSpeeds,
    next_worker: WorkerId,
    shutting_down: bool,
}

impl Scheduler {
    /// A scheduler with these providers, in priority order (the first that serves a model wins).
    pub fn new(providers: Vec<(String, ProviderLimits)>) -> Self {
        Scheduler {
            providers: providers
                .into_iter()
                .map(|(name, limits)| Provider {
                    name,
                    limits,
                    queue: Turns::default(),
                    model_workers: HashMap::new(),
                    lingering: HashMap::new(),
                    asleep: HashSet::new(),
                    round_robin: 0,
                })
                .collect(),
            workers: HashMap::new(),
            requests: HashMap::new(),
            affinity: AffinityTable::default(),
            reasons: [0; Reason::ALL.len()],
            side_flow: side::SideFlow::default(),
            arrivals: loads::Arrivals::default(),
            cost_routing: false,
            known_speeds: known::KnownSpeeds::default(),
            next_worker: 1,
            shutting_down: false,
        }
    }

    /// Turns cost routing on or off (the default, until the fleet bench shows it never loses:
    /// BENCHMARKS.md) ([`cost`]).
    pub fn set_cost_routing(&mut self, on: bool) {
        self.cost_routing = on;
    }

    /// Client request `request` arrived for `model`.
    pub fn submit(
        &mut self,
        request: RequestId,
        model: &str,
        placement: Placement,
        now: Instant,
    ) -> Result<Submitted, SubmitError> {
        if self.shutting_down {
            return Err(SubmitError::ShuttingDown);
        }
        let provider = self.route(model, now).ok_or(SubmitError::UnknownModel)?;
        // Refused at once only when surely too long: the size is estimated, and a backend's
        // own tokenizer says the last word on anything closer.
        if let (Some(tokens), Some(limit)) = (placement.prompt_tokens, self.context_limit(model)) {
            if tokens > limit.saturating_add(limit / 2) {
                return Err(SubmitError::PromptTooLong { tokens, limit });
            }
        }
        let limits = &self.providers[provider].limits;
        if !limits.enabled {
            return Err(SubmitError::ProviderDisabled);
        }
        self.side_flow.expect(&placement, now);
        self.arrivals.saw(now);
        let deadline = now + limits.request_timeout;
        let queue_deadline = (now + limits.queue_timeout).min(deadline);
        let model: Arc<str> = self.providers[provider]
            .model_workers
            .get_key_value(model)
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| Arc::from(model));
        let picked = self.pick_worker(provider, &model, &placement, now);
        let p = &self.providers[provider];
        // 0 is no limit, as the published relay reads it (its runbook uses it).
        let full = p.limits.max_queue_len != 0 && p.queue.len() >= p.limits.max_queue_len;
        if picked.is_none() && full {
            // Rough hint: a queue drains at least once per queue timeout.
            let retry_after = p
                .limits
                .queue_timeout
                .clamp(Duration::from_secs(1), Duration::from_secs(30));
            return Err(SubmitError::QueueFull { retry_after });
        }
        let picked_worker = picked.as_ref().map(|(w, _)| *w);
        let wake = self.wake_plan(provider, &model, &placement, picked_worker, now);
        let wake = wake.or_else(|| self.side_wait(&model, &placement, picked_worker, now));
        let wake =
            wake.or_else(|| self.load_wait(provider, &model, &placement, picked_worker, now));
        self.track_request(
            request,
            provider,
            model,
            placement,
            now,
            deadline,
            queue_deadline,
        );
        if let Some((worker, weighed)) = picked.filter(|_| wake.is_none()) {
            self.assign(request, worker, weighed, Some(now));
            let seat = self.requests[&request].seat();
            self.providers[provider].queue.served_directly(seat);
            return Ok(Submitted::Dispatched { request, worker });
        }
        let waiter_deadline = wake.as_ref().and_then(|w| w.give_up_at);
        self.requests.get_mut(&request).expect("tracked").wake = wake;
        self.enqueue(request);
        Ok(Submitted::Queued {
            request,
            queue_deadline: waiter_deadline.unwrap_or(queue_deadline),
        })
    }

    #[allow(clippy::too_many_arguments)] // one per field of the request it creates
    fn track_request(
        &mut self,
        id: RequestId,
        provider: usize,
        model: Arc<str>,
        placement: Placement,
        arrived: Instant,
        deadline: Instant,
        queue_deadline: Instant,
    ) {
        self.requests.insert(
            id,
            Request {
                provider,
                model,
                deadline,
                queue_deadline,
                requeues: 0,
                arrived,
                placement,
                started: false,
                phase: Phase::Queued,
                prefill_tokens: 0,
                assigned_at: None,
                reason: None,
                weighed: None,
                wake: None,
                shared_prefill: false,
            },
        );
    }

    fn enqueue(&mut self, request: RequestId) {
        let entry = self.requests.get_mut(&request).expect("known request");
        entry.phase = Phase::Queued;
        self.providers[entry.provider]
            .queue
            .push(request, entry.seat());
    }

    fn dequeue(&mut self, request: RequestId) {
        let entry = &self.requests[&request];
        self.providers[entry.provider]
            .queue
            .remove(request, entry.seat());
    }

    /// Every placement passes here (`weighed`: what cost routing weighed, moving it to the
    /// worker or keeping it there; `at`: now, where the caller knows it): the worker becomes
    /// the home of the request's conversation, holding its prompt.
    fn assign(
        &mut self,
        request: RequestId,
        worker: WorkerId,
        weighed: Option<Weighed>,
        at: Option<Instant>,
    ) {
        let entry = &self.requests[&request];
        let (affinity, tokens) = (entry.placement.affinity, entry.placement.prompt_tokens);
        // Read before the placement moves the conversation's home.
        let home = affinity.map(|key| self.affinity.home(key, entry.arrived));
        let held = match (affinity, home) {
            (Some(key), Some(Some(at))) if at == worker => self.affinity.context(key),
            _ => 0,
        };
        let waited = self.waited_for(entry, worker);
        // A request that waited for a box (to wake, or for a slot where its model is loaded)
        // and got it keeps what made it wait.
        let name = self.workers.get(&worker).map_or("", |w| w.name.as_str());
        let carried = (entry.wake.as_ref())
            .filter(|wait| wait.met_by(name))
            .and_then(|wait| wait.weighed.clone());
        let weighed = if waited { carried } else { carried.or(weighed) };
        let faster_box = weighed.as_ref().is_some_and(|w| !w.kept);
        let side = entry.placement.side && !faster_box && !waited;
        let reason = side.then_some(Reason::SideRequest);
        let reason = reason.unwrap_or_else(|| Reason::of(home, worker, faster_box, waited));
        let entry = self.requests.get_mut(&request).expect("known request");
        entry.weighed = weighed;
        entry.phase = Phase::Assigned { worker };
        entry.prefill_tokens = tokens.unwrap_or(0).saturating_sub(held);
        entry.assigned_at = at;
        entry.reason = Some(reason);
        self.reasons[reason.index()] += 1;
        self.side_flow.saw(&entry.placement, entry.arrived);
        // A side request is nobody's home ([`side`]).
        if let Some(key) = affinity.filter(|_| !entry.placement.side) {
            self.affinity.record(key, worker, entry.arrived);
            self.affinity.set_context(key, tokens.unwrap_or(0));
        }
        self.note_shared_prefill(worker, request);
        self.load_begins(worker, request, at);
        self.workers
            .get_mut(&worker)
            .expect("known worker")
            .in_flight
            .insert(request);
    }

    /// The conversation's home worker while it serves `model` and has a free slot; otherwise
    /// the lowest load among workers serving `model` with a free slot, round-robin among equals;
    /// then, with cost routing, a worker whose first token comes clearly sooner ([`cost`]), and
    /// what it weighed.
    ///
    /// Why a saturated home yields at once instead of holding the request for a while: its slots
    /// are taken by answers of unknown length (a long generation holds one for minutes), while
    /// going elsewhere costs one re-evaluation of the prompt, bounded and usually seconds at
    /// most. The worker it goes to becomes the new home, so the conversation moves once rather
    /// than bouncing. A home that left, is draining or no longer serves the model yields too.
    fn pick_worker(
        &mut self,
        provider: usize,
        model: &str,
        placement: &Placement,
        now: Instant,
    ) -> Option<(WorkerId, Option<Weighed>)> {
        let (affinity, prompt_tokens) = (placement.affinity, placement.prompt_tokens);
        let p = &self.providers[provider];
        let candidates = p.model_workers.get(model)?;
        // A worker whose window holds the prompt, when any does: a smaller one would only
        // answer that it is too long. When none does, the backend says so itself.
        let any_fits = candidates
            .iter()
            .any(|id| self.workers[id].fits(model, prompt_tokens));
        let eligible = |w: &Worker| w.has_capacity() && (!any_fits || w.fits(model, prompt_tokens));
        let roomy = placement
            .side
            .then(|| self.roomy(model, candidates, &eligible, prompt_tokens, now));
        let candidates: &[WorkerId] = roomy
            .as_ref()
            .and_then(Option::as_deref)
            .unwrap_or(candidates);
        let home = affinity
            .filter(|_| !placement.side)
            .and_then(|key| self.affinity.home(key, now))
            .filter(|home| candidates.contains(home))
            .filter(|home| self.workers.get(home).is_some_and(eligible));
        let usual = match (home, affinity) {
            (Some(home), _) => Some(home),
            _ if placement.side => self.pick_side_slot(candidates, &eligible, now),
            (None, Some(_)) => self.pick_new_home(provider, model, &eligible),
            (None, None) => self.least_loaded(p.round_robin, candidates, &eligible),
        }?;
        // A side request is nobody's home: it crowds no box, and only among boxes with a slot
        // to spare (`roomy`), so the one that answers it soonest takes it.
        let sooner = self.sooner_than(
            model,
            candidates,
            &eligible,
            placement.side && placement.slot_hinted,
            affinity.filter(|_| !placement.side),
            prompt_tokens,
            usual,
            now,
        );
        if home.is_none() && affinity.is_none() {
            let p = &mut self.providers[provider];
            p.round_robin = p.round_robin.wrapping_add(1);
        }
        Some(match sooner {
            Some((faster, weighed)) => (faster.unwrap_or(usual), Some(weighed)),
            None => (usual, None),
        })
    }

    /// Hands queued work to `worker` while it has free slots: the request whose turn it is among
    /// those for the models it serves ([`Turns::take_next`]).
    fn fill_worker(&mut self, worker: WorkerId, actions: &mut Vec<Action>) {
        loop {
            let Some(w) = self.workers.get(&worker) else {
                return;
            };
            if !w.has_capacity() {
                return;
            }
            // A queued prompt this worker's window cannot hold waits for one that can, when one
            // serving its model does: per model, the largest prompt some worker holds (`None`: a
            // window is unknown, so any). Only models this worker knows a window for can refuse
            // anything: a worker that reported none (the usual case) pays nothing here.
            let ceilings: HashMap<&Arc<str>, Option<u32>> = w
                .models
                .iter()
                .filter(|model| w.windows.contains_key(*model))
                .map(|model| {
                    let serving = self.providers[w.provider].model_workers.get(model);
                    let largest = serving
                        .into_iter()
                        .flatten()
                        .map(|id| self.workers[id].windows.get(model).copied())
                        .try_fold(0, |largest, window| Some(largest.max(window?)));
                    (model, largest)
                })
                .collect();
            let spare_here = self.spare_slots_as_one_frees(worker);
            let requests = &self.requests;
            let accept = |request: RequestId| {
                let Some(r) = requests.get(&request) else {
                    return true;
                };
                if let Some(wait) = &r.wake {
                    let evicts = wait.wants_spare_slot() && spare_here.is_some_and(|n| n <= 0);
                    if wait.keeps_from(&w.name) || evicts {
                        return false;
                    }
                }
                let tokens = r.placement.prompt_tokens;
                if w.fits(&r.model, tokens) {
                    return true;
                }
                let held_elsewhere = ceilings
                    .get(&r.model)
                    .copied()
                    .flatten()
                    .is_none_or(|largest| tokens.is_some_and(|t| t <= largest));
                !held_elsewhere
            };
            let next = self.providers[w.provider]
                .queue
                .take_next_where(&w.models, &accept);
            let Some(request) = next else {
                return;
            };
            self.assign(request, worker, None, None);
            actions.push(Action::Dispatch { request, worker });
        }
    }

    /// The first byte of this request's answer was handed to its client.
    pub fn mark_started(&mut self, request: RequestId) {
        if let Some(entry) = self.requests.get_mut(&request) {
            entry.started = true;
        }
        self.loaded_by(request);
    }

    /// Whether `request` is running (or being cancelled) on `worker`: a message from any other
    /// worker about it is stray.
    fn is_running_on(&self, request: RequestId, worker: WorkerId) -> bool {
        matches!(
            self.requests.get(&request).map(|r| r.phase),
            Some(Phase::Assigned { worker: w } | Phase::Cancelling { worker: w }) if w == worker
        )
    }

    /// The worker finished `request` (`response_complete` or a request `error`): free its slot and
    /// hand the worker more work. Returns false if the request was not running on that worker
    /// (a duplicate or stray message), in which case nothing changed.
    pub fn finish(
        &mut self,
        worker: WorkerId,
        request: RequestId,
        actions: &mut Vec<Action>,
    ) -> bool {
        if !self.is_running_on(request, worker) {
            return false;
        }
        self.requests.remove(&request);
        self.release_slot(worker, request, actions);
        true
    }

    fn release_slot(&mut self, worker: WorkerId, request: RequestId, actions: &mut Vec<Action>) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        w.in_flight.remove(&request);
        if w.draining && w.in_flight.is_empty() {
            actions.push(Action::CloseDrained { worker });
        }
        self.fill_worker(worker, actions);
    }

    /// The client went away or timed out.
    pub fn cancel(&mut self, request: RequestId) -> CancelOutcome {
        let Some(entry) = self.requests.get_mut(&request) else {
            return CancelOutcome::Nothing;
        };
        match entry.phase {
            Phase::Queued => {
                self.dequeue(request);
                self.requests.remove(&request);
                CancelOutcome::RemovedFromQueue
            }
            Phase::Assigned { worker } => {
                entry.phase = Phase::Cancelling { worker };
                CancelOutcome::SendCancel { worker }
            }
            Phase::Cancelling { .. } => CancelOutcome::Nothing,
        }
    }

    /// The grace period of a cancelled request ended without the worker confirming: free its
    /// slot anyway, so one disconnecting client never shrinks a worker's capacity for good.
    pub fn release_cancelled(&mut self, request: RequestId) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(Phase::Cancelling { worker }) = self.requests.get(&request).map(|r| r.phase) {
            self.requests.remove(&request);
            self.release_slot(worker, request, &mut actions);
        }
        actions
    }

    /// The waiter's queue deadline passed: if the request is still queued past its deadline,
    /// remove it and say what it waited for (the caller answers 504). A request dispatched
    /// meanwhile is left alone.
    pub fn expire_queued(&mut self, request: RequestId, now: Instant) -> Option<Expired> {
        match self
            .requests
            .get(&request)
            .map(|r| (r.phase, r.queue_deadline))
        {
            Some((Phase::Queued, queue_deadline)) if queue_deadline <= now => {
                self.dequeue(request);
                let entry = self.requests.remove(&request).expect("present");
                let served = self.providers[entry.provider]
                    .model_workers
                    .contains_key(&entry.model);
                Some(Expired {
                    model: entry.model,
                    served,
                })
            }
            _ => None,
        }
    }

    /// A worker's connection is gone: requeue what it was running where no byte reached the
    /// client (at most [`MAX_REQUEUE_COUNT`] times, never past the original deadline), fail the
    /// rest.
    pub fn worker_gone(&mut self, worker: WorkerId, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(entry) = self.workers.remove(&worker) else {
            return actions;
        };
        self.unindex_models(entry.provider, worker, &entry.models, now);
        self.known_speeds.remember(&entry.name, entry.speeds);
        let mut orphans: Vec<RequestId> = entry.in_flight.into_iter().collect();
        orphans.sort_unstable();
        for request in orphans {
            self.requeue_or_fail(request, now, &mut actions);
        }
        actions
    }

    /// Frees the slot `request` held on `worker`; false (nothing changed) if it was not running
    /// there.
    fn give_back_slot(&mut self, worker: WorkerId, request: RequestId) -> bool {
        if !self.is_running_on(request, worker) {
            return false;
        }
        if let Some(w) = self.workers.get_mut(&worker) {
            w.in_flight.remove(&request);
        }
        true
    }

    /// The worker says its attempt at `request` failed before any output and may be retried
    /// elsewhere (a model process crashed): free its slot and requeue the request under the same
    /// rules as a worker death. Returns false if the request was not running on that worker.
    pub fn retry(
        &mut self,
        worker: WorkerId,
        request: RequestId,
        now: Instant,
        actions: &mut Vec<Action>,
    ) -> bool {
        if !self.give_back_slot(worker, request) {
            return false;
        }
        self.requeue_or_fail(request, now, actions);
        self.fill_worker(worker, actions);
        true
    }

    /// A request whose worker can no longer serve it: requeue it if no byte of its answer reached
    /// the client (at most [`MAX_REQUEUE_COUNT`] times, never past its original deadline), else
    /// fail it. A request already cancelled by its client is simply forgotten.
    fn requeue_or_fail(&mut self, request: RequestId, now: Instant, actions: &mut Vec<Action>) {
        let Some(r) = self.requests.get_mut(&request) else {
            return;
        };
        let fail = if matches!(r.phase, Phase::Cancelling { .. }) {
            self.requests.remove(&request);
            return;
        } else if r.started {
            Some(FailReason::WorkerLostMidStream)
        } else if r.requeues >= MAX_REQUEUE_COUNT {
            Some(FailReason::RequeueExhausted)
        } else if now >= r.deadline {
            Some(FailReason::RequestTimeout)
        } else if self.shutting_down {
            Some(FailReason::ShuttingDown)
        } else {
            None
        };
        if let Some(reason) = fail {
            self.requests.remove(&request);
            actions.push(Action::Fail { request, reason });
            return;
        }
        r.requeues += 1;
        self.place_again(request, now, actions);
    }

    /// Places a request that is not queued on a free worker, or queues it again.
    fn place_again(&mut self, request: RequestId, now: Instant, actions: &mut Vec<Action>) {
        let r = &self.requests[&request];
        let (provider, model, queue_deadline) = (r.provider, r.model.clone(), r.queue_deadline);
        let placement = r.placement.clone();
        if let Some((next, weighed)) = self.pick_worker(provider, &model, &placement, now) {
            self.assign(request, next, weighed, Some(now));
            actions.push(Action::Dispatch {
                request,
                worker: next,
            });
        } else {
            // Accepted requests are never dropped: a requeue may exceed the admission bound.
            // It waits until its original queue deadline; one already past ends at once (504)
            // unless a worker frees up first.
            self.enqueue(request);
            actions.push(Action::Requeued {
                request,
                queue_deadline,
            });
        }
    }

    /// The proxy is shutting down: refuse new work, fail queued requests, drain every worker.
    /// Returns the failures and the workers to tell.
    pub fn begin_shutdown(&mut self) -> (Vec<Action>, Vec<WorkerId>) {
        self.shutting_down = true;
        let mut actions = Vec::new();
        let queued: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, r)| matches!(r.phase, Phase::Queued))
            .map(|(id, _)| *id)
            .collect();
        for request in queued {
            self.dequeue(request);
            self.requests.remove(&request);
            actions.push(Action::Fail {
                request,
                reason: FailReason::ShuttingDown,
            });
        }
        let mut workers: Vec<WorkerId> = self.workers.keys().copied().collect();
        workers.sort_unstable();
        for w in &workers {
            actions.extend(self.drain_worker(*w));
        }
        (actions, workers)
    }

    /// Gives back map capacity left over from a burst once no request is tracked.
    pub fn shrink_if_idle(&mut self) {
        if !self.requests.is_empty() {
            return;
        }
        self.requests.shrink_to_fit();
        for worker in self.workers.values_mut() {
            worker.in_flight.shrink_to_fit();
        }
        for provider in &mut self.providers {
            provider.queue.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests;
