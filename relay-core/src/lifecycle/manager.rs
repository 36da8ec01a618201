//! The lifecycle manager: the worker's one handle on its model servers.
//!
//! `acquire` is the request path: it returns a [`Lease`] on a ready server, starting it first
//! when needed (one start, however many requests wait for it), making room per the policy,
//! restarting it on a session change, and refusing at once while its breaker is open.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::config::LifecycleConfig;
use super::error::LifecycleError;
use super::lease::Lease;
use super::pidfile::{CleanupReport, PidDir};
use super::policy::{self, Admission, Candidate, Limits, SessionAction};
use super::process;
use super::run::{self, Start};
use super::state::{Entry, FreeVram, Inner, ModelStatus, Phase, Table};

/// Starts, stops and supervises the model servers of one worker. Cheap to clone (a handle).
///
/// Dropping every handle does not stop the servers; call [`LifecycleManager::shutdown`]. If the
/// runtime itself goes away, each server's process group is killed as its task is dropped.
#[derive(Clone)]
pub struct LifecycleManager {
    inner: Arc<Inner>,
}

/// What an acquire does next.
enum Step {
    Leased(Lease),
    /// Wait for a change of the table, or until the instant.
    Wait(Option<Instant>),
}

/// What an acquire remembers between looks at the table.
#[derive(Default)]
struct Waiting {
    /// The generation whose start it waits for: if that start fails it gets the error.
    start: Option<u64>,
    /// Since when it waits for room.
    room_since: Option<Instant>,
}

