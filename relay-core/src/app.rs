//! What the `modelrelay` command runs: proxy and worker together (the zero-config default), the
//! proxy alone, a worker alone, or discovery. The desktop app calls the same functions.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::path::PathBuf;

use rand::distr::{Alphanumeric, SampleString};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cli::{Cli, Command, ModelsCommand};
use crate::config::{self, ConfigError, FileConfig};
use crate::discovery::{self, DiscoveryOptions};
use crate::proxy::{self, RunningProxy};
use crate::worker;

/// How many ports after the default one are tried when it is taken.
const PORT_SEARCH: u16 = 20;

/// A failure that stops the command, with a message that says what to do.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The listen address could not be used.
    #[error("cannot listen on {address}: {reason}")]
    Listen {
        /// The address.
        address: String,
        /// Why, and what to do.
        reason: String,
    },
    /// The worker secret could not be stored or read.
    #[error("worker secret file {path}: {reason}")]
    Secret {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A worker has no secret to present.
    #[error("no worker secret: pass --worker-secret (or set WORKER_SECRET) to the secret the proxy printed when it started")]
    MissingSecret,
    /// `models scan` could not read its directory.
    #[error(transparent)]
    Scan(#[from] crate::lifecycle::scan::ScanError),
}

/// Runs the command line.
pub async fn run(cli: Cli) -> Result<(), AppError> {
    let file = config::load_file(cli.config.as_deref())?;
    let command = if cli.serve {
        Some(Command::Serve)
    } else {
        cli.command.clone()
    };
    match command {
        None => run_both(&cli.proxy, &cli.worker, &file).await,
        Some(Command::Serve) => run_proxy_only(&cli.proxy, &file).await,
        Some(Command::Worker) => run_worker_only(&cli.proxy, &cli.worker, &file).await,
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
            let mapped: Vec<String> = file.worker.model_map.keys().cloned().collect();
            crate::lifecycle::inspect::run(&mapped, &data_dir()).await;
            Ok(())
        }
    }
}

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

/// The stored worker secret, created on first use with 32 random characters (owner-only file).
pub fn stored_secret(create: bool) -> Result<Option<String>, AppError> {
    let path = data_dir().join("worker-secret");
    let failure = |reason: String| AppError::Secret {
        path: path.clone(),
        reason,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(Some(text.trim().to_string())),
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(failure(e.to_string())),
    }
    if !create {
        return Ok(None);
    }
    let secret = Alphanumeric.sample_string(&mut rand::rng(), 32);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| failure(e.to_string()))?;
    }
    write_private(&path, &secret).map_err(|e| failure(e.to_string()))?;
    tracing::info!(path = %path.display(), "generated a new worker secret");
    Ok(Some(secret))
}

#[cfg(unix)]
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}

#[cfg(not(unix))]
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}

/// The proxy's secret: flag/env, file, or the stored one (generated on first run).
fn proxy_secret(flag: Option<&String>, file: &FileConfig) -> Result<String, AppError> {
    if let Some(secret) = flag.or(file.proxy.worker_secret.as_ref()) {
        return Ok(secret.clone());
    }
    Ok(stored_secret(true)?.expect("created when missing"))
}

/// Binds the listen address. The default address moves to the next free port when taken (a
/// llama-server often holds 8080); an explicit one that is taken is an error.
pub async fn bind(address: &str, explicit: bool) -> Result<TcpListener, AppError> {
    let parsed: SocketAddr = address.parse().map_err(|e| AppError::Listen {
        address: address.to_string(),
        reason: format!("not an IP:port address ({e}); example: 0.0.0.0:8080"),
    })?;
    let in_use = |addr: SocketAddr| AppError::Listen {
        address: addr.to_string(),
        reason: "the port is in use; choose another with --listen or LISTEN_ADDR".to_string(),
    };
    match TcpListener::bind(parsed).await {
        Ok(listener) => return Ok(listener),
        Err(e) if e.kind() == ErrorKind::AddrInUse && !explicit => {}
        Err(e) if e.kind() == ErrorKind::AddrInUse => return Err(in_use(parsed)),
        Err(e) => {
            return Err(AppError::Listen {
                address: address.to_string(),
                reason: e.to_string(),
            })
        }
    }
    for offset in 1..=PORT_SEARCH {
        let candidate = SocketAddr::new(parsed.ip(), parsed.port().saturating_add(offset));
        if let Ok(listener) = TcpListener::bind(candidate).await {
            println!(
                "Port {} is in use (probably a model server); serving on port {} instead.",
                parsed.port(),
                candidate.port()
            );
            return Ok(listener);
        }
    }
    Err(in_use(parsed))
}

