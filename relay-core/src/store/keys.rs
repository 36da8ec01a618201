//! Client API keys: what a key may do, how one is made, and the store that checks them.
//!
//! A key is `mr-` and 40 random letters and digits (238 bits). Only its SHA-256 is stored, with
//! its first characters (`prefix`) so a person can tell keys apart; the secret is shown once, when
//! the key is made. Checking a key reads a map in memory, never the database: the map is loaded
//! at start, replaced after every change made here, and, when other proxies share the database
//! (PostgreSQL), read again every few seconds, which is how long a revocation made on another
//! proxy takes to reach this one.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rand::distr::{Alphanumeric, SampleString};
use serde::{Deserialize, Serialize};

use super::dates::rfc3339;
use super::db::{Columns, Database, DbError, Kind, Param, Row};

/// What every key starts with: clients and logs can tell a relay key from a provider's.
pub const KEY_PREFIX: &str = "mr-";
/// Random characters after the prefix.
const SECRET_CHARS: usize = 40;
/// Characters of a key kept in clear to tell keys apart (`mr-` and five more).
const SHOWN_CHARS: usize = 8;
/// How often a proxy sharing its database re-reads the keys.
pub const SHARED_REFRESH: Duration = Duration::from_secs(5);
/// A key unknown here may have just been made on another proxy sharing the database: it is
/// looked for again, but at most this often, so a flood of wrong keys costs few reads.
const MISS_RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Bounds of what a key may carry.
const MAX_NAME_CHARS: usize = 100;
const MAX_MODELS: usize = 256;
const MAX_MODEL_BYTES: usize = 256;
const MAX_CONCURRENT: u32 = 100_000;
const MAX_REQUESTS_PER_MINUTE: u32 = 1_000_000;
/// The largest weight a key may have in the queue's turns: the scheduler's stride divides evenly by
/// every weight up to it.
pub const MAX_WEIGHT: u32 = 16;

/// How urgent a key's requests are by default: under contention the relay serves interactive
/// requests before batch ones (batch still gets a share, so it never starves).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(test, derive(ts_rs::TS))]
pub enum KeyPriority {
    /// A person waits for the answers (chat, an editor).
    #[default]
    Interactive,
    /// Nobody watches (agents, evaluations, bulk jobs): its requests are always batch, whatever
    /// they ask for.
    Batch,
}

impl KeyPriority {
    /// Its stored form; `NULL` (keys made before it existed) reads as interactive.
    fn stored(self) -> Option<&'static str> {
        match self {
            KeyPriority::Interactive => None,
            KeyPriority::Batch => Some("batch"),
        }
    }
}

/// A key, without its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// `key_` and 16 hex digits.
    pub id: String,
    /// What it is for, as its creator named it.
    pub name: String,
    /// Its first characters, e.g. `mr-AbCdE`.
    pub prefix: String,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms; a revoked key is refused.
    pub revoked_at: Option<i64>,
    /// Unix ms of the last request made with it (updated with the usage, every second or so).
    pub last_used_at: Option<i64>,
    /// The models it may use; `None` for every model.
    pub models: Option<Vec<String>>,
    /// How many of its requests may run or wait at once.
    pub max_concurrent: Option<u32>,
    /// How many requests it may make per minute.
    pub requests_per_minute: Option<u32>,
    /// Its requests' priority.
    pub priority: KeyPriority,
    /// Its share of contended slots against other clients of its priority: a key of weight 3
    /// takes three turns for each one of a weight-1 key. `None` is 1.
    pub weight: Option<u32>,
}

impl ApiKey {
    /// Whether it may use `model`.
    pub fn allows(&self, model: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|models| models.iter().any(|m| m == model))
    }
}

/// A key as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct KeyView {
    pub id: String,
    pub name: String,
    pub prefix: String,
    pub created_at: String,
    pub revoked_at: Option<String>,
    pub last_used_at: Option<String>,
    pub models: Option<Vec<String>>,
    pub max_concurrent: Option<u32>,
    pub requests_per_minute: Option<u32>,
    pub priority: KeyPriority,
    pub weight: Option<u32>,
    /// The secret: only in the answer that created the key.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(optional))]
    pub key: Option<String>,
}

