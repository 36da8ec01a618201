//! The fleets and workloads of the fleet bench, made from a seed.

use super::ram::RAM_CACHE_TOKENS;
use super::sim::{BoxSpec, Req, Session, Step, Unloads, GPU_DECODE_CROWDING};

/// A small deterministic generator (xorshift64*): the same seed makes the same workload.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[low, high)`.
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An integer in `[low, high]`.
    pub fn between(&mut self, low: u32, high: u32) -> u32 {
        low + (self.next() % u64::from(high - low + 1)) as u32
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.uniform(0.0, 1.0) < p
    }
}

/// The fleets: equal boxes; a fast box with one five times slower; and those two with a third
/// box as fast as the first, asleep when the workload starts (it wakes in 8 s, as measured the
/// last time it was woken; only cost routing weighs waking it while the others serve).
///
/// `ram_cache`: each box's llama-server keeps displaced prompts in host memory ([`super::ram::RamCache`]).
pub fn fleets(ram_cache: bool, unloads: Option<Unloads>) -> Vec<(&'static str, Vec<BoxSpec>)> {
    let ram_cache = ram_cache.then_some(RAM_CACHE_TOKENS);
    let even = |name| BoxSpec {
        name,
        prompt_tps: 2000.0,
        generation_tps: 40.0,
        decode_crowding: GPU_DECODE_CROWDING,
        slots: 4,
        asleep: None,
        ram_cache,
        unloads,
    };
    let fast = BoxSpec {
        name: "fast",
        prompt_tps: 3000.0,
        generation_tps: 60.0,
        decode_crowding: GPU_DECODE_CROWDING,
        slots: 4,
        asleep: None,
        ram_cache,
        unloads,
    };
    let slow = BoxSpec {
        name: "slow",
        prompt_tps: 600.0,
        generation_tps: 12.0,
        decode_crowding: GPU_DECODE_CROWDING,
        slots: 4,
        asleep: None,
        ram_cache,
        unloads,
    };
    let sleeper = BoxSpec {
        name: "asleep",
        asleep: Some(8.0),
        ..fast
    };
    vec![
        ("uniform (2 equal boxes)", vec![even("a"), even("b")]),
        ("fast + 5x slower", vec![fast, slow]),
        ("fast + 5x slower + fast asleep", vec![fast, slow, sleeper]),
    ]
}

/// Conversation keys of distinct sessions and kinds never collide.
fn key(kind: u64, session: usize, part: u64) -> u64 {
    (kind << 48) ^ ((session as u64) << 16) ^ part
}

/// Agent sessions, as Claude Code sends them: a ~12k-token system prompt and tools shared by
/// every session, turns that each add a few hundred tokens (the answer and the next message or
/// tool result), and side requests (titles, summaries) with the same session, keyed by their
/// own prompt.
pub fn agent_sessions(rng: &mut Rng, sessions: usize, turns: usize) -> Vec<Session> {
    const SYSTEM: u32 = 12_000;
    (0..sessions)
        .map(|s| {
            let mut prompt = SYSTEM + rng.between(200, 600);
            let steps = (0..turns)
                .map(|turn| {
                    let output = rng.between(80, 300);
                    let main = Req {
                        prompt,
                        output,
                        conversation: key(1, s, 0),
                        prefix: 1,
                        prefix_tokens: SYSTEM,
                        side: false,
                        claude_code: true,
                    };
                    let side = if rng.chance(0.5) {
                        vec![Req {
                            prompt: rng.between(800, 1600),
                            output: rng.between(15, 40),
                            conversation: key(2, s, turn as u64),
                            prefix: 2,
                            prefix_tokens: 600,
                            side: true,
                            claude_code: true,
                        }]
                    } else {
                        Vec::new()
                    };
                    prompt += output + rng.between(150, 900);
                    Step {
                        main,
                        side,
                        think: rng.uniform(1.0, 6.0),
                    }
                })
                .collect();
            Session {
                start: rng.uniform(0.0, 20.0),
                steps,
            }
        })
        .collect()
}

/// One conversation's shape: `turns` turns from a first prompt of `prompt` tokens, each answer
/// `output` tokens (a range) long, each next prompt the last one plus the answer plus `grow`.
struct Shape {
    turns: u32,
    prompt: u32,
    conversation: u64,
    prefix: u64,
    prefix_tokens: u32,
    output: (u32, u32),
    grow: (u32, u32),
    think: (f64, f64),
}

fn turns(rng: &mut Rng, shape: Shape) -> Vec<Step> {
    let mut prompt = shape.prompt;
    (0..shape.turns)
        .map(|_| {
            let output = rng.between(shape.output.0, shape.output.1);
            let main = Req {
                prompt,
                output,
                conversation: shape.conversation,
                prefix: shape.prefix,
                prefix_tokens: shape.prefix_tokens,
                side: false,
                claude_code: false,
            };
            prompt += output + rng.between(shape.grow.0, shape.grow.1);
            Step {
                main,
                side: Vec::new(),
                think: rng.uniform(shape.think.0, shape.think.1),
            }
        })
        .collect()
}

/// Chat: many users, short prompts, a few turns each, arriving over a couple of minutes.
pub fn chat(rng: &mut Rng, users: usize) -> Vec<Session> {
    const SYSTEM: u32 = 300;
    (0..users)
        .map(|u| {
            // Drawn in this order: a seed's workload stays the one BENCHMARKS.md reports.
            let prompt = SYSTEM + rng.between(100, 900);
            let shape = Shape {
                turns: rng.between(1, 4),
                prompt,
                conversation: key(3, u, 0),
                prefix: 3,
                prefix_tokens: SYSTEM,
                output: (80, 400),
                grow: (50, 500),
                think: (4.0, 20.0),
            };
            let steps = turns(rng, shape);
            Session {
                start: rng.uniform(0.0, 120.0),
                steps,
            }
        })
        .collect()
}

/// Chat with long documents among it: some sessions paste 15–28k tokens and ask about them.
pub fn mixed(rng: &mut Rng, users: usize, documents: usize) -> Vec<Session> {
    let mut sessions = chat(rng, users);
    sessions.extend((0..documents).map(|d| {
        let prompt = rng.between(15_000, 28_000);
        let shape = Shape {
            turns: rng.between(1, 2),
            prompt,
            conversation: key(4, d, 0),
            prefix: 100 + d as u64,
            prefix_tokens: 0,
            output: (200, 500),
            grow: (50, 300),
            think: (5.0, 15.0),
        };
        let steps = turns(rng, shape);
        Session {
            start: rng.uniform(0.0, 120.0),
            steps,
        }
    }));
    sessions
}
