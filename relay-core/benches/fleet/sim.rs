//! A simulated fleet under the proxy's real scheduler: boxes with measured-looking speeds,
//! slots and a prompt cache per slot, driven by a workload in virtual time.
//!
//! The scheduler is the proxy's own (`relay_core::proxy::dispatch::scheduler`, pure, time as
//! an input): the simulation submits each request as the hub would, carries out its dispatch
//! decisions, and reports each answer's timings as a worker does, so cost routing learns the
//! boxes' speeds the way it does in a proxy. A box runs llama-server's loop ([`Prefill::Batches`]):
//! each iteration evaluates up to 2,048 waiting prompt tokens, slot by slot, and generates a
//! token of every answer under way (or, for comparison, evaluates its waiting prompts together,
//! [`Prefill::Together`], or in slot order without batches, [`Prefill::SlotOrder`]), generating
//! at its generation speed
//! (slowed per extra sequence, as batched decoding is), and keeps one prompt per slot:
//! a request reuses what its slot holds of the same conversation, or of the same leading prefix
//! (a shared system prompt), and evaluates the rest. With affinity on, slots are taken as our
//! worker's slot table pins them (a conversation's own slot, a new one where the fewest are
//! kept, a side request where none is; a turn whose own slot a side request holds waits for it,
//! up to 5 s); without it (least-loaded sends no conversation key), as
//! llama-server picks on its own (the slot holding the conversation, else one holding its
//! prefix, else the least recently used).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use relay_core::protocol::{ModelStateReport, RegisterMessage, Timings};
use relay_core::proxy::dispatch::scheduler::{
    Action, AsleepBox, KnownBox, Placement, ProviderLimits, Reason, Registered, RequestId,
    Scheduler, Submitted, WorkerId,
};

use super::probe::{Discipline, Queue, Waiting};
use super::ram::RamCache;

/// The simulation's clock step.
const STEP: f64 = 0.005;

/// How much each extra sequence decoded together slows every sequence of a GPU box (batched
/// decoding is nearly free there; on a CPU it is not: the calibration measures a real box's).
pub const GPU_DECODE_CROWDING: f64 = 0.08;

/// A box of the fleet.
#[derive(Debug, Clone, Copy)]
pub struct BoxSpec {
    /// Its name in the report.
    pub name: &'static str,
    /// Prompt tokens evaluated per second (shared by the prompts it evaluates at once).
    pub prompt_tps: f64,
    /// Tokens generated per second for one sequence.
    pub generation_tps: f64,
    /// How much each extra sequence decoded at once slows every sequence.
    pub decode_crowding: f64,
    /// Requests it runs at once (llama-server's slots; the worker's `max_concurrent`).
    pub slots: u32,
    /// Asleep when the workload starts, and the seconds it takes to wake (measured the last
    /// time it was woken, as the proxy remembers it).
    pub asleep: Option<f64>,
    /// The tokens its llama-server's host-memory prompt cache holds ([`RamCache`]), when the
    /// bench models one (`FLEET_RAM_CACHE=1`): a displaced prompt is saved there and restored
    /// when its conversation comes back to this box.
    pub ram_cache: Option<u32>,
    /// Its backend unloads the model by itself when idle (`FLEET_UNLOADS`: Ollama's
    /// keep-alive, llama-server's `--sleep-idle-seconds`).
    pub unloads: Option<Unloads>,
}

/// A backend that unloads its model after `idle` seconds without work, and takes `load`
/// seconds to load it again at the next request, with every cached prompt gone. Its worker
/// reports the model unloaded, with the load it measured the last time, as ours does.
#[derive(Debug, Clone, Copy)]
pub struct Unloads {
    pub idle: f64,
    pub load: f64,
}

/// One request of a workload.
#[derive(Debug, Clone, Copy)]
pub struct Req {
    /// Its prompt's tokens.
    pub prompt: u32,
    /// The tokens it generates.
    pub output: u32,
    /// Its conversation (the affinity key the proxy derives).
    pub conversation: u64,
    /// Its leading prefix (a system prompt shared by many conversations), and that prefix's size.
    pub prefix: u64,
    /// The prefix's tokens.
    pub prefix_tokens: u32,
    /// A side request (a title, a summary) rather than a turn of the conversation.
    pub side: bool,
    /// Sent by Claude Code (its session header on every request, side requests beside turns).
    pub claude_code: bool,
}

/// One turn of a session: the main request, side requests sent with it, and the pause after
/// its answer before the next turn.
#[derive(Debug, Clone)]
pub struct Step {
    /// The turn.
    pub main: Req,
    /// Sent at the same time.
    pub side: Vec<Req>,
    /// Seconds between the main answer's end and the next turn.
    pub think: f64,
}

/// A client's session: turns one after another from `start`.
#[derive(Debug, Clone)]
pub struct Session {
    /// When its first turn is sent (seconds).
    pub start: f64,
    /// Its turns.
    pub steps: Vec<Step>,
}

