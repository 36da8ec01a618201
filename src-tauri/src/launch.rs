//! Command-line handling: the desktop binary takes exactly the `modelrelay` command line
//! (relay-core's clap [`Cli`]), plus `--hidden`. A command or `--serve` runs the core headless,
//! like `modelrelay` would; otherwise the tray app starts.

use std::ffi::OsString;

use clap::{Arg, ArgAction, CommandFactory, FromArgMatches};
use relay_core::cli::Cli;

/// The binary's name, for `--help` and error messages.
pub const BIN_NAME: &str = "modelrelay-desktop";

/// What to run.
#[derive(Debug)]
pub enum Launch {
    /// The same as the `modelrelay` command with these arguments: no window, no tray, no GTK.
    Headless(Box<Cli>),
    /// The tray app, with the node configured from these arguments.
    Gui {
        /// The parsed command line (config file, listen address, ...).
        cli: Box<Cli>,
        /// Start in the tray without opening the window (the start-on-login entry passes it).
        hidden: bool,
    },
}

/// relay-core's command line under this binary's name, with the desktop's own flag.
pub fn command() -> clap::Command {
    Cli::command()
        .name(BIN_NAME)
        .bin_name(BIN_NAME)
        .before_help(
            "ModelRelay desktop app. With no command and no --serve it opens the tray and the \
             dashboard window; with a command or --serve it runs headless, exactly like the \
             `modelrelay` command (no display or D-Bus needed).",
        )
        .arg(
            Arg::new("hidden")
                .long("hidden")
                .action(ArgAction::SetTrue)
                .help("Start in the tray without opening the dashboard window"),
        )
}

/// Parses a command line (the first item is the program name).
pub fn parse<I, T>(args: I) -> Result<Launch, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = command().try_get_matches_from(args)?;
    let hidden = matches.get_flag("hidden");
    let cli = Cli::from_arg_matches(&matches)?;
    if cli.serve || cli.command.is_some() {
        return Ok(Launch::Headless(Box::new(cli)));
    }
    Ok(Launch::Gui {
        cli: Box::new(cli),
        hidden,
    })
}

/// Whether a GUI can start. On Linux GTK needs an X11 or Wayland display and panics without one,
/// so the caller checks first; elsewhere there is always a window server.
pub fn has_display() -> bool {
    if cfg!(target_os = "linux") {
        let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
        set("DISPLAY") || set("WAYLAND_DISPLAY")
    } else {
        true
    }
}

/// Starts logging to stderr, like the `modelrelay` command: `LOG_LEVEL`/`--log-level` is a level
/// for ModelRelay's own crates (libraries stay at `warn`) or a full tracing filter directive.
pub fn init_logging(level: Option<&str>) {
    relay_core::startup::init_logging(
        level,
        &["relay_core", "relay_desktop", "modelrelay_desktop"],
    );
    relay_core::startup::raise_open_files_limit();
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_core::cli::Command;

    #[test]
    fn definition_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn no_arguments_is_the_tray_app() {
        match parse([BIN_NAME]).unwrap() {
            Launch::Gui { hidden, cli } => {
                assert!(!hidden);
                assert!(cli.command.is_none());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hidden_and_node_flags_stay_in_the_gui() {
        match parse([
            BIN_NAME,
            "--hidden",
            "--listen",
            "127.0.0.1:18080",
            "--config",
            "/tmp/x.toml",
        ])
        .unwrap()
        {
            Launch::Gui { hidden, cli } => {
                assert!(hidden);
                assert_eq!(cli.proxy.listen.as_deref(), Some("127.0.0.1:18080"));
                assert_eq!(
                    cli.config.as_deref(),
                    Some(std::path::Path::new("/tmp/x.toml"))
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn serve_and_commands_are_headless() {
        let serve = parse([BIN_NAME, "--serve", "--listen", "127.0.0.1:9"]).unwrap();
        assert!(matches!(serve, Launch::Headless(ref cli) if cli.serve));
        let worker = parse([BIN_NAME, "worker", "--proxy-url", "http://h:8080"]).unwrap();
        assert!(
            matches!(worker, Launch::Headless(ref cli) if matches!(cli.command, Some(Command::Worker)))
        );
        let serve_cmd = parse([BIN_NAME, "serve"]).unwrap();
        assert!(matches!(serve_cmd, Launch::Headless(_)));
    }

    #[test]
    fn help_and_bad_flags_are_clap_errors() {
        let help = parse([BIN_NAME, "--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = help.to_string();
        assert!(text.contains(BIN_NAME), "{text}");
        assert!(text.contains("--hidden"), "{text}");
        assert!(text.contains("--serve"), "{text}");
        assert!(parse([BIN_NAME, "--no-such-flag"]).is_err());
    }
}
