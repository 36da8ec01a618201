//! `modelrelay`: the headless command. See `modelrelay --help`.

use std::io::IsTerminal;

use clap::Parser;
use relay_core::app;
use relay_core::cli::Cli;
use tracing_subscriber::EnvFilter;

#[cfg(all(not(target_env = "msvc"), not(feature = "system-allocator")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc settings read at startup: a background thread purges pages freed for a second, so
/// memory goes back to the OS after a burst of streams.
#[cfg(all(not(target_env = "msvc"), not(feature = "system-allocator")))]
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
// jemalloc reads this symbol as a C `const char *`: a reference to an array is a thin pointer.
pub static malloc_conf: &[u8; 60] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn init_logging(level: Option<&str>) {
    let level = level.unwrap_or("info");
    // A bare level applies to ModelRelay; libraries stay at warn so debug logs stay readable.
    let directive = if level.contains('=') {
        level.to_string()
    } else {
        format!("warn,relay_core={level},modelrelay={level}")
    };
    let filter = EnvFilter::try_new(&directive).unwrap_or_else(|error| {
        eprintln!("LOG_LEVEL {level:?} is not valid ({error}); using info");
        EnvFilter::new("warn,relay_core=info,modelrelay=info")
    });
    // Colour only for a terminal: journald and log files get plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_level.as_deref());
    match app::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("modelrelay: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
