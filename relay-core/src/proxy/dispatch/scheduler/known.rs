//! What the proxy knows of boxes beyond their connections: the speeds of boxes that left (asleep,
//! restarting, reconnecting) and how long each took to wake, so a box coming back is routed by
//! what was measured of it at once; and all of it as [`KnownBox`]es, which the hub keeps in the
//! store so that a restarted proxy starts measured.

use std::collections::HashMap;
use std::sync::Arc;

use super::cost::Speed;
use super::Scheduler;

/// What is known of one box, as kept across the proxy's restarts.
#[derive(Debug, Clone, PartialEq)]
pub struct KnownBox {
    /// The name its worker registers with.
    pub name: String,
    /// Its speeds, by model.
    pub speeds: Vec<(String, Speed)>,
    /// Seconds it took to wake (a moving average), if it was ever woken.
    pub wake_secs: Option<f64>,
}

impl Scheduler {
    /// Everything measured of every box, connected or not: those remembered longest ago first,
    /// then the connected ones (their speeds now). Boxes with nothing measured are left out.
    pub fn known_boxes(&self) -> Vec<KnownBox> {
        let mut order: Vec<(&String, &Known)> = self.known_speeds.boxes.iter().collect();
        order.sort_by_key(|(_, known)| known.stamp);
        let mut boxes: Vec<KnownBox> = order
            .into_iter()
            .map(|(name, known)| KnownBox {
                name: name.clone(),
                speeds: sorted(&known.speeds),
                wake_secs: known.wake_secs,
            })
            .collect();
        let mut ids: Vec<_> = self.workers.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let worker = &self.workers[&id];
            if worker.speeds.is_empty() {
                continue;
            }
            let speeds = sorted(&worker.speeds);
            match boxes.iter().position(|b| b.name == worker.name) {
                Some(at) => {
                    let mut known = boxes.remove(at);
                    known.speeds = speeds;
                    boxes.push(known);
                }
                None => boxes.push(KnownBox {
                    name: worker.name.clone(),
                    speeds,
                    wake_secs: None,
                }),
            }
        }
        boxes
    }

    /// Takes back what an earlier run of the proxy knew of `boxes` (the one remembered longest
    /// ago first). What this run has measured already wins; rates that are not finite positive
    /// numbers and wake times beyond the longest one measured (a damaged store) are dropped.
    pub fn restore_known(&mut self, boxes: Vec<KnownBox>) {
        for known in boxes {
            let speeds: HashMap<Arc<str>, Speed> = known
                .speeds
                .into_iter()
                .filter_map(|(model, speed)| Some((Arc::from(model.as_str()), sane(speed)?)))
                .collect();
            // The same bound as a wake measured in this run.
            let longest = super::wake::LONGEST_WAKE.as_secs_f64();
            let wake_secs = known.wake_secs.filter(|s| (0.0..=longest).contains(s));
            if speeds.is_empty() || self.known_speeds.boxes.contains_key(&known.name) {
                continue;
            }
            for worker in self.workers.values_mut() {
                if worker.name == known.name && worker.speeds.is_empty() {
                    worker.speeds.clone_from(&speeds);
                }
            }
            self.known_speeds.remember(&known.name, speeds);
            if let Some(secs) = wake_secs {
                self.known_speeds.learn_wake(&known.name, secs, 1.0);
            }
        }
    }
}

/// `speeds` by model name, in name order.
fn sorted(speeds: &HashMap<Arc<str>, Speed>) -> Vec<(String, Speed)> {
    let mut list: Vec<(String, Speed)> = speeds
        .iter()
        .map(|(model, speed)| (model.to_string(), *speed))
        .collect();
    list.sort_by(|a, b| a.0.cmp(&b.0));
    list
}

