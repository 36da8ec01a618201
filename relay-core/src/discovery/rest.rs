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

/// What a backend said of its models.
#[derive(Debug, Clone, PartialEq)]
pub struct Look {
    /// Of the models asked about, those it has unloaded now.
    pub unloaded: Vec<String>,
    /// Until the first of those still loaded unloads, where the backend says (Ollama's
    /// `expires_at`; in the past, zero).
    pub first_expiry: Option<std::time::Duration>,
}

/// What the backend at `base_url` says of `models`, which it serves; `None` when it did not
/// answer, or not as it says `how`. The time bound is the caller's.
pub async fn unloaded_models(
    client: &reqwest::Client,
    base_url: &str,
    how: Unloads,
    models: &[String],
) -> Option<Look> {
    let base = normalize_base_url(base_url);
    check_base_url(&base).ok()?;
    let unloaded = |unloaded| Look {
        unloaded,
        first_expiry: None,
    };
    match how {
        Unloads::LlamaCppSleep => {
            let answer = get(client, &format!("{base}/props")).await.ok()?;
            let asleep = asleep(&answer.json_ok()?)?;
            Some(unloaded(if asleep { models.to_vec() } else { Vec::new() }))
        }
        Unloads::LlamaCppRouter => {
            let answer = get(client, &format!("{base}/v1/models")).await.ok()?;
            not_loaded(&answer.json_ok()?, models).map(unloaded)
        }
        Unloads::Ollama => {
            let answer = get(client, &format!("{base}/api/ps")).await.ok()?;
            let ps = answer.json_ok()?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_secs_f64();
            Some(Look {
                unloaded: not_running(&ps, models)?,
                first_expiry: first_expiry(&ps, models, now),
            })
        }
    }
}

/// Seconds until the first of `models` that an Ollama `/api/ps` answer lists unloads (its
/// `expires_at`), from `now` (Unix seconds); zero for one already past.
fn first_expiry(ps: &Value, models: &[String], now: f64) -> Option<std::time::Duration> {
    let running = ps["models"].as_array()?;
    let served = |entry: &&Value| {
        let named = |key: &str| {
            entry[key]
                .as_str()
                .is_some_and(|n| models.iter().any(|m| m == n))
        };
        named("name") || named("model")
    };
    let first = running
        .iter()
        .filter(served)
        .filter_map(|entry| unix_seconds(entry["expires_at"].as_str()?))
        .min_by(f64::total_cmp)?;
    Some(std::time::Duration::from_secs_f64(
        (first - now).clamp(0.0, 1e9),
    ))
}

/// Unix seconds of an RFC 3339 time (`2024-06-04T14:38:31.83753-07:00`, `…Z`), as Ollama
/// writes them; `None` for anything else.
fn unix_seconds(text: &str) -> Option<f64> {
    let (date, time) = text.split_once(['T', 't'])?;
    let mut ymd = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (ymd.next()??, ymd.next()??, ymd.next()??);
    if !(1..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // Past `hh:mm:ss` (a byte offset that may fall inside a character of a bad answer).
    let zone_at = time
        .get(8..)?
        .find(['Z', 'z', '+', '-'])
        .map(|i| i + 8)
        .unwrap_or(time.len());
    let (clock, zone) = time.split_at(zone_at);
    let mut hms = clock.splitn(3, ':');
    let (h, min) = (
        hms.next()?.parse::<i64>().ok()?,
        hms.next()?.parse::<i64>().ok()?,
    );
    let secs: f64 = hms.next()?.parse().ok()?;
    if !(0..24).contains(&h) || !(0..60).contains(&min) || !(0.0..61.0).contains(&secs) {
        return None;
    }
    let offset = match zone {
        "Z" | "z" | "" => 0,
        _ => {
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            let (oh, om) = zone.get(1..)?.split_once(':')?;
            let (oh, om) = (oh.parse::<i64>().ok()?, om.parse::<i64>().ok()?);
            if !(0..24).contains(&oh) || !(0..60).contains(&om) {
                return None;
            }
            sign * (oh * 3600 + om * 60)
        }
    };
    // Days since 1970-01-01 of a proleptic Gregorian date, years counted from March.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some((days * 86_400 + h * 3600 + min * 60 - offset) as f64 + secs)
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
    fn ollama_says_when_its_first_running_model_unloads() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0.0));
        let cases = [
            ("2024-06-04T14:38:31.83753-07:00", 1_717_537_111.837_53),
            ("2026-11-30T09:45:00Z", 1_796_031_900.0),
            ("2000-02-29T23:59:59+05:30", 951_848_999.0),
        ];
        for (text, unix) in cases {
            let seen = unix_seconds(text).unwrap_or(f64::NAN);
            assert!((seen - unix).abs() < 1e-3, "{text}: {seen}");
        }
        for bad in [
            "",
            "2024-06-04",
            "2024-13-04T00:00:00Z",
            "soon",
            "2024-06-04T1:2Z",
        ] {
            assert_eq!(unix_seconds(bad), None, "{bad}");
        }
        // A bad answer's bytes: never a panic, never a time that is not a number.
        let hostile = [
            "2024-06-04T12:00:0é:00Z",
            "2024-06-04T12:00:00+é",
            "99999999999999999-01-01T00:00:00Z",
            "2024-06-04T99999999999999:00:00Z",
            "2024-06-04T12:00:NaNZ",
            "2024-06-04T12:00:infZ",
            "2024-06-04T12:00:00+99999999999:00",
            "-0001-01-01T00:00:00Z",
            "2024-06-04T\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}é",
        ];
        for text in hostile {
            assert_eq!(unix_seconds(text), None, "{text}");
        }
        for len in 0..40 {
            let text: String = "2024-06-04T12:00:00.5+01:00".chars().take(len).collect();
            assert!(unix_seconds(&text).is_none_or(f64::is_finite), "{text}");
        }
        let ps = json!({"models": [
            {"name": "a", "expires_at": "2026-11-30T09:50:00Z"},
            {"name": "b", "expires_at": "2026-11-30T09:46:00Z"},
            {"name": "other", "expires_at": "2026-11-30T09:45:30Z"},
            {"model": "c", "expires_at": "never"},
        ]});
        let served = names(&["a", "b", "c"]);
        let now = 1_796_031_900.0;
        let first = first_expiry(&ps, &served, now);
        assert_eq!(first, Some(std::time::Duration::from_secs(60)));
        // Past: zero; nothing served running: nothing.
        assert_eq!(
            first_expiry(&ps, &served, now + 3600.0),
            Some(std::time::Duration::ZERO)
        );
        assert_eq!(first_expiry(&ps, &names(&["z"]), now), None);
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
