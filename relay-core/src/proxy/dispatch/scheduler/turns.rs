//! Which queued request a freed slot takes: the queue discipline of one provider, pure.
//!
//! - Interactive before batch, with ageing: once a batch request has waited through
//!   [`BATCH_AGEING_TURNS`] slot turns given to other work, batch gets the next turn, as if it were
//!   interactive. Batch work therefore always gets at least one freed slot in
//!   `BATCH_AGEING_TURNS + 1` while it waits, and never starves.
//! - Within a class, clients take turns: each client (an API key, or an address) has its own
//!   FIFO, and the client that has had the fewest turns goes next (ties: the older request). A
//!   client that starts waiting joins at the turn count of the client served last, so it neither
//!   pays for the time it was idle nor is owed for it: one client's flood of a thousand requests
//!   delays another client's request by at most one turn.
//! - A request that finds a free slot at once is a turn too, so a client whose first request
//!   went straight to a worker does not tie, when its next ones queue, with a client that had
//!   nothing yet. A client remembers its count while idle only when it is ahead of the class
//!   (and at most [`MAX_REMEMBERED_CLIENTS`] of them): behind, it would rejoin level anyway.
//! - Weighted turns: a client of weight `w` (a key's `weight`, 1 to [`MAX_WEIGHT`]) pays
//!   `1/w` of a turn for each slot it gets, so under contention a weight-3 key is served three
//!   times for each request of a weight-1 key. Counts are kept in [`STRIDE`]s, which every
//!   weight divides evenly, so the arithmetic stays exact.
//! - A request keeps its id when it is requeued, and ids grow with arrival: a requeued request
//!   goes back to the head of its client's FIFO, where it was.
//!
//! A slot only takes work for the models its worker serves, so every choice is made among the
//! requests for those models.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::proxy::dispatch::scheduler::{Priority, RequestId};
pub use crate::store::MAX_WEIGHT;

/// What one turn costs a weight-1 client, in the units turn counts are kept in: the least common
/// multiple of 1 to [`MAX_WEIGHT`], so that a weight-`w` client's turn costs exactly
/// `STRIDE / w`.
pub const STRIDE: u64 = 720_720;

/// What one turn costs a client of `weight` (0 counts as 1; above [`MAX_WEIGHT`] as the most).
fn stride(weight: u32) -> u64 {
    STRIDE / u64::from(weight.clamp(1, MAX_WEIGHT))
}

/// Slot turns a waiting batch request lets other work take before batch gets the next one.
///
/// Counted in turns rather than seconds because turns are what is shared: a bound in seconds
/// would be shorter than one long generation (batch would be interactive) or, with short ones,
/// let hundreds of interactive requests pass. Eight keeps interactive work at least 8 of every
/// 9 contended turns (a person waits behind at most one batch request per 8 turns) while batch
/// work keeps a ninth of the slots however much interactive work arrives.
pub const BATCH_AGEING_TURNS: u64 = 8;

/// Idle clients whose turn counts are remembered at most, per class. Past it they are forgotten
/// all at once, which costs each of them at most the one turn it was ahead by.
pub const MAX_REMEMBERED_CLIENTS: usize = 1024;

/// Who asks: a key's id, an address, or nobody known.
pub type Client = Option<Arc<str>>;

/// The queue of one provider: every queued request, by class, client and model.
#[derive(Debug, Default)]
pub struct Turns {
    interactive: Class,
    batch: Class,
    /// Requests handed to slots from this queue so far: the clock batch requests age by.
    turns: u64,
}

/// The requests of one priority class.
#[derive(Debug, Default)]
struct Class {
    clients: HashMap<Client, ClientQueue>,
    /// The turn count of the client served last, when it was served: where a client that starts
    /// waiting joins.
    served: u64,
    /// Idle clients ahead of `served`, with their turn counts.
    ahead: HashMap<Client, u64>,
    len: usize,
}

/// One client's waiting requests of one class.
#[derive(Debug, Default)]
struct ClientQueue {
    /// Turns this client has had (in its class's count, see [`Class::served`]), in strides.
    turns: u64,
    /// Its weight, as its latest request gave it.
    weight: u32,
    /// Its requests per model, oldest (smallest id) first, each with the queue's turn count when
    /// it was (re)queued.
    by_model: HashMap<Arc<str>, BTreeMap<RequestId, u64>>,
    len: usize,
}

/// Where a queued request sits, as the scheduler remembers it.
#[derive(Debug, Clone, Copy)]
pub struct Seat<'a> {
    /// Its model.
    pub model: &'a Arc<str>,
    /// Its client.
    pub client: &'a Client,
    /// Its class.
    pub priority: Priority,
    /// Its client's weight in the turns (0 or 1: an even share).
    pub weight: u32,
}