/// How the proxy routes in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// No affinity: the least loaded worker.
    LeastLoaded,
    /// Today's affinity: the conversation's home while it has a free slot.
    Affinity,
    /// Affinity on the fastest box alone (the others unused).
    FastOnly,
    /// Affinity with cost routing (measured speeds), on a proxy started afresh: it knows each
    /// box only by its worker's warm-up until the box has answered.
    Cost,
    /// Cost routing on a proxy restarted with its store: it starts with the speeds an earlier
    /// run measured (a home's proxy after its first day).
    CostRestarted,
    /// [`Policy::Cost`] with every awake box's warm-up known before the first request: what a
    /// first run's miss leaves once the seconds before a slow box's warm-up arrives (when the
    /// usual rules place requests, as the issue says they must without a measurement) are
    /// taken out. Not a row of the report: shown beside a first run's miss.
    CostWarmedUp,
    /// No proxy: a central queue with knowledge no proxy has ([`super::probe`]), to tell a
    /// miss that is cost routing's from one no in-order routing is known to avoid.
    Probe(Discipline),
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 5] = [
        Policy::LeastLoaded,
        Policy::Affinity,
        Policy::FastOnly,
        Policy::Cost,
        Policy::CostRestarted,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Policy::LeastLoaded => "least-loaded",
            Policy::Affinity => "affinity",
            Policy::FastOnly => "fast box only",
            Policy::Cost => "cost, first run",
            Policy::CostRestarted => "cost",
            Policy::CostWarmedUp => "cost, first run, warm-ups known at once",
            Policy::Probe(Discipline::InOrder { .. }) => "probe: in order",
            Policy::Probe(Discipline::GivesUp { .. }) => "probe: gives up",
            Policy::Probe(Discipline::ShortestPrompt) => "probe: shortest prompt",
        }
    }

    /// Whether it routes by measured speeds.
    pub fn by_cost(self) -> bool {
        matches!(
            self,
            Policy::Cost | Policy::CostRestarted | Policy::CostWarmedUp
        )
    }
}

/// What one request experienced.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Seconds from sending to the first token.
    pub ttft: f64,
    /// Seconds from sending to the last token.
    pub last: f64,
    /// Prompt tokens taken from a cache.
    pub reused: u32,
    /// Prompt tokens.
    pub prompt: u32,
    /// A side request.
    pub side: bool,
    /// The turn's place in its session (0: the first).
    pub turn: usize,
    /// The box that served it.
    pub served_by: usize,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    conversation: Option<u64>,
    tokens: u32,
    prefix: u64,
    prefix_tokens: u32,
    busy: bool,
    used: f64,
}

#[derive(Debug)]
struct Running {
    id: RequestId,
    slot: usize,
    prefill_left: f64,
    prefill_total: u32,
    generate_left: f64,
    /// When its prompt's evaluation began: when it started, or with [`Prefill::Batches`] when a
    /// batch first took its tokens — llama-server's `prompt_ms` does not count the wait for the
    /// slots before it (measured: a short prompt behind a long one in an earlier slot waited
    /// 0.9 s and reported 28 ms).
    started_at: f64,
    first_token_at: Option<f64>,
    /// A side request's prompt tokens (`None` for a turn): a turn whose slot it holds waits.
    side_prompt: Option<u32>,
}

/// How a box evaluates the prompts of several requests that wait for their first token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefill {
    /// Together, each at an equal share of the box's prompt speed: short prompts among long
    /// ones come out soon (the bench's model until 2026-11-29; the calibration found it the
    /// furthest from llama-server's times).
    Together,
    /// One after another in slot order, as llama-server fills each batch: every pending prompt
    /// token of a slot before any of the next slot's (`update_slots` in its
    /// `tools/server/server-context.cpp`), so a short prompt in a later slot waits for the long
    /// ones before it.
    SlotOrder,
    /// As llama-server's loop runs: each iteration a token for every sequence generating and
    /// up to [`N_BATCH`] prompt tokens in slot order, so a long prompt also slows the answers
    /// being generated beside it (one token per batch of prompt). The default: the closest to a
    /// real llama-server's times (`FLEET_CALIBRATE=1`).
    Batches,
}

/// llama-server's default logical batch (`-b`): prompt tokens evaluated per iteration at most.
const N_BATCH: u32 = 2048;

#[derive(Debug)]
struct SimBox {
    spec: BoxSpec,
    prefill: Prefill,
    /// Seconds between two calls of [`SimBox::step`].
    tick: f64,
    /// Prompt tokens one iteration takes at most ([`Prefill::Batches`]; llama-server's `-b`).
    n_batch: f64,
    worker: WorkerId,
    slots: Vec<Slot>,
    running: Vec<Running>,
    /// Conversation → the slot our worker keeps it in (with affinity on).
    pins: HashMap<u64, usize>,
    /// Asleep (`Some(None)`), waking until this time (`Some(Some(t))`), or awake (`None`).
    sleep: Option<Option<f64>>,
    /// Turns waiting for their own slot, which a side request holds, until a deadline.
    waiting: Vec<(RequestId, Req, f64)>,
    /// With [`Prefill::Batches`], the iteration under way.
    batch: Option<Batch>,
    /// Its llama-server's host-memory prompt cache, when modelled.
    ram: Option<RamCache>,
    /// Its model unloaded ([`Unloads`]): the next request loads it.
    unloaded: bool,
    /// Nothing is evaluated before this time (the model is loading).
    loaded_at: f64,
    /// When it last had work.
    busy_at: f64,
    /// The proxy was told the model is unloaded, and not yet that it is loaded again (the
    /// worker says so once the request that loaded it sends its first event).
    reported_unloaded: bool,
}

