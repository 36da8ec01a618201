//! Which models a backend has unloaded by itself, as it says, for backends the relay does not
//! manage: llama-server started with `--sleep-idle-seconds` frees its model after that much
//! idleness (`is_sleeping` in `GET /props`, an answer that does not wake it); llama-server's
//! router mode (`--models-dir`, `--models-preset`) loads each model on request and unloads the
//! least recently used beyond `--models-max` (each model's `status` in `GET /v1/models`); and
//! Ollama unloads a model after its keep-alive, five minutes by default (`GET /api/ps` lists the
//! loaded ones, without touching them). Each loads the model again at the next request, which
//! pays the load before its first token and finds no prompt cached.

use super::*;

/// How a backend says which of its models are unloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unloads {
    /// A llama.cpp server that says whether it is asleep: its model, all at once.
    LlamaCppSleep,
    /// A llama.cpp server in router mode: each model's own `status`.
    LlamaCppRouter,
    /// Ollama: each model, after its own keep-alive.
    Ollama,
}

/// How a backend unloads, from its `GET /v1/models` and `GET /props` (each passed only when
/// signed by llama.cpp) and its `GET /api/ps` answers; `None` when none says.
pub(super) fn unloads_of(
    llama_cpp_models: Option<&Value>,
    llama_cpp_props: Option<&Value>,
    ps: Option<&Value>,
) -> Option<Unloads> {
    let routed = |list: &Value| {
        (list["data"].as_array()).is_some_and(|all| all.iter().any(|m| router_status(m).is_some()))
    };
    if llama_cpp_models.is_some_and(routed) {
        return Some(Unloads::LlamaCppRouter);
    }
    if llama_cpp_props.is_some_and(|props| asleep(props).is_some()) {
        return Some(Unloads::LlamaCppSleep);
    }
    ps.filter(|ps| ps["models"].is_array())
        .map(|_| Unloads::Ollama)
}

/// Of `models`, served by the backend at `base_url`, those it has unloaded now; `None` when it
/// did not answer, or not as it says `how`. The time bound is the caller's.
pub async fn unloaded_models(
    client: &reqwest::Client,
    base_url: &str,
    how: Unloads,
    models: &[String],
) -> Option<Vec<String>> {
    let base = normalize_base_url(base_url);
    check_base_url(&base).ok()?;
    match how {
        Unloads::LlamaCppSleep => {
            let answer = get(client, &format!("{base}/props")).await.ok()?;
            let asleep = asleep(&answer.json_ok()?)?;
            Some(if asleep { models.to_vec() } else { Vec::new() })
        }
        Unloads::LlamaCppRouter => {
            let answer = get(client, &format!("{base}/v1/models")).await.ok()?;
            not_loaded(&answer.json_ok()?, models)
        }
        Unloads::Ollama => {
            let answer = get(client, &format!("{base}/api/ps")).await.ok()?;
            not_running(&answer.json_ok()?, models)
        }
    }
}

/// A router-mode llama-server's word on one model of its list: `loaded`, `loading`,
/// `unloaded`, `sleeping`, ...
fn router_status(entry: &Value) -> Option<&str> {
    entry["status"]["value"].as_str()
}

/// Of `models`, those a router-mode llama-server's `/v1/models` lists (by id or alias) as
/// anything but `loaded` (a model it is loading still costs the rest of its load); `None` when
/// it is not such a list. A model it does not list is taken for loaded.
fn not_loaded(list: &Value, models: &[String]) -> Option<Vec<String>> {
    let listed = list["data"].as_array()?;
    let named = |entry: &&Value, model: &str| {
        entry["id"].as_str() == Some(model)
            || (entry["aliases"].as_array()).is_some_and(|a| a.iter().any(|n| n == model))
    };
    let unloaded = |model: &&String| {
        let status = listed
            .iter()
            .find(|e| named(e, model))
            .and_then(router_status);
        status.is_some_and(|status| status != "loaded")
    };
    Some(models.iter().filter(unloaded).cloned().collect())
}

