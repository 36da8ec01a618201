//! A bound on the bytes the worker has written that the proxy has not read yet.
//!
//! Without one, every byte the proxy has not read yet waits in the kernel's socket buffers, which
//! grow to hundreds of kilobytes, and a new stream's first chunk queues behind all of it (measured
//! on `stream64` with `ss`: up to 370 KB in the proxy's receive queue, 10–18 ms). With a window the
//! backlog stays in the worker's per-request lanes, where a first chunk can go ahead of it.
//!
//! The proxy's reading is observed with standard WebSocket ping frames, no protocol extension:
//! after a burst the worker pings with the number of bytes written so far as payload, and a peer
//! answers a ping with a pong carrying the same payload once it has *read* the ping (RFC 6455
//! §5.5.2), so a pong acknowledges every byte before its ping. The window only starts limiting
//! once a first pong proved that the peer answers pings; a peer that does not is never held back.

use bytes::Bytes;

/// Bytes written but not yet acknowledged beyond which started streams wait. Measured on
/// `stream64` (TTFB p50 added / chunks per second against direct): 16 KiB 0.8–1.2 ms / 0.72–0.75,
/// 32 KiB 1.7–2.3 ms / 0.72–0.78, 64 KiB 4–6 ms, unbounded 15 ms; throughput did not drop with
/// the smaller windows once the worker sent bigger chunks (BENCHMARKS.md).
const WINDOW_BYTES: u64 = 16 * 1024;

/// A ping goes out after this many bytes, so a closed window reopens in steps of this size.
const PING_EVERY_BYTES: u64 = WINDOW_BYTES / 4;

/// Written and acknowledged byte counts of one connection.
#[derive(Debug, Default)]
pub struct FlowWindow {
    written: u64,
    acknowledged: u64,
    /// The offset carried by the last ping sent.
    pinged: u64,
    /// Whether the peer answered a ping yet.
    answered: bool,
}

impl FlowWindow {
    /// Whether started streams may write more.
    pub fn is_open(&self) -> bool {
        !self.answered || self.written - self.acknowledged < WINDOW_BYTES
    }

    /// `bytes` more were written.
    pub fn wrote(&mut self, bytes: usize) {
        self.written += bytes as u64;
    }

    /// The payload of a ping to send after a burst, when one is due: enough was written since
    /// the last one, or the window is closed and the last ping does not cover everything.
    pub fn ping_due(&mut self) -> Option<Bytes> {
        let unpinged = self.written - self.pinged;
        if unpinged == 0 || (unpinged < PING_EVERY_BYTES && self.is_open()) {
            return None;
        }
        Some(self.ping())
    }

    /// A ping payload for everything written so far (also the probe sent at the start).
    pub fn ping(&mut self) -> Bytes {
        self.pinged = self.written;
        Bytes::copy_from_slice(&self.written.to_be_bytes())
    }

    /// A pong arrived. Only a payload this window could have sent counts: a peer may send pongs
    /// of its own (RFC 6455 allows unsolicited ones).
    pub fn on_pong(&mut self, payload: &[u8]) {
        let Ok(bytes) = <[u8; 8]>::try_from(payload) else {
            return;
        };
        let offset = u64::from_be_bytes(bytes);
        if offset <= self.pinged {
            self.answered = true;
            self.acknowledged = self.acknowledged.max(offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_limits_only_after_a_first_pong() {
        let mut window = FlowWindow::default();
        window.wrote(10 * WINDOW_BYTES as usize);
        assert!(
            window.is_open(),
            "a peer not known to answer pings is never held back"
        );
        let probe = window.ping();
        window.on_pong(&probe);
        assert!(window.is_open());
        window.wrote(WINDOW_BYTES as usize);
        assert!(!window.is_open());
        let ping = window.ping_due().expect("a closed window pings");
        assert!(window.ping_due().is_none(), "nothing new to cover");
        window.on_pong(&ping);
        assert!(window.is_open());
    }

    #[test]
    fn pings_follow_every_few_kilobytes_and_stray_pongs_are_ignored() {
        let mut window = FlowWindow::default();
        window.wrote(100);
        assert!(window.ping_due().is_none());
        window.wrote(PING_EVERY_BYTES as usize);
        let ping = window.ping_due().expect("due");
        window.on_pong(b"not ours");
        window.on_pong(&(u64::MAX).to_be_bytes());
        assert!(!window.answered);
        window.on_pong(&ping);
        assert!(window.answered);
        assert_eq!(window.acknowledged, 100 + PING_EVERY_BYTES);
    }
}
