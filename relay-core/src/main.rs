//! `modelrelay`: the headless command. See `modelrelay --help`.

use clap::Parser;
use relay_core::cli::Cli;
use relay_core::{app, startup};

// The system allocator instead for heap profilers (`--features system-allocator`).
#[cfg(not(feature = "system-allocator"))]
relay_core::use_jemalloc!();

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    startup::init_logging(cli.log_level.as_deref(), &["relay_core", "modelrelay"]);
    startup::raise_open_files_limit();
    startup::exit_code("modelrelay", app::run(cli).await)
}
