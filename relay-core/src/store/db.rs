//! One handle on the proxy's database: an embedded SQLite file (the zero-configuration default)
//! or a PostgreSQL server (`DATABASE_URL`), behind the same few calls, so the code above writes
//! each query once.
//!
//! The SQL is the part of the language both understand: `$1`-style parameters (SQLite reads
//! `$1` as a named parameter, numbered in order of first appearance, so every statement here uses
//! them in order), `BIGINT` and `TEXT` columns, `INSERT … ON CONFLICT … DO UPDATE`. Values are
//! 64-bit integers or text, either possibly NULL; sums are cast to `BIGINT` (PostgreSQL would
//! make them NUMERIC).
//!
//! SQLite calls run on the blocking pool (the library is synchronous); PostgreSQL uses one
//! connection, made again when the server dropped it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::health::StoreHealth;

/// A failure of the database, with what was being done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DbError(pub String);

impl DbError {
    fn new(doing: &str, error: impl std::fmt::Display) -> DbError {
        DbError(format!("{doing}: {error}"))
    }
}

/// A statement parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// A 64-bit integer, or NULL.
    Int(Option<i64>),
    /// Text, or NULL.
    Text(Option<String>),
}

impl From<i64> for Param {
    fn from(value: i64) -> Param {
        Param::Int(Some(value))
    }
}

impl From<Option<i64>> for Param {
    fn from(value: Option<i64>) -> Param {
        Param::Int(value)
    }
}

impl From<&str> for Param {
    fn from(value: &str) -> Param {
        Param::Text(Some(value.to_string()))
    }
}

impl From<String> for Param {
    fn from(value: String) -> Param {
        Param::Text(Some(value))
    }
}

impl From<Option<String>> for Param {
    fn from(value: Option<String>) -> Param {
        Param::Text(value)
    }
}

/// The type of a result column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Text,
}

/// One result row, its columns in the order of the query's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row(Vec<Param>);

impl Row {
    /// Column `i` as an integer (0 for NULL).
    pub fn int(&self, i: usize) -> i64 {
        self.opt_int(i).unwrap_or(0)
    }

    /// Column `i` as an integer, `None` for NULL.
    pub fn opt_int(&self, i: usize) -> Option<i64> {
        match self.0.get(i) {
            Some(Param::Int(value)) => *value,
            _ => None,
        }
    }

    /// Column `i` as text (empty for NULL).
    pub fn text(&self, i: usize) -> String {
        self.opt_text(i).unwrap_or_default()
    }

    /// Column `i` as text, `None` for NULL.
    pub fn opt_text(&self, i: usize) -> Option<String> {
        match self.0.get(i) {
            Some(Param::Text(value)) => value.clone(),
            _ => None,
        }
    }
}

/// A table's columns as one list, read by name: what a `SELECT` names, the kinds its rows are
/// decoded as, and where each name's value sits in a row all follow from it, so a column added
/// or moved is one entry here, never a position kept in step by hand.
#[derive(Debug, Clone, Copy)]
pub struct Columns(pub &'static [(&'static str, Kind)]);

impl Columns {
    /// `a, b, c`: the columns for a `SELECT`.
    pub fn list(&self) -> String {
        self.0
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The kinds a row of them decodes as.
    pub fn kinds(&self) -> Vec<Kind> {
        self.0.iter().map(|(_, kind)| *kind).collect()
    }

    /// `row` (of a query naming [`Columns::list`]) read by column name.
    pub fn read<'r>(&'r self, row: &'r Row) -> NamedRow<'r> {
        NamedRow { columns: self, row }
    }
}

/// A row read by column name ([`Columns::read`]).
pub struct NamedRow<'r> {
    columns: &'r Columns,
    row: &'r Row,
}

impl NamedRow<'_> {
    /// Where `name` sits. A name not in the list is a mistake in the code that reads it, found
    /// by the first test that reads such a row.
    fn at(&self, name: &str) -> usize {
        self.columns
            .0
            .iter()
            .position(|(column, _)| *column == name)
            .unwrap_or_else(|| panic!("column {name} is not in the list read"))
    }

    /// Column `name` as an integer (0 for NULL).
    pub fn int(&self, name: &str) -> i64 {
        self.row.int(self.at(name))
    }

    /// Column `name` as an integer, `None` for NULL.
    pub fn opt_int(&self, name: &str) -> Option<i64> {
        self.row.opt_int(self.at(name))
    }

    /// Column `name` as text (empty for NULL).
    pub fn text(&self, name: &str) -> String {
        self.row.text(self.at(name))
    }

    /// Column `name` as text, `None` for NULL.
    pub fn opt_text(&self, name: &str) -> Option<String> {
        self.row.opt_text(self.at(name))
    }
}

