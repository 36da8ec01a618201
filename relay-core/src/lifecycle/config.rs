//! The model map and the box-wide lifecycle settings: as written in the config file, and resolved
//! (defaults applied, validated) for the manager.
//!
//! In the config file they live under `[worker]`:
//!
//! ```toml
//! [worker.lifecycle]              # box-wide; every key optional
//! model_port_base = 8081          # first port tried for a model without a pinned port
//! max_loaded_models = 1           # default: 1 without vram_budget_mb, unlimited with it
//! vram_budget_mb = 22000          # sum of loaded models' vram_mb may not exceed this
//! startup_timeout_secs = 120      # start → /health 200, and the longest wait for room
//! stop_grace_secs = 10            # SIGTERM → SIGKILL
//! session_restart = false         # restart a model when the session id changes
//! session_headers = ["session-id", "session_id", "x-session-affinity", "x-client-request-id"]
//! breaker_max_failures = 3        # failed starts or crashes within the window that open the breaker
//! breaker_window_secs = 300
//! breaker_backoff_secs = 60       # how long an open breaker refuses starts (0 failures = off)
//!
//! [worker.model_map."qwen2.5-7b"] # the table key is the model name clients ask for
//! llama_server = "/opt/llama.cpp/llama-server"
//! model_file = "/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf"
//! args = ["-ngl", "999", "--jinja"]
//! ctx_size = 32768
//! idle_timeout_secs = 3600        # 0 = never unload when idle
//! vram_mb = 6000
//! group = "gpu0"                  # models of one group never run at the same time
//!
//! [worker.model_map.coder]
//! start_script = "~/start-scripts/coder.sh"   # run with LLAMA_PORT set
//! port = 8085                     # pinned port
//! ```
//!
//! A map keyed by name (rather than an array of tables) makes duplicate names impossible and reads
//! like llama-swap's `models:` map; names with dots or colons need quotes, as above.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::policy::BreakerSettings;

/// The headers checked for a session id, in priority order (first match wins).
pub const DEFAULT_SESSION_HEADERS: [&str; 4] = [
    "session-id",
    "session_id",
    "x-session-affinity",
    "x-client-request-id",
];

/// `[worker.lifecycle]` in the config file. Every field is optional.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifecycleFile {
    /// First port tried for models without a pinned port [default: 8081].
    pub model_port_base: Option<u16>,
    /// Models loaded at once [default: 1 without `vram_budget_mb`, unlimited with it].
    pub max_loaded_models: Option<usize>,
    /// VRAM the loaded models' `vram_mb` may add up to.
    pub vram_budget_mb: Option<u64>,
    /// Seconds from start to a ready `/health`, and the longest wait for room [default: 120].
    pub startup_timeout_secs: Option<u64>,
    /// Seconds between SIGTERM and SIGKILL when stopping a model [default: 10].
    pub stop_grace_secs: Option<u64>,
    /// Restart a model when the session id changes [default: false].
    pub session_restart: Option<bool>,
    /// Headers holding the session id, first match wins [default: [`DEFAULT_SESSION_HEADERS`]].
    pub session_headers: Option<Vec<String>>,
    /// Failed starts or crashes within the window that open the breaker; 0 disables it
    /// [default: 3].
    pub breaker_max_failures: Option<u32>,
    /// The breaker's window in seconds [default: 300].
    pub breaker_window_secs: Option<u64>,
    /// Seconds an open breaker refuses starts before one retry is allowed [default: 60].
    pub breaker_backoff_secs: Option<u64>,
}

/// `[worker.model_map.NAME]` in the config file: how to start one model.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    /// A script that starts the server on `$LLAMA_PORT` (e.g. from `relay setup`).
    pub start_script: Option<PathBuf>,
    /// The llama-server binary (a path, or a name looked up on `PATH`).
    pub llama_server: Option<PathBuf>,
    /// The `.gguf` file given to llama-server as `--model`.
    pub model_file: Option<PathBuf>,
    /// Extra arguments: after the ones the manager sets for llama-server, or the script's.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables for the process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A pinned port; otherwise the first free one from `model_port_base`.
    pub port: Option<u16>,
    /// `--ctx-size` for llama-server (`LLAMA_CTX_SIZE` for a script).
    pub ctx_size: Option<u32>,
    /// Seconds idle before the model is stopped; 0 never [default: 3600].
    pub idle_timeout_secs: Option<u64>,
    /// Models of one group are never loaded at the same time.
    pub group: Option<String>,
    /// VRAM the model takes, counted against `vram_budget_mb` [default: 0].
    pub vram_mb: Option<u64>,
}

