//! What the tray shows for a node state: which icon, the tooltip, the status line and the check
//! marks. Pure functions only, so every case is a unit test that needs no display.

use relay_core::node::{NodeState, WorkerState};
use relay_core::protocol::HardwareReport;

/// The tray icon variants, one per look; the PNGs are `icons/tray/*.png`, generated from
/// `icons/source.svg` by `scripts/desktop-icons.sh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrayIconKind {
    /// Neither role is running (or the worker is still looking for its proxy): greyed mark.
    Off,
    /// The proxy is up: blue dot.
    Proxy,
    /// This machine's worker is connected to a proxy: green dot.
    Worker,
    /// Something needs the user: red dot.
    Error,
}

/// Labels of the fixed menu entries; kept here so the tests and the menu use the same text.
pub mod labels {
    /// Check item: run the proxy role.
    pub const RUN_PROXY: &str = "Run proxy";
    /// Check item: run the worker role.
    pub const JOIN_AS_WORKER: &str = "Join as worker";
    /// Opens (or re-creates) the dashboard window.
    pub const OPEN_DASHBOARD: &str = "Open dashboard";
    /// Copies the relay URL to the clipboard.
    pub const COPY_URL: &str = "Copy relay URL";
    /// Check item: start the app when the user logs in.
    pub const START_ON_LOGIN: &str = "Start on login";
    /// Drains the node and exits.
    pub const QUIT: &str = "Quit";
    /// Status line while quitting (the node drains in-flight requests first).
    pub const QUITTING: &str = "Quitting: finishing requests…";
}

/// Everything the tray displays for one state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrayView {
    /// Which icon variant.
    pub icon: TrayIconKind,
    /// Hover text (not shown by every Linux tray host).
    pub tooltip: String,
    /// The disabled first menu line, e.g. `Proxy on :8080 · 2 workers · worker connected`.
    pub status_line: String,
    /// Check mark of "Run proxy".
    pub proxy_checked: bool,
    /// Check mark of "Join as worker".
    pub worker_checked: bool,
    /// The menu line naming the model Claude Code uses here (clicking it opens the dashboard,
    /// where it is picked).
    pub claude_code_line: String,
}

/// Longest model name shown in the Claude Code line (the menu does not wrap).
const MAX_MODEL_CHARS: usize = 40;

/// Longest error text shown in the menu; GTK menus do not wrap, so a long message would make the
/// whole menu as wide as the screen. The notification carries the full text.
const MAX_ERROR_CHARS: usize = 60;

/// Maps a node state (and the node's URL, for the port) to what the tray shows.
pub fn view(state: &NodeState, url: &str) -> TrayView {
    let icon = if state.error.is_some() {
        TrayIconKind::Error
    } else if state.roles.worker && state.worker == WorkerState::Connected {
        TrayIconKind::Worker
    } else if state.roles.proxy {
        TrayIconKind::Proxy
    } else {
        TrayIconKind::Off
    };
    let status_line = match &state.error {
        Some(message) => format!("Error: {}", truncate(message, MAX_ERROR_CHARS)),
        None => status_line(state, url),
    };
    let mut tooltip = format!("ModelRelay · {status_line}");
    if let Some(line) = state.hardware.as_ref().and_then(hardware_line) {
        tooltip.push('\n');
        tooltip.push_str(&line);
    }
    TrayView {
        icon,
        tooltip,
        status_line,
        proxy_checked: state.roles.proxy,
        worker_checked: state.roles.worker,
        claude_code_line: claude_code_line(state),
    }
}

/// `Claude Code uses MODEL`, or why it uses none here.
fn claude_code_line(state: &NodeState) -> String {
    match (&state.claude_code_model, state.roles.proxy) {
        (_, false) => "Claude Code: this box runs no proxy".to_string(),
        (Some(model), true) => format!("Claude Code uses {}", truncate(model, MAX_MODEL_CHARS)),
        (None, true) => "Claude Code: waiting for a chat model".to_string(),
    }
}

