//! The one error type of the adapter: a field path and what is wrong with it.

/// A request (or backend answer) the adapter cannot translate.
///
/// `path` names the exact field (`messages[2].content[0].type`) so the caller can answer with a
/// precise 400 in the client's own dialect; `Display` gives `path: message`, ready for an error body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct AdapterError {
    /// Where in the JSON body the problem is, in `a.b[3].c` form; `body` for the body itself.
    pub path: String,
    /// What is wrong, phrased for the client (`audio is not supported`, `expected a string`).
    pub message: String,
}

impl AdapterError {
    /// An error at `path`.
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        let path = path.into();
        AdapterError {
            path: if path.is_empty() { "body".into() } else { path },
            message: message.into(),
        }
    }
}
