//! What a proxy keeps across restarts: client API keys and usage, in an embedded SQLite file
//! in the data directory, or in PostgreSQL (`DATABASE_URL`) so that proxies behind one load
//! balancer share them. Imports nothing of the proxy: the proxy calls in.

pub mod box_speeds;
pub mod dates;
pub mod db;
pub mod health;
pub mod keys;
mod migrations;
pub mod sleepers;
pub mod usage;

pub use db::{Database, DatabaseSetting, DbError};
pub use health::{StorageView, StoreHealth};
pub use keys::{ApiKey, KeyError, KeyPriority, KeyStore, KeyView, NewKey, MAX_WEIGHT};
