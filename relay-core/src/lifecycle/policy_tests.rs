//! The lifecycle policy, rule by rule, with time as an input.

use super::*;

fn at(base: Instant, secs: u64) -> Instant {
    base + Duration::from_secs(secs)
}

fn resident(name: &str, last_used: Instant, activity: Activity) -> Resident {
    Resident {
        name: name.to_string(),
        vram_mb: 0,
        group: None,
        last_used,
        activity,
    }
}

fn candidate(name: &str) -> Candidate {
    Candidate {
        name: name.to_string(),
        vram_mb: 0,
        group: None,
    }
}

fn one_at_a_time() -> Limits {
    Limits {
        max_loaded: Some(1),
        vram_budget_mb: None,
    }
}

#[test]
fn a_model_starts_at_once_when_it_fits() {
    let t = Instant::now();
    assert_eq!(
        admit(&candidate("a"), &[], &one_at_a_time()),
        Admission::Start
    );
    let limits = Limits {
        max_loaded: Some(2),
        vram_budget_mb: None,
    };
    let loaded = [resident("b", t, Activity::Busy)];
    assert_eq!(admit(&candidate("a"), &loaded, &limits), Admission::Start);
}

#[test]
fn the_least_recently_used_idle_model_is_evicted_first() {
    let t = Instant::now();
    let limits = Limits {
        max_loaded: Some(2),
        vram_budget_mb: None,
    };
    let loaded = [
        resident("recent", at(t, 50), Activity::Idle),
        resident("old", at(t, 10), Activity::Idle),
    ];
    assert_eq!(
        admit(&candidate("new"), &loaded, &limits),
        Admission::StartAfter {
            evict: vec!["old".into()],
            await_gone: vec!["old".into()],
        }
    );
}

#[test]
fn a_busy_model_is_never_evicted_even_when_it_is_the_oldest() {
    let t = Instant::now();
    let limits = Limits {
        max_loaded: Some(2),
        vram_budget_mb: None,
    };
    let loaded = [
        resident("busy-old", at(t, 1), Activity::Busy),
        resident("idle-new", at(t, 90), Activity::Idle),
    ];
    assert_eq!(
        admit(&candidate("new"), &loaded, &limits),
        Admission::StartAfter {
            evict: vec!["idle-new".into()],
            await_gone: vec!["idle-new".into()],
        }
    );
    let all_busy = [
        resident("a", t, Activity::Busy),
        resident("b", t, Activity::Starting),
    ];
    assert_eq!(
        admit(&candidate("new"), &all_busy, &limits),
        Admission::Wait {
            blocked_by: vec!["a".into(), "b".into()]
        }
    );
}

#[test]
fn the_vram_budget_evicts_as_many_idle_models_as_needed() {
    let t = Instant::now();
    let limits = Limits {
        max_loaded: None,
        vram_budget_mb: Some(10_000),
    };
    let mut small_old = resident("small-old", at(t, 1), Activity::Idle);
    small_old.vram_mb = 2_000;
    let mut mid = resident("mid", at(t, 2), Activity::Idle);
    mid.vram_mb = 3_000;
    let mut busy = resident("busy", at(t, 0), Activity::Busy);
    busy.vram_mb = 4_000;
    let big = Candidate {
        vram_mb: 5_000,
        ..candidate("big")
    };
    // 9000 used + 5000 > 10000: dropping small-old (2000) is not enough, mid goes too.
    assert_eq!(
        admit(&big, &[small_old, mid, busy.clone()], &limits),
        Admission::StartAfter {
            evict: vec!["small-old".into(), "mid".into()],
            await_gone: vec!["small-old".into(), "mid".into()],
        }
    );
    let huge = Candidate {
        vram_mb: 7_000,
        ..candidate("huge")
    };
    assert_eq!(
        admit(&huge, &[busy], &limits),
        Admission::Wait {
            blocked_by: vec!["busy".into()]
        }
    );
    let too_big = Candidate {
        vram_mb: 10_001,
        ..candidate("too-big")
    };
    assert!(matches!(
        admit(&too_big, &[], &limits),
        Admission::Impossible(reason) if reason.contains("10001 MB")
    ));
}

