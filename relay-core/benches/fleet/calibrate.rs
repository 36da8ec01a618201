//! `FLEET_CALIBRATE=1`: the simulated box against a real llama-server, request for request.
//!
//! The fleet bench's verdicts rest on how its boxes evaluate prompts that wait together
//! ([`Prefill`]). This mode measures it. It starts the realstack's llama-server (one thread,
//! [`SLOTS`] slots), measures its prompt and generation speed alone, then has each slot send a
//! chain of requests (long prompts and short ones, answers of different lengths, random pauses;
//! `id_slot` pinned, nothing cached) and records each request's time to first and last token.
//! The same chains run through [`sim::replay`] with the measured speeds, once per prefill
//! model, and the report says how far each model's times are from the server's. Two servers:
//! llama-server's default batches, and small ones (`-b 256 -ub 256`), whose prompts take
//! many iterations. `FLEET_CALIBRATE_SEEDS` (default 6) chains are pooled.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::llama;
use crate::sim::{self, BoxSpec, Prefill, Seen, SlotRequest};
use crate::workloads::Rng;

/// Slots of the server (and the simulated box).
const SLOTS: usize = 3;
/// Context per slot: the longest prompt and its answer fit.
const SLOT_CONTEXT: u32 = 8192;
/// Requests per slot in one chain.
const CHAIN: usize = 5;

/// One server setting to calibrate: its name, its extra arguments, its `-b`.
struct Setting {
    name: &'static str,
    args: &'static [&'static str],
    n_batch: u32,
}

const SETTINGS: [Setting; 2] = [
    Setting {
        name: "llama-server's default batches (-b 2048 -ub 512)",
        args: &[],
        n_batch: 2048,
    },
    Setting {
        name: "small batches (-b 256 -ub 256)",
        args: &["-b", "256", "-ub", "256"],
        n_batch: 256,
    },
];

pub fn run() {
    let Some(stack) = llama::realstack(None) else {
        eprintln!("SKIPPED fleet calibration: {}", llama::NO_REALSTACK);
        return;
    };
    let seeds: u64 = std::env::var("FLEET_CALIBRATE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        // A connection per request: llama-server may close a kept-alive one as the next
        // request goes out on it.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("a client");
        for setting in &SETTINGS {
            calibrate(&client, (&stack.0, &stack.1), setting, seeds).await;
        }
    });
}

/// The chains of seed `seed`: per slot, a mix of long prompts (a document, a first turn) and
/// short ones, answers of 4–160 tokens, pauses of 0.05–0.6 s.
fn chains(seed: u64) -> Vec<Vec<SlotRequest>> {
    let mut rng = Rng::new(seed);
    (0..SLOTS)
        .map(|_| {
            (0..CHAIN)
                .map(|i| SlotRequest {
                    after: if i == 0 {
                        rng.uniform(0.0, 0.5)
                    } else {
                        rng.uniform(0.05, 0.6)
                    },
                    prompt: if rng.chance(0.35) {
                        rng.between(1_500, 6_000)
                    } else {
                        rng.between(16, 400)
                    },
                    output: rng.between(4, 160),
                })
                .collect()
        })
        .collect()
}

/// What the server reported of one request, and what its client saw.
struct Measured {
    seen: Seen,
    /// Prompt tokens evaluated per second (`timings.prompt_n` over `prompt_ms`).
    prompt_tps: f64,
    /// Tokens generated per second (`timings.predicted_n` over `predicted_ms`).
    generation_tps: f64,
}

