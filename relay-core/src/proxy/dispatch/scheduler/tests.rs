//! One test per scheduling rule of the behavior contract, with time as an input.

use crate::proxy::dispatch::scheduler::*;

fn limits() -> ProviderLimits {
    ProviderLimits {
        max_queue_len: 3,
        queue_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(300),
        max_models_per_worker: 4,
        enabled: true,
        models: Vec::new(),
    }
}

fn scheduler() -> Scheduler {
    Scheduler::new(vec![("local".to_string(), limits())])
}

pub(super) fn register(s: &mut Scheduler, name: &str, models: &[&str], max: u32) -> Registered {
    s.register_worker(
        "local",
        &RegisterMessage {
            warm_ups: None,
            sides_first: None,
            worker_name: name.to_string(),
            models: models.iter().map(|m| m.to_string()).collect(),
            max_concurrent: max,
            protocol_version: Some("1".to_string()),
            current_load: Some(0),
            mac_address: None,
            sleeps_when_idle: None,
            context_windows: None,
        },
    )
    .expect("registered")
}

/// Submits with the next id, as the hub does.
fn submit(s: &mut Scheduler, model: &str, now: Instant) -> Result<Submitted, SubmitError> {
    thread_local!(static NEXT: std::cell::Cell<RequestId> = const { std::cell::Cell::new(1) });
    let id = NEXT.with(|n| {
        let id = n.get();
        n.set(id + 1);
        id
    });
    s.submit(id, model, Placement::default(), now)
}

fn dispatched_to(s: Submitted) -> WorkerId {
    match s {
        Submitted::Dispatched { worker, .. } => worker,
        other => panic!("expected dispatch, got {other:?}"),
    }
}

#[test]
fn registration_trims_drops_empty_dedupes_in_order_and_caps_with_warnings() {
    let mut s = scheduler();
    let r = register(
        &mut s,
        " box ",
        &[" a ", "", "b", "a", "  ", "c", "d", "e", "f"],
        2,
    );
    assert_eq!(r.models, vec!["a", "b", "c", "d"]);
    assert!(r
        .warnings
        .iter()
        .any(|w| w.contains("duplicate model \"a\"")));
    assert!(r.warnings.iter().any(|w| w.contains("2 empty")));
    assert!(r.warnings.iter().any(|w| w.contains("truncated to 4")));
    assert_eq!(s.workers()[0].name, "box");
}

#[test]
fn oversized_or_control_character_names_are_dropped_and_warnings_stay_short() {
    let long = "m".repeat(MAX_NAME_BYTES + 1);
    let longest = "m".repeat(MAX_NAME_BYTES);
    let mut models = vec![
        long.as_str(),
        "a\nINFO forged log line",
        longest.as_str(),
        "b",
    ];
    let copies = vec!["b"; 100_000];
    models.extend(copies);
    let r = register(&mut s_with_many_models(), &"w".repeat(10_000), &models, 1);
    assert_eq!(r.models, vec![longest.clone(), "b".to_string()]);
    assert!(r.warnings.len() <= 12, "{:?}", r.warnings.len());
    let text = r.warnings.join("\n");
    assert!(
        text.contains("1 model name(s) longer than 256 bytes dropped"),
        "{text}"
    );
    assert!(
        text.contains("1 model name(s) with control characters dropped"),
        "{text}"
    );
    assert!(
        text.contains("99992 more duplicate model name(s) dropped"),
        "{text}"
    );
    assert!(
        text.contains("worker name cut to 256 bytes (10000 given)"),
        "{text}"
    );
    assert!(
        text.len() < 4096,
        "warnings are a few lines: {}",
        text.len()
    );
}

#[test]
fn a_worker_name_is_cut_at_a_character_boundary_and_loses_its_control_characters() {
    let mut s = scheduler();
    let name = format!("{}\u{e9}", "x".repeat(MAX_NAME_BYTES - 1));
    register(&mut s, &name, &["a"], 1);
    assert_eq!(s.workers()[0].name, "x".repeat(MAX_NAME_BYTES - 1));
    register(&mut s, "box\r\n1", &["a"], 1);
    assert_eq!(s.workers()[1].name, "box??1");
}

fn s_with_many_models() -> Scheduler {
    let mut limits = limits();
    limits.max_models_per_worker = 256;
    Scheduler::new(vec![("local".to_string(), limits)])
}

#[test]
fn worker_never_gains_models_beyond_the_acknowledged_list() {
    let mut s = scheduler();
    let w = register(&mut s, "w", &["a", "b", "c", "d", "e"], 1).worker;
    let now = Instant::now();
    assert!(matches!(
        submit(&mut s, "e", now),
        Ok(Submitted::Queued { .. })
    ));
    assert_eq!(s.workers[&w].in_flight.len(), 0, "e never reaches w");
}

#[test]
fn a_model_no_worker_serves_queues_at_the_default_provider_until_one_announces_it() {
    let mut s = Scheduler::new(vec![
        ("local".to_string(), limits()),
        ("other".to_string(), limits()),
    ]);
    let now = Instant::now();
    let queued = submit(&mut s, "llama3-8b", now).unwrap();
    assert!(matches!(queued, Submitted::Queued { .. }));
    assert_eq!(s.queue_depths()[0], ("local".to_string(), 1));
    let r = register(&mut s, "late", &["llama3-8b"], 1);
    assert_eq!(
        r.actions,
        vec![Action::Dispatch {
            request: queued.request(),
            worker: r.worker
        }]
    );
}

