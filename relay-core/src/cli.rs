//! Command-line interface of `modelrelay`. Every flag also reads an environment variable with the
//! name the seeds and the published ModelRelay binaries use.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::fingerprint::Fingerprint;
use crate::settings::Overrides;

/// ModelRelay: one OpenAI- and Anthropic-compatible endpoint for all your GPU boxes.
///
/// With no command, runs a proxy and a worker in one process: the proxy on 127.0.0.1:8080 (or the
/// next free port), and a worker serving every model server found on this machine (llama-server,
/// Ollama, vLLM, LM Studio, llamafile, ...).
///
/// Settings come from, lowest priority first: built-in defaults, the config file
/// (--config, or ~/.config/modelrelay/config.toml when present), environment variables, flags.
#[derive(Debug, Parser)]
#[command(name = "modelrelay", version, about, long_about)]
pub struct Cli {
    /// What to run; with none, proxy and worker together.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Run the proxy only (same as the `serve` command).
    #[arg(long, global = true)]
    pub serve: bool,

    /// TOML config file.
    #[arg(long, env = "MODELRELAY_CONFIG", global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Log verbosity: trace, debug, info, warn or error (or a tracing filter directive).
    #[arg(long, env = "LOG_LEVEL", global = true, value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// Proxy settings.
    #[command(flatten)]
    pub proxy: ProxyArgs,

    /// Worker settings.
    #[command(flatten)]
    pub worker: WorkerArgs,
}

impl Cli {
    /// What the flags and environment variables say, as the settings' top layer; callers go
    /// through `app::overrides`, which also reads `--worker-secret-file`.
    pub(crate) fn overrides(&self) -> Overrides {
        let (p, w) = (&self.proxy, &self.worker);
        Overrides {
            listen: p.listen.clone(),
            worker_secret: p.worker_secret.clone(),
            admin_token: p.admin_token.clone(),
            forward_client_auth: p.forward_client_auth,
            require_api_keys: p.require_api_keys,
            affinity: p.affinity,
            cost_routing: p.cost_routing,
            database_url: p.database_url.clone(),
            allowed_hosts: p.allowed_hosts.clone(),
            cors_origins: p.cors_origins.clone(),
            metrics_public: p.metrics_public,
            tls_cert: p.tls_cert.clone(),
            tls_key: p.tls_key.clone(),
            tls: p.tls,
            provider: p.provider.clone(),
            max_queue_len: p.max_queue_len,
            queue_timeout_secs: p.queue_timeout,
            request_timeout_secs: p.request_timeout,
            max_connections: p.max_connections,
            max_body_bytes: p.max_body_bytes,
            heartbeat_interval_secs: p.heartbeat_interval,
            heartbeat_timeout_secs: p.heartbeat_timeout,
            drain_timeout_secs: p.drain_timeout,
            proxy_url: w.proxy_url.clone(),
            proxy_fingerprint: w.proxy_fingerprint,
            worker_name: w.worker_name.clone(),
            backend_url: w.backend_url.clone(),
            models: w.models.clone(),
            max_concurrency: w.max_concurrency,
            protocol_version: w.protocol_version.clone(),
            worker_drain_timeout_secs: w.worker_drain_timeout,
            proxy_silence_timeout_secs: w.proxy_silence_timeout,
            wake_target: p.wake_target.clone(),
            sleepers_remembered_secs: p.sleepers_remembered,
            sleeps_when_idle: w.sleeps_when_idle,
            slot_hints: w.slot_hints,
            mac_address: w.mac_address.clone(),
        }
    }
}

/// The commands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run the proxy only: clients and workers connect to it.
    Serve,
    /// Run a worker only: connect out to a proxy and serve a local backend.
    Worker,
    /// Open this machine's dashboard in the browser, signed in (a one-time link made from the
    /// admin token; the token itself is never sent).
    Dashboard {
        /// Print the link instead of opening a browser.
        #[arg(long)]
        print: bool,
    },
    /// List model servers running on this machine and their models.
    Discover {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Model files and the worker's model map.
    Models {
        /// What to do.
        #[command(subcommand)]
        command: ModelsCommand,
    },
}

/// `modelrelay models ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum ModelsCommand {
    /// Find .gguf model files under DIR and print model-map entries for the config file.
    Scan {
        /// The directory to search (recursively).
        dir: PathBuf,
    },
    /// Show the model map and which of its models run on this machine (port, pid, whether
    /// /health answers), including servers a killed worker left behind.
    Status,
}

