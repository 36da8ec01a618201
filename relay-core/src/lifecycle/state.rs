//! The manager's shared state: one table of models behind one lock (short critical sections,
//! no I/O under it), and the change counter every waiter watches.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::config::{Launch, LifecycleConfig, ModelSpec};
use super::error::LifecycleError;
use super::pidfile::PidDir;
use super::policy::{Activity, Breaker, BreakerState, Resident};

/// Where a model's process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Stopped,
    Starting,
    Ready,
    Stopping,
}

/// One model of the map.
pub(super) struct Entry {
    pub spec: Arc<ModelSpec>,
    pub phase: Phase,
    /// Counts starts; leases and the process task belong to one generation.
    pub generation: u64,
    pub port: Option<u16>,
    pub pid: Option<u32>,
    /// Leases of the current generation not yet dropped.
    pub in_flight: usize,
    pub last_used: Option<Instant>,
    pub last_used_at: Option<SystemTime>,
    /// The session id the model's KV cache belongs to.
    pub session: Option<String>,
    /// A request of another session waits for the requests in flight to finish, then restarts
    /// the model; no new leases are handed out meanwhile.
    pub restart_pending: bool,
    pub starts: u32,
    pub crashes: u32,
    pub breaker: Breaker,
    pub last_error: Option<LifecycleError>,
    /// The failure of a start attempt, by generation: whoever waited for that start gets it
    /// instead of trying again.
    pub failed_start: Option<(u64, LifecycleError)>,
    /// Asks the current generation's process task to stop, with a reason.
    pub stop_tx: Option<mpsc::UnboundedSender<String>>,
    /// Tells the current generation's leases that the process ended.
    pub ended: watch::Sender<Option<LifecycleError>>,
    /// When a process of this model last ended: VRAM sampled before then is out of date.
    pub ended_at: Option<Instant>,
    /// The size of its model file, read once when the manager is made (a start script has
    /// none): with `vram_mb`, what the free VRAM check compares against.
    pub file_bytes: Option<u64>,
    /// How long its last start took, from spawning its process to its server answering.
    pub last_load: Option<Duration>,
}

impl Entry {
    pub fn new(spec: ModelSpec) -> Self {
        let file_bytes = match &spec.launch {
            Launch::LlamaServer { model_file, .. } => {
                std::fs::metadata(model_file).ok().map(|m| m.len())
            }
            Launch::Script { .. } => None,
        };
        Entry {
            ended_at: None,
            last_load: None,
            file_bytes,
            spec: Arc::new(spec),
            phase: Phase::Stopped,
            generation: 0,
            port: None,
            pid: None,
            in_flight: 0,
            last_used: None,
            last_used_at: None,
            session: None,
            restart_pending: false,
            starts: 0,
            crashes: 0,
            breaker: Breaker::default(),
            last_error: None,
            failed_start: None,
            stop_tx: None,
            ended: watch::channel(None).0,
        }
    }

    /// Asks a starting or ready model's process to stop. Returns whether it did.
    pub fn begin_stop(&mut self, reason: &str) -> bool {
        if !matches!(self.phase, Phase::Starting | Phase::Ready) {
            return false;
        }
        tracing::info!(model = %self.spec.name, reason, "stopping model");
        self.phase = Phase::Stopping;
        self.restart_pending = false;
        if let Some(stop) = &self.stop_tx {
            let _ = stop.send(reason.to_string());
        }
        true
    }

    /// The process of this generation ended: reset to stopped and tell its leases why.
    pub fn ended(&mut self, why: LifecycleError) {
        self.ended.send_replace(Some(why));
        self.ended_at = Some(Instant::now());
        self.phase = Phase::Stopped;
        self.port = None;
        self.pid = None;
        self.in_flight = 0;
        self.restart_pending = false;
        self.stop_tx = None;
    }

    pub fn touch(&mut self, now: Instant) {
        self.last_used = Some(now);
        self.last_used_at = Some(SystemTime::now());
    }
}

/// Every model, and whether the manager is shutting down.
pub(super) struct Table {
    pub entries: BTreeMap<String, Entry>,
    pub shutting_down: bool,
}