/// `speed` with every rate that is not a finite positive number dropped; `None` if nothing is
/// left.
fn sane(speed: Speed) -> Option<Speed> {
    let keep = |rate: Option<f64>| rate.filter(|r| r.is_finite() && *r > 0.0);
    let speed = Speed {
        prompt_tps: keep(speed.prompt_tps),
        generation_tps: keep(speed.generation_tps),
        typical_output: keep(speed.typical_output),
        typical_turn_output: keep(speed.typical_turn_output),
    };
    (speed != Speed::default()).then_some(speed)
}

/// Boxes remembered with their speeds after they left, at most.
const KNOWN_BOXES: usize = 256;

/// The speeds of boxes that left, by worker name (a box asleep, restarting or reconnecting),
/// so that one coming back is routed by what was measured of it at once, and how long each took
/// to wake; and the boxes asleep now (`wake`). Bounded: the box remembered longest ago makes
/// room.
#[derive(Debug, Default)]
pub(super) struct KnownSpeeds {
    boxes: HashMap<String, Known>,
    stamp: u64,
    asleep: Vec<super::AsleepBox>,
}

/// What is known of one box.
#[derive(Debug, Default)]
struct Known {
    /// When it was last remembered, for eviction.
    stamp: u64,
    speeds: HashMap<Arc<str>, Speed>,
    /// Seconds from the first Wake-on-LAN packet to its worker's registration (a moving
    /// average).
    wake_secs: Option<f64>,
}

