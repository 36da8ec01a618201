//! Usage that lasts: every finished request, per key, model, worker and outcome.
//!
//! Requests hand their record to [`UsageLog::record`], which never waits: records go through a
//! bounded channel to one writer task that stores them in batches (one transaction every
//! [`FLUSH_EVERY`] or [`BATCH`] records), as raw rows and as daily roll-ups updated in the same
//! transaction. Raw rows are pruned by age and count; roll-ups are kept much longer and answer
//! the queries, so a query's cost does not grow with traffic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use super::dates::{day_of, now_ms};
use super::db::{Database, DbError, Kind, Param, Statement};
use super::keys::KeyStore;

/// The key of requests made without one.
pub const ANONYMOUS: &str = "anonymous";
/// Records waiting for the writer at most; beyond, records are dropped and counted.
const QUEUE: usize = 65_536;
/// The writer stores a record at most this long after it arrived.
const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// And at most this many records per transaction.
const BATCH: usize = 2_000;
/// Distinct model names recorded in one day at most; later ones are recorded as [`OTHER_MODEL`].
/// Model names come from clients (an upstream takes any name), so without a bound a client
/// inventing names would add a daily roll-up row per name. The count restarts with the
/// process, so a restart admits at most this many more that day.
pub const MAX_MODELS_PER_DAY: usize = 200;

/// The model name usage beyond [`MAX_MODELS_PER_DAY`] is recorded under.
pub const OTHER_MODEL: &str = "other";

/// How often old rows are pruned: at start, then after the first batch stored this long after
/// the last pruning (an idle proxy adds no rows; old ones wait for its next batch).
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// How much usage is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageRetention {
    /// Raw rows (one per request) older than this many days are deleted.
    pub raw_days: u32,
    /// And beyond this many rows, the oldest.
    pub raw_rows: u64,
    /// Daily roll-ups older than this many days are deleted.
    pub daily_days: u32,
}

impl Default for UsageRetention {
    fn default() -> Self {
        UsageRetention {
            raw_days: 7,
            raw_rows: 1_000_000,
            daily_days: 400,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Answered with a status below 400.
    Ok,
    /// Answered with an error (the backend's or the relay's).
    Error,
    /// The client left before the end.
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// One finished request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRecord {
    /// When it ended, Unix ms.
    pub at: i64,
    /// The key's id, or [`ANONYMOUS`].
    pub key: std::borrow::Cow<'static, str>,
    pub model: String,
    /// The worker's name, the upstream's, or empty when none answered.
    pub worker: String,
    pub outcome: Outcome,
    /// The HTTP status the client got (0 when it left first).
    pub status: u16,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Time to first byte.
    pub ttft_ms: Option<u64>,
    pub duration_ms: u64,
}

enum Message {
    Record(UsageRecord),
    Flush(oneshot::Sender<()>),
}

/// Where requests report their usage; cheap to clone.
#[derive(Clone)]
pub struct UsageLog {
    sender: mpsc::Sender<Message>,
    dropped: Arc<AtomicU64>,
    db: Database,
}

impl std::fmt::Debug for UsageLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageLog").field("db", &self.db).finish()
    }
}

impl UsageLog {
    /// Starts the writer; it ends, after storing what it was given, when every clone of the
    /// log is gone.
    pub fn start(db: Database, keys: Option<Arc<KeyStore>>, retention: UsageRetention) -> UsageLog {
        let (sender, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(write_loop(db.clone(), keys, retention, receiver));
        UsageLog {
            sender,
            dropped: Arc::new(AtomicU64::new(0)),
            db,
        }
    }

    /// Records a finished request; never waits.
    pub fn record(&self, record: UsageRecord) {
        if self.sender.try_send(Message::Record(record)).is_err() {
            // Only when the writer is far behind (or the database down for long): say so,
            // once per thousand, rather than slow requests down.
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed);
            if dropped.is_multiple_of(1000) {
                tracing::warn!(
                    dropped = dropped + 1,
                    "usage records dropped: the usage writer is behind"
                );
            }
        }
    }

