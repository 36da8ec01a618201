//! Model lifecycle on the worker: llama-server processes started on demand, unloaded when idle,
//! switched to stay within the box's budget, restarted on a session change, supervised, and
//! cleaned up after a crash of the worker itself.
//!
//! - [`config`]: the model map and box-wide settings (`[worker.lifecycle]`,
//!   `[worker.model_map.NAME]`).
//! - [`policy`]: the decisions (eviction, idle timers, circuit breaker, sessions, ports) as pure
//!   functions with time as an input.
//! - [`LifecycleManager`]: the async side. The worker calls [`LifecycleManager::acquire`] for each
//!   request to a mapped model and forwards to [`Lease::base_url`] while holding the lease.
//! - [`scan`]: `modelrelay models scan DIR`, proposing model-map entries from `.gguf` files.
//! - [`inspect`]: `modelrelay models status`, the model map and the servers running, from the
//!   pid files.

pub mod config;
pub mod error;
pub mod gguf;
pub mod inspect;
mod lease;
mod manager;
pub mod os;
pub mod pidfile;
pub mod policy;
pub mod process;
mod run;
pub mod scan;
mod state;

pub use config::{LifecycleConfig, LifecycleSection, ModelSpec};
pub use error::LifecycleError;
pub use lease::Lease;
pub use manager::LifecycleManager;
pub use pidfile::CleanupReport;
pub use state::{FreeVram, ModelState, ModelStatus};
