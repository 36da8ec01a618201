//! The tray app: the node runs in-process on Tauri's tokio runtime, the tray shows its state and
//! switches its roles, the window shows the web UI, notifications report what happens.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relay_core::cli::Cli;
use relay_core::node::start_on_login::StartOnLogin;
use relay_core::node::{Node, NodeEvent, NodeOptions, Roles};
use tauri::image::Image;
use tauri::menu::{CheckMenuItem, Menu, MenuEvent, MenuItem, PredefinedMenuItem};
use tauri::tray::{TrayIcon, TrayIconBuilder};
use tauri::{AppHandle, Manager, RunEvent, WebviewUrl, WebviewWindowBuilder};
use tokio::sync::broadcast;

use crate::autostart::{LoginItem, LoginSetting, OsLoginItem};
use crate::clipboard::Clipboard;
use crate::launch::init_logging;
use crate::notifications::{self, Message, Notifier};
use crate::tray_state::{self, labels, TrayIconKind, TrayView};

/// Label of the dashboard window; `capabilities/default.json` grants it the core JS APIs.
pub const MAIN_WINDOW: &str = "main";
const TRAY_ID: &str = "modelrelay";

// Decoded at compile time (tauri's include_image!), so a broken icon is a build error and the
// app needs no PNG decoder at runtime.
const ICON_OFF: Image<'static> = tauri::include_image!("../icons/tray/off.png");
const ICON_PROXY: Image<'static> = tauri::include_image!("../icons/tray/proxy.png");
const ICON_WORKER: Image<'static> = tauri::include_image!("../icons/tray/worker.png");
const ICON_ERROR: Image<'static> = tauri::include_image!("../icons/tray/error.png");

fn icon(kind: TrayIconKind) -> Image<'static> {
    match kind {
        TrayIconKind::Off => ICON_OFF,
        TrayIconKind::Proxy => ICON_PROXY,
        TrayIconKind::Worker => ICON_WORKER,
        TrayIconKind::Error => ICON_ERROR,
    }
}

/// The running app's parts that the tray, the watchers and the exit handler share.
struct Shell {
    node: Node,
    notifier: Notifier,
    clipboard: Clipboard,
    /// Set by the first quit request: later ones (a second click, SIGTERM) do nothing more.
    quitting: AtomicBool,
    /// Set once the node has drained: the exit that follows is let through.
    drained: AtomicBool,
}

/// The menu entries whose text or check mark changes, and the icon last shown (set_icon on
/// Linux writes a file for the tray host, so it is only called when the variant changes).
struct TrayParts {
    tray: TrayIcon,
    status: MenuItem<tauri::Wry>,
    claude_code: MenuItem<tauri::Wry>,
    proxy: CheckMenuItem<tauri::Wry>,
    worker: CheckMenuItem<tauri::Wry>,
    login: CheckMenuItem<tauri::Wry>,
    shown: Mutex<Option<TrayIconKind>>,
}

