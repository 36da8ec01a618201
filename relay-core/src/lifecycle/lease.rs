//! A lease: one request's use of a ready model. While it lives the model counts the request as
//! in flight (so it is never stopped for idleness or to make room); dropping it marks the model
//! used now and starts its idle timer when it was the last one.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::error::LifecycleError;
use super::state::Inner;

/// One request's hold on a ready model server. Drop it when the request is done.
pub struct Lease {
    pub(super) inner: Arc<Inner>,
    pub(super) model: String,
    pub(super) generation: u64,
    pub(super) port: u16,
    pub(super) base_url: String,
    pub(super) ended: watch::Receiver<Option<LifecycleError>>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("model", &self.model)
            .field("generation", &self.generation)
            .field("base_url", &self.base_url)
            .finish()
    }
}

impl Lease {
    /// The model.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The port the model's server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's base URL, e.g. `http://127.0.0.1:8081`: what the worker forwards to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `Err` once the process this lease was given has ended (crashed or was stopped).
    pub fn check(&self) -> Result<(), LifecycleError> {
        match &*self.ended.borrow() {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    /// Resolves when the process ends while the lease is held: race it against the forwarded
    /// request so a crash fails the request at once with the reason (the last lines of output).
    pub async fn ended(&mut self) -> LifecycleError {
        let fallback = || LifecycleError::Stopped {
            model: self.model.clone(),
            reason: "its process ended".to_string(),
        };
        match self.ended.wait_for(Option::is_some).await {
            Ok(value) => value.clone().unwrap_or_else(fallback),
            Err(_) => fallback(),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut table = self.inner.lock();
        if let Some(entry) = table.entries.get_mut(&self.model) {
            // A lease of an earlier generation no longer counts: its process is gone.
            if entry.generation == self.generation && entry.in_flight > 0 {
                entry.in_flight -= 1;
                entry.touch(Instant::now());
            }
        }
        drop(table);
        self.inner.changed();
    }
}
