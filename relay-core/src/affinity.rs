//! The conversation affinity table: where each conversation was served last.
//!
//! A backend such as llama-server reuses a prompt's already-evaluated prefix only on the server
//! and in the slot that saw it last, so a conversation's next turn is much cheaper there. The
//! table remembers that "home" per affinity key: the proxy's home is a worker, a worker's is one
//! of its llama-server's slots. It is bounded in entries (least recently used goes first) and in
//! age (a conversation idle past the TTL is forgotten: its prefix has long been evicted from the
//! backend's cache by other work). Pure: time is an input; imports nothing else of the crate.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Conversations remembered at most: ~80 bytes each, so about 1.3 MB when full.
pub const AFFINITY_ENTRIES: usize = 16_384;

/// A conversation idle this long is forgotten.
pub const AFFINITY_TTL: Duration = Duration::from_secs(30 * 60);

/// The prompt tokens a request body of `bytes` carries, about: a token is some four bytes of
/// text, and the JSON around it weighs alike on every request, so sizes compare fairly. The
/// proxy weighs a prompt's cost with it; a worker, what a slot will cache.
pub fn estimated_prompt_tokens(bytes: usize) -> u32 {
    u32::try_from(bytes / 4).unwrap_or(u32::MAX)
}

/// How a request with an affinity key was placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It went to its home worker.
    Hit,
    /// It had a home but went elsewhere (home saturated, gone, or not serving the model); the
    /// worker it went to is its new home.
    Miss,
    /// Its conversation had no home yet (first turn, or forgotten).
    New,
}

/// Placements counted since the proxy started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct AffinityCounts {
    /// Requests routed to their home worker.
    pub hits: u64,
    /// Requests that had a home but were routed elsewhere.
    pub misses: u64,
    /// Requests whose conversation had no home yet.
    pub new: u64,
    /// Conversations the table remembers now.
    pub entries: u64,
}

#[derive(Debug)]
struct Home<H> {
    worker: H,
    used: Instant,
    /// The conversation's prompt tokens the home holds (its last prompt's size; 0: unknown).
    context: u32,
    /// Its position in [`AffinityTable::recency`].
    stamp: u64,
}

/// Affinity key → home (a worker, or a slot), LRU with a TTL.
#[derive(Debug)]
pub struct AffinityTable<H> {
    homes: HashMap<u64, Home<H>>,
    /// Keys by last use (stamps grow), oldest first: what eviction takes.
    recency: BTreeMap<u64, u64>,
    next_stamp: u64,
    capacity: usize,
    ttl: Duration,
    counts: AffinityCounts,
    /// Conversations whose home each worker is: where new ones are placed (see
    /// [`AffinityTable::homes_of`]).
    per_worker: HashMap<H, usize>,
}

impl<H: Copy + Eq + Hash> Default for AffinityTable<H> {
    fn default() -> Self {
        AffinityTable::new(AFFINITY_ENTRIES, AFFINITY_TTL)
    }
}

