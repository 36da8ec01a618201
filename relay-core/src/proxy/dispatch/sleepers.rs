//! Boxes that went to sleep: which models they served, when they left, and the Wake-on-LAN
//! attempts made for them. A pure registry (no I/O, time is an input) held under the hub's
//! lock: the hub records a box when a worker that said it sleeps leaves, asks which boxes to
//! wake when a request arrives for a model only sleepers serve, and forgets a box when it
//! reconnects or after [`SleeperLimits::remember`].
//!
//! Bounded: at most [`SleeperLimits::max_boxes`] boxes (the oldest sleeper makes room), each
//! with the models its worker was allowed to advertise, so a worker cannot grow it by
//! reconnecting under new names.

use std::net::IpAddr;
use std::time::Instant;

use super::scheduler::WakeCause;
use crate::wake::MacAddress;

pub use crate::settings::SleeperLimits;

/// A box asleep, or being woken.
#[derive(Debug, Clone)]
pub struct Sleeper {
    /// The name its worker registered with.
    pub name: String,
    /// The provider it had joined.
    pub provider: String,
    /// Its network card, if the worker announced one (no packet can be sent otherwise).
    pub mac: Option<MacAddress>,
    /// The address its worker connected from: workers connecting from its LAN relay the packet.
    pub address: Option<IpAddr>,
    /// The models it served when it left.
    pub models: Vec<String>,
    since: Instant,
    /// When it went to sleep, for the dashboard.
    pub since_unix_ms: u64,
    /// The wake attempt under way, if any.
    pub waking: Option<WakeAttempt>,
}

/// One attempt at waking a box: packets sent until it reconnects or a request gives up.
#[derive(Debug, Clone, Copy)]
pub struct WakeAttempt {
    /// When the first packet of this attempt went out, for the dashboard.
    pub since_unix_ms: u64,
    last_packet: Instant,
    /// Packets sent in this attempt.
    pub packets: u32,
    /// Why the attempt began.
    pub cause: WakeCause,
}

/// How a sleeping box is reached: its network card, and the address its worker connected from
/// (workers connecting from its LAN relay the packet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Card {
    /// Its network card, if the worker announced one.
    pub mac: Option<MacAddress>,
    /// Where its worker's connection came from.
    pub address: Option<IpAddr>,
}

/// A packet to send now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeOrder {
    /// The box.
    pub name: String,
    /// Its card.
    pub mac: MacAddress,
    /// Where its worker connected from, for choosing workers on its LAN to relay the packet.
    pub address: Option<IpAddr>,
    /// Why it is woken.
    pub cause: WakeCause,
}

/// A box a previous run of the proxy knew asleep, as its store kept it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    /// The name its worker registered with.
    pub name: String,
    /// The provider it had joined.
    pub provider: String,
    /// How it is reached.
    pub card: Card,
    /// The models it served.
    pub models: Vec<String>,
    /// When it fell asleep (Unix ms).
    pub since_unix_ms: u64,
}

/// The registry.
#[derive(Debug)]
pub struct Sleepers {
    limits: SleeperLimits,
    /// In the order they fell asleep (oldest first): eviction takes the front.
    boxes: Vec<Sleeper>,
    /// Wake attempts begun, by cause (in [`WakeCause::ALL`]'s order).
    attempts: [u64; WakeCause::ALL.len()],
}

impl Sleepers {
    /// An empty registry.
    pub fn new(limits: SleeperLimits) -> Self {
        Sleepers {
            limits,
            boxes: Vec::new(),
            attempts: [0; WakeCause::ALL.len()],
        }
    }

    /// The limits it runs with.
    pub fn limits(&self) -> &SleeperLimits {
        &self.limits
    }

    /// A box went to sleep serving `models` (an earlier entry of the same name or card is
    /// replaced). Returns false when there is nothing to remember (no models) or sleeping
    /// boxes are not remembered at all (`max_boxes` 0).
    pub fn fell_asleep(
        &mut self,
        name: &str,
        provider: &str,
        card: Card,
        models: Vec<String>,
        now: Instant,
        now_unix_ms: u64,
    ) -> bool {
        let Card { mac, address } = card;
        if models.is_empty() || self.limits.max_boxes == 0 {
            return false;
        }
        self.woke(name, mac);
        if self.boxes.len() >= self.limits.max_boxes {
            self.boxes.remove(0);
        }
        self.boxes.push(Sleeper {
            name: name.to_string(),
            provider: provider.to_string(),
            mac,
            address,
            models,
            since: now,
            since_unix_ms: now_unix_ms,
            waking: None,
        });
        true
    }