/// A client's best candidate for a slot: its oldest request for one of the slot's models.
#[derive(Debug, Clone)]
struct Candidate {
    client: Client,
    turns: u64,
    request: RequestId,
    model: Arc<str>,
    queued_at: u64,
}

impl Turns {
    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.interactive.len + self.batch.len
    }

    fn class_mut(&mut self, priority: Priority) -> &mut Class {
        match priority {
            Priority::Interactive => &mut self.interactive,
            Priority::Batch => &mut self.batch,
        }
    }

    #[cfg(test)]
    fn class(&self, priority: Priority) -> &Class {
        match priority {
            Priority::Interactive => &self.interactive,
            Priority::Batch => &self.batch,
        }
    }

    /// Queues `request`. Re-queuing a request that is already queued changes nothing.
    pub fn push(&mut self, request: RequestId, seat: Seat<'_>) {
        let now = self.turns;
        let class = self.class_mut(seat.priority);
        if !class.clients.contains_key(seat.client) {
            let joined = class
                .served
                .max(class.ahead.remove(seat.client).unwrap_or(0));
            class.clients.insert(
                seat.client.clone(),
                ClientQueue {
                    turns: joined,
                    ..ClientQueue::default()
                },
            );
        }
        let queue = class.clients.get_mut(seat.client).expect("inserted above");
        queue.weight = seat.weight;
        let fifo = queue.by_model.entry(seat.model.clone()).or_default();
        if fifo.contains_key(&request) {
            return;
        }
        fifo.insert(request, now);
        queue.len += 1;
        class.len += 1;
    }

    /// Takes `request` out (cancelled, expired, shut down) without counting a turn. False if it
    /// was not queued there.
    pub fn remove(&mut self, request: RequestId, seat: Seat<'_>) -> bool {
        let class = self.class_mut(seat.priority);
        let Some(queue) = class.clients.get_mut(seat.client) else {
            return false;
        };
        let Some(fifo) = queue.by_model.get_mut(seat.model) else {
            return false;
        };
        if fifo.remove(&request).is_none() {
            return false;
        }
        if fifo.is_empty() {
            queue.by_model.remove(seat.model);
        }
        queue.len -= 1;
        class.len -= 1;
        if queue.len == 0 {
            // Idle: memory stays bounded by what waits (and the few remembered ahead).
            let turns = queue.turns;
            class.clients.remove(seat.client);
            class.remember(seat.client, turns);
        }
        true
    }

    /// A request of `client` went straight to a free slot without queueing: a turn all the same.
    pub fn served_directly(&mut self, seat: Seat<'_>) {
        let cost = stride(seat.weight);
        let class = self.class_mut(seat.priority);
        let turns = match class.clients.get_mut(seat.client) {
            Some(queue) => {
                queue.turns += cost;
                queue.turns - cost
            }
            None => {
                let turns = class
                    .served
                    .max(class.ahead.get(seat.client).copied().unwrap_or(0));
                class.remember(seat.client, turns + cost);
                turns
            }
        };
        class.advance(turns);
    }

    /// Takes the request a freed slot of a worker serving `models` gets, counting the turn.
    #[cfg(test)]
    pub fn take_next(&mut self, models: &[Arc<str>]) -> Option<RequestId> {
        self.take_next_where(models, &|_| true)
    }

    /// [`Turns::take_next`] among the requests `accept` takes: in a FIFO whose head it refuses,
    /// the first request it takes goes ahead of the head this once (a prompt too long for
    /// this worker waits for one that holds it, and does not hold up its client's others).
    pub fn take_next_where(
        &mut self,
        models: &[Arc<str>],
        accept: &dyn Fn(RequestId) -> bool,
    ) -> Option<RequestId> {
        let interactive = self.interactive.candidate(models, accept);
        let batch = self.batch.candidate(models, accept);
        let (priority, chosen) = match (interactive, batch) {
            (None, None) => return None,
            (Some(i), None) => (Priority::Interactive, i),
            (None, Some(b)) => (Priority::Batch, b),
            (Some(i), Some(b)) => {
                let oldest = self.batch.oldest_queued_at(models).unwrap_or(b.queued_at);
                if self.turns.saturating_sub(oldest) >= BATCH_AGEING_TURNS {
                    (Priority::Batch, b)
                } else {
                    (Priority::Interactive, i)
                }
            }
        };
        self.turns += 1;
        let class = self.class_mut(priority);
        if let Some(queue) = class.clients.get_mut(&chosen.client) {
            queue.turns = chosen.turns + stride(queue.weight);
        }
        class.advance(chosen.turns);
        let removed = self.remove(
            chosen.request,
            Seat {
                model: &chosen.model,
                client: &chosen.client,
                priority,
                weight: 0,
            },
        );
        debug_assert!(removed, "the candidate was queued");
        Some(chosen.request)
    }

    /// Gives back map capacity left over from a burst.
    pub fn shrink_to_fit(&mut self) {
        for class in [&mut self.interactive, &mut self.batch] {
            class.clients.shrink_to_fit();
            class.ahead.shrink_to_fit();
        }
    }

    /// Whether `request` is queued at `seat` (for the scheduler's consistency checks).
    #[cfg(test)]
    pub fn contains(&self, request: RequestId, seat: Seat<'_>) -> bool {
        self.class(seat.priority)
            .clients
            .get(seat.client)
            .and_then(|q| q.by_model.get(seat.model))
            .is_some_and(|fifo| fifo.contains_key(&request))
    }

    /// How many (client, model) FIFOs are kept.
    #[cfg(test)]
    pub fn fifo_count(&self) -> usize {
        [&self.interactive, &self.batch]
            .iter()
            .flat_map(|c| c.clients.values())
            .map(|q| q.by_model.len())
            .sum()
    }

    /// Every count agrees with what is stored, and nothing empty is kept.
    #[cfg(test)]
    pub fn assert_consistent(&self) {
        for priority in [Priority::Interactive, Priority::Batch] {
            let class = self.class(priority);
            let mut total = 0;
            for queue in class.clients.values() {
                let held: usize = queue.by_model.values().map(BTreeMap::len).sum();
                assert_eq!(held, queue.len, "a client's count");
                assert!(queue.len > 0, "no idle client is kept");
                assert!(
                    queue.by_model.values().all(|f| !f.is_empty()),
                    "no empty model queue is kept"
                );
                total += held;
            }
            assert_eq!(total, class.len, "a class's count");
            assert!(class.ahead.len() <= MAX_REMEMBERED_CLIENTS);
            for (client, turns) in &class.ahead {
                assert!(*turns > class.served, "only clients ahead are remembered");
                assert!(!class.clients.contains_key(client), "only idle ones");
            }
        }
    }
}

