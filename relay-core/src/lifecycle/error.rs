//! The lifecycle's errors: each names the model and says what happened and what to look at, so
//! the worker can pass the message to the client as it is.

use std::time::Duration;

/// Why a model could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    /// The model is not in the model map.
    #[error("model {0:?} is not in this worker's model map")]
    UnknownModel(String),
    /// The process could not be spawned, or exited before it was ready.
    #[error(
        "model {model:?} failed to start: {reason}\n  command: {command}{}",
        tail(output)
    )]
    StartFailed {
        /// The model.
        model: String,
        /// The command line.
        command: String,
        /// What went wrong.
        reason: String,
        /// The last lines the process printed.
        output: Vec<String>,
    },
    /// `/health` did not answer 200 within the startup timeout.
    #[error(
        "model {model:?} was not ready within {}s (its /health never answered 200); it was stopped\n  command: {command}{}",
        timeout.as_secs_f64(),
        tail(output)
    )]
    StartupTimeout {
        /// The model.
        model: String,
        /// The command line.
        command: String,
        /// The bound.
        timeout: Duration,
        /// The last lines the process printed.
        output: Vec<String>,
    },
    /// The breaker is open after repeated failures.
    #[error(
        "model {model:?} is marked failed after repeated failures to start or crashes; it will be retried in {}s. Last error: {last_error}",
        retry_in.as_secs().max(1)
    )]
    BreakerOpen {
        /// The model.
        model: String,
        /// Until the next trial start.
        retry_in: Duration,
        /// The failure that opened it.
        last_error: String,
    },
    /// No room: the loaded models in the way kept requests in flight.
    #[error(
        "no room to load model {model:?}: {} busy and cannot be stopped (waited {}s)",
        blocked_by.join(", "),
        waited.as_secs_f64()
    )]
    NoRoom {
        /// The model.
        model: String,
        /// The busy models in the way.
        blocked_by: Vec<String>,
        /// How long the acquire waited.
        waited: Duration,
    },
    /// The model can never fit the box's budget.
    #[error("model {model:?} cannot be loaded: {reason}")]
    DoesNotFit {
        /// The model.
        model: String,
        /// Why.
        reason: String,
    },
    /// The GPUs lack the free VRAM the model needs now (other programs or models hold it).
    #[error(
        "model {model:?} would not fit in free VRAM: it needs about {needed_mb} MiB ({basis}) but the GPUs have {free_mb} MiB free; unload other models, stop other programs using the GPU, or choose a smaller quantisation (set vram_mb in its [worker.model_map] entry if the estimate is wrong)"
    )]
    NotEnoughVram {
        /// The model.
        model: String,
        /// VRAM it needs, MiB.
        needed_mb: u64,
        /// What the need is based on.
        basis: String,
        /// VRAM free on the GPUs at the last sample, MiB.
        free_mb: u64,
    },
    /// No port could be found for the model.
    #[error("model {model:?} cannot start: {reason}")]
    NoPort {
        /// The model.
        model: String,
        /// Why.
        reason: String,
    },
    /// The process died while serving.
    #[error("model {model:?} crashed ({status}){}", tail(output))]
    Crashed {
        /// The model.
        model: String,
        /// Its exit status.
        status: String,
        /// The last lines the process printed.
        output: Vec<String>,
    },
    /// The process was stopped on purpose (unload, shutdown) while the request used it.
    #[error("model {model:?} was stopped ({reason})")]
    Stopped {
        /// The model.
        model: String,
        /// Why.
        reason: String,
    },
    /// The manager is shutting down.
    #[error("the worker is shutting down and starts no models")]
    ShuttingDown,
}

fn tail(output: &[String]) -> String {
    if output.is_empty() {
        return String::new();
    }
    format!("\n  last output:\n    {}", output.join("\n    "))
}

impl LifecycleError {
    /// A stable machine-readable code for the client's error body.
    pub fn code(&self) -> &'static str {
        match self {
            LifecycleError::UnknownModel(_) => "model_not_found",
            LifecycleError::StartFailed { .. } | LifecycleError::StartupTimeout { .. } => {
                "model_start_failed"
            }
            LifecycleError::BreakerOpen { .. } => "model_failed",
            LifecycleError::NoRoom { .. }
            | LifecycleError::DoesNotFit { .. }
            | LifecycleError::NotEnoughVram { .. } => "model_no_room",
            LifecycleError::NoPort { .. } => "model_start_failed",
            LifecycleError::Crashed { .. } => "model_crashed",
            LifecycleError::Stopped { .. } | LifecycleError::ShuttingDown => "model_stopped",
        }
    }

    /// The HTTP status a client should see: 404 for an unknown model, 503 for everything that
    /// may pass (busy, backing off, stopped), 502 for a server that would not start or died.
    pub fn status_code(&self) -> u16 {
        match self {
            LifecycleError::UnknownModel(_) => 404,
            LifecycleError::StartFailed { .. }
            | LifecycleError::StartupTimeout { .. }
            | LifecycleError::NoPort { .. }
            | LifecycleError::DoesNotFit { .. }
            | LifecycleError::Crashed { .. } => 502,
            LifecycleError::BreakerOpen { .. }
            | LifecycleError::NoRoom { .. }
            | LifecycleError::NotEnoughVram { .. }
            | LifecycleError::Stopped { .. }
            | LifecycleError::ShuttingDown => 503,
        }
    }

    /// The model the error is about, if any.
    pub fn model(&self) -> Option<&str> {
        match self {
            LifecycleError::UnknownModel(model)
            | LifecycleError::StartFailed { model, .. }
            | LifecycleError::StartupTimeout { model, .. }
            | LifecycleError::BreakerOpen { model, .. }
            | LifecycleError::NoRoom { model, .. }
            | LifecycleError::DoesNotFit { model, .. }
            | LifecycleError::NotEnoughVram { model, .. }
            | LifecycleError::NoPort { model, .. }
            | LifecycleError::Crashed { model, .. }
            | LifecycleError::Stopped { model, .. } => Some(model),
            LifecycleError::ShuttingDown => None,
        }
    }
}