#[test]
fn names_no_worker_could_advertise_are_unknown_at_once() {
    let mut s = scheduler();
    let now = Instant::now();
    let long = "m".repeat(MAX_NAME_BYTES + 1);
    assert_eq!(submit(&mut s, &long, now), Err(SubmitError::UnknownModel));
    assert_eq!(submit(&mut s, "a\nb", now), Err(SubmitError::UnknownModel));
    assert_eq!(s.tracked_requests(), 0);
}

#[test]
fn random_model_names_share_the_queue_bound_and_leave_no_queue_behind() {
    let mut s = scheduler();
    let now = Instant::now();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            submit(&mut s, &format!("random-{i}"), now)
                .unwrap()
                .request(),
        );
    }
    assert!(matches!(
        submit(&mut s, "random-3", now),
        Err(SubmitError::QueueFull { .. })
    ));
    s.cancel(ids[0]);
    assert!(s
        .expire_queued(ids[1], now + Duration::from_secs(30))
        .is_some());
    assert!(matches!(
        submit(&mut s, "random-4", now),
        Ok(Submitted::Queued { .. })
    ));
    assert_eq!(s.queue_depth(), 2);
    assert_eq!(
        s.providers[0].queue.fifo_count(),
        2,
        "one queue per waiting model"
    );
}

fn placed(client: &str, priority: Priority) -> Placement {
    Placement {
        client: Some(Arc::from(client)),
        priority,
        ..Placement::default()
    }
}

/// A scheduler with room in its queue and one worker of one slot serving `m`.
fn one_slot() -> (Scheduler, WorkerId) {
    let mut roomy = limits();
    roomy.max_queue_len = 100;
    let mut s = Scheduler::new(vec![("local".to_string(), roomy)]);
    let w = register(&mut s, "w", &["m"], 1).worker;
    (s, w)
}

/// Finishes `running` on `w`; returns the one request the freed slot took.
fn finish_and_take_next(s: &mut Scheduler, w: WorkerId, running: RequestId) -> RequestId {
    let mut actions = Vec::new();
    assert!(s.finish(w, running, &mut actions));
    let [Action::Dispatch { request, .. }] = actions[..] else {
        panic!("one dispatch, got {actions:?}");
    };
    request
}

#[test]
fn a_freed_slot_serves_interactive_work_first_and_takes_turns_between_clients() {
    let (mut s, w) = one_slot();
    let now = Instant::now();
    let interactive = Priority::Interactive;
    let submitted = s.submit(1, "m", placed("flood", interactive), now);
    assert_eq!(dispatched_to(submitted.unwrap()), w);
    for id in 2..=20 {
        s.submit(id, "m", placed("flood", interactive), now)
            .unwrap();
    }
    s.submit(21, "m", placed("agent", Priority::Batch), now)
        .unwrap();
    s.submit(22, "m", placed("person", interactive), now)
        .unwrap();
    assert_eq!(s.queue_depth(), 21);
    let mut order = Vec::new();
    let mut running = 1;
    for _ in 0..4 {
        running = finish_and_take_next(&mut s, w, running);
        order.push(running);
    }
    assert_eq!(
        order,
        [22, 2, 3, 4],
        "the person's request goes at the first turn (the flood had one), batch waits"
    );
    assert_eq!(s.queue_depth(), 17);
    assert_eq!(s.queue_depths(), vec![("local".to_string(), 17)]);
}

#[test]
fn batch_work_on_a_busy_worker_still_runs_within_the_ageing_bound() {
    let (mut s, w) = one_slot();
    let now = Instant::now();
    s.submit(1, "m", placed("a", Priority::Interactive), now)
        .unwrap();
    s.submit(2, "m", placed("agent", Priority::Batch), now)
        .unwrap();
    for id in 3..40 {
        s.submit(id, "m", placed("a", Priority::Interactive), now)
            .unwrap();
    }
    let mut running = 1;
    let mut turns = 0;
    while running != 2 {
        running = finish_and_take_next(&mut s, w, running);
        turns += 1;
    }
    assert_eq!(
        turns,
        BATCH_AGEING_TURNS + 1,
        "eight interactive turns, then batch"
    );
}

#[test]
fn unknown_and_disabled_providers_are_rejected() {
    let mut disabled = limits();
    disabled.enabled = false;
    let s = Scheduler::new(vec![
        ("local".to_string(), limits()),
        ("off".to_string(), disabled),
    ]);
    assert_eq!(
        s.check_provider("nope"),
        Err(RegisterError::UnknownProvider)
    );
    assert_eq!(
        s.check_provider("off"),
        Err(RegisterError::ProviderDisabled)
    );
    assert_eq!(s.check_provider("local"), Ok(()));
}

#[test]
fn routes_only_to_workers_that_advertise_the_exact_model() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["llama3-8b"], 4).worker;
    register(&mut s, "b", &["llama3-8B"], 4);
    let now = Instant::now();
    for _ in 0..3 {
        assert_eq!(dispatched_to(submit(&mut s, "llama3-8b", now).unwrap()), a);
    }
}