/// Starts the node, then the tray app; returns when the app exits.
pub fn run(cli: Cli, hidden: bool) -> ExitCode {
    // Before any thread or the display exists (see the module's docs for why).
    crate::rendering::prefer_software_rendering();
    init_logging(cli.log_level.as_deref());
    // Every `modelrelay` flag applies (listen address, secret, worker settings, ...); the
    // roles come from the config file, where the tray's check items save them.
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
        tauri::async_runtime::block_on(Node::start(options)).map_err(Into::into)
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
    let events = node.events();
    tracing::info!(url = %node.url(), "node started; opening the tray app");
    let shell = Shell {
        node: node.clone(),
        notifier: Notifier::spawn(),
        clipboard: Clipboard::new(),
        quitting: AtomicBool::new(false),
        drained: AtomicBool::new(false),
    };

    // No commands: the window shows the node's own page and talks to it over HTTP only.
    let app = tauri::Builder::default()
        .manage(login.clone())
        .manage(shell)
        .setup(move |app| {
            let handle = app.handle().clone();
            build_tray(&handle, &login)?;
            refresh_tray(&handle);
            spawn_watchers(&handle, events, login);
            if !hidden {
                open_dashboard(&handle);
            }
            Ok(())
        })
        .build(tauri::generate_context!());
    let app = match app {
        Ok(app) => app,
        Err(error) => {
            eprintln!("modelrelay-desktop: cannot start the window system: {error}");
            tauri::async_runtime::block_on(node.shutdown());
            return ExitCode::FAILURE;
        }
    };
    let code = app.run_return(|app, event| match event {
        RunEvent::ExitRequested { code, api, .. } => {
            let shell = app.state::<Shell>();
            if code.is_none() {
                // The last window closed: a tray app keeps running (Tauri would exit).
                api.prevent_exit();
            } else if !shell.drained.load(Ordering::SeqCst) {
                // An exit we did not start (OS logout, Cmd+Q): drain the node first.
                api.prevent_exit();
                quit(app);
            }
        }
        #[cfg(target_os = "macos")]
        RunEvent::Reopen { .. } => open_dashboard(app),
        _ => {}
    });
    ExitCode::from(u8::try_from(code).unwrap_or(1))
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

fn build_tray(app: &AppHandle, login: &LoginSetting) -> tauri::Result<()> {
    let status = MenuItem::with_id(app, "status", "Starting…", false, None::<&str>)?;
    // Enabled: clicking it opens the dashboard, where the model is picked.
    let claude_code = MenuItem::with_id(app, "claude", "Claude Code", true, None::<&str>)?;
    let proxy = CheckMenuItem::with_id(app, "proxy", labels::RUN_PROXY, true, false, None::<&str>)?;
    let worker = CheckMenuItem::with_id(
        app,
        "worker",
        labels::JOIN_AS_WORKER,
        true,
        false,
        None::<&str>,
    )?;
    let open = MenuItem::with_id(app, "open", labels::OPEN_DASHBOARD, true, None::<&str>)?;
    let copy = MenuItem::with_id(app, "copy", labels::COPY_URL, true, None::<&str>)?;
    let login_item = CheckMenuItem::with_id(
        app,
        "login",
        labels::START_ON_LOGIN,
        true,
        login.get().unwrap_or(false),
        None::<&str>,
    )?;
    let quit_item = MenuItem::with_id(app, "quit", labels::QUIT, true, None::<&str>)?;
    let menu = Menu::with_items(
        app,
        &[
            &status,
            &claude_code,
            &PredefinedMenuItem::separator(app)?,
            &proxy,
            &worker,
            &PredefinedMenuItem::separator(app)?,
            &open,
            &copy,
            &login_item,
            &PredefinedMenuItem::separator(app)?,
            &quit_item,
        ],
    )?;
    let tray = TrayIconBuilder::with_id(TRAY_ID)
        .icon(ICON_OFF)
        .tooltip("ModelRelay")
        .menu(&menu)
        .show_menu_on_left_click(true)
        .on_menu_event(on_menu_event)
        .build(app)?;
    app.manage(TrayParts {
        tray,
        status,
        claude_code,
        proxy,
        worker,
        login: login_item,
        shown: Mutex::new(None),
    });
    Ok(())
}

fn on_menu_event(app: &AppHandle, event: MenuEvent) {
    match event.id.as_ref() {
        "proxy" => toggle_role(app, |roles| roles.proxy = !roles.proxy),
        "worker" => toggle_role(app, |roles| roles.worker = !roles.worker),
        "open" | "claude" => open_dashboard(app),
        "copy" => copy_url(app),
        "login" => toggle_login(app),
        "quit" => quit(app),
        _ => {}
    }
}

/// Applies the node's current state to the tray. Also called after a menu action that may have
/// failed: GTK flips a check item's mark on click, whatever the outcome.
fn refresh_tray(app: &AppHandle) {
    let (Some(shell), Some(parts)) = (app.try_state::<Shell>(), app.try_state::<TrayParts>())
    else {
        return;
    };
    if shell.quitting.load(Ordering::SeqCst) {
        return;
    }
    let state = shell.node.state().borrow().clone();
    apply_view(&parts, &tray_state::view(&state, &shell.node.url()));
}

fn apply_view(parts: &TrayParts, view: &TrayView) {
    // The lock is released before set_icon: tray calls wait for the main thread, which must
    // never find this lock held.
    let icon_changed = {
        let mut shown = parts.shown.lock().unwrap_or_else(|p| p.into_inner());
        shown.replace(view.icon) != Some(view.icon)
    };
    if icon_changed {
        if let Err(error) = parts.tray.set_icon(Some(icon(view.icon))) {
            tracing::debug!(%error, "tray icon not updated");
        }
    }
    // Errors here mean the tray is gone (no tray host): nothing to show it on anyway.
    let _ = parts.tray.set_tooltip(Some(&view.tooltip));
    let _ = parts.status.set_text(&view.status_line);
    let _ = parts.claude_code.set_text(&view.claude_code_line);
    let _ = parts.proxy.set_checked(view.proxy_checked);
    let _ = parts.worker.set_checked(view.worker_checked);
}

fn toggle_role(app: &AppHandle, change: impl FnOnce(&mut Roles)) {
    let shell = app.state::<Shell>();
    let node = shell.node.clone();
    let notifier = shell.notifier.clone();
    let mut roles = node.roles();
    change(&mut roles);
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        if let Err(error) = node.set_roles(roles).await {
            tracing::warn!(%error, ?roles, "roles not changed");
            notifier.notify(Message::new("Could not change roles", error.to_string()));
        }
        refresh_tray(&app);
    });
}