impl From<&ApiKey> for KeyView {
    fn from(key: &ApiKey) -> KeyView {
        KeyView {
            id: key.id.clone(),
            name: key.name.clone(),
            prefix: key.prefix.clone(),
            created_at: rfc3339(key.created_at),
            revoked_at: key.revoked_at.map(rfc3339),
            last_used_at: key.last_used_at.map(rfc3339),
            models: key.models.clone(),
            max_concurrent: key.max_concurrent,
            requests_per_minute: key.requests_per_minute,
            priority: key.priority,
            weight: key.weight,
            key: None,
        }
    }
}

/// What `POST /admin/keys` takes.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct NewKey {
    pub name: String,
    #[serde(default)]
    pub models: Option<Vec<String>>,
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Interactive when left out.
    #[serde(default)]
    pub priority: KeyPriority,
    /// 1 when left out.
    #[serde(default)]
    pub weight: Option<u32>,
}

impl NewKey {
    /// The request made sound, or what is wrong with it.
    fn checked(mut self) -> Result<NewKey, String> {
        self.name = self.name.trim().to_string();
        if self.name.is_empty() {
            return Err(
                "`name` must not be empty: say what the key is for, e.g. \"open-webui\"".into(),
            );
        }
        if self.name.chars().count() > MAX_NAME_CHARS {
            return Err(format!("`name` is longer than {MAX_NAME_CHARS} characters"));
        }
        if self.name.chars().any(char::is_control) {
            return Err("`name` must not contain control characters".into());
        }
        if let Some(models) = &mut self.models {
            if models.is_empty() {
                return Err("`models` is empty, which would allow nothing: leave it out to allow every model".into());
            }
            if models.len() > MAX_MODELS {
                return Err(format!("`models` lists more than {MAX_MODELS} models"));
            }
            for model in models.iter_mut() {
                *model = model.trim().to_string();
                if model.is_empty()
                    || model.len() > MAX_MODEL_BYTES
                    || model.chars().any(char::is_control)
                {
                    return Err(format!(
                        "`models` has an invalid name {model:?}: 1 to {MAX_MODEL_BYTES} bytes, no control characters"
                    ));
                }
            }
            models.sort();
            models.dedup();
        }
        if let Some(n) = self.max_concurrent {
            if n == 0 || n > MAX_CONCURRENT {
                return Err(format!("`max_concurrent` must be 1 to {MAX_CONCURRENT}"));
            }
        }
        if let Some(n) = self.requests_per_minute {
            if n == 0 || n > MAX_REQUESTS_PER_MINUTE {
                return Err(format!(
                    "`requests_per_minute` must be 1 to {MAX_REQUESTS_PER_MINUTE}"
                ));
            }
        }
        if let Some(n) = self.weight {
            if n == 0 || n > MAX_WEIGHT {
                return Err(format!(
                    "`weight` must be 1 to {MAX_WEIGHT}: the key's turns for each turn of a \
                     weight-1 key when they wait for the same slots"
                ));
            }
        }
        Ok(self)
    }
}

/// Why a key operation did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The request was not sound (the message says why).
    #[error("{0}")]
    Invalid(String),
    /// No key has this id.
    #[error("no key has the id {0}")]
    NotFound(String),
    /// The database failed.
    #[error("the key store failed: {0}")]
    Database(#[from] DbError),
}

