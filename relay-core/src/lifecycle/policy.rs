//! The lifecycle's decisions as pure functions: what to stop to make room for a model, when an
//! idle model is due to stop, the circuit breaker, what a session change means, which port to
//! use. No I/O and no clock: time is an argument, so every rule is a plain unit test.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// What a loaded model is doing, as far as eviction cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Ready with no request in flight: may be stopped to make room.
    Idle,
    /// Ready with requests in flight: never stopped to make room.
    Busy,
    /// Starting: someone is waiting for it, so it is not stopped to make room either.
    Starting,
    /// Already stopping: leaves by itself, but holds its VRAM until its process is gone.
    Stopping,
}

/// A model that holds (or is about to hold) resources on the box.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resident {
    /// Its name.
    pub name: String,
    /// Its VRAM, in MB.
    pub vram_mb: u64,
    /// Its exclusion group.
    pub group: Option<String>,
    /// When a request last used it (or it became ready).
    pub last_used: Instant,
    /// What it is doing.
    pub activity: Activity,
}

/// The model that wants to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its name.
    pub name: String,
    /// Its VRAM, in MB.
    pub vram_mb: u64,
    /// Its exclusion group.
    pub group: Option<String>,
}

/// The box's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Models loaded at once.
    pub max_loaded: Option<usize>,
    /// Sum of loaded models' VRAM, in MB.
    pub vram_budget_mb: Option<u64>,
}

/// Whether and how a candidate may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// It fits now.
    Start,
    /// Stop `evict` (idle models, least recently used first) and start once every model in
    /// `await_gone` (the evicted ones, plus models already stopping whose room is needed) is gone.
    StartAfter {
        /// Idle models to stop now.
        evict: Vec<String>,
        /// Models whose processes must be gone before the candidate starts.
        await_gone: Vec<String>,
    },
    /// It does not fit until one of these busy or starting models goes idle.
    Wait {
        /// The models in the way.
        blocked_by: Vec<String>,
    },
    /// It can never fit (it alone exceeds the budget).
    Impossible(String),
}

/// Decides how `candidate` can start beside `residents` (which must not include it).
///
/// Group-mates must always go; then idle models go, least recently used first, until the count
/// and VRAM limits hold. Models that are already stopping are counted as gone, but awaited only
/// when their room is actually needed.
pub fn admit(candidate: &Candidate, residents: &[Resident], limits: &Limits) -> Admission {
    if let Some(budget) = limits.vram_budget_mb {
        if candidate.vram_mb > budget {
            return Admission::Impossible(format!(
                "model {:?} needs {} MB of VRAM but the budget is {budget} MB",
                candidate.name, candidate.vram_mb
            ));
        }
    }
    let same_group = |r: &Resident| {
        candidate.group.is_some() && r.group.as_deref() == candidate.group.as_deref()
    };
    let blocking_mates: Vec<String> = residents
        .iter()
        .filter(|r| same_group(r) && matches!(r.activity, Activity::Busy | Activity::Starting))
        .map(|r| r.name.clone())
        .collect();
    if !blocking_mates.is_empty() {
        return Admission::Wait {
            blocked_by: blocking_mates,
        };
    }
    let mut evict: Vec<&Resident> = residents
        .iter()
        .filter(|r| same_group(r) && r.activity == Activity::Idle)
        .collect();
    let mut await_gone: Vec<&Resident> = residents
        .iter()
        .filter(|r| same_group(r) && r.activity == Activity::Stopping)
        .collect();
    let mut kept: Vec<&Resident> = residents.iter().filter(|r| !same_group(r)).collect();
    let fits = |kept: &[&Resident]| {
        let count_ok = limits.max_loaded.is_none_or(|max| kept.len() < max);
        let vram: u64 = kept.iter().map(|r| r.vram_mb).sum::<u64>() + candidate.vram_mb;
        count_ok && limits.vram_budget_mb.is_none_or(|budget| vram <= budget)
    };
    if !fits(&kept) {
        // Room that is leaving anyway is cheaper than stopping a model someone may want.
        let stopping: Vec<&Resident> = kept
            .iter()
            .copied()
            .filter(|r| r.activity == Activity::Stopping)
            .collect();
        kept.retain(|r| r.activity != Activity::Stopping);
        await_gone.extend(stopping);
        let mut idle: Vec<&Resident> = kept
            .iter()
            .copied()
            .filter(|r| r.activity == Activity::Idle)
            .collect();
        idle.sort_by_key(|r| r.last_used);
        for victim in idle {
            if fits(&kept) {
                break;
            }
            kept.retain(|r| r.name != victim.name);
            evict.push(victim);
        }
        if !fits(&kept) {
            return Admission::Wait {
                blocked_by: kept
                    .iter()
                    .filter(|r| r.activity != Activity::Idle)
                    .map(|r| r.name.clone())
                    .collect(),
            };
        }
    }
    if evict.is_empty() && await_gone.is_empty() {
        return Admission::Start;
    }
    let evict: Vec<String> = evict.iter().map(|r| r.name.clone()).collect();
    let mut gone: Vec<String> = evict.clone();
    gone.extend(await_gone.iter().map(|r| r.name.clone()));
    Admission::StartAfter {
        evict,
        await_gone: gone,
    }
}

/// When an idle model is due to stop: `None` while requests are in flight or when it never
/// stops by itself.
pub fn idle_deadline(
    last_used: Instant,
    in_flight: usize,
    idle_timeout: Option<Duration>,
) -> Option<Instant> {
    if in_flight > 0 {
        return None;
    }
    idle_timeout.map(|timeout| last_used + timeout)
}

