//! Models that backends the worker does not manage have unloaded by themselves, and how long
//! loading them again took.
//!
//! A llama-server started with `--sleep-idle-seconds` and Ollama after a model's keep-alive
//! free the model, and load it again at the next request: that request pays the load before its
//! first token, and finds no prompt cached ([`crate::discovery::Unloads`]). The worker asks such
//! backends every few seconds ([`Resting::poll_forever`]) and reports their models in its pongs
//! (`model_states`: `loaded`, or `unloaded` with the time the last load took), as it reports
//! its model map's, and at once in a `models_update` when one changes ([`Resting::changed`]),
//! so the proxy's cost routing weighs the load. The load is measured on the request that found
//! the model unloaded ([`super::clocked::Clocks`]); until one has, the proxy has no load time
//! for the model there, and routes requests it could go to by the usual rules.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::discovery::{unloaded_models, Look, Unloads};
use crate::protocol::ModelStateReport;

/// How often the watched backends are asked. A request in the seconds after a backend unloaded
/// is placed as if the model were loaded; asking costs one small local `GET` (which neither
/// wakes a llama-server nor keeps an Ollama model loaded).
pub const POLL_EVERY: Duration = Duration::from_secs(5);

/// How long one backend's answer may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Ticks an Ollama with none of the worker's models running is left unasked: five minutes at
/// the default tick, as long as its default keep-alive.
const OLLAMA_IDLE_TICKS: u32 = 60;

/// A backend's model, by (base URL, model name).
type Served = (String, String);

/// What the worker knows of its backends' unloaded models; shared by its sessions and its
/// request tasks.
#[derive(Debug, Clone, Default)]
pub struct Resting {
    inner: Arc<Mutex<Inner>>,
    /// Told when a model's state changed ([`Resting::changed`]).
    changes: Arc<tokio::sync::Notify>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The backends that say what they unloaded, by base URL: how, and the models the worker
    /// sends them.
    watched: HashMap<String, (Unloads, Vec<String>)>,
    /// Their models unloaded at the last look (or since a request found them so).
    unloaded: HashSet<Served>,
    /// How long each model's last load took there, in milliseconds.
    loads: HashMap<Served, u64>,
    /// When each backend is asked next ([`Resting::next_ask`]); one not here at the next tick.
    next_ask: HashMap<String, Instant>,
}

impl Resting {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Completes once a watched model was found unloaded or loaded, or a load was measured,
    /// since the last time it completed: the session then tells the proxy at once, not at the
    /// next heartbeat (15 s by default), where a request placed meanwhile would be weighed by
    /// the old state.
    pub async fn changed(&self) {
        self.changes.notified().await;
    }

    /// From the latest catalog: the backends to watch, how each says what it unloaded, and the
    /// models the worker sends each. What is known of anything else is forgotten.
    pub fn watch(&self, backends: Vec<(String, Unloads, Vec<String>)>) {
        let mut inner = self.lock();
        let watched: HashMap<String, (Unloads, Vec<String>)> = backends
            .into_iter()
            .map(|(url, how, models)| (url, (how, models)))
            .collect();
        // Models newly watched (or no longer) change what the proxy is told.
        if watched != inner.watched {
            self.changes.notify_one();
        }
        inner.watched = watched;
        let Inner {
            watched,
            unloaded,
            loads,
            next_ask,
        } = &mut *inner;
        next_ask.retain(|url, _| watched.contains_key(url));
        let served = |(url, model): &Served| {
            watched
                .get(url)
                .is_some_and(|(_, models)| models.contains(model))
        };
        unloaded.retain(served);
        loads.retain(|key, _| served(key));
    }

    /// Whether `model` was unloaded at the backend `url` at the last look. Asked for every
    /// request: nothing is allocated while nothing is unloaded.
    pub fn is_unloaded(&self, url: &str, model: &str) -> bool {
        let inner = self.lock();
        !inner.unloaded.is_empty()
            && inner
                .unloaded
                .contains(&(url.to_string(), model.to_string()))
    }