/// This box in one line: `CPU 12% · RAM 4.0/16 GiB · RTX 4090 18/24 GiB 71 °C`; `None` when
/// the sample holds nothing to show.
pub fn hardware_line(report: &HardwareReport) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(cpu) = report.cpu_percent {
        parts.push(format!("CPU {cpu}%"));
    }
    if let (Some(used), Some(total)) = (report.memory_used_mb, report.memory_total_mb) {
        parts.push(format!("RAM {}/{} GiB", gib(used), gib(total)));
    }
    for gpu in &report.gpus {
        // "NVIDIA GeForce RTX 4090" → "RTX 4090": the tooltip is short on room.
        let name = gpu
            .name
            .trim_start_matches("NVIDIA ")
            .trim_start_matches("GeForce ")
            .trim_start_matches("AMD ");
        let mut part = name.to_string();
        if let (Some(used), Some(total)) = (gpu.vram_used_mb, gpu.vram_total_mb) {
            part.push_str(&format!(" {}/{} GiB", gib(used), gib(total)));
        }
        if let Some(temperature) = gpu.temperature_c {
            part.push_str(&format!(" {temperature} °C"));
        }
        parts.push(part);
    }
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// MiB as GiB, one decimal below 10.
fn gib(mb: u64) -> String {
    let gib = mb as f64 / 1024.0;
    if gib < 10.0 {
        format!("{gib:.1}")
    } else {
        format!("{gib:.0}")
    }
}

/// The status line of a state without an error.
fn status_line(state: &NodeState, url: &str) -> String {
    let mut parts = Vec::new();
    if state.roles.proxy {
        match port_of(url) {
            Some(port) => parts.push(format!("Proxy on :{port}")),
            None => parts.push("Proxy on".to_string()),
        }
        parts.push(match state.workers_connected {
            1 => "1 worker".to_string(),
            n => format!("{n} workers"),
        });
    }
    if state.roles.worker {
        parts.push(
            match state.worker {
                WorkerState::Off => "worker off",
                WorkerState::Connecting => "worker connecting…",
                WorkerState::Connected => "worker connected",
                WorkerState::Disconnected => "worker disconnected, retrying",
                WorkerState::Drained => "worker drained by the proxy",
            }
            .to_string(),
        );
    }
    if parts.is_empty() {
        return "Off: turn on Run proxy or Join as worker".to_string();
    }
    parts.join(" · ")
}

/// The port of a `http://host:port[/...]` URL, if it has one.
pub fn port_of(url: &str) -> Option<u16> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let (_, port) = authority.rsplit_once(':')?;
    port.parse().ok()
}

