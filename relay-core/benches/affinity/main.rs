//! Conversation affinity against real llama-servers: does a conversation's next turn find its
//! prompt in the backend's cache?
//!
//! Two real llama-servers (tiny model, three slots each, one thread) behind the real proxy and
//! two real workers; six concurrent conversations of several turns, each with a long system
//! prompt (≥ 2,000 tokens), with random pauses between turns. It runs two workloads: one system
//! prompt shared by all conversations, and a system prompt of its own per conversation. The same run measures the proxy with
//! affinity off (least-loaded routing), then on with the workers' slot hints off, then both on;
//! each phase gets fresh servers and its own system prompts, so none inherits another's cache.
//! For turns 2+ it reports the share of prompt tokens llama-server served from cache
//! (`timings.cache_n / (cache_n + prompt_n)`), the turns whose history was evaluated again, the
//! prompt tokens evaluated, the mean prompt evaluation time (`timings.prompt_ms`) and the
//! client's time to first token.
//!
//! `cargo bench -p relay-core --bench affinity` (needs `../shared/tools/realstack/setup.sh`'s
//! stack in `$REALSTACK`, default `~/.cache/modelrelay-realstack`; without it, it says so and
//! exits). `AFFINITY_TURNS`, `AFFINITY_CONVERSATIONS`, `AFFINITY_SEEDS`, `AFFINITY_SYSTEM`
//! (`shared`, `own`, `both`), `AFFINITY_LLAMA_ARGS` (more llama-server arguments, the same
//! for every phase), `AFFINITY_SLOW_ARGS` (more arguments for the second server only: boxes of
//! unequal speed, for the cost-routing phase), `AFFINITY_SIDE_REQUESTS=1` (every request
//! carries its conversation's Claude Code session header, and every second turn sends a side
//! request beside it, as Claude Code's titles and summaries: `claude-haiku-*`, aliased to the
//! model, a prompt of its own), `AFFINITY_API=messages` (every request on Anthropic's
//! `/v1/messages`, as Claude Code sends them, which llama-server serves natively and which
//! takes no slot hint: llama-server drops `id_slot` there; the reuse then comes from the
//! stream's `usage`, and llama-server reports no prompt time there, so that column reads 0)
//! `AFFINITY_SUBAGENTS=1` (with `AFFINITY_API=messages`: before every third turn the
//! conversation runs a subagent, as Claude Code's Task tool does: three turns of a conversation
//! of its own, on the main model, with a system prompt of its own and the same session header;
//! every system prompt opens with Claude Code's billing line, whose `cc_is_subagent=true` marks
//! the subagent's; with `AFFINITY_ATTRIBUTION=0` none does, as Claude Code sends them with
//! `CLAUDE_CODE_ATTRIBUTION_HEADER=0`) and `AFFINITY_MODEL` (another GGUF file) change the run;
//! `AFFINITY_WORKER_LOG` is the workers' log level (`warn` by default).

#[path = "../relay/llama.rs"]
mod llama;
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
/// The realstack's server and model (`AFFINITY_MODEL` another model for every phase alike, e.g.
/// a bigger random one whose prompt evaluation costs per token what a real model's does:
/// `make_tiny_gguf.py --n-embd 256 --n-layer 4`).
fn realstack() -> Option<(PathBuf, PathBuf)> {
    llama::realstack(std::env::var_os("AFFINITY_MODEL").map(PathBuf::from))
}

