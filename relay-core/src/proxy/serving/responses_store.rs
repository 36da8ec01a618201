//! The proxy's OpenAI Responses store: finished exchanges, kept so a later request with
//! `previous_response_id` can continue the conversation whichever worker answers it, and so
//! `GET` / `DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items` work.
//!
//! It lives in the proxy because the proxy is the one place every request passes; workers come
//! and go. Everything is bounded: entries expire after a TTL, and the oldest entries are evicted
//! when the entry count or the approximate byte size would exceed its limit. A single exchange
//! larger than the byte limit is not stored at all. Time is an input, so every rule is a plain
//! unit test.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde_json::Value;

use crate::adapter::canonical::{Image, Part};
use crate::adapter::openai_responses::StoredConversation;

pub use crate::settings::StoreLimits;

/// One finished exchange.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// The response object as the client received it (what `GET` returns).
    pub response: Value,
    /// The conversation up to and including this answer (what a continuation starts from).
    pub conversation: StoredConversation,
    /// How many of the conversation's messages were the request's input (the stored history
    /// it continued plus its own `input`); the rest are the answer. What
    /// `GET /v1/responses/{id}/input_items` lists.
    pub input_len: usize,
    /// Whose it is: the client that made it ([`crate::proxy::access::client_keys::ClientIdentity`]'s
    /// `client`: its key's id, or `addr:IP` without keys). Only that client reads, deletes or
    /// continues it; anyone else is told it does not exist.
    pub owner: Arc<str>,
}

impl StoredResponse {
    /// Approximate bytes held: the response's JSON text plus the conversation's contents.
    pub fn approx_bytes(&self) -> usize {
        // Per-part bookkeeping (enum, vectors, small strings) beyond the contents themselves.
        const PART_OVERHEAD: usize = 64;
        let part_bytes = |part: &Part| -> usize {
            PART_OVERHEAD
                + match part {
                    Part::Text(text) => text.len(),
                    Part::Thinking(thinking) => thinking.text.len(),
                    Part::ToolCall(call) => call.id.len() + call.name.len() + call.arguments.len(),
                    Part::Image(Image::Base64 { media_type, data }) => {
                        media_type.len() + data.len()
                    }
                    Part::Image(Image::Url(url)) => url.len(),
                    Part::ToolResult(result) => {
                        result.call_id.len()
                            + result
                                .content
                                .iter()
                                .map(|p| PART_OVERHEAD + text_len(p))
                                .sum::<usize>()
                    }
                }
        };
        let conversation: usize = self
            .conversation
            .messages
            .iter()
            .flat_map(|m| m.content.iter())
            .map(part_bytes)
            .sum();
        self.response.to_string().len() + conversation
    }
}

fn text_len(part: &Part) -> usize {
    match part {
        Part::Text(text) => text.len(),
        Part::Image(Image::Base64 { data, .. }) => data.len(),
        Part::Image(Image::Url(url)) => url.len(),
        _ => 0,
    }
}

struct Entry {
    stored: Arc<StoredResponse>,
    bytes: usize,
    expires: Instant,
    /// Insertion number, to tell this entry from an older one with the same id in `order`.
    seq: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Ids in insertion order, which is also expiry order (one TTL for all). May hold ids that
    /// were since deleted or replaced; `seq` tells.
    order: VecDeque<(u64, String)>,
    bytes: usize,
    next_seq: u64,
}

impl Inner {
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.entries.remove(id)?;
        self.bytes -= entry.bytes;
        Some(entry)
    }

    /// Drops expired entries, then the oldest ones while a bound is exceeded.
    fn evict(&mut self, limits: &StoreLimits, now: Instant) {
        while let Some((seq, id)) = self.order.front() {
            let live = self.entries.get(id).filter(|e| e.seq == *seq);
            let over = self.entries.len() > limits.max_entries || self.bytes > limits.max_bytes;
            match live {
                None => {}
                Some(entry) if entry.expires <= now || over => {
                    let id = id.clone();
                    self.remove(&id);
                }
                Some(_) => break,
            }
            self.order.pop_front();
        }
        // Deletions leave stale ids behind; compact before they outnumber live ones.
        if self.order.len() > 2 * self.entries.len() + 16 {
            let entries = &self.entries;
            self.order
                .retain(|(seq, id)| entries.get(id).is_some_and(|e| e.seq == *seq));
        }
    }
}

/// The store; one per proxy, shared by the routes.
pub struct ResponsesStore {
    limits: StoreLimits,
    inner: Mutex<Inner>,
}

