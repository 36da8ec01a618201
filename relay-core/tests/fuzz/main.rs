//! Fuzzing of every parser that sees network bytes: the worker protocol's messages, the SSE
//! readers (line reader, event splitter, usage reader, the proxy's `response.completed` watch and
//! stream patcher), the worker's backend client (response heads, chunked bodies), the adapter's
//! request, answer and stream translations in every direction, join codes and the config file. Each target checks that nothing panics and, where there is
//! one, an invariant (a round trip, or no byte lost).
//!
//! The test command runs a fixed number of inputs per target (the same ones every run);
//! `scripts/fuzz.sh` runs each for longer with a random seed. See `engine.rs`.

mod coverage;
mod engine;

use std::path::PathBuf;

use engine::{corpus, fixtures, fuzz, hash, Budget, Rng};
use relay_core::adapter::sse::LineBuffer;
use relay_core::adapter::{
    from_backend_response_with, to_backend_request, BackendApi, ClientApi, Identity,
    StreamTranslator,
};
use relay_core::backend::http::framing::{body_length, parse_head, ChunkedDecoder};
use relay_core::backend::sse::{SseSplitter, UsageTracker};
use relay_core::node::join_code;
use relay_core::protocol::{ServerToWorker, WorkerToServer};
use relay_core::proxy::serving::completed_event::CompletedWatch;
use relay_core::proxy::serving::stream_patch::StreamPatcher;
use relay_core::settings::{parse_file, Overrides, ProxySettings, WorkerSettings};
use serde_json::Value;

/// Inputs per target in the test command.
const RUNS: usize = 2_000;

const BACKENDS: [BackendApi; 2] = [BackendApi::OpenAiChat, BackendApi::AnthropicMessages];
const CLIENTS: [ClientApi; 3] = [
    ClientApi::OpenAiChat,
    ClientApi::AnthropicMessages,
    ClientApi::OpenAiResponses,
];

/// `input` cut into pieces at points derived from it, as a network would deliver it.
fn pieces(input: &[u8]) -> Vec<&[u8]> {
    let mut rng = Rng::new(hash(input));
    let mut out = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let take = (rng.below(48) + 1).min(rest.len());
        let (piece, after) = rest.split_at(take);
        out.push(piece);
        rest = after;
    }
    out
}

fn run(target: &str, extra: &[PathBuf], check: impl Fn(&[u8])) {
    let budget = Budget::from_env(RUNS);
    let seeds = corpus(target, extra);
    let run = fuzz(target, &seeds, &budget, check);
    let guided = match run.regions {
        Some(regions) => format!(
            ", guided: {regions} code regions reached, {} inputs kept",
            run.kept
        ),
        None => String::new(),
    };
    eprintln!(
        "fuzz {target}: {} inputs, no panic (seed {:#x}){guided}",
        run.inputs, budget.seed
    );
}

#[test]
fn fuzz_wire_messages() {
    run("wire", &fixtures("tests/fixtures/wire", ".json"), |input| {
        let text = String::from_utf8_lossy(input);
        if let Ok(message) = WorkerToServer::from_json(&text) {
            let again = WorkerToServer::from_json(&message.to_json()).expect("re-parses");
            assert_eq!(again.to_json(), message.to_json(), "round trip");
        }
        if let Ok(message) = ServerToWorker::from_json(&text) {
            let again = ServerToWorker::from_json(&message.to_json()).expect("re-parses");
            assert_eq!(again.to_json(), message.to_json(), "round trip");
        }
    });
}