/// At most `max` characters, with an ellipsis when cut (on a char boundary, never mid-UTF-8).
fn truncate(text: &str, max: usize) -> String {
    let text = text.trim();
    // Only the first line: a menu item is one line.
    let first_line = text.lines().next().unwrap_or_default().trim_end();
    if first_line.chars().count() <= max {
        return if first_line.len() < text.len() {
            format!("{first_line}…")
        } else {
            first_line.to_string()
        };
    }
    let cut: String = first_line.chars().take(max.saturating_sub(1)).collect();
    format!("{}…", cut.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_core::node::Roles;

    fn state(proxy: bool, worker: bool, ws: WorkerState, workers: usize) -> NodeState {
        NodeState {
            roles: Roles { proxy, worker },
            worker: ws,
            workers_connected: workers,
            error: None,
            hardware: None,
            claude_code_model: None,
        }
    }

    #[test]
    fn the_tooltip_shows_this_box_cpu_memory_and_gpus() {
        let mut s = state(false, true, WorkerState::Connected, 0);
        s.hardware = Some(HardwareReport {
            cpu_percent: Some(12),
            memory_used_mb: Some(4096),
            memory_total_mb: Some(16384),
            gpus: vec![relay_core::protocol::GpuReport {
                name: "NVIDIA GeForce RTX 4090".into(),
                vram_used_mb: Some(18211),
                vram_total_mb: Some(24564),
                utilization_percent: Some(97),
                temperature_c: Some(71),
            }],
        });
        let v = view(&s, URL);
        assert_eq!(
            v.tooltip,
            "ModelRelay · worker connected\nCPU 12% · RAM 4.0/16 GiB · RTX 4090 18/24 GiB 71 °C"
        );
        // A sample with nothing in it adds nothing.
        s.hardware = Some(HardwareReport::default());
        assert_eq!(view(&s, URL).tooltip, "ModelRelay · worker connected");
    }

    const URL: &str = "http://127.0.0.1:8080";

    #[test]
    fn both_roles_with_connected_worker() {
        let v = view(&state(true, true, WorkerState::Connected, 2), URL);
        assert_eq!(v.icon, TrayIconKind::Worker);
        assert_eq!(
            v.status_line,
            "Proxy on :8080 · 2 workers · worker connected"
        );
        assert_eq!(
            v.tooltip,
            "ModelRelay · Proxy on :8080 · 2 workers · worker connected"
        );
        assert!(v.proxy_checked && v.worker_checked);
    }

    #[test]
    fn proxy_only() {
        let v = view(&state(true, false, WorkerState::Off, 1), URL);
        assert_eq!(v.icon, TrayIconKind::Proxy);
        assert_eq!(v.status_line, "Proxy on :8080 · 1 worker");
        assert!(v.proxy_checked && !v.worker_checked);
    }

    #[test]
    fn proxy_up_while_own_worker_still_connecting_shows_proxy() {
        let v = view(&state(true, true, WorkerState::Connecting, 0), URL);
        assert_eq!(v.icon, TrayIconKind::Proxy);
        assert_eq!(
            v.status_line,
            "Proxy on :8080 · 0 workers · worker connecting…"
        );
    }

    #[test]
    fn worker_only_states() {
        let connected = view(
            &state(false, true, WorkerState::Connected, 0),
            "http://10.0.0.5:9000",
        );
        assert_eq!(connected.icon, TrayIconKind::Worker);
        assert_eq!(connected.status_line, "worker connected");
        let lost = view(&state(false, true, WorkerState::Disconnected, 0), URL);
        assert_eq!(lost.icon, TrayIconKind::Off);
        assert_eq!(lost.status_line, "worker disconnected, retrying");
    }

    #[test]
    fn nothing_running() {
        let v = view(&state(false, false, WorkerState::Off, 0), URL);
        assert_eq!(v.icon, TrayIconKind::Off);
        assert_eq!(v.status_line, "Off: turn on Run proxy or Join as worker");
        assert!(!v.proxy_checked && !v.worker_checked);
    }

    #[test]
    fn error_wins_and_is_shortened_to_one_line() {
        let mut s = state(true, true, WorkerState::Connected, 3);
        s.error = Some(format!(
            "cannot listen on 0.0.0.0:8080: {}\nsecond line",
            "x".repeat(80)
        ));
        let v = view(&s, URL);
        assert_eq!(v.icon, TrayIconKind::Error);
        assert!(v
            .status_line
            .starts_with("Error: cannot listen on 0.0.0.0:8080: xx"));
        assert!(v.status_line.ends_with('…'));
        assert_eq!(
            v.status_line.chars().count(),
            "Error: ".len() + MAX_ERROR_CHARS
        );
        assert!(!v.status_line.contains('\n'));
        // The roles' check marks still reflect what is configured.
        assert!(v.proxy_checked && v.worker_checked);
    }

    #[test]
    fn short_error_is_kept_whole() {
        let mut s = state(false, true, WorkerState::Disconnected, 0);
        s.error = Some("worker secret rejected by the proxy".into());
        assert_eq!(
            view(&s, URL).status_line,
            "Error: worker secret rejected by the proxy"
        );
    }

    #[test]
    fn truncation_respects_utf8() {
        assert_eq!(truncate("ééééé", 3), "éé…");
        assert_eq!(truncate("abc", 3), "abc");
    }

    #[test]
    fn ports_from_urls() {
        assert_eq!(port_of("http://127.0.0.1:8080"), Some(8080));
        assert_eq!(port_of("http://[::1]:8081/"), Some(8081));
        assert_eq!(port_of("https://relay.example.com/v1"), None);
        assert_eq!(port_of("127.0.0.1:9"), Some(9));
        let v = view(
            &state(true, false, WorkerState::Off, 0),
            "https://relay.example.com",
        );
        assert_eq!(v.status_line, "Proxy on · 0 workers");
    }

    #[test]
    fn menu_labels() {
        assert_eq!(labels::RUN_PROXY, "Run proxy");
        assert_eq!(labels::JOIN_AS_WORKER, "Join as worker");
        assert_eq!(labels::OPEN_DASHBOARD, "Open dashboard");
        assert_eq!(labels::COPY_URL, "Copy relay URL");
        assert_eq!(labels::START_ON_LOGIN, "Start on login");
        assert_eq!(labels::QUIT, "Quit");
    }

    #[test]
    fn the_menu_names_the_model_claude_code_uses() {
        let mut s = state(true, false, WorkerState::Off, 1);
        assert_eq!(
            view(&s, "http://127.0.0.1:8080").claude_code_line,
            "Claude Code: waiting for a chat model"
        );
        s.claude_code_model = Some("qwen2.5-coder-32b-instruct-q4_k_m".to_string());
        assert_eq!(
            view(&s, "http://127.0.0.1:8080").claude_code_line,
            "Claude Code uses qwen2.5-coder-32b-instruct-q4_k_m"
        );
        s.claude_code_model = Some("x".repeat(80));
        let line = view(&s, "http://127.0.0.1:8080").claude_code_line;
        assert!(line.ends_with('…') && line.chars().count() < 60, "{line}");
        s.roles.proxy = false;
        assert_eq!(
            view(&s, "http://127.0.0.1:8080").claude_code_line,
            "Claude Code: this box runs no proxy"
        );
    }
}