#[test]
fn group_mates_always_make_way_but_busy_ones_are_waited_for() {
    let t = Instant::now();
    let unlimited = Limits::default();
    let mut mate = resident("mate", t, Activity::Idle);
    mate.group = Some("gpu0".into());
    let mut other = resident("other", t, Activity::Idle);
    other.group = Some("gpu1".into());
    let grouped = Candidate {
        group: Some("gpu0".into()),
        ..candidate("new")
    };
    assert_eq!(
        admit(&grouped, &[mate.clone(), other], &unlimited),
        Admission::StartAfter {
            evict: vec!["mate".into()],
            await_gone: vec!["mate".into()],
        }
    );
    mate.activity = Activity::Busy;
    assert_eq!(
        admit(&grouped, &[mate], &unlimited),
        Admission::Wait {
            blocked_by: vec!["mate".into()]
        }
    );
}

#[test]
fn a_stopping_model_is_awaited_only_when_its_room_is_needed() {
    let t = Instant::now();
    let stopping = resident("leaving", t, Activity::Stopping);
    let two = Limits {
        max_loaded: Some(2),
        vram_budget_mb: None,
    };
    assert_eq!(
        admit(&candidate("new"), std::slice::from_ref(&stopping), &two),
        Admission::Start
    );
    assert_eq!(
        admit(&candidate("new"), &[stopping], &one_at_a_time()),
        Admission::StartAfter {
            evict: vec![],
            await_gone: vec!["leaving".into()],
        }
    );
}

#[test]
fn idle_models_expire_after_their_timeout_only_without_requests_in_flight() {
    let t = Instant::now();
    let timeout = Some(Duration::from_secs(3600));
    assert_eq!(idle_deadline(t, 0, timeout), Some(at(t, 3600)));
    assert!(!idle_expired(at(t, 3599), t, 0, timeout));
    assert!(idle_expired(at(t, 3600), t, 0, timeout));
    assert!(!idle_expired(at(t, 7200), t, 1, timeout), "busy");
    assert!(!idle_expired(at(t, 7200), t, 0, None), "never");
    assert_eq!(idle_deadline(t, 2, timeout), None);
}

fn settings() -> BreakerSettings {
    BreakerSettings {
        max_failures: 3,
        window: Duration::from_secs(60),
        backoff: Duration::from_secs(30),
    }
}

#[test]
fn the_breaker_opens_after_n_failures_within_the_window() {
    let t = Instant::now();
    let mut breaker = Breaker::default();
    breaker.record_failure(t, &settings());
    breaker.record_failure(at(t, 10), &settings());
    assert_eq!(breaker.state(at(t, 10)), BreakerState::Closed);
    breaker.record_failure(at(t, 20), &settings());
    assert_eq!(
        breaker.state(at(t, 20)),
        BreakerState::Open { until: at(t, 50) }
    );
    assert_eq!(breaker.allows_start(at(t, 49)), Err(at(t, 50)));
}

#[test]
fn failures_outside_the_window_do_not_count() {
    let t = Instant::now();
    let mut breaker = Breaker::default();
    breaker.record_failure(t, &settings());
    breaker.record_failure(at(t, 10), &settings());
    breaker.record_failure(at(t, 71), &settings());
    assert_eq!(breaker.state(at(t, 71)), BreakerState::Closed);
    breaker.record_failure(at(t, 72), &settings());
    assert_eq!(
        breaker.state(at(t, 72)),
        BreakerState::Closed,
        "only 71 and 72 count"
    );
    breaker.record_failure(at(t, 73), &settings());
    assert!(matches!(
        breaker.state(at(t, 73)),
        BreakerState::Open { .. }
    ));
}

