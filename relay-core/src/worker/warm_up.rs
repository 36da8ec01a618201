//! Warm-ups: when the worker starts, each llama-server it serves evaluates a prompt of about a
//! thousand tokens and generates sixteen, alone, and the worker reports what the server's own
//! `timings` said (`register` / `models_update.warm_ups`). A proxy that has never seen the box
//! answer then knows its speed at once: on the fleet bench a proxy's first day on a fast box
//! and one five times slower sent new conversations to the slow box until it had answered, and
//! they stayed there (BENCHMARKS.md, "a warm-up when a worker starts").
//!
//! Only llama-servers (`GET /props` signed `llama.cpp`) serving one model (the one they list,
//! or the one `--models` sends them) are warmed up: their model is loaded already, so the
//! warm-up starts nothing. Models of the model map are never warmed up (that would start a
//! server nobody asked for), nor Ollama's (a request loads the model). Once per server and
//! model for the worker's life; a server that was busy or down is asked again at a later
//! catalog refresh.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::slot_pins::probe::post_completion;

use crate::protocol::{Timings, WarmUp};

/// Words of the warm-up prompt: about a thousand tokens for a llama tokenizer, enough that
/// the time is the server's speed rather than its overhead.
const PROMPT_WORDS: usize = 750;

/// Tokens generated: enough for a generation speed (the proxy wants eight at least).
const GENERATED_TOKENS: u32 = 16;

/// How long one warm-up may take: a thousand tokens on a slow CPU box take half a minute.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(120);

