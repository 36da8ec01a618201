//! ModelRelay desktop app: two processes around `relay-core`.
//!
//! - [`launch`]: the command line; `--serve` or a command runs the core headless (no GTK).
//! - [`tray`]: the tray process (`modelrelay-desktop`), always on: the node in-process, the
//!   tray menu, notifications, start on login; no web view linked.
//! - [`dashboard`]: the window process (`modelrelay-dashboard`, Tauri), started by *Open
//!   dashboard* and ended when the window closes; it shows the node's own web UI (signed in by a
//!   one-time link handed over on its stdin), which talks HTTP to the node and nothing else.
//!   [`dashboard_process`] is the tray's side of it.
//! - [`tray_state`]: node state → tray icon, tooltip, status line (pure, unit-tested).
//! - [`notifications`], [`autostart`], [`clipboard`]: the OS integrations, each failing softly.
//! - [`rendering`]: software rendering for GTK and WebKit, which keeps the tray app small.
//! - [`webkit_trim`]: preloads the `webkit-trim` library into WebKit's processes, which lets
//!   them go of the code their start-up ran.

pub mod autostart;
pub mod clipboard;
pub mod dashboard;
pub mod dashboard_process;
pub mod launch;
pub mod notifications;
pub mod rendering;
pub mod tray;
pub mod tray_state;
pub mod webkit_trim;

use std::process::ExitCode;

use relay_core::cli::Cli;

/// Runs the core exactly like the `modelrelay` command: no window, no tray, and nothing from
/// Tauri or GTK is touched, so it works with no display and no D-Bus (servers, containers).
pub fn run_headless(cli: Cli) -> ExitCode {
    launch::init_logging(cli.log_level.as_deref());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!(
                "{}: cannot start the async runtime: {error}",
                launch::BIN_NAME
            );
            return ExitCode::FAILURE;
        }
    };
    relay_core::startup::exit_code(
        launch::BIN_NAME,
        runtime.block_on(relay_core::app::run(cli)),
    )
}
