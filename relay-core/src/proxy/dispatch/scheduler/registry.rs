//! Who serves what: providers' limits, workers registering, changing their models and load,
//! and sleeping boxes' models kept claimed.

use super::*;

impl Scheduler {
    /// Replaces `provider`'s limits while it runs (settings saved on the dashboard): later
    /// arrivals get them, requests already queued keep the deadlines they were given. False
    /// for a provider this scheduler does not have (new providers need a restart).
    pub fn set_limits(&mut self, provider: &str, limits: ProviderLimits) -> bool {
        match self.provider_index(provider) {
            Some(index) => {
                self.providers[index].limits = limits;
                true
            }
            None => false,
        }
    }

    pub(super) fn provider_index(&self, name: &str) -> Option<usize> {
        self.providers.iter().position(|p| p.name == name)
    }

    /// Whether workers may join `provider` (it exists and is enabled).
    pub fn check_provider(&self, provider: &str) -> Result<(), RegisterError> {
        let index = self
            .provider_index(provider)
            .ok_or(RegisterError::UnknownProvider)?;
        if !self.providers[index].limits.enabled {
            return Err(RegisterError::ProviderDisabled);
        }
        if self.shutting_down {
            return Err(RegisterError::ShuttingDown);
        }
        Ok(())
    }

    /// A worker sent `register`: sanitize, add it to routing, and hand it queued work.
    pub fn register_worker(
        &mut self,
        provider: &str,
        message: &RegisterMessage,
    ) -> Result<Registered, RegisterError> {
        self.check_provider(provider)?;
        let provider_index = self.provider_index(provider).expect("checked above");
        let limit = self.providers[provider_index].limits.max_models_per_worker;
        let (models, mut warnings) = sanitize_models(&message.models, limit);
        let max_concurrent = if message.max_concurrent == 0 {
            warnings.push("max_concurrent 0 is not usable; treated as 1".to_string());
            1
        } else {
            message.max_concurrent
        };
        let name = worker_display_name(&message.worker_name, &mut warnings);
        if models.is_empty() {
            warnings.push(
                "no usable model advertised: nothing is routed to this worker until it sends \
                 models_update"
                    .to_string(),
            );
        }
        if self.workers.values().any(|w| w.name == name) {
            warnings.push(format!(
                "another connected worker is also named \"{name}\"; logs and the dashboard tell \
                 them apart only by id (give each machine its own name)"
            ));
        }
        let worker_id = self.next_worker;
        self.next_worker += 1;
        let models: Vec<Arc<str>> = models.into_iter().map(Arc::from).collect();
        self.index_models(provider_index, worker_id, &models);
        let windows = windows_of(&models, message.context_windows.as_ref());
        let speeds = self.known_speeds.recall(&name);
        self.workers.insert(
            worker_id,
            Worker {
                provider: provider_index,
                name,
                models: models.clone(),
                max_concurrent,
                in_flight: HashSet::new(),
                external_load: message.current_load.unwrap_or(0),
                draining: false,
                windows,
                speeds,
                cold: HashMap::new(),
                loading: HashMap::new(),
                sides_first: Vec::new(),
            },
        );
        self.observe_warm_ups(worker_id, message.warm_ups.as_deref());
        self.set_sides_first(worker_id, message.sides_first.as_deref());
        let mut actions = Vec::new();
        self.fill_worker(worker_id, &mut actions);
        Ok(Registered {
            worker: worker_id,
            models: models.iter().map(|m| m.to_string()).collect(),
            warnings,
            actions,
        })
    }

    /// The largest context window among the workers serving `model`, when every one of them
    /// reported its own (else `None`: some window is unknown, so nothing is too long).
    pub fn context_limit(&self, model: &str) -> Option<u32> {
        let mut largest = None;
        for provider in &self.providers {
            for id in provider.model_workers.get(model).into_iter().flatten() {
                let window = *self.workers[id].windows.get(model)?;
                largest = largest.max(Some(window));
            }
        }
        largest
    }

    pub(super) fn index_models(&mut self, provider: usize, worker: WorkerId, models: &[Arc<str>]) {
        let p = &mut self.providers[provider];
        for model in models {
            p.lingering.remove(model);
            p.model_workers
                .entry(model.clone())
                .or_default()
                .push(worker);
        }
    }

    pub(super) fn unindex_models(
        &mut self,
        provider: usize,
        worker: WorkerId,
        models: &[Arc<str>],
        now: Instant,
    ) {
        let p = &mut self.providers[provider];
        let linger_until = now + p.limits.queue_timeout;
        for model in models {
            if let Some(list) = p.model_workers.get_mut(model) {
                list.retain(|w| *w != worker);
                if list.is_empty() {
                    p.model_workers.remove(model);
                    p.lingering.insert(model.clone(), linger_until);
                }
            }
        }
        p.lingering.retain(|_, until| *until > now);
    }

    /// The warm-ups a worker reported (`register`, `models_update`): the speeds of models it
    /// serves where none were measured ([`Scheduler::observe_warm_up`]).
    fn observe_warm_ups(&mut self, worker: WorkerId, warm_ups: Option<&[WarmUp]>) {
        for warm_up in warm_ups.unwrap_or_default() {
            self.observe_warm_up(worker, &warm_up.model, &warm_up.timings);
        }
    }

