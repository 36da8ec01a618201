//! Conversation affinity against real llama-servers: does a conversation's next turn find its
//! prompt in the backend's cache?
//!
//! Two real llama-servers (tiny model, three slots each, one thread) behind the real proxy and
//! two real workers; six concurrent conversations of several turns share a long system prompt
//! (≥ 2,000 tokens), with random pauses between turns. The same run measures the proxy with
//! affinity off (least-loaded routing), then on with the workers' slot hints off, then both on;
//! each phase gets fresh servers and its own system prompt, so none inherits another's cache.
//! For turns 2+ it reports the share of prompt tokens llama-server served from cache
//! (`timings.cache_n / (cache_n + prompt_n)`), the turns whose history was evaluated again, the
//! prompt tokens evaluated, the mean prompt evaluation time (`timings.prompt_ms`) and the
//! client's time to first token.
//!
//! `cargo bench -p relay-core --bench affinity` (needs `../shared/tools/realstack/setup.sh`'s
//! stack in `$REALSTACK`, default `~/.cache/modelrelay-realstack`; without it, it says so and
//! exits). `AFFINITY_TURNS`, `AFFINITY_CONVERSATIONS` and `AFFINITY_SEED` change the run.

#[allow(dead_code)] // shared with the relay bench, which uses more of it
#[path = "../relay/procs.rs"]
mod procs;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use procs::{modelrelay_binary, wait_for_workers, ChildProcess, SECRET};
use serde_json::{json, Value};