/// The two `[worker]` keys this module reads (`config::WorkerFile` has the same two fields and
/// builds one of these to resolve them).
#[derive(Debug, Default, Clone, Deserialize)]
pub struct LifecycleSection {
    /// `[worker.lifecycle]`.
    #[serde(default)]
    pub lifecycle: LifecycleFile,
    /// `[worker.model_map.NAME]`.
    #[serde(default)]
    pub model_map: BTreeMap<String, ModelFile>,
}

impl LifecycleSection {
    /// Reads `[worker.lifecycle]` and `[worker.model_map]` from a whole config file's text,
    /// ignoring everything else in it.
    pub fn from_config_text(text: &str) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct Whole {
            #[serde(default)]
            worker: LifecycleSection,
        }
        toml::from_str::<Whole>(text)
            .map(|whole| whole.worker)
            .map_err(|e| e.to_string())
    }
}

/// How a model's process is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    /// A script run with `LLAMA_PORT` (and `LLAMA_CTX_SIZE` when set) in its environment.
    Script {
        /// The script.
        path: PathBuf,
        /// Its arguments.
        args: Vec<String>,
    },
    /// `binary --model FILE --host 127.0.0.1 --port PORT [--ctx-size N] [--alias NAME] ARGS`.
    LlamaServer {
        /// The llama-server binary.
        binary: PathBuf,
        /// The model file.
        model_file: PathBuf,
        /// Extra arguments, appended.
        args: Vec<String>,
    },
}

/// One model of the map, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The name clients ask for.
    pub name: String,
    /// How to start it.
    pub launch: Launch,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// A pinned port.
    pub port: Option<u16>,
    /// Context size.
    pub ctx_size: Option<u32>,
    /// Idle time before it is stopped; `None` never.
    pub idle_timeout: Option<Duration>,
    /// Its exclusion group.
    pub group: Option<String>,
    /// VRAM it takes, in MB (0 when unknown).
    pub vram_mb: u64,
}

impl ModelSpec {
    /// The program and arguments that start this model on `port`.
    pub fn command_line(&self, port: u16) -> (PathBuf, Vec<String>) {
        match &self.launch {
            Launch::Script { path, args } => (path.clone(), args.clone()),
            Launch::LlamaServer {
                binary,
                model_file,
                args,
            } => {
                let mut all = vec![
                    "--model".to_string(),
                    model_file.display().to_string(),
                    "--host".to_string(),
                    "127.0.0.1".to_string(),
                    "--port".to_string(),
                    port.to_string(),
                ];
                if let Some(ctx) = self.ctx_size {
                    all.extend(["--ctx-size".to_string(), ctx.to_string()]);
                }
                // llama-server names the model after its file unless told otherwise; the alias
                // makes its /v1/models agree with the name clients use.
                if !args.iter().any(|a| a == "--alias" || a == "-a") {
                    all.extend(["--alias".to_string(), self.name.clone()]);
                }
                all.extend(args.iter().cloned());
                (binary.clone(), all)
            }
        }
    }
}

/// The lifecycle configuration, resolved and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct LifecycleConfig {
    /// The model map, by name.
    pub models: BTreeMap<String, ModelSpec>,
    /// First port tried for models without a pinned port.
    pub port_base: u16,
    /// Models loaded at once; `None` unlimited.
    pub max_loaded_models: Option<usize>,
    /// VRAM budget in MB; `None` unlimited.
    pub vram_budget_mb: Option<u64>,
    /// Start → ready bound, and the longest an acquire waits for room.
    pub startup_timeout: Duration,
    /// SIGTERM → SIGKILL.
    pub stop_grace: Duration,
    /// Restart a model when the session id changes.
    pub session_restart: bool,
    /// Lower-case header names holding the session id, first match wins.
    pub session_headers: Vec<String>,
    /// The circuit breaker.
    pub breaker: BreakerSettings,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig::resolve(&LifecycleSection::default()).expect("the defaults are valid")
    }
}

