//! Measured boxes across restarts: what the scheduler learnt of each box (its speeds per model,
//! how long it takes to wake) is read back from the proxy's database at start and written as it
//! changes, so a restarted proxy routes by it from the first request instead of learning every
//! box again (`store::box_speeds` holds the rows).
//!
//! Speeds move with every answer, so they are written at most every [`SAVE_EVERY`] (and once
//! more on a graceful shutdown): a proxy killed outright loses at most that much of its latest
//! measurements, never what it knew before. Nothing is written while nothing is measured.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::proxy::dispatch::hub::Hub;
use crate::proxy::dispatch::scheduler::{KnownBox, Speed};
use crate::proxy::dispatch::telemetry::unix_ms;
use crate::store::box_speeds::{self, StoredBox, StoredSpeed};
use crate::store::Database;

/// Measurements are written at most this often.
const SAVE_EVERY: Duration = Duration::from_secs(30);

/// Keeps the store in step with what the hub measures; [`MeasuredBoxes::flush`] writes what is
/// not written yet.
#[derive(Clone)]
pub struct MeasuredBoxes {
    keeper: Arc<Keeper>,
}

struct Keeper {
    hub: Weak<Hub>,
    db: Database,
    /// What the store holds, as this proxy wrote or read it.
    saved: tokio::sync::Mutex<HashMap<String, StoredBox>>,
}

/// Gives `hub` what `db` remembers of each box; then keeps `db` in step with it for as long as
/// the hub lives (a task that wakes only when a box is measured).
pub async fn restore_and_keep(hub: &Arc<Hub>, db: Database) -> MeasuredBoxes {
    let stored = match box_speeds::load(&db).await {
        Ok(stored) => stored,
        Err(error) => {
            tracing::warn!(%error, "could not read the box speeds of the last run");
            Vec::new()
        }
    };
    let count = stored.len();
    hub.restore_known_boxes(stored.iter().map(known_form).collect());
    if count > 0 {
        tracing::info!(boxes = count, "box speeds of the last run remembered");
    }
    let keeper = Arc::new(Keeper {
        hub: Arc::downgrade(hub),
        db,
        saved: tokio::sync::Mutex::new(stored.into_iter().map(|s| (s.name.clone(), s)).collect()),
    });
    let mut changes = hub.measured_changes();
    let task = Arc::clone(&keeper);
    tokio::spawn(async move {
        // Ends with the hub (its sender goes with it).
        while changes.changed().await.is_ok() {
            task.save().await;
            tokio::time::sleep(SAVE_EVERY).await;
        }
    });
    MeasuredBoxes { keeper }
}

impl MeasuredBoxes {
    /// Writes what was measured since the last write (on shutdown).
    pub async fn flush(&self) {
        self.keeper.save().await;
    }
}

impl Keeper {
    async fn save(&self) {
        let Some(hub) = self.hub.upgrade() else {
            return;
        };
        let now: HashMap<String, StoredBox> = hub
            .known_boxes()
            .iter()
            .map(|known| (known.name.clone(), stored_form(known)))
            .collect();
        drop(hub);
        let mut saved = self.saved.lock().await;
        let now_ms = i64::try_from(unix_ms()).unwrap_or(i64::MAX);
        match box_speeds::save(&self.db, &saved, &now, now_ms).await {
            Ok(()) => *saved = now,
            // The store's health says so; the next change tries again from what is stored.
            Err(error) => tracing::debug!(%error, "box speeds not stored"),
        }
    }
}

fn stored_form(known: &KnownBox) -> StoredBox {
    StoredBox {
        name: known.name.clone(),
        speeds: known
            .speeds
            .iter()
            .map(|(model, speed)| {
                let stored = StoredSpeed {
                    prompt_tps: speed.prompt_tps,
                    generation_tps: speed.generation_tps,
                    typical_output: speed.typical_output,
                    typical_turn_output: speed.typical_turn_output,
                };
                (model.clone(), stored)
            })
            .collect::<BTreeMap<_, _>>(),
        // Whole milliseconds: a wake takes seconds.
        wake_ms: known.wake_secs.map(|secs| (secs * 1000.0).round() as i64),
    }
}

/// A stored row as the scheduler takes it (which drops rates that make no sense).
fn known_form(stored: &StoredBox) -> KnownBox {
    KnownBox {
        name: stored.name.clone(),
        speeds: stored
            .speeds
            .iter()
            .map(|(model, speed)| {
                let known = Speed {
                    prompt_tps: speed.prompt_tps,
                    generation_tps: speed.generation_tps,
                    typical_output: speed.typical_output,
                    typical_turn_output: speed.typical_turn_output,
                };
                (model.clone(), known)
            })
            .collect(),
        wake_secs: stored.wake_ms.map(|ms| ms as f64 / 1000.0),
    }
}
