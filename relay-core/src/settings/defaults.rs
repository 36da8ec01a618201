//! Every built-in default, once. The file schema, the resolution, the runtime configurations'
//! `Default`s and the dashboard's form all read them from here; the command line's help text
//! names them in words.

use std::time::Duration;

/// The listen address: loopback, on llama-server's usual port (the next free port when taken).
pub const LISTEN: &str = "127.0.0.1:8080";
/// A worker's backend when none is configured: vLLM's and many servers' port.
pub const BACKEND_URL: &str = "http://127.0.0.1:8000";
/// The proxy a worker joins when none is configured.
pub const PROXY_URL: &str = "http://127.0.0.1:8080";
/// The provider proxies serve and workers join.
pub const PROVIDER: &str = "local";
/// A worker's name when none is configured and the host name is unknown.
pub const WORKER_NAME: &str = "worker";

/// Queued requests per provider before new ones get 429.
pub const MAX_QUEUE_LEN: usize = 100;
/// How long a request may wait in the queue before 504.
pub const QUEUE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request may live in total before it is cancelled with 504.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Models accepted from one worker; the rest are dropped with a warning.
pub const MAX_MODELS_PER_WORKER: usize = 256;

/// Largest request body accepted (413 beyond).
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Stream bytes that may wait for a slow client, per request: beyond, the stream is ended with an
/// SSE error and the worker told to stop, so a client that stops reading cannot make the proxy
/// hold the whole answer.
pub const MAX_BUFFERED_STREAM_BYTES: usize = 16 * 1024 * 1024;
/// Largest streamed answer before it is ended with an SSE error.
pub const MAX_STREAM_BYTES: u64 = 256 * 1024 * 1024;
/// Open connections (clients and workers) beyond which new ones get 503. Above the 10,000
/// streams and 1,000 workers the bench holds open at once.
pub const MAX_CONNECTIONS: usize = 20_000;
/// Time a client has to send a request's head (and an idle keep-alive connection its next one).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Time a client has to send a request's whole body once its head arrived.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(120);
/// Request body bytes a proxy holds at once (being read, queued or on a worker): bounds memory
/// whatever clients send. Ordinary requests are kilobytes; this allows 32 bodies of the largest
/// size at once.
pub const MAX_REQUEST_BYTES_IN_FLIGHT: usize = 1024 * 1024 * 1024;
/// Worker connections a proxy accepts at once; beyond, a joining worker gets 503 and retries
/// with its backoff. Above the 1,000 workers the bench connects.
pub const MAX_WORKERS: usize = 4096;
/// Whether `/metrics` answers without the admin token where the control API needs one: no, the
/// counts name models, workers and client keys.
pub const METRICS_PUBLIC: bool = false;
/// Dashboards (`/api/events` live feeds) open at once; each costs a status snapshot a second.
pub const MAX_EVENT_SUBSCRIBERS: usize = 64;

/// Period of the proxy's pings to workers.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(15);
/// A worker silent this long is disconnected.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(45);
/// In-flight requests get this long to finish when a proxy or worker stops.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a stored Responses answer can be continued or fetched.
pub const RESPONSES_STORE_TTL: Duration = Duration::from_secs(3600);
/// Most Responses answers kept at once.
pub const RESPONSES_STORE_MAX_ENTRIES: usize = 1000;
/// Most bytes the Responses store holds.
pub const RESPONSES_STORE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// How long the proxy remembers a sleeping box (lists its models, wakes it for requests).
pub const SLEEPERS_REMEMBERED: Duration = Duration::from_secs(7 * 24 * 3600);
/// Sleeping boxes remembered at once; the one asleep longest makes room.
pub const MAX_SLEEPERS: usize = 256;
/// A box being woken gets another Wake-on-LAN packet at most this often, however many requests
/// wait for it (a packet can be lost; a flood must not become a packet storm).
pub const WAKE_RETRY: Duration = Duration::from_secs(10);

/// Requests a worker runs at once.
pub const MAX_CONCURRENCY: u32 = 4;
/// How often a worker re-reads its backends' model lists (and forgets what it probed).
pub const MODEL_REFRESH: Duration = Duration::from_secs(30);
/// A worker that hears nothing from its proxy (no message, no pong to its own pings) for this
/// long takes the connection for dead and reconnects: a network partition leaves a half-open
/// TCP connection that would otherwise never end.
pub const PROXY_SILENCE_TIMEOUT: Duration = Duration::from_secs(60);
/// A worker's first reconnect delay.
pub const RECONNECT_MIN: Duration = Duration::from_secs(1);
/// A worker's longest reconnect delay.
pub const RECONNECT_MAX: Duration = Duration::from_secs(30);

/// A conversation's next turn prefers the worker that served it last (conversation affinity).
pub const AFFINITY: bool = true;

/// Cost routing is on: on the fleet bench it is within 5% of the best other policy in every
/// cell and far ahead on unequal boxes, and where nothing is measured (a backend that reports no
/// timings, a box never seen answer) or boxes are equal it keeps the usual rules.
pub const COST_ROUTING: bool = true;

/// A worker keeps each conversation in one slot of its llama-server backends (slot hints).
pub const SLOT_HINTS: bool = true;

/// The shortest admin token a node accepts when one is configured: 20 characters of a random
/// hex string are 80 bits, beyond any guessing through the failure limiter.
pub const ADMIN_TOKEN_MIN_CHARS: usize = 20;