    /// Whether the database takes writes, and what failed writes cost.
    pub fn health(&self) -> Arc<super::StoreHealth> {
        Arc::clone(self.db.health())
    }

    /// Records dropped because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Waits until everything recorded so far is stored.
    pub async fn flush(&self) {
        let (done, stored) = oneshot::channel();
        if self.sender.send(Message::Flush(done)).await.is_ok() {
            let _ = stored.await;
        }
    }

    /// Usage as `query` asks.
    pub async fn query(&self, query: &UsageQuery) -> Result<UsageReport, DbError> {
        run_query(&self.db, query).await
    }
}

async fn write_loop(
    db: Database,
    keys: Option<Arc<KeyStore>>,
    retention: UsageRetention,
    mut receiver: mpsc::Receiver<Message>,
) {
    prune(&db, retention).await;
    let mut pruned = tokio::time::Instant::now();
    let mut models = DayModels::default();
    // Raw rows now, as far as this writer knows: counted once, then kept up to date, so the
    // bound on rows holds after every batch without counting the table each time.
    let mut raw_rows = count_raw_rows(&db).await;
    let mut batch = Vec::new();
    let mut waiting = Vec::new();
    loop {
        // The batch's clock starts with its first record: with nothing to store, the writer
        // sleeps until something arrives instead of waking twice a second on an idle proxy.
        let mut deadline = None;
        let open = loop {
            let message = match deadline {
                None => receiver.recv().await,
                Some(deadline) => tokio::select! {
                    message = receiver.recv() => message,
                    _ = tokio::time::sleep_until(deadline) => break true,
                },
            };
            match message {
                Some(Message::Record(record)) => {
                    batch.push(record);
                    deadline.get_or_insert_with(|| tokio::time::Instant::now() + FLUSH_EVERY);
                    if batch.len() >= BATCH {
                        break true;
                    }
                }
                Some(Message::Flush(done)) => {
                    waiting.push(done);
                    break true;
                }
                None => break false,
            }
        };
        if !batch.is_empty() {
            for record in &mut batch {
                models.admit(record);
            }
            raw_rows += batch.len() as u64;
            store(&db, keys.as_deref(), std::mem::take(&mut batch)).await;
            // A hundredth of slack: a proxy at its bound prunes every ~1% of new rows, not
            // after every batch (each prune scans the index for the cut).
            if raw_rows > retention.raw_rows + retention.raw_rows / 100 {
                prune_by_count(&db, retention).await;
                raw_rows = raw_rows.min(retention.raw_rows);
            }
        }
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
        if !open {
            return;
        }
        if pruned.elapsed() >= PRUNE_EVERY {
            prune(&db, retention).await;
            pruned = tokio::time::Instant::now();
        }
    }
}

/// Raw rows per `INSERT` statement: one statement text for every full chunk (prepared once and
/// reused), instead of a statement per request.
const ROWS_PER_INSERT: usize = 50;

/// What a batch adds to one day's roll-up of one key, model, worker and outcome.
#[derive(Debug, Default)]
struct DayAddition {
    requests: i64,
    errors: i64,
    input_tokens: i64,
    output_tokens: i64,
    ttft_ms_sum: i64,
    ttft_count: i64,
    duration_ms_sum: i64,
}

