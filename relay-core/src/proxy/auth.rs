//! Worker authentication: constant-time secret comparison and a per-IP limit on failed attempts.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

/// Compares a presented secret with the expected one in time independent of where they differ.
pub fn secrets_match(presented: &str, expected: &str) -> bool {
    // Lengths leak through `ct_eq`'s early return on length mismatch; comparing fixed-size
    // digests instead would hide that too, but secret length is not sensitive here.
    bool::from(presented.as_bytes().ct_eq(expected.as_bytes()))
}

/// How failed worker authentications are limited: a short burst of failures from one address
/// locks it out, even with the right secret, for a short while that ends by itself (the
/// contract: "repeated failed auth attempts are rate-limited by client IP", and the entries
/// expire). A worker whose secret was fixed gets in at its next retry after the lockout.
#[derive(Debug, Clone)]
pub struct FailureLimits {
    /// Failures from one IP within `window` that lock it out.
    pub max_failures: u32,
    /// The counting window, from the first failure; the lockout ends with it.
    pub window: Duration,
    /// IPs tracked at most; the table never grows beyond this.
    pub max_tracked: usize,
}

impl Default for FailureLimits {
    fn default() -> Self {
        // The published proxy locks out after 3 failures. Its lockout is 250 ms; ours lasts
        // up to 10 s, which caps guessing at 3 tries per 10 s per address and still lets a
        // corrected worker in at its next reconnect.
        FailureLimits {
            max_failures: 3,
            window: Duration::from_secs(10),
            max_tracked: 10_000,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    first: Instant,
}

/// Counts failed attempts per client IP; entries expire after the window.
#[derive(Debug)]
pub struct FailureLimiter {
    limits: FailureLimits,
    table: Mutex<HashMap<IpAddr, Failures>>,
}

impl FailureLimiter {
    /// A limiter with these limits.
    pub fn new(limits: FailureLimits) -> Self {
        FailureLimiter {
            limits,
            table: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(retry_after)` when `ip` has failed too often recently.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        match table.get(&ip) {
            Some(f) if f.count >= self.limits.max_failures => {
                let until = f.first + self.limits.window;
                if until > now {
                    Err(until - now)
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }

    /// Records one failed attempt from `ip`.
    pub fn record_failure(&self, ip: IpAddr, now: Instant) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let window = self.limits.window;
        if table.len() >= self.limits.max_tracked {
            table.retain(|_, f| f.first + window > now);
            if table.len() >= self.limits.max_tracked {
                // Still full of live entries: forget the oldest to stay bounded.
                if let Some(oldest) = table.iter().min_by_key(|(_, f)| f.first).map(|(ip, _)| *ip) {
                    table.remove(&oldest);
                }
            }
        }
        let entry = table.entry(ip).or_insert(Failures {
            count: 0,
            first: now,
        });
        if entry.first + window <= now {
            *entry = Failures {
                count: 0,
                first: now,
            };
        }
        entry.count += 1;
    }

    /// Forgets `ip`'s failures after a successful attempt.
    pub fn record_success(&self, ip: IpAddr) {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(secrets_match("s3cret", "s3cret"));
        assert!(!secrets_match("s3cret", "s3creT"));
        assert!(!secrets_match("s3cre", "s3cret"));
        assert!(!secrets_match("", "s3cret"));
    }

    #[test]
    fn repeated_failures_block_an_ip_until_the_window_passes() {
        let limiter = FailureLimiter::new(FailureLimits {
            max_failures: 3,
            window: Duration::from_secs(60),
            max_tracked: 100,
        });
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limiter.check(ip(1), t0).is_ok());
            limiter.record_failure(ip(1), t0);
        }
        let retry = limiter
            .check(ip(1), t0 + Duration::from_secs(10))
            .unwrap_err();
        assert_eq!(retry, Duration::from_secs(50));
        assert!(limiter.check(ip(2), t0).is_ok(), "other IPs unaffected");
        assert!(limiter.check(ip(1), t0 + Duration::from_secs(61)).is_ok());
    }

    #[test]
    fn success_clears_failures() {
        let limiter = FailureLimiter::new(FailureLimits {
            max_failures: 1,
            ..FailureLimits::default()
        });
        let now = Instant::now();
        limiter.record_failure(ip(1), now);
        assert!(limiter.check(ip(1), now).is_err());
        limiter.record_success(ip(1));
        assert!(limiter.check(ip(1), now).is_ok());
    }

    #[test]
    fn table_stays_bounded() {
        let limiter = FailureLimiter::new(FailureLimits {
            max_failures: 5,
            window: Duration::from_secs(60),
            max_tracked: 4,
        });
        let now = Instant::now();
        for last in 0..50 {
            limiter.record_failure(ip(last), now);
        }
        assert!(limiter.table.lock().unwrap().len() <= 4);
    }
}
