//! Orphan cleanup: a worker killed with SIGKILL leaves its model servers running; the next
//! worker on the same data directory kills those (whole process groups) and nothing else — not
//! an unrelated process whose pid a stale record names, nor one of a worker still running.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use relay_core::lifecycle::os::{self, ProcessIdentity};
use relay_core::lifecycle::pidfile::PidRecord;
use relay_core::lifecycle::LifecycleManager;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::*;

const HELPER: &str = "orphans::previous_worker_process";
const DIR_VAR: &str = "RELAY_ORPHAN_HELPER_DIR";
const CONFIG_VAR: &str = "RELAY_ORPHAN_HELPER_CONFIG";

/// The "previous worker": run by the test below as a child process of its own (this test
/// binary again), which it then kills with SIGKILL. Does nothing when run directly.
#[tokio::test]
#[ignore = "a helper process for orphan_cleanup_kills_survivors_of_a_killed_worker_and_only_those"]
async fn previous_worker_process() {
    let (Ok(dir), Ok(text)) = (std::env::var(DIR_VAR), std::env::var(CONFIG_VAR)) else {
        return;
    };
    let manager = LifecycleManager::new(quick(config(&text)), Path::new(&dir)).unwrap();
    let m = manager.acquire("m", None).await.unwrap();
    let s = manager.acquire("s", None).await.unwrap();
    println!("READY {} {}", m.port(), s.port());
    // Killed long before this ends; the bound keeps a forgotten helper from living on.
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// A process not started by any worker, killed (group and all) when the test ends.
struct Unrelated(std::process::Child);

impl Unrelated {
    fn start(port: u16) -> Self {
        use std::os::unix::process::CommandExt;
        let child = std::process::Command::new(fake_server())
            .args(["--port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        Unrelated(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Unrelated {
    fn drop(&mut self) {
        os::kill_group(self.0.id());
        let _ = self.0.wait();
    }
}

fn write_record(data: &Path, record: &PidRecord) {
    let path = data.join("pids").join(format!("{}.json", record.pid));
    std::fs::write(path, serde_json::to_string(record).unwrap()).unwrap();
}

#[tokio::test]
async fn orphan_cleanup_kills_survivors_of_a_killed_worker_and_only_those() {
    bounded(async {
        let dir = TempDir::new("orphans");
        let data = dir.join("data");
        let log = dir.join("m.log");
        let script_log = dir.join("s.log");
        let script = dir.join("start.sh");
        {
            use std::os::unix::fs::PermissionsExt;
            let body = format!(
                "#!/bin/sh\n{:?} --log {:?} &\nwait\n",
                fake_server().display().to_string(),
                script_log.display().to_string()
            );
            std::fs::write(&script, body).unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 25500\nmax_loaded_models = 2\n{}[worker.model_map.s]\nstart_script = {:?}\n",
            fake_entry("m", &log, "", ""),
            script.display().to_string()
        );

        // The previous worker starts both models, then dies by SIGKILL.
        let mut helper = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([HELPER, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(DIR_VAR, &data)
            .env(CONFIG_VAR, &text)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(helper.stdout.take().unwrap()).lines();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .expect("the helper worker got ready")
                .unwrap()
                .expect("the helper worker printed READY");
            // libtest prints the test's name on the same line first.
            if line.contains("READY ") {
                break;
            }
        }
        helper.kill().await.unwrap();
        let survivor = starts(&log)[0];
        let script_child = starts(&script_log)[0];
        assert!(alive(survivor) && alive(script_child), "SIGKILL left them running");

        // Two unrelated processes, each named by a record that must not get it killed.
        let recycled = Unrelated::start(free_port_near(25580));
        let (me, my_identity) = os::me();
        let dead_owner = {
            let mut child = std::process::Command::new("true").spawn().unwrap();
            let pid = child.id();
            child.wait().unwrap();
            pid
        };
        let real = os::identity(recycled.pid()).unwrap();
        write_record(
            &data,
            &PidRecord {
                pid: recycled.pid(),
                identity: ProcessIdentity {
                    start_time: "1".into(),
                    ..real
                },
                model: "m".into(),
                port: 1,
                command: "llama-server (long ago)".into(),
                owner_pid: dead_owner,
                owner: my_identity.clone().map(|i| ProcessIdentity {
                    start_time: "1".into(),
                    ..i
                }),
            },
        );
        let other_workers = Unrelated::start(free_port_near(25590));
        write_record(
            &data,
            &PidRecord {
                pid: other_workers.pid(),
                identity: os::identity(other_workers.pid()).unwrap(),
                model: "m".into(),
                port: 1,
                command: "llama-server (another worker's)".into(),
                owner_pid: me,
                owner: my_identity,
            },
        );

        let manager = LifecycleManager::new(quick(config(&text)), &data).unwrap();
        let report = manager.cleanup_orphans().await;
        let mut killed: Vec<String> = report.killed.iter().map(|(_, m)| m.clone()).collect();
        killed.sort();
        assert_eq!(killed, ["m", "s"]);
        assert_eq!(report.stale, 1, "the recycled pid");
        assert_eq!(report.foreign, 1, "the live worker's record");
        assert!(gone_within(survivor, Duration::from_secs(3)).await);
        assert!(
            gone_within(script_child, Duration::from_secs(3)).await,
            "the script's child went with its group"
        );
        assert!(alive(recycled.pid()), "an unrelated process survives");
        assert!(alive(other_workers.pid()), "another worker's process survives");

        // The ports are free again: the new worker serves as usual.
        let lease = manager.acquire("m", None).await.unwrap();
        chat(lease.base_url()).await.unwrap();
        drop(lease);
        manager.shutdown().await;
        drop(recycled);
        drop(other_workers);
    })
    .await;
}

/// A process group whose leader has exited while a member lives on: what a recorded model
/// server's group looks like after the server itself died, and, after a reboot, what an
/// unrelated program's group can look like under a recycled pgid. Killed when dropped.
struct LeaderlessGroup {
    pgid: u32,
}

impl LeaderlessGroup {
    async fn start() -> Self {
        use std::os::unix::process::CommandExt;
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "sleep 30 >/dev/null 2>&1 & exit 0"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = leader.id();
        leader.wait().unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !os::group_exists(pgid) {
            assert!(tokio::time::Instant::now() < deadline, "the member started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        LeaderlessGroup { pgid }
    }
}

impl Drop for LeaderlessGroup {
    fn drop(&mut self) {
        os::kill_group(self.pgid);
    }
}

fn record_of_group(pgid: u32, boot_id: Option<String>) -> PidRecord {
    PidRecord {
        pid: pgid,
        identity: ProcessIdentity {
            boot_id,
            start_time: "12345".into(),
        },
        model: "m".into(),
        port: 1,
        command: "llama-server (before the power loss)".into(),
        owner_pid: 1,
        owner: None,
    }
}

#[tokio::test]
async fn records_from_another_boot_are_forgotten_and_never_signalled() {
    bounded(async {
        let dir = TempDir::new("orphans-boot");
        let data = dir.join("data");
        let manager = LifecycleManager::new(quick(config("")), &data).unwrap();
        // After a power loss the recorded pgid names someone else's group.
        let stranger = LeaderlessGroup::start().await;
        write_record(
            &data,
            &record_of_group(stranger.pgid, Some("a-boot-long-ago".into())),
        );
        let report = manager.cleanup_orphans().await;
        assert!(report.killed.is_empty(), "{report:?}");
        assert_eq!(report.stale, 1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            os::group_exists(stranger.pgid),
            "a process under a pid from another boot was signalled"
        );
        assert!(
            !data
                .join("pids")
                .join(format!("{}.json", stranger.pgid))
                .exists(),
            "the record is forgotten"
        );

        // The same group recorded in this boot is a survivor of ours: it goes.
        let survivor = LeaderlessGroup::start().await;
        write_record(&data, &record_of_group(survivor.pgid, os::boot_id()));
        let report = manager.cleanup_orphans().await;
        assert_eq!(report.killed.len(), 1, "{report:?}");
        assert!(!os::group_exists(survivor.pgid));
        manager.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn pid_records_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    bounded(async {
        let dir = TempDir::new("orphans-mode");
        let data = dir.join("data");
        let log = dir.join("m.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 25620\n{}",
            fake_entry("m", &log, "", "")
        );
        let manager = LifecycleManager::new(quick(config(&text)), &data).unwrap();
        let lease = manager.acquire("m", None).await.unwrap();
        let records: Vec<_> = std::fs::read_dir(data.join("pids"))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(records.len(), 1, "{records:?}");
        let mode = records[0].metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "pid record mode {mode:o}");
        drop(lease);
        manager.shutdown().await;
    })
    .await;
}
