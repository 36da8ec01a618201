//! What the hub hands the proxy's store to keep across restarts, and takes back at start: the
//! boxes asleep (`sleeper_store`) and what was measured of each box (`speed_store`).

use super::*;

impl Hub {
    /// Changes whenever a box falls asleep, wakes or is forgotten.
    pub fn sleeper_changes(&self) -> watch::Receiver<u64> {
        self.lock().sleepers_changed.subscribe()
    }

    /// Changes whenever a box is measured: an answer's timings, how long it took to wake.
    pub fn measured_changes(&self) -> watch::Receiver<u64> {
        self.lock().measured.subscribe()
    }

    /// Everything measured of every box, connected or not (see [`Scheduler::known_boxes`]).
    pub fn known_boxes(&self) -> Vec<KnownBox> {
        self.lock().scheduler.known_boxes()
    }

    /// What an earlier run of the proxy measured of `boxes`, the one measured longest ago first.
    pub fn restore_known_boxes(&self, boxes: Vec<KnownBox>) {
        self.lock().scheduler.restore_known(boxes);
    }

    /// Boxes a previous run of the proxy knew asleep (`since_unix_ms` each): listed and woken
    /// as if they had fallen asleep in this run, for what is left of their remembered time.
    pub fn restore_sleepers(&self, boxes: Vec<Remembered>) {
        let mut inner = self.lock();
        let (now, now_unix_ms) = (Instant::now(), unix_ms());
        let mut any = false;
        for remembered in boxes {
            any |= inner.sleepers.restore(remembered, now, now_unix_ms);
        }
        if any {
            inner.sync_asleep();
        }
    }
}