/// One iteration of llama-server's loop ([`Prefill::Batches`]).
#[derive(Debug)]
struct Batch {
    /// When it ends.
    ends: f64,
    /// The prompt tokens it evaluates, per request.
    prompts: Vec<(RequestId, f64)>,
    /// The requests it generates a token for.
    generating: Vec<RequestId>,
}

/// How long a turn waits for its own slot while a side request holds it (as our worker's
/// `SIDE_WAIT`).
const SIDE_WAIT: f64 = 5.0;

/// A request whose answer is complete.
#[derive(Debug)]
struct Ended {
    id: RequestId,
    slot: usize,
    timings: Timings,
    /// When its last token came.
    at: f64,
}

impl SimBox {
    /// A box awake (unless `spec` says it sleeps) with empty slots, stepped every `tick` s.
    fn new(spec: BoxSpec, prefill: Prefill, n_batch: u32, worker: WorkerId, tick: f64) -> SimBox {
        let empty = Slot {
            conversation: None,
            tokens: 0,
            prefix: u64::MAX,
            prefix_tokens: 0,
            busy: false,
            used: 0.0,
        };
        SimBox {
            spec,
            prefill,
            tick,
            n_batch: f64::from(n_batch),
            sleep: spec.asleep.map(|_| None),
            worker,
            slots: vec![empty; spec.slots as usize],
            running: Vec::new(),
            pins: HashMap::new(),
            waiting: Vec::new(),
            batch: None,
            ram: spec.ram_cache.map(RamCache::new),
            unloaded: false,
            loaded_at: 0.0,
            busy_at: 0.0,
            reported_unloaded: false,
        }
    }

    /// Unloads the model when its backend would have ([`Unloads`]) by `now`: every slot's and
    /// the host memory's prompts go with it. Whether it did.
    fn unload_when_idle(&mut self, now: f64) -> bool {
        if !self.running.is_empty() || !self.waiting.is_empty() || self.batch.is_some() {
            self.busy_at = now;
            return false;
        }
        let Some(unloads) = self.spec.unloads else {
            return false;
        };
        // A box asleep is woken with its model loaded, its wake time counting the load.
        if self.sleep.is_some() || self.unloaded || now - self.busy_at < unloads.idle {
            return false;
        }
        self.unloaded = true;
        for slot in &mut self.slots {
            (slot.conversation, slot.tokens) = (None, 0);
            (slot.prefix, slot.prefix_tokens) = (u64::MAX, 0);
        }
        self.ram = self.spec.ram_cache.map(RamCache::new);
        true
    }

    /// Whether `req`, a turn, waits for its own slot: a side request no larger than it holds
    /// the slot (as our worker's `Slots::home_held_by_side`).
    fn waits_for_home(&self, req: &Req) -> bool {
        let Some(&home) = self.pins.get(&req.conversation) else {
            return false;
        };
        !req.side
            && self
                .running
                .iter()
                .any(|r| r.slot == home && r.side_prompt.is_some_and(|tokens| tokens <= req.prompt))
    }

    /// Starts `req` at `now` unless it waits for its own slot ([`SimBox::waits_for_home`];
    /// then it is started by [`SimBox::start_waiting`]); the tokens it reuses when started.
    fn admit(&mut self, id: RequestId, req: &Req, pinned: bool, now: f64) -> Option<u32> {
        if pinned && self.waits_for_home(req) {
            self.waiting.push((id, *req, now + SIDE_WAIT));
            return None;
        }
        Some(self.start(id, req, pinned, now))
    }

    /// Starts the waiting turns whose own slot came free or whose wait is over; each with the
    /// tokens it reuses.
    fn start_waiting(&mut self, now: f64) -> Vec<(RequestId, u32)> {
        let waiting = std::mem::take(&mut self.waiting);
        let mut started = Vec::new();
        for (id, req, deadline) in waiting {
            if now < deadline && self.waits_for_home(&req) {
                self.waiting.push((id, req, deadline));
            } else {
                started.push((id, self.start(id, &req, true, now)));
            }
        }
        started
    }

    /// Takes a slot for `req` and starts it at `now`; the tokens it reuses. With a
    /// conversation key (`pinned`), as our worker's slot table picks; without, as llama-server
    /// picks on its own.
    fn start(&mut self, id: RequestId, req: &Req, pinned: bool, now: f64) -> u32 {
        let pick = if pinned {
            self.pinned_slot(req, now)
        } else {
            self.similar_slot(req)
        };
        self.occupy(id, req, pick, now)
    }

