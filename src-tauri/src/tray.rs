//! The tray process: the node runs in-process on a tokio runtime, the tray shows its state and
//! switches its roles, notifications report what happens, and *Open dashboard* starts the window
//! process ([`crate::dashboard_process`]).
//!
//! No web view is linked here: the event loop is tao's and the icon and menu are tray-icon's
//! (the crates Tauri itself uses underneath), so the process a box keeps at login holds GTK and
//! the node, not WebKit (BENCHMARKS.md, "desktop footprint").

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use relay_core::cli::Cli;
use relay_core::node::start_on_login::StartOnLogin;
use relay_core::node::{Node, NodeEvent, NodeOptions, Roles};
use tao::event::{Event, StartCause};
use tao::event_loop::{ControlFlow, EventLoopBuilder, EventLoopProxy};
use tokio::runtime::Runtime;
use tokio::sync::broadcast;
use tray_icon::menu::{CheckMenuItem, Menu, MenuEvent, MenuId, MenuItem, PredefinedMenuItem};
use tray_icon::{Icon, TrayIcon, TrayIconBuilder};

use crate::autostart::{LoginItem, LoginSetting, OsLoginItem};
use crate::clipboard::Clipboard;
use crate::dashboard_process::DashboardWindow;
use crate::launch::init_logging;
use crate::notifications::{self, Message, Notifier};
use crate::tray_state::{self, labels, TrayIconKind, TrayView};

const TRAY_ID: &str = "modelrelay";

/// How long the window process has to close its window when the tray quits.
const WINDOW_CLOSE_GRACE: Duration = Duration::from_secs(3);

/// What the node's tasks, the menu and signals tell the event loop.
#[derive(Debug)]
enum TrayEvent {
    Menu(MenuId),
    /// The node's state changed.
    Refresh,
    /// Start on login was switched (from the dashboard or the menu).
    Login(bool),
    /// SIGTERM, Ctrl-C or the menu's Quit.
    Quit,
    /// The node has drained: the process may end.
    Drained,
}

/// What the tray's handlers share; lives on the event loop's thread.
struct Shell {
    node: Node,
    runtime: Runtime,
    events: EventLoopProxy<TrayEvent>,
    notifier: Notifier,
    clipboard: Clipboard,
    login: LoginSetting,
    window: DashboardWindow,
    tray: Option<TrayParts>,
    quitting: bool,
}

/// The menu entries whose text or check mark changes, and the icon last shown.
struct TrayParts {
    tray: TrayIcon,
    status: MenuItem,
    claude_code: MenuItem,
    proxy: CheckMenuItem,
    worker: CheckMenuItem,
    login: CheckMenuItem,
    shown: Option<TrayIconKind>,
}

