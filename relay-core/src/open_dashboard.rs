//! `modelrelay dashboard`: opens this machine's dashboard in the browser, signed in.
//!
//! It mints the one-time login link itself from the admin token it can read (configured, or the
//! node's `admin-token` file), so the token never travels — not even to whatever may listen on
//! the node's port while the node is down. The link names the node's port in its signature;
//! the URL comes from the file the running node writes into its data directory (a default node
//! moves to the next free port when 8080 is taken), else from the settings.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::paths;
use crate::proxy::access::session::{Sessions, LINK_LIFETIME};
use crate::proxy::access::sign_in::link_path;
use crate::settings::{FileConfig, Overrides, ProxySettings, TlsSetting};

/// `modelrelay dashboard` could not make a link.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the dashboard: {reason}")]
pub struct DashboardError {
    /// Why, and what to do.
    pub reason: String,
}

/// The file in the data directory where a running node writes the URL a browser on this
/// machine opens its dashboard at.
pub const URL_FILE: &str = "dashboard-url";

/// Writes `url` to the data directory `dir`'s [`URL_FILE`] (owner-only).
pub fn remember_url(dir: &Path, url: &str) {
    let written =
        std::fs::create_dir_all(dir).and_then(|()| paths::write_private(&dir.join(URL_FILE), url));
    if let Err(error) = written {
        tracing::warn!(%error, dir = %dir.display(), "could not note the dashboard's URL for `modelrelay dashboard`");
    }
}

/// What `modelrelay dashboard` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The one-time link.
    pub url: String,
    /// Whether the node answered at its address just now.
    pub node_answers: bool,
}

/// Mints a login link for the node configured by `file` and `overrides`, whose data directory
/// is `dir`.
pub async fn link(
    file: &FileConfig,
    overrides: &Overrides,
    dir: &Path,
) -> Result<Link, DashboardError> {
    let settings =
        ProxySettings::resolve(file, overrides).map_err(|e| dashboard_error(e.to_string()))?;
    let base = match std::fs::read_to_string(dir.join(URL_FILE)) {
        Ok(text) if !text.trim().is_empty() => text.trim().trim_end_matches('/').to_string(),
        _ => {
            let scheme = if matches!(settings.tls, TlsSetting::Off) {
                "http"
            } else {
                "https"
            };
            format!("{scheme}://{}", browser_address(&settings.listen))
        }
    };
    let parsed = reqwest::Url::parse(&base)
        .map_err(|e| dashboard_error(format!("{base} is not a URL: {e}")))?;
    let port = parsed
        .port_or_known_default()
        .ok_or_else(|| dashboard_error(format!("{base} names no port")))?;
    let token = match settings.admin_token {
        Some(token) => token,
        None => paths::stored_secret(dir, paths::ADMIN_TOKEN_FILE, false)
            .map_err(|e| {
                dashboard_error(format!(
                    "cannot read {}: {e}",
                    paths::admin_token_path(dir).display()
                ))
            })?
            .ok_or_else(|| {
                dashboard_error(format!(
                    "no admin token at {}: start the relay first (`modelrelay`), or set \
                     MODELRELAY_ADMIN_TOKEN to the one it uses",
                    paths::admin_token_path(dir).display()
                ))
            })?,
    };
    let sessions = Sessions::new(&token, port, parsed.scheme() == "https");
    let node_answers = answers(&parsed).await;
    Ok(Link {
        url: format!("{base}{}", link_path(&sessions, LINK_LIFETIME)),
        node_answers,
    })
}

/// Runs the command: prints the link and, unless `print_only`, opens it in the browser.
pub async fn run(
    file: &FileConfig,
    overrides: &Overrides,
    print_only: bool,
) -> Result<(), DashboardError> {
    let link = link(file, overrides, &paths::data_dir()).await?;
    if !link.node_answers {
        eprintln!(
            "Nothing answers at this address right now; start the relay (`modelrelay`) and open \
             the link within {} s.",
            LINK_LIFETIME.as_secs()
        );
    }
    if print_only {
        println!("{}", link.url);
        return Ok(());
    }
    match open_in_browser(&link.url) {
        Ok(()) => eprintln!(
            "Opened the dashboard in your browser (the link signs it in once, within {} s).",
            LINK_LIFETIME.as_secs()
        ),
        Err(reason) => {
            eprintln!(
                "Could not open a browser ({reason}); open this link (once, within {} s):",
                LINK_LIFETIME.as_secs()
            );
            println!("{}", link.url);
        }
    }
    Ok(())
}

fn dashboard_error(reason: String) -> DashboardError {
    DashboardError { reason }
}

/// `listen` as a browser on this machine reaches it: a wildcard address becomes loopback.
fn browser_address(listen: &str) -> String {
    match listen.parse::<SocketAddr>() {
        Ok(mut addr) if addr.ip().is_unspecified() => {
            addr.set_ip(if addr.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
            addr.to_string()
        }
        _ => listen.to_string(),
    }
}

/// Whether something accepts connections at `url`'s address within a second (nothing is sent).
async fn answers(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_or_known_default().unwrap_or(80);
    tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    .is_ok_and(|connected| connected.is_ok())
}

/// Opens `url` with the platform's opener.
fn open_in_browser(url: &str) -> Result<(), String> {
    let mut command = if cfg!(target_os = "macos") {
        std::process::Command::new("open")
    } else if cfg!(windows) {
        let mut command = std::process::Command::new("rundll32");
        command.arg("url.dll,FileProtocolHandler");
        command
    } else {
        std::process::Command::new("xdg-open")
    };
    let status = command
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the opener exited with {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_listen_address_opens_on_loopback() {
        assert_eq!(browser_address("0.0.0.0:8080"), "127.0.0.1:8080");
        assert_eq!(browser_address("[::]:8080"), "[::1]:8080");
        assert_eq!(browser_address("127.0.0.1:9"), "127.0.0.1:9");
    }

    #[tokio::test]
    async fn the_link_names_the_running_nodes_url_and_works_there_only() {
        let dir = std::env::temp_dir().join(format!("mr-dashboard-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let token = paths::stored_secret(&dir, paths::ADMIN_TOKEN_FILE, true)
            .unwrap()
            .unwrap();
        remember_url(&dir, "http://127.0.0.1:18081");
        let link = link(&FileConfig::default(), &Overrides::default(), &dir)
            .await
            .unwrap();
        let code = link
            .url
            .strip_prefix("http://127.0.0.1:18081/login?code=")
            .unwrap_or_else(|| panic!("{}", link.url));
        assert!(!Sessions::new(&token, 8080, false).redeem(code));
        assert!(Sessions::new(&token, 18081, false).redeem(code));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn without_a_token_it_says_to_start_the_relay_first() {
        let dir = std::env::temp_dir().join(format!("mr-dashboard-none-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let error = link(&FileConfig::default(), &Overrides::default(), &dir)
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("start the relay first"), "{error}");
    }
}
