//! A real PostgreSQL server for tests: a temporary cluster (`initdb`) listening on a loopback
//! port, stopped and deleted when dropped. Debian's `postgresql` package provides the programs
//! (`scripts/install-deps.sh` installs it). PostgreSQL refuses to run as root, so as root the
//! cluster belongs to the package's `postgres` user.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A running temporary cluster.
pub struct TempPostgres {
    dir: PathBuf,
    bin: PathBuf,
    /// `postgres://relay@127.0.0.1:PORT/postgres` (trust authentication, loopback only).
    pub url: String,
}

/// The directory of the newest installed PostgreSQL's programs.
fn bin_dir() -> Result<PathBuf, String> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| {
            "PostgreSQL is not installed: install Debian's `postgresql` package \
             (scripts/install-deps.sh does)"
                .to_string()
        })?
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| "no initdb under /usr/lib/postgresql/*/bin".to_string())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|uids| uids.split_whitespace().next() == Some("0"))
        })
        .unwrap_or(false)
}

/// `program` with `args`, as the `postgres` user when this process is root.
fn as_cluster_owner(program: &Path, args: &[&str]) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command
            .args(["-u", "postgres", "--"])
            .arg(program)
            .args(args);
        command
    } else {
        let mut command = Command::new(program);
        command.args(args);
        command
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl TempPostgres {
    /// Creates and starts a cluster; fails with what is missing or what PostgreSQL said.
    pub fn start() -> Result<TempPostgres, String> {
        let bin = bin_dir()?;
        let dir =
            std::env::temp_dir().join(format!("relay-pg-{}-{}", std::process::id(), free_port()));
        let data = dir.join("data");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        if is_root() {
            let owned = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .map_err(|e| e.to_string())?;
            if !owned.success() {
                return Err("chown to the postgres user failed".into());
            }
        }
        let initdb = as_cluster_owner(
            &bin.join("initdb"),
            &[
                "-D",
                data.to_str().expect("UTF-8 path"),
                "-U",
                "relay",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        )
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("initdb: {e}"))?;
        if !initdb.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&initdb.stderr)
            ));
        }
        let log = dir.join("server.log");
        // A port chosen free can be taken by another test before the server binds it: then a
        // new one is chosen (the server says so in its log).
        let mut attempts = 0;
        let port = loop {
            attempts += 1;
            let port = free_port();
            let options = format!(
                "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
                dir.display()
            );
            let _ = std::fs::remove_file(&log);
            let started = as_cluster_owner(
                &bin.join("pg_ctl"),
                &[
                    "-D",
                    data.to_str().expect("UTF-8 path"),
                    "-o",
                    &options,
                    "-l",
                    log.to_str().expect("UTF-8 path"),
                    "-w",
                    "-t",
                    "30",
                    "start",
                ],
            )
            .stdout(Stdio::null())
            .output()
            .map_err(|e| format!("pg_ctl: {e}"))?;
            if started.status.success() {
                break port;
            }
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            if !said.contains("Address already in use") || attempts >= 5 {
                return Err(format!("PostgreSQL did not start: {said}"));
            }
        };
        let cluster = TempPostgres {
            dir,
            bin,
            url: format!("postgres://relay@127.0.0.1:{port}/postgres"),
        };
        Ok(cluster)
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        // Immediate: the test is over, nothing in the cluster is worth a checkpoint.
        let data = self.dir.join("data");
        let _ = as_cluster_owner(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                data.to_str().unwrap_or_default(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