/// Starts the node, then the tray; returns only if the event loop cannot start (it ends the
/// process itself when the node has drained).
pub fn run(cli: Cli, hidden: bool) -> ExitCode {
    // Before any thread or the display exists: GTK reads these when it opens the display.
    crate::rendering::prefer_software_rendering();
    init_logging(cli.log_level.as_deref());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("modelrelay-desktop: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let login_item: Arc<dyn LoginItem> = match OsLoginItem::for_current_exe() {
        Ok(item) => Arc::new(item),
        Err(error) => Arc::new(Unavailable(error)),
    };
    let login = LoginSetting::new(login_item);
    let started = relay_core::app::overrides(&cli).and_then(|overrides| {
        let options = NodeOptions {
            config_path: cli.config.clone(),
            overrides,
            // The dashboard's start-on-login switch, served by the node like every setting.
            start_on_login: Some(StartOnLogin(Arc::new(login.clone()))),
            ..NodeOptions::default()
        };
        runtime.block_on(Node::start(options)).map_err(Into::into)
    });
    let node = match started {
        Ok(node) => node,
        Err(error) => {
            eprintln!("modelrelay-desktop: {error}");
            // The user may have started us from a menu, with nowhere to read stderr.
            notifications::show_blocking(
                &Message::new("ModelRelay could not start", error.to_string()),
                Duration::from_secs(3),
            );
            return ExitCode::FAILURE;
        }
    };
    // Subscribed before anything else runs, so events from the first moments (discovery finding
    // the local model servers) are not lost.
    let node_events = node.events();
    tracing::info!(url = %node.url(), "node started; opening the tray");
    {
        let _entered = runtime.enter();
        // A tray spends its life idle: let go of the code only start-up ran (its own and GTK's;
        // the menu's code maps back when the menu opens).
        relay_core::resident::release_soon(relay_core::resident::release_loaded_code);
    }

    let event_loop = EventLoopBuilder::<TrayEvent>::with_user_event().build();
    let proxy = event_loop.create_proxy();
    let menu_events = proxy.clone();
    MenuEvent::set_event_handler(Some(move |event: MenuEvent| {
        let _ = menu_events.send_event(TrayEvent::Menu(event.id));
    }));
    let mut shell = Shell {
        node,
        runtime,
        events: proxy,
        notifier: Notifier::spawn(),
        clipboard: Clipboard::new(),
        login,
        window: DashboardWindow::beside_this_program(),
        tray: None,
        quitting: false,
    };
    spawn_watchers(&shell, node_events);
    event_loop.run(move |event, _, control_flow| {
        *control_flow = ControlFlow::Wait;
        match event {
            // The tray is made once the loop runs (macOS requires it; harmless elsewhere).
            Event::NewEvents(StartCause::Init) => {
                match build_tray(&shell) {
                    Ok(parts) => shell.tray = Some(parts),
                    // No tray host (a bare X session): the node serves on, the window and
                    // notifications still work, and Quit is SIGTERM.
                    Err(error) => tracing::warn!(%error, "no tray icon"),
                }
                refresh_tray(&mut shell);
                if !hidden {
                    open_dashboard(&shell);
                }
            }
            Event::UserEvent(TrayEvent::Menu(id)) => on_menu(&mut shell, id.as_ref()),
            Event::UserEvent(TrayEvent::Refresh) => refresh_tray(&mut shell),
            Event::UserEvent(TrayEvent::Login(enabled)) => {
                if let Some(parts) = &shell.tray {
                    parts.login.set_checked(enabled);
                }
            }
            Event::UserEvent(TrayEvent::Quit) => quit(&mut shell),
            Event::UserEvent(TrayEvent::Drained) => *control_flow = ControlFlow::ExitWithCode(0),
            _ => {}
        }
    })
}

/// A login entry that cannot exist (no home directory, no executable path): says why.
struct Unavailable(String);

impl LoginItem for Unavailable {
    fn is_enabled(&self) -> Result<bool, String> {
        Ok(false)
    }
    fn set_enabled(&self, _enabled: bool) -> Result<(), String> {
        Err(self.0.clone())
    }
}

/// A tray icon's PNG (64×64 RGBA; the tests decode each).
fn icon_png(kind: TrayIconKind) -> &'static [u8] {
    match kind {
        TrayIconKind::Off => include_bytes!("../../icons/tray/off.png"),
        TrayIconKind::Proxy => include_bytes!("../../icons/tray/proxy.png"),
        TrayIconKind::Worker => include_bytes!("../../icons/tray/worker.png"),
        TrayIconKind::Error => include_bytes!("../../icons/tray/error.png"),
    }
}

/// A tray icon, decoded when it is shown (it changes only with the node's roles).
fn icon(kind: TrayIconKind) -> Option<Icon> {
    match decode_rgba(icon_png(kind)) {
        Ok((rgba, width, height)) => Icon::from_rgba(rgba, width, height).ok(),
        Err(error) => {
            tracing::warn!(%error, ?kind, "tray icon not decoded");
            None
        }
    }
}

/// A PNG's pixels as 8-bit RGBA, with its width and height.
pub fn decode_rgba(png_bytes: &[u8]) -> Result<(Vec<u8>, u32, u32), String> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().map_err(|e| e.to_string())?;
    let size = reader
        .output_buffer_size()
        .ok_or("the image is too large")?;
    let mut pixels = vec![0; size];
    let frame = reader.next_frame(&mut pixels).map_err(|e| e.to_string())?;
    if frame.color_type != png::ColorType::Rgba {
        return Err(format!("{:?} pixels, not RGBA", frame.color_type));
    }
    pixels.truncate(frame.buffer_size());
    Ok((pixels, frame.width, frame.height))
}