async fn start_proxy(
    args: &crate::cli::ProxyArgs,
    file: &FileConfig,
) -> Result<(RunningProxy, String), AppError> {
    let (address, explicit) = config::listen_address(args, file);
    // Bind before touching the secret, so a run that cannot listen leaves nothing behind.
    let listener = bind(&address, explicit).await?;
    let secret = proxy_secret(args.worker_secret.as_ref(), file)?;
    let config = config::proxy_config(args, file, secret.clone())?;
    let proxy = proxy::start(config, listener).map_err(|e| AppError::Listen {
        address,
        reason: e.to_string(),
    })?;
    tracing::info!(addr = %proxy.addr, "proxy listening");
    Ok((proxy, secret))
}

fn print_banner(proxy: &RunningProxy, secret: &str, provider: Option<&String>) {
    let url = proxy.url();
    let join_host = if proxy.addr.ip().is_loopback() {
        println!("ModelRelay is serving at {url}");
        println!("  OpenAI base URL:     {url}/v1");
        println!("  Anthropic base URL:  {url}   (e.g. ANTHROPIC_BASE_URL={url})");
        println!("Other machines cannot reach a loopback address; to let GPU boxes join,");
        println!(
            "restart with --listen 0.0.0.0:{} and run on each box:",
            proxy.addr.port()
        );
        format!("THIS-MACHINE:{}", proxy.addr.port())
    } else {
        println!("ModelRelay is serving at {url}");
        println!("To join another GPU box, run on it:");
        proxy.addr.to_string()
    };
    let provider = provider
        .map(|p| format!(" --provider {p}"))
        .unwrap_or_default();
    println!(
        "  modelrelay worker --proxy-url http://{join_host} --worker-secret {secret}{provider}"
    );
}

async fn run_both(
    proxy_args: &crate::cli::ProxyArgs,
    worker_args: &crate::cli::WorkerArgs,
    file: &FileConfig,
) -> Result<(), AppError> {
    let (proxy, secret) = start_proxy(proxy_args, file).await?;
    let discovery = DiscoveryOptions {
        exclude_ports: vec![proxy.addr.port()],
        ..DiscoveryOptions::default()
    };
    let mut worker_args = worker_args.clone();
    // The in-process worker joins over the same WebSocket path as any other worker.
    worker_args.proxy_url = Some(proxy.url());
    let worker_config = config::worker_config(
        &worker_args,
        proxy_args,
        file,
        secret.clone(),
        Some(discovery),
    )?;
    print_banner(&proxy, &secret, proxy_args.provider.as_ref());
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(worker::run(worker_config, stopped));
    shutdown_signal().await;
    let _ = stop.send(true);
    proxy.shutdown().await;
    let _ = worker.await;
    Ok(())
}

async fn run_proxy_only(args: &crate::cli::ProxyArgs, file: &FileConfig) -> Result<(), AppError> {
    let (proxy, secret) = start_proxy(args, file).await?;
    print_banner(&proxy, &secret, args.provider.as_ref());
    shutdown_signal().await;
    proxy.shutdown().await;
    Ok(())
}

async fn run_worker_only(
    proxy_args: &crate::cli::ProxyArgs,
    worker_args: &crate::cli::WorkerArgs,
    file: &FileConfig,
) -> Result<(), AppError> {
    let secret = match proxy_args
        .worker_secret
        .clone()
        .or_else(|| file.worker.worker_secret.clone())
    {
        Some(secret) => secret,
        // On the proxy's own machine the stored secret is the right one.
        None => stored_secret(false)?.ok_or(AppError::MissingSecret)?,
    };
    let config = config::worker_config(worker_args, proxy_args, file, secret, None)?;
    tracing::info!(proxy = %config.proxy_url, name = %config.name, "starting worker");
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(worker::run(config, stopped));
    shutdown_signal().await;
    let _ = stop.send(true);
    let _ = worker.await;
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