#[test]
fn after_the_backoff_one_trial_closes_or_reopens_the_breaker() {
    let t = Instant::now();
    let open = |breaker: &mut Breaker| {
        for s in 0..3 {
            breaker.record_failure(at(t, s), &settings());
        }
    };
    let mut breaker = Breaker::default();
    open(&mut breaker);
    assert_eq!(breaker.state(at(t, 32)), BreakerState::HalfOpen);
    assert_eq!(breaker.allows_start(at(t, 32)), Ok(()));
    breaker.record_failure(at(t, 33), &settings());
    assert_eq!(
        breaker.state(at(t, 33)),
        BreakerState::Open { until: at(t, 63) },
        "a failed trial reopens at once"
    );
    breaker.record_success(at(t, 64));
    assert_eq!(breaker.state(at(t, 64)), BreakerState::Closed);
    breaker.record_failure(at(t, 65), &settings());
    assert_eq!(
        breaker.state(at(t, 65)),
        BreakerState::Closed,
        "counting starts over"
    );
}

#[test]
fn success_while_closed_does_not_forgive_a_crash_loop() {
    let t = Instant::now();
    let mut breaker = Breaker::default();
    for s in [0, 5, 10] {
        breaker.record_success(at(t, s));
        breaker.record_failure(at(t, s + 1), &settings());
    }
    assert!(matches!(
        breaker.state(at(t, 11)),
        BreakerState::Open { .. }
    ));
    let mut disabled = Breaker::default();
    let off = BreakerSettings {
        max_failures: 0,
        ..settings()
    };
    for s in 0..10 {
        disabled.record_failure(at(t, s), &off);
    }
    assert_eq!(disabled.state(at(t, 10)), BreakerState::Closed);
    breaker.reset();
    assert_eq!(breaker.state(at(t, 11)), BreakerState::Closed);
}

#[test]
fn session_changes_restart_only_when_enabled_and_idle() {
    use SessionAction::*;
    assert_eq!(session_action(true, Some("a"), None, 0), Proceed);
    assert_eq!(session_action(true, None, Some("a"), 3), Adopt);
    assert_eq!(session_action(true, Some("a"), Some("a"), 3), Proceed);
    assert_eq!(session_action(true, Some("a"), Some("b"), 0), Restart);
    assert_eq!(session_action(true, Some("a"), Some("b"), 2), WaitForIdle);
    assert_eq!(session_action(false, Some("a"), Some("b"), 0), Adopt);
}

#[test]
fn ports_are_pinned_or_the_first_free_unreserved_from_the_base() {
    let reserved = BTreeSet::from([8081, 8083]);
    let taken = [8082];
    let free = |p: u16| !taken.contains(&p);
    assert_eq!(pick_port(None, 8081, &reserved, free), Ok(8084));
    assert_eq!(pick_port(Some(9000), 8081, &reserved, free), Ok(9000));
    assert!(pick_port(Some(8082), 8081, &reserved, free)
        .unwrap_err()
        .contains("pinned port 8082"));
    assert!(pick_port(None, 65535, &BTreeSet::from([65535]), free).is_err());
}

#[test]
fn vram_need_is_the_file_plus_a_margin_or_the_configured_figure_when_larger() {
    let gib = 1024 * 1024 * 1024;
    let (needed, basis) = vram_needed_mb(Some(4 * gib), 0).unwrap();
    assert_eq!(needed, 4096 + 409 + 256);
    assert!(basis.contains("4096 MiB model file"), "{basis}");
    assert_eq!(vram_needed_mb(Some(4 * gib), 9000).unwrap().0, 9000);
    assert_eq!(vram_needed_mb(None, 3000).unwrap().0, 3000);
    assert_eq!(vram_needed_mb(None, 0), None);
    // A tiny file still needs the fixed part; a huge one does not overflow.
    assert_eq!(vram_needed_mb(Some(1), 0).unwrap().0, 1 + 256);
    assert!(vram_needed_mb(Some(u64::MAX), 0).is_some());
}