/// Proxy flags.
#[derive(Debug, Default, Clone, Args)]
pub struct ProxyArgs {
    /// Address the proxy listens on [default: 127.0.0.1:8080, or the next free port].
    #[arg(long, env = "LISTEN_ADDR", global = true, value_name = "ADDR")]
    pub listen: Option<String>,

    /// Shared secret workers authenticate with [default: generated on first run and stored in
    /// the data directory].
    #[arg(
        long,
        env = "WORKER_SECRET",
        global = true,
        value_name = "SECRET",
        hide_env_values = true
    )]
    pub worker_secret: Option<String>,

    /// Token of the control API [default: generated on first run and stored in the data
    /// directory]. Given, it guards every control route; generated, only changes that run
    /// programs or send secrets elsewhere, unless the proxy listens beyond loopback.
    #[arg(
        long,
        env = "MODELRELAY_ADMIN_TOKEN",
        global = true,
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,

    /// File holding the admin token (keeps it off the command line and out of `ps`).
    #[arg(
        long,
        env = "MODELRELAY_ADMIN_TOKEN_FILE",
        global = true,
        value_name = "FILE",
        conflicts_with = "admin_token"
    )]
    pub admin_token_file: Option<PathBuf>,

    /// File holding the worker secret (keeps it off the command line and out of `ps`): the
    /// proxy's secret, and the one a worker presents.
    #[arg(
        long,
        env = "WORKER_SECRET_FILE",
        global = true,
        value_name = "FILE",
        conflicts_with = "worker_secret"
    )]
    pub worker_secret_file: Option<PathBuf>,

    /// Pass clients' `Authorization` and `x-api-key` on: the proxy to the workers of its
    /// default provider, a worker to its backends (for backends that check them) [default:
    /// false: the shared worker secret must not hand every box the users' keys].
    #[arg(
        long,
        env = "FORWARD_CLIENT_AUTH",
        global = true,
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub forward_client_auth: Option<bool>,

    /// Inference requests (/v1/...) need a client API key, sent as `Authorization: Bearer
    /// mr-...` or `x-api-key: mr-...`; keys are made with POST /admin/keys or the dashboard's
    /// Keys page [default: false].
    #[arg(
        long,
        env = "MODELRELAY_REQUIRE_API_KEYS",
        global = true,
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub require_api_keys: Option<bool>,

    /// Send a conversation's next turn to the worker that served it last, whose backend still
    /// holds its prompt in cache (keyed by a session id or the prompt's leading part); off routes
    /// every request to the least-loaded worker [default: true].
    #[arg(
        long,
        env = "MODELRELAY_AFFINITY",
        global = true,
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub affinity: Option<bool>,

    /// Send a request to a faster box than the usual rules pick when its measured speed says
    /// its first token comes clearly sooner [default: true; `--cost-routing false` keeps the
    /// usual rules alone].
    #[arg(
        long,
        env = "MODELRELAY_COST_ROUTING",
        global = true,
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub cost_routing: Option<bool>,

    /// Keep client API keys and usage in this PostgreSQL database (postgres://user:pass@host/db),
    /// shared by every proxy pointed at it, instead of the SQLite file in the data directory.
    #[arg(long, env = "DATABASE_URL", global = true, value_name = "URL")]
    pub database_url: Option<String>,

    /// Host names, besides this machine's own, that requests may carry in `Host` (comma-separated;
    /// `*` turns the check off). Others are refused: that stops DNS-rebinding web pages.
    #[arg(
        long,
        env = "MODELRELAY_ALLOWED_HOSTS",
        global = true,
        value_name = "NAMES",
        value_delimiter = ','
    )]
    pub allowed_hosts: Option<Vec<String>>,

    /// Web origins allowed to call /v1 from a browser (comma-separated, e.g.
    /// https://chat.example.com; `*` for any). Other web pages are refused.
    #[arg(
        long,
        env = "MODELRELAY_CORS_ORIGINS",
        global = true,
        value_name = "ORIGINS",
        value_delimiter = ','
    )]
    pub cors_origins: Option<Vec<String>>,

    /// Serve /metrics (Prometheus) without the admin token even where the control API needs it
    /// (a configured token, or a listener beyond loopback) [default: false]. On loopback with
    /// no configured token it is open either way, like the dashboard.
    #[arg(
        long,
        env = "MODELRELAY_METRICS_PUBLIC",
        global = true,
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub metrics_public: Option<bool>,

    /// Where Wake-on-LAN packets for sleeping boxes go, as IP:PORT: the broadcast address of
    /// their network [default: 255.255.255.255:9].
    #[arg(
        long,
        env = "MODELRELAY_WAKE_TARGET",
        global = true,
        value_name = "IP:PORT"
    )]
    pub wake_target: Option<String>,

    /// Seconds a sleeping box is remembered (its models listed, requests waking it)
    /// [default: 604800, 7 days].
    #[arg(
        long = "sleepers-remembered",
        env = "MODELRELAY_SLEEPERS_REMEMBERED_SECS",
        global = true,
        value_name = "SECS"
    )]
    pub sleepers_remembered: Option<u64>,

    /// Serve HTTPS with this PEM certificate (chain, leaf first); needs --tls-key. Workers pin
    /// its fingerprint, shown at start-up and carried in the join code.
    #[arg(long, env = "TLS_CERT", global = true, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, env = "TLS_KEY", global = true, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// `self-signed`: serve HTTPS with a certificate generated on first run and kept in the data
    /// directory (tls/cert.pem); workers pin its fingerprint. `off`: plain HTTP [default: off].
    #[arg(long, env = "MODELRELAY_TLS", global = true, value_name = "MODE")]
    pub tls: Option<TlsMode>,

    /// Provider name: the proxy's default provider, and the one a worker joins [default: local].
    #[arg(long, env = "PROVIDER_NAME", global = true, value_name = "NAME")]
    pub provider: Option<String>,

    /// Queued requests per provider before new ones get 429; 0 for no limit [default: 100].
    #[arg(long, env = "MAX_QUEUE_LEN", global = true, value_name = "N")]
    pub max_queue_len: Option<usize>,

    /// Seconds a request may wait in the queue before 504 [default: 30].
    #[arg(
        long = "queue-timeout",
        env = "QUEUE_TIMEOUT_SECS",
        global = true,
        value_name = "SECS"
    )]
    pub queue_timeout: Option<u64>,

    /// Seconds a request may live in total before it is cancelled with 504 [default: 300].
    #[arg(
        long = "request-timeout",
        env = "REQUEST_TIMEOUT_SECS",
        global = true,
        value_name = "SECS"
    )]
    pub request_timeout: Option<u64>,

    /// Open connections (clients and workers) beyond which new ones get 503 [default: 20000].
    #[arg(long, env = "MAX_CONNECTIONS", global = true, value_name = "N")]
    pub max_connections: Option<usize>,

    /// Largest request body accepted, in bytes, before 413 [default: 33554432].
    #[arg(long, env = "MAX_BODY_BYTES", global = true, value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,

    /// Seconds between heartbeat pings to workers [default: 15].
    #[arg(
        long = "heartbeat-interval",
        env = "HEARTBEAT_INTERVAL_SECS",
        global = true,
        value_name = "SECS"
    )]
    pub heartbeat_interval: Option<u64>,

    /// Seconds without hearing from a worker before it is disconnected [default: 45].
    #[arg(
        long = "heartbeat-timeout",
        env = "HEARTBEAT_TIMEOUT_SECS",
        global = true,
        value_name = "SECS"
    )]
    pub heartbeat_timeout: Option<u64>,

    /// Seconds in-flight requests get to finish when the proxy shuts down [default: 30].
    #[arg(
        long = "drain-timeout",
        env = "DRAIN_TIMEOUT_SECS",
        global = true,
        value_name = "SECS"
    )]
    pub drain_timeout: Option<u64>,
}