impl KnownSpeeds {
    /// Box `name` left with these `speeds`.
    pub(super) fn remember(&mut self, name: &str, speeds: HashMap<Arc<str>, Speed>) {
        if speeds.is_empty() {
            return;
        }
        if self.boxes.len() >= KNOWN_BOXES && !self.boxes.contains_key(name) {
            let oldest = self
                .boxes
                .iter()
                .min_by_key(|(_, known)| known.stamp)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                self.boxes.remove(&oldest);
            }
        }
        self.stamp += 1;
        let known = self.boxes.entry(name.to_string()).or_default();
        known.stamp = self.stamp;
        known.speeds = speeds;
    }

    /// What was measured of box `name` before it left (nothing for a new box).
    pub(super) fn recall(&self, name: &str) -> HashMap<Arc<str>, Speed> {
        self.boxes
            .get(name)
            .map(|known| known.speeds.clone())
            .unwrap_or_default()
    }

    /// Box `name`'s speed on `model` when it left.
    pub(super) fn speed(&self, name: &str, model: &str) -> Option<Speed> {
        self.boxes.get(name)?.speeds.get(model).copied()
    }

    /// Box `name` took `secs` to wake; `weight` is how far the estimate moves towards it. Only
    /// boxes remembered (with their speeds) are kept: a wake time alone routes nothing.
    pub(super) fn learn_wake(&mut self, name: &str, secs: f64, weight: f64) {
        if let Some(known) = self.boxes.get_mut(name) {
            let old = known.wake_secs.unwrap_or(secs);
            known.wake_secs = Some(old + weight * (secs - old));
        }
    }

    /// How long box `name` was measured to take to wake.
    pub(super) fn wake_secs(&self, name: &str) -> Option<f64> {
        self.boxes.get(name)?.wake_secs
    }

    /// The boxes asleep now.
    pub(super) fn asleep(&self) -> &[super::AsleepBox] {
        &self.asleep
    }

    pub(super) fn set_asleep(&mut self, boxes: Vec<super::AsleepBox>) {
        self.asleep = boxes;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::cost::tests::{fleet, place};
    use super::super::tests::register;
    use super::*;

    #[test]
    fn a_box_that_reconnects_keeps_its_measured_speed_and_the_memory_stays_bounded() {
        let now = Instant::now();
        let (mut s, ids) = fleet(true, &[Some(600.0), Some(3000.0)]);
        let measured = s.speed(ids[1], "m");
        assert!(measured.is_some());
        s.worker_gone(ids[1], now);
        let back = register(&mut s, "box-1", &["m"], 4).worker;
        assert_ne!(back, ids[1], "a new connection");
        assert_eq!(s.speed(back, "m"), measured, "known at once");
        assert_eq!(place(&mut s, 1, 7, 12_000, now), back, "and routed by it");
        let mut known = KnownSpeeds::default();
        let one = HashMap::from([(Arc::from("m"), Speed::default())]);
        for i in 0..(KNOWN_BOXES + 10) {
            known.remember(&format!("box-{i}"), one.clone());
        }
        assert_eq!(known.boxes.len(), KNOWN_BOXES);
        assert!(known.recall("box-0").is_empty(), "the oldest made room");
        assert_eq!(known.recall(&format!("box-{}", KNOWN_BOXES + 9)).len(), 1);
    }

    #[test]
    fn a_restarted_proxy_routes_by_what_an_earlier_run_measured() {
        let now = Instant::now();
        let (mut before, ids) = fleet(true, &[Some(600.0), Some(3000.0)]);
        before.learn_wake("asleep", std::time::Duration::from_secs(9));
        before.worker_gone(ids[0], now);
        before.learn_wake("box-0", std::time::Duration::from_secs(12));
        let kept = before.known_boxes();
        let names: Vec<&str> = kept.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["box-0", "box-1"], "the box that left first");
        assert_eq!(kept[0].wake_secs, Some(12.0));
        assert_eq!(kept[1].speeds[0].1, before.speed(ids[1], "m").unwrap());

        // A new proxy: box-1 registers before the store is read, box-0 after.
        let (mut after, _) = fleet(true, &[]);
        let fast = register(&mut after, "box-1", &["m"], 4).worker;
        after.restore_known(kept.clone());
        let slow = register(&mut after, "box-0", &["m"], 4).worker;
        assert_eq!(after.speed(fast, "m"), before.speed(ids[1], "m"));
        assert_eq!(after.speed(slow, "m").unwrap().prompt_tps, Some(600.0));
        assert_eq!(
            after.wake_time("box-0"),
            Some(std::time::Duration::from_secs(12))
        );
        // Measured, so a long prompt goes to the faster box at once (unmeasured boxes would
        // keep the usual rule: the first registered, the slow one, with the lower id).
        assert_eq!(place(&mut after, 1, 7, 12_000, now), fast);
        let mut round_trip = after.known_boxes();
        round_trip.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(round_trip, kept, "nothing lost in the round trip");
    }

    #[test]
    fn measurements_of_this_run_win_and_damaged_ones_are_dropped() {
        let (mut s, ids) = fleet(true, &[Some(600.0)]);
        let mine = s.speed(ids[0], "m");
        let broken = Speed {
            prompt_tps: Some(f64::NAN),
            generation_tps: Some(-4.0),
            typical_output: Some(f64::INFINITY),
            typical_turn_output: Some(-1.0),
        };
        let half = Speed {
            prompt_tps: Some(0.0),
            generation_tps: Some(25.0),
            typical_output: None,
            typical_turn_output: None,
        };
        s.restore_known(vec![
            KnownBox {
                name: "box-0".into(),
                speeds: vec![("m".into(), half)],
                wake_secs: None,
            },
            KnownBox {
                name: "broken".into(),
                speeds: vec![("m".into(), broken)],
                wake_secs: Some(f64::NAN),
            },
            KnownBox {
                name: "half".into(),
                speeds: vec![("m".into(), half), ("n".into(), broken)],
                wake_secs: Some(-1.0),
            },
            KnownBox {
                name: "a year to wake".into(),
                speeds: vec![("m".into(), half)],
                wake_secs: Some(3.2e7),
            },
        ]);
        assert_eq!(s.speed(ids[0], "m"), mine, "this run's measurement kept");
        let known = s.known_boxes();
        let names: Vec<&str> = known.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["half", "a year to wake", "box-0"], "{known:?}");
        assert_eq!(known[1].wake_secs, None);
        let expected = Speed {
            prompt_tps: None,
            ..half
        };
        assert_eq!(known[0].speeds, vec![("m".to_string(), expected)]);
        assert_eq!(known[0].wake_secs, None);
    }
}