/// A warm-up that got no answer is tried again this long after.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Warm-ups known or under way, per server and model (shared by every catalog refresh), and
/// a count of those measured, which the session watches to report a new one at once.
#[derive(Debug, Clone)]
pub struct WarmUps {
    states: Arc<Mutex<HashMap<(String, String), State>>>,
    measured: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for WarmUps {
    fn default() -> Self {
        WarmUps {
            states: Arc::default(),
            measured: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    Running,
    Measured(Timings),
    /// Not a llama-server, or it answered without timings: never asked again.
    Unlike,
    /// Busy or down: asked again after [`RETRY_AFTER`].
    NotNow(Instant),
}

impl WarmUps {
    /// Starts the warm-up of `model` on the server at `base` in the background, unless it was
    /// done, is under way, or failed a moment ago. `server` says what the server is: its slots
    /// and context window when it is a llama.cpp server (`Ok(None)`: it is not, and is never
    /// warmed up; `Err`: it did not answer, and is asked again later).
    pub fn start<F>(&self, client: &reqwest::Client, base: &str, model: &str, server: F)
    where
        F: std::future::Future<Output = Result<Option<(u32, Option<u32>)>, ()>> + Send + 'static,
    {
        let key = (base.to_string(), model.to_string());
        {
            let mut states = self.lock();
            match states.get(&key) {
                Some(State::Running | State::Measured(_) | State::Unlike) => return,
                Some(State::NotNow(at)) if at.elapsed() < RETRY_AFTER => return,
                _ => {}
            }
            states.insert(key.clone(), State::Running);
        }
        let (states, measured) = (self.states.clone(), self.measured.clone());
        let (client, base) = (client.clone(), base.to_string());
        tokio::spawn(async move {
            let state = match server.await {
                Err(()) => State::NotNow(Instant::now()),
                Ok(None) => State::Unlike,
                Ok(Some((slots, window))) => {
                    let measured = measure(&client, &base, slots, window);
                    tokio::time::timeout(WARM_UP_TIMEOUT, measured)
                        .await
                        .unwrap_or(State::NotNow(Instant::now()))
                }
            };
            if let State::Measured(timings) = state {
                tracing::info!(
                    backend = %base,
                    prompt_tokens = timings.prompt_tokens,
                    prompt_ms = timings.prompt_ms,
                    generated_tokens = timings.generated_tokens,
                    generation_ms = timings.generation_ms,
                    "warm-up measured the backend's speed"
                );
            }
            let done = matches!(state, State::Measured(_));
            states
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, state);
            if done {
                measured.send_modify(|count| *count += 1);
            }
        });
    }

    /// Changes each time a warm-up is measured.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.measured.subscribe()
    }

    /// The warm-ups measured for `routes` (model, server), in the routes' order.
    pub fn measured(&self, routes: &[(String, String)]) -> Vec<WarmUp> {
        let states = self.lock();
        routes
            .iter()
            .filter_map(
                |(model, base)| match states.get(&(base.clone(), model.clone())) {
                    Some(State::Measured(timings)) => Some(WarmUp {
                        model: model.clone(),
                        timings: *timings,
                    }),
                    _ => None,
                },
            )
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), State>> {
        self.states.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One warm-up of the llama.cpp server at `base`: one `/completion`, pinned to the server's
/// last slot. The slot-hint probe ([`super::slot_pins::probe`]) asks whether slot 0 keeps its
/// prompt while slot 1 takes another: a warm-up in slot 0 meanwhile would make it conclude
/// that the server clears pinned slots, and one in the last slot cannot (with one slot there
/// is nothing to hint).
async fn measure(client: &reqwest::Client, base: &str, slots: u32, window: Option<u32>) -> State {
    let body = json!({
        "prompt": prompt(window),
        "n_predict": GENERATED_TOKENS,
        "ignore_eos": true,
        "cache_prompt": false,
        "temperature": 0,
        "id_slot": slots.saturating_sub(1),
    });
    let answer = match post_completion(client, base, &body).await {
        Err(()) => return State::NotNow(Instant::now()),
        Ok((200..=299, answer)) => answer,
        // Loading, or every slot taken: asked again later.
        Ok((429 | 503, _)) => return State::NotNow(Instant::now()),
        // No such endpoint, or a refusal that would be the same again (a window too small).
        Ok((status, _)) => {
            tracing::info!(backend = %base, status, "no warm-up: the server refused it");
            return State::Unlike;
        }
    };
    match answer.and_then(|answer| crate::backend::sse::llama_timings(&answer["timings"])) {
        Some(timings) => State::Measured(timings),
        None => State::Unlike,
    }
}

/// The warm-up prompt: [`PROMPT_WORDS`] words, or fewer where the context window is small (a
/// word is about four thirds of a token; the prompt keeps to half the window).
fn prompt(window: Option<u32>) -> String {
    let words = window.map_or(PROMPT_WORDS, |tokens| {
        PROMPT_WORDS.min(tokens as usize * 3 / 8).max(1)
    });
    let text = "the relay reads this once to learn how fast the server reads a prompt and \
                writes an answer so that requests go where they finish first";
    let vocabulary: Vec<&str> = text.split_whitespace().collect();
    let mut prompt = String::from("ModelRelay warm-up:");
    for word in vocabulary.iter().cycle().take(words) {
        prompt.push(' ');
        prompt.push_str(word);
    }
    prompt
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server whose `/completion` answers with `status` and `body`, and its base URL.
    async fn answering(status: u16, body: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().route(
            "/completion",
            axum::routing::post(move || async move {
                (axum::http::StatusCode::from_u16(status).unwrap(), body)
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        base
    }

    #[tokio::test]
    async fn a_warm_up_is_measured_from_timings_asked_again_when_busy_and_never_when_refused() {
        let client = reqwest::Client::new();
        let timed = r#"{"content":"x","timings":{"prompt_n":1000,"prompt_ms":400.0,"predicted_n":16,"predicted_ms":200.0}}"#;
        let state = |status, body| {
            let client = client.clone();
            async move { measure(&client, &answering(status, body).await, 4, None).await }
        };
        match state(200, timed).await {
            State::Measured(timings) => {
                assert_eq!(
                    (timings.prompt_tokens, timings.generated_tokens),
                    (1000, 16)
                )
            }
            other => panic!("{other:?}"),
        }
        for (status, body) in [(503, ""), (429, "")] {
            assert!(
                matches!(state(status, body).await, State::NotNow(_)),
                "{status}"
            );
        }
        for (status, body) in [
            (200, r#"{"content":"x"}"#),
            (200, "not json"),
            (404, ""),
            (400, ""),
        ] {
            assert!(
                matches!(state(status, body).await, State::Unlike),
                "{status} {body}"
            );
        }
        // Nobody listening: asked again later.
        let gone = measure(&client, "http://127.0.0.1:1", 4, None).await;
        assert!(matches!(gone, State::NotNow(_)));
    }

    #[test]
    fn the_prompt_is_about_a_thousand_tokens_and_keeps_to_half_a_small_window() {
        let words = |window| prompt(window).split_whitespace().count() - 2;
        assert_eq!(words(None), PROMPT_WORDS);
        assert_eq!(words(Some(32_768)), PROMPT_WORDS);
        assert_eq!(words(Some(512)), 192, "3/8 of 512 tokens in words");
        assert_eq!(words(Some(1)), 1);
    }
}