impl LifecycleManager {
    /// A manager for `config`, recording its processes under `data_dir` (created if needed;
    /// the worker passes `paths::data_dir().join("lifecycle")`). Must be called inside a tokio
    /// runtime: it spawns the idle timer task.
    pub fn new(config: LifecycleConfig, data_dir: &Path) -> std::io::Result<Self> {
        let pids = PidDir::open(data_dir)?;
        let entries: BTreeMap<String, Entry> = config
            .models
            .values()
            .map(|spec| (spec.name.clone(), Entry::new(spec.clone())))
            .collect();
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(2))
            .build()
            .map_err(std::io::Error::other)?;
        let inner = Arc::new(Inner {
            config,
            table: Mutex::new(Table {
                entries,
                shutting_down: false,
            }),
            events: watch::channel(0).0,
            pids,
            client,
            free_vram: OnceLock::new(),
        });
        tokio::spawn(run::housekeeper(
            Arc::downgrade(&inner),
            inner.events.subscribe(),
        ));
        Ok(LifecycleManager { inner })
    }

    /// Where free VRAM is read before a start (the worker's hardware sampler). Without it, or
    /// while it knows no GPU, starts are never refused for VRAM. Set once; later calls are
    /// ignored.
    pub fn set_free_vram(&self, probe: FreeVram) {
        let _ = self.inner.free_vram.set(probe);
    }

    /// Refuses a start of `model` that the last VRAM sample says would not fit. Passes whenever
    /// the sample cannot be trusted: no GPU information, or memory in flux (another model
    /// starting or stopping, or one that stopped after the sample was taken).
    fn check_vram(&self, table: &Table, model: &str) -> Result<(), LifecycleError> {
        let Some(probe) = self.inner.free_vram.get() else {
            return Ok(());
        };
        let entry = &table.entries[model];
        let Some((needed_mb, basis)) = policy::vram_needed_mb(entry.file_bytes, entry.spec.vram_mb)
        else {
            return Ok(());
        };
        let Some((free_mb, taken)) = probe() else {
            return Ok(());
        };
        let in_flux = table.entries.values().any(|e| {
            matches!(e.phase, Phase::Starting | Phase::Stopping)
                || e.ended_at.is_some_and(|ended| ended >= taken)
        });
        if in_flux || needed_mb <= free_mb {
            return Ok(());
        }
        Err(LifecycleError::NotEnoughVram {
            model: model.to_string(),
            needed_mb,
            basis,
            free_mb,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LifecycleConfig {
        &self.inner.config
    }

    /// The mapped models (the worker advertises them all, loaded or not).
    pub fn models(&self) -> Vec<String> {
        self.inner.config.model_names()
    }

    /// Whether `model` is in the model map.
    pub fn has_model(&self, model: &str) -> bool {
        self.inner.config.models.contains_key(model)
    }

    /// Whether `model` is ready now: a request for it will not wait for a start (unless a
    /// session change restarts it). The worker uses this to decide on SSE keep-alives.
    pub fn is_ready(&self, model: &str) -> bool {
        let table = self.inner.lock();
        table
            .entries
            .get(model)
            .is_some_and(|e| e.phase == Phase::Ready && !e.restart_pending)
    }

    /// Kills the model servers a previous run of this worker left behind (recorded in the pid
    /// files, owner gone, still the very processes recorded), and only those. Call it once at
    /// startup, before serving.
    pub async fn cleanup_orphans(&self) -> CleanupReport {
        let report = self
            .inner
            .pids
            .cleanup_orphans(self.inner.config.stop_grace)
            .await;
        if !report.killed.is_empty() {
            tracing::warn!(killed = ?report.killed, "stopped model servers left over from a previous run");
        }
        report
    }

    /// A lease on `model`'s ready server, starting it first if needed. `session` is the
    /// request's session id ([`LifecycleConfig::session_id`]); when session restarts are on, a
    /// different one restarts the model once its requests in flight are done.
    ///
    /// Waits as long as the start takes (bounded by the startup timeout) and at most the
    /// startup timeout for room. Dropping the future gives up waiting without disturbing the
    /// start, which other requests may be waiting for.
    pub async fn acquire(
        &self,
        model: &str,
        session: Option<&str>,
    ) -> Result<Lease, LifecycleError> {
        let mut events = self.inner.events.subscribe();
        let mut waiting = Waiting::default();
        loop {
            events.borrow_and_update();
            let until = match self.step(model, session, &mut waiting)? {
                Step::Leased(lease) => return Ok(lease),
                Step::Wait(until) => until,
            };
            let sleep_until = until.map(tokio::time::Instant::from_std);
            tokio::select! {
                changed = events.changed() => if changed.is_err() {
                    return Err(LifecycleError::ShuttingDown);
                },
                _ = tokio::time::sleep_until(sleep_until.unwrap_or_else(tokio::time::Instant::now)), if sleep_until.is_some() => {}
            }
        }
    }

    /// One look at the table: lease, start, make room, or wait.
    fn step(
        &self,
        model: &str,
        session: Option<&str>,
        waiting: &mut Waiting,
    ) -> Result<Step, LifecycleError> {
        let config = &self.inner.config;
        let now = Instant::now();
        let mut table = self.inner.lock();
        if table.shutting_down {
            return Err(LifecycleError::ShuttingDown);
        }
        let entry = table
            .entries
            .get_mut(model)
            .ok_or_else(|| LifecycleError::UnknownModel(model.to_string()))?;
        match entry.phase {
            Phase::Ready => {
                if entry.restart_pending {
                    if entry.in_flight == 0 && entry.begin_stop("session changed") {
                        self.inner.changed();
                    }
                    return Ok(Step::Wait(None));
                }
                let current = entry.session.as_deref();
                match policy::session_action(
                    config.session_restart,
                    current,
                    session,
                    entry.in_flight,
                ) {
                    SessionAction::Proceed => {}
                    SessionAction::Adopt => entry.session = session.map(str::to_string),
                    SessionAction::Restart => {
                        entry.begin_stop("session changed");
                        self.inner.changed();
                        return Ok(Step::Wait(None));
                    }
                    SessionAction::WaitForIdle => {
                        entry.restart_pending = true;
                        self.inner.changed();
                        return Ok(Step::Wait(None));
                    }
                }
                entry.in_flight += 1;
                entry.touch(now);
                // The dashboard shows requests per model (release reports its side too).
                self.inner.changed();
                let port = entry.port.expect("a ready model has a port");
                Ok(Step::Leased(Lease {
                    inner: self.inner.clone(),
                    model: model.to_string(),
                    generation: entry.generation,
                    port,
                    base_url: format!("http://127.0.0.1:{port}"),
                    ended: entry.ended.subscribe(),
                }))
            }
            Phase::Starting => {
                waiting.start = Some(entry.generation);
                Ok(Step::Wait(None))
            }
            Phase::Stopping => Ok(Step::Wait(None)),
            Phase::Stopped => {
                if let (Some(awaited), Some((failed, error))) = (waiting.start, &entry.failed_start)
                {
                    if awaited == *failed {
                        return Err(error.clone());
                    }
                }
                if let Err(until) = entry.breaker.allows_start(now) {
                    return Err(LifecycleError::BreakerOpen {
                        model: model.to_string(),
                        retry_in: until.duration_since(now),
                        last_error: entry
                            .last_error
                            .as_ref()
                            .map(ToString::to_string)
                            .unwrap_or_default(),
                    });
                }
                let candidate = Candidate {
                    name: model.to_string(),
                    vram_mb: entry.spec.vram_mb,
                    group: entry.spec.group.clone(),
                };
                let limits = Limits {
                    max_loaded: config.max_loaded_models,
                    vram_budget_mb: config.vram_budget_mb,
                };
                let residents = table.residents(model, now);
                let await_gone = match policy::admit(&candidate, &residents, &limits) {
                    Admission::Impossible(reason) => {
                        return Err(LifecycleError::DoesNotFit {
                            model: model.to_string(),
                            reason,
                        })
                    }
                    Admission::Wait { blocked_by } => {
                        let since = *waiting.room_since.get_or_insert(now);
                        let deadline = since + config.startup_timeout;
                        if now >= deadline {
                            return Err(LifecycleError::NoRoom {
                                model: model.to_string(),
                                blocked_by,
                                waited: now - since,
                            });
                        }
                        return Ok(Step::Wait(Some(deadline)));
                    }
                    Admission::Start => {
                        // Only a start that evicts nothing: an eviction frees VRAM the sample
                        // cannot show yet.
                        self.check_vram(&table, model)?;
                        Vec::new()
                    }
                    Admission::StartAfter { evict, await_gone } => {
                        for victim in &evict {
                            if let Some(victim) = table.entries.get_mut(victim) {
                                victim.begin_stop(&format!("making room for {model}"));
                            }
                        }
                        await_gone
                    }
                };
                let generation = self.begin_start(&mut table, model, session, await_gone)?;
                waiting.start = Some(generation);
                Ok(Step::Wait(None))
            }
        }
    }

    /// Picks a port, marks the model starting and spawns its process task.
    fn begin_start(
        &self,
        table: &mut Table,
        model: &str,
        session: Option<&str>,
        await_gone: Vec<String>,
    ) -> Result<u64, LifecycleError> {
        let config = &self.inner.config;
        let reserved = table.reserved_ports(model);
        let entry = table.entries.get_mut(model).expect("checked by the caller");
        let port = policy::pick_port(
            entry.spec.port,
            config.port_base,
            &reserved,
            process::port_is_free,
        )
        .map_err(|reason| LifecycleError::NoPort {
            model: model.to_string(),
            reason,
        })?;
        let (stop_tx, stop_rx) = mpsc::unbounded_channel();
        entry.generation += 1;
        entry.phase = Phase::Starting;
        entry.port = Some(port);
        entry.pid = None;
        entry.in_flight = 0;
        entry.restart_pending = false;
        entry.session = session.map(str::to_string);
        entry.starts += 1;
        entry.failed_start = None;
        entry.stop_tx = Some(stop_tx);
        entry.ended = watch::channel(None).0;
        tokio::spawn(run::run_model(Start {
            inner: self.inner.clone(),
            spec: entry.spec.clone(),
            generation: entry.generation,
            port,
            await_gone,
            stop: stop_rx,
        }));
        self.inner.changed();
        Ok(entry.generation)
    }

    /// Starts `model` by hand (the dashboard's "load"), forgetting its breaker's failures, and
    /// returns once it is ready. Its idle timer starts now.
    pub async fn load(&self, model: &str) -> Result<(), LifecycleError> {
        {
            let mut table = self.inner.lock();
            let entry = table
                .entries
                .get_mut(model)
                .ok_or_else(|| LifecycleError::UnknownModel(model.to_string()))?;
            entry.breaker.reset();
        }
        self.acquire(model, None).await.map(drop)
    }

    /// Stops `model` by hand (the dashboard's "unload"), even with requests in flight (they
    /// fail with [`LifecycleError::Stopped`]), and returns once its process is gone.
    pub async fn unload(&self, model: &str) -> Result<(), LifecycleError> {
        let mut events = self.inner.events.subscribe();
        let generation = {
            let mut table = self.inner.lock();
            let entry = table
                .entries
                .get_mut(model)
                .ok_or_else(|| LifecycleError::UnknownModel(model.to_string()))?;
            entry.begin_stop("unloaded by request");
            entry.generation
        };
        self.inner.changed();
        loop {
            events.borrow_and_update();
            {
                let table = self.inner.lock();
                let entry = &table.entries[model];
                // A newer generation means it was stopped and someone started it again.
                if entry.phase == Phase::Stopped || entry.generation != generation {
                    return Ok(());
                }
            }
            if events.changed().await.is_err() {
                return Ok(());
            }
        }
    }

    /// Changes whenever a model's status may have changed (state, process, requests, errors):
    /// wait on it, then read [`LifecycleManager::status`].
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.events.subscribe()
    }

    /// Every mapped model's status, by name.
    pub fn status(&self) -> Vec<ModelStatus> {
        let now = Instant::now();
        let table = self.inner.lock();
        table
            .entries
            .values()
            .map(|entry| ModelStatus::of(entry, now))
            .collect()
    }

    /// Stops every model server (SIGTERM to each process group, SIGKILL after the grace) and
    /// refuses further acquires. Returns once all are gone.
    pub async fn shutdown(&self) {
        let mut events = self.inner.events.subscribe();
        {
            let mut table = self.inner.lock();
            table.shutting_down = true;
            for entry in table.entries.values_mut() {
                entry.begin_stop("worker shutting down");
            }
        }
        self.inner.changed();
        // Each process task is bounded by the grace; the margin covers reaping.
        let bound = self.inner.config.stop_grace + Duration::from_secs(5);
        let all_stopped = async {
            loop {
                events.borrow_and_update();
                let done = {
                    let table = self.inner.lock();
                    table.entries.values().all(|e| e.phase == Phase::Stopped)
                };
                if done || events.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(bound, all_stopped).await.is_err() {
            tracing::warn!("some model servers did not stop in time");
        }
    }
}

/// The worker acquires and holds leases inside spawned request tasks: all of it must be `Send`.
#[allow(dead_code)]
fn assert_send(manager: &LifecycleManager, lease: &mut Lease) {
    fn send<T: Send>(_: T) {}
    send(manager.acquire("model", None));
    send(manager.shutdown());
    send(lease.ended());
    send(manager.clone());
}