fn build_tray(shell: &Shell) -> Result<TrayParts, String> {
    let status = MenuItem::with_id("status", "Starting…", false, None);
    // Enabled: clicking it opens the dashboard, where the model is picked.
    let claude_code = MenuItem::with_id("claude", "Claude Code", true, None);
    let proxy = CheckMenuItem::with_id("proxy", labels::RUN_PROXY, true, false, None);
    let worker = CheckMenuItem::with_id("worker", labels::JOIN_AS_WORKER, true, false, None);
    let open = MenuItem::with_id("open", labels::OPEN_DASHBOARD, true, None);
    let copy = MenuItem::with_id("copy", labels::COPY_URL, true, None);
    let login = CheckMenuItem::with_id(
        "login",
        labels::START_ON_LOGIN,
        true,
        shell.login.get().unwrap_or(false),
        None,
    );
    let quit_item = MenuItem::with_id("quit", labels::QUIT, true, None);
    let menu = Menu::with_items(&[
        &status,
        &claude_code,
        &PredefinedMenuItem::separator(),
        &proxy,
        &worker,
        &PredefinedMenuItem::separator(),
        &open,
        &copy,
        &login,
        &PredefinedMenuItem::separator(),
        &quit_item,
    ])
    .map_err(|e| e.to_string())?;
    let mut builder = TrayIconBuilder::new()
        .with_id(TRAY_ID)
        .with_tooltip("ModelRelay")
        .with_menu(Box::new(menu))
        .with_menu_on_left_click(true);
    if let Some(icon) = icon(TrayIconKind::Off) {
        builder = builder.with_icon(icon);
    }
    let tray = builder.build().map_err(|e| e.to_string())?;
    Ok(TrayParts {
        tray,
        status,
        claude_code,
        proxy,
        worker,
        login,
        shown: Some(TrayIconKind::Off),
    })
}

fn on_menu(shell: &mut Shell, id: &str) {
    // Opening the menu ran GTK's menu code again (~14 MB of it mapped back, measured): once the
    // click is handled the tray is idle again and lets go of it as after start.
    {
        let _entered = shell.runtime.enter();
        relay_core::resident::release_soon(relay_core::resident::release_loaded_code);
    }
    match id {
        "proxy" => toggle_role(shell, |roles| roles.proxy = !roles.proxy),
        "worker" => toggle_role(shell, |roles| roles.worker = !roles.worker),
        "open" | "claude" => open_dashboard(shell),
        "copy" => copy_url(shell),
        "login" => toggle_login(shell),
        "quit" => quit(shell),
        _ => {}
    }
}

/// Applies the node's current state to the tray. Also called after a menu action that may have
/// failed: GTK flips a check item's mark on click, whatever the outcome.
fn refresh_tray(shell: &mut Shell) {
    if shell.quitting {
        return;
    }
    let state = shell.node.state().borrow().clone();
    let view = tray_state::view(&state, &shell.node.url());
    if let Some(parts) = shell.tray.as_mut() {
        apply_view(parts, &view);
    }
}

fn apply_view(parts: &mut TrayParts, view: &TrayView) {
    // set_icon writes a file for the tray host on Linux: only when the variant changes.
    if parts.shown.replace(view.icon) != Some(view.icon) {
        if let Err(error) = parts.tray.set_icon(icon(view.icon)) {
            tracing::debug!(%error, "tray icon not updated");
        }
    }
    // Errors here mean the tray is gone (no tray host): nothing to show it on anyway.
    let _ = parts.tray.set_tooltip(Some(&view.tooltip));
    parts.status.set_text(&view.status_line);
    parts.claude_code.set_text(&view.claude_code_line);
    parts.proxy.set_checked(view.proxy_checked);
    parts.worker.set_checked(view.worker_checked);
}

fn toggle_role(shell: &Shell, change: impl FnOnce(&mut Roles)) {
    let node = shell.node.clone();
    let notifier = shell.notifier.clone();
    let events = shell.events.clone();
    let mut roles = node.roles();
    change(&mut roles);
    shell.runtime.spawn(async move {
        if let Err(error) = node.set_roles(roles).await {
            tracing::warn!(%error, ?roles, "roles not changed");
            notifier.notify(Message::new("Could not change roles", error.to_string()));
        }
        let _ = events.send_event(TrayEvent::Refresh);
    });
}