impl<H: Copy + Eq + Hash> AffinityTable<H> {
    /// A table of at most `capacity` conversations, each forgotten after `ttl` without use.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        AffinityTable {
            homes: HashMap::new(),
            recency: BTreeMap::new(),
            next_stamp: 0,
            capacity: capacity.max(1),
            ttl,
            counts: AffinityCounts::default(),
            per_worker: HashMap::new(),
        }
    }

    /// The worker that served conversation `key` last, unless that was more than the TTL ago.
    pub fn home(&self, key: u64, now: Instant) -> Option<H> {
        self.homes
            .get(&key)
            .filter(|home| now.saturating_duration_since(home.used) < self.ttl)
            .map(|home| home.worker)
    }

    /// Conversation `key` was just placed on `worker`, which becomes its home; counts and
    /// returns how that placement relates to the previous home.
    pub fn record(&mut self, key: u64, worker: H, now: Instant) -> Outcome {
        let outcome = match self.home(key, now) {
            Some(home) if home == worker => Outcome::Hit,
            Some(_) => Outcome::Miss,
            None => Outcome::New,
        };
        match outcome {
            Outcome::Hit => self.counts.hits += 1,
            Outcome::Miss => self.counts.misses += 1,
            Outcome::New => self.counts.new += 1,
        }
        let previous_use = self.remove(key).map(|old| old.used);
        self.evict(now);
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.recency.insert(stamp, key);
        *self.per_worker.entry(worker).or_default() += 1;
        self.homes.insert(
            key,
            Home {
                worker,
                // A request placed late (it waited in the queue) must not make its home look
                // older than one already recorded.
                used: previous_use.map_or(now, |used| used.max(now)),
                stamp,
                context: 0,
            },
        );
        outcome
    }

    /// The home of conversation `key` now holds `tokens` of its prompt (the last one placed).
    pub fn set_context(&mut self, key: u64, tokens: u32) {
        if let Some(home) = self.homes.get_mut(&key) {
            home.context = tokens;
        }
    }

    /// How many tokens of conversation `key`'s prompt its home holds (0: unknown or none).
    pub fn context(&self, key: u64) -> u32 {
        self.homes.get(&key).map_or(0, |home| home.context)
    }

    /// Drops expired entries from the old end and, if still full, the least recently used.
    fn evict(&mut self, now: Instant) {
        while let Some((&stamp, &key)) = self.recency.first_key_value() {
            let expired = self
                .homes
                .get(&key)
                .is_none_or(|h| now.saturating_duration_since(h.used) >= self.ttl);
            if !expired && self.homes.len() < self.capacity {
                break;
            }
            self.recency.remove(&stamp);
            self.remove(key);
        }
    }

    /// Forgets conversation `key`, keeping the per-worker counts right.
    fn remove(&mut self, key: u64) -> Option<Home<H>> {
        let home = self.homes.remove(&key)?;
        self.recency.remove(&home.stamp);
        if let Some(count) = self.per_worker.get_mut(&home.worker) {
            *count -= 1;
            if *count == 0 {
                self.per_worker.remove(&home.worker);
            }
        }
        Some(home)
    }

    /// How many remembered conversations call `worker` home. A backend keeps a conversation's
    /// prompt in one of its slots, so a worker (or slot) home to more conversations than it has
    /// slots makes them overwrite each other's caches: new conversations go where homes per
    /// slot are fewest.
    pub fn homes_of(&self, worker: H) -> usize {
        self.per_worker.get(&worker).copied().unwrap_or(0)
    }

    /// The fewest prompt tokens a conversation homed on `worker` has there (`None`: no home
    /// there with a known size): what a new conversation placed on a worker whose slots are all
    /// kept for conversations costs the one evicted, which its backend chooses as the one
    /// cheapest to lose.
    pub fn least_context_of(&self, worker: H, now: Instant) -> Option<u32> {
        if self.homes_of(worker) == 0 {
            return None;
        }
        self.homes
            .values()
            .filter(|home| home.worker == worker && home.context > 0)
            .filter(|home| now.saturating_duration_since(home.used) < self.ttl)
            .map(|home| home.context)
            .min()
    }

    /// The counts so far, with the current number of entries.
    pub fn counts(&self) -> AffinityCounts {
        AffinityCounts {
            entries: self.homes.len() as u64,
            ..self.counts
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_is_estimated_at_four_bytes_a_token_and_never_overflows() {
        assert_eq!(estimated_prompt_tokens(0), 0);
        assert_eq!(estimated_prompt_tokens(4_001), 1_000);
        assert_eq!(estimated_prompt_tokens(usize::MAX), u32::MAX);
    }

    #[test]
    fn a_conversation_placed_again_on_its_home_is_a_hit_elsewhere_a_miss_that_moves_it() {
        let mut table = AffinityTable::<u64>::new(8, Duration::from_secs(60));
        let t = Instant::now();
        assert_eq!(table.record(7, 1, t), Outcome::New);
        assert_eq!(table.home(7, t), Some(1));
        assert_eq!(table.record(7, 1, t), Outcome::Hit);
        assert_eq!(table.record(7, 2, t), Outcome::Miss);
        assert_eq!(table.home(7, t), Some(2));
        assert_eq!(table.record(7, 2, t), Outcome::Hit);
        let counts = table.counts();
        assert_eq!((counts.hits, counts.misses, counts.new), (2, 1, 1));
        assert_eq!(counts.entries, 1);
    }

    #[test]
    fn a_home_remembers_how_much_of_its_conversation_it_holds() {
        let mut table = AffinityTable::<u64>::new(8, Duration::from_secs(60));
        let t = Instant::now();
        table.record(7, 1, t);
        assert_eq!(table.context(7), 0, "unknown at first");
        table.set_context(7, 12_000);
        assert_eq!(table.context(7), 12_000);
        table.record(7, 2, t);
        assert_eq!(table.context(7), 0, "a new home holds nothing yet");
        assert_eq!(table.context(99), 0);
    }

    #[test]
    fn the_cheapest_cache_to_lose_on_a_worker_is_its_smallest_known_live_home() {
        let mut table = AffinityTable::<u64>::new(8, Duration::from_secs(60));
        let t = Instant::now();
        assert_eq!(table.least_context_of(1, t), None, "no home there");
        for (key, tokens) in [(7, 12_000), (8, 900), (9, 0)] {
            table.record(key, 1, t);
            table.set_context(key, tokens);
        }
        table.record(10, 2, t);
        table.set_context(10, 50);
        // Size unknown (0) is not "nothing to lose"; another worker's home is not counted.
        assert_eq!(table.least_context_of(1, t), Some(900));
        table.record(8, 1, t + Duration::from_secs(30));
        table.set_context(8, 1_500);
        assert_eq!(table.least_context_of(1, t), Some(1_500));
        // Past the TTL only the conversation used later is still there.
        assert_eq!(
            table.least_context_of(1, t + Duration::from_secs(61)),
            Some(1_500)
        );
        assert_eq!(table.least_context_of(2, t + Duration::from_secs(61)), None);
    }

    #[test]
    fn a_conversation_idle_past_the_ttl_is_forgotten_and_counts_as_new() {
        let mut table = AffinityTable::<u64>::new(8, Duration::from_secs(60));
        let t = Instant::now();
        table.record(1, 1, t);
        assert_eq!(table.home(1, t + Duration::from_secs(59)), Some(1));
        assert_eq!(table.home(1, t + Duration::from_secs(60)), None);
        assert_eq!(
            table.record(1, 2, t + Duration::from_secs(61)),
            Outcome::New
        );
    }

    #[test]
    fn the_table_stays_bounded_and_forgets_the_least_recently_used_first() {
        let mut table = AffinityTable::<u64>::new(3, Duration::from_secs(60));
        let t = Instant::now();
        for key in 0..3 {
            table.record(key, 1, t);
        }
        // Key 0 is used again, so key 1 is now the least recently used.
        table.record(0, 1, t);
        table.record(3, 1, t);
        assert_eq!(table.homes.len(), 3);
        assert_eq!(table.home(1, t), None);
        for key in [0, 2, 3] {
            assert_eq!(table.home(key, t), Some(1), "key {key}");
        }
        for key in 100..10_000 {
            table.record(key, 2, t);
        }
        assert_eq!(table.homes.len(), 3);
        assert_eq!(table.recency.len(), 3);
    }

    #[test]
    fn expired_entries_are_dropped_when_new_ones_arrive() {
        let mut table = AffinityTable::<u64>::new(100, Duration::from_secs(60));
        let t = Instant::now();
        for key in 0..50 {
            table.record(key, 1, t);
        }
        table.record(1000, 1, t + Duration::from_secs(120));
        assert_eq!(table.homes.len(), 1);
        assert_eq!(table.recency.len(), 1);
    }

    #[test]
    fn each_worker_counts_the_conversations_it_is_home_to_through_moves_and_evictions() {
        let mut table = AffinityTable::<u64>::new(3, Duration::from_secs(60));
        let t = Instant::now();
        table.record(1, 10, t);
        table.record(2, 10, t);
        table.record(3, 20, t);
        assert_eq!((table.homes_of(10), table.homes_of(20)), (2, 1));
        table.record(2, 20, t);
        assert_eq!((table.homes_of(10), table.homes_of(20)), (1, 2), "a move");
        table.record(4, 30, t);
        assert_eq!(table.homes_of(10), 0, "the least recently used made room");
        table.record(5, 30, t + Duration::from_secs(60));
        assert_eq!(
            (table.homes_of(20), table.homes_of(30)),
            (0, 1),
            "expired ones are dropped, 4 with them"
        );
    }
}
