//! Pid files: every model server this worker starts is recorded under `DATA_DIR/pids/`, with the
//! identity of the process *and* of the worker that owns it. At startup the worker kills the
//! survivors of a previous run (its owner is gone, the process is still the one recorded), and
//! nothing else: a recycled pid or a record of a worker that is still running is left alone, and
//! so is every record from another boot (after a power loss the recorded pids and process
//! groups name unrelated processes, which must never be signalled). Records are readable by
//! their owner only: they hold command lines.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::{sleep, Instant};

use super::os::{self, ProcessIdentity};

/// One started process, as recorded on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidRecord {
    /// The process (and process group) id.
    pub pid: u32,
    /// Who the process is.
    pub identity: ProcessIdentity,
    /// The model it serves.
    pub model: String,
    /// The port it was started on.
    pub port: u16,
    /// The command line, for logs.
    pub command: String,
    /// The worker process that started it.
    pub owner_pid: u32,
    /// Who that worker process is.
    pub owner: Option<ProcessIdentity>,
}

/// Writes `text` to `path`, readable and writable by its owner only.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
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

/// What [`PidDir::cleanup_orphans`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Survivors of a previous run that were killed: (pid, model).
    pub killed: Vec<(u32, String)>,
    /// Records whose process was already gone or whose pid now names another process.
    pub stale: usize,
    /// Records of a worker that is still running (left alone).
    pub foreign: usize,
}

/// The directory of pid files.
#[derive(Debug, Clone)]
pub struct PidDir {
    dir: PathBuf,
    owner_pid: u32,
    owner: Option<ProcessIdentity>,
}

impl PidDir {
    /// Uses (and creates) `data_dir/pids`.
    pub fn open(data_dir: &Path) -> std::io::Result<Self> {
        let dir = data_dir.join("pids");
        std::fs::create_dir_all(&dir)?;
        let (owner_pid, owner) = os::me();
        Ok(PidDir {
            dir,
            owner_pid,
            owner,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn file(&self, pid: u32) -> PathBuf {
        self.dir.join(format!("{pid}.json"))
    }

    /// Records a process this worker just started. Without an identity (the process already
    /// exited) there is nothing that could be safely killed later, so nothing is written.
    pub fn record(&self, pid: u32, model: &str, port: u16, command: &str) -> std::io::Result<()> {
        let Some(identity) = os::identity(pid) else {
            return Ok(());
        };
        let record = PidRecord {
            pid,
            identity,
            model: model.to_string(),
            port,
            command: command.to_string(),
            owner_pid: self.owner_pid,
            owner: self.owner.clone(),
        };
        let text = serde_json::to_string_pretty(&record).expect("a record always serializes");
        // Write then rename, so a crash mid-write never leaves a half record.
        let tmp = self.dir.join(format!(".{pid}.json.tmp"));
        write_private(&tmp, &text)?;
        std::fs::rename(&tmp, self.file(pid))
    }

    /// Forgets a process that was stopped and reaped.
    pub fn remove(&self, pid: u32) {
        match std::fs::remove_file(self.file(pid)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(pid, "cannot remove pid file: {e}"),
        }
    }

    /// The records on disk (unreadable ones are logged and removed).
    pub fn records(&self) -> Vec<PidRecord> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let parsed = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()));
            match parsed {
                Ok(record) => records.push(record),
                Err(error) => {
                    tracing::warn!(path = %path.display(), "removing unreadable pid file: {error}");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        records
    }

    fn owned_by_live_worker(&self, record: &PidRecord) -> bool {
        match &record.owner {
            Some(owner) => os::is_same_process(record.owner_pid, owner),
            None => false,
        }
    }

    /// Kills the recorded processes whose worker is gone and that are still the very processes
    /// recorded (their groups: SIGTERM, then SIGKILL after `grace`), and removes stale records.
    /// Only records of this boot are acted on; without a boot id to compare (an OS that gives
    /// none) nothing is signalled.
    pub async fn cleanup_orphans(&self, grace: Duration) -> CleanupReport {
        let mut report = CleanupReport::default();
        let mut doomed = Vec::new();
        let this_boot = os::boot_id();
        for record in self.records() {
            if this_boot.is_none() || record.identity.boot_id != this_boot {
                tracing::info!(
                    pid = record.pid,
                    model = %record.model,
                    "forgetting a pid record from another boot (its pid may name another process now)"
                );
                report.stale += 1;
                self.remove(record.pid);
                continue;
            }
            if self.owned_by_live_worker(&record) {
                // Ours (this very worker) or another worker's that is still running.
                report.foreign += 1;
                continue;
            }
            let leader_is_ours = os::is_same_process(record.pid, &record.identity);
            // With the leader gone, its group id cannot have been reused while members of the
            // group live, so surviving members are still the ones we started.
            let members_left = os::identity(record.pid).is_none() && os::group_exists(record.pid);
            if leader_is_ours || members_left {
                tracing::warn!(
                    pid = record.pid,
                    model = %record.model,
                    command = %record.command,
                    "stopping a model server left over from a previous run"
                );
                os::terminate_group(record.pid);
                doomed.push(record);
            } else {
                if let Some(now) = os::command_line(record.pid) {
                    tracing::info!(pid = record.pid, now = %now, "pid was reused; leaving it alone");
                }
                report.stale += 1;
                self.remove(record.pid);
            }
        }
        let deadline = Instant::now() + grace;
        while doomed.iter().any(|r| os::group_exists(r.pid)) && Instant::now() < deadline {
            sleep(Duration::from_millis(20)).await;
        }
        for record in doomed {
            if os::group_exists(record.pid) {
                os::kill_group(record.pid);
            }
            self.remove(record.pid);
            report.killed.push((record.pid, record.model));
        }
        report
    }
}
