//! What ended requests add up to, for `/metrics`: requests by model, client key and status,
//! tokens by model and key, and latency histograms by model.
//!
//! It lives under the telemetry's request lock, which a request's end takes anyway to leave the
//! dashboard's list, so counting costs no lock of its own; after a label's first request it
//! costs no allocation either (a few hash lookups and additions).
//!
//! Label values come from clients (model names sent to an upstream that takes any name) and
//! from workers, so their number and size are bounded: at most [`MAX_MODEL_LABELS`] models and
//! [`MAX_KEY_LABELS`] keys get a label of their own, in the order they are first seen; later
//! ones, names longer than [`MAX_LABEL_BYTES`] or with control characters (no worker may serve
//! such a name; only an upstream taking any name could) and requests the proxy could not route
//! (no such model, no model at all) count under [`OTHER`]. A client sending 100,000 random model
//! names adds to one series, not 100,000.

use std::collections::HashMap;
use std::time::Duration;

/// Models with a label of their own; the rest count as [`OTHER`].
pub const MAX_MODEL_LABELS: usize = 100;
/// Client keys with a label of their own; the rest count as [`OTHER`].
pub const MAX_KEY_LABELS: usize = 100;
/// Longer label values count as [`OTHER`] (the relay's bound on names; a client may send more).
pub const MAX_LABEL_BYTES: usize = 256;
/// The label value of everything folded together.
pub const OTHER: &str = "other";

/// Time-to-first-token buckets (seconds): a loaded model answers in tens of milliseconds, one
/// being started or a long prompt being read takes seconds to minutes.
pub const TTFT_BUCKETS: &[f64] = &[
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
/// Request duration buckets (seconds), up to the default request timeout and beyond.
pub const DURATION_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Label values interned to small ids; id 0 is [`OTHER`].
#[derive(Debug, Clone)]
struct Labels {
    names: Vec<Box<str>>,
    ids: HashMap<Box<str>, u16>,
    cap: usize,
}

impl Labels {
    fn new(cap: usize) -> Self {
        Labels {
            names: vec![OTHER.into()],
            // A model or key really named `other` shares the fold's series.
            ids: HashMap::from([(OTHER.into(), 0)]),
            cap,
        }
    }

    /// The id of `value`, given one if there is room; [`OTHER`]'s for `None`.
    fn id(&mut self, value: Option<&str>) -> u16 {
        let Some(value) = value else { return 0 };
        if let Some(id) = self.ids.get(value) {
            return *id;
        }
        // Checked only on a miss: known names were checked when they got their label. `names`
        // holds OTHER besides the capped values.
        let labelled = value.len() <= MAX_LABEL_BYTES && !value.chars().any(char::is_control);
        if !labelled || self.names.len() > self.cap {
            return 0;
        }
        let id = self.names.len() as u16;
        self.names.push(value.into());
        self.ids.insert(value.into(), id);
        id
    }

    fn name(&self, id: u16) -> &str {
        &self.names[usize::from(id)]
    }
}

/// A histogram with fixed bucket bounds; counts per bucket (not cumulative) and a sum.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, for observations at most that bound and above the previous one.
    counts: Vec<u64>,
    count: u64,
    sum_nanos: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            count: 0,
            sum_nanos: 0,
        }
    }

    fn observe(&mut self, value: Duration) {
        let secs = value.as_secs_f64();
        if let Some(bucket) = self.bounds.iter().position(|bound| secs <= *bound) {
            self.counts[bucket] += 1;
        }
        self.count += 1;
        self.sum_nanos = self
            .sum_nanos
            .saturating_add(u64::try_from(value.as_nanos()).unwrap_or(u64::MAX));
    }

    /// `(upper bound, observations at most that bound)` for each bucket, `+Inf` excluded (its
    /// count is [`Histogram::count`]).
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.bounds
            .iter()
            .zip(&self.counts)
            .scan(0, |total, (bound, count)| {
                *total += count;
                Some((*bound, *total))
            })
    }

    /// Observations.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Their sum, in seconds.
    pub fn sum_secs(&self) -> f64 {
        self.sum_nanos as f64 / 1e9
    }
}

