//! Which backend serves which model: built from the model map (models the worker starts on
//! demand), `MODELS` or the backends' own model lists, and rebuilt at each refresh so models that
//! appear or vanish change what the worker advertises.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::slot_pins::SlotPins;
use super::warm_up::WarmUps;
use super::{BackendAccess, Backends, WorkerConfig};
use crate::discovery::{discover, fetch_context_windows, fetch_models, llama_cpp_props};
use crate::protocol::{ContextWindows, WarmUp};

/// Models and where each is served, in advertisement order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    /// Models of the model map: advertised whether loaded or not, and served by the lifecycle
    /// manager even when a backend lists the same name (the map is the user's explicit choice).
    managed: Vec<String>,
    routes: Vec<(String, String)>,
    /// Where requests for models nobody listed go: the first backend the owner configured.
    /// Never a discovered one — "first found" would hand every unknown name to whoever listens
    /// on the lowest well-known port.
    fallback: Option<String>,
    /// The tokens one request may hold, per advertised model, where known.
    windows: ContextWindows,
    /// What the warm-ups of its llama-servers measured ([`super::warm_up`]).
    warm_ups: Vec<WarmUp>,
    /// The models whose llama-server evaluates side requests first ([`SlotPins::sides_first`]).
    sides_first: Vec<String>,
}

/// Where a request for one model goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// A model of the model map: through the lifecycle manager.
    Managed,
    /// A backend, by base URL.
    Backend(&'a str),
}

impl Catalog {
    /// The advertised model names: the mapped ones first.
    pub fn models(&self) -> Vec<String> {
        self.managed
            .iter()
            .cloned()
            .chain(self.routes.iter().map(|(model, _)| model.clone()))
            .collect()
    }

    /// The context windows to report (`None` when none is known).
    pub fn context_windows(&self) -> Option<ContextWindows> {
        (!self.windows.is_empty()).then(|| self.windows.clone())
    }

    /// The warm-ups to report (`None` when none was measured).
    pub fn warm_ups(&self) -> Option<Vec<WarmUp>> {
        (!self.warm_ups.is_empty()).then(|| self.warm_ups.clone())
    }

    /// The models whose side requests are evaluated first, to report (`None` when none is).
    pub fn sides_first(&self) -> Option<Vec<String>> {
        (!self.sides_first.is_empty()).then(|| self.sides_first.clone())
    }

    /// Records the warm-ups measured of `routes` (model, server), and which of those servers
    /// evaluate side requests first; asks each warmed-up server about its slots now rather
    /// than at its first request ([`SlotPins::prepare`]), so the proxy knows before traffic.
    fn warmed_up(
        &mut self,
        warm_ups: &WarmUps,
        slot_pins: &SlotPins,
        client: &reqwest::Client,
        routes: &[(String, String)],
    ) {
        self.warm_ups = warm_ups.measured(routes);
        self.sides_first.clear();
        for (model, url) in routes {
            if self.warm_ups.iter().any(|w| w.model == *model) {
                slot_pins.prepare(client, url);
                if slot_pins.sides_first(url) {
                    self.sides_first.push(model.clone());
                }
            }
        }
    }

    /// Where `model` goes: the model map, the backend listing it, or the first backend.
    pub fn route(&self, model: &str) -> Option<Route<'_>> {
        if self.managed.iter().any(|m| m == model) {
            return Some(Route::Managed);
        }
        self.routes
            .iter()
            .find(|(m, _)| m == model)
            .map(|(_, backend)| backend.as_str())
            .or(self.fallback.as_deref())
            .map(Route::Backend)
    }

    fn add(&mut self, model: String, backend: &str) {
        if self.managed.contains(&model) || self.routes.iter().any(|(m, _)| *m == model) {
            return;
        }
        self.routes.push((model, backend.to_string()));
    }
}

/// How long a backend's context windows are believed before they are asked again: a window
/// changes only when its server restarts with other settings, and asking costs a request (a
/// 404 in the logs of servers that do not have `/props`).
const WINDOWS_KEPT: Duration = Duration::from_secs(600);

