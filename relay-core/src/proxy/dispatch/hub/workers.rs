//! The hub's side of a worker's life: registering, load and model reports, leaving, being
//! drained, and the proxy's own shutdown.

use super::*;

impl Hub {
    /// Whether workers may join `provider` right now.
    pub fn check_provider(&self, provider: &str) -> Result<(), RegisterError> {
        self.lock().scheduler.check_provider(provider)
    }

    /// A worker sent `register`.
    pub fn register_worker(
        &self,
        provider: &str,
        message: &RegisterMessage,
        address: IpAddr,
    ) -> Result<Joined, RegisterError> {
        let (outbound, receiver) = mpsc::unbounded_channel();
        let mut inner = self.lock();
        if inner.drained_names.contains(&message.worker_name) {
            return Err(RegisterError::Drained);
        }
        let mut registered = inner.scheduler.register_worker(provider, message)?;
        let mac = match message
            .mac_address
            .as_deref()
            .map(str::parse::<crate::wake::MacAddress>)
        {
            None => None,
            Some(Ok(mac)) => Some(mac),
            Some(Err(error)) => {
                registered.warnings.push(format!(
                    "mac_address ignored ({error}): this box cannot be woken by Wake-on-LAN"
                ));
                None
            }
        };
        // The name as the scheduler cleaned it: what the dashboard shows, bounded in length.
        let name = inner
            .scheduler
            .worker_name(registered.worker)
            .unwrap_or_default()
            .to_string();
        let woke = inner.sleepers.woke(&name, mac);
        // How long it took, for cost routing to weigh waking it next time.
        for attempt in woke.iter().filter_map(|s| s.waking) {
            let took = unix_ms().saturating_sub(attempt.since_unix_ms);
            (inner.scheduler).learn_wake(&name, Duration::from_millis(took));
            inner.measured.send_modify(|generation| *generation += 1);
        }
        if !woke.is_empty() {
            inner.sync_asleep();
            log_woke(&woke, &name);
        }
        let sleep = SleepInfo {
            name,
            provider: provider.to_string(),
            mac,
            address,
            sleeps_when_idle: message.sleeps_when_idle == Some(true),
            models: registered.models.clone(),
            announced_sleep: false,
        };
        let forwards_client_auth = self
            .settings
            .client_auth_providers
            .iter()
            .any(|p| p == provider);
        inner.links.insert(
            registered.worker,
            WorkerLink {
                outbound,
                forwards_client_auth,
                sleep,
            },
        );
        inner.execute(registered.actions);
        Ok(Joined {
            worker: registered.worker,
            ack: RegisterAck {
                worker_id: worker_wire_id(registered.worker),
                models: registered.models,
                warnings: registered.warnings,
                protocol_version: Some(
                    message
                        .protocol_version
                        .clone()
                        .unwrap_or_else(|| BRIDGE_PROTOCOL_VERSION.to_string()),
                ),
            },
            outbound: receiver,
        })
    }

    /// A worker connection ended: requeue or fail what it was running.
    pub fn worker_gone(&self, worker: WorkerId) {
        self.worker_left(worker, Departure::ProxyClosed);
    }

    /// A worker connection ended this way: requeue or fail what it was running, and remember
    /// its box as asleep if it said it was going to sleep, or it sleeps when idle and left on
    /// its own (closed or went silent) with models to serve. An admin-drained worker never is.
    pub fn worker_left(&self, worker: WorkerId, departure: Departure) {
        let mut inner = self.lock();
        let now = Instant::now();
        if let Some(link) = inner.links.remove(&worker) {
            let info = link.sleep;
            let asleep = info.announced_sleep
                || (info.sleeps_when_idle && departure != Departure::ProxyClosed);
            if asleep && !inner.drained_names.contains(&info.name) {
                let remembered = inner.sleepers.fell_asleep(
                    &info.name,
                    &info.provider,
                    Card {
                        mac: info.mac,
                        address: Some(info.address),
                    },
                    info.models.clone(),
                    now,
                    unix_ms(),
                );
                if remembered {
                    inner.sync_asleep();
                    tracing::info!(worker = %worker_wire_id(worker), name = %info.name, models = ?info.models, mac = ?info.mac.map(|m| m.to_string()), "box asleep: its models stay listed and wake it");
                }
            }
        }
        let actions = inner.scheduler.worker_gone(worker, now);
        inner.execute(actions);
        drop(inner);
        self.telemetry.worker_left(&worker_wire_id(worker));
    }

