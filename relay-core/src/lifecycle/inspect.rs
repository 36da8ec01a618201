//! `modelrelay models status`: the model map and the model servers running on this machine, as
//! the pid files in the data directory record them.
//!
//! The worker's own view (restarts, last use, breaker) lives in the worker process, which a
//! separate command cannot ask; the records and the OS still say which models run, on which
//! port, whether they answer `/health`, and which a killed worker left behind.

use std::path::Path;
use std::time::Duration;

use super::os;
use super::pidfile::PidRecord;

/// One line of the status table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The model.
    pub model: String,
    /// `ready`, `starting`, `orphaned` or `stopped`.
    pub state: &'static str,
    /// Its port while it runs.
    pub port: Option<u16>,
    /// Its process while it runs.
    pub pid: Option<u32>,
    /// The worker process that started it.
    pub worker_pid: Option<u32>,
    /// Whether it is in the config file's model map.
    pub mapped: bool,
}

/// What the OS says about one recorded process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// The recorded process still runs (same pid and start time).
    pub alive: bool,
    /// The worker that started it still runs.
    pub owner_alive: bool,
    /// Its `/health` answered 200.
    pub healthy: bool,
}

/// The table: every mapped model (sorted, as the map is), then running models the map does not
/// name (a config changed since the worker started). Records of dead processes are left out.
pub fn rows(mapped: &[String], records: &[(PidRecord, Liveness)]) -> Vec<Row> {
    let running = |record: &PidRecord, live: &Liveness, is_mapped: bool| Row {
        model: record.model.clone(),
        state: match (live.owner_alive, live.healthy) {
            (false, _) => "orphaned",
            (true, true) => "ready",
            (true, false) => "starting",
        },
        port: Some(record.port),
        pid: Some(record.pid),
        worker_pid: Some(record.owner_pid),
        mapped: is_mapped,
    };
    let live: Vec<&(PidRecord, Liveness)> = records.iter().filter(|(_, l)| l.alive).collect();
    let mut table = Vec::new();
    for model in mapped {
        let mut found = false;
        for (record, liveness) in live.iter().filter(|(r, _)| &r.model == model) {
            table.push(running(record, liveness, true));
            found = true;
        }
        if !found {
            table.push(Row {
                model: model.clone(),
                state: "stopped",
                port: None,
                pid: None,
                worker_pid: None,
                mapped: true,
            });
        }
    }
    for (record, liveness) in live.iter().filter(|(r, _)| !mapped.contains(&r.model)) {
        table.push(running(record, liveness, false));
    }
    table
}

/// The table as text, with a note for what needs one.
pub fn render(table: &[Row]) -> String {
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let width = table
        .iter()
        .map(|r| r.model.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut text = format!(
        "{:<width$}  {:<9} {:<6} {:<8} WORKER\n",
        "MODEL", "STATE", "PORT", "PID"
    );
    for row in table {
        let note = match (row.mapped, row.state) {
            (_, "orphaned") => "  (its worker is gone; the next worker start stops it)",
            (false, _) => "  (not in the model map)",
            _ => "",
        };
        text.push_str(&format!(
            "{:<width$}  {:<9} {:<6} {:<8} {}{note}\n",
            row.model,
            row.state,
            dash(row.port.map(|p| p.to_string())),
            dash(row.pid.map(|p| p.to_string())),
            dash(row.worker_pid.map(|p| p.to_string())),
        ));
    }
    text
}

/// The pid files under `data_dir/lifecycle/pids` (unreadable ones are skipped: the worker
/// removes them at its next start).
pub fn read_records(data_dir: &Path) -> Vec<PidRecord> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("lifecycle").join("pids")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().and_then(|e| e.to_str()) == Some("json"))
        .filter_map(|path| serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok())
        .collect()
}

/// Asks the OS and each running server's `/health` about `record`.
async fn liveness(client: &reqwest::Client, record: &PidRecord) -> Liveness {
    let alive = os::is_same_process(record.pid, &record.identity);
    let owner_alive = record
        .owner
        .as_ref()
        .is_some_and(|owner| os::is_same_process(record.owner_pid, owner));
    let healthy = alive
        && client
            .get(format!("http://127.0.0.1:{}/health", record.port))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
    Liveness {
        alive,
        owner_alive,
        healthy,
    }
}

/// `modelrelay models status`: prints the table for the model map `mapped` and the records
/// under `data_dir`.
pub async fn run(mapped: &[String], data_dir: &Path) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(1))
        .build()
        .expect("a client with these options always builds");
    let mut records = Vec::new();
    for record in read_records(data_dir) {
        let live = liveness(&client, &record).await;
        records.push((record, live));
    }
    let table = rows(mapped, &records);
    if table.is_empty() {
        println!(
            "No model map in the config file and no model server running. Add \
             [worker.model_map.NAME] entries (`modelrelay models scan DIR` proposes them)."
        );
        return;
    }
    print!("{}", render(&table));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::os::ProcessIdentity;

    fn record(pid: u32, model: &str) -> PidRecord {
        PidRecord {
            pid,
            identity: ProcessIdentity {
                boot_id: None,
                start_time: "1".into(),
            },
            model: model.into(),
            port: 8000 + pid as u16,
            command: "llama-server".into(),
            owner_pid: 7,
            owner: None,
        }
    }

    const LIVE: Liveness = Liveness {
        alive: true,
        owner_alive: true,
        healthy: true,
    };

    #[test]
    fn status_rows_show_mapped_models_running_or_stopped_and_flag_orphans() {
        let mapped = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let records = [
            (record(1, "a"), LIVE),
            (
                record(2, "b"),
                Liveness {
                    healthy: false,
                    ..LIVE
                },
            ),
            (
                record(3, "c"),
                Liveness {
                    alive: false,
                    ..LIVE
                },
            ),
            (
                record(4, "gone-from-map"),
                Liveness {
                    owner_alive: false,
                    ..LIVE
                },
            ),
        ];
        let table = rows(&mapped, &records);
        let states: Vec<(&str, &str)> = table.iter().map(|r| (r.model.as_str(), r.state)).collect();
        assert_eq!(
            states,
            [
                ("a", "ready"),
                ("b", "starting"),
                ("c", "stopped"),
                ("gone-from-map", "orphaned"),
            ]
        );
        assert_eq!((table[0].port, table[0].pid), (Some(8001), Some(1)));
        let text = render(&table);
        assert!(text.starts_with("MODEL"), "{text}");
        let words = |line: &str| {
            line.split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert!(
            text.lines()
                .any(|l| words(l) == ["c", "stopped", "-", "-", "-"]),
            "{text}"
        );
        assert!(text.contains("its worker is gone"), "{text}");
    }
}
