//! The realstack's llama-server (`../shared/tools/realstack/setup.sh`), for the benches that
//! run a real one: where it is, and starting one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::procs::ChildProcess;

/// The realstack's `llama-server` and `model` (by default its tiny random model), in
/// `$REALSTACK` (default `~/.cache/modelrelay-realstack`); `None` when either is missing.
pub fn realstack(model: Option<PathBuf>) -> Option<(PathBuf, PathBuf)> {
    let root = std::env::var_os("REALSTACK")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/modelrelay-realstack"))
        })?;
    let server = root.join("bin/llama-server");
    let model = model.unwrap_or_else(|| root.join("models/tiny-random-llama.gguf"));
    (server.is_file() && model.is_file()).then_some((server, model))
}

/// What a bench prints when the realstack is missing.
pub const NO_REALSTACK: &str = "no real llama-server stack (bin/llama-server and \
     models/tiny-random-llama.gguf in $REALSTACK or ~/.cache/modelrelay-realstack; build it \
     with ../shared/tools/realstack/setup.sh)";

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Starts `server` with `model` on a free loopback port, serving it as `alias`, with `args`
/// after; returns once its `/health` says it is ready (within two minutes).
pub async fn start_llama(
    client: &reqwest::Client,
    (server, model): (&Path, &Path),
    alias: &str,
    args: &[String],
) -> (ChildProcess, u16) {
    let port = free_port();
    let mut command = Command::new(server);
    command.args(["-m", &model.display().to_string()]);
    command.args([
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "-a",
        alias,
    ]);
    command.args(args);
    let child = ChildProcess::start(command, None);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let health = client
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await;
        if health.is_ok_and(|r| r.status().is_success()) {
            return (child, port);
        }
        assert!(Instant::now() < deadline, "llama-server did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
