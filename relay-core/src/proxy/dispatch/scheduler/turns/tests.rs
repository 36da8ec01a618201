//! The queue discipline, rule by rule.

use crate::proxy::dispatch::scheduler::turns::*;

fn name(s: &str) -> Arc<str> {
    Arc::from(s)
}

/// A queue and the models its test worker serves.
struct Fixture {
    turns: Turns,
    next: RequestId,
    /// Clients' weights (1 unless set).
    weights: std::collections::HashMap<String, u32>,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            turns: Turns::default(),
            next: 1,
            weights: Default::default(),
        }
    }

    /// Queues a request of `client` for `model`; returns its id (ids grow with arrival).
    fn push(&mut self, client: &str, model: &str, priority: Priority) -> RequestId {
        let id = self.next;
        self.next += 1;
        self.put(id, Some(client), model, priority);
        id
    }

    /// Queues request `id` (a new one, or one coming back) of `client` (`None`: unknown).
    fn put(&mut self, id: RequestId, client: Option<&str>, model: &str, priority: Priority) {
        let weight = client
            .and_then(|c| self.weights.get(c).copied())
            .unwrap_or(1);
        self.turns.push(
            id,
            Seat {
                model: &name(model),
                client: &client.map(name),
                priority,
                weight,
            },
        );
        self.turns.assert_consistent();
    }

    fn take(&mut self, models: &[&str]) -> Option<RequestId> {
        let models: Vec<Arc<str>> = models.iter().map(|m| name(m)).collect();
        let taken = self.turns.take_next(&models);
        self.turns.assert_consistent();
        taken
    }
}

const I: Priority = Priority::Interactive;
const B: Priority = Priority::Batch;

#[test]
fn one_clients_flood_of_a_thousand_delays_another_clients_request_by_at_most_one_turn() {
    let mut f = Fixture::new();
    let flood: Vec<RequestId> = (0..1000).map(|_| f.push("a", "m", I)).collect();
    assert_eq!(f.take(&["m"]), Some(flood[0]));
    assert_eq!(f.take(&["m"]), Some(flood[1]));
    let other = f.push("b", "m", I);
    assert_eq!(
        f.take(&["m"]),
        Some(other),
        "b's request goes at the next turn"
    );
    assert_eq!(f.take(&["m"]), Some(flood[2]), "then the flood resumes");
    assert_eq!(f.turns.len(), 997);
}

#[test]
fn clients_take_turns_and_each_keeps_its_own_order() {
    let mut f = Fixture::new();
    let a: Vec<RequestId> = (0..3).map(|_| f.push("a", "m", I)).collect();
    let b: Vec<RequestId> = (0..3).map(|_| f.push("b", "m", I)).collect();
    let c = f.push("c", "m", I);
    let order: Vec<RequestId> = std::iter::from_fn(|| f.take(&["m"])).collect();
    assert_eq!(order, [a[0], b[0], c, a[1], b[1], a[2], b[2]]);
    assert_eq!(f.turns.len(), 0);
    assert_eq!(f.turns.fifo_count(), 0, "idle clients are forgotten");
}

#[test]
fn a_client_back_from_idling_gets_no_backlog_of_turns() {
    let mut f = Fixture::new();
    let a: Vec<RequestId> = (0..20).map(|_| f.push("a", "m", I)).collect();
    for expected in &a[..10] {
        assert_eq!(f.take(&["m"]), Some(*expected));
    }
    // b waited for nothing during those ten turns: it is not owed ten.
    let b: Vec<RequestId> = (0..3).map(|_| f.push("b", "m", I)).collect();
    let order: Vec<RequestId> = (0..4).filter_map(|_| f.take(&["m"])).collect();
    assert_eq!(order, [b[0], a[10], b[1], a[11]]);
}