impl LifecycleConfig {
    /// Applies defaults to the file's values and checks them; the error names the setting.
    pub fn resolve(section: &LifecycleSection) -> Result<Self, String> {
        let l = &section.lifecycle;
        let port_base = l.model_port_base.unwrap_or(8081);
        if port_base == 0 {
            return Err(
                "[worker.lifecycle] model_port_base must be a port number (1-65535)".into(),
            );
        }
        let max_loaded_models = match (l.max_loaded_models, l.vram_budget_mb) {
            (Some(0), _) => {
                return Err("[worker.lifecycle] max_loaded_models must be at least 1".into())
            }
            (Some(n), _) => Some(n),
            // Without a budget the safe assumption for a GPU box is one model at a time.
            (None, None) => Some(1),
            (None, Some(_)) => None,
        };
        let startup_timeout = Duration::from_secs(l.startup_timeout_secs.unwrap_or(120));
        if startup_timeout.is_zero() {
            return Err("[worker.lifecycle] startup_timeout_secs must be at least 1".into());
        }
        let session_headers: Vec<String> = match &l.session_headers {
            Some(list) => list.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
            None => DEFAULT_SESSION_HEADERS.map(str::to_string).to_vec(),
        };
        if session_headers.iter().any(String::is_empty) {
            return Err("[worker.lifecycle] session_headers may not contain empty names".into());
        }
        let mut models = BTreeMap::new();
        let mut pinned = BTreeSet::new();
        for (name, entry) in &section.model_map {
            let spec = resolve_model(name, entry)?;
            if let Some(port) = spec.port {
                if !pinned.insert(port) {
                    return Err(format!(
                        "[worker.model_map.{name:?}] port {port} is pinned by another model too"
                    ));
                }
            }
            if let Some(budget) = l.vram_budget_mb {
                if spec.vram_mb > budget {
                    return Err(format!(
                        "[worker.model_map.{name:?}] vram_mb {} exceeds vram_budget_mb {budget}",
                        spec.vram_mb
                    ));
                }
            }
            models.insert(name.clone(), spec);
        }
        Ok(LifecycleConfig {
            models,
            port_base,
            max_loaded_models,
            vram_budget_mb: l.vram_budget_mb,
            startup_timeout,
            stop_grace: Duration::from_secs(l.stop_grace_secs.unwrap_or(10)),
            session_restart: l.session_restart.unwrap_or(false),
            session_headers,
            breaker: BreakerSettings {
                max_failures: l.breaker_max_failures.unwrap_or(3),
                window: Duration::from_secs(l.breaker_window_secs.unwrap_or(300)),
                backoff: Duration::from_secs(l.breaker_backoff_secs.unwrap_or(60)),
            },
        })
    }

    /// The mapped model names, sorted.
    pub fn model_names(&self) -> Vec<String> {
        self.models.keys().cloned().collect()
    }

    /// The session id of a request: the value of the first configured header present (names
    /// compared case-insensitively), ignoring empty values.
    pub fn session_id<'a, I>(&self, headers: I) -> Option<String>
    where
        I: IntoIterator<Item = (&'a str, &'a str)> + Clone,
    {
        self.session_headers.iter().find_map(|wanted| {
            headers
                .clone()
                .into_iter()
                .find(|(name, value)| name.eq_ignore_ascii_case(wanted) && !value.trim().is_empty())
                .map(|(_, value)| value.trim().to_string())
        })
    }
}

fn resolve_model(name: &str, entry: &ModelFile) -> Result<ModelSpec, String> {
    let at = format!("[worker.model_map.{name:?}]");
    if name.trim().is_empty() {
        return Err("[worker.model_map] a model name may not be empty".into());
    }
    let launch = match (&entry.start_script, &entry.llama_server, &entry.model_file) {
        (Some(script), None, None) => Launch::Script {
            path: expand_home(script),
            args: entry.args.clone(),
        },
        (None, Some(binary), Some(model_file)) => Launch::LlamaServer {
            binary: expand_home(binary),
            model_file: expand_home(model_file),
            args: entry.args.clone(),
        },
        (None, Some(_), None) => return Err(format!("{at} llama_server needs a model_file")),
        (None, None, Some(_)) => {
            return Err(format!(
                "{at} model_file needs llama_server (the binary to run it with)"
            ))
        }
        (None, None, None) => {
            return Err(format!(
                "{at} needs start_script, or llama_server and model_file"
            ))
        }
        (Some(_), _, _) => {
            return Err(format!(
                "{at} has start_script and llama_server/model_file; choose one"
            ))
        }
    };
    if entry.port == Some(0) {
        return Err(format!("{at} port must be a port number (1-65535)"));
    }
    let idle_secs = entry.idle_timeout_secs.unwrap_or(3600);
    Ok(ModelSpec {
        name: name.to_string(),
        launch,
        env: entry.env.clone(),
        port: entry.port,
        ctx_size: entry.ctx_size,
        idle_timeout: (idle_secs > 0).then(|| Duration::from_secs(idle_secs)),
        group: entry.group.clone().filter(|g| !g.is_empty()),
        vram_mb: entry.vram_mb.unwrap_or(0),
    })
}