#[test]
fn dispatch_prefers_lowest_load_and_round_robins_ties() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 4).worker;
    let b = register(&mut s, "b", &["m"], 4).worker;
    let now = Instant::now();
    let first = dispatched_to(submit(&mut s, "m", now).unwrap());
    let second = dispatched_to(submit(&mut s, "m", now).unwrap());
    assert_ne!(first, second, "tie broken round-robin, then lowest load");
    // Both at load 1: round-robin again spreads them.
    let third = dispatched_to(submit(&mut s, "m", now).unwrap());
    let fourth = dispatched_to(submit(&mut s, "m", now).unwrap());
    assert_ne!(third, fourth);
    // Load from elsewhere makes `a` the busier one: `b` wins.
    s.update_load(a, 2 + 3);
    assert_eq!(dispatched_to(submit(&mut s, "m", now).unwrap()), b);
}

#[test]
fn capacity_is_reserved_and_extra_requests_queue_then_429_when_full() {
    let mut s = scheduler();
    register(&mut s, "a", &["m"], 1);
    let now = Instant::now();
    dispatched_to(submit(&mut s, "m", now).unwrap());
    for _ in 0..3 {
        assert!(matches!(
            submit(&mut s, "m", now),
            Ok(Submitted::Queued { .. })
        ));
    }
    assert!(matches!(
        submit(&mut s, "m", now),
        Err(SubmitError::QueueFull { .. })
    ));
    assert_eq!(s.queue_depth(), 3);
}

#[test]
fn finishing_dispatches_the_oldest_compatible_queued_request() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    register(&mut s, "b", &["other"], 1);
    let now = Instant::now();
    let first = submit(&mut s, "m", now).unwrap().request();
    let q1 = submit(&mut s, "m", now).unwrap().request();
    let q2 = submit(&mut s, "m", now).unwrap().request();
    let mut actions = Vec::new();
    assert!(s.finish(a, first, &mut actions));
    assert_eq!(
        actions,
        vec![Action::Dispatch {
            request: q1,
            worker: a
        }]
    );
    actions.clear();
    assert!(s.finish(a, q1, &mut actions));
    assert_eq!(
        actions,
        vec![Action::Dispatch {
            request: q2,
            worker: a
        }]
    );
}

#[test]
fn a_worker_picks_the_oldest_request_among_its_models_skipping_incompatible_ones() {
    let mut s = scheduler();
    let busy = register(&mut s, "busy", &["x", "y"], 1).worker;
    let now = Instant::now();
    let running = submit(&mut s, "x", now).unwrap().request();
    let y_old = submit(&mut s, "y", now).unwrap().request();
    let x_new = submit(&mut s, "x", now).unwrap().request();
    let only_x = register(&mut s, "only-x", &["x"], 1);
    assert_eq!(
        only_x.actions,
        vec![Action::Dispatch {
            request: x_new,
            worker: only_x.worker
        }],
        "a newly registered worker takes queued work at once, compatible first"
    );
    let mut actions = Vec::new();
    s.finish(busy, running, &mut actions);
    assert_eq!(
        actions,
        vec![Action::Dispatch {
            request: y_old,
            worker: busy
        }]
    );
}

#[test]
fn lower_reported_load_dispatches_queued_work_at_once() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 2).worker;
    let now = Instant::now();
    s.update_load(a, 2);
    let queued = submit(&mut s, "m", now).unwrap();
    assert!(matches!(queued, Submitted::Queued { .. }));
    let actions = s.update_load(a, 0);
    assert_eq!(
        actions,
        vec![Action::Dispatch {
            request: queued.request(),
            worker: a
        }]
    );
}

#[test]
fn models_update_changes_routing_at_once_and_dispatches_queued_work() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 2).worker;
    let now = Instant::now();
    let waiting = submit(&mut s, "new", now).unwrap();
    assert!(matches!(waiting, Submitted::Queued { .. }));
    let (models, warnings, actions) = s.update_models(a, &["new".to_string()], 0, None, None, now);
    assert_eq!(models, vec!["new"]);
    assert!(warnings.is_empty());
    assert_eq!(
        actions,
        vec![Action::Dispatch {
            request: waiting.request(),
            worker: a
        }]
    );
    assert!(matches!(
        submit(&mut s, "new", now),
        Ok(Submitted::Dispatched { .. })
    ));
    // "m" was dropped: it is claimed (lingers) for the queue timeout, then only queues at the
    // default provider like any model nobody serves.
    assert!(s.is_claimed("m", now));
    assert!(matches!(
        submit(&mut s, "m", now),
        Ok(Submitted::Queued { .. })
    ));
    let later = now + Duration::from_secs(31);
    assert!(!s.is_claimed("m", later));
}

#[test]
fn configured_provider_models_queue_while_no_worker_is_connected() {
    let mut with_models = limits();
    with_models.models = vec!["llama3-8b".to_string()];
    let mut s = Scheduler::new(vec![("local".to_string(), with_models)]);
    let now = Instant::now();
    let queued = submit(&mut s, "llama3-8b", now).unwrap();
    assert!(matches!(queued, Submitted::Queued { .. }));
    let r = register(&mut s, "late", &["llama3-8b"], 1);
    assert_eq!(
        r.actions,
        vec![Action::Dispatch {
            request: queued.request(),
            worker: r.worker
        }]
    );
}

#[test]
fn cancelling_a_queued_request_removes_it() {
    let mut s = scheduler();
    let mut with_models = limits();
    with_models.models = vec!["m".to_string()];
    s.providers[0].limits = with_models;
    let now = Instant::now();
    let r = submit(&mut s, "m", now).unwrap().request();
    assert_eq!(s.cancel(r), CancelOutcome::RemovedFromQueue);
    assert_eq!(s.queue_depth(), 0);
    assert_eq!(s.tracked_requests(), 0);
    assert_eq!(s.cancel(r), CancelOutcome::Nothing);
}

