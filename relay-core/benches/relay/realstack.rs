//! The `realstack` scenario: a real llama-server (the tiny random-weight model) as the backend,
//! streamed answers direct and through the relay, alternating one for one so a busy machine
//! slows both sides alike: tokens/s while generating and time to the first token.
//!
//! The server and model are built by `../shared/tools/realstack/setup.sh` into `$REALSTACK`
//! (default `~/.cache/modelrelay-realstack`). Without them the rows say so and the run goes on.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;

use crate::load;
use crate::procs::{start_proxy, start_worker_for, ChildProcess};
use crate::report::Row;

const SCENARIO: &str = "realstack";
const MODEL: &str = "tiny-random";
/// Tokens per answer: long enough that the generation rate, not the first token, dominates.
const TOKENS: u64 = 128;

fn root() -> PathBuf {
    std::env::var_os("REALSTACK")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/modelrelay-realstack"))
        })
        .unwrap_or_else(|| PathBuf::from(".cache/modelrelay-realstack"))
}

fn skipped(reason: String) -> Vec<Row> {
    eprintln!("{SCENARIO}: skipped: {reason}");
    vec![Row {
        scenario: SCENARIO,
        figure: "tokens/s, time to first token",
        direct: None,
        relay: f64::NAN,
        target: format!("skipped: {reason}"),
        met: None,
    }]
}

/// A port the OS says is free now (llama-server does not report the port it bound).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Starts llama-server and waits (bounded) until `/health` answers 200.
async fn start_llama(server: &Path, model: &Path) -> Option<(ChildProcess, u16)> {
    let port = free_port();
    let mut command = Command::new(server);
    command
        .args(["-m", &model.display().to_string()])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "-a", MODEL, "-c", "2048", "-n", "512", "-t", "1", "-np", "1",
        ])
        .arg("--no-webui");
    let llama = ChildProcess::start(command, None);
    let client = load::client(1);
    let url = format!("http://127.0.0.1:{port}/health");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(response) = client.get(&url).send().await {
            if response.status().is_success() {
                return Some((llama, port));
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// One streamed answer: (time to the first SSE event, events, time from the first event to the
/// last), or None on failure.
async fn timed_stream(client: &reqwest::Client, base: &str) -> Option<(Duration, u64, Duration)> {
    let body = json!({"model": MODEL, "stream": true, "max_tokens": TOKENS,
                      "ignore_eos": true, "temperature": 0,
                      "messages": [{"role": "user", "content": "Count to a hundred."}]});
    let sent = Instant::now();
    let response = client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let mut stream = response.bytes_stream();
    let (mut first, mut last, mut events, mut previous) = (None, sent, 0u64, 0u8);
    while let Some(piece) = stream.next().await {
        let piece = piece.ok()?;
        for &b in piece.iter() {
            if b == b'\n' && previous == b'\n' {
                events += 1;
                last = Instant::now();
                first.get_or_insert(last);
            }
            previous = b;
        }
    }
    let first = first?;
    Some((first - sent, events, last - first))
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Direct and relay streams, alternating, for about `duration` each.
pub async fn rows(duration: Duration) -> Vec<Row> {
    let root = root();
    let (server, model) = (
        root.join("bin/llama-server"),
        root.join("models/tiny-random-llama.gguf"),
    );
    if !server.is_file() || !model.is_file() {
        return skipped(format!(
            "no realstack ({} and {} are built by ../shared/tools/realstack/setup.sh)",
            server.display(),
            model.display()
        ));
    }
    let Some((llama, llama_port)) = start_llama(&server, &model).await else {
        return skipped("llama-server did not become healthy within 60 s".to_string());
    };
    let (proxy, proxy_port) = start_proxy(&[]);
    let worker = start_worker_for(MODEL, proxy_port, llama_port, 4);
    crate::procs::wait_for_workers(&load::client(1), proxy_port, 1).await;
    let client = load::client(2);
    let direct = format!("http://127.0.0.1:{llama_port}");
    let relay = format!("http://127.0.0.1:{proxy_port}");
    // Warm both paths (the server's first answer loads caches; the relay's opens connections).
    let _ = timed_stream(&client, &direct).await;
    let _ = timed_stream(&client, &relay).await;
    let (mut ttft, mut rate, mut failed) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()], 0);
    let end = Instant::now() + duration * 2;
    while Instant::now() < end || ttft[1].len() < 3 {
        for (side, base) in [&direct, &relay].into_iter().enumerate() {
            match timed_stream(&client, base).await {
                Some((first, events, rest)) if events > 1 => {
                    ttft[side].push(first.as_secs_f64() * 1000.0);
                    rate[side].push((events - 1) as f64 / rest.as_secs_f64().max(1e-6));
                }
                _ => failed += 1,
            }
        }
        if failed > 10 {
            break;
        }
    }
    eprintln!(
        "{SCENARIO}: {} direct and {} relay answers, {failed} failed",
        ttft[0].len(),
        ttft[1].len()
    );
    drop((worker, proxy, llama));
    let [direct_rate, relay_rate] = rate.each_mut().map(|r| median(r));
    let [direct_ttft, relay_ttft] = ttft.each_mut().map(|t| median(t));
    vec![
        Row {
            scenario: SCENARIO,
            figure: "tokens/s while generating (median answer)",
            direct: Some(direct_rate),
            relay: relay_rate,
            target: "≥ 99% of direct".to_string(),
            met: Some(relay_rate >= 0.99 * direct_rate && failed == 0),
        },
        Row {
            scenario: SCENARIO,
            figure: "time to first token p50 (ms)",
            direct: Some(direct_ttft),
            relay: relay_ttft,
            target: "added ≤ 2 ms".to_string(),
            met: Some(relay_ttft - direct_ttft <= 2.0),
        },
    ]
}