    /// A request that found `model` unloaded at `url` was answered: it is loaded now, and
    /// loading it took `load_ms` (when that could be told apart from the request's own work).
    pub fn loaded(&self, url: &str, model: &str, load_ms: Option<u64>) {
        let key = (url.to_string(), model.to_string());
        let mut inner = self.lock();
        if !inner
            .watched
            .get(url)
            .is_some_and(|(_, models)| models.contains(&key.1))
        {
            return;
        }
        let mut changed = inner.unloaded.remove(&key);
        // Asked at the next tick: an Ollama says when the model unloads again.
        inner.next_ask.remove(url);
        if let Some(ms) = load_ms {
            changed |= inner.loads.insert(key, ms) != Some(ms);
        }
        drop(inner);
        if changed {
            self.changes.notify_one();
        }
    }

    /// Marks `model` at `url` unloaded, as a look would.
    #[cfg(test)]
    pub(crate) fn mark_unloaded(&self, url: &str, model: &str) {
        self.lock()
            .unloaded
            .insert((url.to_string(), model.to_string()));
    }

    /// The watched models' states, for the pong.
    pub fn states(&self) -> Vec<ModelStateReport> {
        let inner = self.lock();
        let mut states: Vec<ModelStateReport> = inner
            .watched
            .iter()
            .flat_map(|(url, (_, models))| models.iter().map(move |model| (url, model)))
            .map(|(url, model)| {
                let key = (url.clone(), model.clone());
                let state = if inner.unloaded.contains(&key) {
                    "unloaded"
                } else {
                    "loaded"
                };
                ModelStateReport {
                    model: model.clone(),
                    state: state.to_string(),
                    load_ms: inner.loads.get(&key).copied(),
                }
            })
            .collect();
        states.sort_by(|a, b| a.model.cmp(&b.model));
        states
    }

    /// Asks every watched backend that is due which of its models it has unloaded now (see
    /// [`Resting::next_ask`]); one that does not answer keeps what was known of it, and is asked
    /// again at the next tick.
    pub async fn poll(&self, client: &reqwest::Client, every: Duration) {
        let now = Instant::now();
        let due: Vec<(String, Unloads, Vec<String>)> = {
            let inner = self.lock();
            let due = |url: &String| inner.next_ask.get(url).is_none_or(|at| *at <= now);
            (inner.watched.iter())
                .filter(|(url, _)| due(url))
                .map(|(url, (how, models))| (url.clone(), *how, models.clone()))
                .collect()
        };
        let answers =
            futures_util::future::join_all(due.into_iter().map(|(url, how, models)| async move {
                let asked = unloaded_models(client, &url, how, &models);
                let look = tokio::time::timeout(ASK_TIMEOUT, asked)
                    .await
                    .ok()
                    .flatten();
                (url, how, models, look)
            }))
            .await;
        let mut inner = self.lock();
        let mut changed = false;
        for (url, how, models, look) in answers {
            let Some(look) = look else {
                continue;
            };
            let next = Self::next_ask(how, &look, every);
            inner.next_ask.insert(url.clone(), Instant::now() + next);
            for model in models {
                let now_unloaded = look.unloaded.contains(&model);
                let key = (url.clone(), model);
                changed |= if now_unloaded {
                    inner.unloaded.insert(key)
                } else {
                    inner.unloaded.remove(&key)
                };
            }
        }
        drop(inner);
        if changed {
            self.changes.notify_one();
        }
    }

    /// How long until a backend that said `look` is asked again. llama-server logs no request
    /// of its own `/props` and `/v1/models`: every tick. Ollama logs every request, so it is
    /// asked when the first of its running models is due to unload (its `expires_at`, moved on
    /// by every request), else every [`OLLAMA_IDLE_TICKS`] ticks: its models load at a request,
    /// and the worker learns of its own at once ([`Resting::loaded`]).
    fn next_ask(how: Unloads, look: &Look, every: Duration) -> Duration {
        let idle = every * OLLAMA_IDLE_TICKS;
        match how {
            Unloads::LlamaCppSleep | Unloads::LlamaCppRouter => Duration::ZERO,
            Unloads::Ollama => look.first_expiry.map_or(idle, |expiry| {
                (expiry + Duration::from_secs(1)).clamp(every, idle)
            }),
        }
    }

    /// [`Resting::poll`] every `every` in a task of its own, until the returned guard drops
    /// (the worker stops, or its future is dropped).
    pub fn start_polling(&self, client: reqwest::Client, every: Duration) -> Polling {
        Polling(tokio::spawn(self.clone().poll_forever(client, every)))
    }

    async fn poll_forever(self, client: reqwest::Client, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !self.lock().watched.is_empty() {
                self.poll(&client, every).await;
            }
        }
    }
}

