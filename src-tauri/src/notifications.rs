//! Desktop notifications for node events (a worker joining or leaving, a model server found or
//! lost, errors that need the user).
//!
//! Showing a notification talks to the session's notification daemon (D-Bus on Linux), which can
//! be missing or slow. So notifications go through a bounded queue to one thread of their own:
//! the tray and the node never wait for it, a full queue drops the newest, and a failure is logged
//! (once as a warning, then at debug level) and otherwise ignored.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};

use relay_core::node::NodeEvent;

/// The application name notifications are filed under.
pub const APP_NAME: &str = "ModelRelay";

/// How many notifications may wait for the daemon before new ones are dropped.
const QUEUE: usize = 16;

/// A notification's title and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The title line.
    pub summary: String,
    /// The text under it.
    pub body: String,
}

impl Message {
    /// A message from a title and a body.
    pub fn new(summary: impl Into<String>, body: impl Into<String>) -> Self {
        Self {
            summary: summary.into(),
            body: body.into(),
        }
    }
}

/// The notification for a node event; every event kind is worth telling the user about.
pub fn message_for(event: &NodeEvent) -> Message {
    match event {
        NodeEvent::WorkerJoined { name, host } if host.is_empty() || host == name => {
            Message::new("Worker joined", format!("{name} is now serving models"))
        }
        NodeEvent::WorkerJoined { name, host } => Message::new(
            "Worker joined",
            format!("{name} ({host}) is now serving models"),
        ),
        NodeEvent::WorkerLeft { name } => {
            Message::new("Worker left", format!("{name} disconnected"))
        }
        NodeEvent::BackendFound { url, label } => {
            Message::new("Model server found", format!("{label} at {url}"))
        }
        NodeEvent::BackendLost { url } => Message::new(
            "Model server gone",
            format!("{url} stopped answering; its models are no longer offered"),
        ),
        NodeEvent::Error { message } => Message::new("ModelRelay needs attention", message),
    }
}

/// Shows notifications from a background thread; cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    queue: SyncSender<Message>,
}

impl Notifier {
    /// Starts the notification thread with the platform's notification service.
    pub fn spawn() -> Self {
        Self::spawn_with(show_native)
    }

