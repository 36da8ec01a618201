//! When a process lets go of the code that only its start-up ran; *what* is let go of, and how,
//! is the `relay-resident` crate's (shared with the library the dashboard preloads into
//! WebKit's processes, which must not link this crate).

use std::time::Duration;

pub use relay_resident::{release_loaded_code, release_start_up_code, Released};

/// How long after start the start-up code is let go of: the node is up by then, and the worker's
/// first connection has usually been made.
pub const AFTER_START: Duration = Duration::from_secs(2);

/// Spawns a task that calls [`release_start_up_code`] once, [`AFTER_START`] from now.
pub fn release_start_up_code_soon() {
    release_soon(release_start_up_code);
}

/// Spawns a task that calls `release` (one of this module's) once, [`AFTER_START`] from now.
pub fn release_soon(release: fn() -> Released) {
    tokio::spawn(async move {
        tokio::time::sleep(AFTER_START).await;
        let released = release();
        tracing::debug!(
            mappings = released.mappings,
            kib = released.bytes / 1024,
            "let go of start-up code pages"
        );
    });
}
