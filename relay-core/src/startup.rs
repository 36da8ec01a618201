//! What a program embedding the relay does once at start, the same in `modelrelay` and the
//! desktop app: logging to stderr, the open-files limit, jemalloc as the allocator, and the exit
//! code of a run.

use std::io::IsTerminal;
use std::process::ExitCode;

/// Starts logging to stderr. `level` (`LOG_LEVEL` / `--log-level`) is a level for `crates`
/// (ModelRelay's own; libraries stay at `warn` so debug logs stay readable) or, when it contains
/// `=`, a whole tracing filter directive. Colour only on a terminal: journald and log files get
/// plain text. A subscriber already installed (tests, embedders) is kept.
pub fn init_logging(level: Option<&str>, crates: &[&str]) {
    let level = level.unwrap_or("info");
    let directive_for = |level: &str| {
        std::iter::once("warn".to_string())
            .chain(crates.iter().map(|name| format!("{name}={level}")))
            .collect::<Vec<_>>()
            .join(",")
    };
    let directive = if level.contains('=') {
        level.to_string()
    } else {
        directive_for(level)
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&directive).unwrap_or_else(|error| {
        eprintln!("LOG_LEVEL {level:?} is not valid ({error}); using info");
        tracing_subscriber::EnvFilter::new(directive_for("info"))
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// The exit code of a run: success, or the error printed as `program: error` and failure.
pub fn exit_code<E: std::fmt::Display>(program: &str, result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: {error}");
            ExitCode::FAILURE
        }
    }
}

/// jemalloc's settings, read at start: a background thread purges pages freed for a second, so
/// memory goes back to the OS after a burst of streams (ARCHITECTURE.md, "jemalloc").
pub const JEMALLOC_CONF: &[u8; 60] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

#[cfg(not(target_env = "msvc"))]
#[doc(hidden)]
pub use tikv_jemallocator::Jemalloc;

/// Makes jemalloc the program's allocator with [`JEMALLOC_CONF`]. A macro because both the
/// `#[global_allocator]` and the `_rjem_malloc_conf` symbol jemalloc looks up must live in the
/// final binary. jemalloc does not build for MSVC, where the system allocator stays.
#[macro_export]
macro_rules! use_jemalloc {
    () => {
        #[cfg(not(target_env = "msvc"))]
        #[global_allocator]
        static ALLOCATOR: $crate::startup::Jemalloc = $crate::startup::Jemalloc;

        #[cfg(not(target_env = "msvc"))]
        #[allow(non_upper_case_globals)]
        #[export_name = "_rjem_malloc_conf"]
        // jemalloc reads this symbol as a C `const char *`: a reference to an array is a thin
        // pointer.
        pub static malloc_conf: &[u8; 60] = $crate::startup::JEMALLOC_CONF;
    };
}

/// Raises this process's soft limit on open files to its hard limit, as servers do: every
/// client, worker and backend connection is a descriptor, and many systems start programs with a
/// soft limit of 1,024 while allowing far more. Returns the soft limit now (`None` where there is
/// no such limit, or it cannot be read); the proxy keeps its connection bound below it.
pub fn raise_open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let limit = open_files_rlimit()?;
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: setrlimit only reads the struct passed.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
                tracing::debug!("cannot raise the open-files limit above {}", limit.rlim_cur);
            }
        }
    }
    open_files_limit()
}

/// This process's soft limit on open files; `None` where there is none or it cannot be read.
// `rlim_t` is `u64` on Linux and macOS but not on every Unix: the cast says what is meant.
#[allow(clippy::unnecessary_cast)]
pub fn open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        open_files_rlimit().map(|limit| limit.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(unix)]
fn open_files_rlimit() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jemalloc_settings_are_one_c_string() {
        assert_eq!(JEMALLOC_CONF.iter().filter(|&&b| b == 0).count(), 1);
        assert_eq!(JEMALLOC_CONF.last(), Some(&0));
    }
}