impl Table {
    /// The models other than `except` that hold resources, for the admission policy.
    pub fn residents(&self, except: &str, now: Instant) -> Vec<Resident> {
        self.entries
            .values()
            .filter(|e| e.spec.name != except)
            .filter_map(|e| {
                let activity = match e.phase {
                    Phase::Stopped => return None,
                    Phase::Starting => Activity::Starting,
                    Phase::Stopping => Activity::Stopping,
                    Phase::Ready if e.in_flight > 0 || e.restart_pending => Activity::Busy,
                    Phase::Ready => Activity::Idle,
                };
                Some(Resident {
                    name: e.spec.name.clone(),
                    vram_mb: e.spec.vram_mb,
                    group: e.spec.group.clone(),
                    last_used: e.last_used.unwrap_or(now),
                    activity,
                })
            })
            .collect()
    }

    /// Ports `except` must not take: the other models' pinned ports and the ports in use.
    pub fn reserved_ports(&self, except: &str) -> BTreeSet<u16> {
        self.entries
            .values()
            .filter(|e| e.spec.name != except)
            .flat_map(|e| [e.spec.port, e.port])
            .flatten()
            .collect()
    }
}

/// What the manager shares with its tasks and leases.
pub(super) struct Inner {
    pub config: LifecycleConfig,
    pub table: Mutex<Table>,
    /// Bumped after every change of the table; waiters re-check when it moves.
    pub events: watch::Sender<u64>,
    pub pids: PidDir,
    pub client: reqwest::Client,
    /// Free VRAM on the box and when it was sampled, once the worker provides it.
    pub free_vram: OnceLock<FreeVram>,
}

/// Free VRAM in MiB and when it was sampled; `None` when the box's GPUs are unknown.
pub type FreeVram = Arc<dyn Fn() -> Option<(u64, Instant)> + Send + Sync>;

impl Inner {
    pub fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic under the lock leaves plain data behind; keep serving rather than poison
        // every later request.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn changed(&self) {
        self.events.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// A model's state as the dashboard shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(test, derive(ts_rs::TS))]
pub enum ModelState {
    /// Not running; the next request starts it.
    Stopped,
    /// Its process is starting (or waiting for room).
    Starting,
    /// Serving.
    Ready,
    /// Its process is being stopped.
    Stopping,
    /// Not running, and refusing starts for a while after repeated failures.
    Failed,
}

/// One model's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct ModelStatus {
    /// The model name.
    pub name: String,
    /// Its state.
    pub state: ModelState,
    /// Its port while it runs.
    pub port: Option<u16>,
    /// Its process id while it runs.
    pub pid: Option<u32>,
    /// When a request last used it, in milliseconds since the Unix epoch.
    pub last_used_unix_ms: Option<u64>,
    /// Starts after the first one (after idle unloads, crashes, session changes, ...).
    pub restarts: u32,
    /// Times its process died unexpectedly.
    pub crashes: u32,
    /// Requests using it now.
    pub in_flight: usize,
    /// The last failure, if any.
    pub last_error: Option<String>,
    /// While failed: seconds until a start is tried again.
    pub retry_in_secs: Option<u64>,
    /// How long its last start took to serve, in milliseconds (what loading it costs a request).
    pub last_load_ms: Option<u64>,
}

impl ModelStatus {
    pub(super) fn of(entry: &Entry, now: Instant) -> Self {
        let breaker = entry.breaker.state(now);
        let state = match (entry.phase, breaker) {
            (Phase::Stopped, BreakerState::Open { .. }) => ModelState::Failed,
            (Phase::Stopped, _) => ModelState::Stopped,
            (Phase::Starting, _) => ModelState::Starting,
            (Phase::Ready, _) => ModelState::Ready,
            (Phase::Stopping, _) => ModelState::Stopping,
        };
        ModelStatus {
            name: entry.spec.name.clone(),
            state,
            port: entry.port,
            pid: entry.pid,
            last_used_unix_ms: entry.last_used_at.and_then(|t| {
                t.duration_since(UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_millis() as u64)
            }),
            restarts: entry.starts.saturating_sub(1),
            crashes: entry.crashes,
            in_flight: entry.in_flight,
            last_error: entry.last_error.as_ref().map(ToString::to_string),
            retry_in_secs: match breaker {
                BreakerState::Open { until } => Some(until.duration_since(now).as_secs().max(1)),
                _ => None,
            },
            last_load_ms: entry.last_load.map(|d| d.as_millis() as u64),
        }
    }
}
