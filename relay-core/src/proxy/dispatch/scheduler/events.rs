//! What the scheduler says and takes: the actions it asks of the async layer, a request's
//! placement and priority, and its answers to a submission, a cancel or a registration.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{RequestId, WorkerId};

/// What the async layer must do after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send the request to the worker (capacity is already reserved).
    Dispatch {
        /// The request.
        request: RequestId,
        /// The worker that has reserved a slot for it.
        worker: WorkerId,
    },
    /// The request went back to the queue; its waiter's queue deadline is now `queue_deadline`.
    Requeued {
        /// The request.
        request: RequestId,
        /// When it gives up waiting.
        queue_deadline: Instant,
    },
    /// Answer the client with this failure.
    Fail {
        /// The request.
        request: RequestId,
        /// Why it failed.
        reason: FailReason,
    },
    /// Close a drained worker's connection: it has nothing left in flight.
    CloseDrained {
        /// The worker.
        worker: WorkerId,
    },
}

/// Interactive work goes before batch work when both wait for the same slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Work nobody watches as it happens (agents, evaluations, bulk jobs).
    Batch,
    /// A person is waiting for the answer.
    #[default]
    Interactive,
}

/// What, besides its model, the scheduler weighs when it places a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The conversation this request continues (an explicit session id, or a hash of the
    /// prompt's leading part): it prefers the worker that served that conversation last, whose
    /// backend still holds the prompt in its cache.
    pub affinity: Option<u64>,
    /// Who asks (a client key's id; `None` without a key): under contention the queue takes
    /// turns between clients, so one client's flood does not starve another.
    pub client: Option<Arc<str>>,
    /// Interactive before batch.
    pub priority: Priority,
    /// The client's share of contended turns within its priority (a key's `weight`; 0 or 1
    /// is an even share, 3 is three turns for each of an even share's).
    pub weight: u32,
    /// The prompt's size in tokens, estimated: sent where a worker's context window holds it
    /// when one's does ([`Scheduler::context_limit`]).
    pub prompt_tokens: Option<u32>,
    /// A side request of a conversation (Claude Code's titles and summaries, keyed by their own
    /// prompt): placed where a slot is kept for no conversation, and nobody's home after.
    pub side: bool,
    /// Its client sends side requests beside its turns (Claude Code, named by its session
    /// header): boxes keep a slot for them from the session's first turn, not only once the
    /// first side request came ([`Scheduler::leaves_no_side_slot`]).
    pub expects_side_requests: bool,
    /// A worker that pins slots pins requests of its endpoint
    /// ([`crate::endpoint::Endpoint::pinnable`]: chat and text completions, and Claude Code's
    /// `/v1/messages`, translated to carry the hint): it puts it where its slot table says, a
    /// side request in the lowest free slot, which llama-server evaluates first. The Responses
    /// API goes as it came, and llama-server places it itself.
    pub slot_hinted: bool,
}

/// Why a request failed inside the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// The provider's queue is at its bound.
    QueueFull,
    /// The request outlived its request timeout.
    RequestTimeout,
    /// Its workers died [`MAX_REQUEUE_COUNT`] times.
    RequeueExhausted,
    /// The worker died after part of the answer had reached the client.
    WorkerLostMidStream,
    /// The proxy is shutting down.
    ShuttingDown,
}

/// Why a request was refused at the door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// No worker could ever serve this model name (longer than [`MAX_NAME_BYTES`], control
    /// characters), or the proxy has no provider at all.
    UnknownModel,
    /// The provider serving the model is disabled.
    ProviderDisabled,
    /// The queue is full; retry after this long.
    QueueFull {
        /// A hint for the `Retry-After` header.
        retry_after: Duration,
    },
    /// The proxy is draining.
    ShuttingDown,
    /// The prompt (about `tokens`) is far beyond the largest context window, `limit`, of the
    /// workers serving its model (every one of which reported its window).
    PromptTooLong {
        /// The prompt's estimated size.
        tokens: u32,
        /// The largest window.
        limit: u32,
    },
}

/// Where a request went when it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// Straight to a worker.
    Dispatched {
        /// Its id.
        request: RequestId,
        /// The worker.
        worker: WorkerId,
    },
    /// Into the queue, waiting until `queue_deadline` at most.
    Queued {
        /// Its id.
        request: RequestId,
        /// When it gives up waiting.
        queue_deadline: Instant,
    },
}

impl Submitted {
    /// The id of the submitted request.
    pub fn request(&self) -> RequestId {
        match self {
            Submitted::Dispatched { request, .. } | Submitted::Queued { request, .. } => *request,
        }
    }
}

/// What cancelling a request amounted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// It was still queued and is gone now.
    RemovedFromQueue,
    /// It is running on this worker: send `cancel` and hold its slot until the worker confirms
    /// or the grace period ends.
    SendCancel {
        /// The worker running it.
        worker: WorkerId,
    },
    /// Already finished, already cancelled, or never known.
    Nothing,
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterError {
    /// No such provider.
    UnknownProvider,
    /// The provider is disabled.
    ProviderDisabled,
    /// The proxy is draining.
    ShuttingDown,
    /// An admin drained a worker of this name; it may not rejoin until the proxy restarts.
    Drained,
}

/// A request that waited in the queue until its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// The model it asked for.
    pub model: Arc<str>,
    /// Whether some connected worker serves that model (they were all busy), or none does.
    pub served: bool,
}

/// A registration the proxy accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The new worker's id.
    pub worker: WorkerId,
    /// The sanitized models it will be routed.
    pub models: Vec<String>,
    /// What sanitization changed.
    pub warnings: Vec<String>,
    /// Queued requests handed to it at once.
    pub actions: Vec<Action>,
}

/// A snapshot of one worker, for `/health`, admin views and the dashboard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkerSnapshot {
    /// The wire id (`w-N`).
    pub id: String,
    /// Provider it joined.
    pub provider: String,
    /// Its name.
    pub name: String,
    /// Its sanitized models.
    pub models: Vec<String>,
    /// Requests the proxy has running on it.
    pub in_flight: u32,
    /// Load the worker last reported that the proxy did not send it.
    pub external_load: u32,
    /// Its capacity.
    pub max_concurrent: u32,
    /// Whether it is draining.
    pub draining: bool,
    /// The tokens one request may hold, per model, where it reported them.
    pub context_windows: std::collections::BTreeMap<String, u32>,
    /// How fast it was measured to be, per model.
    pub speeds: std::collections::BTreeMap<String, super::Speed>,
    /// Models whose side requests it evaluates before the turns waiting there (its worker said
    /// so: `sides_first`).
    pub sides_first: Vec<String>,
}

/// A box asleep, as the proxy remembers it: its worker's name, provider and models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsleepBox {
    /// The provider it had joined.
    pub provider: String,
    /// Its worker's name.
    pub name: String,
    /// The models it served.
    pub models: Vec<String>,
}
