//! Saving settings: a patch from the form, the whole file, or the tray's role switches;
//! validated, guarded ([`super::guarded`]), written, then applied live where the node can.

use super::{guarded, locked, Node, NodeError, Roles};
use crate::proxy::ProxyConfig;
use crate::settings::{edit as settings, ProxySettings};

/// Who asks for a settings change.
pub enum Caller<'a> {
    /// Code of the program embedding the node (the desktop app's tray): trusted.
    Owner,
    /// A control-API request: its guarded changes ([`guarded`]) need the admin token in
    /// these headers.
    Request(&'a axum::http::HeaderMap),
}

impl Node {
    /// Turns roles on or off now and saves them to the config file.
    pub async fn set_roles(&self, roles: Roles) -> Result<(), NodeError> {
        let patch = serde_json::json!({"roles": {"proxy": roles.proxy, "worker": roles.worker}});
        self.save_settings(&patch, Caller::Owner).await.map(|_| ())
    }

    /// Refuses `caller`'s change from `old` to `new` when it touches a guarded setting and the
    /// caller has no admin token.
    pub(super) fn authorize(
        &self,
        caller: &Caller<'_>,
        old: &str,
        new: &str,
    ) -> Result<(), NodeError> {
        let Caller::Request(headers) = caller else {
            return Ok(());
        };
        let fields = guarded::changed(old, new);
        if fields.is_empty() {
            return Ok(());
        }
        let what = format!(
            "Changing {} (it decides which programs this node runs or where it sends secrets)",
            fields.join(", ")
        );
        self.inner
            .access
            .elevated(headers, &what)
            .map_err(NodeError::Forbidden)
    }

    /// Applies a settings patch (see [`settings::patch`]): validates, saves, and applies what
    /// can be applied live.
    pub async fn save_settings(
        &self,
        patch: &serde_json::Value,
        caller: Caller<'_>,
    ) -> Result<settings::Changes, NodeError> {
        let _one_at_a_time = self.inner.apply.lock().await;
        let path = &self.inner.config_path;
        let text = settings::read(path).map_err(|source| NodeError::File {
            path: path.clone(),
            source,
        })?;
        let (new_text, changes) = settings::patch(&text, patch).map_err(NodeError::Invalid)?;
        self.authorize(&caller, &text, &new_text)?;
        self.write_and_apply(&new_text, changes).await
    }

    /// Replaces the whole config file with `text` (validated first) and applies it.
    /// Secrets shown as [`settings::REDACTED`] keep their saved values.
    pub async fn save_config_text(
        &self,
        text: &str,
        caller: Caller<'_>,
    ) -> Result<settings::Changes, NodeError> {
        let _one_at_a_time = self.inner.apply.lock().await;
        let path = &self.inner.config_path;
        let old = settings::read(path).map_err(|source| NodeError::File {
            path: path.clone(),
            source,
        })?;
        let text = settings::restore_secrets(text, &old).map_err(NodeError::Invalid)?;
        settings::validate(&text).map_err(NodeError::Invalid)?;
        self.authorize(&caller, &old, &text)?;
        let changes = settings::diff(&old, &text);
        self.write_and_apply(&text, changes).await
    }

    pub(super) async fn write_and_apply(
        &self,
        text: &str,
        changes: settings::Changes,
    ) -> Result<settings::Changes, NodeError> {
        let path = &self.inner.config_path;
        if !changes.fields.is_empty() {
            settings::write(path, text).map_err(|source| NodeError::File {
                path: path.clone(),
                source,
            })?;
            tracing::info!(path = %path.display(), changed = ?changes.fields, "settings saved");
        }
        let file = settings::validate(text).map_err(NodeError::Invalid)?;
        if changes.touches_any(settings::LIVE_PROXY_FIELDS) {
            // Resolved as at start (flags and environment over the file), then applied.
            let resolved = ProxySettings::resolve(&file, &self.inner.overrides)
                .map_err(|e| NodeError::Invalid(e.to_string()))?;
            let config = ProxyConfig::from_settings(resolved, self.inner.secret.clone());
            self.inner.aliases.replace(config.aliases);
            for provider in config.providers {
                self.inner.hub.set_limits(&provider.name, provider.limits);
            }
            tracing::info!("model aliases and queue limits applied");
            self.publish();
        }
        {
            let mut pending = locked(&self.inner.restart_required);
            for field in changes.needing_restart() {
                if !pending.contains(&field) {
                    pending.push(field);
                }
            }
        }
        // A role the file leaves unset stays as it runs (it may come from the command line).
        let running = self.roles();
        let roles = Roles {
            proxy: file.roles.proxy.unwrap_or(running.proxy),
            worker: file.roles.worker.unwrap_or(running.worker),
        };
        if changes.touches("worker") && roles.worker && self.roles().worker {
            // New connection or backend settings: a fresh worker picks them up.
            self.stop_worker().await;
        }
        self.apply_roles(roles, &file)?;
        Ok(changes)
    }
}