    /// An admin drains a connected worker (by wire id): no new work; it is closed once idle and
    /// refused if it rejoins under the same name. False if no such worker is connected.
    pub fn drain_worker(&self, wire_id: &str) -> bool {
        let Some(id) = parse_worker_wire_id(wire_id) else {
            return false;
        };
        let mut inner = self.lock();
        let Some(name) = inner.scheduler.worker_name(id).map(str::to_string) else {
            return false;
        };
        inner.drained_names.insert(name.clone());
        // Told first, so the worker finishes its requests and stays away (a `graceful_shutdown`
        // without `reconnect` is the seeds' drain; the name check stops one that is restarted).
        let frame = ServerToWorker::GracefulShutdown(GracefulShutdownMessage {
            reason: Some(
                "drained by an admin of the proxy; it may rejoin after the proxy restarts"
                    .to_string(),
            ),
            drain_timeout_secs: Some(self.settings.drain_timeout.as_secs()),
            reconnect: None,
        })
        .to_json();
        inner.send(id, Outbound::Frame(frame.into()));
        let actions = inner.scheduler.drain_worker(id);
        inner.execute(actions);
        drop(inner);
        tracing::info!(worker = wire_id, name, "worker drained by an admin");
        self.telemetry.touch();
        true
    }

    /// A worker reported its load (and, ours, its models' states: see `Scheduler::set_model_states`).
    pub fn update_load(
        &self,
        worker: WorkerId,
        load: u32,
        model_states: Option<&[ModelStateReport]>,
    ) {
        let mut inner = self.lock();
        if let Some(states) = model_states {
            inner.scheduler.set_model_states(worker, states);
        }
        let actions = inner.scheduler.update_load(worker, load);
        inner.execute(actions);
        drop(inner);
        self.telemetry.touch();
    }

    /// A worker sent `models_update`; returns the accepted models and warnings. With
    /// `going_to_sleep` the models it served until now are kept for its box's sleep.
    pub fn update_models(
        &self,
        worker: WorkerId,
        update: &crate::protocol::ModelsUpdateMessage,
    ) -> (Vec<String>, Vec<String>) {
        let going_to_sleep = update.going_to_sleep == Some(true);
        let mut inner = self.lock();
        let (accepted, warnings, actions) = inner.scheduler.update_models(
            worker,
            &update.models,
            update.current_load,
            update.context_windows.as_ref(),
            update.warm_ups.as_deref(),
            Instant::now(),
        );
        inner
            .scheduler
            .set_sides_first(worker, update.sides_first.as_deref());
        if let Some(states) = &update.model_states {
            inner.scheduler.set_model_states(worker, states);
        }
        if let Some(link) = inner.links.get_mut(&worker) {
            if going_to_sleep {
                link.sleep.announced_sleep = true;
                if !accepted.is_empty() {
                    link.sleep.models = accepted.clone();
                }
            } else {
                link.sleep.models = accepted.clone();
            }
        }
        inner.execute(actions);
        drop(inner);
        self.telemetry.touch();
        self.telemetry.models_changed();
        (accepted, warnings)
    }

    /// Asks every worker to re-read its backend's models; returns how many were asked.
    pub fn refresh_models(&self, reason: &str) -> usize {
        let frame: Utf8Bytes = ServerToWorker::ModelsRefresh(ModelsRefreshMessage {
            reason: Some(reason.to_string()),
        })
        .to_json()
        .into();
        let inner = self.lock();
        for link in inner.links.values() {
            let _ = link.outbound.send(Outbound::Frame(frame.clone()));
        }
        inner.links.len()
    }

    /// Starts the proxy's drain: refuse new work, fail queued requests, and send
    /// `graceful_shutdown` to every worker, saying the proxy stops rather than sending them
    /// away (`reconnect`), so ours come back by themselves when it is up again. Returns how many
    /// requests are still running.
    pub fn begin_shutdown(&self, reason: &str) -> usize {
        let frame: Utf8Bytes = ServerToWorker::GracefulShutdown(GracefulShutdownMessage {
            reason: Some(reason.to_string()),
            drain_timeout_secs: Some(self.settings.drain_timeout.as_secs()),
            reconnect: Some(true),
        })
        .to_json()
        .into();
        let mut inner = self.lock();
        let (actions, workers) = inner.scheduler.begin_shutdown();
        for worker in workers {
            inner.send(worker, Outbound::Frame(frame.clone()));
        }
        inner.execute(actions);
        tracing::info!("graceful shutdown: draining workers");
        inner.scheduler.in_flight_count()
    }

    /// Closes every worker connection; what they were running fails or is requeued as usual.
    pub fn close_all_workers(&self, reason: &str) {
        let inner = self.lock();
        for link in inner.links.values() {
            let _ = link.outbound.send(Outbound::Close(reason.to_string()));
        }
    }
}
