//! The tasks behind the manager: one per started process (wait for room, spawn, wait for
//! `/health`, supervise until it exits or is told to stop), and the housekeeper that stops idle
//! models when their timer is due.
//!
//! A process task is spawned by whoever decides to start the model, not by the request waiting
//! for it, so a client that goes away never abandons a half-started server.

use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::sync::{mpsc, watch};
use tokio::time::sleep_until;

use super::config::ModelSpec;
use super::error::LifecycleError;
use super::policy;
use super::process::{self, describe_status, Spawned};
use super::state::{Inner, Phase};

/// What the task of one generation was given.
pub(super) struct Start {
    pub inner: Arc<Inner>,
    pub spec: Arc<ModelSpec>,
    pub generation: u64,
    pub port: u16,
    /// Models whose processes must be gone first (stopped to make room).
    pub await_gone: Vec<String>,
    pub stop: mpsc::UnboundedReceiver<String>,
}

/// How the task ends, for the table.
enum Outcome {
    /// It never became ready.
    StartFailed(LifecycleError),
    /// It was ready and died on its own.
    Crashed(LifecycleError),
    /// It was told to stop; `before_ready` when that cancelled its start.
    Stopped { reason: String, before_ready: bool },
}

/// Runs one generation of a model's process from start to exit.
pub(super) async fn run_model(mut start: Start) {
    let outcome = run(&mut start).await;
    let inner = &start.inner;
    let name = &start.spec.name;
    let now = Instant::now();
    let mut table = inner.lock();
    let entry = table
        .entries
        .get_mut(name)
        .expect("models never leave the table");
    debug_assert_eq!(entry.generation, start.generation);
    match outcome {
        Outcome::StartFailed(error) => {
            tracing::warn!(model = %name, "{error}");
            entry.breaker.record_failure(now, &inner.config.breaker);
            entry.failed_start = Some((start.generation, error.clone()));
            entry.last_error = Some(error.clone());
            entry.ended(error);
        }
        Outcome::Crashed(error) => {
            tracing::warn!(model = %name, "{error}");
            entry.crashes += 1;
            entry.breaker.record_failure(now, &inner.config.breaker);
            entry.last_error = Some(error.clone());
            entry.ended(error);
        }
        Outcome::Stopped {
            reason,
            before_ready,
        } => {
            tracing::info!(model = %name, reason = %reason, "model stopped");
            let error = LifecycleError::Stopped {
                model: name.clone(),
                reason,
            };
            // Waiters of a start that was cancelled get the reason rather than starting again.
            if before_ready {
                entry.failed_start = Some((start.generation, error.clone()));
            }
            entry.ended(error);
        }
    }
    drop(table);
    inner.changed();
}

async fn run(start: &mut Start) -> Outcome {
    if let Some(reason) = wait_until_gone(start).await {
        return Outcome::Stopped {
            reason,
            before_ready: true,
        };
    }
    let inner = start.inner.clone();
    let spec = start.spec.clone();
    let command = process::display_command(&spec, start.port);
    tracing::info!(model = %spec.name, port = start.port, %command, "starting model");
    let mut spawned = match process::spawn(&spec, start.port) {
        Ok(spawned) => spawned,
        Err(reason) => {
            return Outcome::StartFailed(LifecycleError::StartFailed {
                model: spec.name.clone(),
                command,
                reason,
                output: Vec::new(),
            })
        }
    };
    if let Err(error) = inner
        .pids
        .record(spawned.pid, &spec.name, start.port, &command)
    {
        // Without a record a crash of this worker would leave the process behind; say so.
        tracing::warn!(model = %spec.name, "cannot write pid file: {error}");
    }
    {
        let mut table = inner.lock();
        if let Some(entry) = table.entries.get_mut(&spec.name) {
            entry.pid = Some(spawned.pid);
        }
    }
    inner.changed();
    let outcome = supervise(start, &mut spawned, &command).await;
    inner.pids.remove(spawned.pid);
    outcome
}

/// Waits until the models stopped to make room are gone. `Some(reason)` if told to stop first.
async fn wait_until_gone(start: &mut Start) -> Option<String> {
    if start.await_gone.is_empty() {
        return None;
    }
    let mut events = start.inner.events.subscribe();
    loop {
        events.borrow_and_update();
        let all_gone = {
            let table = start.inner.lock();
            start.await_gone.iter().all(|name| {
                table
                    .entries
                    .get(name)
                    .is_none_or(|e| e.phase == Phase::Stopped)
            })
        };
        if all_gone {
            return None;
        }
        tokio::select! {
            changed = events.changed() => if changed.is_err() {
                return Some("the manager is gone".to_string());
            },
            reason = start.stop.recv() => {
                return Some(reason.unwrap_or_else(|| "the manager is gone".to_string()));
            }
        }
    }
}

