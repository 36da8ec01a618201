//! "Start on login": an XDG autostart entry on Linux, a LaunchAgent on macOS, a `Run` registry
//! value on Windows (the `auto-launch` crate). The OS entry itself is the stored setting, so there
//! is nothing to keep in sync in a file of our own.

use std::sync::Arc;

use tokio::sync::watch;

/// The flag the login entry starts the app with: tray only, no window.
pub const HIDDEN_FLAG: &str = "--hidden";

/// Reads and changes the OS's start-on-login entry for this app.
pub trait LoginItem: Send + Sync {
    /// Whether the app starts on login.
    fn is_enabled(&self) -> Result<bool, String>;
    /// Adds or removes the entry.
    fn set_enabled(&self, enabled: bool) -> Result<(), String>;
}

/// The real entry, through `auto-launch`.
pub struct OsLoginItem {
    inner: auto_launch::AutoLaunch,
}

impl OsLoginItem {
    /// The entry for the running executable, started with [`HIDDEN_FLAG`].
    pub fn for_current_exe() -> Result<Self, String> {
        Self::new("ModelRelay", &launch_path()?)
    }

    /// The entry named `name` that runs `path`.
    pub fn new(name: &str, path: &str) -> Result<Self, String> {
        let inner = auto_launch::AutoLaunchBuilder::new()
            .set_app_name(name)
            .set_app_path(path)
            .set_args(&[HIDDEN_FLAG])
            // Per user: the default tries the machine-wide key first, which needs admin rights.
            .set_windows_enable_mode(auto_launch::WindowsEnableMode::CurrentUser)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { inner })
    }
}

impl LoginItem for OsLoginItem {
    fn is_enabled(&self) -> Result<bool, String> {
        self.inner.is_enabled().map_err(|e| e.to_string())
    }

    fn set_enabled(&self, enabled: bool) -> Result<(), String> {
        let result = if enabled {
            self.inner.enable()
        } else {
            self.inner.disable()
        };
        result.map_err(|e| e.to_string())
    }
}

/// What the login entry should run. Inside an AppImage the executable lives in a temporary mount
/// that is gone after logout, so the AppImage file itself ($APPIMAGE) is the thing to start.
fn launch_path() -> Result<String, String> {
    if let Some(appimage) = std::env::var_os("APPIMAGE") {
        return Ok(appimage.to_string_lossy().into_owned());
    }
    std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| format!("cannot find the running executable: {e}"))
}

/// The start-on-login setting shared by the dashboard (through the node) and the tray: one place that changes it
/// and a watch channel that tells the tray's check item about changes made from the UI.
#[derive(Clone)]
pub struct LoginSetting {
    item: Arc<dyn LoginItem>,
    changed: Arc<watch::Sender<bool>>,
}

impl LoginSetting {
    /// Wraps an entry; reads its current state once (an unreadable entry counts as off).
    pub fn new(item: Arc<dyn LoginItem>) -> Self {
        let now = item.is_enabled().unwrap_or(false);
        Self {
            item,
            changed: Arc::new(watch::channel(now).0),
        }
    }

    /// Whether the app starts on login.
    pub fn get(&self) -> Result<bool, String> {
        self.item.is_enabled()
    }

    /// Turns it on or off and returns the state read back from the OS.
    pub fn set(&self, enabled: bool) -> Result<bool, String> {
        self.item.set_enabled(enabled)?;
        let now = self.item.is_enabled()?;
        self.changed.send_replace(now);
        Ok(now)
    }

    /// Changes as they happen, for the tray's check item.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changed.subscribe()
    }
}

/// The dashboard reaches the entry through the node's HTTP API (`/api/start-on-login`): the
/// window needs no channel into the app.
impl relay_core::node::start_on_login::LoginEntry for LoginSetting {
    fn enabled(&self) -> Result<bool, String> {
        self.get()
    }
    fn set_enabled(&self, enabled: bool) -> Result<bool, String> {
        self.set(enabled)
    }
}

#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use std::sync::Mutex;

    /// An in-memory entry for tests.
    #[derive(Default)]
    pub struct FakeLoginItem {
        pub enabled: Mutex<bool>,
        pub fail: bool,
    }

    impl LoginItem for FakeLoginItem {
        fn is_enabled(&self) -> Result<bool, String> {
            Ok(*self.enabled.lock().unwrap())
        }
        fn set_enabled(&self, enabled: bool) -> Result<(), String> {
            if self.fail {
                return Err("permission denied".into());
            }
            *self.enabled.lock().unwrap() = enabled;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeLoginItem;
    use super::*;

    #[test]
    fn set_reports_and_broadcasts_the_new_state() {
        let setting = LoginSetting::new(Arc::new(FakeLoginItem::default()));
        let mut changes = setting.subscribe();
        assert_eq!(setting.get(), Ok(false));
        assert_eq!(setting.set(true), Ok(true));
        assert!(changes.has_changed().unwrap());
        assert!(*changes.borrow_and_update());
        assert_eq!(setting.set(false), Ok(false));
        assert!(!*changes.borrow_and_update());
    }

    #[test]
    fn failure_is_an_error_and_changes_nothing() {
        let setting = LoginSetting::new(Arc::new(FakeLoginItem {
            fail: true,
            ..Default::default()
        }));
        let changes = setting.subscribe();
        assert_eq!(setting.set(true), Err("permission denied".to_string()));
        assert!(!changes.has_changed().unwrap());
    }
}
