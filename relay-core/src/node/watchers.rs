//! What the node watches and tells: the dashboard's node info and the tray state, workers
//! joining and leaving, model servers appearing and going on this machine, and the LAN
//! announcement of a reachable proxy.

use std::time::Duration;

use super::{locked, same_proxy, Node, NodeEvent, NodeState, WorkerState};
use crate::discovery::{self, DiscoveredBackend, DiscoveryOptions};
use crate::lan;
use crate::proxy::observation::control::OwnWorker;

/// How often local backends are looked for, while someone listens for node events (the tray's
/// "model server found" notifications): each scan is a few loopback connects.
const BACKEND_SCAN_PERIOD: Duration = Duration::from_secs(30);

impl Node {
    /// Local backend discovery as this node does it: the well-known ports, or
    /// `MODELRELAY_DISCOVERY_PORTS` (a comma-separated list), never this node's own port.
    pub fn discovery_options(&self) -> DiscoveryOptions {
        let mut options = DiscoveryOptions::default();
        if let Some(ports) = std::env::var("MODELRELAY_DISCOVERY_PORTS")
            .ok()
            .map(|v| parse_ports(&v))
        {
            options.ports = ports;
        }
        options.exclude_ports.push(self.inner.addr.port());
        options
    }

    /// Local backends and LAN proxies, looked for at the same time, for the dashboard.
    pub async fn discover(&self) -> (Vec<DiscoveredBackend>, Vec<lan::LanProxy>) {
        let mut options = self.discovery_options();
        // Which found servers the owner confirmed, as the file says now (the worker gets the
        // same list from its settings; the background scan needs none).
        if let Ok(file) = super::load(&self.inner.config_path) {
            options.confirmed = file.worker.confirmed_backends.unwrap_or_default();
        }
        let own = self.url();
        let (backends, mut proxies) = tokio::join!(
            discovery::discover(&options),
            lan::browse(Duration::from_millis(1500))
        );
        proxies.retain(|p| !same_proxy(&p.url, &own));
        (backends, proxies)
    }

    /// Recomputes the dashboard's node info and the tray state from the roles and the worker.
    pub(super) fn publish(&self) {
        let roles = self.roles();
        let has_worker = locked(&self.inner.worker).is_some();
        self.inner.info.send_modify(|info| {
            info.roles = roles;
            if !has_worker {
                info.worker = OwnWorker {
                    state: WorkerState::Off,
                    proxy_url: None,
                    name: None,
                    last_error: None,
                    hardware: None,
                };
                info.lifecycle.clear();
            }
        });
        let info = self.inner.info.borrow().clone();
        let workers_connected = self.inner.hub.counts().0;
        let claude_code_model = locked(&self.inner.proxy)
            .as_ref()
            .and_then(|proxy| proxy.names.claude_code().model);
        let error = match info.worker.state {
            WorkerState::Disconnected => info
                .worker
                .last_error
                .clone()
                .map(|e| format!("worker cannot reach its proxy: {e}")),
            _ => None,
        };
        self.inner.state.send_if_modified(|state| {
            let next = NodeState {
                roles,
                worker: info.worker.state,
                workers_connected,
                error,
                hardware: info.worker.hardware.clone(),
                claude_code_model,
            };
            let changed = *state != next;
            if changed {
                if let (Some(message), true) = (&next.error, next.error != state.error) {
                    let _ = self.inner.events.send(NodeEvent::Error {
                        message: message.clone(),
                    });
                }
                *state = next;
            }
            changed
        });
    }

    pub(super) fn update_announcement(&self, proxy_on: bool) {
        let mut announcement = locked(&self.inner.announcement);
        // Only a proxy others can reach is worth announcing.
        let wanted = proxy_on && !self.inner.addr.ip().is_loopback();
        match (wanted, announcement.is_some()) {
            (true, false) => {
                match lan::announce(
                    &lan::host_name(),
                    self.inner.addr.port(),
                    &self.inner.provider,
                    self.inner.fingerprint,
                ) {
                    Ok(handle) => *announcement = Some(handle),
                    Err(error) => {
                        tracing::warn!("cannot announce this proxy on the LAN: {error}")
                    }
                }
            }
            (false, true) => {
                if let Some(handle) = announcement.take() {
                    drop(handle);
                }
            }
            _ => {}
        }
    }

    /// Watches the hub for workers joining, leaving and changing models, and (while anyone listens for events)
    /// this machine for model servers appearing and going.
    pub(super) fn spawn_watchers(&self) {
        let node = self.clone();
        // Woken by workers joining and leaving only, never by a clock: an idle node sleeps.
        let mut roster = self.inner.hub.telemetry().roster_changes();
        let workers = tokio::spawn(async move {
            let mut known: Vec<(String, String)> = Vec::new();
            loop {
                roster.borrow_and_update();
                let current: Vec<(String, String)> = node
                    .inner
                    .hub
                    .workers()
                    .into_iter()
                    .map(|w| (w.id, w.name))
                    .collect();
                for (id, name) in &current {
                    if !known.iter().any(|(k, _)| k == id) {
                        let host = node
                            .inner
                            .hub
                            .telemetry()
                            .worker(id)
                            .map(|r| r.host)
                            .unwrap_or_default();
                        let _ = node.inner.events.send(NodeEvent::WorkerJoined {
                            name: name.clone(),
                            host,
                        });
                    }
                }
                for (id, name) in &known {
                    if !current.iter().any(|(c, _)| c == id) {
                        let _ = node
                            .inner
                            .events
                            .send(NodeEvent::WorkerLeft { name: name.clone() });
                    }
                }
                known = current;
                node.publish();
                if roster.changed().await.is_err() {
                    return;
                }
            }
        });
        let node = self.clone();
        let backends = tokio::spawn(async move {
            let mut known: Option<Vec<DiscoveredBackend>> = None;
            let mut tick = tokio::time::interval(BACKEND_SCAN_PERIOD);
            loop {
                tick.tick().await;
                if node.inner.events.receiver_count() == 0 {
                    continue;
                }
                let found = discovery::discover(&node.discovery_options()).await;
                if let Some(before) = &known {
                    for backend in &found {
                        if !before.iter().any(|b| b.url == backend.url) {
                            let _ = node.inner.events.send(NodeEvent::BackendFound {
                                url: backend.url.clone(),
                                label: backend.kind.label().to_string(),
                            });
                        }
                    }
                    for backend in before {
                        if !found.iter().any(|b| b.url == backend.url) {
                            let _ = node.inner.events.send(NodeEvent::BackendLost {
                                url: backend.url.clone(),
                            });
                        }
                    }
                }
                known = Some(found);
            }
        });
        locked(&self.inner.background).extend([workers, backends]);
    }
}

pub(super) fn parse_ports(value: &str) -> Vec<u16> {
    value
        .split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn discovery_ports_parse_from_a_comma_list() {
        assert_eq!(parse_ports("1234, 8000,x,"), vec![1234, 8000]);
    }
}