#[test]
fn cancelled_in_flight_request_holds_its_slot_until_confirmed() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let now = Instant::now();
    let running = submit(&mut s, "m", now).unwrap().request();
    let waiting = submit(&mut s, "m", now).unwrap().request();
    assert_eq!(s.cancel(running), CancelOutcome::SendCancel { worker: a });
    assert_eq!(s.queue_depth(), 1, "slot still held while the worker stops");
    let mut actions = Vec::new();
    assert!(
        s.finish(a, running, &mut actions),
        "worker confirmed the end"
    );
    assert_eq!(
        actions,
        vec![Action::Dispatch {
            request: waiting,
            worker: a
        }]
    );
}

#[test]
fn cancelled_request_slot_is_released_after_grace_when_worker_never_confirms() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let now = Instant::now();
    let running = submit(&mut s, "m", now).unwrap().request();
    let waiting = submit(&mut s, "m", now).unwrap().request();
    s.cancel(running);
    let actions = s.release_cancelled(running);
    assert_eq!(
        actions,
        vec![Action::Dispatch {
            request: waiting,
            worker: a
        }]
    );
    // A late confirmation changes nothing.
    let mut late = Vec::new();
    assert!(!s.finish(a, running, &mut late));
    assert!(late.is_empty());
}

#[test]
fn duplicate_or_foreign_completion_is_ignored() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 2).worker;
    let b = register(&mut s, "b", &["m"], 2).worker;
    let now = Instant::now();
    let r = submit(&mut s, "m", now).unwrap();
    let (req, owner) = match r {
        Submitted::Dispatched { request, worker } => (request, worker),
        _ => unreachable!(),
    };
    let other = if owner == a { b } else { a };
    let mut actions = Vec::new();
    assert!(
        !s.finish(other, req, &mut actions),
        "another worker cannot finish it"
    );
    assert!(s.finish(owner, req, &mut actions));
    assert!(
        !s.finish(owner, req, &mut actions),
        "second completion ignored"
    );
}

#[test]
fn queue_timeout_expires_only_past_the_deadline() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let now = Instant::now();
    submit(&mut s, "m", now).unwrap();
    let Submitted::Queued {
        request,
        queue_deadline,
    } = submit(&mut s, "m", now).unwrap()
    else {
        panic!("queued");
    };
    assert_eq!(queue_deadline, now + Duration::from_secs(30));
    assert_eq!(
        s.expire_queued(request, now + Duration::from_secs(29)),
        None
    );
    assert_eq!(
        s.expire_queued(request, queue_deadline),
        Some(Expired {
            model: Arc::from("m"),
            served: true
        })
    );
    assert_eq!(s.queue_depth(), 0);
    let _ = a;
}

#[test]
fn worker_death_requeues_unstarted_requests_keeping_their_deadline() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let t0 = Instant::now();
    let r = submit(&mut s, "m", t0).unwrap().request();
    let t1 = t0 + Duration::from_secs(20);
    let actions = s.worker_gone(a, t1);
    assert_eq!(
        actions,
        vec![Action::Requeued {
            request: r,
            queue_deadline: t0 + Duration::from_secs(30)
        }],
        "the requeued request keeps the queue deadline fixed at arrival"
    );
    let b = register(&mut s, "b", &["m"], 1);
    assert_eq!(
        b.actions,
        vec![Action::Dispatch {
            request: r,
            worker: b.worker
        }]
    );
}

#[test]
fn a_request_requeued_past_its_queue_deadline_ends_at_once_unless_a_worker_is_free() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let t0 = Instant::now();
    let r = submit(&mut s, "m", t0).unwrap().request();
    // It ran 40 s, past its 30 s queue deadline, when its worker died.
    let t1 = t0 + Duration::from_secs(40);
    let actions = s.worker_gone(a, t1);
    assert_eq!(
        actions,
        vec![Action::Requeued {
            request: r,
            queue_deadline: t0 + Duration::from_secs(30)
        }]
    );
    assert!(s.expire_queued(r, t1).is_some(), "no fresh queue timeout");
    assert_eq!(s.tracked_requests(), 0);
}

#[test]
fn requeue_goes_straight_to_another_free_worker() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let now = Instant::now();
    let r = submit(&mut s, "m", now).unwrap().request();
    let b = register(&mut s, "b", &["m"], 1).worker;
    assert_eq!(
        s.worker_gone(a, now),
        vec![Action::Dispatch {
            request: r,
            worker: b
        }]
    );
}

#[test]
fn requeue_is_capped_at_three_then_fails_with_requeue_exhausted() {
    let mut s = scheduler();
    let now = Instant::now();
    let first = register(&mut s, "w0", &["m"], 1).worker;
    let r = submit(&mut s, "m", now).unwrap().request();
    let mut worker = first;
    for i in 1..=3 {
        let actions = s.worker_gone(worker, now);
        assert!(matches!(actions[0], Action::Requeued { .. }), "requeue {i}");
        let reg = register(&mut s, &format!("w{i}"), &["m"], 1);
        assert_eq!(
            reg.actions,
            vec![Action::Dispatch {
                request: r,
                worker: reg.worker
            }]
        );
        worker = reg.worker;
    }
    assert_eq!(
        s.worker_gone(worker, now),
        vec![Action::Fail {
            request: r,
            reason: FailReason::RequeueExhausted
        }]
    );
    assert_eq!(s.tracked_requests(), 0);
}