#[test]
fn fuzz_sse_readers() {
    let mut extra = fixtures("tests/fixtures/adapter/streams", ".sse");
    extra.extend(fixtures("tests/fixtures/adapter/anthropic_streams", ".sse"));
    extra.extend(fixtures("tests/fixtures/responses", ".sse"));
    run("sse", &extra, |input| {
        // The line reader loses and adds nothing, however the stream is cut.
        let mut lines = LineBuffer::default();
        let mut rebuilt = Vec::new();
        for piece in pieces(input) {
            lines.push_bytes(piece, |content, ending| {
                rebuilt.extend_from_slice(content);
                rebuilt.extend_from_slice(ending);
            });
        }
        lines.finish_bytes(|content, ending| {
            rebuilt.extend_from_slice(content);
            rebuilt.extend_from_slice(ending);
        });
        assert_eq!(rebuilt, input, "the line reader kept every byte");

        // The worker's event splitter passes text through whole (invalid UTF-8 replaced).
        let mut splitter = SseSplitter::default();
        let mut usage = UsageTracker::default();
        let mut out = String::new();
        for piece in pieces(input) {
            if let Some(text) = splitter.push(piece) {
                usage.observe_events(&text);
                out.push_str(&text);
            }
        }
        if let Some(rest) = splitter.finish() {
            out.push_str(&rest);
        }
        if let Ok(text) = std::str::from_utf8(input) {
            assert_eq!(out, text, "the event splitter kept every byte");
        }
        usage.observe_body(input);
        let _ = usage.token_counts();

        // The proxy's Responses watch and patcher.
        let mut watch = CompletedWatch::new(4096);
        let mut patcher = StreamPatcher::new(Some("resp_previous".to_string()));
        let mut patched = Vec::new();
        for piece in pieces(input) {
            let _ = watch.push(piece);
            patched.extend_from_slice(&patcher.push(piece));
        }
        patched.extend_from_slice(&patcher.finish());
        let line_ends = |bytes: &[u8]| bytes.iter().filter(|b| **b == b'\n').count();
        assert_eq!(
            line_ends(&patched),
            line_ends(input),
            "the patcher keeps the lines"
        );
    });
}

#[test]
fn fuzz_adapter_requests_and_answers() {
    run(
        "adapter",
        &fixtures("tests/fixtures/adapter/convert", ".json"),
        |input| {
            let Ok(value) = serde_json::from_slice::<Value>(input) else {
                return;
            };
            // The fixtures wrap a body (`input`) with what is expected of it.
            let bodies = [Some(&value), value.get("input"), value.get("expected")];
            for body in bodies.into_iter().flatten() {
                for backend in BACKENDS {
                    for api in CLIENTS {
                        let _ = to_backend_request(backend, api, body);
                        // The same value as a backend's answer to a plain request.
                        let request =
                            serde_json::json!({"model": "m", "messages": [], "input": "hi"});
                        let _ = from_backend_response_with(
                            backend,
                            api,
                            &request,
                            body,
                            &Identity::minted(0),
                        );
                    }
                }
            }
        },
    );
}

#[test]
fn fuzz_adapter_streams() {
    let mut extra = fixtures("tests/fixtures/adapter/streams", ".sse");
    extra.extend(fixtures("tests/fixtures/adapter/anthropic_streams", ".sse"));
    run("adapter_streams", &extra, |input| {
        let text = String::from_utf8_lossy(input);
        let request = serde_json::json!({"model": "m", "stream": true, "input": "hi"});
        for backend in BACKENDS {
            for api in CLIENTS {
                let mut translator = StreamTranslator::for_backend_with_identity(
                    backend,
                    api,
                    &request,
                    Identity::minted(0),
                );
                for piece in text.split_inclusive(['\n', '}']) {
                    let _ = translator.push(piece);
                }
                let _ = translator.finish();
                let _ = translator.usage();
            }
        }
    });
}

