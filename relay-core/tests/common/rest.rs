//! What a process uses while it should be at rest, read from Linux's `/proc`: CPU time
//! (`utime + stime` of `/proc/PID/stat`) and wake-ups, counted as the context switches of its
//! threads (`voluntary_ctxt_switches + nonvoluntary_ctxt_switches` of
//! `/proc/PID/task/TID/status`): each is a thread put to sleep and woken again, or preempted.
//! Shared by the idle guard (`tests/idle.rs`) and the bench's `rest` scenario.
#![allow(dead_code)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One reading of a process.
#[derive(Debug, Clone)]
pub struct Reading {
    /// CPU seconds so far (user + system).
    cpu_seconds: f64,
    /// Context switches so far, per thread id.
    switches: HashMap<u32, u64>,
    at: Instant,
}

/// What a process used between two readings.
#[derive(Debug, Clone, Copy)]
pub struct Rest {
    /// CPU seconds used.
    pub cpu_seconds: f64,
    /// Context switches of its threads.
    pub wakeups: u64,
    /// Time between the readings.
    pub elapsed: Duration,
}

impl Rest {
    /// The share of one core it used (1.0 = a whole core).
    pub fn core_share(&self) -> f64 {
        self.cpu_seconds / self.elapsed.as_secs_f64()
    }

    /// Wake-ups per second.
    pub fn wakeups_per_sec(&self) -> f64 {
        self.wakeups as f64 / self.elapsed.as_secs_f64()
    }
}

impl Reading {
    /// Reads process `pid` now; `None` when it is gone (or this is not Linux).
    pub fn of(pid: u32) -> Option<Reading> {
        let at = Instant::now();
        Some(Reading {
            cpu_seconds: cpu_seconds(pid)?,
            switches: switches_per_thread(pid)?,
            at,
        })
    }

    /// What the process used from `earlier` to this reading. A thread that ended in between
    /// takes its switches since `earlier` with it (they are not counted); a thread that started
    /// counts all of its own.
    pub fn since(&self, earlier: &Reading) -> Rest {
        let wakeups = self
            .switches
            .iter()
            .map(|(tid, now)| now.saturating_sub(earlier.switches.get(tid).copied().unwrap_or(0)))
            .sum();
        Rest {
            cpu_seconds: (self.cpu_seconds - earlier.cpu_seconds).max(0.0),
            wakeups,
            elapsed: self.at.duration_since(earlier.at),
        }
    }
}

/// CPU seconds (user + system) of `pid` so far.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: count fields after its end.
    let (_, after_name) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime) are the 12th and 13th after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / ticks.max(1.0))
}

/// Context switches of each thread of `pid` so far.
fn switches_per_thread(pid: u32) -> Option<HashMap<u32, u64>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    Some(
        tasks
            .flatten()
            .filter_map(|task| {
                let tid = task.file_name().to_str()?.parse().ok()?;
                let status = std::fs::read_to_string(task.path().join("status")).ok()?;
                let switches = status
                    .lines()
                    .filter(|line| line.contains("ctxt_switches:"))
                    .filter_map(|line| line.split(':').nth(1)?.trim().parse::<u64>().ok())
                    .sum();
                Some((tid, switches))
            })
            .collect(),
    )
}