    /// A box a previous run of the proxy knew asleep: remembered for what is left of
    /// [`SleeperLimits::remember`] (false when that has passed, or it serves nothing).
    pub fn restore(&mut self, remembered: Remembered, now: Instant, now_unix_ms: u64) -> bool {
        let Remembered {
            name,
            provider,
            card,
            models,
            since_unix_ms,
        } = remembered;
        let age = std::time::Duration::from_millis(now_unix_ms.saturating_sub(since_unix_ms));
        if age >= self.limits.remember {
            return false;
        }
        let since = now.checked_sub(age).unwrap_or(now);
        if !self.fell_asleep(&name, &provider, card, models, since, since_unix_ms) {
            return false;
        }
        // Oldest first, as if they had fallen asleep in this run.
        self.boxes.sort_by_key(|s| s.since_unix_ms);
        true
    }

    /// A worker with this name (or card) connected: the box is awake. Returns the sleepers
    /// removed (usually none or one).
    pub fn woke(&mut self, name: &str, mac: Option<MacAddress>) -> Vec<Sleeper> {
        let (gone, kept): (Vec<Sleeper>, Vec<Sleeper>) = std::mem::take(&mut self.boxes)
            .into_iter()
            .partition(|s| s.name == name || (mac.is_some() && s.mac == mac));
        self.boxes = kept;
        gone
    }

    /// Forgets boxes asleep for longer than [`SleeperLimits::remember`]; true if any was.
    pub fn forget_expired(&mut self, now: Instant) -> bool {
        let before = self.boxes.len();
        let remember = self.limits.remember;
        self.boxes
            .retain(|s| now.saturating_duration_since(s.since) < remember);
        self.boxes.len() != before
    }

    /// A request for `model` arrived and no connected worker serves it (or cost routing chose
    /// to wake box `only`, for `cause`): the boxes serving it (that one) that are due a packet
    /// (none sent in this attempt within [`SleeperLimits::retry`]), marked waking. A flood of
    /// requests costs one packet per box per retry interval.
    pub fn wake_for(
        &mut self,
        model: &str,
        only: Option<&str>,
        cause: WakeCause,
        now: Instant,
        now_unix_ms: u64,
    ) -> Vec<WakeOrder> {
        let retry = self.limits.retry;
        let mut orders = Vec::new();
        for sleeper in self.boxes.iter_mut() {
            let wanted = only.is_none_or(|name| sleeper.name == name);
            if !wanted || !sleeper.models.iter().any(|m| m == model) {
                continue;
            }
            let Some(mac) = sleeper.mac else {
                continue;
            };
            let due = match &sleeper.waking {
                None => true,
                Some(attempt) => now.saturating_duration_since(attempt.last_packet) >= retry,
            };
            if !due {
                continue;
            }
            if sleeper.waking.is_none() {
                self.attempts[cause as usize] += 1;
            }
            let attempt = sleeper.waking.get_or_insert(WakeAttempt {
                since_unix_ms: now_unix_ms,
                last_packet: now,
                packets: 0,
                cause,
            });
            attempt.last_packet = now;
            attempt.packets += 1;
            orders.push(WakeOrder {
                name: sleeper.name.clone(),
                mac,
                address: sleeper.address,
                cause: attempt.cause,
            });
        }
        orders
    }

    /// Wake attempts begun since the proxy started, by cause (every cause listed).
    pub fn attempt_counts(&self) -> Vec<(WakeCause, u64)> {
        WakeCause::ALL
            .iter()
            .map(|cause| (*cause, self.attempts[*cause as usize]))
            .collect()
    }

    /// A request for `model` gave up waiting: the boxes serving it that were being woken (and
    /// did not reconnect in time) are plain sleepers again; their names, for the 504's message.
    pub fn gave_up(&mut self, model: &str) -> Vec<String> {
        let mut names = Vec::new();
        for sleeper in self.boxes.iter_mut() {
            if sleeper.models.iter().any(|m| m == model) {
                sleeper.waking = None;
                names.push(sleeper.name.clone());
            }
        }
        names
    }

