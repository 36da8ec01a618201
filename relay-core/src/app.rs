//! What the `modelrelay` command runs: proxy and worker together (the zero-config default), the
//! proxy alone, a worker alone, or discovery. The desktop app calls the same functions.

use std::path::{Path, PathBuf};

use tokio::sync::watch;

use crate::cli::{Cli, Command, ModelsCommand};
use crate::discovery::{self, DiscoveryOptions};
use crate::node::{Node, NodeOptions, Roles};
use crate::paths;
use crate::settings::{self, ConfigError, FileConfig, Overrides, WorkerSettings};
use crate::worker::{self, WorkerConfig};

/// A failure that stops the command, with a message that says what to do.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The listen address could not be used.
    #[error(transparent)]
    Listen(#[from] crate::listen::ListenError),
    /// The worker secret could not be stored or read.
    #[error(transparent)]
    Secret(#[from] paths::SecretError),
    /// The node could not start or apply its settings.
    #[error(transparent)]
    Node(#[from] crate::node::NodeError),
    /// A worker has no secret to present.
    #[error("no worker secret: pass --worker-secret (or set WORKER_SECRET) to the secret the proxy printed when it started")]
    MissingSecret,
    /// The proxy's TLS certificate could not be loaded or generated.
    #[error(transparent)]
    Tls(#[from] crate::tls::server::TlsError),
    /// `modelrelay dashboard` could not make a link.
    #[error(transparent)]
    Dashboard(#[from] crate::open_dashboard::DashboardError),
    /// `models scan` could not read its directory.
    #[error(transparent)]
    Scan(#[from] crate::lifecycle::scan::ScanError),
}

/// Runs the command line.
pub async fn run(cli: Cli) -> Result<(), AppError> {
    let secret_source = SecretSource::of(&cli);
    let overrides = overrides(&cli)?;
    // A node creates its config file when settings are first saved, so only the other
    // commands need it to exist.
    let file = || settings::load_file(cli.config.as_deref());
    let command = if cli.serve {
        Some(Command::Serve)
    } else {
        cli.command.clone()
    };
    match command {
        None => run_node(&cli, overrides, None, &secret_source).await,
        Some(Command::Serve) => {
            run_node(
                &cli,
                overrides,
                Some(Roles {
                    proxy: true,
                    worker: false,
                }),
                &secret_source,
            )
            .await
        }
        Some(Command::Worker) => run_worker_only(&overrides, &file()?).await,
        Some(Command::Dashboard { print }) => {
            Ok(crate::open_dashboard::run(&file()?, &overrides, print).await?)
        }
        Some(Command::Discover { json }) => {
            run_discover(json).await;
            Ok(())
        }
        Some(Command::Models {
            command: ModelsCommand::Scan { dir },
        }) => Ok(crate::lifecycle::scan::run(&dir)?),
        Some(Command::Models {
            command: ModelsCommand::Status,
        }) => {
            let mapped: Vec<String> = file()?.worker.model_map.keys().cloned().collect();
            crate::lifecycle::inspect::run(&mapped, &paths::data_dir()).await;
            Ok(())
        }
    }
}

/// The start-up banner. It names where the secrets are instead of printing them: stdout ends up
/// in journald and `docker logs`, which more people can read than the files.
fn print_banner(node: &Node, secret_source: &SecretSource) {
    let url = node.url();
    let addr = node.addr();
    let roles = node.roles();
    println!("ModelRelay is serving at {url}");
    // A one-time link only where a person reads it: stdout may be journald or `docker logs`.
    let link = std::io::IsTerminal::is_terminal(&std::io::stdout())
        .then(|| node.login_link(crate::proxy::access::session::BANNER_LINK_LIFETIME))
        .flatten();
    match link {
        Some(link) => {
            println!("  Dashboard:           {link}");
            println!("                       (signs this browser in once; `modelrelay dashboard` opens it again)");
        }
        None => println!(
            "  Dashboard:           {url}/   (sign in: run `modelrelay dashboard` on this machine)"
        ),
    }
    if roles.proxy {
        println!("  OpenAI base URL:     {url}/v1");
        println!("  Anthropic base URL:  {url}   (e.g. ANTHROPIC_BASE_URL={url})");
    } else {
        println!("  The proxy role is off: this node only runs its worker.");
    }
    println!(
        "  Admin token:         {}",
        node.admin_token_origin().short()
    );
    if let Some(fingerprint) = node.fingerprint() {
        // Workers pin this; clients can check it against what their browser or SDK shows.
        println!("  TLS certificate:     {fingerprint}");
    }
    if !roles.proxy {
        return;
    }
    println!("  Worker secret:       {}", secret_source.describe());
    let scheme = if node.fingerprint().is_some() {
        "https"
    } else {
        "http"
    };
    // The addresses other machines reach, never the wildcard this node may listen on.
    let urls = node.join_urls();
    let join_url = if addr.ip().is_loopback() {
        println!("Other machines cannot reach a loopback address; to let GPU boxes join,");
        println!(
            "restart with --listen 0.0.0.0:{} and run on each box:",
            addr.port()
        );
        format!("{scheme}://THIS-MACHINE:{}", addr.port())
    } else {
        println!("To join another GPU box, run on it (or paste the join code from the dashboard's Setup page):");
        urls[0].clone()
    };
    let provider = match node.provider() {
        settings::defaults::PROVIDER => String::new(),
        other => format!(" --provider {other}"),
    };
    let pin = match node.fingerprint() {
        Some(fingerprint) => format!(" --proxy-fingerprint {fingerprint}"),
        None => String::new(),
    };
    println!(
        "  WORKER_SECRET=<the worker secret> modelrelay worker --proxy-url {join_url}{provider}{pin}"
    );
    if !addr.ip().is_loopback() && urls.len() > 1 {
        println!(
            "  This proxy is also reachable at: {}",
            urls[1..].join(", ")
        );
    }
}

/// Where the proxy's worker secret comes from, for the banner.
#[derive(Debug, Clone)]
pub enum SecretSource {
    /// `--worker-secret`, `WORKER_SECRET` or the config file.
    Given,
    /// `--worker-secret-file` / `WORKER_SECRET_FILE`.
    File(PathBuf),
    /// Generated on first run and stored in the data directory.
    Stored,
}

impl SecretSource {
    fn describe(&self) -> String {
        match self {
            SecretSource::Given => {
                "as configured (--worker-secret, WORKER_SECRET or the config file)".to_string()
            }
            SecretSource::File(path) => format!("in {}", path.display()),
            SecretSource::Stored => {
                format!(
                    "stored in {}",
                    paths::data_dir().join(paths::WORKER_SECRET_FILE).display()
                )
            }
        }
    }

    fn of(cli: &Cli) -> SecretSource {
        if let Some(path) = &cli.proxy.worker_secret_file {
            SecretSource::File(path.clone())
        } else if cli.proxy.worker_secret.is_some() {
            SecretSource::Given
        } else {
            match settings::load_file(cli.config.as_deref()) {
                Ok(file) if file.proxy.worker_secret.is_some() => SecretSource::Given,
                _ => SecretSource::Stored,
            }
        }
    }
}

/// What the command line and environment say, with `--worker-secret-file` read into the worker
/// secret, so everything after sees one secret. The desktop app starts its node with these too.
pub fn overrides(cli: &Cli) -> Result<Overrides, AppError> {
    let mut overrides = cli.overrides();
    if let Some(path) = &cli.proxy.worker_secret_file {
        overrides.worker_secret = Some(secret_from_file(path, "the worker secret")?);
    }
    if let Some(path) = &cli.proxy.admin_token_file {
        overrides.admin_token = Some(secret_from_file(path, "the admin token")?);
    }
    Ok(overrides)
}

/// The secret in the file at `path` (`what` it is, for the error), trimmed; an empty file or
/// one that cannot be read is an error naming it.
fn secret_from_file(path: &Path, what: &str) -> Result<String, AppError> {
    let failure = |reason: String| {
        AppError::Secret(paths::SecretError {
            path: path.to_path_buf(),
            reason,
        })
    };
    let text = std::fs::read_to_string(path).map_err(|e| failure(e.to_string()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(failure(format!("the file is empty: write {what} into it")));
    }
    Ok(secret.to_string())
}

/// Runs a node (proxy and/or worker, with the dashboard) until Ctrl-C or SIGTERM.
async fn run_node(
    cli: &Cli,
    overrides: Overrides,
    roles: Option<Roles>,
    secret_source: &SecretSource,
) -> Result<(), AppError> {
    let node = Node::start(NodeOptions {
        config_path: cli.config.clone(),
        overrides,
        roles,
        ..NodeOptions::default()
    })
    .await?;
    print_banner(&node, secret_source);
    crate::resident::release_start_up_code_soon();
    shutdown_signal().await;
    node.shutdown().await;
    Ok(())
}

async fn run_worker_only(overrides: &Overrides, file: &FileConfig) -> Result<(), AppError> {
    let settings = WorkerSettings::resolve(file, overrides)?;
    let secret = match settings.worker_secret.clone() {
        Some(secret) => secret,
        // On the proxy's own machine the stored secret is the right one.
        None => paths::worker_secret(false)?.ok_or(AppError::MissingSecret)?,
    };
    let proxy_url = settings
        .proxy_url
        .clone()
        .unwrap_or_else(|| settings::defaults::PROXY_URL.to_string());
    let config = WorkerConfig::from_settings(settings, proxy_url, secret, None);
    tracing::info!(proxy = %config.proxy_url, name = %config.name, "starting worker");
    let (stop, stopped) = watch::channel(false);
    let mut worker = tokio::spawn(worker::run(config, Default::default(), stopped));
    crate::resident::release_start_up_code_soon();
    tokio::select! {
        () = shutdown_signal() => {
            let _ = stop.send(true);
            let _ = worker.await;
        }
        // Drained by its proxy: the process exits 0, as the published worker does; a service
        // manager (systemd's Restart=always) brings it back.
        _ = &mut worker => tracing::info!("worker exits: its proxy drained it"),
    }
    Ok(())
}

async fn run_discover(json: bool) {
    eprintln!("Looking for model servers on this machine...");
    let found = discovery::discover(&DiscoveryOptions::default()).await;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&found).unwrap_or_default()
        );
        return;
    }
    if found.is_empty() {
        println!(
            "No model server found on the usual ports ({:?}).",
            discovery::WELL_KNOWN_PORTS
        );
        println!("Start llama-server, Ollama, vLLM or LM Studio, or point a worker at yours with --backend-url.");
        return;
    }
    for backend in found {
        println!(
            "{:<18} {:<28} {}",
            backend.kind.label(),
            backend.url,
            backend.models.join(", ")
        );
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
    tracing::info!("shutdown requested: draining");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_worker_secret_file_becomes_the_worker_secret_and_an_empty_one_is_an_error() {
        let dir = std::env::temp_dir().join(format!("modelrelay-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, "s3cret\n").unwrap();
        let cli =
            Cli::try_parse_from(["modelrelay", "--worker-secret-file", file.to_str().unwrap()])
                .unwrap();
        assert_eq!(
            overrides(&cli).unwrap().worker_secret.as_deref(),
            Some("s3cret")
        );
        std::fs::write(&file, " \n").unwrap();
        let error = overrides(&cli).unwrap_err().to_string();
        assert!(error.contains("empty"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
