//! A small mutation fuzzer that builds on stable Rust: inputs start from a corpus of seeds (files
//! in `tests/fuzz/corpus/TARGET/`, plus the repository's fixtures), are mutated byte-wise or, for
//! JSON, structure-wise, and run under `catch_unwind`. A panic is saved under
//! `target/fuzz-crashes/` with the command to add it to the corpus, where it stays as a
//! regression test: every corpus file runs as it is before any mutation.
//!
//! In an instrumented build (`scripts/fuzz.sh`, see `coverage.rs`) the run is coverage-guided:
//! an input that reaches code no input reached before joins the pool that mutations start from,
//! and is saved under `target/fuzz-corpus/TARGET/`, where the next run picks it up (and from where
//! it can be copied into the repository's corpus). Without instrumentation the seeds are mutated
//! blindly; the structure-aware JSON mutations still reach deep into the parsers instead of
//! dying at the first syntax error.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::coverage::Coverage;

/// A deterministic pseudo-random source (xorshift64*): the same seed replays the same run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// How long, or how many inputs, each target runs: `FUZZ_SECONDS` (a budget per target, for the
/// long runs of `scripts/fuzz.sh`) or `FUZZ_RUNS` (inputs per target; the test command's
/// default keeps every run the same). `FUZZ_SEED` picks the sequence.
pub struct Budget {
    runs: Option<usize>,
    time: Option<Duration>,
    pub seed: u64,
}

impl Budget {
    pub fn from_env(default_runs: usize) -> Budget {
        let number = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let time = number("FUZZ_SECONDS").map(Duration::from_secs);
        Budget {
            runs: match time {
                Some(_) => number("FUZZ_RUNS").map(|n| n as usize),
                None => Some(number("FUZZ_RUNS").map_or(default_runs, |n| n as usize)),
            },
            time,
            seed: number("FUZZ_SEED").unwrap_or(0x5eed),
        }
    }

    /// Exactly `runs` inputs, whatever the environment says (the guided engine's self-test).
    #[cfg_attr(not(fuzz_coverage), allow(dead_code))]
    pub fn runs(runs: usize, seed: u64) -> Budget {
        Budget {
            runs: Some(runs),
            time: None,
            seed,
        }
    }

    fn more(&self, done: usize, started: Instant) -> bool {
        self.runs.is_none_or(|runs| done < runs)
            && self.time.is_none_or(|time| started.elapsed() < time)
    }
}

/// The seeds of `target`: its corpus directory, then `extra` files.
pub fn corpus(target: &str, extra: &[PathBuf]) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/corpus")
        .join(target);
    let mut seeds = read_dir_files(&dir);
    seeds.extend(extra.iter().filter_map(|file| std::fs::read(file).ok()));
    assert!(
        !seeds.is_empty(),
        "no seeds for {target} in {}",
        dir.display()
    );
    seeds
}

/// Files of a fixtures directory (relative to the crate) whose names end with `suffix`.
pub fn fixtures(dir: &str, suffix: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|f| f.to_string_lossy().ends_with(suffix));
    files.sort();
    files
}

/// What a run did.
#[derive(Debug)]
pub struct Run {
    /// Inputs run.
    pub inputs: usize,
    /// Inputs kept because they reached new code (guided runs only).
    pub kept: usize,
    /// Code regions reached by any input, when the build counts them.
    pub regions: Option<usize>,
}

/// Where a guided run keeps the inputs that reached new code, per target.
fn found_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/fuzz-corpus")
        .join(target)
}

/// Runs `check` on every seed as it is, then on mutations until the budget is spent. In a
/// guided run, the pool mutations start from grows with every input that reached new code (and
/// starts with what earlier guided runs found).
pub fn fuzz(target: &str, seeds: &[Vec<u8>], budget: &Budget, check: impl Fn(&[u8])) -> Run {
    let mut rng = Rng::new(budget.seed ^ hash(target.as_bytes()));
    let started = Instant::now();
    let mut coverage = Coverage::new();
    let mut pool = seeds.to_vec();
    if Coverage::available() {
        pool.extend(read_dir_files(&found_dir(target)));
    }
    for input in &pool {
        coverage.start();
        run_one(target, input, &check);
        coverage.novel();
    }
    let mut run = Run {
        inputs: pool.len(),
        kept: 0,
        regions: None,
    };
    while budget.more(run.inputs, started) {
        let input = mutate(&pool, &mut rng);
        coverage.start();
        run_one(target, &input, &check);
        run.inputs += 1;
        if coverage.novel() {
            keep(target, &input);
            pool.push(input);
            run.kept += 1;
        }
    }
    run.regions = Coverage::available().then(|| coverage.regions_reached());
    run
}

/// Saves an input that reached new code for the next guided run.
fn keep(target: &str, input: &[u8]) {
    let dir = found_dir(target);
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{:016x}", hash(input))), input);
}

/// The contents of the files in `dir`, in name order (none when it does not exist).
fn read_dir_files(dir: &Path) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .filter_map(|file| std::fs::read(file).ok())
        .collect()
}