/// Stores a batch in one transaction: its raw rows (a few multi-row inserts), one roll-up
/// update per group it touched (not per request), and keys' last use. A batch the database
/// refuses is logged with its size (the proxy keeps serving; usage is not worth a failed
/// request).
async fn store(db: &Database, keys: Option<&KeyStore>, batch: Vec<UsageRecord>) {
    let mut statements: Vec<Statement> = batch.chunks(ROWS_PER_INSERT).map(insert_events).collect();
    let mut days: HashMap<(String, &str, &str, &str, &'static str), DayAddition> = HashMap::new();
    let mut last_used: HashMap<String, i64> = HashMap::new();
    for r in &batch {
        let day = days
            .entry((
                day_of(r.at),
                &*r.key,
                &r.model,
                &r.worker,
                r.outcome.as_str(),
            ))
            .or_default();
        day.requests += 1;
        day.errors += i64::from(r.outcome == Outcome::Error);
        day.input_tokens += r.input_tokens as i64;
        day.output_tokens += r.output_tokens as i64;
        if let Some(ttft) = r.ttft_ms {
            day.ttft_ms_sum += ttft as i64;
            day.ttft_count += 1;
        }
        day.duration_ms_sum += r.duration_ms as i64;
        if &*r.key != ANONYMOUS {
            let at = last_used.entry(r.key.to_string()).or_default();
            *at = (*at).max(r.at);
        }
    }
    for ((day, key, model, worker, outcome), add) in days {
        statements.push((
            "INSERT INTO usage_daily (day, key_id, model, worker, outcome, requests, errors, \
             input_tokens, output_tokens, ttft_ms_sum, ttft_count, duration_ms_sum) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
             ON CONFLICT (day, key_id, model, worker, outcome) DO UPDATE SET \
             requests = usage_daily.requests + excluded.requests, \
             errors = usage_daily.errors + excluded.errors, \
             input_tokens = usage_daily.input_tokens + excluded.input_tokens, \
             output_tokens = usage_daily.output_tokens + excluded.output_tokens, \
             ttft_ms_sum = usage_daily.ttft_ms_sum + excluded.ttft_ms_sum, \
             ttft_count = usage_daily.ttft_count + excluded.ttft_count, \
             duration_ms_sum = usage_daily.duration_ms_sum + excluded.duration_ms_sum"
                .to_string(),
            vec![
                day.into(),
                key.into(),
                model.into(),
                worker.into(),
                outcome.into(),
                add.requests.into(),
                add.errors.into(),
                add.input_tokens.into(),
                add.output_tokens.into(),
                add.ttft_ms_sum.into(),
                add.ttft_count.into(),
                add.duration_ms_sum.into(),
            ],
        ));
    }
    statements.extend(KeyStore::last_used_statements(&last_used));
    match db.transaction(statements).await {
        Ok(_) => {
            if let (Some(keys), false) = (keys, last_used.is_empty()) {
                if let Err(error) = keys.reload().await {
                    tracing::warn!(%error, "could not re-read the keys after recording their use");
                }
            }
        }
        // The database's health says it (once, not every batch) and counts what is lost.
        Err(_) => db.health().usage_not_stored(batch.len()),
    }
}

/// One `INSERT` of `rows` as raw usage rows.
fn insert_events(rows: &[UsageRecord]) -> Statement {
    const COLUMNS: usize = 10;
    let mut sql = String::from(
        "INSERT INTO usage_events (at, key_id, model, worker, outcome, status, input_tokens, \
         output_tokens, ttft_ms, duration_ms) VALUES ",
    );
    let mut params: Vec<Param> = Vec::with_capacity(rows.len() * COLUMNS);
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        let placeholders: Vec<String> = (1..=COLUMNS)
            .map(|c| format!("${}", i * COLUMNS + c))
            .collect();
        sql.push('(');
        sql.push_str(&placeholders.join(", "));
        sql.push(')');
        params.extend([
            r.at.into(),
            r.key.to_string().into(),
            r.model.clone().into(),
            r.worker.clone().into(),
            r.outcome.as_str().into(),
            i64::from(r.status).into(),
            (r.input_tokens as i64).into(),
            (r.output_tokens as i64).into(),
            r.ttft_ms.map(|ms| ms as i64).into(),
            (r.duration_ms as i64).into(),
        ]);
    }
    (sql, params)
}

/// The model names recorded today, for [`MAX_MODELS_PER_DAY`].
#[derive(Debug, Default)]
struct DayModels {
    day: String,
    names: std::collections::HashSet<String>,
}

