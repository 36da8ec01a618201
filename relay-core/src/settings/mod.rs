//! Settings as plain data: the config file's schema ([`file`]), every default in one place
//! ([`defaults`]), the environment and flags as plain [`Overrides`], their resolution (defaults
//! < file < overrides) into checked values ([`ProxySettings`], [`WorkerSettings`]), and edits of
//! the file that keep its comments ([`edit`]).
//!
//! Nothing here knows the proxy, the worker or the node: they build their runtime
//! configurations from these values, adding what only they know (secrets a node generated,
//! backends it discovered, handles to report through).

pub mod defaults;
pub mod edit;
mod file;
mod limits;
mod overrides;
mod resolve;

use std::path::{Path, PathBuf};

pub use file::{
    FileConfig, ProviderFile, ProxyFile, RolesFile, TlsMode, UpstreamFile, UpstreamKind, WorkerFile,
};
pub use limits::{
    ConnectionLimits, NativeOverrides, ProviderConfig, ProviderLimits, Roles, SleeperLimits,
    StoreLimits, TlsSetting, UpstreamConfig,
};
pub use overrides::Overrides;
pub use resolve::{ProxySettings, WorkerSettings};

/// Errors in configuration, each naming the setting and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for these settings.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's explanation (line, column, field).
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("{0}")]
    Invalid(String),
}

/// Loads `path`, or the default file in the OS config directory when it exists.
pub fn load_file(path: Option<&Path>) -> Result<FileConfig, ConfigError> {
    let path = match path {
        Some(path) => path.to_path_buf(),
        None => match default_config_path().filter(|p| p.exists()) {
            Some(path) => path,
            None => return Ok(FileConfig::default()),
        },
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    parse_file(&text).map_err(|message| ConfigError::Parse { path, message })
}

/// Parses config file text.
pub fn parse_file(text: &str) -> Result<FileConfig, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

/// `<OS config dir>/modelrelay/config.toml`, e.g. `~/.config/modelrelay/config.toml` on Linux.
pub fn default_config_path() -> Option<PathBuf> {
    directories::ProjectDirs::from("", "", "modelrelay").map(|d| d.config_dir().join("config.toml"))
}

/// Splits a `MODELS` value: comma-separated names; `*` (or nothing) means "ask the backend".
pub fn parse_models(value: &str) -> Option<Vec<String>> {
    let models: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect();
    if models.is_empty() || models.iter().any(|m| m == "*") {
        None
    } else {
        Some(models)
    }
}

/// This machine's host name, the natural worker name.
pub fn default_worker_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| defaults::WORKER_NAME.to_string())
}

#[cfg(test)]
mod tests;