#[test]
fn request_whose_bytes_reached_the_client_is_never_requeued() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    register(&mut s, "b", &["m"], 1);
    let now = Instant::now();
    let Submitted::Dispatched { request, worker } = submit(&mut s, "m", now).unwrap() else {
        panic!()
    };
    s.mark_started(request);
    assert_eq!(
        s.worker_gone(worker, now),
        vec![Action::Fail {
            request,
            reason: FailReason::WorkerLostMidStream
        }]
    );
    let _ = a;
}

#[test]
fn worker_death_after_client_cancel_just_forgets_the_request() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let now = Instant::now();
    let r = submit(&mut s, "m", now).unwrap().request();
    s.cancel(r);
    assert!(s.worker_gone(a, now).is_empty());
    assert_eq!(s.tracked_requests(), 0);
}

#[test]
fn draining_worker_gets_no_new_work_and_closes_when_idle() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 2).worker;
    let now = Instant::now();
    let r = submit(&mut s, "m", now).unwrap().request();
    assert!(s.drain_worker(a).is_empty(), "busy: not closed yet");
    assert!(matches!(
        submit(&mut s, "m", now),
        Ok(Submitted::Queued { .. })
    ));
    let mut actions = Vec::new();
    s.finish(a, r, &mut actions);
    assert_eq!(actions, vec![Action::CloseDrained { worker: a }]);
}

#[test]
fn shutdown_refuses_new_work_and_fails_queued_requests() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let now = Instant::now();
    submit(&mut s, "m", now).unwrap();
    let queued = submit(&mut s, "m", now).unwrap().request();
    let (actions, workers) = s.begin_shutdown();
    assert_eq!(workers, vec![a]);
    assert_eq!(
        actions,
        vec![Action::Fail {
            request: queued,
            reason: FailReason::ShuttingDown
        }]
    );
    assert_eq!(submit(&mut s, "m", now), Err(SubmitError::ShuttingDown));
    assert_eq!(s.in_flight_count(), 1);
}

#[test]
fn zero_max_concurrent_is_treated_as_one_with_a_warning() {
    let mut s = scheduler();
    let r = register(&mut s, "a", &["m"], 0);
    assert!(r.warnings.iter().any(|w| w.contains("max_concurrent")));
    assert!(matches!(
        submit(&mut s, "m", Instant::now()),
        Ok(Submitted::Dispatched { .. })
    ));
}

#[test]
fn blank_names_empty_model_lists_and_duplicate_names_are_warned_in_the_ack() {
    let mut s = scheduler();
    let first = register(&mut s, "gpu-box", &["m"], 1);
    assert!(first.warnings.is_empty(), "{:?}", first.warnings);
    let blank = register(&mut s, "  ", &[], 1);
    assert!(blank.warnings.iter().any(|w| w.contains("name is blank")));
    assert!(blank.warnings.iter().any(|w| w.contains("no usable model")));
    let all_dropped = register(&mut s, "b", &["", " "], 1);
    assert!(all_dropped
        .warnings
        .iter()
        .any(|w| w.contains("no usable model")));
    let twin = register(&mut s, "gpu-box", &["m"], 1);
    assert!(twin
        .warnings
        .iter()
        .any(|w| w.contains("also named \"gpu-box\"")));
}

#[test]
fn wire_ids_round_trip_and_foreign_ids_are_rejected() {
    assert_eq!(parse_request_wire_id(&request_wire_id(42)), Some(42));
    assert_eq!(parse_request_wire_id("r-x"), None);
    assert_eq!(parse_request_wire_id("req-1"), None);
}

#[test]
fn retryable_failure_before_any_byte_requeues_to_another_worker() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let now = Instant::now();
    let r = submit(&mut s, "m", now).unwrap().request();
    let b = register(&mut s, "b", &["m"], 1).worker;
    let mut actions = Vec::new();
    assert!(s.retry(a, r, now, &mut actions));
    assert_eq!(
        actions,
        vec![Action::Dispatch {
            request: r,
            worker: b
        }]
    );
    assert_eq!(
        s.workers()[0].in_flight,
        0,
        "the failed worker's slot is free"
    );
}

#[test]
fn a_busy_refusal_counts_its_worker_full_until_it_reports_and_never_exhausts_the_request() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 2).worker;
    let now = Instant::now();
    let r = submit(&mut s, "m", now).unwrap().request();
    // Refused again and again, as a worker whose own count ran ahead of the proxy's would.
    for _ in 0..(MAX_REQUEUE_COUNT + 2) {
        let mut actions = Vec::new();
        assert!(s.refused_as_busy(a, r, now, &mut actions));
        assert!(
            !actions.iter().any(|a| matches!(a, Action::Dispatch { .. })),
            "not straight back to the worker that said it is full: {actions:?}"
        );
        assert_eq!(s.queue_depth(), 1, "it waits");
        // The worker reports a free slot again: the request goes back to it.
        let actions = s.update_load(a, 1);
        assert_eq!(
            actions,
            vec![Action::Dispatch {
                request: r,
                worker: a
            }]
        );
    }
    let mut actions = Vec::new();
    assert!(s.finish(a, r, &mut actions), "and it is finally answered");
}

#[test]
fn retryable_failure_after_bytes_reached_the_client_fails_the_request() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let now = Instant::now();
    let r = submit(&mut s, "m", now).unwrap().request();
    s.mark_started(r);
    let mut actions = Vec::new();
    assert!(s.retry(a, r, now, &mut actions));
    assert_eq!(
        actions,
        vec![Action::Fail {
            request: r,
            reason: FailReason::WorkerLostMidStream
        }]
    );
}

