//! One llama-server's slots: the conversation each is kept for, and how many of this worker's
//! requests each holds now. Pure: time is an input.
//!
//! llama-server gives a request without `id_slot` the free slot whose cached prompt shares the
//! most with it (above `--slot-prompt-similarity`, 10% by default), else the least recently
//! used one. Conversations that share a long system prompt all look alike to that rule, so one
//! conversation's turn takes the slot that holds another's history, and that conversation's
//! next turn evaluates its history again. Keeping each conversation in a slot of its own, and
//! new conversations where the fewest are kept, stops that.

use std::time::Instant;

use crate::affinity::AffinityTable;

/// Conversations remembered per backend at most (each ~80 bytes).
pub const PINNED_CONVERSATIONS: usize = 4_096;

/// A llama-server's slots as this worker uses them.
#[derive(Debug)]
pub struct Slots {
    /// Conversation → the slot it is kept in (LRU, TTL).
    pins: AffinityTable<u32>,
    /// This worker's requests in flight in each slot.
    busy: Vec<u32>,
    /// When each slot was last given a request (a counter): ties go to the one idle longest.
    last_given: Vec<u64>,
    given: u64,
    /// The slot the last side request took.
    last_side: Option<u32>,
}

impl Slots {
    /// A server with `count` slots (at least one).
    pub fn new(count: u32) -> Self {
        let count = count.max(1) as usize;
        Slots {
            pins: AffinityTable::new(PINNED_CONVERSATIONS, crate::affinity::AFFINITY_TTL),
            busy: vec![0; count],
            last_given: vec![0; count],
            given: 0,
            last_side: None,
        }
    }

    /// How many slots the server has.
    pub fn count(&self) -> u32 {
        self.busy.len() as u32
    }

    /// The slot for conversation `key`'s next request, counted busy until [`Slots::release`].
    ///
    /// Its own slot while none of this worker's requests is in it. When one is (the same
    /// conversation asking twice at once, or another conversation kept in the same slot), a
    /// free slot instead, which becomes the conversation's: evaluating the prompt again costs
    /// a bounded amount, while waiting for the slot may mean waiting for a long generation
    /// (the proxy's affinity yields the same way). A new conversation goes to the free slot
    /// kept for the fewest conversations, then the one idle longest.
    pub fn take(&mut self, key: u64, now: Instant) -> u32 {
        let count = self.count();
        let home = self.pins.home(key, now).filter(|&slot| slot < count);
        let slot = match home {
            Some(home) if self.busy[home as usize] == 0 => home,
            _ => {
                let free = (0..count)
                    .filter(|&slot| self.busy[slot as usize] == 0)
                    .min_by_key(|&slot| (self.pins.homes_of(slot), self.last_given[slot as usize]));
                // Every slot busy: the conversation's own slot if it has one (its cache is
                // there), else the least busy.
                free.or(home).unwrap_or_else(|| self.least_busy())
            }
        };
        self.pins.record(key, slot, now);
        self.give(slot);
        slot
    }

    /// The slot for a side request of a conversation (Claude Code's titles and summaries:
    /// one-off prompts, each keyed by its own), counted busy until [`Slots::release`]. The free
    /// slot kept for the fewest conversations, then the one the last side request took (the
    /// side requests' shared leading prompt may still be there), then the one idle longest.
    /// It becomes nobody's home: pinned like a conversation, each title would count as one, and
    /// the slot that takes them would soon look the most crowded, so the next title would take
    /// a conversation's slot instead.
    pub fn take_side(&mut self) -> u32 {
        let count = self.count();
        let slot = (0..count)
            .filter(|&slot| self.busy[slot as usize] == 0)
            .min_by_key(|&slot| {
                (
                    self.pins.homes_of(slot),
                    self.last_side != Some(slot),
                    self.last_given[slot as usize],
                )
            })
            .unwrap_or_else(|| self.least_busy());
        self.last_side = Some(slot);
        self.give(slot);
        slot
    }

    /// With every slot busy: the least busy, kept for the fewest conversations, idle longest.
    fn least_busy(&self) -> u32 {
        (0..self.count())
            .min_by_key(|&slot| {
                (
                    self.busy[slot as usize],
                    self.pins.homes_of(slot),
                    self.last_given[slot as usize],
                )
            })
            .unwrap_or(0)
    }

