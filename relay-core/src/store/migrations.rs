//! The database schema, as numbered steps applied once each, in order, on open.
//!
//! A step is never edited once released: a change is a new step. Each runs in the same
//! transaction as the row that records it, so a failed step leaves nothing half done; on
//! PostgreSQL an advisory lock keeps two proxies starting together from both applying it.

use super::db::{Database, DatabaseSetting, DbError, Kind};

impl Database {
    /// Opens (creating when missing) the database `setting` names and brings its schema up to
    /// date. (Here rather than in `db`, which runs statements and knows no schema.)
    pub async fn open(setting: &DatabaseSetting) -> Result<Database, DbError> {
        let database = Database::connect(setting).await?;
        migrate(&database).await?;
        Ok(database)
    }
}

impl Database {
    /// Checks that a database opened for reading only has this release's schema: one a
    /// writable open would change cannot be used as it is.
    pub async fn check_schema_is_current(&self) -> Result<(), DbError> {
        let current = schema_version(self).await?;
        if current == VERSION {
            return Ok(());
        }
        Err(DbError(format!(
            "its schema is version {current} and this release needs {VERSION}: bringing it up \
             to date needs a writable data directory"
        )))
    }
}

/// The steps, oldest first; a step's number is its place here, from 1.
const STEPS: &[&str] = &[
    // 1: client API keys, usage (raw rows and daily roll-ups).
    "CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        secret_hash TEXT NOT NULL UNIQUE,
        prefix TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        revoked_at BIGINT,
        last_used_at BIGINT,
        models TEXT,
        max_concurrent BIGINT,
        requests_per_minute BIGINT
    );
    CREATE TABLE usage_events (
        at BIGINT NOT NULL,
        key_id TEXT NOT NULL,
        model TEXT NOT NULL,
        worker TEXT NOT NULL,
        outcome TEXT NOT NULL,
        status BIGINT NOT NULL,
        input_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL,
        ttft_ms BIGINT,
        duration_ms BIGINT NOT NULL
    );
    CREATE INDEX usage_events_at ON usage_events (at);
    CREATE TABLE usage_daily (
        day TEXT NOT NULL,
        key_id TEXT NOT NULL,
        model TEXT NOT NULL,
        worker TEXT NOT NULL,
        outcome TEXT NOT NULL,
        requests BIGINT NOT NULL,
        errors BIGINT NOT NULL,
        input_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL,
        ttft_ms_sum BIGINT NOT NULL,
        ttft_count BIGINT NOT NULL,
        duration_ms_sum BIGINT NOT NULL,
        PRIMARY KEY (day, key_id, model, worker, outcome)
    );",
    // 2: stored Responses shared by proxies on one PostgreSQL (unused with SQLite).
    "CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        response TEXT NOT NULL,
        conversation TEXT NOT NULL,
        input_len BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL
    );
    CREATE INDEX responses_expires_at ON responses (expires_at);",
    // 3: a key's priority (`batch`; NULL is interactive, so existing keys keep theirs).
    "ALTER TABLE api_keys ADD COLUMN priority TEXT;",
    // 4: a key's weight in the queue's turns (NULL is 1).
    "ALTER TABLE api_keys ADD COLUMN weight BIGINT;",
    // 5: whose a stored response is (a client key's id, or `addr:IP` without keys); rows from
    // before belong to nobody who can ask for them.
    "ALTER TABLE responses ADD COLUMN owner TEXT NOT NULL DEFAULT '';",
    // 6: boxes asleep when the proxy stopped, so a restart still lists and wakes them.
    "CREATE TABLE sleeping_boxes (
        name TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        mac TEXT,
        address TEXT,
        models TEXT NOT NULL,
        since_ms BIGINT NOT NULL
    );",
    // 7: what was measured of each box (speeds per model as JSON, time to wake), so a
    // restarted proxy routes by it at once.
    "CREATE TABLE box_speeds (
        name TEXT PRIMARY KEY,
        speeds TEXT NOT NULL,
        wake_ms BIGINT,
        written_ms BIGINT NOT NULL
    );",
];

/// The schema version this build writes.
pub const VERSION: i64 = STEPS.len() as i64;

/// Applies the steps the database has not seen yet.
pub async fn migrate(db: &Database) -> Result<(), DbError> {
    db.batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version BIGINT PRIMARY KEY,
            applied_at BIGINT NOT NULL
        )",
    )
    .await?;
    if db.is_shared() {
        // Held until this session ends (the connection stays, so release it explicitly).
        db.batch("SELECT pg_advisory_lock(7315000001)").await?;
    }
    let result = apply_missing(db).await;
    if db.is_shared() {
        db.batch("SELECT pg_advisory_unlock(7315000001)").await?;
    }
    result
}

/// The last schema step the database has seen (0: none).
async fn schema_version(db: &Database) -> Result<i64, DbError> {
    let rows = db
        .query(
            "SELECT CAST(COALESCE(MAX(version), 0) AS BIGINT) FROM schema_migrations",
            vec![],
            &[Kind::Int],
        )
        .await?;
    Ok(rows.first().map_or(0, |row| row.int(0)))
}

async fn apply_missing(db: &Database) -> Result<(), DbError> {
    let current = schema_version(db).await?;
    if current > VERSION {
        return Err(DbError(format!(
            "the database's schema is version {current}, newer than this ModelRelay knows \
             ({VERSION}): it was used by a newer release; upgrade this one, or point it at \
             another database"
        )));
    }
    for (version, step) in (current + 1..).zip(&STEPS[current as usize..]) {
        // The statements of a step, then its record, in one transaction.
        let mut statements: Vec<(String, Vec<super::db::Param>)> = step
            .split(';')
            .map(str::trim)
            .filter(|sql| !sql.is_empty())
            .map(|sql| (sql.to_string(), vec![]))
            .collect();
        statements.push((
            "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)".to_string(),
            vec![version.into(), (super::dates::now_ms()).into()],
        ));
        db.transaction(statements)
            .await
            .map_err(|e| DbError(format!("updating the schema to version {version}: {e}")))?;
        tracing::info!(version, "database schema updated");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn opening_twice_applies_each_step_once() {
        let dir = std::env::temp_dir().join(format!("relay-migrate-{}", std::process::id()));
        let path = dir.join("relay.db");
        let setting = DatabaseSetting::Sqlite(path.clone());
        Database::open(&setting).await.unwrap();
        let db = Database::open(&setting).await.unwrap();
        let rows = db
            .query(
                "SELECT version FROM schema_migrations",
                vec![],
                &[Kind::Int],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), STEPS.len());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_database_from_a_newer_release_is_refused_with_what_to_do() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        db.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
            vec![(VERSION + 5).into(), 0.into()],
        )
        .await
        .unwrap();
        let error = migrate(&db).await.unwrap_err();
        assert!(
            error.0.contains("newer than this ModelRelay knows"),
            "{error}"
        );
    }
}