/// The polling task of [`Resting::start_polling`]: stopped when dropped.
#[derive(Debug)]
pub struct Polling(tokio::task::JoinHandle<()>);

impl Drop for Polling {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_of(resting: &Resting, model: &str) -> Option<(String, Option<u64>)> {
        resting
            .states()
            .into_iter()
            .find(|s| s.model == model)
            .map(|s| (s.state, s.load_ms))
    }

    #[test]
    fn llama_server_is_asked_every_tick_and_ollama_when_its_first_model_is_due_to_unload() {
        let every = Duration::from_secs(5);
        let look = |first_expiry| Look {
            unloaded: Vec::new(),
            first_expiry,
        };
        let next = |how, first_expiry| Resting::next_ask(how, &look(first_expiry), every);
        assert_eq!(next(Unloads::LlamaCppSleep, None), Duration::ZERO);
        assert_eq!(next(Unloads::LlamaCppRouter, None), Duration::ZERO);
        let secs = Duration::from_secs;
        // A second after its keep-alive ends; never sooner than a tick, never later than five
        // minutes (nothing running, or kept loaded for ever).
        assert_eq!(next(Unloads::Ollama, Some(secs(120))), secs(121));
        assert_eq!(next(Unloads::Ollama, Some(Duration::ZERO)), every);
        assert_eq!(next(Unloads::Ollama, None), secs(300));
        assert_eq!(next(Unloads::Ollama, Some(secs(1_000_000))), secs(300));
    }

    #[test]
    fn the_session_is_told_once_of_each_change_and_of_nothing_else() {
        use futures_util::FutureExt;
        let resting = Resting::default();
        let told = || resting.changed().now_or_never().is_some();
        let watch = |models: &[&str]| {
            let models = models.iter().map(|m| m.to_string()).collect();
            resting.watch(vec![("http://x".into(), Unloads::Ollama, models)]);
        };
        watch(&["a"]);
        assert!(told(), "a model newly watched");
        assert!(!told(), "told once");
        watch(&["a"]);
        assert!(!told(), "the same catalog again");
        resting.mark_unloaded("http://x", "a");
        resting.loaded("http://x", "a", Some(1500));
        assert!(told(), "loaded again, and its load measured");
        resting.loaded("http://x", "a", Some(1500));
        resting.loaded("http://x", "b", Some(9));
        assert!(!told(), "nothing new, or a model not watched");
        watch(&["a", "b"]);
        assert!(told(), "another model watched");
    }

    #[test]
    fn a_model_found_unloaded_reports_its_last_load_and_forgets_what_it_no_longer_serves() {
        let resting = Resting::default();
        let models = vec!["a".to_string(), "b".to_string()];
        resting.watch(vec![("http://x".into(), Unloads::Ollama, models)]);
        assert_eq!(state_of(&resting, "a"), Some(("loaded".into(), None)));
        resting.mark_unloaded("http://x", "a");
        assert!(resting.is_unloaded("http://x", "a"));
        assert!(!resting.is_unloaded("http://x", "b"));
        assert!(!resting.is_unloaded("http://y", "a"));
        assert_eq!(state_of(&resting, "a"), Some(("unloaded".into(), None)));
        // The request that woke it measured the load.
        resting.loaded("http://x", "a", Some(1500));
        assert_eq!(state_of(&resting, "a"), Some(("loaded".into(), Some(1500))));
        // Unloaded again: the last load is kept as its cost.
        resting.mark_unloaded("http://x", "a");
        assert_eq!(
            state_of(&resting, "a"),
            Some(("unloaded".into(), Some(1500)))
        );
        // A model the worker does not send there is not reported, whatever a request said.
        resting.loaded("http://x", "c", Some(9));
        resting.loaded("http://y", "a", Some(9));
        assert_eq!(state_of(&resting, "c"), None);
        assert_eq!(
            state_of(&resting, "a"),
            Some(("unloaded".into(), Some(1500)))
        );
        // The backend no longer serves "a": nothing of it is kept.
        resting.watch(vec![(
            "http://x".into(),
            Unloads::Ollama,
            vec!["b".to_string()],
        )]);
        assert_eq!(state_of(&resting, "a"), None);
        assert!(resting.lock().loads.is_empty() && resting.lock().unloaded.is_empty());
    }
}
