//! The desktop app's start-on-login entry, as the dashboard reaches it. The program embedding
//! the node supplies the entry (the node knows nothing of the OS's login items); the node
//! serves it at `/api/start-on-login` behind the control rule, so the dashboard needs no
//! channel into the app but the node's HTTP API, like every other setting.

use std::sync::Arc;

/// The OS's start-on-login entry for the embedding program.
pub trait LoginEntry: Send + Sync {
    /// Whether the program starts on login; the OS's error text otherwise.
    fn enabled(&self) -> Result<bool, String>;
    /// Turns it on or off; the state read back from the OS, or its error text.
    fn set_enabled(&self, enabled: bool) -> Result<bool, String>;
}

/// A shared [`LoginEntry`].
#[derive(Clone)]
pub struct StartOnLogin(pub Arc<dyn LoginEntry>);

impl std::fmt::Debug for StartOnLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StartOnLogin")
    }
}