/// A statement and its parameters, for [`Database::transaction`].
pub type Statement = (String, Vec<Param>);

/// The statements that make `table`'s rows (keyed by their `name` column) `now`, given what was
/// stored `before`: a delete for each name gone, `upsert` (with the parameters `params` gives)
/// for each row new or changed; none when nothing changed. Writing only what changed keeps
/// proxies that share a database from erasing each other's rows wholesale.
pub fn changed_rows<T: PartialEq>(
    table: &str,
    upsert: &str,
    before: &std::collections::HashMap<String, T>,
    now: &std::collections::HashMap<String, T>,
    params: impl Fn(&str, &T) -> Vec<Param>,
) -> Vec<Statement> {
    let gone = before
        .keys()
        .filter(|name| !now.contains_key(*name))
        .map(|name| {
            let delete = format!("DELETE FROM {table} WHERE name = $1");
            (delete, vec![name.as_str().into()])
        });
    let changed = now
        .iter()
        .filter(|(name, row)| before.get(*name) != Some(*row))
        .map(|(name, row)| (upsert.to_string(), params(name, row)));
    gone.chain(changed).collect()
}

/// Which database a proxy keeps its keys and usage in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseSetting {
    /// An SQLite file (created when missing).
    Sqlite(std::path::PathBuf),
    /// An SQLite database in memory, gone with the process (tests, and proxies built without a
    /// data directory).
    Memory,
    /// A PostgreSQL server, `postgres://user:password@host:port/database`.
    Postgres(String),
}

impl DatabaseSetting {
    /// What to say about it in logs and the banner (a PostgreSQL URL without its password).
    pub fn describe(&self) -> String {
        match self {
            DatabaseSetting::Sqlite(path) => format!("SQLite {}", path.display()),
            DatabaseSetting::Memory => "SQLite in memory (nothing is kept across restarts)".into(),
            DatabaseSetting::Postgres(url) => format!("PostgreSQL {}", redact_url(url)),
        }
    }
}

/// `url` with its password (if any) replaced by `***`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((credentials, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    match credentials.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// The proxy's database; cheap to clone.
#[derive(Clone)]
pub struct Database {
    backend: Arc<Backend>,
    /// Whether writes work, and what failed ones cost; shared by every clone.
    health: Arc<StoreHealth>,
    /// Opened for reading only (a read-only data directory): every write is refused at once.
    read_only: bool,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.backend {
            Backend::Sqlite(_) => f.write_str("Database(SQLite)"),
            Backend::Postgres(pg) => write!(f, "Database(PostgreSQL {})", redact_url(&pg.url)),
        }
    }
}

enum Backend {
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Postgres(Box<Postgres>),
}

struct Postgres {
    url: String,
    client: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
}

impl Database {
    /// Connects to (creating when missing) the database `setting` names, its schema as found;
    /// [`Database::open`] (in `migrations`) also brings the schema up to date.
    pub(super) async fn connect(setting: &DatabaseSetting) -> Result<Database, DbError> {
        let backend = match setting {
            DatabaseSetting::Sqlite(path) => Backend::Sqlite(open_sqlite(Some(path))?),
            DatabaseSetting::Memory => Backend::Sqlite(open_sqlite(None)?),
            DatabaseSetting::Postgres(url) => {
                let pg = Postgres {
                    url: url.clone(),
                    client: tokio::sync::Mutex::new(None),
                };
                // Connect now, so a wrong URL is a start-up error, not a first request's.
                drop(pg.client().await?);
                Backend::Postgres(Box::new(pg))
            }
        };
        Ok(Database {
            backend: Arc::new(backend),
            health: Arc::default(),
            read_only: false,
        })
    }

    /// The SQLite file at `path`, opened for reading only: for a data directory that cannot be
    /// written (read-only, or its disk full), so the keys in it still guard the relay. Its schema
    /// must be this release's (upgrading it needs writes). `health` says why from the start.
    pub async fn open_read_only(path: &Path, why: String) -> Result<Database, DbError> {
        let path = path.to_path_buf();
        let connection = blocking(move || open_sqlite_read_only(&path)).await?;
        let database = Database {
            backend: Arc::new(Backend::Sqlite(connection)),
            health: Arc::default(),
            read_only: true,
        };
        database.health.opened_read_only(why);
        Ok(database)
    }

