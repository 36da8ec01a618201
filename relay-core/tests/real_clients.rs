//! Nothing but the URL, with the real things (issue "Nothing but the URL"): the real Claude Code
//! (npm `@anthropic-ai/claude-code`) through the real `modelrelay` to a real llama-server with
//! a tiny real model, set up as the README says — `ANTHROPIC_BASE_URL` and a dummy token, no
//! `ANTHROPIC_MODEL`. Each turn is answered on the first try; later turns of a session reuse the
//! backend's prompt cache, natively and through the translation path (a worker that translates
//! Anthropic Messages into chat completions); a long prompt goes to the worker whose window
//! holds it and one beyond every window is refused at once; count_tokens agrees with what the
//! backend then reports.
//!
//! The stack is built once by `scripts/real-clients.sh` (see `common/realstack.rs`); without
//! it every test here says it is skipped and passes. Cache reuse is read from llama-server's
//! own timings (its log), not from anything the relay reports.

#[path = "common/binary.rs"]
mod binary;
#[path = "common/realstack.rs"]
mod realstack;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use binary::*;
use realstack::Stack;
use serde_json::{json, Value};

/// The model name llama-server reports (`-a`).
const MODEL: &str = "tiny-random";
/// Bound on one Claude Code run: a ~12k-token prompt takes about a second here.
const CLAUDE_BOUND: Duration = Duration::from_secs(120);
/// The relay's default queue timeout: a request that waited for it would have failed.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// A real llama-server on a free loopback port, killed on drop; its log is its timings.
struct LlamaServer {
    child: Child,
    url: String,
    log: PathBuf,
    /// Tasks of its log that are not the test's: the worker's warm-up and slot probe.
    skip: usize,
    slots: u32,
}

impl LlamaServer {
    /// `-c ctx` split over `slots` slots; answers of at most 16 tokens.
    fn start(stack: &Stack, dir: &Path, ctx: u32, slots: u32) -> LlamaServer {
        Self::start_with(stack, dir, ctx, slots, &[])
    }

    /// [`Self::start`], with `extra` arguments.
    fn start_with(stack: &Stack, dir: &Path, ctx: u32, slots: u32, extra: &[&str]) -> LlamaServer {
        let model = stack.model.display().to_string();
        let (ctx, np) = (ctx.to_string(), slots.to_string());
        let mut args = vec!["-m", &model, "-a", MODEL, "-c", &ctx, "-np", &np];
        args.extend(extra);
        Self::launch(stack, dir, slots, &args)
    }