/// `is_sleeping` of a llama-server's `/props`, when it says.
fn asleep(props: &Value) -> Option<bool> {
    props.get("is_sleeping")?.as_bool()
}

/// Of `models`, those an Ollama `/api/ps` answer does not list as running (by `name` or
/// `model`); `None` when it is not such an answer.
fn not_running(ps: &Value, models: &[String]) -> Option<Vec<String>> {
    let running = ps["models"].as_array()?;
    let runs = |model: &String| {
        running.iter().any(|entry| {
            entry["name"].as_str() == Some(model) || entry["model"].as_str() == Some(model)
        })
    };
    Some(models.iter().filter(|m| !runs(m)).cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_llama_server_that_says_whether_it_sleeps_is_watched_and_one_that_does_not_is_not() {
        let awake = json!({"total_slots": 4, "is_sleeping": false});
        assert_eq!(
            unloads_of(None, Some(&awake), None),
            Some(Unloads::LlamaCppSleep)
        );
        assert_eq!(asleep(&json!({"is_sleeping": true})), Some(true));
        // An older llama-server (no such field), or the field as anything but a boolean.
        assert_eq!(
            unloads_of(None, Some(&json!({"total_slots": 4})), None),
            None
        );
        assert_eq!(
            unloads_of(None, Some(&json!({"is_sleeping": "yes"})), None),
            None
        );
        assert_eq!(unloads_of(None, Some(&json!([1, 2])), None), None);
    }

    #[test]
    fn a_router_mode_llama_server_says_each_models_status() {
        let list = json!({"object": "list", "data": [
            {"id": "alpha", "status": {"value": "loaded", "args": []}},
            {"id": "beta", "aliases": ["b"], "status": {"value": "unloaded"}},
            {"id": "gamma", "status": {"value": "loading"}},
            {"id": "delta", "status": {"value": "sleeping"}},
            {"id": "epsilon", "status": "loaded"},
        ]});
        // The router's /props says nothing of sleep; its list is what counts.
        let props = json!({"role": "router", "max_instances": 1});
        assert_eq!(
            unloads_of(Some(&list), Some(&props), None),
            Some(Unloads::LlamaCppRouter)
        );
        let served = names(&["alpha", "b", "gamma", "delta", "epsilon", "unlisted"]);
        assert_eq!(
            not_loaded(&list, &served),
            Some(names(&["b", "gamma", "delta"]))
        );
        // A llama-server serving one model lists no status: not a router.
        let single = json!({"data": [{"id": "m", "owned_by": "llamacpp"}]});
        assert_eq!(unloads_of(Some(&single), None, None), None);
        assert_eq!(not_loaded(&json!({"data": 3}), &served), None);
    }

    #[test]
    fn ollama_lists_its_running_models_and_the_others_are_unloaded() {
        let ps = json!({"models": [
            {"name": "llama3.2:latest", "model": "llama3.2:latest", "size_vram": 1},
            {"model": "qwen3:8b"},
            {"name": 7},
        ]});
        assert_eq!(unloads_of(None, None, Some(&ps)), Some(Unloads::Ollama));
        let served = names(&["llama3.2:latest", "qwen3:8b", "gemma3:4b"]);
        assert_eq!(not_running(&ps, &served), Some(names(&["gemma3:4b"])));
        // Nothing running: all of them unloaded.
        assert_eq!(
            not_running(&json!({"models": []}), &served),
            Some(served.clone())
        );
        // Not an Ollama answer.
        for other in [
            json!({}),
            json!({"models": {}}),
            json!(null),
            json!("models"),
        ] {
            assert_eq!(unloads_of(None, None, Some(&other)), None, "{other}");
            assert_eq!(not_running(&other, &served), None, "{other}");
        }
    }
}
