//! "Copy relay URL": the system clipboard through `arboard` (X11/XWayland on Linux, AppKit, Win32).
//!
//! On X11 the copying program owns the clipboard's contents and must stay around to hand them
//! out: dropping the `arboard::Clipboard` right after `set_text` empties the clipboard again. So
//! one instance lives as long as the app, created on first use (no X connection until then).

use std::sync::Mutex;

/// The app's clipboard handle.
#[derive(Default)]
pub struct Clipboard {
    inner: Mutex<Option<arboard::Clipboard>>,
}

impl Clipboard {
    /// A handle that connects on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `text` on the clipboard.
    pub fn copy(&self, text: &str) -> Result<(), String> {
        let mut slot = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // A handle whose connection broke (X server restarted) fails every call: retry once
        // with a fresh one.
        for attempt in 0..2 {
            if slot.is_none() {
                *slot = Some(arboard::Clipboard::new().map_err(|e| e.to_string())?);
            }
            let result = slot
                .as_mut()
                .map(|clipboard| clipboard.set_text(text.to_owned()));
            match result {
                Some(Ok(())) => return Ok(()),
                Some(Err(error)) if attempt == 1 => return Err(error.to_string()),
                _ => *slot = None,
            }
        }
        Err("clipboard unavailable".to_string())
    }

    /// Reads the clipboard's text (for tests and diagnostics).
    pub fn text(&self) -> Result<String, String> {
        let mut slot = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(arboard::Clipboard::new().map_err(|e| e.to_string())?);
        }
        slot.as_mut()
            .map(|clipboard| clipboard.get_text().map_err(|e| e.to_string()))
            .unwrap_or_else(|| Err("clipboard unavailable".to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_round_trips_when_a_display_exists() {
        let clipboard = Clipboard::new();
        if cfg!(target_os = "linux")
            && std::env::var_os("DISPLAY").is_none()
            && std::env::var_os("WAYLAND_DISPLAY").is_none()
        {
            // Headless: the copy must fail cleanly, never panic.
            assert!(clipboard.copy("http://127.0.0.1:8080").is_err());
            return;
        }
        // Overwriting a developer's clipboard is rude: the round trip only runs when asked for
        // (e.g. `MODELRELAY_TEST_CLIPBOARD=1 xvfb-run -a cargo test -p relay-desktop`).
        if std::env::var_os("MODELRELAY_TEST_CLIPBOARD").is_none() {
            return;
        }
        clipboard.copy("http://127.0.0.1:8080").unwrap();
        assert_eq!(clipboard.text().unwrap(), "http://127.0.0.1:8080");
    }
}
