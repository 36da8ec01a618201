//! What passes through the relay: a malicious worker's headers, content types and status codes,
//! clients' credentials, and `endpoint_path`s that try to leave the worker's backend.