const MODEL: &str = "tiny-random";
/// Slots per llama-server.
const SLOTS: u32 = 3;
/// Tokens the answer of each turn is cut at.
const ANSWER_TOKENS: u32 = 24;
/// The system prompt is grown until it has at least this many tokens.
const SYSTEM_TOKENS: usize = 2_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small deterministic generator for pauses and words (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const WORDS: &[&str] = &[
    "relay", "worker", "proxy", "queue", "model", "token", "stream", "answer", "careful", "always",
    "never", "explain", "context", "request", "cache", "prompt", "system", "tool", "result",
    "follow", "rules", "format", "markdown", "code", "review", "safety", "helpful", "concise",
    "detail", "example", "question", "summary", "budget", "latency", "server", "client",
];

fn words(rng: &mut Rng, count: usize) -> String {
    (0..count)
        .map(|_| WORDS[rng.below(WORDS.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A free TCP port on 127.0.0.1 (bound, then released for the child to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn realstack() -> Option<(PathBuf, PathBuf)> {
    let root = std::env::var_os("REALSTACK")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/modelrelay-realstack"))
        })?;
    let server = root.join("bin/llama-server");
    let model = root.join("models/tiny-random-llama.gguf");
    (server.is_file() && model.is_file()).then_some((server, model))
}

async fn start_llama(client: &reqwest::Client, server: &Path, model: &Path) -> (ChildProcess, u16) {
    let port = free_port();
    let mut command = Command::new(server);
    command.args(["-m", &model.display().to_string()]);
    command.args([
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "-a",
        MODEL,
    ]);
    // Each slot gets a third of the context: a 2,000-token system prompt and the turns.
    command.args(["-c", "16384", "-n", &ANSWER_TOKENS.to_string(), "-t", "1"]);
    command.args(["-np", &SLOTS.to_string(), "--no-webui"]);
    let child = ChildProcess::start(command, None);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let health = client
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await;
        if health.is_ok_and(|r| r.status().is_success()) {
            return (child, port);
        }
        assert!(Instant::now() < deadline, "llama-server did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn start_proxy(affinity: bool, data: &std::path::Path) -> (ChildProcess, u16) {
    let mut command = Command::new(modelrelay_binary());
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--worker-secret",
            SECRET,
        ])
        .args(["--affinity", if affinity { "true" } else { "false" }])
        .env("LOG_LEVEL", "warn")
        .env("MODELRELAY_DATA_DIR", data);
    let proxy = ChildProcess::start(command, Some("serving at http://"));
    let port = proxy
        .announced
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok())
        .expect("the proxy's port");
    (proxy, port)
}

fn start_worker(
    proxy: u16,
    backend: u16,
    name: &str,
    slot_hints: bool,
    data: &std::path::Path,
) -> ChildProcess {
    let mut command = Command::new(modelrelay_binary());
    command
        .args(["worker", "--worker-secret", SECRET, "--models", MODEL])
        .args(["--slot-hints", if slot_hints { "true" } else { "false" }])
        .args(["--worker-name", name])
        .args(["--proxy-url", &format!("http://127.0.0.1:{proxy}")])
        .args(["--backend-url", &format!("http://127.0.0.1:{backend}")])
        .args(["--max-concurrency", &SLOTS.to_string()])
        .env("LOG_LEVEL", "warn")
        .env("MODELRELAY_DATA_DIR", data);
    ChildProcess::start(command, None)
}

/// What llama-server and the client saw of one turn.
#[derive(Debug, Clone, Copy)]
struct Turn {
    turn: usize,
    prompt_n: u64,
    cache_n: u64,
    /// Tokens generated (the answer, which llama-server keeps in the slot's cache too).
    predicted_n: u64,
    /// Tokens of the conversation's history that were evaluated again (not found in the
    /// cache): this turn's evaluated tokens beyond what is new since the previous turn (its
    /// question and the chat template around it). Zero for a first turn.
    history_reevaluated: u64,
    prompt_ms: f64,
    ttft_ms: f64,
}

/// Chat-template tokens around a new message that a turn evaluates besides its text: slack
/// before a turn counts as having re-evaluated its history.
const TEMPLATE_SLACK: u64 = 16;

/// One streamed turn: its answer text and measurements.
async fn turn(
    client: &reqwest::Client,
    url: &str,
    messages: &[Value],
    index: usize,
) -> (String, Turn) {
    let body = json!({
        "model": MODEL,
        "messages": messages,
        "max_tokens": ANSWER_TOKENS,
        "stream": true,
        "temperature": 0,
    });
    let started = Instant::now();
    let mut response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("the turn was sent");
    assert!(
        response.status().is_success(),
        "status {}",
        response.status()
    );
    let mut pending = String::new();
    let mut text = String::new();
    let mut ttft = None;
    let mut timings = Value::Null;
    while let Some(chunk) = response.chunk().await.expect("the stream") {
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let Ok(event) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            if let Some(piece) = event["choices"][0]["delta"]["content"].as_str() {
                if ttft.is_none() {
                    ttft = Some(started.elapsed());
                }
                text.push_str(piece);
            }
            if event["timings"].is_object() {
                timings = event["timings"].clone();
            }
        }
    }
    let ttft = ttft.unwrap_or_else(|| started.elapsed());
    (
        text,
        Turn {
            turn: index,
            prompt_n: timings["prompt_n"].as_u64().expect("timings.prompt_n"),
            cache_n: timings["cache_n"].as_u64().unwrap_or(0),
            predicted_n: timings["predicted_n"].as_u64().unwrap_or(0),
            history_reevaluated: 0,
            prompt_ms: timings["prompt_ms"].as_f64().unwrap_or(0.0),
            ttft_ms: ttft.as_secs_f64() * 1000.0,
        },
    )
}

async fn conversation(
    client: reqwest::Client,
    url: String,
    system: String,
    turns: usize,
    seed: u64,
) -> Vec<Turn> {
    let mut rng = Rng(seed | 1);
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut out: Vec<Turn> = Vec::new();
    // Staggered starts, as real sessions begin.
    tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
    for index in 1..=turns {
        let question = format!(
            "Turn {index} of conversation {seed}: {}",
            words(&mut rng, 60)
        );
        messages.push(json!({"role": "user", "content": question}));
        let (answer, mut measured) = turn(&client, &url, &messages, index).await;
        messages.push(json!({"role": "assistant", "content": answer}));
        if let Some(previous) = out.last() {
            let seen = previous.prompt_n + previous.cache_n + previous.predicted_n;
            let new = (measured.prompt_n + measured.cache_n).saturating_sub(seen);
            measured.history_reevaluated = measured.prompt_n.saturating_sub(new);
        }
        out.push(measured);
        // A person (or an agent's tool) takes a while before the next turn.
        tokio::time::sleep(Duration::from_millis(200 + rng.below(1300))).await;
    }
    out
}

/// The phase's summary of turns 2+.
struct Summary {
    turns: usize,
    /// Turns 2+ that evaluated their history again, and how many history tokens in all.
    history_misses: usize,
    history_tokens: u64,
    cached_share: f64,
    /// Prompt tokens llama-server evaluated per turn (`prompt_n`): the work, whatever the
    /// machine's load does to the time it takes.
    prompt_tokens: f64,
    prompt_ms: f64,
    ttft_ms: f64,
    placements: String,
}

/// How one phase routes: the proxy's affinity, the workers' slot hints.
#[derive(Debug, Clone, Copy)]
struct Routing {
    name: &'static str,
    affinity: bool,
    slot_hints: bool,
}

const PHASES: [Routing; 3] = [
    Routing {
        name: "least-loaded (affinity off)",
        affinity: false,
        slot_hints: false,
    },
    Routing {
        name: "affinity on, slot hints off",
        affinity: true,
        slot_hints: false,
    },
    Routing {
        name: "affinity on, slot hints on",
        affinity: true,
        slot_hints: true,
    },
];

async fn phase(
    client: &reqwest::Client,
    stack: &(PathBuf, PathBuf),
    (index, routing): (usize, Routing),
    conversations: u64,
    turns: usize,
    seed: u64,
) -> Summary {
    let data =
        std::env::temp_dir().join(format!("modelrelay-affinity-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&data);
    let (_llama_a, port_a) = start_llama(client, &stack.0, &stack.1).await;
    let (_llama_b, port_b) = start_llama(client, &stack.0, &stack.1).await;
    let (_proxy, proxy_port) = start_proxy(routing.affinity, &data);
    let _worker_a = start_worker(proxy_port, port_a, "box-a", routing.slot_hints, &data);
    let _worker_b = start_worker(proxy_port, port_b, "box-b", routing.slot_hints, &data);
    wait_for_workers(client, proxy_port, 2).await;
    // Each phase has its own system prompt, so the servers' caches start cold for it.
    let mut rng = Rng(seed ^ index as u64 ^ 0x9e37_79b9);
    let mut system = format!("Phase {index}. You are a careful assistant. ");
    loop {
        system.push_str(&words(&mut rng, 200));
        system.push(' ');
        let tokens = client
            .post(format!("http://127.0.0.1:{port_a}/tokenize"))
            .header("content-type", "application/json")
            .body(json!({"content": system}).to_string())
            .send()
            .await
            .expect("tokenize")
            .text()
            .await
            .expect("tokens");
        let tokens: Value = serde_json::from_str(&tokens).unwrap_or_default();
        if tokens["tokens"].as_array().map_or(0, Vec::len) >= SYSTEM_TOKENS {
            break;
        }
    }
    let url = format!("http://127.0.0.1:{proxy_port}/v1/chat/completions");
    let tasks: Vec<_> = (0..conversations)
        .map(|c| {
            tokio::spawn(conversation(
                client.clone(),
                url.clone(),
                system.clone(),
                turns,
                seed.wrapping_mul(31).wrapping_add(c + 1),
            ))
        })
        .collect();
    let mut later = Vec::new();
    for task in tasks {
        later.extend(
            task.await
                .expect("conversation")
                .into_iter()
                .filter(|t| t.turn >= 2),
        );
    }
    let metrics = client
        .get(format!("http://127.0.0.1:{proxy_port}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    let placements = metrics
        .lines()
        .filter(|l| l.starts_with("modelrelay_affinity_placements_total{"))
        .map(|l| l.trim_start_matches("modelrelay_affinity_placements_total"))
        .collect::<Vec<_>>()
        .join(" ");
    let _ = std::fs::remove_dir_all(&data);
    let n = later.len().max(1) as f64;
    let cached: u64 = later.iter().map(|t| t.cache_n).sum();
    let evaluated: u64 = later.iter().map(|t| t.prompt_n).sum();
    Summary {
        turns: later.len(),
        history_misses: later
            .iter()
            .filter(|t| t.history_reevaluated > TEMPLATE_SLACK)
            .count(),
        history_tokens: later.iter().map(|t| t.history_reevaluated).sum(),
        cached_share: cached as f64 / (cached + evaluated).max(1) as f64,
        prompt_tokens: evaluated as f64 / n,
        prompt_ms: later.iter().map(|t| t.prompt_ms).sum::<f64>() / n,
        ttft_ms: later.iter().map(|t| t.ttft_ms).sum::<f64>() / n,
        placements,
    }
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken from the command line.
    let Some(stack) = realstack() else {
        eprintln!(
            "SKIPPED affinity bench: no real llama-server stack (bin/llama-server and \
             models/tiny-random-llama.gguf in $REALSTACK or ~/.cache/modelrelay-realstack; \
             build it with ../shared/tools/realstack/setup.sh)"
        );
        return;
    };
    let conversations = env_or("AFFINITY_CONVERSATIONS", 6);
    let turns = env_or("AFFINITY_TURNS", 6) as usize;
    let seed = env_or("AFFINITY_SEED", 17);
    let client = reqwest::Client::new();
    let mut summaries = Vec::new();
    for (index, routing) in PHASES.into_iter().enumerate() {
        eprintln!(
            "{conversations} conversations x {turns} turns, seed {seed}: {}...",
            routing.name
        );
        let summary = phase(
            &client,
            &stack,
            (index, routing),
            conversations,
            turns,
            seed,
        )
        .await;
        summaries.push((routing.name, summary));
    }
    println!(
        "\n{conversations} conversations x {turns} turns, ≥{SYSTEM_TOKENS}-token shared system \
         prompt, 2 llama-servers x {SLOTS} slots (tiny model, 1 thread), seed {seed}; turns 2+:\n"
    );
    println!("| routing | turns | prompt tokens from cache | turns that re-evaluated history (tokens) | mean prompt tokens evaluated | mean prompt eval ms | mean TTFT ms | placements (/metrics) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for (name, s) in &summaries {
        println!(
            "| {name} | {} | {:.1}% | {} ({}) | {:.0} | {:.1} | {:.1} | {} |",
            s.turns,
            s.cached_share * 100.0,
            s.history_misses,
            s.history_tokens,
            s.prompt_tokens,
            s.prompt_ms,
            s.ttft_ms,
            if s.placements.is_empty() {
                "-"
            } else {
                &s.placements
            },
        );
    }
    let off = &summaries[0].1;
    for (name, on) in &summaries[1..] {
        println!(
            "| off / ({name}) | | | | {:.2}x | {:.2}x | {:.2}x | |",
            off.prompt_tokens / on.prompt_tokens.max(0.001),
            off.prompt_ms / on.prompt_ms.max(0.001),
            off.ttft_ms / on.ttft_ms.max(0.001)
        );
    }
}