    /// Starts the notification thread with `show` as the way to display one (tests pass a fake).
    pub fn spawn_with<F>(show: F) -> Self
    where
        F: Fn(&Message) -> Result<(), String> + Send + 'static,
    {
        let (queue, incoming) = sync_channel::<Message>(QUEUE);
        let spawned = std::thread::Builder::new()
            .name("notifications".into())
            .spawn(move || {
                let mut warned = false;
                for message in incoming {
                    match show(&message) {
                        Ok(()) => tracing::debug!(summary = %message.summary, "notification shown"),
                        // Headless sessions, CI and minimal desktops have no notification daemon:
                        // say so once, then stay quiet.
                        Err(error) if !warned => {
                            warned = true;
                            tracing::warn!(%error, "desktop notifications unavailable");
                        }
                        Err(error) => tracing::debug!(%error, "notification not shown"),
                    }
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "no notification thread; notifications are off");
        }
        Self { queue }
    }

    /// Queues a notification; never blocks.
    pub fn notify(&self, message: Message) {
        match self.queue.try_send(message) {
            Ok(()) => {}
            Err(TrySendError::Full(message)) => {
                tracing::debug!(summary = %message.summary, "notification queue full; dropped")
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Queues the notification for a node event.
    pub fn notify_event(&self, event: &NodeEvent) {
        self.notify(message_for(event));
    }
}

/// Shows one notification and waits for it at most `timeout`; for the last words of a process
/// that is about to exit (the queue's thread would die with it).
pub fn show_blocking(message: &Message, timeout: std::time::Duration) {
    let (done, finished) = std::sync::mpsc::channel();
    let message = message.clone();
    let spawned = std::thread::Builder::new()
        .name("notification".into())
        .spawn(move || {
            let _ = done.send(show_native(&message));
        });
    if spawned.is_ok() {
        if let Ok(Err(error)) = finished.recv_timeout(timeout) {
            tracing::debug!(%error, "notification not shown");
        }
    }
}

/// Shows one notification with the platform's service (D-Bus, Notification Center, toast).
fn show_native(message: &Message) -> Result<(), String> {
    notify_rust::Notification::new()
        .appname(APP_NAME)
        .summary(&message.summary)
        .body(&native_body(&message.body))
        .timeout(notify_rust::Timeout::Milliseconds(6_000))
        .show()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// `body` as the platform's notification service reads it. The freedesktop servers (Linux)
/// read a body as markup — links, images, bold — and worker names and URLs come from other
/// boxes, so `&`, `<` and `>` are escaped there; elsewhere a body is plain text.
fn native_body(body: &str) -> std::borrow::Cow<'_, str> {
    if cfg!(all(unix, not(target_os = "macos"))) {
        escape_markup(body)
    } else {
        std::borrow::Cow::Borrowed(body)
    }
}

/// `text` with the characters markup gives meaning to escaped.
fn escape_markup(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(['&', '<', '>']) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            c => escaped.push(c),
        }
    }
    std::borrow::Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_name_with_markup_is_shown_as_text() {
        let joined = message_for(&NodeEvent::WorkerJoined {
            name: "<a href=\"https://evil.example\">click</a> & <img src=x>".into(),
            host: "10.0.0.9".into(),
        });
        let shown = escape_markup(&joined.body);
        assert_eq!(
            shown,
            "&lt;a href=\"https://evil.example\"&gt;click&lt;/a&gt; &amp; &lt;img src=x&gt; \
             (10.0.0.9) is now serving models"
        );
        assert!(matches!(
            escape_markup("gpu-box is now serving models"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    #[test]
    fn messages_for_every_event() {
        let joined = message_for(&NodeEvent::WorkerJoined {
            name: "gpu-box".into(),
            host: "10.0.0.7".into(),
        });
        assert_eq!(
            joined,
            Message::new("Worker joined", "gpu-box (10.0.0.7) is now serving models")
        );
        let same_host = message_for(&NodeEvent::WorkerJoined {
            name: "gpu-box".into(),
            host: String::new(),
        });
        assert_eq!(same_host.body, "gpu-box is now serving models");
        assert_eq!(
            message_for(&NodeEvent::WorkerLeft {
                name: "gpu-box".into()
            }),
            Message::new("Worker left", "gpu-box disconnected")
        );
        assert_eq!(
            message_for(&NodeEvent::BackendFound {
                url: "http://127.0.0.1:11434".into(),
                label: "Ollama".into()
            }),
            Message::new("Model server found", "Ollama at http://127.0.0.1:11434")
        );
        assert!(message_for(&NodeEvent::BackendLost {
            url: "http://127.0.0.1:8000".into()
        })
        .body
        .starts_with("http://127.0.0.1:8000 stopped answering"));
        assert_eq!(
            message_for(&NodeEvent::Error {
                message: "port 8080 in use".into()
            }),
            Message::new("ModelRelay needs attention", "port 8080 in use")
        );
    }

    #[test]
    fn failing_service_never_blocks_or_panics() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen_in_thread = Arc::clone(&seen);
        let notifier = Notifier::spawn_with(move |m: &Message| {
            seen_in_thread.lock().unwrap().push(m.summary.clone());
            Err("org.freedesktop.Notifications was not provided".to_string())
        });
        for i in 0..3 {
            notifier.notify(Message::new(format!("n{i}"), "body"));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.lock().unwrap().len() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(*seen.lock().unwrap(), vec!["n0", "n1", "n2"]);
    }

    #[test]
    fn a_stuck_service_drops_instead_of_blocking() {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let wait = Mutex::new(wait);
        let notifier = Notifier::spawn_with(move |_m: &Message| {
            // The first call hangs like a daemon that never answers.
            let _ = wait.lock().unwrap().recv();
            Ok(())
        });
        let started = Instant::now();
        for i in 0..(QUEUE * 4) {
            notifier.notify(Message::new(format!("n{i}"), "body"));
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(release);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn real_service_without_a_session_bus_fails_fast() {
        // Only where there is no session bus at all (CI, ssh, containers): on a desktop this
        // would pop up a real notification.
        let uid = std::fs::read_to_string("/proc/self/loginuid").unwrap_or_default();
        let default_bus = format!("/run/user/{}/bus", uid.trim());
        if std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some()
            || std::path::Path::new(&default_bus).exists()
            || std::path::Path::new("/run/user/0/bus").exists()
        {
            return;
        }
        let started = Instant::now();
        let result = show_native(&Message::new("ModelRelay test", "notification check"));
        assert!(result.is_err());
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
