//! Whether the proxy's database takes writes, and what was lost while it did not.
//!
//! A full disk or a read-only data directory must not stop a relay from serving: requests do
//! not need the database (keys are checked from memory), only accounting and key changes do. So
//! a write that fails is not an error anyone waits on: it is counted here, said once in the log
//! when writes start failing and once when they work again, and shown on the dashboard and in
//! `/metrics` for as long as it lasts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use super::dates::now_ms;

/// The health of one database handle; shared by everything that writes through it.
#[derive(Debug, Default)]
pub struct StoreHealth {
    state: Mutex<State>,
    usage_not_stored: AtomicU64,
    writes_failed: AtomicU64,
}

#[derive(Debug, Default, Clone)]
struct State {
    /// Set at start when the database could only be opened for reading (or not at all).
    opened_read_only: Option<String>,
    /// The last write's failure, while writes fail.
    failing: Option<Failure>,
}

#[derive(Debug, Clone)]
struct Failure {
    why: String,
    since_unix_ms: u64,
}

/// What the dashboard and `/api/status` show about storage.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct StorageView {
    /// Writes work (the last one succeeded, and the database was opened for writing).
    pub writable: bool,
    /// What is wrong, and what to do, in a sentence; none while all is well.
    pub problem: Option<String>,
    /// Since when (Unix ms), if something is wrong.
    pub since_unix_ms: Option<u64>,
    /// Finished requests whose usage could not be written since start.
    pub usage_records_not_stored: u64,
    /// Writes refused since start (usage batches, key changes).
    pub writes_failed: u64,
}

impl StoreHealth {
    /// A database opened for reading only, or standing in for one that could not be opened:
    /// every write will be refused, for the reason `why`.
    pub fn opened_read_only(&self, why: String) {
        tracing::warn!(
            "{why}: the relay keeps serving, checking client API keys from memory; usage is not \
             stored and keys cannot be created or revoked until it is restarted with a writable \
             data directory"
        );
        self.lock().opened_read_only = Some(why);
    }

    /// Whether the database was opened for reading only.
    pub fn is_read_only(&self) -> bool {
        self.lock().opened_read_only.is_some()
    }

    /// A write failed with `error` (a database's message).
    pub fn write_failed(&self, error: &str) {
        self.writes_failed.fetch_add(1, Ordering::Relaxed);
        let why = explain(error);
        let mut state = self.lock();
        if state.failing.is_none() {
            tracing::error!(
                error,
                "{why}: the relay keeps serving; usage is counted as not stored and key changes \
                 are refused until writes work again"
            );
        }
        let since_unix_ms = state
            .failing
            .as_ref()
            .map_or_else(now_ms_u64, |f| f.since_unix_ms);
        state.failing = Some(Failure { why, since_unix_ms });
    }

    /// A write succeeded: whatever was failing works again.
    pub fn write_succeeded(&self) {
        let mut state = self.lock();
        if let Some(failure) = state.failing.take() {
            tracing::warn!(
                not_stored = self.usage_not_stored.load(Ordering::Relaxed),
                "the database takes writes again (after: {})",
                failure.why
            );
        }
    }

    /// `records` finished requests whose usage could not be written.
    pub fn usage_not_stored(&self, records: usize) {
        self.usage_not_stored
            .fetch_add(records as u64, Ordering::Relaxed);
    }

    /// Finished requests whose usage could not be written, since start.
    pub fn usage_records_not_stored(&self) -> u64 {
        self.usage_not_stored.load(Ordering::Relaxed)
    }

    /// Writes refused since start.
    pub fn writes_failed(&self) -> u64 {
        self.writes_failed.load(Ordering::Relaxed)
    }

    /// For the dashboard.
    pub fn view(&self) -> StorageView {
        let state = self.lock().clone();
        let (problem, since_unix_ms) = match (&state.opened_read_only, &state.failing) {
            (Some(why), _) => (Some(why.clone()), None),
            (None, Some(failure)) => (Some(failure.why.clone()), Some(failure.since_unix_ms)),
            (None, None) => (None, None),
        };
        StorageView {
            writable: problem.is_none(),
            problem,
            since_unix_ms,
            usage_records_not_stored: self.usage_records_not_stored(),
            writes_failed: self.writes_failed(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn now_ms_u64() -> u64 {
    u64::try_from(now_ms()).unwrap_or_default()
}

/// A database's error as what it means for the user, and what to do.
pub fn explain(error: &str) -> String {
    let lower = error.to_ascii_lowercase();
    if lower.contains("disk is full")
        || lower.contains("no space left")
        || lower.contains("could not extend file")
        || lower.contains("disk full")
    {
        "the disk holding the proxy's database is full: free some space there (the relay \
         resumes writing by itself)"
            .to_string()
    } else if lower.contains("readonly") || lower.contains("read-only") {
        "the proxy's database cannot be written (the data directory is read-only): make it \
         writable, or set --data-dir to a writable directory"
            .to_string()
    } else if lower.contains("permission denied") {
        "the proxy may not write its data directory (permission denied): run it as the \
         directory's owner, or set --data-dir to one it owns"
            .to_string()
    } else {
        format!("the proxy's database refuses writes ({error})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_write_is_shown_until_one_succeeds_and_its_losses_stay_counted() {
        let health = StoreHealth::default();
        assert!(health.view().writable);
        health.write_failed("committing: database or disk is full");
        health.usage_not_stored(40);
        let failing = health.view();
        assert!(!failing.writable);
        let problem = failing.problem.expect("a problem");
        assert!(
            problem.contains("disk holding the proxy's database is full"),
            "{problem}"
        );
        let since = failing.since_unix_ms.expect("since when");
        health.write_failed("committing: database or disk is full");
        assert_eq!(
            health.view().since_unix_ms,
            Some(since),
            "the first failure's time"
        );
        health.write_succeeded();
        let healed = health.view();
        assert!(healed.writable && healed.problem.is_none());
        assert_eq!(healed.usage_records_not_stored, 40);
        assert_eq!(healed.writes_failed, 2);
    }

    #[test]
    fn a_database_opened_for_reading_stays_unwritable_whatever_succeeds() {
        let health = StoreHealth::default();
        health.opened_read_only("the data directory is read-only".into());
        health.write_succeeded();
        let view = health.view();
        assert!(!view.writable);
        assert_eq!(
            view.problem.as_deref(),
            Some("the data directory is read-only")
        );
        assert!(health.is_read_only());
    }

    #[test]
    fn errors_are_explained_with_what_to_do() {
        assert!(explain("attempt to write a readonly database").contains("--data-dir"));
        assert!(
            explain("could not extend file \"base/5/1234\": No space left on device")
                .contains("free some space")
        );
        assert!(explain("Permission denied (os error 13)").contains("owner"));
        assert!(explain("deadlock detected").contains("deadlock detected"));
    }
}