    /// Starts `req` in slot `pick` at `now`; the tokens it reuses of what the slot holds.
    fn occupy(&mut self, id: RequestId, req: &Req, pick: usize, now: f64) -> u32 {
        if self.unloaded {
            self.unloaded = false;
            self.loaded_at = now + self.spec.unloads.map_or(0.0, |u| u.load);
        }
        self.busy_at = now;
        let slot = &mut self.slots[pick];
        let mut reused = if slot.conversation == Some(req.conversation) {
            slot.tokens.min(req.prompt)
        } else if slot.prefix == req.prefix {
            slot.prefix_tokens.min(req.prompt)
        } else {
            0
        };
        if let Some(ram) = &mut self.ram {
            reused = ram.swap(
                slot.conversation,
                slot.tokens,
                reused,
                req.conversation,
                req.prompt,
            );
        }
        slot.busy = true;
        slot.used = now;
        let prefill = req.prompt - reused;
        self.running.push(Running {
            id,
            slot: pick,
            prefill_left: f64::from(prefill.max(1)),
            prefill_total: prefill,
            generate_left: f64::from(req.output.max(1)),
            started_at: now.max(self.loaded_at),
            first_token_at: None,
            side_prompt: req.side.then_some(req.prompt),
        });
        reused
    }

    /// llama-server's own choice: the free slot holding the conversation, else one holding its
    /// prefix (the least recently used of those), else the least recently used.
    fn similar_slot(&self, req: &Req) -> usize {
        let free = || self.slots.iter().enumerate().filter(|(_, s)| !s.busy);
        let lru = |a: &(usize, &Slot), b: &(usize, &Slot)| a.1.used.total_cmp(&b.1.used);
        free()
            .find(|(_, s)| s.conversation == Some(req.conversation))
            .or_else(|| {
                free()
                    .filter(|(_, s)| s.prefix == req.prefix && s.prefix_tokens > 0)
                    .min_by(lru)
            })
            .or_else(|| free().min_by(lru))
            .map(|(i, _)| i)
            .expect("the scheduler gives a box no more requests than it has slots")
    }

    /// What losing slot `i`'s cached prompt would cost, as our worker's slot table weighs it
    /// (`Slots::worth`): its tokens, halved every 120 s unused, in steps of 4,096.
    fn worth(&self, i: usize, now: f64) -> u64 {
        let slot = &self.slots[i];
        (f64::from(slot.tokens) * 0.5f64.powf((now - slot.used) / 120.0) / 4_096.0) as u64
    }

    /// Our worker's slot table (`worker::slot_pins`): a conversation's own slot while free,
    /// else the free slot kept for the fewest conversations (then the one whose cached prompt
    /// is worth least, then the one idle longest, then any but slot 0, then the lowest), which
    /// becomes its own; a side request the lowest free slot kept for the fewest conversations,
    /// nobody's after (llama-server evaluates it before the turns in the slots above).
    fn pinned_slot(&mut self, req: &Req, now: f64) -> usize {
        let homes = |slot: usize| self.pins.values().filter(|s| **s == slot).count();
        let free: Vec<usize> = (0..self.slots.len())
            .filter(|i| !self.slots[*i].busy)
            .collect();
        let used = |i: usize| self.slots[i].used;
        let pick = if req.side {
            free.iter()
                .copied()
                .min_by(|a, b| homes(*a).cmp(&homes(*b)).then(a.cmp(b)))
        } else {
            self.pins
                .get(&req.conversation)
                .copied()
                .filter(|home| free.contains(home))
                .or_else(|| {
                    free.iter().copied().min_by(|a, b| {
                        homes(*a)
                            .cmp(&homes(*b))
                            .then(self.worth(*a, now).cmp(&self.worth(*b, now)))
                            .then(used(*a).total_cmp(&used(*b)))
                            .then((*a == 0).cmp(&(*b == 0)))
                    })
                })
        }
        .expect("the scheduler gives a box no more requests than it has slots");
        if !req.side {
            self.pins.insert(req.conversation, pick);
        }
        pick
    }

    /// Advances one tick to `now`; returns the requests whose first token came (and when), and
    /// those that ended.
    fn step(&mut self, now: f64) -> (Vec<(RequestId, f64)>, Vec<Ended>) {
        if now < self.loaded_at {
            return (Vec::new(), Vec::new());
        }
        if self.prefill == Prefill::Batches {
            return self.iterate(now);
        }
        let prefilling = self.running.iter().filter(|r| r.prefill_left > 0.0).count();
        let decoding = self.running.len() - prefilling;
        let prompt_share = if prefilling > 0 {
            self.spec.prompt_tps * self.tick / prefilling as f64
        } else {
            0.0
        };
        let decode = self.spec.generation_tps * self.tick
            / (1.0 + self.spec.decode_crowding * decoding.saturating_sub(1) as f64);
        let mut first = Vec::new();
        // What is left of the step's prompt budget, for `Prefill::SlotOrder`.
        let mut budget = self.spec.prompt_tps * self.tick;
        for i in self.in_slot_order() {
            let r = &mut self.running[i];
            if r.prefill_left > 0.0 {
                let evaluated = match self.prefill {
                    Prefill::Together => prompt_share,
                    // (`Batches` runs in `iterate`.)
                    Prefill::SlotOrder | Prefill::Batches => budget.min(r.prefill_left),
                };
                r.prefill_left -= evaluated;
                budget -= evaluated;
                if r.prefill_left <= 0.0 {
                    r.first_token_at = Some(now);
                    first.push((r.id, now));
                }
            } else {
                r.generate_left -= decode;
            }
        }
        let ended = self.take_ended(now);
        (first, ended)
    }

