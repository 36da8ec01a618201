//! Slot hints: a worker in front of llama-server keeps each conversation in one of the server's
//! slots, so the prompt it cached there is reused on the conversation's next turn.
//!
//! The proxy sends each request's conversation (its affinity key, `request.conversation`) and
//! routes a conversation's turns to the same worker; which slot of that worker's server the
//! turn lands in is llama-server's choice, and its choice (the most similar cached prompt)
//! mixes up conversations that share a long system prompt ([`table`] says how). So the worker
//! names the slot itself (`id_slot`), for chat and completion requests (see [`body`]), and
//! for Anthropic Messages requests, which it translates to chat completions to carry it, to
//! backends that said they are llama.cpp servers and how many slots they have (`GET /props`,
//! asked when a warm-up ends or at a backend's first request, which waits for the answer, and
//! again every few minutes) and that keep a pinned slot's prompt ([`probe`]: a server with a
//! unified KV cache, llama-server's default without `-np`, does not, and places conversations
//! better itself). Any other request, or backend, goes as it came.

mod body;
pub mod probe;
pub mod table;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::discovery::fetch_slots;
use table::Slots;

/// How long what a backend said about its slots is trusted before asking again (a server
/// restarted with another `-np` behind the same URL; a hint beyond its slots wraps around, so
/// a stale count is never an error, only a weaker hint).
const RECHECK_AFTER: Duration = Duration::from_secs(300);

/// How long asking a backend for its slots may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long [`probe`] may take: three one-token completions, behind whatever the server is
/// busy with.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// A probe that got no answer in time is tried again this long after.
const PROBE_RETRY: Duration = Duration::from_secs(20);

/// How long the first request to a backend waits for what the backend says of its slots (one
/// `GET /props`, and on a llama-server the probe's three one-token completions: milliseconds on
/// an idle GPU). Sent before the answer, it would go unpinned into the slot llama-server picks,
/// the probe could then take that slot, and the conversation's second turn would evaluate its
/// whole prompt again. A backend that takes longer gets its first request as it came.
const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(2);

/// Backends remembered at most (the model lifecycle starts servers on new ports).
const MAX_BACKENDS: usize = 64;

/// How long a conversation's turn waits for its own slot while a side request holds it
/// ([`Slots::home_held_by_side`]) before it takes another after all: a title on a slow box
/// (a thousand prompt tokens at 600 a second, thirty tokens of answer at 12) takes about five.
const SIDE_WAIT: Duration = Duration::from_secs(5);

/// The slot hints of one worker's backends, shared by its request tasks.
#[derive(Debug, Clone)]
pub struct SlotPins {
    /// Off (`[worker] slot_hints = false`): every body goes as it came.
    enabled: bool,
    backends: Arc<Mutex<HashMap<String, Backend>>>,
    /// Counts the times a backend's hints turned on or off (its slots became known, or were
    /// forgotten): the session watches it to tell the proxy which models' side requests are
    /// evaluated first ([`SlotPins::sides_first`]).
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

/// What is known of one backend's slots.
#[derive(Debug)]
struct Backend {
    /// Its slots, when it is a llama.cpp server.
    slots: Option<Slots>,
    /// Changes whenever `slots` is replaced, so a request that took a slot of the old table
    /// does not release one of the new.
    generation: u64,
    /// When it last answered (or failed to answer) about its slots.
    checked: Option<Instant>,
    /// The slot count [`probe`] last asked the server about, and whether it keeps pinned
    /// prompts (asked again only when the count changes).
    probed: Option<(u32, bool)>,
    asking: bool,
    used: Instant,
    /// Counts the requests that ended in a slot: what a turn waiting for its own slot watches.
    released: tokio::sync::watch::Sender<u64>,
    /// True once the backend first answered (or failed to answer) about its slots: what the
    /// first request to it waits for ([`FIRST_ANSWER_WAIT`]).
    answered: tokio::sync::watch::Sender<bool>,
}

/// A slot a request holds until it ends (dropping this, however the request task ends).
#[derive(Debug)]
pub struct SlotLease {
    backends: Arc<Mutex<HashMap<String, Backend>>>,
    backend: String,
    generation: u64,
    slot: u32,
    side: bool,
}

impl SlotLease {
    /// The slot named in the request.
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        let mut backends = lock(&self.backends);
        if let Some(backend) = backends.get_mut(&self.backend) {
            if backend.generation == self.generation {
                if let Some(slots) = backend.slots.as_mut() {
                    slots.release(self.slot, self.side, Instant::now());
                }
            }
            backend
                .released
                .send_modify(|count| *count = count.wrapping_add(1));
        }
    }
}

