//! The Responses store's copy in a database other proxies share (PostgreSQL, `DATABASE_URL`):
//! a response stored on one proxy is continued (`previous_response_id`), read back and deleted
//! on any other behind the same load balancer.
//!
//! The memory store ([`crate::proxy::serving::responses_store`]) stays the first place looked and the only one
//! without a shared database; the database is written behind each stored answer (never holding
//! up the answer) and read on a miss. A conversation is kept as the Responses input items a
//! client would send to continue it, which is also how the proxy re-sends it to a worker, so
//! reading it back is the adapter's own parsing.

use std::time::Duration;

use serde_json::{json, Value};

use crate::adapter::openai_responses::{input_items, parse_request, StoredConversation};
use crate::proxy::serving::responses_store::StoredResponse;
use crate::store::dates::now_ms;
use crate::store::db::{Database, Kind, Param};

/// The shared copy; cheap to clone.
#[derive(Clone, Debug)]
pub struct SharedResponses {
    db: Database,
    /// How long a stored response lives (the store's TTL).
    ttl: Duration,
    /// Rows kept at most (the store's entry bound); the oldest go first.
    max_entries: usize,
}

impl SharedResponses {
    /// The shared copy in `db`, when other proxies may use it; `None` for a database of this
    /// proxy alone, where the memory store is all there is.
    pub fn for_database(
        db: &Database,
        ttl: Duration,
        max_entries: usize,
    ) -> Option<SharedResponses> {
        (db.is_shared() && max_entries > 0).then(|| SharedResponses {
            db: db.clone(),
            ttl,
            max_entries,
        })
    }

    /// Stores `stored` as `id`, in the background, unless a row has that id already (no answer
    /// replaces another's); expired and surplus rows go at the same time.
    pub fn put(&self, id: &str, stored: &StoredResponse) {
        let now = now_ms();
        let expires = now + self.ttl.as_millis() as i64;
        let conversation = Value::Array(input_items(&stored.conversation.messages)).to_string();
        let statements = vec![
            (
                "INSERT INTO responses (id, response, conversation, input_len, created_at, \
                 expires_at, owner) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (id) DO NOTHING"
                    .to_string(),
                vec![
                    Param::from(id),
                    stored.response.to_string().into(),
                    conversation.into(),
                    (stored.input_len as i64).into(),
                    now.into(),
                    expires.into(),
                    (&*stored.owner).into(),
                ],
            ),
            (
                "DELETE FROM responses WHERE expires_at < $1".to_string(),
                vec![now.into()],
            ),
            (
                "DELETE FROM responses WHERE created_at < (SELECT created_at FROM responses \
                 ORDER BY created_at DESC LIMIT 1 OFFSET $1)"
                    .to_string(),
                vec![(self.max_entries as i64 - 1).into()],
            ),
        ];
        let db = self.db.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            if let Err(error) = db.transaction(statements).await {
                tracing::warn!(%error, response = %id, "response not shared with the other proxies");
            }
        });
    }

    /// The response stored as `id` by any proxy, unless expired.
    pub async fn get(&self, id: &str) -> Option<StoredResponse> {
        let rows = self
            .db
            .query(
                "SELECT response, conversation, input_len, owner FROM responses \
                 WHERE id = $1 AND expires_at >= $2",
                vec![id.into(), now_ms().into()],
                &[Kind::Text, Kind::Text, Kind::Int, Kind::Text],
            )
            .await
            .map_err(|error| tracing::warn!(%error, "the shared Responses store could not be read"))
            .ok()?;
        let row = rows.first()?;
        let response: Value = serde_json::from_str(&row.text(0)).ok()?;
        let items: Value = serde_json::from_str(&row.text(1)).ok()?;
        let parsed = parse_request(&json!({"model": "stored", "input": items})).ok()?;
        Some(StoredResponse {
            response,
            conversation: StoredConversation {
                messages: parsed.messages,
            },
            input_len: row.int(2).max(0) as usize,
            owner: row.text(3).into(),
        })
    }

    /// Deletes `id` everywhere, if `owner`'s; whether it existed (and had not expired).
    pub async fn delete(&self, id: &str, owner: &str) -> bool {
        self.db
            .execute(
                "DELETE FROM responses WHERE id = $1 AND expires_at >= $2 AND owner = $3",
                vec![id.into(), now_ms().into(), owner.into()],
            )
            .await
            .is_ok_and(|deleted| deleted > 0)
    }
}