impl Class {
    /// A client was served at `turns`: the count newcomers join at moves up to it, and idle
    /// clients no longer ahead are forgotten.
    fn advance(&mut self, turns: u64) {
        if turns > self.served {
            self.served = turns;
            let served = self.served;
            self.ahead.retain(|_, t| *t > served);
        }
    }

    /// Keeps an idle client's count if it is ahead of the class.
    fn remember(&mut self, client: &Client, turns: u64) {
        if turns <= self.served {
            self.ahead.remove(client);
            return;
        }
        if self.ahead.len() >= MAX_REMEMBERED_CLIENTS && !self.ahead.contains_key(client) {
            self.ahead.clear();
        }
        self.ahead.insert(client.clone(), turns);
    }

    /// The client whose turn it is among those waiting for one of `models`, with its oldest such
    /// request: fewest turns first, then the older request.
    fn candidate(
        &self,
        models: &[Arc<str>],
        accept: &dyn Fn(RequestId) -> bool,
    ) -> Option<Candidate> {
        if self.len == 0 {
            return None;
        }
        let mut best: Option<Candidate> = None;
        for (client, queue) in &self.clients {
            let Some((model, (request, queued_at))) = models
                .iter()
                .filter_map(|m| {
                    // The FIFO's first request `accept` takes: its head, unless a worker's
                    // context window cannot hold that one (then the next it can).
                    let (id, at) = queue.by_model.get(m)?.iter().find(|(id, _)| accept(**id))?;
                    Some((m, (*id, *at)))
                })
                .min_by_key(|(_, (id, _))| *id)
            else {
                continue;
            };
            let better = best
                .as_ref()
                .is_none_or(|b| (queue.turns, request) < (b.turns, b.request));
            if better {
                best = Some(Candidate {
                    client: client.clone(),
                    turns: queue.turns,
                    request,
                    model: model.clone(),
                    queued_at,
                });
            }
        }
        best
    }

    /// When the longest-waiting request at the head of a FIFO for one of `models` was queued,
    /// in queue turns. Heads only: behind a head every request is younger, except behind a
    /// requeued one, whose own ageing then stands for its FIFO's (it ages as fast).
    fn oldest_queued_at(&self, models: &[Arc<str>]) -> Option<u64> {
        self.clients
            .values()
            .flat_map(|q| models.iter().filter_map(|m| q.by_model.get(m)))
            .filter_map(|fifo| fifo.first_key_value().map(|(_, at)| *at))
            .min()
    }
}

#[cfg(test)]
mod tests;
