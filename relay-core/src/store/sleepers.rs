//! Boxes that were asleep when the proxy stopped: kept so that a restarted proxy still lists
//! their models and wakes them (Wake-on-LAN) for a request. The proxy saves what changed each
//! time a box falls asleep, wakes or is forgotten, and reads them all back at start.

use std::collections::HashMap;

use super::db::{changed_rows, Columns, Database, DbError, Kind};

/// A sleeping box as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSleeper {
    /// The name its worker registered with.
    pub name: String,
    /// The provider it had joined.
    pub provider: String,
    /// Its network card (`aa:bb:…`), if its worker announced one.
    pub mac: Option<String>,
    /// The address its worker connected from.
    pub address: Option<String>,
    /// The models it served.
    pub models: Vec<String>,
    /// When it fell asleep (Unix ms).
    pub since_unix_ms: i64,
}

const COLUMNS: Columns = Columns(&[
    ("name", Kind::Text),
    ("provider", Kind::Text),
    ("mac", Kind::Text),
    ("address", Kind::Text),
    ("models", Kind::Text),
    ("since_ms", Kind::Int),
]);

/// Every stored sleeping box.
pub async fn load(db: &Database) -> Result<Vec<StoredSleeper>, DbError> {
    let rows = db
        .select_all(&COLUMNS, "FROM sleeping_boxes ORDER BY since_ms")
        .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let row = COLUMNS.read(row);
            StoredSleeper {
                name: row.text("name"),
                provider: row.text("provider"),
                mac: row.opt_text("mac"),
                address: row.opt_text("address"),
                // A row a hand or a newer release wrote badly serves no model.
                models: serde_json::from_str(&row.text("models")).unwrap_or_default(),
                since_unix_ms: row.int("since_ms"),
            }
        })
        .collect())
}

/// Makes the stored boxes `now` (by name), given what was stored `before`: writes only what
/// changed ([`changed_rows`]).
pub async fn save(
    db: &Database,
    before: &HashMap<String, StoredSleeper>,
    now: &HashMap<String, StoredSleeper>,
) -> Result<(), DbError> {
    let statements = changed_rows(
        "sleeping_boxes",
        "INSERT INTO sleeping_boxes (name, provider, mac, address, models, since_ms) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name) DO UPDATE SET \
         provider = excluded.provider, mac = excluded.mac, address = excluded.address, \
         models = excluded.models, since_ms = excluded.since_ms",
        before,
        now,
        |name, sleeper| {
            vec![
                name.into(),
                sleeper.provider.as_str().into(),
                sleeper.mac.clone().into(),
                sleeper.address.clone().into(),
                serde_json::to_string(&sleeper.models)
                    .unwrap_or_else(|_| "[]".into())
                    .into(),
                sleeper.since_unix_ms.into(),
            ]
        },
    );
    if statements.is_empty() {
        return Ok(());
    }
    db.transaction(statements).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DatabaseSetting;

    fn sleeper(name: &str, models: &[&str], since: i64) -> StoredSleeper {
        StoredSleeper {
            name: name.into(),
            provider: "local".into(),
            mac: Some("02:00:00:00:00:01".into()),
            address: Some("192.168.1.20".into()),
            models: models.iter().map(|m| m.to_string()).collect(),
            since_unix_ms: since,
        }
    }

    fn by_name(sleepers: &[StoredSleeper]) -> HashMap<String, StoredSleeper> {
        sleepers
            .iter()
            .map(|s| (s.name.clone(), s.clone()))
            .collect()
    }

    #[tokio::test]
    async fn boxes_saved_are_read_back_and_a_box_that_woke_is_removed() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        let first = by_name(&[
            sleeper("gpu-a", &["m1", "m2"], 10),
            sleeper("gpu-b", &["m3"], 20),
        ]);
        save(&db, &HashMap::new(), &first).await.unwrap();
        assert_eq!(
            load(&db).await.unwrap(),
            vec![
                sleeper("gpu-a", &["m1", "m2"], 10),
                sleeper("gpu-b", &["m3"], 20)
            ]
        );
        let second = by_name(&[sleeper("gpu-b", &["m3", "m4"], 30)]);
        save(&db, &first, &second).await.unwrap();
        assert_eq!(
            load(&db).await.unwrap(),
            vec![sleeper("gpu-b", &["m3", "m4"], 30)]
        );
    }

    #[tokio::test]
    async fn a_row_with_unreadable_models_serves_none() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        db.execute(
            "INSERT INTO sleeping_boxes (name, provider, mac, address, models, since_ms) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            vec![
                "x".into(),
                "local".into(),
                None::<String>.into(),
                None::<String>.into(),
                "{not json".into(),
                1.into(),
            ],
        )
        .await
        .unwrap();
        assert!(load(&db).await.unwrap()[0].models.is_empty());
    }
}