/// The context windows learned per backend URL, shared by every catalog refresh of a worker.
#[derive(Debug, Clone, Default)]
pub struct ContextWindowCache(
    Arc<Mutex<HashMap<String, (Instant, crate::discovery::ContextWindows)>>>,
);

impl ContextWindowCache {
    /// `url`'s windows: remembered, or asked for when unknown or stale.
    async fn of(&self, client: &reqwest::Client, url: &str) -> crate::discovery::ContextWindows {
        let now = Instant::now();
        let known = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(url)
            .filter(|(asked, _)| now.duration_since(*asked) < WINDOWS_KEPT)
            .map(|(_, windows)| windows.clone());
        if let Some(windows) = known {
            return windows;
        }
        let windows = fetch_context_windows(client, url).await;
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(url.to_string(), (now, windows.clone()));
        windows
    }
}

/// Reads the current catalog: `managed` (the model map's models) and the backends' models. A
/// backend that cannot be listed contributes no models (it is down or not ready), and the reason
/// is logged once per refresh. The backends that say which models they unloaded by themselves
/// are watched from then on ([`super::resting`]).
pub async fn load(config: &WorkerConfig, access: &BackendAccess, managed: Vec<String>) -> Catalog {
    let (client, windows) = (&access.client, &access.windows);
    let (warm_ups, slot_pins) = (&access.warm_ups, &access.slot_pins);
    let mut catalog = Catalog {
        managed,
        ..Catalog::default()
    };
    let backends: Vec<(String, Option<Vec<String>>)> = match &config.backends {
        Backends::Fixed(urls) => {
            catalog.fallback = urls.first().cloned();
            urls.iter().map(|u| (u.clone(), None)).collect()
        }
        Backends::Discover(options) => discover(options)
            .await
            .into_iter()
            .filter(|found| {
                let usable = found.usable();
                if !usable {
                    tracing::warn!(
                        url = %found.url,
                        owner = ?found.owner,
                        "a model server found on this machine belongs to another user: not used \
                         (confirm it on the dashboard's Setup page to use it)"
                    );
                }
                usable
            })
            .map(|found| (found.url, Some(found.models)))
            .collect(),
    };
    if let Some(models) = &config.models {
        // The owner named the models: each goes to the backend listing it, else to the first
        // (configured or usable) backend.
        let first = backends.first().map(|(url, _)| url.clone());
        for model in models {
            let listing = backends
                .iter()
                .find(|(_, listed)| listed.as_ref().is_some_and(|l| l.contains(model)));
            if let Some(url) = listing.map(|(url, _)| url.clone()).or(first.clone()) {
                catalog.add(model.clone(), &url);
            }
        }
        // A backend that serves one of the named models, and no other: the one its server
        // has loaded, when it is a llama.cpp server (a router-mode one has no slots to say).
        let alone: Vec<(String, String)> = catalog
            .routes
            .iter()
            .filter(|(_, url)| catalog.routes.iter().filter(|(_, u)| u == url).count() == 1)
            .cloned()
            .collect();
        for (model, url) in &alone {
            // One `GET /props`, in the background: named models are advertised without
            // waiting for any backend to answer, and nothing else of the backend is read.
            let (client_, url_) = (client.clone(), url.clone());
            let server = async move { llama_cpp_props(&client_, &url_).await };
            warm_ups.start(client, url, model, server);
        }
        catalog.warmed_up(warm_ups, slot_pins, client, &alone);
        watch_in_background(access, &catalog.routes);
        return catalog;
    }
    let listed = join_all(backends.iter().map(|(url, known)| async move {
        let models = match known {
            Some(models) => Ok(models.clone()),
            None => fetch_models(client, url).await,
        };
        (models, windows.of(client, url).await)
    }))
    .await;
    let mut warmed = Vec::new();
    let mut watched = Vec::new();
    for ((url, _), (models, windows)) in backends.iter().zip(listed) {
        match models {
            Ok(models) => {
                if let Some(how) = windows.unloads {
                    watched.push((url.clone(), how, models.clone()));
                }
                // A llama.cpp server listing one model has it loaded (its router mode lists
                // more, and loads on request): only such a server is warmed up.
                if let ([model], Some(slots)) = (models.as_slice(), windows.llama_cpp_slots) {
                    if !catalog.managed.contains(model) {
                        let server = std::future::ready(Ok(Some((slots, windows.of(model)))));
                        warm_ups.start(client, url, model, server);
                        warmed.push((model.clone(), url.clone()));
                    }
                }
                for model in models {
                    if let Some(tokens) = windows.of(&model).or(config.context_window) {
                        catalog.windows.entry(model.clone()).or_insert(tokens);
                    }
                    catalog.add(model, url);
                }
            }
            Err(error) => tracing::warn!("backend error: could not list models: {error}"),
        }
    }
    // A model another backend listed first is served there, and that backend's speed is
    // another's.
    warmed.retain(|(model, url)| catalog.route(model) == Some(Route::Backend(url)));
    catalog.warmed_up(warm_ups, slot_pins, client, &warmed);
    for (url, _, models) in &mut watched {
        models.retain(|model| catalog.route(model) == Some(Route::Backend(url)));
    }
    access.resting.watch(watched);
    catalog
}

