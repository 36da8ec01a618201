//! What was measured of each box (its prompt and generation speed per model, how long it takes
//! to wake), kept so that a restarted proxy routes by it at once instead of learning every box
//! again from its first answers: at a home's load a slow box may answer nothing for minutes, and
//! until it has, cost routing cannot compare it with the others.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::db::{changed_rows, Columns, Database, DbError, Kind};

/// One box's measurements as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredBox {
    /// The name its worker registered with.
    pub name: String,
    /// Its speeds, by model.
    pub speeds: BTreeMap<String, StoredSpeed>,
    /// Milliseconds from the first Wake-on-LAN packet to its worker's registration.
    pub wake_ms: Option<i64>,
}

/// One model's speeds on one box (each a rate measured from its answers, when it was).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StoredSpeed {
    /// Prompt tokens evaluated per second.
    pub prompt_tps: Option<f64>,
    /// Tokens generated per second.
    pub generation_tps: Option<f64>,
    /// Tokens an answer generates, on average.
    pub typical_output: Option<f64>,
    /// Tokens a conversation's turn generates, on average (absent in rows written before it
    /// was measured).
    #[serde(default)]
    pub typical_turn_output: Option<f64>,
}

const COLUMNS: Columns = Columns(&[
    ("name", Kind::Text),
    ("speeds", Kind::Text),
    ("wake_ms", Kind::Int),
]);

/// Every stored box, the one written longest ago first.
pub async fn load(db: &Database) -> Result<Vec<StoredBox>, DbError> {
    let rows = db
        .select_all(&COLUMNS, "FROM box_speeds ORDER BY written_ms, name")
        .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let row = COLUMNS.read(row);
            StoredBox {
                name: row.text("name"),
                // A row a hand or a newer release wrote badly knows no speed.
                speeds: serde_json::from_str(&row.text("speeds")).unwrap_or_default(),
                wake_ms: row.opt_int("wake_ms"),
            }
        })
        .collect())
}

/// Makes the stored boxes `now` (by name), given what was stored `before`, at `now_unix_ms`:
/// writes only what changed ([`changed_rows`]).
pub async fn save(
    db: &Database,
    before: &HashMap<String, StoredBox>,
    now: &HashMap<String, StoredBox>,
    now_unix_ms: i64,
) -> Result<(), DbError> {
    let statements = changed_rows(
        "box_speeds",
        "INSERT INTO box_speeds (name, speeds, wake_ms, written_ms) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (name) DO UPDATE SET speeds = excluded.speeds, \
         wake_ms = excluded.wake_ms, written_ms = excluded.written_ms",
        before,
        now,
        |name, measured| {
            vec![
                name.into(),
                serde_json::to_string(&measured.speeds)
                    .unwrap_or_else(|_| "{}".into())
                    .into(),
                measured.wake_ms.into(),
                now_unix_ms.into(),
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

    fn measured(name: &str, prompt_tps: f64, wake_ms: Option<i64>) -> StoredBox {
        let speed = StoredSpeed {
            prompt_tps: Some(prompt_tps),
            generation_tps: Some(prompt_tps / 20.0),
            typical_output: None,
            typical_turn_output: None,
        };
        StoredBox {
            name: name.into(),
            speeds: BTreeMap::from([("m1".to_string(), speed)]),
            wake_ms,
        }
    }

    fn by_name(boxes: &[StoredBox]) -> HashMap<String, StoredBox> {
        boxes.iter().map(|b| (b.name.clone(), b.clone())).collect()
    }

    #[tokio::test]
    async fn boxes_saved_are_read_back_oldest_first_and_a_box_forgotten_is_removed() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        let first = by_name(&[measured("gpu-a", 2000.0, Some(9000))]);
        save(&db, &HashMap::new(), &first, 10).await.unwrap();
        let second = by_name(&[
            measured("gpu-a", 2000.0, Some(9000)),
            measured("gpu-b", 400.5, None),
        ]);
        save(&db, &first, &second, 20).await.unwrap();
        assert_eq!(
            load(&db).await.unwrap(),
            vec![
                measured("gpu-a", 2000.0, Some(9000)),
                measured("gpu-b", 400.5, None)
            ]
        );
        let third = by_name(&[measured("gpu-a", 1500.0, Some(8000))]);
        save(&db, &second, &third, 30).await.unwrap();
        assert_eq!(
            load(&db).await.unwrap(),
            vec![measured("gpu-a", 1500.0, Some(8000))]
        );
    }

    #[tokio::test]
    async fn a_row_with_unreadable_speeds_knows_none() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        for (name, speeds) in [("x", "{not json"), ("y", "[1, 2]"), ("z", "null")] {
            db.execute(
                "INSERT INTO box_speeds (name, speeds, wake_ms, written_ms) VALUES ($1, $2, $3, $4)",
                vec![name.into(), speeds.into(), None::<i64>.into(), 1.into()],
            )
            .await
            .unwrap();
        }
        let loaded = load(&db).await.unwrap();
        assert_eq!(loaded.len(), 3);
        assert!(loaded.iter().all(|b| b.speeds.is_empty()), "{loaded:?}");
    }

    #[tokio::test]
    async fn a_row_written_before_turns_were_measured_apart_keeps_its_speeds() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        let older = r#"{"m1":{"prompt_tps":600.0,"generation_tps":12.0,"typical_output":40.0}}"#;
        db.execute(
            "INSERT INTO box_speeds (name, speeds, wake_ms, written_ms) VALUES ($1, $2, $3, $4)",
            vec!["slow".into(), older.into(), None::<i64>.into(), 1.into()],
        )
        .await
        .unwrap();
        let loaded = load(&db).await.unwrap();
        let speed = StoredSpeed {
            prompt_tps: Some(600.0),
            generation_tps: Some(12.0),
            typical_output: Some(40.0),
            typical_turn_output: None,
        };
        assert_eq!(
            loaded[0].speeds,
            BTreeMap::from([("m1".to_string(), speed)])
        );
    }
}
