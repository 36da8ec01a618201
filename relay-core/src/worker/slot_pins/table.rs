//! One llama-server's slots: the conversation each is kept for, and how many of this worker's
//! requests each holds now. Pure: time is an input.
//!
//! llama-server gives a request without `id_slot` the free slot whose cached prompt shares the
//! most with it (above `--slot-prompt-similarity`, 10% by default), else the least recently
//! used one. Conversations that share a long system prompt all look alike to that rule, so one
//! conversation's turn takes the slot that holds another's history, and that conversation's
//! next turn evaluates its history again. Keeping each conversation in a slot of its own, and
//! new conversations where the fewest are kept, stops that. Where as many are kept in two free
//! slots, a new conversation takes the one whose cached prompt is cheaper to lose: a chat's
//! thousand tokens rather than a pasted document's twenty thousand, which its next question
//! would otherwise evaluate again.
//!
//! llama-server fills each batch from its slots in order, every waiting prompt token of one
//! slot before any of the next's, so a prompt waits for the prompts in the slots before it.
//! Side requests (titles, summaries: a thousand tokens) take the lowest free slot, and new
//! conversations leave slot 0 to them while another slot is as good, so a title sent beside a
//! 12,000-token first turn is evaluated first and delays the turn by its own thousand tokens,
//! rather than waiting for all twelve thousand. Conversations still fill the other slots
//! upwards, so first turns sent one after another are evaluated in the order they came. (On
//! the fleet bench, a fast box beside one five times slower at a home's load: TTFT p90 0.80 →
//! 0.71 s; filling conversations downwards instead made the first turns of a burst wait for the
//! later ones, and p99 rose 11 → 19 s; BENCHMARKS.md, 2026-11-29, "side requests first".)

use std::time::{Duration, Instant};

use crate::affinity::AffinityTable;

/// Conversations remembered per backend at most (each ~80 bytes).
pub const PINNED_CONVERSATIONS: usize = 4_096;

/// What a slot's cached prompt is worth halves every this long it stays unused: a document
/// asked about a minute ago is likely asked about again, one left for half an hour is not.
const WORTH_HALF_LIFE: Duration = Duration::from_secs(120);

/// Cached prompts within this many tokens of each other are worth the same (the sizes are
/// estimates), and the slot idle longest is taken among them.
const WORTH_STEP: f64 = 4_096.0;

/// A llama-server's slots as this worker uses them.
#[derive(Debug)]
pub struct Slots {
    /// Conversation → the slot it is kept in (LRU, TTL).
    pins: AffinityTable<u32>,
    /// This worker's requests in flight in each slot.
    busy: Vec<u32>,
    /// Of those, the side requests.
    side_busy: Vec<u32>,
    /// When each slot was last given a request (a counter): ties go to the one idle longest.
    last_given: Vec<u64>,
    /// The prompt tokens (an estimate) of the last request given each slot: what it caches.
    held: Vec<u32>,
    /// When each slot's last request ended; `None` while one runs, or before any.
    freed: Vec<Option<Instant>>,
    given: u64,
}

impl Slots {
    /// A server with `count` slots (at least one).
    pub fn new(count: u32) -> Self {
        let count = count.max(1) as usize;
        Slots {
            pins: AffinityTable::new(PINNED_CONVERSATIONS, crate::affinity::AFFINITY_TTL),
            busy: vec![0; count],
            side_busy: vec![0; count],
            last_given: vec![0; count],
            held: vec![0; count],
            freed: vec![None; count],
            given: 0,
        }
    }

    /// How many slots the server has.
    pub fn count(&self) -> u32 {
        self.busy.len() as u32
    }

