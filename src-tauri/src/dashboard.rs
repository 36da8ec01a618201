//! The dashboard window's own process, `modelrelay-dashboard`: Tauri and the web view, started
//! by the tray's *Open dashboard* and gone when the window closes.
//!
//! Why a process of its own: on Linux a web view's runtime stays for the life of the process
//! that created it (WebKit's network process and web context, the GL driver), so a tray app that
//! had opened its window once kept ~150 MB after closing it (BENCHMARKS.md, "desktop
//! footprint"). Here closing the window ends the process, and the tray never links WebKit.
//!
//! The tray hands the address over on this process's standard input, never on its command line
//! (which every local user can read in `/proc`): the first line is the page to open, a one-time
//! login link minted by the node, which signs the web view in with an `HttpOnly` session cookie.
//! Each later line `show` brings the window to the front; the end of the input (the tray quit or
//! died) closes it.

use std::io::BufRead;
use std::process::ExitCode;

use tauri::webview::PageLoadEvent;
use tauri::{AppHandle, Manager, RunEvent, Url, WebviewUrl, WebviewWindowBuilder};

/// Label of the dashboard window; `capabilities/default.json` grants it nothing.
pub const MAIN_WINDOW: &str = "main";

/// The binary's name, for messages.
pub const BIN_NAME: &str = "modelrelay-dashboard";

/// What the tray may write after the address.
pub const SHOW: &str = "show";

/// Whether `address` is a page this window may show: the node's own, on this machine (the
/// window must never be pointed at a site, whoever writes to its input).
pub fn node_page(address: &str) -> Result<Url, String> {
    let url: Url = address
        .trim()
        .parse()
        .map_err(|e| format!("{address:?} is not a URL ({e})"))?;
    let host = url.host_str().unwrap_or_default();
    let local = host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !matches!(url.scheme(), "http" | "https") || !local {
        return Err(format!("{url} is not a page of a node on this machine"));
    }
    Ok(url)
}

/// Runs the window until it closes or the input ends.
pub fn run() -> ExitCode {
    // Before any thread or the display exists (see `rendering`).
    crate::rendering::prefer_software_rendering();
    let trim = crate::webkit_trim::trim_webkit_processes();
    crate::launch::init_logging(None);
    match trim {
        Ok(library) => {
            tracing::debug!(library = %library.display(), "WebKit's processes will let go of their start-up code")
        }
        Err(why) => tracing::info!("WebKit's processes keep their start-up code: {why}"),
    }
    let mut first = String::new();
    // The lock ends with this statement: the thread that follows the tray reads on.
    let _ = std::io::stdin().lock().read_line(&mut first);
    let url = match node_page(&first) {
        Ok(url) => url,
        Err(why) => {
            eprintln!(
                "{BIN_NAME}: {why}. This program shows the dashboard for the ModelRelay tray \
                 (modelrelay-desktop), which starts it; open the dashboard from the tray."
            );
            return ExitCode::FAILURE;
        }
    };
    let app = tauri::Builder::default()
        .setup(move |app| {
            open_window(app.handle(), url)?;
            follow_the_tray(app.handle().clone());
            Ok(())
        })
        .build(tauri::generate_context!());
    let app = match app {
        Ok(app) => app,
        Err(error) => {
            eprintln!("{BIN_NAME}: cannot start the window system: {error}");
            return ExitCode::FAILURE;
        }
    };
    // The last window closing ends the process (Tauri's default): nothing is kept for later.
    let code = app.run_return(|_, _: RunEvent| {});
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn open_window(app: &AppHandle, url: Url) -> tauri::Result<()> {
    let settled = std::sync::Once::new();
    WebviewWindowBuilder::new(app, MAIN_WINDOW, WebviewUrl::External(url))
        .title("ModelRelay")
        .inner_size(1100.0, 760.0)
        .min_inner_size(720.0, 480.0)
        .on_page_load(move |_, page| {
            if page.event() == PageLoadEvent::Finished {
                settled.call_once(let_go_of_opening_code_soon);
            }
        })
        .build()?;
    Ok(())
}

/// Opening the window runs a great deal of library code (GTK, WebKit's UI side, the GL driver
/// WebKit loads) that keeping it open does not: once the first page has loaded and painted, this
/// process lets go of it (`relay_core::resident`; ~25 MB of the process's 78 MB, BENCHMARKS.md
/// "what a box pays"). What the open window runs again maps back from the page cache.
fn let_go_of_opening_code_soon() {
    std::thread::spawn(|| {
        std::thread::sleep(relay_core::resident::AFTER_START);
        let released = relay_core::resident::release_loaded_code();
        tracing::debug!(
            mappings = released.mappings,
            kib = released.bytes / 1024,
            "let go of the window's opening code"
        );
    });
}

/// Reads the tray's later lines on a thread of its own: `show` raises the window, the end of
/// the input closes it (the window is destroyed first, while the event loop runs: WebKitGTK
/// tearing a web view down inside the process's exit once crashed the app).
fn follow_the_tray(app: AppHandle) {
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim() == SHOW {
                let handle = app.clone();
                let _ = app.run_on_main_thread(move || {
                    if let Some(window) = handle.get_webview_window(MAIN_WINDOW) {
                        let _ = window.show();
                        let _ = window.unminimize();
                        let _ = window.set_focus();
                    }
                });
            }
        }
        let handle = app.clone();
        let _ = app.run_on_main_thread(move || {
            for window in handle.webview_windows().values() {
                let _ = window.destroy();
            }
            handle.exit(0);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_shows_only_a_node_on_this_machine() {
        for ok in [
            "http://127.0.0.1:8080/login?code=abc",
            "https://127.0.0.1:8443/",
            "http://localhost:8080/",
            "http://[::1]:8080/",
        ] {
            assert!(node_page(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "not a url",
            "https://example.com/",
            "http://192.168.1.5:8080/",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "http://localhost.example.com/",
        ] {
            assert!(node_page(bad).is_err(), "{bad}");
        }
    }
}