impl ResponsesStore {
    /// An empty store with `limits`.
    pub fn new(limits: StoreLimits) -> Self {
        ResponsesStore {
            limits,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The store's bounds.
    pub fn limits(&self) -> StoreLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update leaves the maps consistent before anything that could panic.
        self.inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Stores `stored` under `id` at `now` (replacing an entry with the same id), evicting what
    /// the bounds require. Returns false when it was not stored: the store is off, or this one
    /// exchange is larger than the whole byte limit.
    pub fn insert(&self, id: &str, stored: StoredResponse, now: Instant) -> bool {
        if !self.limits.enabled() {
            return false;
        }
        let bytes = stored.approx_bytes() + id.len();
        if bytes > self.limits.max_bytes {
            tracing::info!(
                id,
                bytes,
                max_bytes = self.limits.max_bytes,
                "response too large for the responses store; not stored"
            );
            return false;
        }
        let mut inner = self.lock();
        inner.remove(id);
        let seq = inner.next_seq;
        inner.next_seq += 1;
        inner.bytes += bytes;
        inner.entries.insert(
            id.to_string(),
            Entry {
                stored: Arc::new(stored),
                bytes,
                expires: now + self.limits.ttl,
                seq,
            },
        );
        inner.order.push_back((seq, id.to_string()));
        inner.evict(&self.limits, now);
        true
    }

    /// Stores `stored` under `id` unless an entry has that id already (a worker answering with
    /// another request's id must not replace that request's entry); false when not stored.
    pub fn insert_new(&self, id: &str, stored: StoredResponse, now: Instant) -> bool {
        if self.get(id, now).is_some() {
            tracing::warn!(
                id,
                "an answer carried the id of a stored response: not stored (a worker may \
                 be trying to replace another client's response)"
            );
            return false;
        }
        self.insert(id, stored, now)
    }

    /// The exchange stored under `id`, unless it expired.
    pub fn get(&self, id: &str, now: Instant) -> Option<Arc<StoredResponse>> {
        let mut inner = self.lock();
        inner.evict(&self.limits, now);
        inner.entries.get(id).map(|e| e.stored.clone())
    }

    /// Deletes `id`; false if it was not there.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().remove(id).is_some()
    }

    /// Entries held right now (expired ones included until the next access).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Approximate bytes held.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter::canonical::{Message, Role};
    use serde_json::json;
    use std::time::Duration;

    fn exchange(text: &str) -> StoredResponse {
        StoredResponse {
            owner: Arc::from("addr:127.0.0.1"),
            response: json!({"id": "r", "output_text": text}),
            conversation: StoredConversation {
                messages: vec![Message {
                    role: Role::User,
                    content: vec![Part::Text(text.to_string())],
                }],
            },
            input_len: 1,
        }
    }

    fn limits(ttl_secs: u64, max_entries: usize, max_bytes: usize) -> StoreLimits {
        StoreLimits {
            ttl: Duration::from_secs(ttl_secs),
            max_entries,
            max_bytes,
        }
    }

    #[test]
    fn stored_responses_expire_after_the_ttl() {
        let store = ResponsesStore::new(limits(60, 10, 1 << 20));
        let t0 = Instant::now();
        assert!(store.insert("a", exchange("one"), t0));
        assert!(store.insert("b", exchange("two"), t0 + Duration::from_secs(30)));
        let at = |secs| t0 + Duration::from_secs(secs);
        assert!(store.get("a", at(59)).is_some());
        assert!(store.get("a", at(60)).is_none(), "expired at the TTL");
        assert!(store.get("b", at(60)).is_some());
        assert!(store.get("b", at(90)).is_none());
        assert!(store.is_empty());
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn the_oldest_responses_are_evicted_beyond_max_entries() {
        let store = ResponsesStore::new(limits(60, 2, 1 << 20));
        let now = Instant::now();
        for id in ["a", "b", "c"] {
            store.insert(id, exchange(id), now);
        }
        assert_eq!(store.len(), 2);
        assert!(store.get("a", now).is_none());
        assert!(store.get("b", now).is_some() && store.get("c", now).is_some());
    }

    #[test]
    fn the_oldest_responses_are_evicted_beyond_max_bytes_and_oversized_ones_are_refused() {
        let size = exchange("x".repeat(1000).as_str()).approx_bytes() + 1;
        let store = ResponsesStore::new(limits(60, 100, 3 * size));
        let now = Instant::now();
        for id in ["a", "b", "c", "d"] {
            assert!(store.insert(id, exchange("x".repeat(1000).as_str()), now));
        }
        assert_eq!(store.len(), 3);
        assert!(store.bytes() <= 3 * size);
        assert!(store.get("a", now).is_none());
        assert!(
            !store.insert("huge", exchange("x".repeat(4 * size).as_str()), now),
            "larger than the whole store"
        );
        assert!(
            store.get("d", now).is_some(),
            "a refused insert evicts nothing"
        );
    }

    #[test]
    fn deleted_and_replaced_responses_free_their_space() {
        let store = ResponsesStore::new(limits(60, 2, 1 << 20));
        let now = Instant::now();
        store.insert("a", exchange("one"), now);
        store.insert("a", exchange("two"), now);
        assert_eq!(store.len(), 1);
        assert_eq!(
            store.get("a", now).unwrap().conversation.messages[0].content,
            vec![Part::Text("two".into())]
        );
        assert!(store.remove("a"));
        assert!(!store.remove("a"));
        assert_eq!((store.len(), store.bytes()), (0, 0));
        // Many inserts and deletes leave no unbounded bookkeeping behind.
        for i in 0..1000 {
            let id = format!("r{i}");
            store.insert(&id, exchange("x"), now);
            store.remove(&id);
        }
        let (live, bookkept) = {
            let inner = store.lock();
            (inner.entries.len(), inner.order.len())
        };
        assert!(
            bookkept <= 2 * live + 17,
            "{bookkept} ids kept for {live} entries"
        );
        store.insert("b", exchange("x"), now);
        store.insert("c", exchange("x"), now);
        assert_eq!(
            store.len(),
            2,
            "stale bookkeeping does not count as entries"
        );
    }

    #[test]
    fn a_zero_limit_turns_the_store_off() {
        for limits in [limits(0, 10, 100), limits(60, 0, 100), limits(60, 10, 0)] {
            let store = ResponsesStore::new(limits);
            assert!(!store.insert("a", exchange("one"), Instant::now()));
            assert!(store.get("a", Instant::now()).is_none());
        }
    }
}