    /// An empty database in memory standing in for one that could not be opened (`why`):
    /// serving goes on, nothing written to it outlives the process, and health says so.
    pub async fn stand_in(why: String) -> Result<Database, DbError> {
        let database = Database::open(&DatabaseSetting::Memory).await?;
        database.health.opened_read_only(why);
        Ok(database)
    }

    /// Whether writes work, and what failed ones cost.
    pub fn health(&self) -> &Arc<StoreHealth> {
        &self.health
    }

    /// Whether other proxies may share it (PostgreSQL): what this proxy caches must then be read
    /// again now and then.
    pub fn is_shared(&self) -> bool {
        matches!(&*self.backend, Backend::Postgres(_))
    }

    /// Runs one statement; returns the rows it changed.
    pub async fn execute(&self, sql: &str, params: Vec<Param>) -> Result<u64, DbError> {
        let changed = self.transaction(vec![(sql.to_string(), params)]).await?;
        Ok(changed[0])
    }

    /// Runs `statements` in one transaction (all or none); returns the rows each changed. A
    /// failure is also told to [`Database::health`].
    pub async fn transaction(&self, statements: Vec<Statement>) -> Result<Vec<u64>, DbError> {
        if self.read_only {
            self.health
                .write_failed("the database was opened read-only");
            return Err(DbError(
                "the proxy's data directory could not be written when it started: keys cannot \
                 be created or revoked until it is restarted with a writable one"
                    .to_string(),
            ));
        }
        let result = self.write(statements).await;
        match &result {
            Ok(_) => self.health.write_succeeded(),
            Err(error) => self.health.write_failed(&error.0),
        }
        result
    }

    async fn write(&self, statements: Vec<Statement>) -> Result<Vec<u64>, DbError> {
        match &*self.backend {
            Backend::Sqlite(connection) => {
                let connection = Arc::clone(connection);
                blocking(move || {
                    let mut connection = lock(&connection);
                    let tx = connection
                        .transaction()
                        .map_err(|e| DbError::new("starting a transaction", e))?;
                    let mut changed = Vec::with_capacity(statements.len());
                    for (sql, params) in &statements {
                        // Cached: the usage writer runs the same few statements all day.
                        let n = tx
                            .prepare_cached(sql)
                            .and_then(|mut statement| {
                                statement.execute(rusqlite::params_from_iter(
                                    params.iter().map(to_sqlite),
                                ))
                            })
                            .map_err(|e| DbError::new(first_words(sql), e))?;
                        changed.push(n as u64);
                    }
                    tx.commit().map_err(|e| DbError::new("committing", e))?;
                    Ok(changed)
                })
                .await
            }
            Backend::Postgres(pg) => {
                let mut guard = pg.client().await?;
                let client = guard.as_mut().expect("connected by client()");
                let result = async {
                    let tx = client.transaction().await?;
                    let mut changed = Vec::with_capacity(statements.len());
                    for (sql, params) in &statements {
                        let values: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> =
                            params.iter().map(to_postgres).collect();
                        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                            values.iter().map(|v| &**v as _).collect();
                        changed.push(tx.execute(sql.as_str(), &refs).await?);
                    }
                    tx.commit().await?;
                    Ok::<_, tokio_postgres::Error>(changed)
                }
                .await;
                result.map_err(|e| pg.failed(&mut guard, "a write", e))
            }
        }
    }

    /// Every row of `SELECT <columns> <from>` (`from`: the table and what orders or filters it,
    /// without parameters).
    pub async fn select_all(&self, columns: &Columns, from: &str) -> Result<Vec<Row>, DbError> {
        let sql = format!("SELECT {} {from}", columns.list());
        self.query(&sql, vec![], &columns.kinds()).await
    }

