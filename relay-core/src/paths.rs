//! Where the relay keeps its state on disk: the data directory, the secrets generated into it,
//! and files only their owner may read.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use rand::distr::{Alphanumeric, SampleString};

/// The worker secret's file in the data directory.
pub const WORKER_SECRET_FILE: &str = "worker-secret";
/// The admin token's file in the data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

/// The data directory: `MODELRELAY_DATA_DIR`, or the OS data directory
/// (`~/.local/share/modelrelay` on Linux).
pub fn data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MODELRELAY_DATA_DIR") {
        return PathBuf::from(dir);
    }
    directories::ProjectDirs::from("", "", "modelrelay")
        .map(|d| d.data_dir().to_path_buf())
        .unwrap_or_else(|| PathBuf::from(".modelrelay"))
}

/// The proxy's SQLite database (client API keys, usage) in the data directory.
pub const DATABASE_FILE: &str = "modelrelay.db";

/// Where the proxy's SQLite database is in the data directory `dir`.
pub fn database_path(dir: &Path) -> PathBuf {
    dir.join(DATABASE_FILE)
}

/// Where the generated admin token is stored in the data directory `dir`.
pub fn admin_token_path(dir: &Path) -> PathBuf {
    dir.join(ADMIN_TOKEN_FILE)
}

/// The secret kept in file `name` of `dir`; with `create`, one of 32 random characters is
/// generated and stored (owner-only) when there is none.
pub fn stored_secret(dir: &Path, name: &str, create: bool) -> std::io::Result<Option<String>> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(Some(text.trim().to_string())),
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if !create {
        return Ok(None);
    }
    let secret = Alphanumeric.sample_string(&mut rand::rng(), 32);
    std::fs::create_dir_all(dir)?;
    write_private(&path, &secret)?;
    tracing::info!(path = %path.display(), "generated a new {name}");
    Ok(Some(secret))
}

/// A secret file could not be read or created.
#[derive(Debug, thiserror::Error)]
#[error("worker secret file {path}: {reason}")]
pub struct SecretError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

/// The stored worker secret (in the data directory), created on first use with 32 random
/// characters (owner-only file) when `create`.
pub fn worker_secret(create: bool) -> Result<Option<String>, SecretError> {
    let dir = data_dir();
    stored_secret(&dir, WORKER_SECRET_FILE, create).map_err(|e| SecretError {
        path: dir.join(WORKER_SECRET_FILE),
        reason: e.to_string(),
    })
}

/// The admin token of the control API stored in the data directory `dir`, created on first use
/// like the worker secret.
pub fn admin_token(dir: &Path) -> Result<String, SecretError> {
    stored_secret(dir, ADMIN_TOKEN_FILE, true)
        .map(|token| token.expect("created when missing"))
        .map_err(|e| SecretError {
            path: dir.join(ADMIN_TOKEN_FILE),
            reason: e.to_string(),
        })
}

/// The proxy's worker secret: the configured one (flag, environment or file), or the stored
/// one (generated on first run).
pub fn proxy_secret(configured: Option<&String>) -> Result<String, SecretError> {
    if let Some(secret) = configured {
        return Ok(secret.clone());
    }
    Ok(worker_secret(true)?.expect("created when missing"))
}

/// Writes `text` to `path`, readable and writable by its owner only (elsewhere than Unix, with
/// the directory's default permissions).
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)?.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_generated_once_then_read_back() {
        let dir = std::env::temp_dir().join(format!("mr-paths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(stored_secret(&dir, "s", false).unwrap(), None);
        let first = stored_secret(&dir, "s", true).unwrap().unwrap();
        assert_eq!(first.len(), 32);
        assert_eq!(stored_secret(&dir, "s", true).unwrap().unwrap(), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join("s"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