#[test]
fn retryable_failures_share_the_requeue_cap_with_worker_deaths() {
    let mut s = scheduler();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let now = Instant::now();
    let r = submit(&mut s, "m", now).unwrap().request();
    for _ in 0..MAX_REQUEUE_COUNT {
        let mut actions = Vec::new();
        assert!(s.retry(a, r, now, &mut actions));
        assert_eq!(
            actions,
            vec![Action::Dispatch {
                request: r,
                worker: a
            }],
            "same worker restarts its model"
        );
    }
    let mut actions = Vec::new();
    assert!(s.retry(a, r, now, &mut actions));
    assert_eq!(
        actions,
        vec![Action::Fail {
            request: r,
            reason: FailReason::RequeueExhausted
        }]
    );
    let mut stray = Vec::new();
    assert!(
        !s.retry(a, r, now, &mut stray),
        "an unknown request is not retried"
    );
}

// Model-based: any sequence of events, stray and duplicate ones included, leaves the state
// consistent and never panics. The hub holds its lock around every one of these calls, so a
// panic here would poison it with half an update applied.

/// An event the scheduler may receive, with ids picked among those seen so far (stale ones
/// included, as stray messages from workers are).
#[derive(Debug, Clone)]
enum Event {
    Register {
        models: Vec<usize>,
        max: u32,
    },
    Submit {
        model: usize,
    },
    SubmitAs {
        model: usize,
        client: usize,
        batch: bool,
    },
    Finish {
        worker: usize,
        request: usize,
    },
    Retry {
        worker: usize,
        request: usize,
    },
    Cancel {
        request: usize,
    },
    ReleaseCancelled {
        request: usize,
    },
    ExpireQueued {
        request: usize,
    },
    MarkStarted {
        request: usize,
    },
    WorkerGone {
        worker: usize,
    },
    UpdateModels {
        worker: usize,
        models: Vec<usize>,
    },
    UpdateLoad {
        worker: usize,
        load: u32,
    },
    Drain {
        worker: usize,
    },
    Advance {
        secs: u64,
    },
}

const MODELS: [&str; 4] = ["a", "b", "c", "unknown"];

fn event() -> impl proptest::strategy::Strategy<Value = Event> {
    use proptest::prelude::*;
    let models = || proptest::collection::vec(0usize..4, 0..4);
    prop_oneof![
        (models(), 1u32..4).prop_map(|(models, max)| Event::Register { models, max }),
        (0usize..4).prop_map(|model| Event::Submit { model }),
        (0usize..4, 0usize..3, any::<bool>()).prop_map(|(model, client, batch)| Event::SubmitAs {
            model,
            client,
            batch
        }),
        (0usize..8, 0usize..16).prop_map(|(worker, request)| Event::Finish { worker, request }),
        (0usize..8, 0usize..16).prop_map(|(worker, request)| Event::Retry { worker, request }),
        (0usize..16).prop_map(|request| Event::Cancel { request }),
        (0usize..16).prop_map(|request| Event::ReleaseCancelled { request }),
        (0usize..16).prop_map(|request| Event::ExpireQueued { request }),
        (0usize..16).prop_map(|request| Event::MarkStarted { request }),
        (0usize..8).prop_map(|worker| Event::WorkerGone { worker }),
        (0usize..8, models()).prop_map(|(worker, models)| Event::UpdateModels { worker, models }),
        (0usize..8, 0u32..5).prop_map(|(worker, load)| Event::UpdateLoad { worker, load }),
        (0usize..8).prop_map(|worker| Event::Drain { worker }),
        (0u64..40).prop_map(|secs| Event::Advance { secs }),
    ]
}

