//! Where a request without a usable home goes: a new conversation to the box with the fewest
//! conversations per slot, a request of no conversation to the least loaded box.

use super::{Scheduler, Worker, WorkerId};

/// A ratio `homes / slots`, compared exactly (cross-multiplied, no rounding): 1/2 equals 2/4.
#[derive(Debug, Clone, Copy)]
struct PerSlot(u64, u64);

impl PartialEq for PerSlot {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for PerSlot {}

impl PartialOrd for PerSlot {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PerSlot {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0 * other.1).cmp(&(other.0 * self.1))
    }
}

impl Scheduler {
    /// The least loaded of `candidates` that are `eligible`, the `turn`th among equals.
    pub(super) fn least_loaded(
        &self,
        turn: usize,
        candidates: &[WorkerId],
        eligible: &dyn Fn(&Worker) -> bool,
    ) -> Option<WorkerId> {
        let best_load = candidates
            .iter()
            .map(|id| &self.workers[id])
            .filter(|w| eligible(w))
            .map(Worker::load)
            .min()?;
        let tied = || {
            candidates.iter().filter(|id| {
                let w = &self.workers[*id];
                eligible(w) && w.load() == best_load
            })
        };
        tied().nth(turn % tied().count()).copied()
    }

    /// A worker with a free slot for a conversation without a usable home: the fewest
    /// conversations per slot first ([`super::AffinityTable::homes_of`]), then the least loaded, then
    /// the lowest id. Least-loaded alone, ties broken in turn, can put four conversations on
    /// one three-slot server and two on another, and then the four evict each other's prompts
    /// from its cache on every turn.
    pub(super) fn pick_new_home(
        &self,
        provider: usize,
        model: &str,
        eligible: &dyn Fn(&Worker) -> bool,
    ) -> Option<WorkerId> {
        let candidates = self.providers[provider].model_workers.get(model)?;
        candidates
            .iter()
            .filter(|id| eligible(&self.workers[*id]))
            .min_by_key(|id| {
                let w = &self.workers[*id];
                let homes = self.affinity.homes_of(**id) as u64;
                let slots = u64::from(w.max_concurrent.max(1));
                (PerSlot(homes, slots), w.load(), **id)
            })
            .copied()
    }
}