fn run_one(target: &str, input: &[u8], check: &impl Fn(&[u8])) {
    if catch_unwind(AssertUnwindSafe(|| check(input))).is_ok() {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-crashes");
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(format!("{target}-{:016x}", hash(input)));
    let _ = std::fs::write(&file, input);
    panic!(
        "fuzz target {target} panicked on {} ({} bytes); once fixed, keep it as a regression: \
         cp {} relay-core/tests/fuzz/corpus/{target}/",
        file.display(),
        input.len(),
        file.display()
    );
}

pub fn hash(bytes: &[u8]) -> u64 {
    // FNV-1a: stable across runs and platforms, unlike the std hasher's seed.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Tokens that matter to the parsers here, spliced in by the byte mutations.
const TOKENS: &[&[u8]] = &[
    b"\n",
    b"\r\n",
    b"\n\n",
    b"data: ",
    b"data:",
    b"event: ",
    b": comment\n",
    b"[DONE]",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"null",
    b"-1",
    b"1e999",
    b"18446744073709551616",
    b"\xff\xfe",
    b"\xe2\x82",
    b"response.completed",
    b"\"type\":",
    b"\"usage\":",
];

/// One input derived from the seeds: a JSON seed mutated as a tree half of the time, else bytes.
pub fn mutate(seeds: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
    let seed = &seeds[rng.below(seeds.len())];
    if rng.chance(2) {
        if let Ok(mut value) = serde_json::from_slice::<Value>(seed) {
            for _ in 0..=rng.below(4) {
                mutate_value(&mut value, rng, 0);
            }
            return serde_json::to_vec(&value).expect("a Value serializes");
        }
    }
    let mut bytes = seed.clone();
    for _ in 0..=rng.below(8) {
        mutate_bytes(&mut bytes, seeds, rng);
    }
    bytes
}

fn mutate_bytes(bytes: &mut Vec<u8>, seeds: &[Vec<u8>], rng: &mut Rng) {
    let at = rng.below(bytes.len() + 1);
    match rng.below(8) {
        0 if !bytes.is_empty() => {
            let i = rng.below(bytes.len());
            bytes[i] ^= 1 << rng.below(8);
        }
        7 if !bytes.is_empty() => {
            let i = rng.below(bytes.len());
            bytes[i] = rng.next() as u8;
        }
        1 if !bytes.is_empty() => {
            let end = (at + rng.below(16) + 1).min(bytes.len());
            bytes.drain(at.min(end)..end);
        }
        2 => {
            let token = TOKENS[rng.below(TOKENS.len())];
            bytes.splice(at..at, token.iter().copied());
        }
        3 if !bytes.is_empty() => {
            // Repeat a piece: long lines, deep nesting, many events.
            let start = rng.below(bytes.len());
            let end = (start + rng.below(64) + 1).min(bytes.len());
            let piece = bytes[start..end].to_vec();
            for _ in 0..rng.below(64) + 1 {
                bytes.splice(at..at, piece.iter().copied());
            }
        }
        4 => {
            // Splice in part of another seed.
            let other = &seeds[rng.below(seeds.len())];
            let start = rng.below(other.len() + 1);
            let end = (start + rng.below(256)).min(other.len());
            bytes.splice(at..at, other[start..end].iter().copied());
        }
        5 => bytes.truncate(at),
        _ => bytes.insert(at, rng.next() as u8),
    }
}

/// Replaces, removes or adds something somewhere in `value`.
fn mutate_value(value: &mut Value, rng: &mut Rng, depth: usize) {
    let descend = depth < 12 && rng.below(3) != 0;
    match value {
        Value::Object(map) if descend && !map.is_empty() => {
            let key = map
                .keys()
                .nth(rng.below(map.len()))
                .cloned()
                .expect("present");
            match rng.below(6) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    let copy = map[&key].clone();
                    map.insert(format!("{key}_{}", rng.below(3)), copy);
                }
                _ => mutate_value(map.get_mut(&key).expect("present"), rng, depth + 1),
            }
        }
        Value::Array(items) if descend && !items.is_empty() => {
            let i = rng.below(items.len());
            match rng.below(6) {
                0 => {
                    items.remove(i);
                }
                1 => {
                    let copy = items[i].clone();
                    items.insert(i, copy);
                }
                _ => mutate_value(&mut items[i], rng, depth + 1),
            }
        }
        _ => *value = random_value(rng, 2),
    }
}

fn random_value(rng: &mut Rng, depth: usize) -> Value {
    const STRINGS: &[&str] = &[
        "",
        "user",
        "assistant",
        "system",
        "tool",
        "text",
        "image",
        "tool_use",
        "tool_result",
        "function",
        "message",
        "input_text",
        "output_text",
        "function_call",
        "function_call_output",
        "reasoning",
        "thinking",
        "auto",
        "none",
        "required",
        "stop",
        "length",
        "end_turn",
        "data:image/png;base64,AAAA",
        "\u{0}\n\r\"\\",
        "\u{1F600}",
    ];
    match rng.below(if depth == 0 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(2)),
        2 => match rng.below(4) {
            0 => Value::from(-1),
            1 => Value::from(u64::MAX),
            2 => Value::from(1.5e300),
            _ => Value::from(rng.below(5)),
        },
        3 | 4 => Value::from(STRINGS[rng.below(STRINGS.len())]),
        5 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let mut map = Map::new();
            for _ in 0..rng.below(4) {
                let key =
                    ["type", "role", "content", "text", "id", "name", "arguments"][rng.below(7)];
                map.insert(key.to_string(), random_value(rng, depth - 1));
            }
            Value::Object(map)
        }
    }
}
