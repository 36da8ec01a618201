//! Sleeping boxes across restarts: the hub's registry is read back from the proxy's database at
//! start and written on every change, so a proxy restarted while a box sleeps still lists its
//! models and wakes it for a request (`store::sleepers` holds the rows).

use std::collections::HashMap;
use std::sync::Arc;

use crate::proxy::dispatch::hub::Hub;
use crate::proxy::dispatch::sleepers::{Card, Remembered, Sleeper};
use crate::store::sleepers::{self, StoredSleeper};
use crate::store::Database;

/// Puts the boxes `db` remembers asleep back into `hub`'s registry; then keeps `db` in step with
/// it for as long as the hub lives (a task that wakes only when a box falls asleep or wakes).
pub async fn restore_and_keep(hub: &Arc<Hub>, db: Database) {
    let stored = match sleepers::load(&db).await {
        Ok(stored) => stored,
        Err(error) => {
            tracing::warn!(%error, "could not read the sleeping boxes of the last run");
            Vec::new()
        }
    };
    let count = stored.len();
    hub.restore_sleepers(stored.iter().filter_map(remembered).collect());
    if count > 0 {
        tracing::info!(boxes = count, "sleeping boxes of the last run remembered");
    }
    let mut changes = hub.sleeper_changes();
    let weak = Arc::downgrade(hub);
    let mut saved: HashMap<String, StoredSleeper> =
        stored.into_iter().map(|s| (s.name.clone(), s)).collect();
    tokio::spawn(async move {
        // Ends with the hub (its sender goes with it).
        while changes.changed().await.is_ok() {
            let Some(hub) = weak.upgrade() else { return };
            let now: HashMap<String, StoredSleeper> = hub
                .sleepers()
                .iter()
                .map(|s| (s.name.clone(), stored_form(s)))
                .collect();
            drop(hub);
            match sleepers::save(&db, &saved, &now).await {
                Ok(()) => saved = now,
                // The store's health says so; the next change tries again from what is stored.
                Err(error) => tracing::debug!(%error, "sleeping boxes not stored"),
            }
        }
    });
}

fn stored_form(sleeper: &Sleeper) -> StoredSleeper {
    StoredSleeper {
        name: sleeper.name.clone(),
        provider: sleeper.provider.clone(),
        mac: sleeper.mac.map(|m| m.to_string()),
        address: sleeper.address.map(|a| a.to_string()),
        models: sleeper.models.clone(),
        since_unix_ms: i64::try_from(sleeper.since_unix_ms).unwrap_or(i64::MAX),
    }
}

/// A stored row as the registry takes it; rows a hand or a newer release wrote badly are
/// skipped.
fn remembered(stored: &StoredSleeper) -> Option<Remembered> {
    Some(Remembered {
        name: stored.name.clone(),
        provider: stored.provider.clone(),
        card: Card {
            mac: match &stored.mac {
                Some(mac) => Some(mac.parse().ok()?),
                None => None,
            },
            address: match &stored.address {
                Some(address) => Some(address.parse().ok()?),
                None => None,
            },
        },
        models: stored.models.clone(),
        since_unix_ms: u64::try_from(stored.since_unix_ms).ok()?,
    })
}
