//! The commands the web UI calls through `window.__TAURI__.core.invoke`. Everything else the UI
//! needs it gets over HTTP from the node URL, exactly as in a browser.

use serde::Serialize;
use tauri::{Builder, Runtime, State};

use crate::autostart::LoginSetting;

/// Where the UI finds the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RelayInfo {
    /// The node's base URL, e.g. `http://127.0.0.1:8080`.
    pub url: String,
    /// The admin token for the node's admin API, when one is configured.
    pub admin_token: Option<String>,
}

/// State the commands read; managed by the app.
pub struct DesktopState {
    /// Where the node is.
    pub info: RelayInfo,
    /// The start-on-login entry.
    pub login: LoginSetting,
}

/// `relay_info` → `{"url": "...", "admin_token": "..." | null}`.
#[tauri::command]
fn relay_info(state: State<'_, DesktopState>) -> RelayInfo {
    state.info.clone()
}

/// `get_start_on_login` → `true`/`false`; rejects with the OS's error text.
#[tauri::command]
fn get_start_on_login(state: State<'_, DesktopState>) -> Result<bool, String> {
    state.login.get()
}

/// `set_start_on_login {enabled}` → the state read back from the OS; rejects with its error.
#[tauri::command]
fn set_start_on_login(state: State<'_, DesktopState>, enabled: bool) -> Result<bool, String> {
    state.login.set(enabled)
}

/// Registers the state and the commands. Shared by the real app and the mock-runtime tests, so
/// the tests exercise exactly what the UI calls.
pub fn configure<R: Runtime>(builder: Builder<R>, state: DesktopState) -> Builder<R> {
    builder
        .manage(state)
        .invoke_handler(tauri::generate_handler![
            relay_info,
            get_start_on_login,
            set_start_on_login
        ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autostart::fake::FakeLoginItem;
    use serde_json::{json, Value};
    use std::sync::Arc;
    use tauri::ipc::{CallbackFn, InvokeBody};
    use tauri::test::{get_ipc_response, mock_builder, mock_context, noop_assets, INVOKE_KEY};
    use tauri::webview::InvokeRequest;
    use tauri::WebviewWindowBuilder;

    fn app(login: FakeLoginItem) -> tauri::App<tauri::test::MockRuntime> {
        let state = DesktopState {
            info: RelayInfo {
                url: "http://127.0.0.1:18080".into(),
                admin_token: Some("tok".into()),
            },
            login: LoginSetting::new(Arc::new(login)),
        };
        configure(mock_builder(), state)
            .build(mock_context(noop_assets()))
            .expect("mock app")
    }

    fn invoke(
        app: &tauri::App<tauri::test::MockRuntime>,
        cmd: &str,
        body: Value,
    ) -> Result<Value, Value> {
        let webview = match app.get_webview_window("main") {
            Some(w) => w,
            None => WebviewWindowBuilder::new(app, "main", Default::default())
                .build()
                .expect("mock window"),
        };
        get_ipc_response(
            &webview,
            InvokeRequest {
                cmd: cmd.into(),
                callback: CallbackFn(0),
                error: CallbackFn(1),
                url: "tauri://localhost".parse().unwrap(),
                body: InvokeBody::Json(body),
                headers: Default::default(),
                invoke_key: INVOKE_KEY.to_string(),
            },
        )
        .map(|b| b.deserialize::<Value>().unwrap())
    }

    use tauri::Manager;

    #[test]
    fn relay_info_returns_url_and_token() {
        let app = app(FakeLoginItem::default());
        assert_eq!(
            invoke(&app, "relay_info", json!({})).unwrap(),
            json!({"url": "http://127.0.0.1:18080", "admin_token": "tok"})
        );
    }

    #[test]
    fn relay_info_without_token_is_null() {
        let state = DesktopState {
            info: RelayInfo {
                url: "http://127.0.0.1:1".into(),
                admin_token: None,
            },
            login: LoginSetting::new(Arc::new(FakeLoginItem::default())),
        };
        let app = configure(mock_builder(), state)
            .build(mock_context(noop_assets()))
            .unwrap();
        assert_eq!(
            invoke(&app, "relay_info", json!({})).unwrap(),
            json!({"url": "http://127.0.0.1:1", "admin_token": null})
        );
    }

    #[test]
    fn start_on_login_round_trip() {
        let app = app(FakeLoginItem::default());
        assert_eq!(
            invoke(&app, "get_start_on_login", json!({})).unwrap(),
            json!(false)
        );
        assert_eq!(
            invoke(&app, "set_start_on_login", json!({"enabled": true})).unwrap(),
            json!(true)
        );
        assert_eq!(
            invoke(&app, "get_start_on_login", json!({})).unwrap(),
            json!(true)
        );
        assert_eq!(
            invoke(&app, "set_start_on_login", json!({"enabled": false})).unwrap(),
            json!(false)
        );
    }

    #[test]
    fn start_on_login_failure_rejects_with_the_reason() {
        let app = app(FakeLoginItem {
            fail: true,
            ..Default::default()
        });
        assert_eq!(
            invoke(&app, "set_start_on_login", json!({"enabled": true})).unwrap_err(),
            json!("permission denied")
        );
    }

    #[test]
    fn missing_argument_and_unknown_command_are_errors() {
        let app = app(FakeLoginItem::default());
        assert!(invoke(&app, "set_start_on_login", json!({})).is_err());
        assert!(invoke(&app, "no_such_command", json!({})).is_err());
    }
}
