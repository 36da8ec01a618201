//! llama-server's host-memory prompt cache (`--cache-ram`, on by default since llama.cpp PR
//! 16391), as the fleet bench models it when `FLEET_RAM_CACHE=1`.
//!
//! What the model follows, measured on the realstack's llama-server (`-np 2`, `/completion`
//! pinned with `id_slot`; prompts of a shared 300-token system prompt and 1,200 tokens of
//! their own, as the bench's chats):
//! - A request that lands in a slot whose cached prompt it would mostly discard (it keeps less
//!   than half of it: llama-server's `f_keep`) has that prompt saved to host memory first.
//!   Conversation A's next turn, in the slot B had just displaced it from, evaluated 100 of
//!   1,600 tokens; in another slot that held a third conversation, 50 of 1,650.
//! - A slot whose cached prompt is mostly kept is not saved and nothing is restored into it.
//!   B sharing 800 of A's 1,500 tokens kept the slot, and A's next turn there evaluated its
//!   700-token tail again; sharing 600 (40%), A was saved and restored (100 tokens evaluated).
//!   So the agent sessions' 12,000-token shared system prompt keeps every slot, and a turn that
//!   lands beside another conversation's history evaluates its own tail again.
//! - An empty slot restores nothing (a conversation sent to a slot never used evaluated all of
//!   its 1,600 tokens though its prompt had been saved).
//! - The cache holds at most a context's worth of tokens (llama-server's default limit; the
//!   8 GiB one is larger for the models homes run), oldest saved dropped first. Restoring is a
//!   copy from host memory and costs no time here.

use std::collections::VecDeque;

/// The tokens a box's host-memory cache holds at most: llama-server's `--ctx-size` for four
/// slots of 32,768 (its default limit is the context's size).
pub const RAM_CACHE_TOKENS: u32 = 4 * 32_768;

/// One box's host-memory prompt cache.
#[derive(Debug)]
pub struct RamCache {
    /// Saved prompts, oldest first: a conversation and its tokens.
    saved: VecDeque<(u64, u32)>,
    limit: u32,
}

impl RamCache {
    /// A cache of `limit` tokens.
    pub fn new(limit: u32) -> RamCache {
        RamCache {
            saved: VecDeque::new(),
            limit,
        }
    }

    /// A request of `conversation` with `prompt` tokens lands in a slot that caches `held`
    /// tokens of `holder`'s conversation, of which it reuses `reused`: the tokens it reuses
    /// after llama-server saved the slot's prompt and restored the request's own, if it does.
    pub fn swap(
        &mut self,
        holder: Option<u64>,
        held: u32,
        reused: u32,
        conversation: u64,
        prompt: u32,
    ) -> u32 {
        // `f_keep`: a slot that keeps at least half of what it caches stays as it is (an
        // empty slot too: it restores nothing).
        if u64::from(reused) * 2 >= u64::from(held) {
            return reused;
        }
        if let Some(holder) = holder {
            self.save(holder, held);
        }
        match self.saved.iter().position(|(c, _)| *c == conversation) {
            Some(i) => {
                let (_, tokens) = self.saved.remove(i).expect("found");
                reused.max(tokens.min(prompt))
            }
            None => reused,
        }
    }

    fn save(&mut self, conversation: u64, tokens: u32) {
        self.saved.retain(|(c, _)| *c != conversation);
        self.saved.push_back((conversation, tokens));
        let mut total: u64 = self.saved.iter().map(|(_, t)| u64::from(*t)).sum();
        while total > u64::from(self.limit) {
            let Some((_, dropped)) = self.saved.pop_front() else {
                break;
            };
            total -= u64::from(dropped);
        }
    }
}

/// Replays what the realstack's server did (the module's cases) through [`RamCache`] and panics
/// where the model gives another answer. Benches run no `#[test]`s, so the bench calls this
/// before every run: a change to the model that breaks a measured case stops the bench at once
/// instead of moving its numbers quietly.
pub fn check_against_the_measured_server() {
    let cases: [(&str, u32, u32); 3] = [
        // (what, tokens A's displacer shares with A, A's next turn evaluates)
        ("a displacer sharing 300 of A's 1,500 tokens", 300, 100),
        ("a displacer sharing 600 of A's 1,500 tokens", 600, 100),
        (
            "a displacer sharing 800 of A's 1,500 tokens (the slot is kept)",
            800,
            800,
        ),
    ];
    for (what, shared, evaluated) in cases {
        let mut cache = RamCache::new(RAM_CACHE_TOKENS);
        // A (conversation 1) holds the slot; B (2) lands there, then A's next turn of 1,600.
        let b_reused = cache.swap(Some(1), 1_500, shared, 2, 1_500);
        assert_eq!(b_reused, shared, "{what}: B reuses the shared prefix only");
        let a_reused = cache.swap(Some(2), 1_500, shared, 1, 1_600);
        assert_eq!(
            1_600 - a_reused,
            evaluated,
            "{what}: A's next turn evaluates {evaluated} tokens on the real server"
        );
    }
    // A slot never used restores nothing, though the conversation's prompt was saved.
    let mut cache = RamCache::new(RAM_CACHE_TOKENS);
    cache.swap(Some(1), 1_500, 300, 2, 1_500);
    assert_eq!(
        cache.swap(None, 0, 0, 1, 1_600),
        0,
        "an empty slot evaluates the whole prompt on the real server"
    );
}