impl DayModels {
    /// Records `record` under its model while the day has room for another name (or already
    /// has this one), else under [`OTHER_MODEL`].
    fn admit(&mut self, record: &mut UsageRecord) {
        let day = day_of(record.at);
        if day != self.day {
            self.day = day;
            self.names.clear();
        }
        if self.names.contains(&record.model) {
            return;
        }
        if self.names.len() < MAX_MODELS_PER_DAY {
            self.names.insert(record.model.clone());
        } else {
            record.model = OTHER_MODEL.to_string();
        }
    }
}

/// Raw usage rows in the table (0 when it cannot be read: the next batch then counts again).
async fn count_raw_rows(db: &Database) -> u64 {
    db.query("SELECT COUNT(*) FROM usage_events", vec![], &[Kind::Int])
        .await
        .ok()
        .and_then(|rows| rows.first().map(|row| row.int(0).max(0) as u64))
        .unwrap_or(0)
}

/// Deletes the oldest raw rows beyond `retention.raw_rows`.
async fn prune_by_count(db: &Database, retention: UsageRetention) {
    let statement = (
        "DELETE FROM usage_events WHERE at <= (SELECT at FROM usage_events ORDER BY at DESC \
         LIMIT 1 OFFSET $1)"
            .into(),
        vec![(retention.raw_rows as i64).into()],
    );
    if let Err(error) = db.transaction(vec![statement]).await {
        tracing::warn!(%error, "usage rows beyond the bound not pruned");
    }
}

async fn prune(db: &Database, retention: UsageRetention) {
    let now = now_ms();
    let day_ms = 86_400_000i64;
    let statements: Vec<Statement> = vec![
        (
            "DELETE FROM usage_events WHERE at < $1".into(),
            vec![(now - i64::from(retention.raw_days) * day_ms).into()],
        ),
        (
            "DELETE FROM usage_daily WHERE day < $1".into(),
            vec![day_of(now - i64::from(retention.daily_days) * day_ms).into()],
        ),
    ];
    if let Err(error) = db.transaction(statements).await {
        tracing::warn!(%error, "old usage not pruned");
    }
    prune_by_count(db, retention).await;
}

/// How usage is grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(test, derive(ts_rs::TS))]
pub enum GroupBy {
    Day,
    Key,
    Model,
}

impl GroupBy {
    /// Parses `day`, `key` or `model`.
    pub fn parse(text: &str) -> Option<GroupBy> {
        match text {
            "day" => Some(GroupBy::Day),
            "key" => Some(GroupBy::Key),
            "model" => Some(GroupBy::Model),
            _ => None,
        }
    }

    fn column(self) -> &'static str {
        match self {
            GroupBy::Day => "day",
            GroupBy::Key => "key_id",
            GroupBy::Model => "model",
        }
    }
}

/// What to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageQuery {
    pub key: Option<String>,
    pub model: Option<String>,
    /// First day, `YYYY-MM-DD`.
    pub since: String,
    /// Last day, `YYYY-MM-DD` (included).
    pub until: String,
    pub group_by: GroupBy,
}

/// Sums over a group (or everything).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct UsageSums {
    pub requests: u64,
    pub errors: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Mean time to first byte over requests that got one.
    pub avg_ttft_ms: Option<f64>,
    pub avg_duration_ms: Option<f64>,
}

/// One group's usage.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct UsageRow {
    /// The day, key id (or `anonymous`) or model.
    pub group: String,
    /// The key's name, for rows grouped by key.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(optional))]
    pub name: Option<String>,
    #[serde(flatten)]
    pub sums: UsageSums,
}

/// The answer to a [`UsageQuery`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct UsageReport {
    pub group_by: GroupBy,
    pub since: String,
    pub until: String,
    pub rows: Vec<UsageRow>,
    pub totals: UsageSums,
}

