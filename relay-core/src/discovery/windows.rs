//! How many tokens one request may hold on a backend, as it says itself.

use super::*;

/// The tokens one request may hold on a backend, as it says itself: per model (vLLM's
/// `max_model_len` in `GET /v1/models`), and for every model it serves (llama-server's
/// `default_generation_settings.n_ctx` in `GET /props`: one slot's share of `-c`), and per
/// model from Ollama (see [`ollama_windows`]). Empty when it says nothing (configure
/// `context_window` then). The time bound is the caller's.
pub async fn fetch_context_windows(client: &reqwest::Client, base_url: &str) -> ContextWindows {
    let base = normalize_base_url(base_url);
    let mut windows = ContextWindows::default();
    if check_base_url(&base).is_err() {
        return windows;
    }
    let (models_url, props_url, ps_url) = (
        format!("{base}/v1/models"),
        format!("{base}/props"),
        format!("{base}/api/ps"),
    );
    let (models, props, ps) = tokio::join!(
        get(client, &models_url),
        get(client, &props_url),
        get(client, &ps_url)
    );
    let mut listed = Vec::new();
    let models = models.ok();
    let router_list = models
        .as_ref()
        .filter(|answer| answer.signed_by_llama_cpp())
        .and_then(Reply::json_ok);
    if let Some(list) = models.and_then(|answer| answer.json_ok()) {
        for entry in list["data"].as_array().into_iter().flatten() {
            let Some(id) = entry["id"].as_str() else {
                continue;
            };
            listed.push(id.to_string());
            if let Some(tokens) = window_of(&entry["max_model_len"]) {
                windows.per_model.insert(id.to_string(), tokens);
            }
        }
    }
    // Only Ollama answers `/api/ps` with a `models` list.
    let ps = ps
        .ok()
        .and_then(|a| a.json_ok())
        .filter(|v| v["models"].is_array());
    if let Some(ps) = &ps {
        windows
            .per_model
            .extend(ollama_windows(client, &base, ps, &listed).await);
    }
    let props = props
        .ok()
        .filter(Reply::signed_by_llama_cpp)
        .and_then(|a| a.json_ok());
    if let Some(props) = &props {
        windows.every_model = window_of(&props["default_generation_settings"]["n_ctx"]);
        windows.llama_cpp_slots = slots_of_props(props);
    }
    windows.unloads = super::rest::unloads_of(router_list.as_ref(), props.as_ref(), ps.as_ref());
    windows
}

/// What one `GET /props` says of the server at `base_url`: its slots and context window when
/// it is a llama.cpp server (`Ok(None)`: it answered, and is not one — or is one without
/// slots, as its router mode); `Err` when it did not answer. One request, for the warm-up of a
/// backend the owner named models for (the catalog reads no more of such a backend).
pub async fn llama_cpp_props(
    client: &reqwest::Client,
    base_url: &str,
) -> Result<Option<(u32, Option<u32>)>, ()> {
    let base = normalize_base_url(base_url);
    if check_base_url(&base).is_err() {
        return Ok(None);
    }
    let answer = get(client, &format!("{base}/props"))
        .await
        .map_err(|_| ())?;
    let props = answer.json_ok().filter(|_| answer.signed_by_llama_cpp());
    Ok(props.and_then(|props| {
        let window = window_of(&props["default_generation_settings"]["n_ctx"]);
        Some((slots_of_props(&props)?, window))
    }))
}

/// Most models [`ollama_windows`] asks `/api/show` about: one request each, and a box rarely
/// has more pulled.
pub(super) const MAX_OLLAMA_MODELS_SHOWN: usize = 32;

/// Ollama's windows, per model, best evidence first: a loaded model's `context_length` in
/// `GET /api/ps` (what it runs with now), else the model's own `num_ctx` parameter in
/// `POST /api/show`, else the architecture's `*.context_length` there (the model's maximum;
/// Ollama may run it smaller when `OLLAMA_CONTEXT_LENGTH` says so, and a smaller window then
/// shows once the model is loaded).
pub(super) async fn ollama_windows(
    client: &reqwest::Client,
    base: &str,
    ps: &Value,
    listed: &[String],
) -> std::collections::BTreeMap<String, u32> {
    let mut windows = std::collections::BTreeMap::new();
    for entry in ps["models"].as_array().into_iter().flatten() {
        let name = entry["model"].as_str().or(entry["name"].as_str());
        if let (Some(name), Some(tokens)) = (name, window_of(&entry["context_length"])) {
            windows.insert(name.to_string(), tokens);
        }
    }
    let show_url = format!("{base}/api/show");
    let unknown = listed
        .iter()
        .filter(|name| !windows.contains_key(*name))
        .take(MAX_OLLAMA_MODELS_SHOWN);
    let show_url = &show_url;
    let shown = join_all(unknown.map(|name| async move {
        let body = serde_json::json!({ "model": name });
        let answer = post_json(client, show_url, &body).await.ok()?;
        Some((name.clone(), window_in_ollama_show(&answer.json_ok()?)?))
    }))
    .await;
    windows.extend(shown.into_iter().flatten());
    windows
}

/// The window an Ollama `/api/show` answer names: `num_ctx` among its `parameters` (one
/// `name value` per line), else the architecture's `<arch>.context_length` in `model_info`.
pub(super) fn window_in_ollama_show(show: &Value) -> Option<u32> {
    let num_ctx = show["parameters"].as_str().and_then(|parameters| {
        parameters.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("num_ctx"))
                .then(|| words.next()?.parse::<u64>().ok())
                .flatten()
        })
    });
    if let Some(tokens) = num_ctx.and_then(|n| window_of(&Value::from(n))) {
        return Some(tokens);
    }
    let info = show["model_info"].as_object()?;
    info.iter()
        .filter(|(key, _)| key.ends_with(".context_length"))
        .find_map(|(_, value)| window_of(value))
}

/// A sane context window (1 to 16 Mi tokens) from a JSON number.
pub(super) fn window_of(value: &Value) -> Option<u32> {
    let tokens = value.as_u64()?;
    (1..=16 * 1024 * 1024)
        .contains(&tokens)
        .then_some(tokens as u32)
}

/// What [`fetch_context_windows`] learned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContextWindows {
    /// By model name.
    pub per_model: std::collections::BTreeMap<String, u32>,
    /// For every model of the backend (a llama-server's slot).
    pub every_model: Option<u32>,
    /// The slots of a llama.cpp server (`/props` signed by one): what only it has.
    pub llama_cpp_slots: Option<u32>,
    /// How the backend says which models it unloaded by itself, when it does.
    pub unloads: Option<super::Unloads>,
}

impl ContextWindows {
    /// The window of `model`, if the backend said.
    pub fn of(&self, model: &str) -> Option<u32> {
        self.per_model.get(model).copied().or(self.every_model)
    }
}