    /// The slot for conversation `key`'s next request, a prompt of about `tokens`, counted busy
    /// until [`Slots::release`].
    ///
    /// Its own slot while none of this worker's requests is in it. When one is (the same
    /// conversation asking twice at once, or another conversation kept in the same slot), a
    /// free slot instead, which becomes the conversation's: evaluating the prompt again costs
    /// a bounded amount, while waiting for the slot may mean waiting for a long generation
    /// (the proxy's affinity yields the same way). Held by a title only, the worker waits for
    /// it first ([`Slots::home_held_by_side`]). A new conversation goes to the free slot
    /// kept for the fewest conversations, then the one whose cached prompt is worth least
    /// ([`Slots::worth`]), then the one idle longest, then any but slot 0 (side requests'; see
    /// the module), then the lowest.
    pub fn take(&mut self, key: u64, tokens: u32, now: Instant) -> u32 {
        let count = self.count();
        let home = self.pins.home(key, now).filter(|&slot| slot < count);
        let slot = match home {
            Some(home) if self.busy[home as usize] == 0 => home,
            _ => {
                let free = (0..count)
                    .filter(|&slot| self.busy[slot as usize] == 0)
                    .min_by_key(|&slot| {
                        (
                            self.pins.homes_of(slot),
                            self.worth(slot, now),
                            self.last_given[slot as usize],
                            slot == 0,
                        )
                    });
                // Every slot busy: the conversation's own slot if it has one (its cache is
                // there), else the least busy.
                free.or(home).unwrap_or_else(|| self.least_busy())
            }
        };
        self.pins.record(key, slot, now);
        self.give(slot, tokens);
        slot
    }

    /// What losing `slot`'s cached prompt would cost, in steps of [`WORTH_STEP`] tokens: the
    /// tokens its last request left there, halved for every [`WORTH_HALF_LIFE`] it has been
    /// unused since. On the fleet bench's equal boxes with long documents among chats this
    /// kept documents' second questions cached, and the 90th percentile fell 18.6 → 16.8 s
    /// (BENCHMARKS.md, 2026-11-28).
    fn worth(&self, slot: u32, now: Instant) -> u64 {
        let slot = slot as usize;
        let idle =
            self.freed[slot].map_or(Duration::ZERO, |freed| now.saturating_duration_since(freed));
        let kept = 0.5f64.powf(idle.as_secs_f64() / WORTH_HALF_LIFE.as_secs_f64());
        (f64::from(self.held[slot]) * kept / WORTH_STEP) as u64
    }

    /// The slot for a side request of a conversation (Claude Code's titles and summaries:
    /// one-off prompts, each keyed by its own), counted busy until [`Slots::release`]. The free
    /// slot kept for the fewest conversations, then the lowest: llama-server evaluates it
    /// before the conversations' prompts in the slots above (see the module), and it is the
    /// same slot for title after title while free, so their shared leading prompt stays cached
    /// there. It becomes nobody's home: pinned like a conversation, each title would count as
    /// one, and the slot that takes them would soon look the most crowded, so the next title
    /// would take a conversation's slot instead. `tokens`: its prompt's, about.
    pub fn take_side(&mut self, tokens: u32) -> u32 {
        let count = self.count();
        let slot = (0..count)
            .filter(|&slot| self.busy[slot as usize] == 0)
            .min_by_key(|&slot| (self.pins.homes_of(slot), slot))
            .unwrap_or_else(|| self.least_busy());
        self.side_busy[slot as usize] += 1;
        self.give(slot, tokens);
        slot
    }