/// `slower`: make this server the slower box of an unequal pair (`AFFINITY_SLOW_ARGS`).
async fn start_llama(
    client: &reqwest::Client,
    server: &Path,
    model: &Path,
    slower: bool,
) -> (ChildProcess, u16) {
    // Each slot gets a third of the context: a 2,000-token system prompt and the turns.
    let mut args: Vec<String> = ["-c", "16384", "-n", &ANSWER_TOKENS.to_string(), "-t", "1"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.extend([
        "-np".to_string(),
        SLOTS.to_string(),
        "--no-webui".to_string(),
    ]);
    // More of llama-server's own settings for every phase alike, e.g. `--cache-ram 0`.
    if let Ok(extra) = std::env::var("AFFINITY_LLAMA_ARGS") {
        args.extend(extra.split_whitespace().map(str::to_string));
    }
    // Boxes of unequal speed: more arguments for the second server only, e.g. `-ub 16 -b 16`
    // (smaller batches evaluate prompts several times slower).
    if let (true, Ok(extra)) = (slower, std::env::var("AFFINITY_SLOW_ARGS")) {
        args.extend(extra.split_whitespace().map(str::to_string));
    }
    llama::start_llama(client, (server, model), MODEL, &args).await
}

fn start_proxy(affinity: bool, cost: bool, data: &std::path::Path) -> (ChildProcess, u16) {
    // Claude Code's small model is the tiny one too (side requests ask for it).
    let config = data.join("proxy.toml");
    std::fs::write(
        &config,
        format!("[proxy.aliases]\n\"claude-haiku-*\" = \"{MODEL}\"\n"),
    )
    .expect("the proxy's config");
    let mut command = Command::new(modelrelay_binary());
    command.arg("--config").arg(&config);
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--worker-secret",
            SECRET,
        ])
        .args(["--affinity", if affinity { "true" } else { "false" }])
        .args(["--cost-routing", if cost { "true" } else { "false" }])
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
        .env(
            "LOG_LEVEL",
            std::env::var("AFFINITY_WORKER_LOG").unwrap_or_else(|_| "warn".to_string()),
        )
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
    session: Option<&str>,
) -> (String, Turn) {
    let body = json!({
        "model": MODEL,
        "messages": messages,
        "max_tokens": ANSWER_TOKENS,
        "stream": true,
        "temperature": 0,
    });
    let body = if messages_api() {
        anthropic(body)
    } else {
        body
    };
    let started = Instant::now();
    let mut request = client.post(url).header("anthropic-version", "2023-06-01");
    if let Some(session) = session {
        request = request.header("x-claude-code-session-id", session);
    }
    let mut response = request
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("the turn was sent");
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        panic!("turn {index} got status {status}: {body}");
    }
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
            let piece = event["choices"][0]["delta"]["content"]
                .as_str()
                .or(event["delta"]["text"].as_str());
            if let Some(piece) = piece {
                if ttft.is_none() {
                    ttft = Some(started.elapsed());
                }
                text.push_str(piece);
            }
            if event["timings"].is_object() {
                timings = event["timings"].clone();
            }
            // Anthropic's stream: llama-server's own says the prompt's tokens evaluated and
            // taken from the cache in `message_start`, the answer's in `message_delta`.
            let usage = &event["message"]["usage"];
            if event["type"] == "message_start" && usage.is_object() {
                timings["prompt_n"] = usage["input_tokens"].clone();
                timings["cache_n"] = usage["cache_read_input_tokens"].clone();
            }
            if event["type"] == "message_delta" {
                let usage = &event["usage"];
                timings["predicted_n"] = usage["output_tokens"].clone();
                // A translated stream (the relay's own events) says its input in the end.
                if usage["input_tokens"].is_u64() {
                    timings["prompt_n"] = usage["input_tokens"].clone();
                    timings["cache_n"] = usage["cache_read_input_tokens"].clone();
                }
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

/// `AFFINITY_API=messages`: requests on Anthropic's `/v1/messages` (see the module).
fn messages_api() -> bool {
    std::env::var("AFFINITY_API").is_ok_and(|v| v == "messages")
}

/// The chat-completions `body` as Anthropic's Messages API takes it: the system message as
/// `system`, the rest as they are.
fn anthropic(mut body: Value) -> Value {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let (system, rest): (Vec<Value>, Vec<Value>) =
        messages.into_iter().partition(|m| m["role"] == "system");
    if let Some(system) = system.first() {
        body["system"] = system["content"].clone();
    }
    body["messages"] = Value::Array(rest);
    body
}

async fn conversation(
    client: reqwest::Client,
    url: String,
    system: String,
    turns: usize,
    seed: u64,
) -> Vec<Turn> {
    let mut rng = Rng(seed | 1);
    let mut messages =
        vec![json!({"role": "system", "content": claude_code_system(&system, false)})];
    let mut out: Vec<Turn> = Vec::new();
    // Staggered starts, as real sessions begin.
    tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
    let session = (side_requests() || subagents()).then(|| format!("session-{seed}"));
    for index in 1..=turns {
        if let (true, Some(session)) = (subagents() && index % 3 == 0, session.as_deref()) {
            subagent(&client, &url, session, &mut rng, (seed, index)).await;
        }
        let question = format!(
            "Turn {index} of conversation {seed}: {}",
            words(&mut rng, 60)
        );
        messages.push(json!({"role": "user", "content": question}));
        let main = turn(&client, &url, &messages, index, session.as_deref());
        let ((answer, mut measured), ()) = match session.as_deref() {
            Some(session) if index % 2 == 0 => {
                tokio::join!(main, side_request(&client, &url, session, &question))
            }
            _ => (main.await, ()),
        };
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

/// `AFFINITY_SUBAGENTS=1`: a subagent before every third turn (see the module).
fn subagents() -> bool {
    let on = std::env::var("AFFINITY_SUBAGENTS").is_ok_and(|v| v == "1");
    assert!(
        !on || messages_api(),
        "AFFINITY_SUBAGENTS=1 needs AFFINITY_API=messages: Claude Code's subagents speak Anthropic's API"
    );
    on
}

/// A system prompt as Claude Code sends one with `AFFINITY_SUBAGENTS=1`: its billing line first
/// (`cc_is_subagent=true` in a subagent's), then `prompt`; otherwise (or with
/// `AFFINITY_ATTRIBUTION=0`) `prompt` alone.
fn claude_code_system(prompt: &str, subagent: bool) -> Value {
    let attributed = std::env::var("AFFINITY_ATTRIBUTION").map_or(true, |v| v != "0");
    if !subagents() || !attributed {
        return json!(prompt);
    }
    let marker = if subagent {
        " cc_is_subagent=true;"
    } else {
        ""
    };
    json!([
        {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=cli;{marker}")},
        {"type": "text", "text": prompt},
    ])
}

/// A subagent of conversation `seed`, before its turn `index`: three turns of a conversation of
/// its own on the main model (a search, its tool results, a report), under the session header.
async fn subagent(
    client: &reqwest::Client,
    url: &str,
    session: &str,
    rng: &mut Rng,
    (seed, index): (u64, usize),
) {
    let prompt = format!(
        "You are a search agent of conversation {seed}. {}",
        words(rng, 400)
    );
    let mut messages = vec![
        json!({"role": "system", "content": claude_code_system(&prompt, true)}),
        json!({"role": "user", "content": format!("Task before turn {index}: {}", words(rng, 40))}),
    ];
    for step in 1..=3 {
        let (answer, _) = turn(client, url, &messages, step, Some(session)).await;
        messages.push(json!({"role": "assistant", "content": answer}));
        messages
            .push(json!({"role": "user", "content": format!("Tool result: {}", words(rng, 40))}));
    }
}

/// `AFFINITY_SIDE_REQUESTS=1`: side requests beside the turns (see the module).
fn side_requests() -> bool {
    std::env::var("AFFINITY_SIDE_REQUESTS").is_ok_and(|v| v == "1")
}

/// A side request of a conversation, as Claude Code sends one (a title for the latest message):
/// its small model, the conversation's session header, a short prompt of its own.
async fn side_request(client: &reqwest::Client, url: &str, session: &str, question: &str) {
    let body = json!({
        "model": "claude-haiku-4-5",
        "messages": [
            {"role": "system", "content": "Write a title of at most five words for the message."},
            {"role": "user", "content": question},
        ],
        "max_tokens": 8,
        "temperature": 0,
    });
    let body = if messages_api() {
        anthropic(body)
    } else {
        body
    };
    let response = client
        .post(url)
        .header("x-claude-code-session-id", session)
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("the side request was sent");
    let status = response.status();
    assert!(status.is_success(), "a side request got {status}");
    let _ = response.bytes().await;
}

/// What the proxy's `/metrics` counted of its affinity placements in a phase.
#[derive(Debug, Clone, Copy, Default)]
struct Placements {
    hit: u64,
    miss: u64,
    new: u64,
}

impl Placements {
    /// The `modelrelay_affinity_placements_total{outcome="…"}` lines of a `/metrics` page.
    fn from_metrics(page: &str) -> Self {
        let mut counted = Placements::default();
        for line in page.lines() {
            let Some(rest) = line.strip_prefix("modelrelay_affinity_placements_total{outcome=\"")
            else {
                continue;
            };
            let Some((outcome, value)) = rest.split_once("\"}") else {
                continue;
            };
            let value = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
            match outcome {
                "hit" => counted.hit += value,
                "miss" => counted.miss += value,
                "new" => counted.new += value,
                _ => {}
            }
        }
        counted
    }

    fn add(&mut self, other: Placements) {
        self.hit += other.hit;
        self.miss += other.miss;
        self.new += other.new;
    }
}

/// One phase's turns 2+, pooled over the seeds run.
#[derive(Default)]
struct Pooled {
    later: Vec<Turn>,
    placements: Placements,
    /// Mean prompt evaluation per seed, in the seeds' order, to show how far one run strays
    /// from the pool.
    per_seed_prompt_ms: Vec<f64>,
}

impl Pooled {
    fn add(&mut self, run: PhaseRun) {
        self.per_seed_prompt_ms
            .push(mean(&run.later, |t| t.prompt_ms));
        self.later.extend(run.later);
        self.placements.add(run.placements);
    }

    /// Turns 2+ that evaluated their history again.
    fn history_misses(&self) -> usize {
        self.later
            .iter()
            .filter(|t| t.history_reevaluated > TEMPLATE_SLACK)
            .count()
    }

    fn cached_share(&self) -> f64 {
        let cached: u64 = self.later.iter().map(|t| t.cache_n).sum();
        let evaluated: u64 = self.later.iter().map(|t| t.prompt_n).sum();
        cached as f64 / (cached + evaluated).max(1) as f64
    }
}

fn mean(turns: &[Turn], of: impl Fn(&Turn) -> f64) -> f64 {
    turns.iter().map(of).sum::<f64>() / turns.len().max(1) as f64
}

/// What one phase of one seed measured.
struct PhaseRun {
    later: Vec<Turn>,
    placements: Placements,
}

/// How one phase routes: the proxy's affinity, the workers' slot hints.
#[derive(Debug, Clone, Copy)]
struct Routing {
    name: &'static str,
    affinity: bool,
    slot_hints: bool,
    /// `--cost-routing`: measured speeds may pick a faster box (issue 29).
    cost: bool,
}

const PHASES: [Routing; 4] = [
    Routing {
        name: "least-loaded (affinity off)",
        affinity: false,
        slot_hints: false,
        cost: false,
    },
    Routing {
        name: "affinity on, slot hints off",
        affinity: true,
        slot_hints: false,
        cost: false,
    },
    Routing {
        name: "affinity on, slot hints on",
        affinity: true,
        slot_hints: true,
        cost: false,
    },
    Routing {
        name: "affinity, slot hints, cost routing",
        affinity: true,
        slot_hints: true,
        cost: true,
    },
];

/// Whose system prompt a conversation carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SystemPrompts {
    /// One prompt for every conversation (one agent or client used by everyone): a turn that
    /// lands in another conversation's slot still finds the system prompt there.
    Shared,
    /// Each conversation its own (different clients, users, projects): a turn that lands in
    /// another conversation's slot finds nothing of its prompt there.
    PerConversation,
}

impl SystemPrompts {
    fn describe(self) -> &'static str {
        match self {
            SystemPrompts::Shared => "one system prompt shared by all conversations",
            SystemPrompts::PerConversation => "a system prompt of its own per conversation",
        }
    }
}

/// What one run of the bench sends.
#[derive(Debug, Clone, Copy)]
struct Workload {
    conversations: u64,
    turns: usize,
    seed: u64,
    prompts: SystemPrompts,
}

/// A system prompt of at least `SYSTEM_TOKENS` tokens (counted by llama-server's `/tokenize`),
/// opening with `title`.
async fn system_prompt(client: &reqwest::Client, port: u16, rng: &mut Rng, title: &str) -> String {
    let mut system = format!("{title}. You are a careful assistant. ");
    loop {
        system.push_str(&words(rng, 200));
        system.push(' ');
        let tokens = client
            .post(format!("http://127.0.0.1:{port}/tokenize"))
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
            return system;
        }
    }
}

async fn phase(
    client: &reqwest::Client,
    stack: &(PathBuf, PathBuf),
    (index, routing): (usize, Routing),
    workload: Workload,
) -> PhaseRun {
    let Workload {
        conversations,
        turns,
        seed,
        prompts,
    } = workload;
    let data =
        std::env::temp_dir().join(format!("modelrelay-affinity-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&data);
    let (_llama_a, port_a) = start_llama(client, &stack.0, &stack.1, false).await;
    let (_llama_b, port_b) = start_llama(client, &stack.0, &stack.1, true).await;
    let (_proxy, proxy_port) = start_proxy(routing.affinity, routing.cost, &data);
    let _worker_a = start_worker(proxy_port, port_a, "box-a", routing.slot_hints, &data);
    let _worker_b = start_worker(proxy_port, port_b, "box-b", routing.slot_hints, &data);
    wait_for_workers(client, proxy_port, 2).await;
    // Each phase has its own system prompts, so the servers' caches start cold for it.
    let mut rng = Rng(seed ^ index as u64 ^ 0x9e37_79b9);
    let shared = system_prompt(client, port_a, &mut rng, &format!("Phase {index}")).await;
    let mut systems = Vec::new();
    for c in 0..conversations {
        systems.push(match prompts {
            SystemPrompts::Shared => shared.clone(),
            SystemPrompts::PerConversation => {
                system_prompt(
                    client,
                    port_a,
                    &mut rng,
                    &format!("Phase {index}, user {c}"),
                )
                .await
            }
        });
    }
    let path = if messages_api() {
        "/v1/messages"
    } else {
        "/v1/chat/completions"
    };
    let url = format!("http://127.0.0.1:{proxy_port}{path}");
    let tasks: Vec<_> = (0..conversations)
        .zip(systems)
        .map(|(c, system)| {
            tokio::spawn(conversation(
                client.clone(),
                url.clone(),
                system,
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
    let _ = std::fs::remove_dir_all(&data);
    PhaseRun {
        later,
        placements: Placements::from_metrics(&metrics),
    }
}

/// `AFFINITY_SYSTEM`: `shared`, `own` or (default) `both`, one table each.
fn system_prompt_workloads() -> Vec<SystemPrompts> {
    match std::env::var("AFFINITY_SYSTEM").as_deref() {
        Ok("shared") => vec![SystemPrompts::Shared],
        Ok("own") => vec![SystemPrompts::PerConversation],
        Ok("both") | Err(_) => vec![SystemPrompts::Shared, SystemPrompts::PerConversation],
        Ok(other) => panic!("AFFINITY_SYSTEM is shared, own or both, not {other:?}"),
    }
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken from the command line.
    let Some(stack) = realstack() else {
        eprintln!("SKIPPED affinity bench: {}", llama::NO_REALSTACK);
        return;
    };
    let client = reqwest::Client::new();
    let conversations = env_or("AFFINITY_CONVERSATIONS", 6);
    let turns = env_or("AFFINITY_TURNS", 6) as usize;
    let seeds = seeds();
    let workloads = system_prompt_workloads();
    // pooled[workload][phase]
    let mut pooled: Vec<Vec<Pooled>> = workloads
        .iter()
        .map(|_| PHASES.iter().map(|_| Pooled::default()).collect())
        .collect();
    for &seed in &seeds {
        for (w, &prompts) in workloads.iter().enumerate() {
            let workload = Workload {
                conversations,
                turns,
                seed,
                prompts,
            };
            for (index, routing) in PHASES.into_iter().enumerate() {
                eprintln!(
                    "{conversations} conversations x {turns} turns, {}, seed {seed}: {}...",
                    prompts.describe(),
                    routing.name
                );
                let run = phase(&client, &stack, (index, routing), workload).await;
                pooled[w][index].add(run);
            }
        }
    }
    for (prompts, phases) in workloads.iter().zip(&pooled) {
        print_table(conversations, turns, &seeds, *prompts, phases);
    }
}

/// `AFFINITY_SEEDS`: the runs to pool, as seeds separated by commas or spaces (default five).
/// One run's least-loaded baseline swings about 2x from seed to seed (how often a conversation
/// happens to change servers), so the verdict is taken on the pool.
fn seeds() -> Vec<u64> {
    let list = std::env::var("AFFINITY_SEEDS").unwrap_or_else(|_| "17,18,19,20,21".into());
    let seeds: Vec<u64> = list
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .unwrap_or_else(|_| panic!("AFFINITY_SEEDS holds numbers, not {s:?}"))
        })
        .collect();
    assert!(!seeds.is_empty(), "AFFINITY_SEEDS names no seed");
    seeds
}

/// The model file's name, for the table's title.
fn model_name() -> String {
    std::env::var("AFFINITY_MODEL")
        .ok()
        .and_then(|path| {
            Path::new(&path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "tiny-random-llama.gguf".into())
}

fn print_table(
    conversations: u64,
    turns: usize,
    seeds: &[u64],
    prompts: SystemPrompts,
    phases: &[Pooled],
) {
    let seed_list = seeds
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "\n{conversations} conversations x {turns} turns, {} (≥{SYSTEM_TOKENS} tokens), \
         2 llama-servers x {SLOTS} slots ({model}, 1 thread), seeds {seed_list} pooled; \
         turns 2+:\n",
        prompts.describe(),
        model = model_name(),
    );
    println!("| routing | turns | prompt tokens from cache | turns that re-evaluated history (tokens) | mean prompt tokens evaluated | mean prompt eval ms | mean TTFT ms | per seed: prompt eval ms | placements hit/miss/new |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|---|");
    for (routing, p) in PHASES.iter().zip(phases) {
        let per_seed = p
            .per_seed_prompt_ms
            .iter()
            .map(|ms| format!("{ms:.1}"))
            .collect::<Vec<_>>()
            .join(" ");
        let placements = if routing.affinity {
            let c = p.placements;
            format!("{}/{}/{}", c.hit, c.miss, c.new)
        } else {
            "-".to_string()
        };
        println!(
            "| {} | {} | {:.1}% | {} ({}) | {:.0} | {:.1} | {:.1} | {per_seed} | {placements} |",
            routing.name,
            p.later.len(),
            p.cached_share() * 100.0,
            p.history_misses(),
            p.later.iter().map(|t| t.history_reevaluated).sum::<u64>(),
            mean(&p.later, |t| t.prompt_n as f64),
            mean(&p.later, |t| t.prompt_ms),
            mean(&p.later, |t| t.ttft_ms),
        );
    }
    let off = &phases[0].later;
    for (routing, on) in PHASES.iter().zip(phases).skip(1) {
        let on = &on.later;
        println!(
            "| off / ({}) | | | | {:.2}x | {:.2}x | {:.2}x | | |",
            routing.name,
            mean(off, |t| t.prompt_n as f64) / mean(on, |t| t.prompt_n as f64).max(0.001),
            mean(off, |t| t.prompt_ms) / mean(on, |t| t.prompt_ms).max(0.001),
            mean(off, |t| t.ttft_ms) / mean(on, |t| t.ttft_ms).max(0.001),
        );
    }
}