    /// (provider, model) of every model only sleeping boxes serve, for the scheduler's claim.
    pub fn models(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .boxes
            .iter()
            .flat_map(|s| s.models.iter().map(|m| (s.provider.clone(), m.clone())))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Every box, oldest sleeper first.
    pub fn boxes(&self) -> &[Sleeper] {
        &self.boxes
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn card(mac: Option<MacAddress>) -> Card {
        Card { mac, address: None }
    }

    fn limits(max_boxes: usize) -> SleeperLimits {
        SleeperLimits {
            remember: Duration::from_secs(60),
            max_boxes,
            retry: Duration::from_secs(10),
        }
    }

    fn mac(last: u8) -> Option<MacAddress> {
        Some(MacAddress::from_octets([2, 0, 0, 0, 0, last]).unwrap())
    }

    #[test]
    fn a_box_from_a_previous_run_is_remembered_for_what_is_left_of_its_time() {
        let mut s = Sleepers::new(limits(8));
        let t0 = Instant::now() + Duration::from_secs(120);
        let now_ms = 1_000_000;
        let asleep = |name: &str, last: u8, since_unix_ms: u64| Remembered {
            name: name.into(),
            provider: "local".into(),
            card: card(mac(last)),
            models: vec!["m".into()],
            since_unix_ms,
        };
        assert!(s.restore(asleep("late", 2, now_ms - 10_000), t0, now_ms));
        assert!(s.restore(asleep("early", 1, now_ms - 50_000), t0, now_ms));
        assert!(!s.restore(asleep("stale", 3, now_ms - 61_000), t0, now_ms));
        let names: Vec<&str> = s.boxes().iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["early", "late"], "oldest first");
        assert!(!s.forget_expired(t0 + Duration::from_secs(9)));
        assert!(
            s.forget_expired(t0 + Duration::from_secs(11)),
            "early's 60 s are up"
        );
        assert_eq!(s.boxes().len(), 1);
        assert_eq!(
            s.wake_for("m", None, WakeCause::NothingAwake, t0, now_ms)
                .len(),
            1,
            "a restored box is woken"
        );
    }

    #[test]
    fn a_flood_of_requests_sends_one_packet_per_box_per_retry_interval() {
        let mut s = Sleepers::new(limits(8));
        let t0 = Instant::now();
        assert!(s.fell_asleep("gpu-1", "local", card(mac(1)), vec!["m".into()], t0, 1000));
        assert!(s.fell_asleep("gpu-2", "local", card(None), vec!["m".into()], t0, 1000));
        let first = s.wake_for("m", None, WakeCause::NothingAwake, t0, 2000);
        assert_eq!(first.len(), 1, "only the box with a card gets a packet");
        assert_eq!(first[0].name, "gpu-1");
        for i in 1..1000 {
            let at = t0 + Duration::from_millis(i * 5);
            assert!(s
                .wake_for("m", None, WakeCause::NothingAwake, at, 2000)
                .is_empty());
        }
        assert_eq!(
            s.wake_for(
                "m",
                None,
                WakeCause::NothingAwake,
                t0 + Duration::from_secs(10),
                3000
            )
            .len(),
            1
        );
        let attempt = s.boxes()[0].waking.unwrap();
        assert_eq!(attempt.packets, 2);
        assert_eq!(attempt.since_unix_ms, 2000, "the attempt keeps its start");
        assert_eq!(attempt.cause, WakeCause::NothingAwake);
        let attempts: Vec<u64> = s.attempt_counts().iter().map(|(_, n)| *n).collect();
        assert_eq!(attempts, [1, 0, 0, 0], "one attempt, however many packets");
        assert!(s
            .wake_for("other", None, WakeCause::NothingAwake, t0, 0)
            .is_empty());
    }

    #[test]
    fn the_registry_is_bounded_and_forgets_old_sleepers() {
        let mut s = Sleepers::new(limits(3));
        let t0 = Instant::now();
        for i in 0..10u8 {
            s.fell_asleep(
                &format!("b{i}"),
                "local",
                card(mac(i)),
                vec!["m".into()],
                t0,
                0,
            );
        }
        let names: Vec<&str> = s.boxes().iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["b7", "b8", "b9"], "the oldest make room");
        assert!(!s.fell_asleep("empty", "local", card(mac(1)), vec![], t0, 0));
        assert!(!s.forget_expired(t0 + Duration::from_secs(59)));
        assert!(s.forget_expired(t0 + Duration::from_secs(60)));
        assert!(s.boxes().is_empty());
        assert!(!Sleepers::new(limits(0)).fell_asleep(
            "b",
            "local",
            card(None),
            vec!["m".into()],
            t0,
            0
        ));
    }

    #[test]
    fn a_box_wakes_by_name_or_card_and_falls_asleep_once() {
        let mut s = Sleepers::new(limits(8));
        let t0 = Instant::now();
        s.fell_asleep("gpu-1", "local", card(mac(1)), vec!["a".into()], t0, 0);
        s.fell_asleep("gpu-1", "local", card(mac(1)), vec!["b".into()], t0, 0);
        assert_eq!(s.boxes().len(), 1, "replaced, not duplicated");
        assert_eq!(s.models(), [("local".to_string(), "b".to_string())]);
        assert_eq!(s.woke("renamed", mac(1)).len(), 1, "same card, new name");
        s.fell_asleep("gpu-1", "local", card(mac(1)), vec!["b".into()], t0, 0);
        assert!(s.woke("other", None).is_empty());
        assert_eq!(s.woke("gpu-1", None).len(), 1);
    }
}