    /// llama-server with `args`, on a port of its own, once it is healthy.
    fn launch(stack: &Stack, dir: &Path, slots: u32, args: &[&str]) -> LlamaServer {
        let port = unused_port();
        let log = dir.join(format!("llama-{port}.log"));
        let file = std::fs::File::create(&log).expect("llama-server log");
        let child = Command::new(&stack.llama_server)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            // Short answers: what Claude Code sends back of one is random tokens (see below).
            .args(["-n", "16", "-t", "1", "--no-webui"])
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start llama-server");
        let server = LlamaServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            skip: 0,
            slots,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !answers_200(&format!("{}/health", server.url)) {
            assert!(
                Instant::now() < deadline,
                "llama-server not healthy: {}",
                server.log_text()
            );
            thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn port(&self) -> u16 {
        self.url.rsplit(':').next().unwrap().parse().unwrap()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every finished task, in order, from llama-server's own timings.
    fn tasks(&self) -> Vec<Task> {
        tasks_in(&self.log_text())
            .into_iter()
            .skip(self.skip)
            .collect()
    }

    /// Waits for the warm-up a relay's worker gives a llama-server when it starts (one task of
    /// 756 prompt tokens with the tiny model's vocabulary, 16 generated) and, on a server of
    /// several slots, the slot probe that follows it (three one-token completions of about a
    /// hundred tokens, so the proxy learns before any request whether side requests go first),
    /// and leaves them out of [`Self::tasks`] from then on.
    fn await_warm_up(&mut self) {
        let tasks = self.tasks_once(1);
        assert_eq!(
            tasks.len(),
            1,
            "one warm-up: {tasks:?}\n{}",
            self.log_text()
        );
        assert!(
            (700..=1100).contains(&tasks[0].computed),
            "a prompt of about a thousand tokens: {tasks:?}"
        );
        self.skip = 1;
        if self.slots < 2 {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let probe = loop {
            let probe = self.tasks();
            if probe.len() >= 3 || Instant::now() >= deadline {
                break probe;
            }
            thread::sleep(Duration::from_millis(20));
        };
        assert!(
            probe.len() == 3 && probe.iter().all(|task| task.prompt <= 200),
            "the slot probe, right after the warm-up: {probe:?}\n{}",
            self.log_text()
        );
        self.skip = 4;
    }

    /// [`Self::tasks`] once `count` have finished: llama-server logs a task's end just after
    /// its answer goes out, so the client may be done a moment before the log is.
    fn tasks_once(&self, count: usize) -> Vec<Task> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let tasks = self.tasks();
            if tasks.len() >= count || Instant::now() >= deadline {
                return tasks;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request as llama-server timed it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Task {
    /// Prompt tokens it computed (not taken from its cache).
    computed: u64,
    /// The prompt's tokens in all.
    prompt: u64,
}

impl Task {
    /// The share of the prompt taken from the cache.
    fn reuse(&self) -> f64 {
        1.0 - self.computed as f64 / self.prompt as f64
    }
}

/// Tasks from llama-server's log lines:
/// `print_timing: id 1 | task 159 | prompt eval time = 27.59 ms / 173 tokens (...)`,
/// `print_timing: id 1 | task 159 |        eval time = 87.63 ms / 58 tokens (...)` and
/// `release: id 1 | task 159 | stop processing: n_tokens = 11940, ...`. The slot then holds the
/// prompt and the answer but the last sampled token, which was never evaluated.
fn tasks_in(log: &str) -> Vec<Task> {
    let number_before = |line: &str, word: &str| -> Option<u64> {
        let head = &line[..line.find(word)?];
        head.split_whitespace().last()?.parse().ok()
    };
    let number_after = |line: &str, word: &str| -> Option<u64> {
        let rest = &line[line.find(word)? + word.len()..];
        rest.trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let (mut tasks, mut computed, mut generated) = (Vec::new(), None, None);
    for line in log.lines() {
        if line.contains("prompt eval time =") {
            computed = number_before(line, "tokens (");
        } else if line.contains("| task") && line.contains(" eval time =") {
            generated = number_before(line, "tokens (");
        } else if line.contains("stop processing: n_tokens =") {
            if let (Some(computed), Some(generated), Some(held)) = (
                computed.take(),
                generated.take(),
                number_after(line, "n_tokens ="),
            ) {
                tasks.push(Task {
                    computed,
                    prompt: held + 1 - generated.max(1),
                });
            }
        }
    }
    tasks
}

#[test]
fn llama_server_timings_are_read_from_its_log() {
    let log = "0.11.736 I slot launch_slot_: id  1 | task 159 | processing task, is_child = 0
0.11.852 I slot print_timing: id  1 | task 159 | prompt eval time =      27.59 ms /   173 tokens (    0.16 ms per token,  6269.71 tokens per second)
0.11.852 I slot print_timing: id  1 | task 159 |        eval time =      87.63 ms /    58 tokens (    1.54 ms per token,   650.45 tokens per second)
0.11.852 I slot print_timing: id  1 | task 159 |       total time =     115.23 ms /   231 tokens
0.11.852 I slot      release: id  1 | task 159 | stop processing: n_tokens = 11940, truncated = 0";
    assert_eq!(
        tasks_in(log),
        vec![Task {
            computed: 173,
            prompt: 11883
        }]
    );
}

/// The real `modelrelay` with zero configuration but its address, finding the llama-servers on
/// `ports` the way it finds them on the well-known ones.
fn zero_config_relay(data: &Path, config: &str, ports: &[u16]) -> (Running, String) {
    relay_serving(data, config, ports, MODEL)
}

/// [`zero_config_relay`], once it serves `model`.
fn relay_serving(data: &Path, config: &str, ports: &[u16], model: &str) -> (Running, String) {
    let config_path = data.join("config.toml");
    std::fs::write(&config_path, config).expect("config");
    let port = unused_port();
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let mut command = modelrelay(data);
    command
        .args(["--config", &config_path.display().to_string()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("HOME", data)
        .env("MODELRELAY_DISCOVERY_PORTS", ports.join(","));
    let running = Running::spawn(command);
    let url = format!("http://127.0.0.1:{port}");
    eventually("the relay serves the real model", &running, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            && model_ids(&url).iter().any(|m| m == model)
    });
    (running, url)
}

/// What one Claude Code run printed (`--output-format json`) and how long it took.
struct ClaudeRun {
    result: Value,
    took: Duration,
}

/// `claude -p PROMPT` (with `--continue` to go on with the last session), set up as the
/// README's client table says: the relay URL and a dummy token, and `env` beside them (nothing
/// more, as a new user would: `ANTHROPIC_MODEL` unset).
fn claude(
    stack: &Stack,
    home: &Path,
    relay: &str,
    prompt: &str,
    continued: bool,
    env: &[(&str, &str)],
) -> ClaudeRun {
    let mut command = Command::new(stack.claude.as_ref().expect("claude installed"));
    command.arg("-p");
    if continued {
        command.arg("--continue");
    }
    command
        .args([prompt, "--output-format", "json"])
        .current_dir(home)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("ANTHROPIC_BASE_URL", relay)
        .env("ANTHROPIC_AUTH_TOKEN", "unused")
        // No update checks, telemetry or other calls out of this offline box.
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1");
    command.envs(env.iter().copied());
    let started = Instant::now();
    let mut running = Running::spawn(command);
    let status = running.wait_exit(CLAUDE_BOUND);
    let took = started.elapsed();
    assert!(
        status.success(),
        "claude -p exited {status}\n{}",
        running.output()
    );
    let result: Value = serde_json::from_str(running.stdout().trim())
        .unwrap_or_else(|e| panic!("claude's JSON ({e}): {}", running.output()));
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(result["subtype"], "success", "{result}");
    ClaudeRun { result, took }
}

/// The ids of the assistant messages Claude Code kept in its session transcripts under `home`.
fn transcript_message_ids(home: &Path) -> Vec<String> {
    let mut ids = Vec::new();
    let mut dirs = vec![home.join(".claude/projects")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                for line in text.lines() {
                    let Ok(record) = serde_json::from_str::<Value>(line) else {
                        continue;
                    };
                    if record["type"] == "assistant" {
                        if let Some(id) = record["message"]["id"].as_str() {
                            ids.push(id.to_string());
                        }
                    }
                }
            }
        }
    }
    ids
}

/// The relay's usage totals, as its owner reads them.
fn usage_totals(relay: &str, data: &Path) -> Value {
    owner_get_json(&format!("{relay}/api/usage"), data)["totals"].clone()
}

/// Waits for the usage records (written in the background) to hold `requests` requests, then
/// checks that none failed: each was answered on the first try.
fn answered_first_try(running: &Running, relay: &str, data: &Path, requests: u64) {
    eventually("the usage records hold every request", running, || {
        usage_totals(relay, data)["requests"].as_u64() >= Some(requests)
    });
    let totals = usage_totals(relay, data);
    assert_eq!(
        (totals["requests"].as_u64(), totals["errors"].as_u64()),
        (Some(requests), Some(0)),
        "one request per turn, none failed, none retried: {totals}"
    );
}

/// Three turns of one Claude Code session through the relay (no `ANTHROPIC_MODEL`; `env` set
/// for Claude Code): each answered on the first try, well before a queue timeout; turns 2 and 3
/// take ≥ 95% of their prompt from llama-server's cache. Returns the transcript's message ids.
fn three_turns_reuse_the_cache(stack: &Stack, config: &str, env: &[(&str, &str)]) -> Vec<String> {
    let dir = TempDir::new("claude-code-real");
    let (data, home) = (dir.path().join("relay"), dir.path().join("home"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let mut llama = LlamaServer::start(stack, dir.path(), 65536, 2);
    let (mut relay, url) = zero_config_relay(&data, config, &[llama.port()]);
    llama.await_warm_up();

    let prompts = ["Say hello.", "Now say it again, louder.", "One more time."];
    for (turn, prompt) in prompts.iter().enumerate() {
        let run = claude(stack, &home, &url, prompt, turn > 0, env);
        assert!(
            run.took < QUEUE_TIMEOUT,
            "turn {}: {:?} — nothing may wait for a queue timeout",
            turn + 1,
            run.took
        );
        assert_eq!(run.result["num_turns"], 1, "{}", run.result);
        answered_first_try(&relay, &url, &data, turn as u64 + 1);
    }
    let tasks = llama.tasks_once(3);
    assert_eq!(tasks.len(), 3, "{tasks:?}\n{}", llama.log_text());
    for (turn, pair) in tasks.windows(2).enumerate() {
        let (previous, task) = (pair[0], pair[1]);
        let cached = task.prompt - task.computed;
        eprintln!(
            "turn {}: {cached} of {} prompt tokens from llama-server's cache ({:.1}%); \
             the previous turn's prompt was {} tokens",
            turn + 2,
            task.prompt,
            100.0 * task.reuse(),
            previous.prompt
        );
        assert!(task.prompt > 5_000, "Claude Code's whole prompt: {task:?}");
        // What Claude Code sends again of the previous turn is its prompt: all of it must come
        // from the cache (the relay's part; in practice every token, less the reminders Claude
        // Code moves from the end of the last message). The rest of a turn is new to the
        // backend whatever the relay does: the previous answer as text (the tiny random model's
        // random tokens re-tokenize into more than it generated; answers are kept short, `-n
        // 16`) and what Claude Code appends per turn (its reminders vary, from about 60 to 1,600
        // tokens here). So the whole prompt's share is printed, not held to a floor: a turn to
        // which Claude Code appended 1,600 tokens took all 11,505 of the previous prompt from the
        // cache and still read under 90%.
        assert!(
            cached as f64 >= 0.95 * previous.prompt as f64,
            "turn {}: {cached} tokens from the cache, the previous prompt was {}: {task:?}",
            turn + 2,
            previous.prompt
        );
    }
    relay.terminate_cleanly();
    transcript_message_ids(&home)
}

#[test]
fn claude_code_with_nothing_but_the_url_answers_every_turn_at_once_from_the_cache() {
    let Some(stack) = realstack::stack(
        "claude_code_with_nothing_but_the_url_answers_every_turn_at_once_from_the_cache",
        true,
    ) else {
        return;
    };
    let ids = three_turns_reuse_the_cache(&stack, "", &[]);
    // The worker pinned the session to a slot, so it translated /v1/messages to chat
    // completions, which carry the hint (llama-server drops `id_slot` from /v1/messages): the
    // ids are the relay's own, not llama-server's (`chatcmpl-…`).
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("msg_")), "{ids:?}");
}

#[test]
fn claude_code_reuses_the_backends_cache_through_the_translation_path() {
    let Some(stack) = realstack::stack(
        "claude_code_reuses_the_backends_cache_through_the_translation_path",
        true,
    ) else {
        return;
    };
    // The worker treats the backend as chat-only: Messages become chat completions.
    let ids = three_turns_reuse_the_cache(&stack, "[worker]\nnative_messages = false\n", &[]);
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(
        ids.iter().all(|id| id.starts_with("msg_")),
        "the translator's ids: {ids:?}"
    );
}

#[test]
fn claude_code_that_takes_the_relay_for_anthropic_still_answers_from_the_cache() {
    let Some(stack) = realstack::stack(
        "claude_code_that_takes_the_relay_for_anthropic_still_answers_from_the_cache",
        true,
    ) else {
        return;
    };
    // Told its base URL is Anthropic's own (as a gateway may tell it), Claude Code opens every
    // system prompt with a billing line that changes with each request: a hash of the request
    // and turn counters. The relay leaves the line out of what the backend sees.
    let ids = three_turns_reuse_the_cache(
        &stack,
        "",
        &[("_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL", "1")],
    );
    assert_eq!(ids.len(), 3, "{ids:?}");
}

#[test]
fn claude_code_without_its_billing_line_answers_from_the_cache_too() {
    let Some(stack) = realstack::stack(
        "claude_code_without_its_billing_line_answers_from_the_cache_too",
        true,
    ) else {
        return;
    };
    // `CLAUDE_CODE_ATTRIBUTION_HEADER=0` leaves the billing line out: the relay then keys each
    // conversation of the session by its own prompt too, and the main conversation's key must
    // stay the same from turn to turn.
    let ids = three_turns_reuse_the_cache(&stack, "", &[("CLAUDE_CODE_ATTRIBUTION_HEADER", "0")]);
    assert_eq!(ids.len(), 3, "{ids:?}");
}

#[test]
fn claude_code_with_anthropic_model_set_answers_too() {
    let Some(stack) = realstack::stack("claude_code_with_anthropic_model_set_answers_too", true)
    else {
        return;
    };
    let dir = TempDir::new("claude-code-model");
    let (data, home) = (dir.path().join("relay"), dir.path().join("home"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let llama = LlamaServer::start(&stack, dir.path(), 65536, 2);
    let (mut relay, url) = zero_config_relay(&data, "", &[llama.port()]);
    let model = [("ANTHROPIC_MODEL", MODEL)];
    let run = claude(&stack, &home, &url, "Say hello.", false, &model);
    assert!(run.took < QUEUE_TIMEOUT, "{:?}", run.took);
    let run = claude(&stack, &home, &url, "Again.", true, &model);
    assert!(run.took < QUEUE_TIMEOUT, "{:?}", run.took);
    answered_first_try(&relay, &url, &data, 2);
    relay.terminate_cleanly();
}

/// A Claude Code-like Anthropic request: a system prompt, tools and a conversation.
fn claude_like_request(words: usize) -> Value {
    let text: String = (0..words).map(|i| format!("word{} ", i % 97)).collect();
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "You are a careful coding assistant. Answer briefly."}],
        "tools": [{
            "name": "read_file",
            "description": "Reads a file of the project.",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
        }],
        "messages": [
            {"role": "user", "content": text},
            {"role": "assistant", "content": "I read it."},
            {"role": "user", "content": "Summarise it in one word."}
        ]
    })
}

/// POST `body` to the relay's `path` as Claude Code does; the status and the JSON answer.
fn post_anthropic(relay: &str, path: &str, body: &Value) -> (u16, Value) {
    let reply = exchange(
        "POST",
        &format!("{relay}{path}"),
        &[
            ("content-type", "application/json"),
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", "unused"),
        ],
        Some(&body.to_string()),
    );
    let value = serde_json::from_str(&reply.body).unwrap_or(Value::Null);
    (reply.status, value)
}

#[test]
fn count_tokens_is_within_two_percent_of_the_prompt_tokens_the_backend_then_reports() {
    let Some(stack) = realstack::stack(
        "count_tokens_is_within_two_percent_of_the_prompt_tokens_the_backend_then_reports",
        false,
    ) else {
        return;
    };
    // Natively (llama-server's own count_tokens) and through the translation path (its
    // template and tokenizer).
    for config in ["", "[worker]\nnative_messages = false\n"] {
        let dir = TempDir::new("count-tokens-real");
        let data = dir.path().join("relay");
        std::fs::create_dir_all(&data).unwrap();
        let llama = LlamaServer::start(&stack, dir.path(), 16384, 1);
        let (mut relay, url) = zero_config_relay(&data, config, &[llama.port()]);
        for words in [40, 1_500] {
            let request = claude_like_request(words);
            let (status, counted) = post_anthropic(&url, "/v1/messages/count_tokens", &request);
            assert_eq!(status, 200, "{counted}");
            assert_eq!(
                counted.get("estimated"),
                None,
                "counted, not estimated: {counted}"
            );
            let counted = counted["input_tokens"].as_u64().expect("input_tokens");
            let (status, answer) = post_anthropic(&url, "/v1/messages", &request);
            assert_eq!(status, 200, "{answer}");
            let usage = &answer["usage"];
            let reported = [
                "input_tokens",
                "cache_read_input_tokens",
                "cache_creation_input_tokens",
            ]
            .iter()
            .filter_map(|field| usage[field].as_u64())
            .sum::<u64>();
            let off = (counted as f64 - reported as f64).abs() / reported as f64;
            eprintln!(
                "count_tokens ({}): {counted} counted, {reported} reported by the backend ({:.2}% off)",
                if config.is_empty() { "native" } else { "translated" },
                100.0 * off
            );
            assert!(
                off <= 0.02,
                "{counted} counted, {reported} reported: {usage}"
            );
        }
        relay.terminate_cleanly();
    }
}

#[test]
fn a_long_prompt_goes_to_the_larger_window_and_one_beyond_every_window_is_refused_at_once() {
    let Some(stack) = realstack::stack(
        "a_long_prompt_goes_to_the_larger_window_and_one_beyond_every_window_is_refused_at_once",
        false,
    ) else {
        return;
    };
    let dir = TempDir::new("windows-real");
    let mut small = LlamaServer::start(&stack, dir.path(), 2048, 1);
    let mut large = LlamaServer::start(&stack, dir.path(), 16384, 1);
    let data = dir.path().join("proxy");
    std::fs::create_dir_all(&data).unwrap();
    let secret = "windows-real-worker-secret";
    let port = unused_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut proxy = modelrelay(&data);
    proxy
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--worker-secret", secret]);
    let proxy = Running::spawn(proxy);
    let mut workers = Vec::new();
    for (name, llama) in [("small-box", &small), ("large-box", &large)] {
        let home = dir.path().join(name);
        std::fs::create_dir_all(&home).unwrap();
        let mut worker = modelrelay(&home);
        worker
            .args(["worker", "--proxy-url", &url, "--worker-secret", secret])
            .args(["--backend-url", &llama.url, "--worker-name", name]);
        workers.push(Running::spawn(worker));
    }
    // Both workers report their backends' windows (one slot each: all of -c).
    eventually("both windows are known", &proxy, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() && {
            let status = owner_get_json(&format!("{url}/api/status"), &data);
            let mut windows: Vec<u64> = status["workers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|w| w["context_windows"][MODEL].as_u64())
                .collect();
            windows.sort();
            windows == [2048, 16384]
        }
    });
    // Each worker warmed its llama-server up when it started, and the proxy knows both
    // boxes' speeds before either has answered a request.
    small.await_warm_up();
    large.await_warm_up();
    eventually("both warm-ups reach the proxy", &proxy, || {
        let status = owner_get_json(&format!("{url}/api/status"), &data);
        let measured = status["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|w| {
                w["speeds"][MODEL]["prompt_tps"]
                    .as_f64()
                    .is_some_and(|tps| tps > 0.0)
            })
            .filter(|w| w["speeds"][MODEL]["generation_tps"].as_f64().is_some())
            .count();
        measured == 2
    });

    // About 6k tokens: more than the small window holds, well within the large one.
    let long = claude_like_request(3_000);
    for _ in 0..3 {
        let (status, answer) = post_anthropic(&url, "/v1/messages", &long);
        assert_eq!(status, 200, "{answer}");
    }
    let (on_large, on_small) = (large.tasks_once(3), small.tasks());
    assert!(on_small.is_empty(), "the small box got {on_small:?}");
    assert_eq!(on_large.len(), 3, "{on_large:?}");
    assert!(on_large[0].prompt > 2048, "{on_large:?}");

    // Far beyond every window (~35k tokens by its size): refused by the proxy itself, at once, in the
    // words Claude Code compacts on; no backend sees it.
    let beyond = claude_like_request(20_000);
    let mut took = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let (status, answer) = post_anthropic(&url, "/v1/messages", &beyond);
        took.push(started.elapsed());
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["type"], "error", "{answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("prompt is too long: ")
                && message.contains(" tokens > 16384 maximum"),
            "{message}"
        );
    }
    took.sort();
    let median = took[took.len() / 2];
    eprintln!("a prompt beyond every window refused in {median:?} (median of 5)");
    assert!(median < Duration::from_millis(50), "{took:?}");
    assert_eq!(large.tasks().len(), 3, "no backend saw it");
    assert!(small.tasks().is_empty());
    drop(workers);
}

#[test]
fn the_clock_agrees_with_llama_servers_own_timings() {
    // Backends that say no timings (Ollama, vLLM, LM Studio) are timed by the clock: from the
    // request to the stream's first event, then to its end. Against llama-server, which says
    // both, the clock's speeds must come out no faster, and not far slower.
    let Some(stack) = realstack::stack("the_clock_agrees_with_llama_servers_own_timings", true)
    else {
        return;
    };
    use relay_core::backend::{Backend, BackendEvent, BackendRequest, Capabilities, Speaks};
    let dir = TempDir::new("clocked");
    let llama = LlamaServer::start(&stack, dir.path(), 8192, 1);
    let backend = Backend {
        base_url: llama.url.clone(),
        speaks: Speaks::OpenAi,
        client: reqwest::Client::new().into(),
        capabilities: Capabilities::default(),
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    for (n, words) in [800, 1500, 2000].into_iter().enumerate() {
        let text: String = (0..words)
            .map(|i| format!("w{} ", (i * 7 + n) % 89))
            .collect();
        let body = json!({"model": MODEL, "stream": true, "max_tokens": 16, "temperature": 0,
            "cache_prompt": false, "messages": [{"role": "user", "content": text}]});
        let request = BackendRequest {
            id: format!("clocked-{n}"),
            path: "/v1/chat/completions".into(),
            is_streaming: true,
            body: body.to_string(),
            headers: Default::default(),
            slot: None,
        };
        let answer = runtime.block_on(async {
            let (events, mut received) = tokio::sync::mpsc::channel(64);
            tokio::spawn(backend.clone().serve(request, events));
            let mut last = None;
            while let Some(event) = received.recv().await {
                if let BackendEvent::Complete(answer) = event {
                    last = Some(answer);
                }
            }
            last.expect("an answer")
        });
        let reported = answer
            .timings
            .unwrap_or_else(|| panic!("llama-server's timings: {answer:?}"));
        let clocked = answer.clocked.expect("the clock's");
        let rate = |tokens: u32, ms: f64| f64::from(tokens) * 1000.0 / ms;
        let prompt = rate(clocked.prompt_tokens, clocked.prompt_ms)
            / rate(reported.prompt_tokens, reported.prompt_ms);
        let generation = rate(clocked.generated_tokens, clocked.generation_ms)
            / rate(reported.generated_tokens, reported.generation_ms);
        eprintln!(
            "{} prompt tokens: clock/reported prompt speed {prompt:.2}, generation {generation:.2} \
             ({clocked:?} against {reported:?})",
            clocked.prompt_tokens
        );
        assert_eq!(
            clocked.prompt_tokens, reported.prompt_tokens,
            "nothing cached"
        );
        assert!(
            (0.5..=1.05).contains(&prompt),
            "{clocked:?} against {reported:?}"
        );
        assert!(
            (0.5..=1.1).contains(&generation),
            "{clocked:?} against {reported:?}"
        );
    }
}

/// Milliseconds a short chat completion for `model` took through the relay at `relay`.
fn timed_chat(relay: &str, model: &str) -> f64 {
    let chat = json!({"model": model, "max_tokens": 4,
        "messages": [{"role": "user", "content": "which model answers"}]});
    let started = Instant::now();
    let reply = exchange(
        "POST",
        &format!("{relay}/v1/chat/completions"),
        &[("content-type", "application/json")],
        Some(&chat.to_string()),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    started.elapsed().as_secs_f64() * 1000.0
}

#[test]
fn a_sleeping_llama_server_is_shown_unloaded_and_the_request_that_wakes_it_times_the_load() {
    // llama-server with `--sleep-idle-seconds` frees its model when idle and loads it again at
    // the next request. The worker sees it asleep (`/props`, which does not wake it), tells
    // the proxy, and times the load on the request that wakes it.
    let Some(stack) = realstack::stack(
        "a_sleeping_llama_server_is_shown_unloaded_and_the_request_that_wakes_it_times_the_load",
        false,
    ) else {
        return;
    };
    let dir = TempDir::new("sleeping-real");
    let llama =
        LlamaServer::start_with(&stack, dir.path(), 2048, 1, &["--sleep-idle-seconds", "2"]);
    let config = "[proxy]\nheartbeat_interval_secs = 1\n";
    let (running, relay) = zero_config_relay(dir.path(), config, &[llama.port()]);
    let state = || {
        owner_get_json(&format!("{relay}/api/status"), dir.path())["workers"][0]["model_states"][0]
            .clone()
    };
    eventually("the model is shown unloaded", &running, || {
        state()["state"] == "unloaded"
    });
    assert_eq!(state()["model"], MODEL);
    assert_eq!(state()["load_ms"], Value::Null, "no load seen yet");
    let (waking, awake) = (timed_chat(&relay, MODEL), timed_chat(&relay, MODEL));
    eventually("the load is timed", &running, || {
        state()["load_ms"].is_u64()
    });
    let load = state()["load_ms"].as_f64().unwrap();
    // llama-server's own log: from leaving its sleep to its model initialized.
    let log = llama.log_text();
    // Its lines start `minutes.seconds.milliseconds.microseconds`.
    let at = |line: &str| -> f64 {
        let stamp = line.split_whitespace().next().unwrap_or_default();
        let parts: Vec<f64> = stamp.split('.').filter_map(|p| p.parse().ok()).collect();
        match parts[..] {
            [min, s, ms, us] => min * 60_000.0 + s * 1000.0 + ms + us / 1000.0,
            _ => f64::NAN,
        }
    };
    let woke = log.lines().rfind(|l| l.contains("exiting sleeping state"));
    let ready = log
        .lines()
        .rfind(|l| l.contains("load_model: initializing"));
    let own = woke.zip(ready).map(|(w, r)| at(r) - at(w));
    eprintln!(
        "load timed by the worker {load} ms; the waking request took {waking:.0} ms through \
         the relay, the next {awake:.0} ms; llama-server's log: {own:?} ms from waking to \
         initialized"
    );
    assert!(load < waking, "{load} ms of a {waking:.0} ms request");
    assert!(
        load > (waking - awake) * 0.5,
        "{load} ms against {waking:.0} - {awake:.0} ms"
    );
    if let Some(own) = own {
        assert!(load >= own * 0.8, "{load} ms against the log's {own} ms");
    }
    // Asleep again: shown so, the load kept as its cost.
    eventually("the model is shown unloaded again", &running, || {
        state()["state"] == "unloaded"
    });
    assert_eq!(state()["load_ms"].as_f64(), Some(load));
}

#[test]
fn a_router_mode_llama_server_shows_which_model_it_has_loaded_and_each_load_is_timed() {
    // llama-server's router mode loads each model of its directory at its first request and,
    // past `--models-max`, unloads the one used least recently. Both models here are the tiny
    // one under two names.
    let Some(stack) = realstack::stack(
        "a_router_mode_llama_server_shows_which_model_it_has_loaded_and_each_load_is_timed",
        false,
    ) else {
        return;
    };
    let dir = TempDir::new("router-real");
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    for name in ["alpha", "beta"] {
        std::os::unix::fs::symlink(&stack.model, models.join(format!("{name}.gguf"))).unwrap();
    }
    let models_dir = models.display().to_string();
    let router = LlamaServer::launch(
        &stack,
        dir.path(),
        1,
        &[
            "--models-dir",
            &models_dir,
            "--models-max",
            "1",
            "-c",
            "2048",
            "-np",
            "1",
        ],
    );
    let config = "[proxy]\nheartbeat_interval_secs = 1\n";
    let (running, relay) = relay_serving(dir.path(), config, &[router.port()], "beta");
    // (state, load_ms) of each model, as the dashboard shows them.
    let states = || -> Vec<(String, String, Option<u64>)> {
        let status = owner_get_json(&format!("{relay}/api/status"), dir.path());
        let shown = status["workers"][0]["model_states"].as_array().cloned();
        let state = |s: &Value| {
            let text = |key: &str| s[key].as_str().unwrap_or_default().to_string();
            (text("model"), text("state"), s["load_ms"].as_u64())
        };
        shown.unwrap_or_default().iter().map(state).collect()
    };
    let shows = |alpha: &str, beta: &str| {
        let now = states();
        now.len() == 2 && now[0].1 == alpha && now[1].1 == beta
    };
    eventually("both shown unloaded", &running, || {
        shows("unloaded", "unloaded")
    });
    let timed = |model: &str| timed_chat(&relay, model);
    let (loading, loaded) = (timed("alpha"), timed("alpha"));
    eventually("alpha shown loaded, its load timed", &running, || {
        shows("loaded", "unloaded") && states()[0].2.is_some()
    });
    let alpha = states()[0].2.unwrap() as f64;
    eprintln!(
        "alpha: load timed {alpha} ms; its first request {loading:.0} ms, the next {loaded:.0} ms"
    );
    assert!(alpha < loading && alpha > (loading - loaded) * 0.5);
    // beta's first request loads it, and the router unloads alpha to make room.
    let switching = timed("beta");
    eventually("beta shown loaded, alpha unloaded", &running, || {
        shows("unloaded", "loaded") && states()[1].2.is_some()
    });
    let now = states();
    eprintln!(
        "beta: load timed {:?} ms; its first request {switching:.0} ms",
        now[1].2
    );
    assert_eq!(
        now[0].2,
        Some(alpha as u64),
        "alpha's load is kept as its cost"
    );
    assert!((now[1].2.unwrap() as f64) < switching);
}