    /// The running requests' indices, in the order of their slots.
    fn in_slot_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|i| self.running[*i].slot);
        order
    }

    /// Removes the requests whose answer is complete at `now`.
    fn take_ended(&mut self, now: f64) -> Vec<Ended> {
        let mut ended = Vec::new();
        self.running.retain(|r| {
            if r.generate_left > 0.0 {
                return true;
            }
            let first_at = r.first_token_at.unwrap_or(now);
            ended.push(Ended {
                id: r.id,
                slot: r.slot,
                timings: Timings {
                    prompt_tokens: r.prefill_total,
                    prompt_ms: (first_at - r.started_at) * 1000.0,
                    cached_tokens: None,
                    generated_tokens: 0,
                    generation_ms: (now - first_at) * 1000.0,
                },
                at: now,
            });
            false
        });
        ended
    }

    /// [`SimBox::step`] as llama-server's loop runs ([`Prefill::Batches`]): each iteration
    /// that ended by `now` takes effect when it ended (its prompt tokens evaluated, a token
    /// generated for each sequence in it; a prompt's last batch samples its first token), and
    /// the next starts then, with every generating sequence and up to `n_batch` prompt tokens
    /// taken in slot order, lasting their evaluation plus one step of decoding.
    fn iterate(&mut self, now: f64) -> (Vec<(RequestId, f64)>, Vec<Ended>) {
        let mut first = Vec::new();
        let mut ended = Vec::new();
        while let Some(batch) = self.batch.take() {
            if now < batch.ends {
                self.batch = Some(batch);
                return (first, ended);
            }
            let at = batch.ends;
            for r in &mut self.running {
                if let Some((_, tokens)) = batch.prompts.iter().find(|(id, _)| *id == r.id) {
                    r.prefill_left -= tokens;
                    if r.prefill_left <= 0.0 {
                        r.first_token_at = Some(at);
                        r.generate_left -= 1.0;
                        first.push((r.id, at));
                    }
                } else if batch.generating.contains(&r.id) {
                    r.generate_left -= 1.0;
                }
            }
            ended.extend(self.take_ended(at));
            self.begin_batch(at);
        }
        // Idle until now: an iteration starts with what arrived.
        self.begin_batch(now);
        (first, ended)
    }

    /// Starts llama-server's next iteration at `at`, if anything runs.
    fn begin_batch(&mut self, at: f64) {
        let mut room = self.n_batch;
        let mut prompts = Vec::new();
        let mut generating = Vec::new();
        for i in self.in_slot_order() {
            let r = &mut self.running[i];
            if r.prefill_left <= 0.0 {
                generating.push(r.id);
                continue;
            }
            let tokens = room.min(r.prefill_left);
            if tokens > 0.0 {
                // The first batch to take tokens of this prompt: its evaluation begins.
                if r.prefill_left >= f64::from(r.prefill_total.max(1)) {
                    r.started_at = at;
                }
                prompts.push((r.id, tokens));
                room -= tokens;
            }
        }
        let prompt_secs = (self.n_batch - room) / self.spec.prompt_tps;
        let decode_secs = match generating.len() {
            0 => 0.0,
            n => (1.0 + self.spec.decode_crowding * (n - 1) as f64) / self.spec.generation_tps,
        };
        if !prompts.is_empty() || !generating.is_empty() {
            self.batch = Some(Batch {
                ends: at + prompt_secs + decode_secs,
                prompts,
                generating,
            });
        }
    }
}

/// A request in flight or waiting.
#[derive(Debug, Clone, Copy)]
struct Pending {
    req: Req,
    session: usize,
    turn: usize,
    sent: f64,
    first: Option<f64>,
    reused: u32,
    served_by: usize,
}

/// What one run gives: every request's outcome, the scheduler's placements by reason, and what
/// it measured of the boxes (what its store would keep).
pub type Run = (Vec<Outcome>, Vec<(Reason, u64)>, Vec<KnownBox>);