fn copy_url(shell: &Shell) {
    let url = shell.node.url();
    match shell.clipboard.copy(&url) {
        Ok(()) => {
            tracing::info!(%url, "relay URL copied");
            shell
                .notifier
                .notify(Message::new("Relay URL copied", url.clone()));
        }
        Err(error) => {
            tracing::warn!(%error, "clipboard unavailable");
            shell.notifier.notify(Message::new(
                "Could not copy the relay URL",
                format!("{url} ({error})"),
            ));
        }
    }
}

fn toggle_login(shell: &Shell) {
    let wanted = !shell.login.get().unwrap_or(false);
    if let Err(error) = shell.login.set(wanted) {
        tracing::warn!(%error, "start on login not changed");
        shell
            .notifier
            .notify(Message::new("Could not change Start on login", error));
    }
    // The watcher sets the mark on success; on failure undo GTK's flip here.
    if let Some(parts) = &shell.tray {
        parts
            .login
            .set_checked(shell.login.get().unwrap_or(!wanted));
    }
}

/// Shows the dashboard window: raises the open one, or starts the window process on a one-time
/// login link the node mints (the session is an `HttpOnly` cookie in that web view, so no script
/// of the page ever holds the admin token).
fn open_dashboard(shell: &Shell) {
    let node = &shell.node;
    let shown = shell.window.show(|| {
        node.login_link(relay_core::proxy::access::session::LINK_LIFETIME)
            .unwrap_or_else(|| format!("{}/", node.local_url()))
    });
    if let Err(error) = shown {
        tracing::warn!(%error, "dashboard window not opened");
        shell.notifier.notify(Message::new(
            "Could not open the dashboard",
            format!("{error}; it is at {}/", node.local_url()),
        ));
    }
}

/// Drains the node, then exits. The window goes away at once; the tray says what it waits for.
fn quit(shell: &mut Shell) {
    if std::mem::replace(&mut shell.quitting, true) {
        return;
    }
    tracing::info!("quitting: draining the node");
    if let Some(parts) = &shell.tray {
        parts.status.set_text(labels::QUITTING);
    }
    // The window shows the node's own page, which loses its server as the node drains.
    shell.window.close(WINDOW_CLOSE_GRACE);
    let node = shell.node.clone();
    let events = shell.events.clone();
    shell.runtime.spawn(async move {
        node.shutdown().await;
        let _ = events.send_event(TrayEvent::Drained);
    });
}

/// Live updates: node state → tray, node events → notifications, start-on-login changes from
/// the UI → the tray's check mark, SIGTERM/Ctrl-C → a graceful quit.
fn spawn_watchers(shell: &Shell, mut node_events: broadcast::Receiver<NodeEvent>) {
    let mut states = shell.node.state();
    let events = shell.events.clone();
    shell.runtime.spawn(async move {
        while states.changed().await.is_ok() {
            states.borrow_and_update();
            if events.send_event(TrayEvent::Refresh).is_err() {
                break;
            }
        }
    });

    let notifier = shell.notifier.clone();
    shell.runtime.spawn(async move {
        loop {
            match node_events.recv().await {
                Ok(event) => notifier.notify_event(&event),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "notifications skipped (burst of node events)")
                }
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    });

    let mut login_changes = shell.login.subscribe();
    let events = shell.events.clone();
    shell.runtime.spawn(async move {
        while login_changes.changed().await.is_ok() {
            let enabled = *login_changes.borrow_and_update();
            let _ = events.send_event(TrayEvent::Login(enabled));
        }
    });

    let events = shell.events.clone();
    shell.runtime.spawn(async move {
        relay_core::app::shutdown_signal().await;
        let _ = events.send_event(TrayEvent::Quit);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tray_icon_decodes_to_64_by_64_rgba() {
        for kind in [
            TrayIconKind::Off,
            TrayIconKind::Proxy,
            TrayIconKind::Worker,
            TrayIconKind::Error,
        ] {
            let (rgba, width, height) = decode_rgba(icon_png(kind)).unwrap();
            assert_eq!((width, height), (64, 64), "{kind:?}");
            assert_eq!(rgba.len(), 64 * 64 * 4, "{kind:?}");
        }
    }

    #[test]
    fn what_is_not_a_png_is_an_error() {
        assert!(decode_rgba(b"not a png").is_err());
    }
}
