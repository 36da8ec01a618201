//! Queueing and routing requests to workers: the pure scheduler ([`scheduler`]), the hub that
//! joins it to the sockets ([`hub`], the one way in for the client routes), one task per worker
//! connection ([`worker_socket`]), slow-client pauses ([`stream_pause`]), sleeping boxes
//! ([`sleepers`], kept across restarts by [`sleeper_store`]) and what the dashboard shows that routing does not need, recorded as requests
//! pass ([`telemetry`]). Dispatch never sees axum's routing, extractors or responses.

pub mod hub;
pub mod scheduler;
pub mod sleeper_store;
pub mod sleepers;
pub mod speed_store;
pub(crate) mod stream_pause;
pub mod telemetry;
pub mod worker_socket;