    /// Runs a query whose columns have the types `kinds`.
    pub async fn query(
        &self,
        sql: &str,
        params: Vec<Param>,
        kinds: &[Kind],
    ) -> Result<Vec<Row>, DbError> {
        let kinds = kinds.to_vec();
        match &*self.backend {
            Backend::Sqlite(connection) => {
                let connection = Arc::clone(connection);
                let sql = sql.to_string();
                blocking(move || {
                    let connection = lock(&connection);
                    let mut statement = connection
                        .prepare_cached(&sql)
                        .map_err(|e| DbError::new(first_words(&sql), e))?;
                    let rows = statement
                        .query_map(
                            rusqlite::params_from_iter(params.iter().map(to_sqlite)),
                            |row| {
                                let mut columns = Vec::with_capacity(kinds.len());
                                for (i, kind) in kinds.iter().enumerate() {
                                    columns.push(match kind {
                                        Kind::Int => Param::Int(row.get(i)?),
                                        Kind::Text => Param::Text(row.get(i)?),
                                    });
                                }
                                Ok(Row(columns))
                            },
                        )
                        .map_err(|e| DbError::new(first_words(&sql), e))?;
                    rows.collect::<Result<Vec<Row>, _>>()
                        .map_err(|e| DbError::new(first_words(&sql), e))
                })
                .await
            }
            Backend::Postgres(pg) => {
                let mut guard = pg.client().await?;
                let client = guard.as_mut().expect("connected by client()");
                let values: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> =
                    params.iter().map(to_postgres).collect();
                let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    values.iter().map(|v| &**v as _).collect();
                let rows = match client.query(sql, &refs).await {
                    Ok(rows) => rows,
                    Err(e) => return Err(pg.failed(&mut guard, first_words(sql), e)),
                };
                rows.iter()
                    .map(|row| {
                        let mut columns = Vec::with_capacity(kinds.len());
                        for (i, kind) in kinds.iter().enumerate() {
                            columns.push(match kind {
                                Kind::Int => Param::Int(row.try_get(i)?),
                                Kind::Text => Param::Text(row.try_get(i)?),
                            });
                        }
                        Ok(Row(columns))
                    })
                    .collect::<Result<Vec<Row>, tokio_postgres::Error>>()
                    .map_err(|e| DbError::new(first_words(sql), e))
            }
        }
    }

    /// Runs several `;`-separated statements without parameters (schema changes).
    pub async fn batch(&self, sql: &str) -> Result<(), DbError> {
        match &*self.backend {
            Backend::Sqlite(connection) => {
                let connection = Arc::clone(connection);
                let sql = sql.to_string();
                blocking(move || {
                    lock(&connection)
                        .execute_batch(&sql)
                        .map_err(|e| DbError::new("changing the schema", e))
                })
                .await
            }
            Backend::Postgres(pg) => {
                let mut guard = pg.client().await?;
                let client = guard.as_mut().expect("connected by client()");
                match client.batch_execute(sql).await {
                    Ok(()) => Ok(()),
                    Err(e) => Err(pg.failed(&mut guard, "changing the schema", e)),
                }
            }
        }
    }
}

impl Postgres {
    /// The connection, made when there is none.
    async fn client(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<tokio_postgres::Client>>, DbError> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
                .await
                .map_err(|e| {
                    DbError(format!(
                        "cannot connect to PostgreSQL at {}: {e}; check DATABASE_URL and that \
                         the server accepts connections",
                        redact_url(&self.url)
                    ))
                })?;
            tokio::spawn(async move {
                if let Err(error) = connection.await {
                    tracing::warn!(%error, "PostgreSQL connection ended");
                }
            });
            *guard = Some(client);
        }
        Ok(guard)
    }

    /// The error of a call; a connection the server closed is dropped, to be made again.
    fn failed(
        &self,
        guard: &mut Option<tokio_postgres::Client>,
        doing: &str,
        error: tokio_postgres::Error,
    ) -> DbError {
        if error.is_closed() {
            *guard = None;
        }
        DbError::new(doing, error)
    }
}

fn open_sqlite(path: Option<&Path>) -> Result<Arc<Mutex<rusqlite::Connection>>, DbError> {
    let connection = match path {
        Some(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| DbError::new(&format!("creating {}", dir.display()), e))?;
            }
            rusqlite::Connection::open(path)
                .map_err(|e| DbError::new(&format!("opening {}", path.display()), e))?
        }
        None => rusqlite::Connection::open_in_memory()
            .map_err(|e| DbError::new("opening an in-memory database", e))?,
    };
    // WAL: readers (the usage page) do not wait for the usage writer; a second process opening
    // the same file waits a little instead of failing at once.
    connection
        .execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
        .map_err(|e| DbError::new("setting up SQLite", e))?;
    connection
        .busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| DbError::new("setting up SQLite", e))?;
    if let Some(path) = path {
        restrict_to_owner(path);
    }
    Ok(Arc::new(Mutex::new(connection)))
}

