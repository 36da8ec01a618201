//! `modelrelay-desktop`: the tray process (no web view: the window is `modelrelay-dashboard`),
//! or with `--serve` / a command the headless core.

// No console window behind the app on Windows release builds.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

use std::process::ExitCode;

use relay_desktop::launch::{self, Launch};

// The allocator of the headless `modelrelay` binary, with its settings, so both give memory
// back to the OS the same way after a burst of streams.
relay_core::use_jemalloc!();

fn main() -> ExitCode {
    // Decided before anything from Tauri runs: headless mode must never initialise GTK.
    match launch::parse(std::env::args_os()) {
        Err(error) => {
            // --help and --version land here too; clap prints them and picks the exit code.
            error.exit()
        }
        Ok(Launch::Headless(cli)) => relay_desktop::run_headless(*cli),
        Ok(Launch::Gui { cli, hidden }) if launch::has_display() => {
            relay_desktop::tray::run(*cli, hidden)
        }
        Ok(Launch::Gui { cli, .. }) => {
            // GTK would panic without a display. Run what the app would have run, headless,
            // rather than fail: over ssh or in a container this is what the user wants.
            eprintln!(
                "{}: no display (DISPLAY/WAYLAND_DISPLAY unset): running headless; \
                 use --serve for the proxy only",
                launch::BIN_NAME
            );
            relay_desktop::run_headless(*cli)
        }
    }
}
