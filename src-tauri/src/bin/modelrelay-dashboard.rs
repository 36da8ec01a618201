//! `modelrelay-dashboard`: the dashboard window's process, started by the tray
//! (`modelrelay-desktop`) with the page to show on its standard input.

// No console window behind the window on Windows release builds.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

use std::process::ExitCode;

// The same allocator as the tray and the headless binary.
relay_core::use_jemalloc!();

fn main() -> ExitCode {
    relay_desktop::dashboard::run()
}