/// `path` for reading only. WAL mode keeps its shared index in a `-shm` file beside the
/// database, which a read-only directory cannot hold: then the file is read as immutable, which
/// is sound only when no write-ahead log holds changes the file does not (a clean shutdown
/// leaves none; after a crash the log is replayed by the next writable open).
fn open_sqlite_read_only(path: &Path) -> Result<Arc<Mutex<rusqlite::Connection>>, DbError> {
    use rusqlite::OpenFlags;
    let opening = |uri: String| {
        let connection = rusqlite::Connection::open_with_flags(
            &uri,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
        )?;
        // Reading the schema proves the file can be read, not just opened.
        connection.query_row("SELECT COUNT(*) FROM sqlite_master", [], |_| Ok(()))?;
        Ok::<_, rusqlite::Error>(connection)
    };
    if !path.exists() {
        return Err(DbError(format!("{} does not exist", path.display())));
    }
    let uri = |extra: &str| format!("file:{}?mode=ro{extra}", path.display());
    let connection = match opening(uri("")) {
        Ok(connection) => connection,
        Err(plain) => {
            let mut wal = path.as_os_str().to_owned();
            wal.push("-wal");
            let pending = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0);
            if pending {
                return Err(DbError::new(
                    &format!(
                        "reading {} (its write-ahead log holds changes only a writable open \
                         applies)",
                        path.display()
                    ),
                    plain,
                ));
            }
            opening(uri("&immutable=1"))
                .map_err(|e| DbError::new(&format!("reading {}", path.display()), e))?
        }
    };
    connection
        .busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| DbError::new("setting up SQLite", e))?;
    Ok(Arc::new(Mutex::new(connection)))
}

/// The database holds key hashes and who used what: only its owner reads it.
fn restrict_to_owner(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
    #[cfg(not(unix))]
    let _ = path;
}

fn lock(
    connection: &Mutex<rusqlite::Connection>,
) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
    // A panic inside a call leaves the connection usable: its transaction was rolled back.
    connection
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, DbError> + Send + 'static,
) -> Result<T, DbError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| DbError::new("a database call", e))?
}

fn to_sqlite(param: &Param) -> rusqlite::types::Value {
    use rusqlite::types::Value;
    match param {
        Param::Int(Some(n)) => Value::Integer(*n),
        Param::Text(Some(text)) => Value::Text(text.clone()),
        Param::Int(None) | Param::Text(None) => Value::Null,
    }
}

fn to_postgres(param: &Param) -> Box<dyn tokio_postgres::types::ToSql + Sync + Send> {
    match param {
        Param::Int(value) => Box::new(*value),
        Param::Text(value) => Box::new(value.clone()),
    }
}

/// The start of a statement, to say which one failed.
fn first_words(sql: &str) -> &str {
    let sql = sql.trim_start();
    let end = sql
        .char_indices()
        .filter(|(_, c)| c.is_whitespace())
        .nth(2)
        .map_or(sql.len(), |(i, _)| i);
    &sql[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dollar_parameters_bind_in_order_in_sqlite() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        db.batch("CREATE TABLE t (a BIGINT, b TEXT, c TEXT)")
            .await
            .unwrap();
        db.execute(
            "INSERT INTO t (a, b, c) VALUES ($1, $2, $3)",
            vec![7.into(), "x".into(), Param::Text(None)],
        )
        .await
        .unwrap();
        let rows = db
            .query(
                "SELECT a, b, c FROM t WHERE a = $1 AND b = $2",
                vec![7.into(), "x".into()],
                &[Kind::Int, Kind::Text, Kind::Text],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].int(0), rows[0].text(1)), (7, "x".to_string()));
        assert_eq!(rows[0].opt_text(2), None);
    }

    #[tokio::test]
    async fn a_failed_statement_rolls_back_the_whole_transaction() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        db.batch("CREATE TABLE t (a BIGINT PRIMARY KEY)")
            .await
            .unwrap();
        let error = db
            .transaction(vec![
                ("INSERT INTO t (a) VALUES ($1)".into(), vec![1.into()]),
                ("INSERT INTO t (a) VALUES ($1)".into(), vec![1.into()]),
            ])
            .await
            .unwrap_err();
        assert!(error.0.starts_with("INSERT INTO t"), "{error}");
        let rows = db
            .query("SELECT a FROM t", vec![], &[Kind::Int])
            .await
            .unwrap();
        assert!(rows.is_empty());
    }

    #[test]
    fn a_postgres_url_is_shown_without_its_password() {
        assert_eq!(
            redact_url("postgres://relay:hunter2@db:5432/relay"),
            "postgres://relay:***@db:5432/relay"
        );
        assert_eq!(redact_url("postgres://db/relay"), "postgres://db/relay");
    }
}