/// Whether a model is due to stop for idleness at `now`.
pub fn idle_expired(
    now: Instant,
    last_used: Instant,
    in_flight: usize,
    idle_timeout: Option<Duration>,
) -> bool {
    idle_deadline(last_used, in_flight, idle_timeout).is_some_and(|deadline| now >= deadline)
}

/// The circuit breaker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Failures within `window` that open the breaker; 0 disables it.
    pub max_failures: u32,
    /// The window failures are counted in.
    pub window: Duration,
    /// How long an open breaker refuses starts.
    pub backoff: Duration,
}

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Starts allowed; failures are being counted.
    Closed,
    /// Starts refused until the instant.
    Open {
        /// When one trial start will be allowed.
        until: Instant,
    },
    /// The back-off is over: one trial start is allowed; its outcome closes or reopens.
    HalfOpen,
}

/// Counts a model's failed starts and crashes; opens after too many within a window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Breaker {
    failures: VecDeque<Instant>,
    open_until: Option<Instant>,
}

impl Breaker {
    /// The state at `now`.
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.open_until {
            None => BreakerState::Closed,
            Some(until) if now < until => BreakerState::Open { until },
            Some(_) => BreakerState::HalfOpen,
        }
    }

    /// `Err(until)` while open.
    pub fn allows_start(&self, now: Instant) -> Result<(), Instant> {
        match self.state(now) {
            BreakerState::Open { until } => Err(until),
            _ => Ok(()),
        }
    }

    /// A failed start or a crash at `now`. A failed trial reopens at once; otherwise the breaker
    /// opens when `max_failures` failures fall within the window.
    pub fn record_failure(&mut self, now: Instant, settings: &BreakerSettings) {
        if settings.max_failures == 0 {
            return;
        }
        if self.state(now) == BreakerState::HalfOpen {
            self.open_until = Some(now + settings.backoff);
            return;
        }
        self.failures.push_back(now);
        while self
            .failures
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) > settings.window)
        {
            self.failures.pop_front();
        }
        if self.failures.len() >= settings.max_failures as usize {
            self.failures.clear();
            self.open_until = Some(now + settings.backoff);
        }
    }

    /// A successful start at `now`: closes a half-open breaker. In the closed state failures
    /// keep counting, so a model that starts but keeps crashing still opens it.
    pub fn record_success(&mut self, now: Instant) {
        if self.state(now) == BreakerState::HalfOpen {
            self.open_until = None;
        }
    }

    /// Forgets everything (a person asked for a load).
    pub fn reset(&mut self) {
        *self = Breaker::default();
    }
}

/// What a request's session id means for a ready model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAction {
    /// Use the model as it is.
    Proceed,
    /// Use it and remember the request's session as the model's.
    Adopt,
    /// Restart it first to clear its KV cache.
    Restart,
    /// Restart it once its requests in flight (another session's) are done; wait until then.
    WaitForIdle,
}

/// Decides what a request with session `incoming` does to a model whose session is `current`.
/// A request without a session id never restarts anything; a model without one adopts the first.
pub fn session_action(
    restart_enabled: bool,
    current: Option<&str>,
    incoming: Option<&str>,
    in_flight: usize,
) -> SessionAction {
    match (current, incoming) {
        (_, None) => SessionAction::Proceed,
        (None, Some(_)) => SessionAction::Adopt,
        (Some(current), Some(incoming)) if current == incoming => SessionAction::Proceed,
        _ if !restart_enabled => SessionAction::Adopt,
        _ if in_flight == 0 => SessionAction::Restart,
        _ => SessionAction::WaitForIdle,
    }
}

/// The port for a model: its pinned one, or the first port from `base` upward that is neither
/// `reserved` (other models' ports, pinned or in use) nor taken according to `is_free`.
pub fn pick_port(
    pinned: Option<u16>,
    base: u16,
    reserved: &BTreeSet<u16>,
    mut is_free: impl FnMut(u16) -> bool,
) -> Result<u16, String> {
    if let Some(port) = pinned {
        return if is_free(port) {
            Ok(port)
        } else {
            Err(format!(
                "its pinned port {port} is in use by another program"
            ))
        };
    }
    (base..=u16::MAX)
        .filter(|port| !reserved.contains(port))
        .find(|&port| is_free(port))
        .ok_or_else(|| format!("no free port from {base} upward"))
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;

/// What a model needs beyond its file, as a share of the file (percent): llama-server puts the
/// KV cache and compute buffers in VRAM beside the weights, which grow with the model.
pub const VRAM_MARGIN_PERCENT: u64 = 10;

/// What a model needs beyond its file, fixed part (MiB): the CUDA/ROCm context and scratch
/// buffers every server allocates whatever the model's size.
pub const VRAM_MARGIN_MB: u64 = 256;

/// The VRAM a model needs to start, in MiB, and what that is based on: its file's size plus
/// [`VRAM_MARGIN_PERCENT`] and [`VRAM_MARGIN_MB`], or its configured `vram_mb` when that is
/// more. `None` when neither is known (a start script without `vram_mb`).
pub fn vram_needed_mb(file_bytes: Option<u64>, vram_mb: u64) -> Option<(u64, String)> {
    let from_file = file_bytes.map(|bytes| {
        let file_mb = bytes.div_ceil(1024 * 1024);
        let needed = file_mb + file_mb * VRAM_MARGIN_PERCENT / 100 + VRAM_MARGIN_MB;
        (
            needed,
            format!(
                "a {file_mb} MiB model file plus {VRAM_MARGIN_PERCENT}% and {VRAM_MARGIN_MB} MiB"
            ),
        )
    });
    match from_file {
        Some((needed, basis)) if needed >= vram_mb => Some((needed, basis)),
        _ if vram_mb > 0 => Some((vram_mb, "its vram_mb setting".to_string())),
        _ => None,
    }
}
