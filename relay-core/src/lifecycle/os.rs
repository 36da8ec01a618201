//! What the operating system says about processes, and signals to process groups.
//!
//! A process is identified by its pid *and* its start time (plus the boot id on Linux): pids are
//! recycled, so a pid alone could name an unrelated program by the time we act on it.

use serde::{Deserialize, Serialize};

/// Who a process is, beyond its pid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessIdentity {
    /// The kernel boot id (Linux), so start times from another boot never match.
    pub boot_id: Option<String>,
    /// The start time: clock ticks since boot on Linux, `ps`'s `lstart` elsewhere.
    pub start_time: String,
}

/// The identity of a live (not zombie) process, or `None` when there is none with this pid.
pub fn identity(pid: u32) -> Option<ProcessIdentity> {
    imp::identity(pid)
}

/// The command line of a process, for logs.
pub fn command_line(pid: u32) -> Option<String> {
    imp::command_line(pid)
}

/// Whether `pid` is a live process with this identity.
pub fn is_same_process(pid: u32, expected: &ProcessIdentity) -> bool {
    identity(pid).is_some_and(|found| &found == expected)
}

/// This boot of the machine (Linux: the kernel's boot id; other Unixes: the boot time), or
/// `None` where the system does not say. Records from another boot name recycled pids.
pub fn boot_id() -> Option<String> {
    imp::boot_id()
}

/// This process's pid and identity.
pub fn me() -> (u32, Option<ProcessIdentity>) {
    let pid = std::process::id();
    (pid, identity(pid))
}

/// Whether any live (not zombie) process belongs to process group `pgid`.
pub fn group_exists(pgid: u32) -> bool {
    valid_group(pgid) && imp::group_exists(pgid)
}

/// SIGTERM to every process of group `pgid`.
pub fn terminate_group(pgid: u32) {
    if valid_group(pgid) {
        imp::signal_group(pgid, imp::TERM);
    }
}

/// SIGKILL to every process of group `pgid`.
pub fn kill_group(pgid: u32) {
    if valid_group(pgid) {
        imp::signal_group(pgid, imp::KILL);
    }
}

/// Group ids 0 and 1 would mean "our own group" and "every process": never signal those.
fn valid_group(pgid: u32) -> bool {
    pgid > 1 && i32::try_from(pgid).is_ok()
}

#[cfg(target_os = "linux")]
mod imp {
    pub const TERM: i32 = libc::SIGTERM;
    pub const KILL: i32 = libc::SIGKILL;

    /// The fields of `/proc/PID/stat` after the command name (which may contain spaces and
    /// parentheses, hence the split at the last `)`): state is [0], pgrp [2], starttime [19].
    fn stat_fields(pid: u32) -> Option<Vec<String>> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &text[text.rfind(')')? + 1..];
        Some(rest.split_whitespace().map(str::to_string).collect())
    }

    pub fn boot_id() -> Option<String> {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|id| id.trim().to_string())
            .filter(|id| !id.is_empty())
    }

    pub fn identity(pid: u32) -> Option<super::ProcessIdentity> {
        let fields = stat_fields(pid)?;
        if fields.first()? == "Z" {
            return None;
        }
        Some(super::ProcessIdentity {
            boot_id: boot_id(),
            start_time: fields.get(19)?.clone(),
        })
    }

    pub fn command_line(pid: u32) -> Option<String> {
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let parts: Vec<String> = raw
            .split(|&b| b == 0)
            .filter(|part| !part.is_empty())
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .collect();
        Some(parts.join(" "))
    }

    /// Scans `/proc` rather than `kill(-pgid, 0)`, which also counts zombies that an init
    /// which does not reap would keep forever.
    pub fn group_exists(pgid: u32) -> bool {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return signal_group(pgid, 0);
        };
        let wanted = pgid.to_string();
        entries.flatten().any(|entry| {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                return false;
            };
            stat_fields(pid).is_some_and(|fields| {
                fields.first().map(String::as_str) != Some("Z") && fields.get(2) == Some(&wanted)
            })
        })
    }

    /// `kill(-pgid, sig)`; true when at least one process got it.
    pub fn signal_group(pgid: u32, sig: i32) -> bool {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours; `pgid` was
        // checked to be > 1, so the negative value names exactly that one group.
        unsafe { libc::kill(-(pgid as i32), sig) == 0 }
    }
}

#[cfg(all(unix, not(target_os = "linux")))]
mod imp {
    use std::process::Command;

    pub const TERM: i32 = libc::SIGTERM;
    pub const KILL: i32 = libc::SIGKILL;

    fn ps(pid: u32, field: &str) -> Option<String> {
        let out = Command::new("ps")
            .args(["-o", field, "-p", &pid.to_string()])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    }

    /// `kern.boottime` (macOS, the BSDs): the time of this boot, as good as an id.
    pub fn boot_id() -> Option<String> {
        let out = Command::new("sysctl")
            .args(["-n", "kern.boottime"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    }

    pub fn identity(pid: u32) -> Option<super::ProcessIdentity> {
        if ps(pid, "stat=")?.starts_with('Z') {
            return None;
        }
        Some(super::ProcessIdentity {
            boot_id: boot_id(),
            start_time: ps(pid, "lstart=")?,
        })
    }

    pub fn command_line(pid: u32) -> Option<String> {
        ps(pid, "command=")
    }

    pub fn group_exists(pgid: u32) -> bool {
        signal_group(pgid, 0)
    }

    pub fn signal_group(pgid: u32, sig: i32) -> bool {
        // SAFETY: as on Linux: integers only, and `pgid` > 1.
        unsafe { libc::kill(-(pgid as i32), sig) == 0 }
    }
}

#[cfg(not(unix))]
mod imp {
    // Without process groups the child handle's kill_on_drop is all there is; orphan cleanup
    // has no way to identify survivors, so it leaves them alone.
    pub const TERM: i32 = 15;
    pub const KILL: i32 = 9;

    pub fn boot_id() -> Option<String> {
        None
    }

    pub fn identity(_pid: u32) -> Option<super::ProcessIdentity> {
        None
    }

    pub fn command_line(_pid: u32) -> Option<String> {
        None
    }

    pub fn group_exists(_pgid: u32) -> bool {
        false
    }

    pub fn signal_group(_pgid: u32, _sig: i32) -> bool {
        false
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_stable_identity_and_a_dead_pid_has_none() {
        let (pid, identity) = me();
        let identity = identity.expect("own identity");
        assert!(is_same_process(pid, &identity));
        let other = ProcessIdentity {
            start_time: "1".into(),
            ..identity.clone()
        };
        assert!(!is_same_process(pid, &other), "another start time");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        assert_eq!(super::identity(dead), None);
        assert!(
            !group_exists(0) && !group_exists(1),
            "never our own or every group"
        );
    }
}