/// Every cross-reference of the state agrees.
fn assert_consistent(s: &Scheduler) {
    for (&id, worker) in &s.workers {
        assert!(
            worker.in_flight.len() as u32 <= worker.max_concurrent,
            "worker {id} runs more than it may"
        );
        for request in &worker.in_flight {
            let phase = s.requests.get(request).map(|r| r.phase);
            assert!(
                matches!(phase, Some(Phase::Assigned { worker: w } | Phase::Cancelling { worker: w }) if w == id),
                "worker {id} runs request {request}, which says {phase:?}"
            );
        }
    }
    let mut queued = vec![0usize; s.providers.len()];
    for (&id, request) in &s.requests {
        match request.phase {
            Phase::Queued => {
                assert!(
                    s.providers[request.provider]
                        .queue
                        .contains(id, request.seat()),
                    "queued request {id} is in no queue, or not where its placement says"
                );
                queued[request.provider] += 1;
            }
            Phase::Assigned { worker } | Phase::Cancelling { worker } => {
                let running = s.workers.get(&worker).map(|w| w.in_flight.contains(&id));
                assert_eq!(running, Some(true), "request {id} on worker {worker}");
            }
        }
    }
    for (index, provider) in s.providers.iter().enumerate() {
        // No empty queue is kept (random model names must not leave entries behind).
        provider.queue.assert_consistent();
        assert_eq!(
            provider.queue.len(),
            queued[index],
            "queues hold only queued requests"
        );
        for workers in provider.model_workers.values() {
            for worker in workers {
                assert!(
                    s.workers.contains_key(worker),
                    "routing names a gone worker"
                );
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    #[test]
    fn any_sequence_of_events_keeps_the_state_consistent_and_never_panics(
        events in proptest::collection::vec(event(), 1..80)
    ) {
        let mut s = scheduler();
        let mut now = Instant::now();
        let mut workers: Vec<WorkerId> = Vec::new();
        let mut requests: Vec<RequestId> = Vec::new();
        let mut next_request: RequestId = 1;
        let pick = |ids: &[u64], i: usize| ids.get(i % ids.len().max(1)).copied().unwrap_or(999);
        for event in events {
            let mut actions = Vec::new();
            match event {
                Event::Register { models, max } => {
                    let names: Vec<&str> = models.iter().map(|m| MODELS[*m]).collect();
                    workers.push(register(&mut s, "w", &names, max).worker);
                }
                Event::Submit { model } => {
                    let _ = s.submit(next_request, MODELS[model], Placement::default(), now);
                    requests.push(next_request);
                    next_request += 1;
                }
                Event::SubmitAs { model, client, batch } => {
                    let placement = Placement {
                        client: Some(Arc::from(["k1", "k2", "10.0.0.9"][client])),
                        priority: if batch { Priority::Batch } else { Priority::Interactive },
                        ..Placement::default()
                    };
                    let _ = s.submit(next_request, MODELS[model], placement, now);
                    requests.push(next_request);
                    next_request += 1;
                }
                Event::Finish { worker, request } => {
                    s.finish(pick(&workers, worker), pick(&requests, request), &mut actions);
                }
                Event::Retry { worker, request } => {
                    s.retry(pick(&workers, worker), pick(&requests, request), now, &mut actions);
                }
                Event::Cancel { request } => {
                    let _ = s.cancel(pick(&requests, request));
                }
                Event::ReleaseCancelled { request } => {
                    s.release_cancelled(pick(&requests, request));
                }
                Event::ExpireQueued { request } => {
                    s.expire_queued(pick(&requests, request), now);
                }
                Event::MarkStarted { request } => s.mark_started(pick(&requests, request)),
                Event::WorkerGone { worker } => {
                    s.worker_gone(pick(&workers, worker), now);
                }
                Event::UpdateModels { worker, models } => {
                    let names: Vec<String> = models.iter().map(|m| MODELS[*m].to_string()).collect();
                    s.update_models(pick(&workers, worker), &names, 0, None, None, now);
                }
                Event::UpdateLoad { worker, load } => {
                    s.update_load(pick(&workers, worker), load);
                }
                Event::Drain { worker } => {
                    s.drain_worker(pick(&workers, worker));
                }
                Event::Advance { secs } => now += Duration::from_secs(secs),
            }
            assert_consistent(&s);
        }
    }
}

/// Submits with the next id and an affinity key.
fn submit_in(s: &mut Scheduler, conversation: u64, now: Instant) -> Submitted {
    thread_local!(static NEXT: std::cell::Cell<RequestId> = const { std::cell::Cell::new(1_000_000) });
    let id = NEXT.with(|n| {
        let id = n.get();
        n.set(id + 1);
        id
    });
    let placement = Placement {
        affinity: Some(conversation),
        ..Placement::default()
    };
    s.submit(id, "m", placement, now).expect("accepted")
}

fn finish_on(s: &mut Scheduler, submitted: &Submitted) {
    let worker = dispatched_to(submitted.clone());
    assert!(s.finish(worker, submitted.request(), &mut Vec::new()));
}

#[test]
fn a_conversations_next_turn_goes_to_the_worker_that_served_it_even_when_another_is_idler() {
    let mut s = scheduler();
    let now = Instant::now();
    let a = register(&mut s, "a", &["m"], 4).worker;
    let b = register(&mut s, "b", &["m"], 4).worker;
    let first = submit_in(&mut s, 1, now);
    let home = dispatched_to(first.clone());
    let other = if home == a { b } else { a };
    // The first turn still runs: least-loaded alone would pick the other, idle worker.
    for _ in 0..3 {
        let turn = submit_in(&mut s, 1, now);
        assert_eq!(dispatched_to(turn.clone()), home);
    }
    let stranger = submit_in(&mut s, 2, now);
    assert_eq!(dispatched_to(stranger), other);
    let counts = s.affinity_counts();
    assert_eq!((counts.hits, counts.misses, counts.new), (3, 0, 2));
    assert_eq!(counts.entries, 2);
}

#[test]
fn a_saturated_home_yields_to_the_least_loaded_worker_which_becomes_the_new_home() {
    let mut s = scheduler();
    let now = Instant::now();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let b = register(&mut s, "b", &["m"], 1).worker;
    let first = submit_in(&mut s, 1, now);
    let home = dispatched_to(first.clone());
    let other = if home == a { b } else { a };
    // Turn 2 arrives while turn 1 still holds the home's only slot.
    let second = submit_in(&mut s, 1, now);
    assert_eq!(dispatched_to(second.clone()), other);
    finish_on(&mut s, &first);
    finish_on(&mut s, &second);
    let third = submit_in(&mut s, 1, now);
    assert_eq!(dispatched_to(third), other, "the new home keeps it");
    let counts = s.affinity_counts();
    assert_eq!((counts.hits, counts.misses, counts.new), (1, 1, 1));
}

#[test]
fn a_home_that_left_yields_and_the_conversation_moves_for_good() {
    let mut s = scheduler();
    let now = Instant::now();
    let a = register(&mut s, "a", &["m"], 2).worker;
    let b = register(&mut s, "b", &["m"], 2).worker;
    let first = submit_in(&mut s, 1, now);
    finish_on(&mut s, &first);
    let home = dispatched_to(first);
    let other = if home == a { b } else { a };
    assert!(s.worker_gone(home, now).is_empty());
    let second = submit_in(&mut s, 1, now);
    assert_eq!(dispatched_to(second), other);
    let back = register(&mut s, "again", &["m"], 2).worker;
    let third = submit_in(&mut s, 1, now);
    assert_eq!(dispatched_to(third), other, "not to the newcomer {back}");
    assert_eq!(s.affinity_counts().misses, 1);
}

#[test]
fn a_requeued_request_leaves_its_dead_home_and_a_queued_one_takes_the_slot_that_frees() {
    let mut s = scheduler();
    let now = Instant::now();
    let a = register(&mut s, "a", &["m"], 1).worker;
    let first = submit_in(&mut s, 1, now);
    assert_eq!(dispatched_to(first.clone()), a);
    let b = register(&mut s, "b", &["m"], 1).worker;
    // Both slots taken, conversation 1's next turn waits; a's slot frees first.
    let busy = submit_in(&mut s, 2, now);
    assert_eq!(dispatched_to(busy.clone()), b);
    let queued = submit_in(&mut s, 2, now);
    assert!(matches!(queued, Submitted::Queued { .. }));
    let mut actions = Vec::new();
    s.finish(a, first.request(), &mut actions);
    assert_eq!(
        actions,
        vec![Action::Dispatch {
            request: queued.request(),
            worker: a
        }]
    );
    // Conversation 2's home moved to a; b dies and its request is requeued elsewhere.
    let actions = s.worker_gone(b, now);
    assert!(matches!(actions.as_slice(), [Action::Requeued { .. }]));
    let counts = s.affinity_counts();
    assert_eq!((counts.hits, counts.misses, counts.new), (0, 1, 2));
}

#[test]
fn new_conversations_go_where_homes_per_slot_are_fewest_even_when_both_workers_are_idle() {
    let mut s = scheduler();
    let now = Instant::now();
    let a = register(&mut s, "a", &["m"], 3).worker;
    let b = register(&mut s, "b", &["m"], 3).worker;
    // Each first turn ends before the next conversation starts: least-loaded would see two
    // idle workers every time and could pile four conversations onto three slots.
    for conversation in 1..=6 {
        let first = submit_in(&mut s, conversation, now);
        finish_on(&mut s, &first);
    }
    assert_eq!((s.affinity.homes_of(a), s.affinity.homes_of(b)), (3, 3));
    // A bigger worker takes proportionally more: 8 slots against 3.
    let c = register(&mut s, "c", &["m"], 8).worker;
    for conversation in 7..=14 {
        let first = submit_in(&mut s, conversation, now);
        finish_on(&mut s, &first);
    }
    assert_eq!(
        s.affinity.homes_of(c),
        8,
        "c catches up to one home per slot first"
    );
}

#[test]
fn a_queue_bound_of_zero_is_no_bound_as_the_published_relay_reads_it() {
    let mut unbounded = limits();
    unbounded.max_queue_len = 0;
    let mut s = Scheduler::new(vec![("local".to_string(), unbounded)]);
    let now = Instant::now();
    for i in 0..500 {
        assert!(
            matches!(
                submit(&mut s, &format!("waiting-{}", i % 7), now),
                Ok(Submitted::Queued { .. })
            ),
            "request {i}"
        );
    }
    assert_eq!(s.queue_depth(), 500);
}

#[test]
fn a_queued_prompt_waits_for_a_worker_whose_window_holds_it() {
    let mut s = Scheduler::new(vec![("local".to_string(), limits())]);
    let windowed = |s: &mut Scheduler, name: &str, window: u32| {
        s.register_worker(
            "local",
            &RegisterMessage {
                warm_ups: None,
                sides_first: None,
                worker_name: name.to_string(),
                models: vec!["m".to_string()],
                max_concurrent: 1,
                protocol_version: None,
                current_load: None,
                mac_address: None,
                sleeps_when_idle: None,
                context_windows: Some(std::collections::BTreeMap::from([(
                    "m".to_string(),
                    window,
                )])),
            },
        )
        .expect("registered")
        .worker
    };
    let small = windowed(&mut s, "small", 1_000);
    let large = windowed(&mut s, "large", 8_000);
    let now = Instant::now();
    let sized = |tokens: u32| Placement {
        prompt_tokens: Some(tokens),
        ..Placement::default()
    };
    assert_eq!(
        dispatched_to(s.submit(1, "m", sized(3_000), now).unwrap()),
        large
    );
    assert_eq!(
        dispatched_to(s.submit(2, "m", sized(10), now).unwrap()),
        small
    );
    assert!(matches!(
        s.submit(3, "m", sized(3_000), now),
        Ok(Submitted::Queued { .. })
    ));
    assert!(matches!(
        s.submit(4, "m", sized(20), now),
        Ok(Submitted::Queued { .. })
    ));
    let mut actions = Vec::new();
    assert!(s.finish(small, 2, &mut actions));
    assert_eq!(
        actions,
        [Action::Dispatch {
            request: 4,
            worker: small
        }],
        "the short one"
    );
    let mut actions = Vec::new();
    assert!(s.finish(large, 1, &mut actions));
    assert_eq!(
        actions,
        [Action::Dispatch {
            request: 3,
            worker: large
        }],
        "the long one"
    );
}