fn lock(backends: &Mutex<HashMap<String, Backend>>) -> MutexGuard<'_, HashMap<String, Backend>> {
    // Nothing under this lock panics; were it to, hints are an optimisation worth keeping.
    backends.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl SlotPins {
    /// Hints for a worker with `[worker] slot_hints` set to `enabled`.
    pub fn new(enabled: bool) -> Self {
        SlotPins {
            enabled,
            backends: Arc::default(),
            changed: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// Names the slot for conversation `conversation` in `body`, a request for `path` on the
    /// backend at `base_url`, when that backend is a llama.cpp server: the hinted body and the
    /// lease the request holds while it runs. A `side` request (a title, a summary of that
    /// conversation) takes a slot kept for no conversation where one is free
    /// ([`Slots::take_side`]); a turn whose own slot only a side request holds waits for it,
    /// up to [`SIDE_WAIT`]. `None` (send the body as it is) for a request
    /// without a conversation, a route or body that takes no hint, or a backend that is not
    /// known to be llama.cpp's (the first request to a backend asks it, and waits up to
    /// [`FIRST_ANSWER_WAIT`] for the answer).
    ///
    /// An Anthropic Messages request (Claude Code's) is pinned too, but its body stays as it
    /// is (`None` in place of the hinted body): llama-server drops `id_slot` from
    /// `/v1/messages`, so the request goes translated to chat completions with the lease's slot
    /// ([`crate::backend::BackendRequest::slot`]). Left to llama-server's own placement, six
    /// Claude Code sessions sharing a system prompt took 88% of their later turns' prompts from
    /// cache on the affinity bench, against 96% pinned (BENCHMARKS.md, 2026-11-30).
    pub async fn pin(
        &self,
        client: &reqwest::Client,
        base_url: &str,
        conversation: Option<u64>,
        side: bool,
        path: &str,
        body: &str,
    ) -> Option<(Option<String>, SlotLease)> {
        let conversation = conversation.filter(|_| self.enabled)?;
        let endpoint = crate::endpoint::Endpoint::of(path);
        if !endpoint.pinnable() {
            return None;
        }
        let translated = !endpoint.takes_slot_hint();
        self.first_answer(client, base_url).await;
        // What the slot will cache, roughly.
        let tokens = crate::affinity::estimated_prompt_tokens(body.len());
        if !side {
            self.wait_for_home(base_url, conversation, tokens).await;
        }
        let (slot, lease) = self.take(client, base_url, conversation, side, tokens)?;
        if translated {
            return Some((None, lease));
        }
        let hinted = body::with_slot(body, slot)?;
        Some((Some(hinted), lease))
    }

    /// Returns once the backend at `base_url` has first answered about its slots (asking it
    /// now if nobody has), or after [`FIRST_ANSWER_WAIT`].
    async fn first_answer(&self, client: &reqwest::Client, base_url: &str) {
        let mut answered = {
            let mut backends = lock(&self.backends);
            let backend = self.known(&mut backends, client, base_url, Instant::now());
            if backend.checked.is_some() {
                return;
            }
            backend.answered.subscribe()
        };
        // A backend forgotten meanwhile ends the wait too.
        let _ = tokio::time::timeout(FIRST_ANSWER_WAIT, answered.wait_for(|done| *done)).await;
    }

    /// Returns once conversation `conversation`'s own slot on `base_url` is no longer held by
    /// side requests alone, or after [`SIDE_WAIT`].
    async fn wait_for_home(&self, base_url: &str, conversation: u64, tokens: u32) {
        let deadline = tokio::time::Instant::now() + SIDE_WAIT;
        loop {
            let mut released = {
                let backends = lock(&self.backends);
                let Some(backend) = backends.get(base_url) else {
                    return;
                };
                let waits = backend.slots.as_ref().is_some_and(|slots| {
                    slots.home_held_by_side(conversation, tokens, Instant::now())
                });
                if !waits {
                    return;
                }
                // Subscribed under the lock: a release after the check is seen.
                backend.released.subscribe()
            };
            match tokio::time::timeout_at(deadline, released.changed()).await {
                Ok(Ok(())) => continue,
                // The deadline passed, or the backend was forgotten.
                Ok(Err(_)) | Err(_) => return,
            }
        }
    }

    /// [`SlotPins::pin`] once any wait is over: the slot taken, and its lease (dropping it
    /// releases the slot again).
    fn take(
        &self,
        client: &reqwest::Client,
        base_url: &str,
        conversation: u64,
        side: bool,
        tokens: u32,
    ) -> Option<(u32, SlotLease)> {
        let now = Instant::now();
        let mut backends = lock(&self.backends);
        let backend = self.known(&mut backends, client, base_url, now);
        let generation = backend.generation;
        let slots = backend.slots.as_mut()?;
        let slot = if side {
            slots.take_side(tokens)
        } else {
            slots.take(conversation, tokens, now)
        };
        // Made before the body is checked: a lease dropped right away releases the slot again.
        let lease = SlotLease {
            backends: Arc::clone(&self.backends),
            backend: base_url.to_string(),
            generation,
            slot,
            side,
        };
        drop(backends);
        Some((slot, lease))
    }

    /// What is known of the backend at `base_url`, remembered from now on (the least recently
    /// used forgotten beyond [`MAX_BACKENDS`]); its slots are asked for in the background when
    /// they never were, or not for [`RECHECK_AFTER`].
    fn known<'a>(
        &self,
        backends: &'a mut HashMap<String, Backend>,
        client: &reqwest::Client,
        base_url: &str,
        now: Instant,
    ) -> &'a mut Backend {
        if !backends.contains_key(base_url) && backends.len() >= MAX_BACKENDS {
            let oldest = backends
                .iter()
                .min_by_key(|(_, backend)| backend.used)
                .map(|(url, _)| url.clone());
            if let Some(oldest) = oldest {
                backends.remove(&oldest);
            }
        }
        let backend = backends.entry(base_url.to_string()).or_insert(Backend {
            slots: None,
            generation: 0,
            checked: None,
            probed: None,
            asking: false,
            used: now,
            released: tokio::sync::watch::Sender::new(0),
            answered: tokio::sync::watch::Sender::new(false),
        });
        backend.used = now;
        let due = backend
            .checked
            .is_none_or(|checked| now.duration_since(checked) >= RECHECK_AFTER);
        if due && !backend.asking {
            backend.asking = true;
            self.ask(client.clone(), base_url.to_string());
        }
        backend
    }

    /// Asks the llama-server at `base_url` about its slots now, in the background, rather than
    /// at its first request, so the proxy learns before any request whether its side requests
    /// are evaluated first ([`SlotPins::sides_first`]). The catalog calls this once the
    /// server's warm-up is done: the probe's prompts beside the warm-up would slow it.
    pub fn prepare(&self, client: &reqwest::Client, base_url: &str) {
        if self.enabled {
            let mut backends = lock(&self.backends);
            self.known(&mut backends, client, base_url, Instant::now());
        }
    }

    /// Whether side requests to `base_url` that the worker pins (chat and text completions, and
    /// Anthropic Messages) are evaluated before the conversations' turns waiting there: with
    /// hints on, a side
    /// request takes the lowest free slot kept for no conversation ([`Slots::take_side`]),
    /// conversations leave slot 0 to them while another slot is as good, and llama-server
    /// fills each batch in slot order.
    pub fn sides_first(&self, base_url: &str) -> bool {
        self.enabled
            && lock(&self.backends)
                .get(base_url)
                .is_some_and(|backend| backend.slots.is_some())
    }

    /// Changes each time a backend's hints turn on or off.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Asks the backend at `base_url` for its slots, in the background.
    fn ask(&self, client: reqwest::Client, base_url: String) {
        let backends = Arc::clone(&self.backends);
        let changed = Arc::clone(&self.changed);
        let on_off = move || changed.send_modify(|count| *count = count.wrapping_add(1));
        tokio::spawn(async move {
            let mut answer = tokio::time::timeout(ASK_TIMEOUT, fetch_slots(&client, &base_url))
                .await
                .ok()
                .flatten();
            if let Some(slots) = answer.filter(|slots| *slots >= 2) {
                let probed = lock(&backends).get(&base_url).and_then(|b| b.probed);
                let keeps = match probed {
                    Some((count, keeps)) if count == slots => keeps,
                    _ => {
                        let base = base_url.trim_end_matches('/');
                        let probe = probe::keeps_pinned_prompts(&client, base);
                        let found = tokio::time::timeout(PROBE_TIMEOUT, probe)
                            .await
                            .unwrap_or(probe::Probe::NotNow);
                        if found == probe::Probe::NotNow {
                            // No hints until the server has said; asked again soon.
                            let mut backends = lock(&backends);
                            if let Some(backend) = backends.get_mut(&base_url) {
                                backend.asking = false;
                                if backend.slots.take().is_some() {
                                    backend.generation += 1;
                                    on_off();
                                }
                                let now = Instant::now();
                                let soon = now.checked_sub(RECHECK_AFTER - PROBE_RETRY);
                                backend.checked = Some(soon.unwrap_or(now));
                                backend.answered.send_replace(true);
                            }
                            return;
                        }
                        // A server that does not answer as llama-server does keeps the hints.
                        let keeps = found != probe::Probe::Clears;
                        if !keeps {
                            tracing::info!(
                                backend = %base_url,
                                "this llama-server does not keep a prompt pinned to a slot (its KV \
                                 cache is unified, its default when -np is not given): it places \
                                 conversations itself, and gets no slot hints"
                            );
                        }
                        if let Some(backend) = lock(&backends).get_mut(&base_url) {
                            backend.probed = Some((slots, keeps));
                        }
                        keeps
                    }
                };
                answer = answer.filter(|_| keeps);
            }
            let mut backends = lock(&backends);
            let Some(backend) = backends.get_mut(&base_url) else {
                return;
            };
            backend.asking = false;
            backend.checked = Some(Instant::now());
            backend.answered.send_replace(true);
            let unchanged = backend.slots.as_ref().map(Slots::count) == answer;
            if !unchanged {
                tracing::debug!(backend = %base_url, slots = ?answer, "llama.cpp slots for slot hints");
                let on_or_off = backend.slots.is_some() != answer.is_some();
                backend.slots = answer.map(Slots::new);
                backend.generation += 1;
                if on_or_off {
                    on_off();
                }
            }
        });
    }

    /// The slots known for `base_url` (tests, logs).
    pub fn slots_of(&self, base_url: &str) -> Option<u32> {
        lock(&self.backends)
            .get(base_url)
            .and_then(|backend| backend.slots.as_ref().map(Slots::count))
    }

    /// Requests in flight in `slot` of `base_url` (tests).
    pub fn busy(&self, base_url: &str, slot: u32) -> u32 {
        lock(&self.backends)
            .get(base_url)
            .and_then(|backend| backend.slots.as_ref().map(|slots| slots.busy(slot)))
            .unwrap_or(0)
    }
}