/// One model's latencies.
#[derive(Debug, Clone)]
pub struct Latency {
    /// Arrival to the first byte of a streamed answer.
    pub ttft: Histogram,
    /// Arrival to the end of the answer.
    pub duration: Histogram,
}

/// Input and output tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Prompt tokens, as the backend reported them.
    pub input: u64,
    /// Generated tokens: the backend's count, else the stream's data events.
    pub output: u64,
}

/// One request as counted: what it asked for, how it ended, how long it took.
#[derive(Debug, Clone, Copy)]
pub struct Outcome<'a> {
    /// The model, when the proxy routes it; `None` counts as [`OTHER`].
    pub model: Option<&'a str>,
    /// The client key's label.
    pub key: &'a str,
    /// The HTTP status the client got (or the error's, for a stream that ended in one).
    pub status: u16,
    /// Tokens used.
    pub tokens: Tokens,
    /// Time to the first byte of a streamed answer, if it started.
    pub ttft: Option<Duration>,
    /// Arrival to the end, for requests a worker or upstream took.
    pub duration: Option<Duration>,
}

/// The counts, since the proxy started.
#[derive(Debug, Clone)]
pub struct Ledger {
    models: Labels,
    keys: Labels,
    requests: HashMap<(u16, u16, u16), u64>,
    tokens: HashMap<(u16, u16), Tokens>,
    /// Indexed by model id.
    latency: Vec<Latency>,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            models: Labels::new(MAX_MODEL_LABELS),
            keys: Labels::new(MAX_KEY_LABELS),
            requests: HashMap::new(),
            tokens: HashMap::new(),
            latency: Vec::new(),
        }
    }
}

impl Ledger {
    /// Counts one ended request.
    pub fn record(&mut self, outcome: Outcome<'_>) {
        let model = self.models.id(outcome.model);
        let key = self.keys.id(Some(outcome.key));
        *self
            .requests
            .entry((model, key, outcome.status))
            .or_default() += 1;
        if outcome.tokens != Tokens::default() {
            let tokens = self.tokens.entry((model, key)).or_default();
            tokens.input += outcome.tokens.input;
            tokens.output += outcome.tokens.output;
        }
        if outcome.ttft.is_none() && outcome.duration.is_none() {
            return;
        }
        let index = usize::from(model);
        if self.latency.len() <= index {
            self.latency.resize_with(index + 1, || Latency {
                ttft: Histogram::new(TTFT_BUCKETS),
                duration: Histogram::new(DURATION_BUCKETS),
            });
        }
        let latency = &mut self.latency[index];
        if let Some(ttft) = outcome.ttft {
            latency.ttft.observe(ttft);
        }
        if let Some(duration) = outcome.duration {
            latency.duration.observe(duration);
        }
    }

    /// `(model, key, status, requests)`, sorted.
    pub fn requests(&self) -> Vec<(&str, &str, u16, u64)> {
        let mut all: Vec<_> = self
            .requests
            .iter()
            .map(|((model, key, status), count)| {
                (
                    self.models.name(*model),
                    self.keys.name(*key),
                    *status,
                    *count,
                )
            })
            .collect();
        all.sort_unstable();
        all
    }

    /// `(model, key, tokens)`, sorted.
    pub fn tokens(&self) -> Vec<(&str, &str, Tokens)> {
        let mut all: Vec<_> = self
            .tokens
            .iter()
            .map(|((model, key), tokens)| (self.models.name(*model), self.keys.name(*key), *tokens))
            .collect();
        all.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        all
    }