    fn give(&mut self, slot: u32) {
        self.busy[slot as usize] += 1;
        self.given += 1;
        self.last_given[slot as usize] = self.given;
    }

    /// A request given `slot` ended.
    pub fn release(&mut self, slot: u32) {
        if let Some(busy) = self.busy.get_mut(slot as usize) {
            *busy = busy.saturating_sub(1);
        }
    }

    /// Requests in flight in `slot` (for tests and logs).
    pub fn busy(&self, slot: u32) -> u32 {
        self.busy.get(slot as usize).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_conversation_keeps_its_own_slot_turn_after_turn() {
        let mut slots = Slots::new(3);
        let t = Instant::now();
        let mut kept = Vec::new();
        for conversation in [10, 20, 30] {
            let slot = slots.take(conversation, t);
            slots.release(slot);
            kept.push(slot);
        }
        kept.sort_unstable();
        assert_eq!(kept, [0, 1, 2], "three conversations, three slots");
        for turn in 1..5u64 {
            for (conversation, slot) in [10, 20, 30].into_iter().zip(0..) {
                let now = t + Duration::from_secs(turn);
                let taken = slots.take(conversation, now);
                assert_eq!(taken, slot, "conversation {conversation} turn {turn}");
                slots.release(taken);
            }
        }
    }

    #[test]
    fn a_conversation_whose_slot_is_busy_moves_to_a_free_one_and_stays_there() {
        let mut slots = Slots::new(2);
        let t = Instant::now();
        let first = slots.take(1, t);
        // The same conversation asks again while its first request still runs.
        let second = slots.take(1, t);
        assert_ne!(first, second);
        assert_eq!((slots.busy(first), slots.busy(second)), (1, 1));
        slots.release(first);
        slots.release(second);
        assert_eq!(
            slots.take(1, t),
            second,
            "the slot it moved to is its own now"
        );
    }

    #[test]
    fn new_conversations_go_where_the_fewest_are_kept_and_all_busy_means_the_least_busy() {
        let mut slots = Slots::new(2);
        let t = Instant::now();
        for conversation in 0..4 {
            let slot = slots.take(conversation, t);
            slots.release(slot);
        }
        let kept: Vec<u32> = (0..2)
            .map(|slot| slots.pins.homes_of(slot) as u32)
            .collect();
        assert_eq!(kept, [2, 2], "four conversations share two slots evenly");
        let a = slots.take(100, t);
        let b = slots.take(101, t);
        assert_ne!(a, b);
        let c = slots.take(102, t);
        assert_eq!(slots.busy(c), 2, "every slot busy: it still gets one");
        assert_eq!(slots.busy(a) + slots.busy(b), 3);
        slots.release(a);
        slots.release(a);
        slots.release(a);
        assert_eq!(slots.busy(a), 0, "releases never go below zero");
    }

    #[test]
    fn side_requests_take_a_slot_kept_for_no_conversation_and_are_nobodys_home() {
        let mut slots = Slots::new(3);
        let t = Instant::now();
        let (a, b) = (slots.take(10, t), slots.take(20, t));
        slots.release(a);
        slots.release(b);
        let spare = 3 - a - b;
        for _ in 0..5 {
            let side = slots.take_side();
            assert_eq!(side, spare, "the slot kept for no conversation, every time");
            slots.release(side);
        }
        assert_eq!(slots.pins.homes_of(spare), 0, "no title is pinned");
        // With that slot busy, a title takes a conversation's after all (the one idle longest)
        // rather than wait.
        let busy = slots.take_side();
        let next = slots.take_side();
        assert_eq!((busy, next), (spare, a));
        slots.release(busy);
        slots.release(next);
        assert_eq!(slots.take(10, t), a, "the conversation keeps its slot");
        assert_eq!(
            slots.take(30, t),
            spare,
            "a new one finds the slot kept for none"
        );
    }

    #[test]
    fn the_pins_stay_bounded_however_many_conversations_come() {
        let mut slots = Slots::new(4);
        let t = Instant::now();
        for conversation in 0..(PINNED_CONVERSATIONS as u64 * 3) {
            let slot = slots.take(conversation, t);
            slots.release(slot);
        }
        assert_eq!(
            slots.pins.counts().entries,
            PINNED_CONVERSATIONS as u64,
            "least recently used forgotten"
        );
        assert_eq!(Slots::new(0).count(), 1, "a server has at least one slot");
    }
}
