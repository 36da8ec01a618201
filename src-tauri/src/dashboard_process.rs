//! The tray's side of the dashboard window: the `modelrelay-dashboard` process it starts, raises
//! and ends ([`crate::dashboard`] is the other side).
//!
//! The page's address — a one-time login link, a credential for as long as it is unused — goes
//! to the window process on its standard input, a pipe only the two processes hold; never as a
//! command-line argument, which any local user can read in `/proc/PID/cmdline`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::dashboard::SHOW;

/// The window process, as the tray knows it.
#[derive(Debug)]
pub struct DashboardWindow {
    program: PathBuf,
    running: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    child: Child,
    input: ChildStdin,
}

impl DashboardWindow {
    /// The `modelrelay-dashboard` installed beside this program (as the packages install them,
    /// and as cargo builds them).
    pub fn beside_this_program() -> Self {
        let name = format!("modelrelay-dashboard{}", std::env::consts::EXE_SUFFIX);
        let program = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join(&name)))
            .unwrap_or_else(|| PathBuf::from(name));
        Self::with_program(program)
    }

    /// The window process is `program`.
    pub fn with_program(program: PathBuf) -> Self {
        DashboardWindow {
            program,
            running: Mutex::new(None),
        }
    }

    /// Shows the window: raises the one that is open, or starts a process on the page
    /// `address` names (called only then: a login link is minted for one window).
    pub fn show(&self, address: impl FnOnce() -> String) -> Result<(), String> {
        let mut running = self.lock();
        if let Some(open) = running.as_mut() {
            if open.child.try_wait().ok().flatten().is_none()
                && writeln!(open.input, "{SHOW}")
                    .and_then(|()| open.input.flush())
                    .is_ok()
            {
                return Ok(());
            }
            // It ended (the window was closed): reaped here, and a new one starts.
            let _ = open.child.wait();
        }
        *running = None;
        let mut child = spawn_piped(&self.program)
            .map_err(|e| format!("cannot start {} ({e})", self.program.display()))?;
        let mut input = child.stdin.take().expect("stdin was piped");
        if let Err(error) = writeln!(input, "{}", address()).and_then(|()| input.flush()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{} did not take the address ({error})",
                self.program.display()
            ));
        }
        *running = Some(Running { child, input });
        Ok(())
    }

    /// Whether a window process is running.
    pub fn is_open(&self) -> bool {
        self.lock()
            .as_mut()
            .is_some_and(|open| open.child.try_wait().ok().flatten().is_none())
    }

    /// Ends the window process: its input closes, so it closes its window and exits; after
    /// `grace` it is killed.
    pub fn close(&self, grace: Duration) {
        let Some(Running { mut child, input }) = self.lock().take() else {
            return;
        };
        drop(input);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!("the dashboard window did not close in {grace:?}: ending it");
        let _ = child.kill();
        let _ = child.wait();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Starts `program` with its standard input on a pipe. A program file written a moment ago can
/// be busy ("text file busy": a process forked meanwhile holds it open for writing until it
/// execs — right after an upgrade, or in tests that write one while others spawn): tried again
/// for a short while.
fn spawn_piped(program: &std::path::Path) -> std::io::Result<Child> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match Command::new(program).stdin(Stdio::piped()).spawn() {
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            started => return started,
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// A stand-in window process: writes its arguments and every line it reads to `log`, and
    /// exits at the end of its input.
    fn fake_window(dir: &std::path::Path) -> (PathBuf, PathBuf) {
        let log = dir.join("log");
        let program = dir.join("fake-dashboard");
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\necho \"args:$*\" >> '{log}'\nwhile read -r line; do echo \"line:$line\" >> '{log}'; done\necho eof >> '{log}'\n",
                log = log.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        (program, log)
    }

    fn wait_for(log: &std::path::Path, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let seen = std::fs::read_to_string(log).unwrap_or_default();
            if seen.contains(text) {
                return seen;
            }
            assert!(Instant::now() < deadline, "{text:?} not in {seen:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_address_goes_on_the_pipe_not_the_command_line_and_a_second_show_raises() {
        let dir = temp_dir("dashboard-window");
        let (program, log) = fake_window(&dir);
        let window = DashboardWindow::with_program(program);
        let link = "http://127.0.0.1:9/login?code=secret";
        window.show(|| link.to_string()).unwrap();
        wait_for(&log, &format!("line:{link}"));
        let mut minted = false;
        window
            .show(|| {
                minted = true;
                String::new()
            })
            .unwrap();
        let seen = wait_for(&log, "line:show");
        assert!(!minted, "no second link for an open window");
        assert!(seen.contains("args:\n"), "no arguments: {seen}");
        assert!(!seen.contains("args:http"), "{seen}");
        assert!(window.is_open());
        window.close(Duration::from_secs(5));
        wait_for(&log, "eof");
        assert!(!window.is_open());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_window_closed_by_its_user_is_started_again_on_the_next_show() {
        let dir = temp_dir("dashboard-reopen");
        let (program, log) = fake_window(&dir);
        let window = DashboardWindow::with_program(program);
        window.show(|| "first".into()).unwrap();
        wait_for(&log, "line:first");
        // The user closes the window: the process ends by itself.
        window.lock().as_mut().unwrap().child.kill().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(!window.is_open());
        window.show(|| "second".into()).unwrap();
        wait_for(&log, "line:second");
        window.close(Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_missing_window_program_is_an_error_that_names_it() {
        let window = DashboardWindow::with_program("/nonexistent/modelrelay-dashboard".into());
        let error = window.show(|| "x".into()).unwrap_err();
        assert!(
            error.contains("/nonexistent/modelrelay-dashboard"),
            "{error}"
        );
    }
}