async fn run_query(db: &Database, query: &UsageQuery) -> Result<UsageReport, DbError> {
    let mut filters = vec!["day >= $1".to_string(), "day <= $2".to_string()];
    let mut params: Vec<Param> = vec![query.since.clone().into(), query.until.clone().into()];
    if let Some(key) = &query.key {
        params.push(key.clone().into());
        filters.push(format!("key_id = ${}", params.len()));
    }
    if let Some(model) = &query.model {
        params.push(model.clone().into());
        filters.push(format!("model = ${}", params.len()));
    }
    let column = query.group_by.column();
    let sql = format!(
        "SELECT {column}, CAST(SUM(requests) AS BIGINT), CAST(SUM(errors) AS BIGINT), \
         CAST(SUM(input_tokens) AS BIGINT), CAST(SUM(output_tokens) AS BIGINT), \
         CAST(SUM(ttft_ms_sum) AS BIGINT), CAST(SUM(ttft_count) AS BIGINT), \
         CAST(SUM(duration_ms_sum) AS BIGINT) \
         FROM usage_daily WHERE {} GROUP BY {column} ORDER BY {column}",
        filters.join(" AND ")
    );
    let kinds = [
        Kind::Text,
        Kind::Int,
        Kind::Int,
        Kind::Int,
        Kind::Int,
        Kind::Int,
        Kind::Int,
        Kind::Int,
    ];
    let rows = db.query(&sql, params, &kinds).await?;
    let mut totals = Accumulated::default();
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let sums = Accumulated {
            requests: row.int(1),
            errors: row.int(2),
            input_tokens: row.int(3),
            output_tokens: row.int(4),
            ttft_sum: row.int(5),
            ttft_count: row.int(6),
            duration_sum: row.int(7),
        };
        totals.add(&sums);
        out.push(UsageRow {
            group: row.text(0),
            name: None,
            sums: sums.finish(),
        });
    }
    Ok(UsageReport {
        group_by: query.group_by,
        since: query.since.clone(),
        until: query.until.clone(),
        rows: out,
        totals: totals.finish(),
    })
}

#[derive(Debug, Default)]
struct Accumulated {
    requests: i64,
    errors: i64,
    input_tokens: i64,
    output_tokens: i64,
    ttft_sum: i64,
    ttft_count: i64,
    duration_sum: i64,
}

impl Accumulated {
    fn add(&mut self, other: &Accumulated) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.ttft_sum += other.ttft_sum;
        self.ttft_count += other.ttft_count;
        self.duration_sum += other.duration_sum;
    }

    fn finish(&self) -> UsageSums {
        let mean = |sum: i64, count: i64| (count > 0).then(|| sum as f64 / count as f64);
        UsageSums {
            requests: self.requests.max(0) as u64,
            errors: self.errors.max(0) as u64,
            input_tokens: self.input_tokens.max(0) as u64,
            output_tokens: self.output_tokens.max(0) as u64,
            avg_ttft_ms: mean(self.ttft_sum, self.ttft_count),
            avg_duration_ms: mean(self.duration_sum, self.requests),
        }
    }
}

