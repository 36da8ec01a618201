//! Queue probes: a central queue in place of the proxy's scheduler, handing waiting requests to
//! free slots by a fixed discipline, with knowledge no proxy has (each answer's length).
//!
//! They answer one question about a cell cost routing misses: is the miss the policy's, or the
//! workload's? The disciplines probed in arrival order are the family known to be best for
//! two servers of unequal speed (the faster takes the next request whenever it can; the slower
//! only once enough wait, Lin and Kumar's threshold rule), here also told which waiting answer
//! is shortest. A cell none of them gets within a target is one where no routing that serves
//! requests in order is known to get there. The other kind of queue, out of arrival order (which
//! the seed's FIFO queue rules out), is probed too: [`Discipline::GivesUp`] sends a request late
//! already behind the rest, so the p90 falls and the slowest tenth pays;
//! [`Discipline::ShortestPrompt`] serves short prompts before long ones. A cell no probe of
//! either kind gets within a target is one where no queue discipline tried gets there at all.
//! No probe is a product policy.

use relay_core::proxy::dispatch::scheduler::RequestId;

/// How a probe's queue picks which waiting request a free slot takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discipline {
    /// In arrival order. The fastest box takes the first waiting request whenever it has a free
    /// slot; a slower box only while at least `threshold` requests wait (1: whenever it has a
    /// free slot). With `shortest_answer`, a slower box takes the waiting request whose answer
    /// is shortest (known in advance), holding its slow slot the least time.
    InOrder {
        threshold: usize,
        shortest_answer: bool,
    },
    /// In arrival order, except that a request that has waited `after` seconds goes behind
    /// every request that has not.
    GivesUp { after: u32 },
    /// Out of arrival order: every free slot takes the waiting request with the shortest prompt
    /// (what a proxy knows when a request arrives), so a long document waits behind every chat.
    ShortestPrompt,
}

impl Discipline {
    /// The in-order disciplines probed: thresholds 1–4, each with and without the answers'
    /// lengths.
    pub fn in_order() -> Vec<Discipline> {
        (1..=4)
            .flat_map(|threshold| {
                [false, true].map(|shortest_answer| Discipline::InOrder {
                    threshold,
                    shortest_answer,
                })
            })
            .collect()
    }

    /// The disciplines probed that serve requests out of arrival order: giving up on late
    /// requests (the p90's best found on the busy unequal pair lies between the two), and the
    /// shortest prompt first.
    pub const OUT_OF_ORDER: [Discipline; 3] = [
        Discipline::GivesUp { after: 3 },
        Discipline::GivesUp { after: 4 },
        Discipline::ShortestPrompt,
    ];

    /// What the report says of it.
    pub fn describe(self) -> String {
        match self {
            Discipline::InOrder {
                threshold,
                shortest_answer,
            } => format!(
                "in order; the slower box takes a request while {threshold}+ wait{}",
                if shortest_answer {
                    ", the shortest answer first"
                } else {
                    ""
                }
            ),
            Discipline::GivesUp { after } => {
                format!("a request waiting {after} s goes behind the rest")
            }
            Discipline::ShortestPrompt => "the shortest prompt first".to_string(),
        }
    }
}

/// What the queue knows of a waiting request.
#[derive(Debug, Clone, Copy)]
pub struct Waiting {
    pub id: RequestId,
    /// When it was sent.
    pub sent: f64,
    /// Its answer's tokens (what only a probe knows).
    pub output: u32,
    /// Its prompt's tokens.
    pub prompt: u32,
}

/// The central queue of a probe run.
#[derive(Debug)]
pub struct Queue {
    discipline: Discipline,
    waiting: Vec<Waiting>,
}

impl Queue {
    pub fn new(discipline: Discipline) -> Queue {
        Queue {
            discipline,
            waiting: Vec::new(),
        }
    }

    /// A request arrives.
    pub fn push(&mut self, request: Waiting) {
        self.waiting.push(request);
    }

    /// The request a free slot takes at `now` (of one of the fastest awake boxes, `fastest`, or
    /// of a slower one), taken off the queue; `None` when it takes none.
    pub fn take_for(&mut self, fastest: bool, now: f64) -> Option<RequestId> {
        if self.waiting.is_empty() {
            return None;
        }
        let index = match self.discipline {
            Discipline::InOrder { .. } if fastest => 0,
            Discipline::InOrder { threshold, .. } if self.waiting.len() < threshold => return None,
            Discipline::InOrder {
                shortest_answer: true,
                ..
            } => (0..self.waiting.len())
                .min_by_key(|&i| self.waiting[i].output)
                .expect("a request waits"),
            Discipline::InOrder { .. } => 0,
            Discipline::GivesUp { after } => self
                .waiting
                .iter()
                .position(|w| now - w.sent < f64::from(after))
                .unwrap_or(0),
            Discipline::ShortestPrompt => (0..self.waiting.len())
                .min_by_key(|&i| self.waiting[i].prompt)
                .expect("a request waits"),
        };
        Some(self.waiting.remove(index).id)
    }
}

/// Checks each discipline's choice on a small queue, before the probes' numbers are trusted
/// (benches run no `#[test]`s); panics naming the first that chooses wrongly.
pub fn check_disciplines() {
    let queue = |discipline| {
        let mut queue = Queue::new(discipline);
        for (id, sent, output, prompt) in [(1, 0.0, 300, 900), (2, 5.0, 80, 400), (3, 6.0, 120, 40)]
        {
            queue.push(Waiting {
                id,
                sent,
                output,
                prompt,
            });
        }
        queue
    };
    let in_order = |threshold, shortest_answer| {
        queue(Discipline::InOrder {
            threshold,
            shortest_answer,
        })
    };
    let cases = [
        (
            "the fastest box takes the first",
            in_order(4, true).take_for(true, 6.0),
            Some(1),
        ),
        (
            "a slower box below its threshold takes none",
            in_order(4, false).take_for(false, 6.0),
            None,
        ),
        (
            "a slower box at its threshold takes the first",
            in_order(3, false).take_for(false, 6.0),
            Some(1),
        ),
        (
            "a slower box told the answers takes the shortest",
            in_order(1, true).take_for(false, 6.0),
            Some(2),
        ),
        (
            "a request late already goes behind",
            queue(Discipline::GivesUp { after: 4 }).take_for(true, 6.0),
            Some(2),
        ),
        (
            "when all are late, the first",
            queue(Discipline::GivesUp { after: 1 }).take_for(true, 9.0),
            Some(1),
        ),
        (
            "the shortest prompt goes first",
            queue(Discipline::ShortestPrompt).take_for(true, 6.0),
            Some(3),
        ),
    ];
    for (case, took, expected) in cases {
        assert_eq!(took, expected, "queue probe: {case}");
    }
}
