//! Whether a llama-server keeps a pinned slot's prompt: what slot hints rely on.
//!
//! A llama-server with a unified KV cache (`--kv-unified`, which it turns on by itself when
//! `-np` is not given, its default) saves idle slots' prompts to host memory when a new task
//! arrives, clears the slots, and gives a request without `id_slot` the slot and cached prompt
//! that match it best. A request pinned to a slot finds that slot cleared: measured on the
//! affinity bench, 28.9% of turn-2+ prompt tokens came from cache with slot hints against 84%
//! without them (BENCHMARKS.md). So before hinting, the worker asks the server once what it
//! does: a prompt pinned to slot 0, another to slot 1, the first again to slot 0; a server that
//! keeps pinned prompts answers the third from its cache.
//!
//! Three one-token completions of a ~100-token prompt, once per server (and again when its slot
//! count changes): they take slots 0 and 1, whose cached prompts the next turns of the
//! conversations kept there evaluate again.

use serde_json::{json, Value};

/// The most of an answer read (a probe's or a warm-up's is a few hundred bytes).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// What the probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The server kept the pinned prompt: slot hints help it.
    Keeps,
    /// The server cleared the pinned slot: no slot hints for it.
    Clears,
    /// It does not answer `/completion` as llama-server does: hints stay as they were (on).
    Unlike,
    /// No answer in time (a busy server) or no connection: asked again soon, no hints
    /// meanwhile (llama-server's own placement is the safe side).
    NotNow,
}

/// Whether the llama-server at `base` (a URL without the trailing slash) keeps a prompt pinned
/// to a slot while another slot takes a request.
pub async fn keeps_pinned_prompts(client: &reqwest::Client, base: &str) -> Probe {
    let first = prompt("first");
    let steps = [(first.as_str(), 0), (&prompt("second"), 1), (&first, 0)];
    let mut last = None;
    for (text, slot) in steps {
        match complete(client, base, text, slot).await {
            Err(()) => return Probe::NotNow,
            Ok(None) => return Probe::Unlike,
            Ok(Some(answer)) => last = Some(answer),
        }
    }
    let timings = last.as_ref().map(|answer| &answer["timings"]);
    let count = |name: &str| timings.and_then(|t| t[name].as_u64());
    match (count("cache_n"), count("prompt_n")) {
        (Some(cached), Some(evaluated)) if kept(cached, evaluated) => Probe::Keeps,
        (Some(_), Some(_)) => Probe::Clears,
        _ => Probe::Unlike,
    }
}

/// A pinned prompt was kept when at least half of it came from the slot's cache.
pub fn kept(cached: u64, evaluated: u64) -> bool {
    cached > 0 && cached >= evaluated
}

/// A probe prompt of about a hundred tokens, different for each `name`.
fn prompt(name: &str) -> String {
    let words = "slot probe of the relay worker counting tokens in a cached prompt";
    format!("ModelRelay {name} {}", [words; 8].join(" "))
}

/// `POST /completion` of `prompt` pinned to `slot`, one token: its answer; `Ok(None)` when the
/// server has no such endpoint or answers something else than JSON, `Err` when no answer came
/// or the server refused for now.
async fn complete(
    client: &reqwest::Client,
    base: &str,
    prompt: &str,
    slot: u32,
) -> Result<Option<Value>, ()> {
    let body = json!({
        "prompt": prompt,
        "n_predict": 1,
        "id_slot": slot,
        "cache_prompt": true,
        "temperature": 0,
    });
    match post_completion(client, base, &body).await? {
        (200..=299, answer) => Ok(answer),
        // No such endpoint: not llama-server's.
        (404 | 405, _) => Ok(None),
        // Busy (a slot taken, the server loading) or refusing now: asked again later.
        _ => Err(()),
    }
}

/// `POST {base}/completion` of `body` (what the worker asks a llama-server itself: this probe,
/// and its warm-up, [`crate::worker::warm_up`]): the status, and the answer when it is JSON of
/// at most [`MAX_ANSWER_BYTES`]; `Err` when no answer came.
pub(crate) async fn post_completion(
    client: &reqwest::Client,
    base: &str,
    body: &Value,
) -> Result<(u16, Option<Value>), ()> {
    let mut response = client
        .post(format!("{base}/completion"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(|_| ())?;
    let status = response.status().as_u16();
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|_| ())? {
        if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Ok((status, None));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok((status, serde_json::from_slice(&bytes).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_counts_as_kept_when_most_of_it_came_from_the_cache() {
        assert!(kept(96, 1), "all but the last token");
        assert!(kept(50, 50));
        assert!(!kept(0, 97), "evaluated again");
        assert!(!kept(10, 87));
        assert!(!kept(0, 0));
    }

    #[test]
    fn the_probe_prompts_differ_and_are_long_enough_to_tell() {
        assert_ne!(prompt("first"), prompt("second"));
        assert!(prompt("first").split_whitespace().count() > 90);
    }
}