/// The SHA-256 of a secret, in hex.
pub fn secret_hash(secret: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Keys by the hash of their secret.
type KeyMap = HashMap<String, Arc<ApiKey>>;

/// The keys of a proxy.
pub struct KeyStore {
    db: Database,
    by_hash: RwLock<Arc<KeyMap>>,
    /// When an unknown key last made the store re-read the keys.
    miss_reload: std::sync::Mutex<Option<std::time::Instant>>,
}

/// The columns a key is read from, by name.
const KEY_COLUMNS: Columns = Columns(&[
    ("id", Kind::Text),
    ("name", Kind::Text),
    ("prefix", Kind::Text),
    ("created_at", Kind::Int),
    ("revoked_at", Kind::Int),
    ("last_used_at", Kind::Int),
    ("models", Kind::Text),
    ("max_concurrent", Kind::Int),
    ("requests_per_minute", Kind::Int),
    ("secret_hash", Kind::Text),
    ("priority", Kind::Text),
    ("weight", Kind::Int),
]);

/// A key and its secret's hash, from a row of [`KEY_COLUMNS`].
fn key_of(row: &Row) -> (String, ApiKey) {
    let row = KEY_COLUMNS.read(row);
    let limit = |name| row.opt_int(name).and_then(|n| u32::try_from(n).ok());
    let key = ApiKey {
        id: row.text("id"),
        name: row.text("name"),
        prefix: row.text("prefix"),
        created_at: row.int("created_at"),
        revoked_at: row.opt_int("revoked_at"),
        last_used_at: row.opt_int("last_used_at"),
        models: row
            .opt_text("models")
            .and_then(|json| serde_json::from_str(&json).ok()),
        max_concurrent: limit("max_concurrent"),
        requests_per_minute: limit("requests_per_minute"),
        // Anything but `batch` (NULL, or a value a newer release wrote) is the default.
        priority: match row.opt_text("priority").as_deref() {
            Some("batch") => KeyPriority::Batch,
            _ => KeyPriority::Interactive,
        },
        // Out of range (a newer release, a hand edit) reads as the default.
        weight: limit("weight").filter(|w| (1..=MAX_WEIGHT).contains(w)),
    };
    (row.text("secret_hash"), key)
}

impl KeyStore {
    /// The keys of `db`, loaded; when the database is shared, re-read every
    /// [`SHARED_REFRESH`] for as long as the store lives.
    pub async fn open(db: Database) -> Result<Arc<KeyStore>, DbError> {
        let store = Arc::new(KeyStore {
            db,
            by_hash: RwLock::new(Arc::new(KeyMap::new())),
            miss_reload: std::sync::Mutex::new(None),
        });
        store.reload().await?;
        if store.db.is_shared() {
            let weak = Arc::downgrade(&store);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(SHARED_REFRESH);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(store) = weak.upgrade() else { return };
                    if let Err(error) = store.reload().await {
                        tracing::warn!(%error, "could not re-read the client API keys; using the ones read before");
                    }
                }
            });
        }
        Ok(store)
    }

    /// Reads every key again.
    pub async fn reload(&self) -> Result<(), DbError> {
        let rows = self.db.select_all(&KEY_COLUMNS, "FROM api_keys").await?;
        let map: KeyMap = rows
            .iter()
            .map(|row| {
                let (hash, key) = key_of(row);
                (hash, Arc::new(key))
            })
            .collect();
        *self.by_hash.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(map);
        Ok(())
    }

    fn keys(&self) -> Arc<KeyMap> {
        Arc::clone(&self.by_hash.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The live key whose secret is `secret`, if any (revoked keys are not).
    pub async fn authenticate(&self, secret: &str) -> Option<Arc<ApiKey>> {
        if !secret.starts_with(KEY_PREFIX) {
            return None;
        }
        let hash = secret_hash(secret);
        let live = |keys: &KeyMap| keys.get(&hash).filter(|k| k.revoked_at.is_none()).cloned();
        if let Some(key) = self.keys().get(&hash) {
            return key.revoked_at.is_none().then(|| Arc::clone(key));
        }
        if !(self.db.is_shared() && self.miss_reload_due()) {
            return None;
        }
        if let Err(error) = self.reload().await {
            tracing::warn!(%error, "could not re-read the client API keys");
        }
        live(&self.keys())
    }

    fn miss_reload_due(&self) -> bool {
        let mut last = self.miss_reload.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < MISS_RELOAD_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// Every key, newest first.
    pub fn list(&self) -> Vec<Arc<ApiKey>> {
        let mut keys: Vec<Arc<ApiKey>> = self.keys().values().cloned().collect();
        keys.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
        keys
    }

    /// The name of key `id`, if it exists.
    pub fn name_of(&self, id: &str) -> Option<String> {
        self.keys()
            .values()
            .find(|key| key.id == id)
            .map(|key| key.name.clone())
    }

    /// Makes a key; the answer carries its secret, which is never available again.
    pub async fn create(&self, new: NewKey) -> Result<KeyView, KeyError> {
        let new = new.checked().map_err(KeyError::Invalid)?;
        // The thread's generator is not held across an await (it cannot move between threads).
        let secret = format!(
            "{KEY_PREFIX}{}",
            Alphanumeric.sample_string(&mut rand::rng(), SECRET_CHARS)
        );
        let id = format!("key_{:016x}", rand::random::<u64>());
        let key = ApiKey {
            id: id.clone(),
            name: new.name,
            prefix: secret[..SHOWN_CHARS].to_string(),
            created_at: super::dates::now_ms(),
            revoked_at: None,
            last_used_at: None,
            models: new.models,
            max_concurrent: new.max_concurrent,
            requests_per_minute: new.requests_per_minute,
            priority: new.priority,
            weight: new.weight,
        };
        let models = key
            .models
            .as_ref()
            .map(|m| serde_json::to_string(m).expect("strings serialize"));
        self.db
            .execute(
                "INSERT INTO api_keys (id, name, secret_hash, prefix, created_at, models, \
                 max_concurrent, requests_per_minute, priority, weight) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                vec![
                    key.id.clone().into(),
                    key.name.clone().into(),
                    secret_hash(&secret).into(),
                    key.prefix.clone().into(),
                    key.created_at.into(),
                    models.into(),
                    key.max_concurrent.map(i64::from).into(),
                    key.requests_per_minute.map(i64::from).into(),
                    key.priority.stored().map(str::to_string).into(),
                    key.weight.map(i64::from).into(),
                ],
            )
            .await?;
        self.reload().await?;
        tracing::info!(id, name = %key.name, "client API key created");
        let mut view = KeyView::from(&key);
        view.key = Some(secret);
        Ok(view)
    }

    /// Revokes key `id` (at once here; within [`SHARED_REFRESH`] on proxies sharing the
    /// database). Revoking a revoked key changes nothing.
    pub async fn revoke(&self, id: &str) -> Result<(), KeyError> {
        let now = super::dates::now_ms();
        let changed = self
            .db
            .execute(
                "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2",
                vec![now.into(), id.into()],
            )
            .await?;
        if changed == 0 {
            return Err(KeyError::NotFound(id.to_string()));
        }
        self.reload().await?;
        tracing::info!(id, "client API key revoked");
        Ok(())
    }

    /// Records when keys were last used (called with the usage, in batches).
    pub fn last_used_statements(used: &HashMap<String, i64>) -> Vec<(String, Vec<Param>)> {
        used.iter()
            .map(|(id, at)| {
                (
                    "UPDATE api_keys SET last_used_at = $1 WHERE id = $2 \
                     AND (last_used_at IS NULL OR last_used_at < $1)"
                        .to_string(),
                    vec![(*at).into(), id.clone().into()],
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::db::DatabaseSetting;

    async fn store() -> Arc<KeyStore> {
        KeyStore::open(Database::open(&DatabaseSetting::Memory).await.unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_created_key_authenticates_until_revoked_and_only_its_hash_is_stored() {
        let keys = store().await;
        let made = keys
            .create(NewKey {
                name: " open-webui ".into(),
                ..NewKey::default()
            })
            .await
            .unwrap();
        let secret = made.key.clone().expect("the secret, once");
        assert!(secret.starts_with("mr-") && secret.len() == 3 + SECRET_CHARS);
        assert_eq!(made.name, "open-webui");
        assert_eq!(made.prefix, secret[..SHOWN_CHARS]);
        let key = keys.authenticate(&secret).await.expect("valid");
        assert_eq!(key.id, made.id);
        assert!(keys.authenticate(&format!("{secret}x")).await.is_none());
        assert!(keys.authenticate("sk-not-ours").await.is_none());
        let stored = keys
            .db
            .query(
                "SELECT secret_hash, prefix FROM api_keys",
                vec![],
                &[Kind::Text, Kind::Text],
            )
            .await
            .unwrap();
        assert_eq!(stored[0].text(0), secret_hash(&secret));
        assert!(!stored[0].text(0).contains(&secret[3..]));
        keys.revoke(&made.id).await.unwrap();
        assert!(keys.authenticate(&secret).await.is_none(), "revoked");
        assert!(keys.list()[0].revoked_at.is_some(), "still listed");
        assert_eq!(
            keys.revoke("key_nope").await,
            Err(KeyError::NotFound("key_nope".into()))
        );
    }

    #[tokio::test]
    async fn unsound_keys_are_refused_with_what_is_wrong() {
        let keys = store().await;
        let cases = [
            (
                NewKey {
                    name: "  ".into(),
                    ..NewKey::default()
                },
                "`name` must not be empty",
            ),
            (
                NewKey {
                    name: "x".repeat(101),
                    ..NewKey::default()
                },
                "longer than 100",
            ),
            (
                NewKey {
                    name: "a\u{7}b".into(),
                    ..NewKey::default()
                },
                "control characters",
            ),
            (
                NewKey {
                    name: "a".into(),
                    models: Some(vec![]),
                    ..NewKey::default()
                },
                "allow nothing",
            ),
            (
                NewKey {
                    name: "a".into(),
                    models: Some(vec!["m\n".into(), "x\u{0}".into()]),
                    ..NewKey::default()
                },
                "invalid name",
            ),
            (
                NewKey {
                    name: "a".into(),
                    max_concurrent: Some(0),
                    ..NewKey::default()
                },
                "`max_concurrent` must be",
            ),
            (
                NewKey {
                    name: "a".into(),
                    requests_per_minute: Some(0),
                    ..NewKey::default()
                },
                "`requests_per_minute` must be",
            ),
        ];
        for (new, expected) in cases {
            match keys.create(new).await {
                Err(KeyError::Invalid(message)) => assert!(message.contains(expected), "{message}"),
                other => panic!("expected {expected:?}, got {other:?}"),
            }
        }
        assert!(keys.list().is_empty());
    }

    #[tokio::test]
    async fn limits_and_allow_lists_survive_a_reload() {
        let db = Database::open(&DatabaseSetting::Memory).await.unwrap();
        let keys = KeyStore::open(db.clone()).await.unwrap();
        let made = keys
            .create(NewKey {
                name: "ci".into(),
                models: Some(vec!["b".into(), "a".into(), "a".into()]),
                max_concurrent: Some(2),
                requests_per_minute: Some(30),
                priority: KeyPriority::Batch,
                weight: Some(3),
            })
            .await
            .unwrap();
        let again = KeyStore::open(db).await.unwrap();
        let key = again
            .authenticate(made.key.as_deref().unwrap())
            .await
            .unwrap();
        assert_eq!(
            key.models.as_deref(),
            Some(&["a".to_string(), "b".to_string()][..])
        );
        assert!(key.allows("a") && !key.allows("c"));
        assert_eq!(
            (
                key.max_concurrent,
                key.requests_per_minute,
                key.priority,
                key.weight
            ),
            (Some(2), Some(30), KeyPriority::Batch, Some(3))
        );
    }

    #[test]
    fn a_weight_outside_one_to_sixteen_is_refused_when_a_key_is_made() {
        for bad in [0, MAX_WEIGHT + 1, u32::MAX] {
            let new = NewKey {
                name: "a".into(),
                weight: Some(bad),
                ..NewKey::default()
            };
            let refused = new.checked().unwrap_err();
            assert!(refused.contains("`weight` must be 1 to 16"), "{refused}");
        }
        for bad in [
            r#"{"name": "a", "weight": -1}"#,
            r#"{"name": "a", "weight": "3"}"#,
        ] {
            assert!(serde_json::from_str::<NewKey>(bad).is_err(), "{bad}");
        }
        let good = NewKey {
            name: "a".into(),
            weight: Some(MAX_WEIGHT),
            ..NewKey::default()
        };
        assert_eq!(good.checked().unwrap().weight, Some(MAX_WEIGHT));
    }

    #[test]
    fn a_priority_other_than_interactive_or_batch_is_refused_when_a_key_is_made() {
        let refused = serde_json::from_str::<NewKey>(r#"{"name": "a", "priority": "urgent"}"#)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("unknown variant `urgent`"), "{refused}");
        for bad in [
            r#"{"name": "a", "priority": 1}"#,
            r#"{"name": "a", "priority": null}"#,
        ] {
            assert!(serde_json::from_str::<NewKey>(bad).is_err(), "{bad}");
        }
        let batch: NewKey = serde_json::from_str(r#"{"name": "a", "priority": "batch"}"#).unwrap();
        assert_eq!(batch.priority, KeyPriority::Batch);
    }
}