#[test]
fn fuzz_backend_responses() {
    run("backend_http", &[], |input| {
        // A response head, then its body's framing; a chunked body decodes the same whether it
        // arrives whole or in pieces, and never claims more bytes than it was given.
        let Ok(Some(head)) = parse_head(input) else {
            return;
        };
        assert!(head.len <= input.len());
        let _ = body_length(&head);
        let body = &input[head.len..];
        let whole = {
            let mut decoder = ChunkedDecoder::default();
            let mut out = Vec::new();
            decoder
                .decode(body, &mut out)
                .map(|taken| (out, taken, decoder.is_done()))
        };
        let mut decoder = ChunkedDecoder::default();
        let (mut out, mut taken, mut failed) = (Vec::new(), 0, false);
        for piece in pieces(body) {
            match decoder.decode(piece, &mut out) {
                Ok(took) => {
                    assert!(took <= piece.len());
                    taken += took;
                    if took < piece.len() {
                        break;
                    }
                }
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        match whole {
            Ok((whole_out, whole_taken, done)) => {
                assert!(!failed, "the pieces failed where the whole did not");
                assert_eq!(out, whole_out, "the same data");
                assert_eq!(taken, whole_taken, "the same extent");
                assert_eq!(decoder.is_done(), done);
            }
            Err(_) => assert!(failed, "the whole failed where the pieces did not"),
        }
    });
}

#[test]
fn fuzz_join_codes() {
    use base64::Engine;
    run("join_code", &[], |input| {
        // The input as a code, and as the contents a code carries.
        let contents = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(input);
        for code in [
            String::from_utf8_lossy(input).into_owned(),
            format!("mrj1.{contents}"),
        ] {
            if let Ok(details) = join_code::decode(&code) {
                let code = join_code::encode(&details);
                let again = join_code::decode(&code).expect("an encoded code decodes");
                assert_eq!(join_code::encode(&again), code, "round trip");
            }
        }
    });
}

#[test]
fn fuzz_config_file() {
    run("config", &[], |input| {
        let text = String::from_utf8_lossy(input);
        if let Ok(file) = parse_file(&text) {
            let _ = ProxySettings::resolve(&file, &Overrides::default());
            let _ = WorkerSettings::resolve(&file, &Overrides::default());
        }
    });
}

#[test]
fn the_engine_reports_a_panic_and_keeps_the_input() {
    let seeds = vec![b"data: {}\n\n".to_vec()];
    let budget = Budget::from_env(5_000);
    let caught = std::panic::catch_unwind(|| {
        fuzz("engine_self_test", &seeds, &budget, |input| {
            // A stand-in bug: inputs this long "crash" the target.
            assert!(input.len() < 64, "a long input");
        })
    });
    let message = caught
        .expect_err("a mutation that breaks the check is found")
        .downcast::<String>()
        .expect("a message");
    assert!(
        message.contains("fuzz-crashes/engine_self_test-"),
        "{message}"
    );
    let saved = message
        .split_whitespace()
        .find(|w| w.contains("fuzz-crashes/engine_self_test-"))
        .expect("the file is named");
    assert!(std::path::Path::new(saved).exists(), "{saved}");
    let _ = std::fs::remove_file(saved);
}

/// Guidance climbs, one comparison at a time, to a bug behind a four-byte magic that blind
/// mutation of the seed would take billions of inputs to hit. Only in a guided build.
#[cfg(fuzz_coverage)]
#[test]
fn guidance_finds_a_bug_behind_a_magic_value_blind_mutation_does_not_reach() {
    let seeds = vec![b"data: {}\n\n".to_vec()];
    // A fixed budget, not the campaign's time: blind mutation would need about 10^17 inputs.
    let budget = Budget::runs(2_000_000, 0x5eed);
    // From scratch: no inputs an earlier run kept.
    let found = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/fuzz-corpus/engine_guided_self_test");
    let _ = std::fs::remove_dir_all(&found);
    let started = std::time::Instant::now();
    let caught = std::panic::catch_unwind(|| {
        fuzz("engine_guided_self_test", &seeds, &budget, |input| {
            let input = std::hint::black_box(input);
            if input.first() == Some(&b'M') && input.get(1) == Some(&b'R') {
                if input.get(2) == Some(&b'!') {
                    if input.get(3) == Some(&b'?') {
                        panic!("the magic");
                    }
                }
            }
        })
    });
    let message = caught
        .expect_err("the magic is found")
        .downcast::<String>()
        .expect("a message");
    eprintln!(
        "guided self-test: found the magic in {:?}",
        started.elapsed()
    );
    let saved = message
        .split_whitespace()
        .find(|w| w.contains("fuzz-crashes/engine_guided_self_test-"))
        .expect("the file is named");
    let _ = std::fs::remove_file(saved);
    let _ = std::fs::remove_dir_all(found);
}