/// `~/x` → `$HOME/x`: config files are written by people, and start scripts live in home dirs.
fn expand_home(path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> Result<LifecycleConfig, String> {
        LifecycleConfig::resolve(&LifecycleSection::from_config_text(text)?)
    }

    #[test]
    fn defaults_apply_and_both_launch_kinds_parse() {
        let config = resolve(
            r#"
            log_level = "info"
            [worker]
            proxy_url = "http://x"
            [worker.model_map."qwen2.5:7b"]
            llama_server = "llama-server"
            model_file = "/m/q.gguf"
            args = ["-ngl", "99"]
            ctx_size = 4096
            [worker.model_map.coder]
            start_script = "/s/coder.sh"
            port = 8090
            idle_timeout_secs = 0
            "#,
        )
        .unwrap();
        assert_eq!(config.port_base, 8081);
        assert_eq!(config.max_loaded_models, Some(1));
        assert_eq!(config.startup_timeout, Duration::from_secs(120));
        assert!(!config.session_restart);
        assert_eq!(config.session_headers, DEFAULT_SESSION_HEADERS.to_vec());
        assert_eq!(config.breaker.max_failures, 3);
        let qwen = &config.models["qwen2.5:7b"];
        assert_eq!(qwen.idle_timeout, Some(Duration::from_secs(3600)));
        let (program, args) = qwen.command_line(8081);
        assert_eq!(program, PathBuf::from("llama-server"));
        assert_eq!(
            args.join(" "),
            "--model /m/q.gguf --host 127.0.0.1 --port 8081 --ctx-size 4096 --alias qwen2.5:7b -ngl 99"
        );
        let coder = &config.models["coder"];
        assert_eq!(coder.port, Some(8090));
        assert_eq!(coder.idle_timeout, None, "0 means never");
        assert!(matches!(coder.launch, Launch::Script { .. }));
    }

    #[test]
    fn a_vram_budget_lifts_the_one_model_default() {
        let config = resolve("[worker.lifecycle]\nvram_budget_mb = 1000\n").unwrap();
        assert_eq!(config.max_loaded_models, None);
        assert_eq!(config.vram_budget_mb, Some(1000));
    }

    #[test]
    fn invalid_entries_are_explained() {
        let cases = [
            ("[worker.model_map.a]\nargs = []\n", "needs start_script"),
            ("[worker.model_map.a]\nllama_server = \"x\"\n", "needs a model_file"),
            (
                "[worker.model_map.a]\nstart_script = \"s\"\nllama_server = \"x\"\n",
                "choose one",
            ),
            (
                "[worker.model_map.a]\nstart_script = \"s\"\nport = 9000\n[worker.model_map.b]\nstart_script = \"s\"\nport = 9000\n",
                "pinned by another model",
            ),
            (
                "[worker.lifecycle]\nvram_budget_mb = 10\n[worker.model_map.a]\nstart_script = \"s\"\nvram_mb = 11\n",
                "exceeds vram_budget_mb",
            ),
            ("[worker.lifecycle]\nmax_loaded_models = 0\n", "at least 1"),
            ("[worker.model_map.a]\nstart_script = \"s\"\nbogus = 1\n", "unknown field"),
        ];
        for (text, expected) in cases {
            let error = resolve(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn session_id_takes_the_first_configured_header_present() {
        let config = LifecycleConfig::default();
        let headers = [
            ("X-Client-Request-Id", "req-1"),
            ("Session_Id", "sess-b"),
            ("session-id", " "),
        ];
        assert_eq!(config.session_id(headers), Some("sess-b".to_string()));
        assert_eq!(config.session_id([("content-type", "x")]), None);
    }
}