/// From spawn to exit: startup bounded by the timeout, then the process's life.
async fn supervise(start: &mut Start, spawned: &mut Spawned, command: &str) -> Outcome {
    let inner = start.inner.clone();
    let config = &inner.config;
    let model = start.spec.name.clone();
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + config.startup_timeout;
    tokio::select! {
        status = spawned.child.wait() => {
            let status = status.ok();
            let output = spawned.last_output().await;
            process::reap_group(spawned, tokio::time::Instant::now()).await;
            return Outcome::StartFailed(LifecycleError::StartFailed {
                model,
                command: command.to_string(),
                reason: format!("it exited during startup ({})", describe_status(status)),
                output,
            });
        }
        _ = process::wait_healthy(&inner.client, start.port) => {}
        _ = sleep_until(deadline) => {
            process::terminate(spawned, config.stop_grace).await;
            return Outcome::StartFailed(LifecycleError::StartupTimeout {
                model,
                command: command.to_string(),
                timeout: config.startup_timeout,
                output: spawned.last_output().await,
            });
        }
        reason = start.stop.recv() => {
            process::terminate(spawned, config.stop_grace).await;
            return Outcome::Stopped {
                reason: reason.unwrap_or_else(|| "the manager is gone".to_string()),
                before_ready: true,
            };
        }
    }
    tracing::info!(
        model = %model,
        port = start.port,
        secs = started.elapsed().as_secs_f64(),
        "model ready"
    );
    {
        let now = Instant::now();
        let mut table = inner.lock();
        if let Some(entry) = table.entries.get_mut(&model) {
            if entry.phase == Phase::Starting {
                entry.phase = Phase::Ready;
                entry.last_load = Some(started.elapsed());
            }
            entry.breaker.record_success(now);
            entry.touch(now);
        }
    }
    inner.changed();
    tokio::select! {
        status = spawned.child.wait() => {
            let status = status.ok();
            let output = spawned.last_output().await;
            // A crashed script may leave children holding the port: they go at once.
            process::reap_group(spawned, tokio::time::Instant::now()).await;
            Outcome::Crashed(LifecycleError::Crashed {
                model,
                status: describe_status(status),
                output,
            })
        }
        reason = start.stop.recv() => {
            process::terminate(spawned, config.stop_grace).await;
            Outcome::Stopped {
                reason: reason.unwrap_or_else(|| "the manager is gone".to_string()),
                before_ready: false,
            }
        }
    }
}

/// Stops ready models whose idle timer is due. It sleeps until the earliest due time, or until
/// the table changes (a lease dropped, a model became ready), then looks again: no polling.
pub(super) async fn housekeeper(inner: Weak<Inner>, mut events: watch::Receiver<u64>) {
    loop {
        events.borrow_and_update();
        let next = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let now = Instant::now();
            let mut next: Option<Instant> = None;
            let mut stopped = false;
            let mut table = inner.lock();
            if table.shutting_down {
                return;
            }
            for entry in table.entries.values_mut() {
                if entry.phase != Phase::Ready {
                    continue;
                }
                if entry.restart_pending {
                    // Normally the waiting request restarts it; if that request gave up, the
                    // restart still happens once the old session's requests are done.
                    if entry.in_flight == 0 {
                        stopped |= entry.begin_stop("session changed");
                    }
                    continue;
                }
                let last_used = entry.last_used.unwrap_or(now);
                let Some(due) =
                    policy::idle_deadline(last_used, entry.in_flight, entry.spec.idle_timeout)
                else {
                    continue;
                };
                if due <= now {
                    stopped |= entry.begin_stop("idle timeout");
                } else {
                    next = Some(next.map_or(due, |n| n.min(due)));
                }
            }
            drop(table);
            if stopped {
                inner.changed();
            }
            next
        };
        tokio::select! {
            changed = events.changed() => if changed.is_err() {
                return;
            },
            _ = sleep_until(next.map(tokio::time::Instant::from_std).unwrap_or_else(tokio::time::Instant::now)), if next.is_some() => {}
        }
    }
}