fn copy_url(app: &AppHandle) {
    let shell = app.state::<Shell>();
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

fn toggle_login(app: &AppHandle) {
    let login = app.state::<LoginSetting>();
    let wanted = !login.get().unwrap_or(false);
    if let Err(error) = login.set(wanted) {
        tracing::warn!(%error, "start on login not changed");
        app.state::<Shell>()
            .notifier
            .notify(Message::new("Could not change Start on login", error));
    }
    // The watcher sets the mark on success; on failure undo GTK's flip here.
    if let Some(parts) = app.try_state::<TrayParts>() {
        let _ = parts.login.set_checked(login.get().unwrap_or(!wanted));
    }
}

/// Shows the dashboard window, creating it again if it was closed (closing destroys it, which
/// frees the web view's memory while the app sits in the tray).
///
/// The window shows the node's own page, opened through a one-time login link the app mints
/// itself: the session is an `HttpOnly` cookie in the web view, so no script of the page ever
/// holds the admin token, and the page has no channel into the app but the node's HTTP API.
pub fn open_dashboard(app: &AppHandle) {
    if let Some(window) = app.get_webview_window(MAIN_WINDOW) {
        let _ = window.show();
        let _ = window.unminimize();
        let _ = window.set_focus();
        return;
    }
    let node = &app.state::<Shell>().node;
    let address = node
        .login_link(relay_core::proxy::access::session::LINK_LIFETIME)
        .unwrap_or_else(|| format!("{}/", node.local_url()));
    let url = match address.parse() {
        Ok(url) => url,
        Err(error) => {
            tracing::warn!(%error, %address, "dashboard window not opened");
            return;
        }
    };
    let built = WebviewWindowBuilder::new(app, MAIN_WINDOW, WebviewUrl::External(url))
        .title("ModelRelay")
        .inner_size(1100.0, 760.0)
        .min_inner_size(720.0, 480.0)
        .build();
    if let Err(error) = built {
        tracing::warn!(%error, "dashboard window not opened");
    }
}

/// Drains the node, then exits. The window goes away at once; the tray says what it waits for.
fn quit(app: &AppHandle) {
    let shell = app.state::<Shell>();
    if shell.quitting.swap(true, Ordering::SeqCst) {
        return;
    }
    tracing::info!("quitting: draining the node");
    if let Some(parts) = app.try_state::<TrayParts>() {
        let _ = parts.status.set_text(labels::QUITTING);
    }
    // Destroyed now, while the event loop runs, not torn down at exit: the window shows the
    // node's own page, which loses its server as the node drains, and WebKitGTK tearing a web
    // view down inside the process's exit once crashed the app (exit 139 in the smoke test).
    for window in app.webview_windows().values() {
        let _ = window.destroy();
    }
    let node = shell.node.clone();
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        node.shutdown().await;
        app.state::<Shell>().drained.store(true, Ordering::SeqCst);
        app.exit(0);
    });
}

/// Live updates: node state → tray, node events → notifications, start-on-login changes from
/// the UI → the tray's check mark, SIGTERM/Ctrl-C → a graceful quit.
fn spawn_watchers(
    app: &AppHandle,
    mut events: broadcast::Receiver<NodeEvent>,
    login: LoginSetting,
) {
    let shell = app.state::<Shell>();

    let mut states = shell.node.state();
    let handle = app.clone();
    tauri::async_runtime::spawn(async move {
        // The first pass shows the state at subscription time; then every change.
        loop {
            states.borrow_and_update();
            refresh_tray(&handle);
            if states.changed().await.is_err() {
                break;
            }
        }
    });

    let notifier = shell.notifier.clone();
    tauri::async_runtime::spawn(async move {
        loop {
            match events.recv().await {
                Ok(event) => notifier.notify_event(&event),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "notifications skipped (burst of node events)")
                }
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    });

    let mut login_changes = login.subscribe();
    let handle = app.clone();
    tauri::async_runtime::spawn(async move {
        while login_changes.changed().await.is_ok() {
            let enabled = *login_changes.borrow_and_update();
            if let Some(parts) = handle.try_state::<TrayParts>() {
                let _ = parts.login.set_checked(enabled);
            }
        }
    });

    let handle = app.clone();
    tauri::async_runtime::spawn(async move {
        relay_core::app::shutdown_signal().await;
        quit(&handle);
    });
}
