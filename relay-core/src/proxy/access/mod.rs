//! Who may come in, and with what: every credential and limit — the worker endpoint and its
//! secret ([`worker_connect`]), the failure limiter every check shares and constant-time
//! comparison ([`credentials`]), the admin token and dashboard sessions ([`admin`], [`session`],
//! [`sign_in`]), client API keys ([`client_keys`]) and a request's place in the queue's turns
//! ([`priority`]).

pub mod admin;
pub mod client_keys;
pub mod credentials;
pub mod priority;
pub mod session;
pub mod sign_in;
pub mod worker_connect;
