//! What the scheduler holds, read: counts, queue depths, models and workers, for the dashboard,
//! `/metrics`, the published `/admin` API and the shutdown drain.

use super::*;

impl Scheduler {
    /// Requests still running on workers (for the shutdown drain).
    pub fn in_flight_count(&self) -> usize {
        self.workers.values().map(|w| w.in_flight.len()).sum()
    }

    /// Queued requests across all providers.
    pub fn queue_depth(&self) -> usize {
        self.providers.iter().map(|p| p.queue.len()).sum()
    }

    /// Queue depth per provider, in configuration order.
    pub fn queue_depths(&self) -> Vec<(String, usize)> {
        self.providers
            .iter()
            .map(|p| (p.name.clone(), p.queue.len()))
            .collect()
    }

    /// Conversation affinity placements so far (hits, misses, new) and the table's size.
    pub fn affinity_counts(&self) -> AffinityCounts {
        self.affinity.counts()
    }

    /// Connected workers.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Requests the scheduler still tracks (queued, running or cancelling).
    pub fn tracked_requests(&self) -> usize {
        self.requests.len()
    }

    /// Every routable model with the provider that serves it, sorted, without duplicates.
    pub fn models(&self) -> Vec<(String, String)> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for p in &self.providers {
            let mut names: Vec<&Arc<str>> = p.model_workers.keys().collect();
            names.sort();
            for name in names {
                if seen.insert(name.to_string()) {
                    out.push((name.to_string(), p.name.clone()));
                }
            }
        }
        out.sort();
        out
    }

    /// A snapshot of every worker, ordered by id.
    pub fn workers(&self) -> Vec<WorkerSnapshot> {
        let mut ids: Vec<&WorkerId> = self.workers.keys().collect();
        ids.sort_unstable();
        ids.into_iter()
            .map(|id| {
                let w = &self.workers[id];
                WorkerSnapshot {
                    id: worker_wire_id(*id),
                    provider: self.providers[w.provider].name.clone(),
                    name: w.name.clone(),
                    models: w.models.iter().map(|m| m.to_string()).collect(),
                    in_flight: w.in_flight.len() as u32,
                    external_load: w.external_load,
                    max_concurrent: w.max_concurrent,
                    draining: w.draining,
                    context_windows: w
                        .windows
                        .iter()
                        .map(|(model, tokens)| (model.to_string(), *tokens))
                        .collect(),
                    speeds: w
                        .speeds
                        .iter()
                        .map(|(model, speed)| (model.to_string(), *speed))
                        .collect(),
                    sides_first: w.sides_first.iter().map(|m| m.to_string()).collect(),
                }
            })
            .collect()
    }

    /// Where a tracked request is: `Some(None)` while queued, `Some(Some(worker))` while it
    /// runs (or is being cancelled) there, `None` when it is not tracked.
    pub fn assignment(&self, request: RequestId) -> Option<Option<WorkerId>> {
        self.requests.get(&request).map(|r| match r.phase {
            Phase::Queued => None,
            Phase::Assigned { worker } | Phase::Cancelling { worker } => Some(worker),
        })
    }

    /// The name of a connected worker.
    pub fn worker_name(&self, worker: WorkerId) -> Option<&str> {
        self.workers.get(&worker).map(|w| w.name.as_str())
    }

    /// The end of a tracked request's life, fixed when it arrived.
    pub fn request_deadline(&self, request: RequestId) -> Option<Instant> {
        self.requests.get(&request).map(|r| r.deadline)
    }
}