/// Runs `sessions` on `fleet` (its boxes evaluating prompts as `prefill` says) under `policy`,
/// on a proxy that starts knowing `remembered` (what a store gives a restarted proxy).
pub fn run(
    fleet: &[BoxSpec],
    prefill: Prefill,
    sessions: &[Session],
    policy: Policy,
    remembered: &[KnownBox],
) -> Run {
    let base = Instant::now();
    let at = |t: f64| base + Duration::from_secs_f64(t);
    let limits = ProviderLimits {
        max_queue_len: 0,
        queue_timeout: Duration::from_secs(3600),
        request_timeout: Duration::from_secs(7200),
        ..ProviderLimits::default()
    };
    let mut scheduler = Scheduler::new(vec![("local".to_string(), limits)]);
    scheduler.set_cost_routing(policy.by_cost());
    scheduler.restore_known(remembered.to_vec());
    let used: Vec<BoxSpec> = if policy == Policy::FastOnly {
        let fastest = fleet
            .iter()
            .filter(|b| b.asleep.is_none())
            .max_by(|a, b| a.prompt_tps.total_cmp(&b.prompt_tps))
            .copied()
            .expect("a fleet");
        vec![fastest]
    } else {
        fleet.to_vec()
    };
    let mut boxes: Vec<SimBox> = used
        .iter()
        .map(|spec| {
            let registered = join(&mut scheduler, spec);
            if spec.asleep.is_some() {
                // Measured before it went to sleep, as a proxy would have.
                let second = Timings {
                    prompt_tokens: spec.prompt_tps as u32,
                    prompt_ms: 1000.0,
                    cached_tokens: None,
                    generated_tokens: spec.generation_tps as u32,
                    generation_ms: 1000.0,
                };
                scheduler.observe_timings(registered.worker, "m", &second);
                scheduler.worker_gone(registered.worker, at(0.0));
            }
            SimBox::new(*spec, prefill, N_BATCH, registered.worker, STEP)
        })
        .collect();
    let mut box_of: HashMap<WorkerId, usize> = boxes
        .iter()
        .enumerate()
        .map(|(i, b)| (b.worker, i))
        .collect();
    for b in &boxes {
        if let Some(wake) = b.spec.asleep {
            scheduler.learn_wake(b.spec.name, Duration::from_secs_f64(wake));
        }
    }
    scheduler.set_asleep(&asleep(&boxes));
    // Each awake box's warm-up reaches the proxy once measured (its slot time is not
    // simulated: a second at most, before the workload's first requests as a rule).
    let mut warm_ups: Vec<(f64, WorkerId, Timings)> = boxes
        .iter()
        .filter(|b| b.spec.asleep.is_none())
        .map(|b| {
            let (after, timings) = warm_up_of(&b.spec);
            let after = if policy == Policy::CostWarmedUp {
                0.0
            } else {
                after
            };
            (after, b.worker, timings)
        })
        .collect();
    // Waiters woken at their queue deadline (a request waiting for a box gives up on it then).
    let mut waiters: Vec<(f64, RequestId)> = Vec::new();
    let mut pending: HashMap<RequestId, Pending> = HashMap::new();
    let mut next_id: RequestId = 1;
    // Per session: the next turn and when it is due (None while its turn runs).
    let mut due: Vec<(usize, Option<f64>)> = sessions.iter().map(|s| (0, Some(s.start))).collect();
    let mut outcomes = Vec::new();
    let mut now = 0.0;
    let mut probe = match policy {
        Policy::Probe(discipline) => Some(Queue::new(discipline)),
        _ => None,
    };
    let placement = |req: &Req| Placement {
        affinity: (policy != Policy::LeastLoaded).then_some(req.conversation),
        prompt_tokens: Some(req.prompt),
        side: req.side && policy != Policy::LeastLoaded,
        expects_side_requests: req.claude_code && !req.side,
        // The bench's workers pin every request's slot, side requests' too, as ours does on
        // chat completions and Claude Code's `/v1/messages`.
        slot_hinted: true,
        ..Placement::default()
    };
    let start_on = |boxes: &mut Vec<SimBox>,
                    box_of: &HashMap<WorkerId, usize>,
                    pending: &mut HashMap<RequestId, Pending>,
                    id: RequestId,
                    worker: WorkerId,
                    now: f64| {
        let index = box_of[&worker];
        let p = pending.get_mut(&id).expect("pending");
        p.served_by = index;
        if let Some(reused) = boxes[index].admit(id, &p.req, policy != Policy::LeastLoaded, now) {
            p.reused = reused;
        }
    };
    loop {
        warm_ups.retain(|(at, worker, timings)| {
            let due = *at <= now;
            if due {
                scheduler.observe_warm_up(*worker, "m", timings);
            }
            !due
        });
        // Turns that are due.
        for (s, session) in sessions.iter().enumerate() {
            let (turn, when) = due[s];
            let Some(when) = when else { continue };
            if when > now || turn >= session.steps.len() {
                continue;
            }
            due[s].1 = None;
            let step = &session.steps[turn];
            for req in std::iter::once(&step.main).chain(&step.side) {
                let id = next_id;
                next_id += 1;
                pending.insert(
                    id,
                    Pending {
                        req: *req,
                        session: s,
                        turn,
                        sent: now,
                        first: None,
                        reused: 0,
                        served_by: 0,
                    },
                );
                if let Some(queue) = probe.as_mut() {
                    queue.push(Waiting {
                        id,
                        sent: now,
                        output: req.output,
                        prompt: req.prompt,
                    });
                    // A probe knows the work is coming: it wakes every box with the first.
                    for b in boxes.iter_mut().filter(|b| b.sleep == Some(None)) {
                        b.sleep = Some(Some(now + b.spec.asleep.expect("a box that sleeps")));
                    }
                    continue;
                }
                match scheduler.submit(id, "m", placement(req), at(now)) {
                    Ok(Submitted::Dispatched { worker, .. }) => {
                        start_on(&mut boxes, &box_of, &mut pending, id, worker, now)
                    }
                    Ok(Submitted::Queued { queue_deadline, .. }) => {
                        waiters.push((queue_deadline.duration_since(base).as_secs_f64(), id));
                        // As the hub: wake the box cost routing chose, or every sleeping box
                        // when nothing awake serves the model.
                        let wake = scheduler
                            .box_to_wake(id)
                            .map(|(b, _)| b.map(str::to_string));
                        let wake = wake.or((!scheduler.is_served("m")).then_some(None));
                        for b in boxes.iter_mut() {
                            let wanted = wake.as_ref().is_some_and(|only| {
                                only.as_deref().is_none_or(|name| name == b.spec.name)
                            });
                            if wanted && b.sleep == Some(None) {
                                let took = b.spec.asleep.expect("a box that sleeps");
                                b.sleep = Some(Some(now + took));
                            }
                        }
                    }
                    Err(error) => panic!("refused: {error:?}"),
                }
            }
        }
        // Boxes that woke join; waiters whose wait ended ask again.
        let mut dispatches = Vec::new();
        let mut woke = false;
        for (i, b) in boxes.iter_mut().enumerate() {
            if let Some(Some(until)) = b.sleep {
                if until <= now {
                    let registered = join(&mut scheduler, &b.spec);
                    b.worker = registered.worker;
                    b.sleep = None;
                    box_of.insert(registered.worker, i);
                    dispatches.extend(dispatched(registered.actions));
                    woke = true;
                }
            }
        }
        if woke {
            scheduler.set_asleep(&asleep(&boxes));
        }
        waiters.retain(|(deadline, id)| {
            if *deadline > now {
                return true;
            }
            let mut actions = Vec::new();
            scheduler.stop_waiting_for_wake(*id, at(now), &mut actions);
            dispatches.extend(dispatched(actions));
            false
        });
        // The boxes work.
        for b in &mut boxes {
            let worker = b.worker;
            let (first, ended) = b.step(now);
            for (id, at) in first {
                // A first token: the model is loaded; its worker's next pong says so.
                if b.reported_unloaded {
                    b.reported_unloaded = false;
                    scheduler.set_model_states(worker, &model_states(&b.spec, "loaded"));
                }
                if probe.is_none() {
                    scheduler.mark_started(id);
                }
                if let Some(p) = pending.get_mut(&id) {
                    p.first = Some(at);
                }
            }
            for Ended {
                id,
                slot,
                mut timings,
                at,
            } in ended
            {
                let p = pending.remove(&id).expect("pending");
                timings.generated_tokens = p.req.output;
                let s = &mut b.slots[slot];
                *s = Slot {
                    conversation: Some(p.req.conversation),
                    tokens: p.req.prompt + p.req.output,
                    prefix: p.req.prefix,
                    prefix_tokens: p.req.prefix_tokens,
                    busy: false,
                    used: at,
                };
                if probe.is_none() {
                    scheduler.learn(worker, id, &timings);
                    let mut actions = Vec::new();
                    assert!(scheduler.finish(worker, id, &mut actions));
                    dispatches.extend(dispatched(actions));
                }
                outcomes.push(Outcome {
                    ttft: p.first.unwrap_or(at) - p.sent,
                    last: at - p.sent,
                    reused: p.reused,
                    prompt: p.req.prompt,
                    side: p.req.side,
                    turn: p.turn,
                    served_by: p.served_by,
                });
                if !p.req.side {
                    let step = &sessions[p.session].steps[p.turn];
                    due[p.session] = (p.turn + 1, Some(at + step.think));
                }
            }
        }
        // Idle backends unload; their workers say so at once (ours within a few seconds).
        for b in &mut boxes {
            if b.unload_when_idle(now) {
                b.reported_unloaded = true;
                scheduler.set_model_states(b.worker, &model_states(&b.spec, "unloaded"));
            }
        }
        if let Some(queue) = probe.as_mut() {
            hand_out(queue, &mut boxes, &mut pending, now);
        }
        for (id, worker) in dispatches {
            start_on(&mut boxes, &box_of, &mut pending, id, worker, now);
        }
        for b in &mut boxes {
            for (id, reused) in b.start_waiting(now) {
                pending.get_mut(&id).expect("pending").reused = reused;
            }
        }
        let done = pending.is_empty()
            && due
                .iter()
                .zip(sessions)
                .all(|((turn, _), session)| *turn >= session.steps.len());
        if done {
            return (outcomes, scheduler.reason_counts(), scheduler.known_boxes());
        }
        now += STEP;
        assert!(now < 100_000.0, "the simulation does not end");
    }
}

