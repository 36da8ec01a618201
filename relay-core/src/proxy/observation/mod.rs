//! What the owner sees and does: `/metrics` ([`metrics`]), the published `/admin` API
//! ([`admin`]), the control API with its live status ([`control`]) and the pages the owner opens
//! ([`pages`]). It reads what dispatch recorded ([`crate::proxy::dispatch::telemetry`]).
pub mod admin;
pub mod control;
pub mod metrics;
pub mod pages;
