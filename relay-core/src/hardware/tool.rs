//! Running a vendor tool: a child process with a time limit and a bounded read of its output,
//! killed if it overruns, so a hung driver or a tool printing without end costs the sampler a
//! few seconds and a few KiB, never the worker.

use std::ffi::OsStr;
use std::io::ErrorKind;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// The most output read from a tool (a box with many GPUs prints a few KiB).
pub const MAX_OUTPUT_BYTES: u64 = 256 * 1024;

/// How a tool run went.
#[derive(Debug, PartialEq, Eq)]
pub enum Run {
    /// It exited 0; its output, cut at [`MAX_OUTPUT_BYTES`], invalid UTF-8 replaced.
    Output(String),
    /// No such program on `PATH`: the box has no such GPU (not worth a log line).
    Absent,
    /// It ran but failed, overran or could not be read.
    Failed(String),
}

/// Runs `program` with `args` for at most `limit`, looking for it in `search_path` (a `PATH`
/// value) when given, else in the process's `PATH`.
pub async fn run_in(
    program: &str,
    args: &[&str],
    limit: Duration,
    search_path: Option<&OsStr>,
) -> Run {
    // Looked up here rather than left to the spawn: on a box without the tool (most boxes lack
    // at least one vendor's), no process is forked every few seconds only to fail its exec.
    let Some(found) = find_program(program, search_path) else {
        return Run::Absent;
    };
    let mut command = Command::new(found);
    if let Some(path) = search_path {
        // The standard library looks the program up in the child's PATH when it is set.
        command.env("PATH", path);
    }
    let mut child = match command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(error) if error.kind() == ErrorKind::NotFound => return Run::Absent,
        Err(error) => return Run::Failed(format!("{program} could not start: {error}")),
    };
    let Some(stdout) = child.stdout.take() else {
        return Run::Failed(format!("{program}: no output pipe"));
    };
    let finished = async {
        let mut output = Vec::new();
        // A tool printing more than the bound is cut; the rest is not read and the child is
        // waited for (it gets SIGPIPE or finishes).
        stdout
            .take(MAX_OUTPUT_BYTES)
            .read_to_end(&mut output)
            .await?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, output))
    };
    match tokio::time::timeout(limit, finished).await {
        Err(_) => Run::Failed(format!(
            "{program} did not answer within {} s",
            limit.as_secs_f64()
        )),
        Ok(Err(error)) => Run::Failed(format!("{program}: {error}")),
        Ok(Ok((status, _))) if !status.success() => {
            Run::Failed(format!("{program} exited with {status}"))
        }
        Ok(Ok((_, output))) => Run::Output(String::from_utf8_lossy(&output).into_owned()),
    }
}

/// Where `program` is: itself when it names a path, else the first executable file of that
/// name in `search_path` (a `PATH` value), or in the process's `PATH`.
fn find_program(program: &str, search_path: Option<&OsStr>) -> Option<std::path::PathBuf> {
    if program.contains(std::path::MAIN_SEPARATOR) {
        return Some(program.into());
    }
    let path = match search_path {
        Some(path) => path.to_owned(),
        None => std::env::var_os("PATH")?,
    };
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

#[cfg(unix)]
fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &std::path::Path) -> bool {
    path.is_file() || path.with_extension("exe").is_file()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    use super::*;

    /// A directory holding one executable shell script named `name`.
    fn fake_tool(name: &str, script: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "modelrelay-tool-{}-{}-{name}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    async fn run_fake(script: &str, limit: Duration) -> Run {
        let dir = fake_tool("fake-smi", script);
        // The system's directories after it, for the commands the script runs.
        let path = format!("{}:/usr/bin:/bin", dir.display());
        let run = run_in("fake-smi", &[], limit, Some(path.as_ref())).await;
        std::fs::remove_dir_all(dir).unwrap();
        run
    }

    #[tokio::test]
    async fn a_tool_that_is_not_installed_is_absent_not_an_error() {
        let empty = std::env::temp_dir();
        let run = run_in("no-such-smi-tool", &[], TOOL_LIMIT, Some(empty.as_os_str())).await;
        assert_eq!(run, Run::Absent);
    }

    /// The lookup happens before any process is started (a box without the tool forks nothing
    /// every sample): a file of that name that is not executable is not the tool.
    #[tokio::test]
    async fn a_tool_is_looked_up_before_anything_is_started_and_must_be_executable() {
        let dir = fake_tool("plain-smi", "echo should-not-run");
        std::fs::set_permissions(
            dir.join("plain-smi"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let run = run_in("plain-smi", &[], TOOL_LIMIT, Some(dir.as_os_str())).await;
        assert_eq!(run, Run::Absent);
        assert_eq!(find_program("plain-smi", Some(dir.as_os_str())), None);
        std::fs::set_permissions(
            dir.join("plain-smi"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        assert_eq!(
            find_program("plain-smi", Some(dir.as_os_str())),
            Some(dir.join("plain-smi"))
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    const TOOL_LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_tool_s_output_is_read_and_its_failure_reported() {
        assert_eq!(
            run_fake("echo 'GPU, 1, 2, 3, 4'", TOOL_LIMIT).await,
            Run::Output("GPU, 1, 2, 3, 4\n".into())
        );
        let failed = run_fake("echo broken; exit 9", TOOL_LIMIT).await;
        assert!(
            matches!(&failed, Run::Failed(why) if why.contains("exit status: 9")),
            "{failed:?}"
        );
    }

    #[tokio::test]
    async fn a_hung_tool_is_killed_at_the_time_limit() {
        let started = std::time::Instant::now();
        let run = run_fake("sleep 30", Duration::from_millis(300)).await;
        assert!(
            matches!(&run, Run::Failed(why) if why.contains("did not answer")),
            "{run:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_tool_printing_without_end_is_cut_at_the_bound() {
        let started = std::time::Instant::now();
        let run = run_fake("exec yes 'NVIDIA GeForce RTX 4090, 1, 2, 3, 4'", TOOL_LIMIT).await;
        // Its pipe closed after the bound, the tool dies of SIGPIPE: a failure, read no further
        // and well before the time limit.
        assert!(
            matches!(&run, Run::Failed(why) if why.contains("signal")),
            "{run:?}"
        );
        assert!(started.elapsed() < TOOL_LIMIT);
    }
}