    /// The models whose backend evaluates `worker`'s side requests first, as it last said
    /// (`register`, `models_update`: absent is none).
    pub fn set_sides_first(&mut self, worker: WorkerId, models: Option<&[String]>) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.sides_first = models
                .unwrap_or_default()
                .iter()
                .map(|model| Arc::from(model.as_str()))
                .collect();
        }
    }

    /// A worker sent `models_update`: replace its models and hand it newly compatible work.
    /// Returns the sanitized list, warnings and actions.
    pub fn update_models(
        &mut self,
        worker: WorkerId,
        models: &[String],
        current_load: u32,
        windows: Option<&crate::protocol::ContextWindows>,
        warm_ups: Option<&[WarmUp]>,
        now: Instant,
    ) -> (Vec<String>, Vec<String>, Vec<Action>) {
        let Some(entry) = self.workers.get(&worker) else {
            return (Vec::new(), Vec::new(), Vec::new());
        };
        let provider = entry.provider;
        let old = entry.models.clone();
        let (accepted, warnings) = sanitize_models(
            models,
            self.providers[provider].limits.max_models_per_worker,
        );
        let accepted_arcs: Vec<Arc<str>> = accepted.iter().map(|m| Arc::from(m.as_str())).collect();
        self.unindex_models(provider, worker, &old, now);
        self.index_models(provider, worker, &accepted_arcs);
        let entry = self.workers.get_mut(&worker).expect("present");
        entry.windows = windows_of(&accepted_arcs, windows);
        entry.models = accepted_arcs;
        entry.external_load = current_load.saturating_sub(entry.in_flight.len() as u32);
        self.observe_warm_ups(worker, warm_ups);
        let mut actions = Vec::new();
        self.fill_worker(worker, &mut actions);
        (accepted, warnings, actions)
    }

    /// A worker reported its load in `pong`. Load beyond what this proxy has running on it (work
    /// from elsewhere) counts against its capacity; a lower report frees capacity at once.
    pub fn update_load(&mut self, worker: WorkerId, current_load: u32) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(entry) = self.workers.get_mut(&worker) {
            entry.external_load = current_load.saturating_sub(entry.in_flight.len() as u32);
            self.fill_worker(worker, &mut actions);
        }
        actions
    }

    /// Resolves which provider takes a request for `model` right now: the first whose workers
    /// serve it, else the first that claims it (lists it, or its last worker left moments ago),
    /// else the default provider (the first, where workers join without `?provider=`), where it
    /// waits for a worker that serves it (walkthrough §7: a provider with no worker for the
    /// model queues). `None` only for a name no worker could ever advertise (see
    /// [`sanitize_models`]) or a proxy without providers.
    pub(super) fn route(&mut self, model: &str, now: Instant) -> Option<usize> {
        if unusable_name(model).is_some() {
            return None;
        }
        let serving = self
            .providers
            .iter()
            .position(|p| p.model_workers.contains_key(model));
        serving
            .or_else(|| self.providers.iter().position(|p| p.claims(model, now)))
            .or_else(|| (!self.providers.is_empty()).then_some(0))
    }

    /// Whether some provider claims `model` at `now`: a worker serves it, a provider lists it, or
    /// its last worker left moments ago. An unclaimed model still queues (at the default
    /// provider), but aliases and upstreams get the first say over it.
    pub fn is_claimed(&self, model: &str, now: Instant) -> bool {
        self.providers
            .iter()
            .any(|p| p.model_workers.contains_key(model) || p.claims(model, now))
    }

    /// Whether a connected worker serves `model` (busy or not).
    pub fn is_served(&self, model: &str) -> bool {
        self.providers
            .iter()
            .any(|p| p.model_workers.contains_key(model))
    }

    /// Stop routing new work to `worker`; it is closed once idle.
    pub fn drain_worker(&mut self, worker: WorkerId) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(w) = self.workers.get_mut(&worker) {
            w.draining = true;
            if w.in_flight.is_empty() {
                actions.push(Action::CloseDrained { worker });
            }
        }
        actions
    }

    /// `worker` refused `request` as beyond its `max_concurrent` (`worker_busy`): the proxy's
    /// view of its load was wrong (a report still on its way, or a worker that counts
    /// differently). It is full until it reports its load again, and the request goes back to
    /// the queue without the refusal counting towards [`MAX_REQUEUE_COUNT`] (nothing failed:
    /// it was not taken), so a race cannot exhaust a request's requeues in a microsecond.
    pub fn refused_as_busy(
        &mut self,
        worker: WorkerId,
        request: RequestId,
        now: Instant,
        actions: &mut Vec<Action>,
    ) -> bool {
        if !self.give_back_slot(worker, request) {
            return false;
        }
        if let Some(w) = self.workers.get_mut(&worker) {
            w.external_load = w.max_concurrent.saturating_sub(w.in_flight.len() as u32);
        }
        let before = self
            .requests
            .get_mut(&request)
            .map(|r| std::mem::take(&mut r.requeues));
        self.requeue_or_fail(request, now, actions);
        if let (Some(r), Some(before)) = (self.requests.get_mut(&request), before) {
            r.requeues = before;
        }
        true
    }
}