#[test]
fn an_interactive_request_overtakes_queued_batch_work() {
    let mut f = Fixture::new();
    let batch: Vec<RequestId> = (0..5).map(|_| f.push("agent", "m", B)).collect();
    let person = f.push("person", "m", I);
    assert_eq!(f.take(&["m"]), Some(person));
    assert_eq!(
        f.take(&["m"]),
        Some(batch[0]),
        "batch goes once no one else waits"
    );
}

#[test]
fn batch_work_gets_a_turn_after_waiting_through_the_ageing_bound_however_much_interactive_work_comes(
) {
    let mut f = Fixture::new();
    let batch = f.push("agent", "m", B);
    for turn in 0..BATCH_AGEING_TURNS {
        let person = f.push("person", "m", I);
        assert_eq!(f.take(&["m"]), Some(person), "turn {turn} is interactive");
    }
    f.push("person", "m", I);
    assert_eq!(
        f.take(&["m"]),
        Some(batch),
        "the aged batch request goes next"
    );
    // The next batch request waits its own bound again.
    let batch = f.push("agent", "m", B);
    for _ in 0..BATCH_AGEING_TURNS {
        f.push("person", "m", I);
    }
    let mut waited = 0;
    while f.take(&["m"]) != Some(batch) {
        waited += 1;
    }
    assert_eq!(waited, BATCH_AGEING_TURNS);
}

#[test]
fn a_slot_takes_only_requests_for_models_its_worker_serves_and_skipped_clients_keep_their_turn() {
    let mut f = Fixture::new();
    let big = f.push("a", "big", I);
    let small_a = f.push("a", "small", I);
    let small_b = f.push("b", "small", I);
    assert_eq!(f.take(&["other"]), None);
    assert_eq!(
        f.take(&["small"]),
        Some(small_a),
        "a's oldest request for small"
    );
    assert_eq!(
        f.take(&["small", "big"]),
        Some(small_b),
        "b's turn: a just had one"
    );
    assert_eq!(f.take(&["small", "big"]), Some(big));
    assert_eq!(f.take(&["small", "big"]), None);
}

#[test]
fn a_requeued_request_goes_back_to_the_head_of_its_clients_queue() {
    let mut f = Fixture::new();
    let first = f.push("a", "m", I);
    let second = f.push("a", "m", I);
    assert_eq!(f.take(&["m"]), Some(first));
    // Its worker died: it comes back with its old id.
    f.put(first, Some("a"), "m", I);
    assert_eq!(f.take(&["m"]), Some(first));
    assert_eq!(f.take(&["m"]), Some(second));
}

#[test]
fn removing_a_request_takes_no_turn_and_removing_twice_changes_nothing() {
    let mut f = Fixture::new();
    let a1 = f.push("a", "m", I);
    let a2 = f.push("a", "m", I);
    let b = f.push("b", "m", I);
    let seat = |client: &'static str| (name("m"), Some(name(client)));
    let (model, client) = seat("a");
    let at = Seat {
        model: &model,
        client: &client,
        priority: I,
        weight: 1,
    };
    assert!(f.turns.remove(a1, at));
    assert!(!f.turns.remove(a1, at), "already gone");
    let wrong_class = Seat { priority: B, ..at };
    assert!(!f.turns.remove(a2, wrong_class), "not queued as batch");
    assert_eq!(
        f.take(&["m"]),
        Some(a2),
        "a had no turn taken: its older request goes first"
    );
    assert_eq!(f.take(&["m"]), Some(b));
}

#[test]
fn requests_without_a_known_client_share_one_queue() {
    let mut f = Fixture::new();
    let anonymous = [f.next, f.next + 1];
    f.next += 2;
    for id in anonymous {
        f.put(id, None, "m", I);
    }
    let keyed = f.push("k", "m", I);
    let order: Vec<RequestId> = std::iter::from_fn(|| f.take(&["m"])).collect();
    assert_eq!(order, [anonymous[0], keyed, anonymous[1]]);
}