/// Watches the backends the owner's named models go to (`routes`), once their answers, read in
/// the background, say how they unload models by themselves: the named models are advertised
/// without waiting for any backend, and a backend's answers are asked at most every
/// [`WINDOWS_KEPT`] (the cache the other catalog path reads too). An Ollama named with
/// `--models` unloads its model after its keep-alive like any other.
fn watch_in_background(access: &BackendAccess, routes: &[(String, String)]) {
    let mut by_backend: HashMap<String, Vec<String>> = HashMap::new();
    for (model, url) in routes {
        by_backend
            .entry(url.clone())
            .or_default()
            .push(model.clone());
    }
    let (client, windows) = (access.client.clone(), access.windows.clone());
    let resting = access.resting.clone();
    tokio::spawn(async move {
        let looks = by_backend.into_iter().map(|(url, models)| {
            let (client, windows) = (&client, &windows);
            async move {
                let how = windows.of(client, &url).await.unloads?;
                Some((url, how, models))
            }
        });
        resting.watch(join_all(looks).await.into_iter().flatten().collect());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_backend_listing_a_model_serves_it_and_others_fall_back() {
        let mut catalog = Catalog {
            fallback: Some("http://a".to_string()),
            ..Catalog::default()
        };
        catalog.add("m1".to_string(), "http://a");
        catalog.add("m2".to_string(), "http://b");
        catalog.add("m1".to_string(), "http://b");
        assert_eq!(catalog.models(), vec!["m1", "m2"]);
        assert_eq!(catalog.route("m2"), Some(Route::Backend("http://b")));
        assert_eq!(catalog.route("m1"), Some(Route::Backend("http://a")));
        assert_eq!(catalog.route("other"), Some(Route::Backend("http://a")));
    }

    #[test]
    fn mapped_models_are_advertised_first_and_take_precedence_over_backend_routes() {
        let mut catalog = Catalog {
            managed: vec!["mapped".to_string(), "both".to_string()],
            fallback: Some("http://a".to_string()),
            ..Catalog::default()
        };
        catalog.add("both".to_string(), "http://a");
        catalog.add("plain".to_string(), "http://a");
        assert_eq!(catalog.models(), vec!["mapped", "both", "plain"]);
        assert_eq!(catalog.route("mapped"), Some(Route::Managed));
        assert_eq!(catalog.route("both"), Some(Route::Managed));
        assert_eq!(catalog.route("plain"), Some(Route::Backend("http://a")));
        let without_backends = Catalog {
            managed: vec!["mapped".to_string()],
            ..Catalog::default()
        };
        assert_eq!(without_backends.route("other"), None);
    }
}
