//! One model server process: spawning it in its own process group, keeping the last lines it
//! printed, waiting for its `/health`, and stopping the whole group (so a start script's children
//! die too).

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use super::config::ModelSpec;
use super::os;

/// Lines of output kept for error messages.
const TAIL_LINES: usize = 20;
/// Longest line kept (llama-server can print very long lines, e.g. chat templates).
const MAX_LINE_CHARS: usize = 400;

/// The last lines a process printed (stdout and stderr interleaved).
#[derive(Debug, Clone, Default)]
pub struct OutputTail(Arc<Mutex<VecDeque<String>>>);

impl OutputTail {
    /// The kept lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().expect("tail lock").iter().cloned().collect()
    }

    fn push(&self, line: String) {
        let mut lines = self.0.lock().expect("tail lock");
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }
}

/// Kills a process group when dropped unless disarmed: if the task owning a child is dropped
/// (runtime shutdown, panic), the model server and its children still die.
#[derive(Debug)]
pub struct GroupGuard {
    pgid: u32,
    armed: bool,
}

impl GroupGuard {
    /// The process group id (the leader's pid).
    pub fn pgid(&self) -> u32 {
        self.pgid
    }

    /// Whether any process of the group is left (zombies count until reaped).
    pub fn exists(&self) -> bool {
        os::group_exists(self.pgid)
    }

    /// Sends SIGTERM to the group.
    pub fn terminate(&self) {
        os::terminate_group(self.pgid);
    }

    /// Sends SIGKILL to the group.
    pub fn kill(&self) {
        os::kill_group(self.pgid);
    }

    /// The group is gone: dropping the guard must not signal a group id that may be reused.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            os::kill_group(self.pgid);
        }
    }
}

/// A started model server.
#[derive(Debug)]
pub struct Spawned {
    /// The child (the group leader).
    pub child: Child,
    /// Its pid.
    pub pid: u32,
    /// Its process group.
    pub group: GroupGuard,
    /// What it printed lately.
    pub output: OutputTail,
    readers: Vec<JoinHandle<()>>,
}

impl Spawned {
    /// The last lines it printed, after giving the pipe readers a moment to catch up with what
    /// a process that just exited wrote last (its error message, usually).
    pub async fn last_output(&mut self) -> Vec<String> {
        for reader in std::mem::take(&mut self.readers) {
            let _ = timeout(Duration::from_millis(300), reader).await;
        }
        self.output.lines()
    }
}

/// The command line as one readable string, for logs and errors.
pub fn display_command(spec: &ModelSpec, port: u16) -> String {
    let (program, args) = spec.command_line(port);
    let mut text = shell_word(&program.display().to_string());
    for arg in args {
        text.push(' ');
        text.push_str(&shell_word(&arg));
    }
    text
}

fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Starts `spec` on `port`, in a new process group, with `LLAMA_PORT` set.
pub fn spawn(spec: &ModelSpec, port: u16) -> Result<Spawned, String> {
    let (program, args) = spec.command_line(port);
    let mut command = Command::new(&program);
    command
        .args(&args)
        .envs(&spec.env)
        .env("LLAMA_PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A backstop for the leader; the group guard takes care of the rest.
        .kill_on_drop(true);
    if let Some(ctx) = spec.ctx_size {
        command.env("LLAMA_CTX_SIZE", ctx.to_string());
    }
    #[cfg(unix)]
    command.process_group(0);
    let mut child = command.spawn().map_err(|error| {
        let hint = match error.kind() {
            std::io::ErrorKind::NotFound => " (no such file; check the path)",
            std::io::ErrorKind::PermissionDenied => " (not executable; try chmod +x)",
            _ => "",
        };
        format!("cannot run {}: {error}{hint}", program.display())
    })?;
    let pid = child
        .id()
        .ok_or_else(|| "the process exited before it could be tracked".to_string())?;
    let output = OutputTail::default();
    let mut readers = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        readers.push(tokio::spawn(collect(
            stdout,
            output.clone(),
            spec.name.clone(),
        )));
    }
    if let Some(stderr) = child.stderr.take() {
        readers.push(tokio::spawn(collect(
            stderr,
            output.clone(),
            spec.name.clone(),
        )));
    }
    Ok(Spawned {
        child,
        pid,
        group: GroupGuard {
            pgid: pid,
            armed: true,
        },
        output,
        readers,
    })
}

/// Reads a pipe to its end, keeping the tail; reading everything also keeps the child from
/// blocking on a full pipe.
async fn collect(pipe: impl AsyncRead + Unpin, tail: OutputTail, model: String) {
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end();
                if text.is_empty() {
                    continue;
                }
                tracing::debug!(model = %model, "{text}");
                tail.push(text.chars().take(MAX_LINE_CHARS).collect());
            }
        }
    }
}

/// Polls `http://127.0.0.1:PORT/health` until it answers 200. Polling is fine here: it lasts
/// only while a model loads, and backs off to a few probes a second.
pub async fn wait_healthy(client: &reqwest::Client, port: u16) {
    let url = format!("http://127.0.0.1:{port}/health");
    let mut pause = Duration::from_millis(25);
    loop {
        let probe = client
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if probe.is_ok_and(|response| response.status().is_success()) {
            return;
        }
        sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

/// Stops the group: SIGTERM, then SIGKILL once `grace` is over. Returns the leader's exit
/// status once the leader is reaped and no process of the group is left.
pub async fn terminate(spawned: &mut Spawned, grace: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + grace;
    spawned.group.terminate();
    let status = match timeout(grace, spawned.child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            spawned.group.kill();
            // Where there are no process groups, this is the only kill there is.
            let _ = spawned.child.start_kill();
            spawned.child.wait().await.ok()
        }
    };
    reap_group(spawned, deadline).await;
    status
}

/// After the leader exited: waits for the rest of its group until `deadline`, then kills what is
/// left. A script's children got the same signal and usually follow within moments.
pub async fn reap_group(spawned: &mut Spawned, deadline: Instant) {
    while spawned.group.exists() && Instant::now() < deadline {
        sleep(Duration::from_millis(20)).await;
    }
    if spawned.group.exists() {
        spawned.group.kill();
        // Orphaned members are reaped by init; give it a moment so the port is free again.
        let settle = Instant::now() + Duration::from_secs(1);
        while spawned.group.exists() && Instant::now() < settle {
            sleep(Duration::from_millis(20)).await;
        }
    }
    spawned.group.disarm();
}

/// Whether nothing listens on `127.0.0.1:port` (a bind probe; the port may still be taken
/// between this check and the server's own bind, which then shows as a failed start).
pub fn port_is_free(port: u16) -> bool {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A readable exit status: "exit code 1", "killed by signal 9".
pub fn describe_status(status: Option<ExitStatus>) -> String {
    let Some(status) = status else {
        return "exit status unknown".to_string();
    };
    if let Some(code) = status.code() {
        return format!("exit code {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("killed by signal {signal}");
        }
    }
    status.to_string()
}