#[test]
fn a_request_that_found_a_free_slot_counts_as_its_clients_turn() {
    let mut f = Fixture::new();
    // a's first request went straight to the only slot; the rest of its burst queues.
    let a = Some(name("a"));
    f.turns.served_directly(Seat {
        model: &name("m"),
        client: &a,
        priority: I,
        weight: 1,
    });
    let a: Vec<RequestId> = (0..3).map(|_| f.push("a", "m", I)).collect();
    let b = f.push("b", "m", I);
    assert_eq!(f.take(&["m"]), Some(b), "b has had no turn, a has had one");
    assert_eq!(f.take(&["m"]), Some(a[0]));
}

#[test]
fn idle_clients_are_remembered_only_while_ahead_and_a_bounded_number_of_them() {
    let mut f = Fixture::new();
    for i in 0..(MAX_REMEMBERED_CLIENTS + 10) {
        f.turns.served_directly(Seat {
            model: &name("m"),
            client: &Some(name(&format!("10.0.{}.{}", i / 256, i % 256))),
            priority: I,
            weight: 1,
        });
        f.turns.assert_consistent();
    }
    assert!(f.turns.interactive.ahead.len() <= MAX_REMEMBERED_CLIENTS);
    // Past the bound they were forgotten at once; the ones served since are remembered, ahead.
    assert_eq!(f.turns.interactive.ahead.len(), 10);
    // One of them served once more moves the class up: the others, no longer ahead, are
    // forgotten.
    let again = f.push("10.0.4.6", "m", I);
    let other = f.push("x", "m", I);
    assert_eq!(f.take(&["m"]), Some(other));
    assert_eq!(f.take(&["m"]), Some(again));
    assert!(
        f.turns.interactive.ahead.len() <= 1,
        "{}",
        f.turns.interactive.ahead.len()
    );
}

#[test]
fn a_heavier_client_takes_as_many_turns_as_its_weight_for_each_turn_of_a_weight_one_client() {
    let mut f = Fixture::new();
    f.weights.insert("heavy".into(), 3);
    let heavy: Vec<RequestId> = (0..30).map(|_| f.push("heavy", "m", I)).collect();
    let light: Vec<RequestId> = (0..30).map(|_| f.push("light", "m", I)).collect();
    let order: Vec<RequestId> = (0..20).map(|_| f.take(&["m"]).unwrap()).collect();
    let heavy_turns = order.iter().filter(|id| heavy.contains(id)).count();
    let light_turns = order.iter().filter(|id| light.contains(id)).count();
    assert_eq!((heavy_turns, light_turns), (15, 5), "3 to 1: {order:?}");
    // Each keeps its own order.
    let heavy_served: Vec<RequestId> = order
        .iter()
        .copied()
        .filter(|id| heavy.contains(id))
        .collect();
    assert_eq!(heavy_served, heavy[..15]);
}

#[test]
fn a_newcomer_waits_at_most_one_turn_behind_a_flood_of_the_heaviest_weight() {
    let mut f = Fixture::new();
    f.weights.insert("flood".into(), MAX_WEIGHT);
    let flood: Vec<RequestId> = (0..1000).map(|_| f.push("flood", "m", I)).collect();
    for expected in &flood[..40] {
        assert_eq!(f.take(&["m"]), Some(*expected));
    }
    let other = f.push("other", "m", I);
    let next_two = [f.take(&["m"]).unwrap(), f.take(&["m"]).unwrap()];
    assert!(next_two.contains(&other), "{next_two:?}");
}

#[test]
fn every_weight_costs_a_whole_number_of_units() {
    for weight in 1..=MAX_WEIGHT {
        assert_eq!(STRIDE % u64::from(weight), 0, "weight {weight}");
    }
    assert_eq!(stride(0), STRIDE, "0 is an even share");
    assert_eq!(stride(1000), STRIDE / u64::from(MAX_WEIGHT), "capped");
}