/// The report as CSV: a header line, then one line per row (RFC 4180 quoting).
pub fn to_csv(report: &UsageReport) -> String {
    let quote = |field: &str| {
        if field.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", field.replace('"', "\"\""))
        } else {
            field.to_string()
        }
    };
    let number = |n: Option<f64>| n.map(|n| format!("{n:.1}")).unwrap_or_default();
    let mut csv = format!(
        "{},name,requests,errors,input_tokens,output_tokens,avg_ttft_ms,avg_duration_ms\r\n",
        match report.group_by {
            GroupBy::Day => "day",
            GroupBy::Key => "key",
            GroupBy::Model => "model",
        }
    );
    for row in &report.rows {
        let s = &row.sums;
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{}\r\n",
            quote(&row.group),
            quote(row.name.as_deref().unwrap_or("")),
            s.requests,
            s.errors,
            s.input_tokens,
            s.output_tokens,
            number(s.avg_ttft_ms),
            number(s.avg_duration_ms)
        ));
    }
    csv
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::db::DatabaseSetting;

    fn record(key: &str, model: &str, outcome: Outcome, at: i64) -> UsageRecord {
        UsageRecord {
            at,
            key: key.to_string().into(),
            model: model.into(),
            worker: "gpu-1".into(),
            outcome,
            status: if outcome == Outcome::Ok { 200 } else { 502 },
            input_tokens: 10,
            output_tokens: 5,
            ttft_ms: (outcome == Outcome::Ok).then_some(100),
            duration_ms: 300,
        }
    }

    #[tokio::test]
    async fn usage_is_summed_per_day_key_and_model_and_survives_a_reopen() {
        let dir = std::env::temp_dir().join(format!("relay-usage-{}", std::process::id()));
        let setting = DatabaseSetting::Sqlite(dir.join("relay.db"));
        let now = now_ms();
        let today = day_of(now);
        {
            let log = UsageLog::start(
                Database::open(&setting).await.unwrap(),
                None,
                UsageRetention::default(),
            );
            log.record(record("key_a", "m1", Outcome::Ok, now));
            log.record(record("key_a", "m2", Outcome::Ok, now));
            log.record(record(ANONYMOUS, "m1", Outcome::Error, now));
            log.flush().await;
        }
        let log = UsageLog::start(
            Database::open(&setting).await.unwrap(),
            None,
            UsageRetention::default(),
        );
        let query = |group_by, key: Option<&str>| UsageQuery {
            key: key.map(str::to_string),
            model: None,
            since: today.clone(),
            until: today.clone(),
            group_by,
        };
        let by_key = log.query(&query(GroupBy::Key, None)).await.unwrap();
        let groups: Vec<(&str, u64)> = by_key
            .rows
            .iter()
            .map(|r| (r.group.as_str(), r.sums.requests))
            .collect();
        assert_eq!(groups, [("anonymous", 1), ("key_a", 2)]);
        assert_eq!(by_key.totals.requests, 3);
        assert_eq!(by_key.totals.errors, 1);
        assert_eq!(by_key.totals.input_tokens, 30);
        assert_eq!(
            by_key.totals.avg_ttft_ms,
            Some(100.0),
            "over the requests that had one"
        );
        let by_model = log
            .query(&query(GroupBy::Model, Some("key_a")))
            .await
            .unwrap();
        let models: Vec<&str> = by_model.rows.iter().map(|r| r.group.as_str()).collect();
        assert_eq!(models, ["m1", "m2"]);
        let by_day = log.query(&query(GroupBy::Day, None)).await.unwrap();
        assert_eq!(by_day.rows.len(), 1);
        assert_eq!(by_day.rows[0].group, today);
        let csv = to_csv(&by_key);
        assert!(csv.starts_with("key,name,requests,"), "{csv}");
        assert!(
            csv.contains("\r\nkey_a,,2,0,20,10,100.0,300.0\r\n"),
            "{csv}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn old_raw_rows_are_pruned_and_roll_ups_stay() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        let retention = UsageRetention {
            raw_days: 7,
            raw_rows: 2,
            daily_days: 400,
        };
        let log = UsageLog::start(db.clone(), None, retention);
        let now = now_ms();
        let old = now - 10 * 86_400_000;
        for at in [old, now - 3, now - 2, now - 1] {
            log.record(record("k", "m", Outcome::Ok, at));
        }
        log.flush().await;
        prune(&db, retention).await;
        let raw = db
            .query(
                "SELECT at FROM usage_events ORDER BY at",
                vec![],
                &[Kind::Int],
            )
            .await
            .unwrap();
        let kept: Vec<i64> = raw.iter().map(|r| r.int(0)).collect();
        assert_eq!(kept, [now - 2, now - 1], "by age, then by count");
        let report = log
            .query(&UsageQuery {
                key: None,
                model: None,
                since: day_of(old),
                until: day_of(now),
                group_by: GroupBy::Day,
            })
            .await
            .unwrap();
        assert_eq!(report.totals.requests, 4, "the roll-ups keep every request");
    }

    #[tokio::test]
    async fn raw_rows_beyond_the_bound_go_after_every_batch_not_only_hourly() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        let retention = UsageRetention {
            raw_rows: 5,
            ..UsageRetention::default()
        };
        let log = UsageLog::start(db.clone(), None, retention);
        let now = now_ms();
        for round in 0..3i64 {
            for i in 0..12 {
                log.record(record("k", "m", Outcome::Ok, now - 100 + round * 20 + i));
            }
            log.flush().await;
            assert!(
                count_raw_rows(&db).await <= 5,
                "round {round}: {} rows",
                count_raw_rows(&db).await
            );
        }
        let report = log
            .query(&UsageQuery {
                key: None,
                model: None,
                since: day_of(now),
                until: day_of(now),
                group_by: GroupBy::Day,
            })
            .await
            .unwrap();
        assert_eq!(
            report.totals.requests, 36,
            "the roll-ups keep every request"
        );
    }

    #[test]
    fn model_names_beyond_the_days_bound_are_recorded_as_other() {
        let mut models = DayModels::default();
        let now = now_ms();
        let named = |name: &str, at: i64, models: &mut DayModels| {
            let mut r = record("k", name, Outcome::Ok, at);
            models.admit(&mut r);
            r.model
        };
        for i in 0..MAX_MODELS_PER_DAY {
            assert_eq!(named(&format!("m{i}"), now, &mut models), format!("m{i}"));
        }
        assert_eq!(named("one-too-many", now, &mut models), OTHER_MODEL);
        assert_eq!(
            named("m7", now, &mut models),
            "m7",
            "a name of the day stays"
        );
        let tomorrow = now + 86_400_000;
        assert_eq!(named("one-too-many", tomorrow, &mut models), "one-too-many");
    }

    #[tokio::test]
    async fn a_batch_larger_than_one_insert_keeps_every_row_and_sums_its_groups_once() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        let log = UsageLog::start(db.clone(), None, UsageRetention::default());
        let now = now_ms();
        let count = ROWS_PER_INSERT * 2 + 7;
        for i in 0..count {
            let key = if i % 3 == 0 { "key_a" } else { "key_b" };
            log.record(record(key, "m", Outcome::Ok, now));
        }
        log.flush().await;
        let raw = db
            .query(
                "SELECT CAST(COUNT(*) AS BIGINT) FROM usage_events",
                vec![],
                &[Kind::Int],
            )
            .await
            .unwrap();
        assert_eq!(raw[0].int(0), count as i64, "every request has its raw row");
        let groups = db
            .query(
                "SELECT key_id, requests FROM usage_daily ORDER BY key_id",
                vec![],
                &[Kind::Text, Kind::Int],
            )
            .await
            .unwrap();
        let sums: Vec<(String, i64)> = groups.iter().map(|r| (r.text(0), r.int(1))).collect();
        let a = (0..count).filter(|i| i % 3 == 0).count() as i64;
        assert_eq!(
            sums,
            [
                ("key_a".to_string(), a),
                ("key_b".to_string(), count as i64 - a)
            ]
        );
    }

    #[test]
    fn csv_fields_are_quoted_when_they_need_it() {
        let report = UsageReport {
            group_by: GroupBy::Model,
            since: "2026-01-01".into(),
            until: "2026-01-02".into(),
            rows: vec![UsageRow {
                group: "a,\"b\"\nc".into(),
                name: None,
                sums: UsageSums::default(),
            }],
            totals: UsageSums::default(),
        };
        assert!(to_csv(&report).contains("\r\n\"a,\"\"b\"\"\nc\",,0,0,0,0,,\r\n"));
    }
}