pub use crate::settings::TlsMode;

/// Worker flags.
#[derive(Debug, Default, Clone, Args)]
pub struct WorkerArgs {
    /// URL of the proxy to join; https:// connects over wss:// [default: http://127.0.0.1:8080].
    #[arg(long, env = "PROXY_URL", global = true, value_name = "URL")]
    pub proxy_url: Option<String>,

    /// SHA-256 fingerprint of the proxy's certificate (sha256:<64 hex>, as its banner and join
    /// code show): connect over wss:// and trust that certificate only, no CA needed.
    #[arg(long, env = "PROXY_FINGERPRINT", global = true, value_name = "SHA256")]
    pub proxy_fingerprint: Option<Fingerprint>,

    /// This worker's name as the proxy shows it [default: the host name].
    #[arg(long, env = "WORKER_NAME", global = true, value_name = "NAME")]
    pub worker_name: Option<String>,

    /// Model server(s) to forward to, comma-separated [default: http://127.0.0.1:8000; with no
    /// command: every server discovered on this machine].
    #[arg(long, env = "BACKEND_URL", global = true, value_name = "URL")]
    pub backend_url: Option<String>,

    /// Models to advertise, comma-separated; `*` asks the backend [default: *].
    #[arg(long, env = "MODELS", global = true, value_name = "LIST")]
    pub models: Option<String>,