/// A probe's queue hands waiting requests to free slots: the fastest awake boxes' first (each
/// box as fast as the fastest takes its turn as one), then the slower ones', fastest first.
fn hand_out(
    queue: &mut Queue,
    boxes: &mut [SimBox],
    pending: &mut HashMap<RequestId, Pending>,
    now: f64,
) {
    let mut by_speed: Vec<usize> = (0..boxes.len())
        .filter(|&i| boxes[i].sleep.is_none())
        .collect();
    by_speed.sort_by(|&a, &b| {
        boxes[b]
            .spec
            .prompt_tps
            .total_cmp(&boxes[a].spec.prompt_tps)
    });
    let Some(&first) = by_speed.first() else {
        return;
    };
    let fastest_tps = boxes[first].spec.prompt_tps;
    for i in by_speed {
        let fastest = boxes[i].spec.prompt_tps >= fastest_tps;
        while boxes[i].running.len() + boxes[i].waiting.len() < boxes[i].spec.slots as usize {
            let Some(id) = queue.take_for(fastest, now) else {
                break;
            };
            let p = pending.get_mut(&id).expect("pending");
            p.served_by = i;
            if let Some(reused) = boxes[i].admit(id, &p.req, true, now) {
                p.reused = reused;
            }
        }
    }
}