/// Sends one request pinned to `slot`, streamed: `prompt` random tokens (none cached), an
/// answer of exactly `output` tokens.
async fn send(
    client: &reqwest::Client,
    port: u16,
    slot: usize,
    prompt: u32,
    output: u32,
    rng: &mut Rng,
) -> Measured {
    let tokens: Vec<u32> = (0..prompt).map(|_| rng.between(100, 20_000)).collect();
    let body = json!({
        "prompt": tokens,
        "n_predict": output,
        "ignore_eos": true,
        "cache_prompt": false,
        "id_slot": slot,
        "stream": true,
        "temperature": 0,
    });
    let sent = Instant::now();
    let mut response = client
        .post(format!("http://127.0.0.1:{port}/completion"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("the request was sent");
    assert!(
        response.status().is_success(),
        "llama-server answered {}",
        response.status()
    );
    let mut pending = String::new();
    let mut first = None;
    let mut timings = Value::Null;
    while let Some(chunk) = response.chunk().await.expect("the stream") {
        first.get_or_insert_with(|| sent.elapsed());
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            if let Ok(event) = serde_json::from_str::<Value>(data.trim()) {
                if event["timings"].is_object() {
                    timings = event["timings"].clone();
                }
            }
        }
    }
    let last = sent.elapsed();
    let rate = |tokens: &str, ms: &str| {
        let number = |name: &str| {
            timings[name]
                .as_f64()
                .unwrap_or_else(|| panic!("llama-server's last event has no timings.{name}"))
        };
        number(tokens) * 1000.0 / number(ms).max(0.001)
    };
    Measured {
        seen: Seen {
            ttft: first.unwrap_or(last).as_secs_f64(),
            last: last.as_secs_f64(),
        },
        prompt_tps: rate("prompt_n", "prompt_ms"),
        generation_tps: rate("predicted_n", "predicted_ms"),
    }
}

/// The server's speeds: prompt tokens per second over a 4,000-token prompt and tokens
/// generated per second over a 128-token answer, alone (each the mean of three, after a
/// warm-up), and how much each extra sequence slows decoding (every slot answering at once).
async fn speeds(client: &reqwest::Client, port: u16, rng: &mut Rng) -> (f64, f64, f64) {
    send(client, port, 0, 500, 16, rng).await;
    let mut prompt = 0.0;
    let mut generation = 0.0;
    for _ in 0..3 {
        prompt += send(client, port, 0, 4_000, 1, rng).await.prompt_tps / 3.0;
        generation += send(client, port, 0, 16, 128, rng).await.generation_tps / 3.0;
    }
    let together = (0..SLOTS).map(|slot| {
        let client = client.clone();
        let mut rng = Rng::new(rng.between(1, 1_000_000).into());
        tokio::spawn(async move { send(&client, port, slot, 16, 128, &mut rng).await })
    });
    let mut crowded = 0.0;
    for task in together.collect::<Vec<_>>() {
        crowded += task.await.expect("a slot's answer").generation_tps / SLOTS as f64;
    }
    let crowding = (generation / crowded - 1.0) / (SLOTS - 1) as f64;
    (prompt, generation, crowding.max(0.0))
}

/// Runs `chains` on the real server, each slot's requests one after another.
async fn on_server(
    client: &reqwest::Client,
    port: u16,
    chains: &[Vec<SlotRequest>],
    seed: u64,
) -> Vec<Vec<Seen>> {
    let tasks = chains.iter().enumerate().map(|(slot, chain)| {
        let client = client.clone();
        let chain = chain.clone();
        tokio::spawn(async move {
            let mut rng = Rng::new(seed * 31 + slot as u64);
            let mut seen = Vec::new();
            for r in chain {
                tokio::time::sleep(Duration::from_secs_f64(r.after)).await;
                seen.push(
                    send(&client, port, slot, r.prompt, r.output, &mut rng)
                        .await
                        .seen,
                );
            }
            seen
        })
    });
    let mut all = Vec::new();
    for task in tasks.collect::<Vec<_>>() {
        all.push(task.await.expect("a slot's chain"));
    }
    all
}

/// Which requests a report line keeps, by their prompt's tokens.
type PromptFilter = fn(u32) -> bool;

/// Mean of `values`.
fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    sum / n.max(1) as f64
}

async fn calibrate(
    client: &reqwest::Client,
    stack: (&std::path::Path, &std::path::Path),
    setting: &Setting,
    seeds: u64,
) {
    let mut args: Vec<String> = ["-t", "1", "--no-webui", "-np"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.push(SLOTS.to_string());
    args.extend(["-c".to_string(), (SLOT_CONTEXT * SLOTS as u32).to_string()]);
    args.extend(setting.args.iter().map(|a| a.to_string()));
    let (_server, port) = llama::start_llama(client, stack, "tiny-random", &args).await;
    let mut rng = Rng::new(7);
    let (prompt_tps, generation_tps, decode_crowding) = speeds(client, port, &mut rng).await;
    let spec = BoxSpec {
        name: "calibrated",
        prompt_tps,
        generation_tps,
        decode_crowding,
        slots: SLOTS as u32,
        asleep: None,
        ram_cache: None,
        unloads: None,
    };
    // Per request, pooled: its prompt's size, what the server gave, what each model gives.
    let models = [Prefill::Together, Prefill::SlotOrder, Prefill::Batches];
    let mut rows: Vec<(u32, Seen, Vec<Seen>)> = Vec::new();
    for seed in 1..=seeds {
        let chains = chains(seed);
        eprintln!("calibration, {}: seed {seed}...", setting.name);
        let real = on_server(client, port, &chains, seed).await;
        let simulated: Vec<Vec<Vec<Seen>>> = models
            .iter()
            .map(|&m| sim::replay(spec, m, setting.n_batch, &chains))
            .collect();
        for (slot, chain) in chains.iter().enumerate() {
            for (i, r) in chain.iter().enumerate() {
                let per_model = simulated.iter().map(|s| s[slot][i]).collect();
                rows.push((r.prompt, real[slot][i], per_model));
            }
        }
    }
    println!(
        "\n## {}: {SLOTS} slots, 1 thread; alone {prompt_tps:.0} prompt tokens/s, \
         {generation_tps:.0} generated tokens/s, each extra answer slows decoding by \
         {:.0}%; {} requests ({seeds} seeds)\n",
        setting.name,
        decode_crowding * 100.0,
        rows.len()
    );
    println!("| requests | measured TTFT mean | model | simulated TTFT mean | TTFT mean abs error | measured last token mean | simulated last token mean | last token mean abs error |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    let groups: [(&str, PromptFilter); 3] = [
        ("all", |_| true),
        ("short prompts (≤ 400)", |p| p <= 400),
        ("long prompts", |p| p > 400),
    ];
    for (group, keep) in groups {
        let kept: Vec<&(u32, Seen, Vec<Seen>)> = rows.iter().filter(|r| keep(r.0)).collect();
        for (m, model) in models.iter().enumerate() {
            println!(
                "| {group} ({}) | {:.3} | {model:?} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
                kept.len(),
                mean(kept.iter().map(|r| r.1.ttft)),
                mean(kept.iter().map(|r| r.2[m].ttft)),
                mean(kept.iter().map(|r| (r.2[m].ttft - r.1.ttft).abs())),
                mean(kept.iter().map(|r| r.1.last)),
                mean(kept.iter().map(|r| r.2[m].last)),
                mean(kept.iter().map(|r| (r.2[m].last - r.1.last).abs())),
            );
        }
    }
}