    /// Whether conversation `key`'s next turn, a prompt of about `tokens`, should wait for its
    /// own slot rather than take another: only side requests are in it (a title took it while
    /// the conversation was between turns), none of them larger than the turn.
    ///
    /// Moving costs the conversation its cached history, and the conversation whose slot it
    /// moves to loses its own; a title's answer is a few dozen tokens. With a system prompt
    /// shared by all conversations the move is worse than it looks: llama-server keeps the
    /// slot moved into for the shared prefix and skips its host-memory prompt cache both ways,
    /// so neither conversation's history comes back from there. The wait is the worker's own
    /// (`SlotPins::pin`): a llama-server asked for a busy slot defers the request, but first
    /// runs its prompt-cache update on that busy slot.
    pub fn home_held_by_side(&self, key: u64, tokens: u32, now: Instant) -> bool {
        let Some(home) = self.pins.home(key, now).filter(|&slot| slot < self.count()) else {
            return false;
        };
        let home = home as usize;
        self.busy[home] > 0 && self.side_busy[home] == self.busy[home] && self.held[home] <= tokens
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

    fn give(&mut self, slot: u32, tokens: u32) {
        let slot = slot as usize;
        self.busy[slot] += 1;
        self.given += 1;
        self.last_given[slot] = self.given;
        self.held[slot] = tokens;
        self.freed[slot] = None;
    }

    /// A request given `slot` (a side request's, `side`) ended at `now`.
    pub fn release(&mut self, slot: u32, side: bool, now: Instant) {
        if side {
            if let Some(busy) = self.side_busy.get_mut(slot as usize) {
                *busy = busy.saturating_sub(1);
            }
        }
        if let Some(busy) = self.busy.get_mut(slot as usize) {
            *busy = busy.saturating_sub(1);
            if *busy == 0 {
                self.freed[slot as usize] = Some(now);
            }
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
            let slot = slots.take(conversation, 1_000, t);
            slots.release(slot, false, t);
            kept.push(slot);
        }
        let mut distinct = kept.clone();
        distinct.sort_unstable();
        assert_eq!(distinct, [0, 1, 2], "three conversations, three slots");
        for turn in 1..5u64 {
            for (conversation, &slot) in [10, 20, 30].into_iter().zip(&kept) {
                let now = t + Duration::from_secs(turn);
                let taken = slots.take(conversation, 1_000, now);
                assert_eq!(taken, slot, "conversation {conversation} turn {turn}");
                slots.release(taken, false, now);
            }
        }
    }

    #[test]
    fn a_conversation_whose_slot_is_busy_moves_to_a_free_one_and_stays_there() {
        let mut slots = Slots::new(2);
        let t = Instant::now();
        let first = slots.take(1, 1_000, t);
        // The same conversation asks again while its first request still runs.
        let second = slots.take(1, 1_000, t);
        assert_ne!(first, second);
        assert_eq!((slots.busy(first), slots.busy(second)), (1, 1));
        slots.release(first, false, t);
        slots.release(second, false, t);
        assert_eq!(
            slots.take(1, 1_000, t),
            second,
            "the slot it moved to is its own now"
        );
    }

    #[test]
    fn new_conversations_go_where_the_fewest_are_kept_and_all_busy_means_the_least_busy() {
        let mut slots = Slots::new(2);
        let t = Instant::now();
        for conversation in 0..4 {
            let slot = slots.take(conversation, 1_000, t);
            slots.release(slot, false, t);
        }
        let kept: Vec<u32> = (0..2)
            .map(|slot| slots.pins.homes_of(slot) as u32)
            .collect();
        assert_eq!(kept, [2, 2], "four conversations share two slots evenly");
        let a = slots.take(100, 1_000, t);
        let b = slots.take(101, 1_000, t);
        assert_ne!(a, b);
        let c = slots.take(102, 1_000, t);
        assert_eq!(slots.busy(c), 2, "every slot busy: it still gets one");
        assert_eq!(slots.busy(a) + slots.busy(b), 3);
        slots.release(a, false, t);
        slots.release(a, false, t);
        slots.release(a, false, t);
        assert_eq!(slots.busy(a), 0, "releases never go below zero");
    }

    #[test]
    fn side_requests_take_a_slot_kept_for_no_conversation_and_are_nobodys_home() {
        let mut slots = Slots::new(3);
        let t = Instant::now();
        let (a, b) = (slots.take(10, 1_000, t), slots.take(20, 1_000, t));
        slots.release(a, false, t);
        slots.release(b, false, t);
        let spare = 3 - a - b;
        for _ in 0..5 {
            let side = slots.take_side(1_000);
            assert_eq!(side, spare, "the slot kept for no conversation, every time");
            slots.release(side, true, t);
        }
        assert_eq!(slots.pins.homes_of(spare), 0, "no title is pinned");
        // With that slot busy, a title takes a conversation's after all (the lowest) rather
        // than wait.
        let busy = slots.take_side(1_000);
        let next = slots.take_side(1_000);
        assert_eq!((busy, next), (spare, a.min(b)));
        slots.release(busy, true, t);
        slots.release(next, true, t);
        assert_eq!(
            slots.take(10, 1_000, t),
            a,
            "the conversation keeps its slot"
        );
        slots.release(a, false, t);
        assert_eq!(
            slots.take(30, 1_000, t),
            spare,
            "a new one finds the slot kept for none"
        );
    }

    #[test]
    fn a_turn_waits_for_its_own_slot_only_while_a_smaller_side_request_alone_holds_it() {
        let mut slots = Slots::new(2);
        let t = Instant::now();
        let (b, a) = (slots.take(20, 3_000, t), slots.take(10, 3_000, t));
        slots.release(a, false, t);
        slots.release(b, false, t);
        assert!(!slots.home_held_by_side(10, 3_000, t), "its slot is free");
        // A title takes the lowest slot: the second conversation's.
        let title = slots.take_side(800);
        assert_eq!(title, a);
        assert!(
            slots.home_held_by_side(10, 3_000, t),
            "a title alone holds it"
        );
        assert!(
            !slots.home_held_by_side(20, 3_000, t),
            "the other's slot is free"
        );
        assert!(
            !slots.home_held_by_side(10, 500, t),
            "a side request larger than the turn is not waited for"
        );
        assert!(
            !slots.home_held_by_side(30, 3_000, t),
            "no home: nothing to wait for"
        );
        // With every slot busy a new conversation joins the title in that slot: a turn in it
        // may run for minutes, and is not waited for.
        let other = slots.take(20, 3_000, t);
        assert_eq!(other, b);
        let newcomer = slots.take(30, 3_000, t);
        assert_eq!(newcomer, a, "the least busy, given longest ago");
        assert!(!slots.home_held_by_side(10, 3_000, t));
        slots.release(newcomer, false, t);
        assert!(
            slots.home_held_by_side(10, 3_000, t),
            "the title alone again"
        );
        slots.release(title, true, t);
        assert!(!slots.home_held_by_side(10, 3_000, t), "free again");
        assert_eq!(slots.take(10, 3_000, t), a, "and its own");
    }

    #[test]
    fn titles_take_the_lowest_slot_and_conversations_the_others_so_llama_server_evaluates_titles_first(
    ) {
        let mut slots = Slots::new(4);
        let t = Instant::now();
        // A session's first turn and its title, sent together.
        let turn = slots.take(1, 12_000, t);
        let title = slots.take_side(1_000);
        assert_eq!(
            (turn, title),
            (1, 0),
            "the title is evaluated before the turn"
        );
        slots.release(title, true, t);
        let second_turn = slots.take(2, 12_000, t);
        assert_eq!(
            second_turn, 2,
            "first turns fill the slots upwards, evaluated in the order they came"
        );
        for _ in 0..2 {
            assert_eq!(
                slots.take_side(900),
                0,
                "title after title, the lowest slot"
            );
            slots.release(0, true, t);
        }
        assert_eq!(
            slots.take_side(900),
            0,
            "the title's slot, though slot 3 has been idle longer"
        );
        assert_eq!(
            slots.take_side(900),
            3,
            "with it busy, the next free slot kept for none"
        );
        let mut fresh = Slots::new(3);
        let taken: Vec<u32> = (0..3).map(|c| fresh.take(c, 12_000, t)).collect();
        assert_eq!(
            taken,
            [1, 2, 0],
            "conversations take slot 0 last while the others are as good"
        );
    }

    #[test]
    fn a_new_conversation_takes_the_slot_whose_cached_prompt_is_cheapest_to_lose() {
        let t = Instant::now();
        let later = |secs| t + Duration::from_secs(secs);
        // A pasted document in one slot, a short chat in the other, both asked before the chat.
        let document_and_chat = || {
            let mut slots = Slots::new(2);
            let document = slots.take(1, 20_000, t);
            let chat = slots.take(2, 900, t);
            slots.release(document, false, t);
            slots.release(chat, false, later(5));
            (slots, document, chat)
        };
        let (mut slots, document, chat) = document_and_chat();
        assert_eq!(
            slots.take(3, 900, later(10)),
            chat,
            "the chat's slot, though the document's has been idle longer"
        );
        assert_eq!(
            slots.take(1, 21_000, later(20)),
            document,
            "the document's next question finds it cached"
        );
        // Unused for half an hour, the document is worth no more than a chat: the slot idle
        // longest goes first again.
        let (mut slots, document, _) = document_and_chat();
        assert_eq!(slots.worth(document, later(1_800)), 0);
        assert_eq!(slots.take(3, 900, later(1_800)), document);
    }

    #[test]
    fn the_pins_stay_bounded_however_many_conversations_come() {
        let mut slots = Slots::new(4);
        let t = Instant::now();
        for conversation in 0..(PINNED_CONVERSATIONS as u64 * 3) {
            let slot = slots.take(conversation, 1_000, t);
            slots.release(slot, false, t);
        }
        assert_eq!(
            slots.pins.counts().entries,
            PINNED_CONVERSATIONS as u64,
            "least recently used forgotten"
        );
        assert_eq!(Slots::new(0).count(), 1, "a server has at least one slot");
    }
}