/// One request of a [`replay`]: sent `after` seconds after the previous request of its slot
/// ended (the slot's first, after the replay began); a prompt of `prompt` tokens, none cached,
/// and an answer of `output` tokens.
#[derive(Debug, Clone, Copy)]
pub struct SlotRequest {
    pub after: f64,
    pub prompt: u32,
    pub output: u32,
}

/// What a request of a [`replay`] saw: seconds from sending it to its first and last token.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub ttft: f64,
    pub last: f64,
}

/// Runs one box alone, slot `i` sending `chains[i]` one request after another — the requests
/// the calibration also sends a real llama-server, pinned to the same slots — and returns,
/// slot by slot, what each request saw. `n_batch` is the server's `-b`.
pub fn replay(
    spec: BoxSpec,
    prefill: Prefill,
    n_batch: u32,
    chains: &[Vec<SlotRequest>],
) -> Vec<Vec<Seen>> {
    // Fine enough for a real box's millisecond decoding steps.
    const TICK: f64 = 0.0002;
    let mut sim = SimBox::new(spec, prefill, n_batch, 0, TICK);
    let mut seen: Vec<Vec<Seen>> = chains.iter().map(|_| Vec::new()).collect();
    let mut due: Vec<Option<f64>> = chains.iter().map(|c| c.first().map(|r| r.after)).collect();
    // Running requests: their slot, when they were sent, when their first token came.
    let mut running: HashMap<RequestId, (usize, f64, Option<f64>)> = HashMap::new();
    let mut next_id: RequestId = 1;
    let mut now = 0.0;
    loop {
        let (first, ended) = sim.step(now);
        for (id, at) in first {
            running.get_mut(&id).expect("running").2 = Some(at);
        }
        for end in ended {
            let (slot, sent, first) = running.remove(&end.id).expect("running");
            sim.slots[end.slot].busy = false;
            seen[slot].push(Seen {
                ttft: first.unwrap_or(end.at) - sent,
                last: end.at - sent,
            });
            due[slot] = chains[slot].get(seen[slot].len()).map(|r| end.at + r.after);
        }
        for (slot, when) in due.iter_mut().enumerate() {
            if when.is_some_and(|t| t <= now) {
                *when = None;
                let r = chains[slot][seen[slot].len()];
                let req = Req {
                    prompt: r.prompt,
                    output: r.output,
                    conversation: next_id,
                    prefix: next_id,
                    prefix_tokens: 0,
                    side: false,
                    claude_code: false,
                };
                sim.occupy(next_id, &req, slot, now);
                running.insert(next_id, (slot, now, None));
                next_id += 1;
            }
        }
        if running.is_empty() && due.iter().all(Option::is_none) {
            return seen;
        }
        now += TICK;
        assert!(now < 10_000.0, "the replay does not end");
    }
}

/// Registers the box `spec` as its worker does when it connects.
fn join(scheduler: &mut Scheduler, spec: &BoxSpec) -> Registered {
    scheduler
        .register_worker(
            "local",
            &RegisterMessage {
                warm_ups: None,
                // The box's slots are taken as our worker's slot table pins them (side
                // requests the lowest free slot), and its worker says so. (A real worker knows
                // it once its slot probe ran, just after its warm-up: before that the proxy
                // has no speed for the box, and the flag changes nothing.)
                sides_first: Some(vec!["m".to_string()]),
                worker_name: spec.name.to_string(),
                models: vec!["m".to_string()],
                max_concurrent: spec.slots,
                protocol_version: Some("1".to_string()),
                current_load: Some(0),
                mac_address: None,
                sleeps_when_idle: None,
                context_windows: None,
            },
        )
        .expect("registered")
}

/// The warm-up the worker of box `spec` measures when it starts (`worker::warm_up`: a prompt
/// of 1,000 tokens and 16 generated, alone), and the seconds it takes, after which its
/// `models_update` reaches the proxy.
fn warm_up_of(spec: &BoxSpec) -> (f64, Timings) {
    let (prompt_secs, generation_secs) = (1000.0 / spec.prompt_tps, 16.0 / spec.generation_tps);
    let timings = Timings {
        prompt_tokens: 1000,
        prompt_ms: 1000.0 * prompt_secs,
        cached_tokens: None,
        generated_tokens: 16,
        generation_ms: 1000.0 * generation_secs,
    };
    (prompt_secs + generation_secs, timings)
}

/// The boxes asleep (or waking), as the hub tells the scheduler.
/// The model's state on a box whose backend unloads it, with the load measured the last time.
fn model_states(spec: &BoxSpec, state: &str) -> Vec<ModelStateReport> {
    vec![ModelStateReport {
        model: "m".to_string(),
        state: state.to_string(),
        load_ms: spec.unloads.map(|u| (u.load * 1000.0) as u64),
    }]
}

fn asleep(boxes: &[SimBox]) -> Vec<AsleepBox> {
    boxes
        .iter()
        .filter(|b| b.sleep.is_some())
        .map(|b| AsleepBox {
            provider: "local".to_string(),
            name: b.spec.name.to_string(),
            models: vec!["m".to_string()],
        })
        .collect()
}

/// The requests `actions` send to a worker.
fn dispatched(actions: Vec<Action>) -> impl Iterator<Item = (RequestId, WorkerId)> {
    actions.into_iter().filter_map(|a| match a {
        Action::Dispatch { request, worker } => Some((request, worker)),
        _ => None,
    })
}