    /// `(model, latencies)` of the models that have any, sorted.
    pub fn latency(&self) -> Vec<(&str, &Latency)> {
        let mut all: Vec<_> = self
            .latency
            .iter()
            .enumerate()
            .filter(|(_, l)| l.ttft.count() > 0 || l.duration.count() > 0)
            .map(|(id, latency)| (self.models.name(id as u16), latency))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(model: Option<&str>, status: u16) -> Outcome<'_> {
        Outcome {
            model,
            key: "anonymous",
            status,
            tokens: Tokens::default(),
            ttft: None,
            duration: None,
        }
    }

    #[test]
    fn requests_count_by_model_key_and_status() {
        let mut ledger = Ledger::default();
        ledger.record(ended(Some("m"), 200));
        ledger.record(ended(Some("m"), 200));
        ledger.record(ended(Some("m"), 502));
        ledger.record(ended(None, 404));
        assert_eq!(
            ledger.requests(),
            vec![
                ("m", "anonymous", 200, 2),
                ("m", "anonymous", 502, 1),
                (OTHER, "anonymous", 404, 1),
            ]
        );
    }

    #[test]
    fn models_beyond_the_cap_and_overlong_or_control_character_names_fold_into_other() {
        let mut ledger = Ledger::default();
        for n in 0..MAX_MODEL_LABELS + 50 {
            ledger.record(ended(Some(&format!("model-{n}")), 200));
        }
        ledger.record(ended(Some(&"x".repeat(MAX_LABEL_BYTES + 1)), 200));
        ledger.record(ended(Some("line\nbreak"), 200));
        let requests = ledger.requests();
        let models: std::collections::BTreeSet<&str> = requests.iter().map(|r| r.0).collect();
        assert_eq!(models.len(), MAX_MODEL_LABELS + 1, "the cap plus `other`");
        assert!(
            models.contains("model-0"),
            "the first ones keep their label"
        );
        let other = requests.iter().find(|r| r.0 == OTHER).unwrap();
        assert_eq!(other.3, 52);
        assert_eq!(
            ledger.models.ids.len(),
            MAX_MODEL_LABELS + 1,
            "nothing more is kept"
        );
    }

    #[test]
    fn a_model_named_other_shares_the_fold() {
        let mut ledger = Ledger::default();
        ledger.record(ended(Some(OTHER), 200));
        ledger.record(ended(None, 200));
        assert_eq!(ledger.requests(), vec![(OTHER, "anonymous", 200, 2)]);
    }

    #[test]
    fn tokens_add_up_per_model_and_key() {
        let mut ledger = Ledger::default();
        for (input, output) in [(3, 5), (4, 6)] {
            ledger.record(Outcome {
                tokens: Tokens { input, output },
                ..ended(Some("m"), 200)
            });
        }
        assert_eq!(
            ledger.tokens(),
            vec![(
                "m",
                "anonymous",
                Tokens {
                    input: 7,
                    output: 11
                }
            )]
        );
    }

    #[test]
    fn histograms_are_cumulative_with_a_sum_and_a_count() {
        let mut ledger = Ledger::default();
        for millis in [20, 70, 70, 400_000] {
            ledger.record(Outcome {
                ttft: Some(Duration::from_millis(millis)),
                duration: Some(Duration::from_millis(millis * 2)),
                ..ended(Some("m"), 200)
            });
        }
        ledger.record(ended(Some("refused"), 429));
        let latency = ledger.latency();
        assert_eq!(latency.len(), 1, "only models with observations");
        let (model, latency) = latency[0];
        assert_eq!(model, "m");
        let buckets: Vec<(f64, u64)> = latency.ttft.cumulative().collect();
        assert_eq!(buckets[0], (0.025, 1));
        assert_eq!(buckets[2], (0.1, 3));
        assert_eq!(buckets.last(), Some(&(120.0, 3)), "400 s is only in +Inf");
        assert_eq!(latency.ttft.count(), 4);
        assert!((latency.ttft.sum_secs() - 400.16).abs() < 1e-9);
        assert_eq!(latency.duration.count(), 4);
    }
}