    /// Requests this worker runs at once; match the backend's parallel slots [default: 4].
    #[arg(long, env = "MAX_CONCURRENCY", global = true, value_name = "N")]
    pub max_concurrency: Option<u32>,

    /// Protocol version announced to the proxy; `none` sends none [default: 2026-04-bridge-v1].
    #[arg(long, env = "PROTOCOL_VERSION", global = true, value_name = "VERSION")]
    pub protocol_version: Option<String>,

    /// Seconds in-flight requests get to finish when the worker stops [default: 30].
    #[arg(
        long = "worker-drain-timeout",
        env = "WORKER_DRAIN_TIMEOUT_SECS",
        global = true,
        value_name = "SECS"
    )]
    pub worker_drain_timeout: Option<u64>,

    /// Seconds without hearing from the proxy (no message, no answer to the worker's own pings)
    /// before the worker takes the connection for dead and reconnects [default: 60].
    #[arg(
        long = "proxy-silence-timeout",
        env = "PROXY_SILENCE_TIMEOUT_SECS",
        global = true,
        value_name = "SECS"
    )]
    pub proxy_silence_timeout: Option<u64>,

    /// This box suspends when idle: when its worker leaves, the proxy keeps its models listed
    /// as asleep and wakes it with Wake-on-LAN for a request [default: false]. `kill -USR1`
    /// tells the worker the box is about to suspend, whatever this says.
    #[arg(
        long,
        env = "MODELRELAY_SLEEPS_WHEN_IDLE",
        global = true,
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub sleeps_when_idle: Option<bool>,

    /// Keep each conversation in one slot of a llama-server backend (`id_slot` in chat and
    /// completion requests), so its cached prompt is reused on its next turn [default: true].
    #[arg(
        long,
        env = "MODELRELAY_SLOT_HINTS",
        global = true,
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub slot_hints: Option<bool>,

    /// The network card the proxy wakes, as aa:bb:cc:dd:ee:ff [default: on Linux, the card of
    /// the default route's interface; elsewhere none].
    #[arg(
        long,
        env = "MODELRELAY_MAC_ADDRESS",
        global = true,
        value_name = "MAC"
    )]
    pub mac_address: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_defaults_the_help_names_are_the_settings_defaults() {
        use crate::settings::defaults;
        let help = Cli::command().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for named in [
            format!("[default: {}, or the next free port]", defaults::LISTEN),
            format!("[default: {}]", defaults::PROVIDER),
            format!("[default: {}]", defaults::MAX_QUEUE_LEN),
            format!("[default: {}]", defaults::QUEUE_TIMEOUT.as_secs()),
            format!("[default: {}]", defaults::REQUEST_TIMEOUT.as_secs()),
            format!("[default: {}]", defaults::MAX_CONNECTIONS),
            format!("[default: {}]", defaults::MAX_BODY_BYTES),
            format!("[default: {}]", defaults::HEARTBEAT_INTERVAL.as_secs()),
            format!("[default: {}]", defaults::HEARTBEAT_TIMEOUT.as_secs()),
            format!("[default: {}]", defaults::DRAIN_TIMEOUT.as_secs()),
            format!("[default: {}]", defaults::METRICS_PUBLIC),
            format!("[default: {}]", defaults::MAX_CONCURRENCY),
            format!("[default: {}]", defaults::PROXY_URL),
            format!("[default: {};", defaults::BACKEND_URL),
        ] {
            assert!(help.contains(&named), "the help does not say {named}");
        }
    }

    #[test]
    fn metrics_public_is_a_switch_that_also_takes_a_value() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["modelrelay"], args].concat()).unwrap();
            cli.overrides().metrics_public
        };
        assert_eq!(parse(&["serve", "--metrics-public"]), Some(true));
        assert_eq!(parse(&["--metrics-public", "false"]), Some(false));
    }

    #[test]
    fn flags_work_before_and_after_the_command() {
        let cli = Cli::try_parse_from([
            "modelrelay",
            "--listen",
            "0.0.0.0:9",
            "serve",
            "--max-queue-len",
            "5",
        ])
        .unwrap();
        assert!(matches!(cli.command, Some(Command::Serve)));
        assert_eq!(cli.proxy.listen.as_deref(), Some("0.0.0.0:9"));
        assert_eq!(cli.proxy.max_queue_len, Some(5));
        let cli = Cli::try_parse_from([
            "modelrelay",
            "worker",
            "--models",
            "a,b",
            "--backend-url",
            "http://x:1",
        ])
        .unwrap();
        assert_eq!(cli.worker.models.as_deref(), Some("a,b"));
    }
}
