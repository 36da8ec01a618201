//! Whether the connection to the proxy is still alive: a silence watchdog, and a probe after the
//! box slept.
//!
//! A partition leaves a half-open connection that never ends by itself, so hearing nothing from
//! the proxy (not even a pong to our own ping) for the silence timeout ends it. A suspend is
//! worse: the monotonic clock every timer runs on stops while the box sleeps, so after a night
//! in suspend the watchdog believes no time passed and the worker would sit on a dead socket for
//! the whole timeout (and keep requests the proxy gave to others long ago). A sleep shows as the
//! wall clock running ahead of the monotonic one between two ticks (on Linux, macOS and Windows
//! alike); then the worker pings at once and gives the connection up if nothing answers within
//! [`PROBE`]. A wall clock set forward by hand costs one ping.
//!
//! Pure: both clocks are arguments.

use std::time::{Duration, Instant, SystemTime};

/// How often the session looks: bounds how long a resumed box takes to notice it slept.
pub const TICK: Duration = Duration::from_secs(3);

/// How long a ping sent after a sleep may go unanswered before the connection is given up.
pub const PROBE: Duration = Duration::from_secs(3);

/// A jump of the wall clock past the monotonic one beyond this counts as a sleep (ticks run
/// late on a busy machine, but both clocks see that).
const SLEEP_JUMP: Duration = Duration::from_secs(2);

/// What to do after a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// All is well.
    Fine,
    /// Ask the proxy for a pong (every WebSocket peer answers a ping).
    Ping,
    /// The connection is dead: end it, for this reason.
    GiveUp(String),
}

/// The watchdog of one connection.
#[derive(Debug)]
pub struct Liveness {
    silence: Duration,
    last_tick: (Instant, SystemTime),
    /// A ping sent after a sleep of this long, at this instant, not answered yet.
    probe: Option<(Instant, Duration)>,
}

impl Liveness {
    /// A watchdog giving the proxy up after `silence` without a word, started at `now`/`wall`.
    pub fn new(silence: Duration, now: Instant, wall: SystemTime) -> Liveness {
        Liveness {
            silence,
            last_tick: (now, wall),
            probe: None,
        }
    }

    /// A tick at `now`/`wall`; the proxy was last heard at `last_heard`.
    pub fn tick(&mut self, now: Instant, wall: SystemTime, last_heard: Instant) -> Verdict {
        let (before, wall_before) = std::mem::replace(&mut self.last_tick, (now, wall));
        let monotonic = now.saturating_duration_since(before);
        let slept = wall
            .duration_since(wall_before)
            .unwrap_or_default()
            .saturating_sub(monotonic);
        let quiet = now.saturating_duration_since(last_heard);
        if quiet >= self.silence {
            return Verdict::GiveUp(format!(
                "nothing heard from the proxy for {} s",
                quiet.as_secs()
            ));
        }
        if slept >= SLEEP_JUMP {
            self.probe = Some((now, slept));
            return Verdict::Ping;
        }
        if let Some((sent, slept)) = self.probe {
            if last_heard >= sent {
                self.probe = None;
            } else if now.saturating_duration_since(sent) >= PROBE {
                self.probe = None;
                return Verdict::GiveUp(format!(
                    "this box slept {} s and its connection to the proxy did not survive",
                    slept.as_secs()
                ));
            }
        }
        if quiet >= self.silence / 2 {
            Verdict::Ping
        } else {
            Verdict::Fine
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SILENCE: Duration = Duration::from_secs(60);

    /// Clocks that advance together (`secs` of both), or with the wall clock alone
    /// (`asleep_secs`: the box was suspended).
    struct Clocks {
        now: Instant,
        wall: SystemTime,
    }

    impl Clocks {
        fn new() -> Clocks {
            Clocks {
                now: Instant::now(),
                wall: SystemTime::now(),
            }
        }
        fn pass(&mut self, secs: u64) -> (Instant, SystemTime) {
            self.now += Duration::from_secs(secs);
            self.wall += Duration::from_secs(secs);
            (self.now, self.wall)
        }
        fn sleep(&mut self, secs: u64) {
            self.wall += Duration::from_secs(secs);
        }
    }

    #[test]
    fn a_proxy_heard_from_is_fine_a_quiet_one_is_pinged_then_given_up() {
        let mut clocks = Clocks::new();
        let mut live = Liveness::new(SILENCE, clocks.now, clocks.wall);
        let heard = clocks.now;
        let (now, wall) = clocks.pass(3);
        assert_eq!(live.tick(now, wall, heard), Verdict::Fine);
        let (now, wall) = clocks.pass(30);
        assert_eq!(live.tick(now, wall, heard), Verdict::Ping);
        let (now, wall) = clocks.pass(30);
        assert!(
            matches!(live.tick(now, wall, heard), Verdict::GiveUp(why) if why.contains("63 s"))
        );
    }

    #[test]
    fn after_a_sleep_the_proxy_is_pinged_at_once_and_given_up_if_silent() {
        let mut clocks = Clocks::new();
        let mut live = Liveness::new(SILENCE, clocks.now, clocks.wall);
        let (now, wall) = clocks.pass(3);
        assert_eq!(live.tick(now, wall, now), Verdict::Fine);
        // Eight hours suspended: the monotonic clock did not move.
        clocks.sleep(8 * 3600);
        let (now, wall) = clocks.pass(1);
        let heard = now - Duration::from_secs(1);
        assert_eq!(
            live.tick(now, wall, heard),
            Verdict::Ping,
            "a probe at once"
        );
        let (now, wall) = clocks.pass(3);
        let verdict = live.tick(now, wall, heard);
        assert!(
            matches!(&verdict, Verdict::GiveUp(why) if why.contains("slept 28800 s")),
            "{verdict:?}"
        );
    }

    #[test]
    fn after_a_sleep_a_proxy_that_answers_keeps_the_connection() {
        let mut clocks = Clocks::new();
        let mut live = Liveness::new(SILENCE, clocks.now, clocks.wall);
        clocks.sleep(600);
        let (now, wall) = clocks.pass(3);
        assert_eq!(
            live.tick(now, wall, now - Duration::from_secs(3)),
            Verdict::Ping
        );
        let pong = now + Duration::from_millis(40);
        let (now, wall) = clocks.pass(3);
        assert_eq!(live.tick(now, wall, pong), Verdict::Fine);
        let (now, wall) = clocks.pass(3);
        assert_eq!(
            live.tick(now, wall, pong),
            Verdict::Fine,
            "the probe is over"
        );
    }

    #[test]
    fn a_late_tick_on_a_busy_machine_is_not_a_sleep() {
        let mut clocks = Clocks::new();
        let mut live = Liveness::new(SILENCE, clocks.now, clocks.wall);
        // Both clocks ran 20 s between ticks: the process was starved or stopped, not suspended.
        let (now, wall) = clocks.pass(20);
        assert_eq!(
            live.tick(now, wall, now - Duration::from_secs(1)),
            Verdict::Fine
        );
        // A wall clock stepped back (NTP, a user) is not a sleep either.
        clocks.wall -= Duration::from_secs(3600);
        let (now, wall) = clocks.pass(3);
        assert_eq!(live.tick(now, wall, now), Verdict::Fine);
    }
}
