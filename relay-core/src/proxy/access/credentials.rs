//! Credential checks: constant-time secret comparison, and one limit on failed attempts per
//! address shared by every check (worker secrets, the admin token, client API keys).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

/// Compares a presented secret with the expected one in time independent of where they differ.
pub fn secrets_match(presented: &str, expected: &str) -> bool {
    // Lengths leak through `ct_eq`'s early return on length mismatch; comparing fixed-size
    // digests instead would hide that too, but secret length is not sensitive here.
    bool::from(presented.as_bytes().ct_eq(expected.as_bytes()))
}

/// How failed credential checks are limited — worker secrets, the admin token (control API,
/// `/admin`, `/metrics`, elevated changes) and client API keys, all in one table: a short burst
/// of wrong credentials from one address locks it out, even with the right one, for a while
/// that ends by itself (the contract: "repeated failed auth attempts are rate-limited by client
/// IP", and the entries expire), longer each time it happens again. A worker whose secret was
/// fixed gets in at its next retry after the lockout.
#[derive(Debug, Clone)]
pub struct FailureLimits {
    /// Failures from one address within `window` that lock it out.
    pub max_failures: u32,
    /// Wrong client API keys from one address within `window` that lock it out. A key is 190
    /// random bits, beyond guessing at any rate, and a household's clients often share one
    /// address (a reverse proxy, one Open WebUI for everyone): a client left with a revoked key
    /// should not lock the others out after three requests. Guessing is still capped.
    pub max_key_failures: u32,
    /// The counting window, from the first failure; the first lockout ends with it, each next
    /// one (while the address keeps failing) lasts twice as long, up to [`MAX_LOCKOUT`].
    pub window: Duration,
    /// Addresses tracked at most; the table never grows beyond this.
    pub max_tracked: usize,
    /// Failures from all addresses within `window` beyond which any address that failed at all
    /// in it is locked out: many addresses guessing a little each still guess slowly.
    pub max_global_failures: u32,
}

impl Default for FailureLimits {
    fn default() -> Self {
        // The published proxy locks out after 3 failures. Its lockout is 250 ms; ours lasts
        // up to 10 s at first, which caps guessing at 3 tries per 10 s per address and still
        // lets a corrected worker in at its next reconnect.
        FailureLimits {
            max_failures: 3,
            max_key_failures: 20,
            window: Duration::from_secs(10),
            max_tracked: 10_000,
            max_global_failures: 100,
        }
    }
}

/// The longest a lockout lasts, however often an address fails.
pub const MAX_LOCKOUT: Duration = Duration::from_secs(600);

/// Who a failure is counted against: an IPv4 address, or an IPv6 /64 (one host's share of a
/// network: an IPv6 attacker has a whole /64 of addresses to rotate through).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Group {
    V4([u8; 4]),
    V6([u8; 8]),
}

impl Group {
    fn of(ip: IpAddr) -> Group {
        match ip {
            IpAddr::V4(v4) => Group::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Group::V4(v4.octets()),
                None => {
                    let octets = v6.octets();
                    let mut prefix = [0u8; 8];
                    prefix.copy_from_slice(&octets[..8]);
                    Group::V6(prefix)
                }
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    /// Failures in the current round (worker secrets, admin tokens).
    count: u32,
    /// Wrong client keys in the current round.
    key_count: u32,
    /// When the current round's first failure was.
    first: Instant,
    /// Lockouts in a row (each doubles the next).
    strikes: u32,
    /// Locked out until then.
    locked_until: Option<Instant>,
}

#[derive(Debug, Default)]
struct Table {
    groups: HashMap<Group, Failures>,
    /// Live authenticated workers per address: never locked out by others' failures there.
    live_workers: HashMap<Group, usize>,
    /// Failures from everyone in the current global round, and when it began.
    global: u32,
    global_since: Option<Instant>,
}

/// Counts failed credential checks per address; entries expire by themselves. One per proxy,
/// shared by every check.
#[derive(Debug)]
pub struct FailureLimiter {
    limits: FailureLimits,
    table: Mutex<Table>,
}

/// Held while an authenticated worker is connected from an address (see
/// [`FailureLimiter::worker_connected`]).
#[derive(Debug)]
pub struct LiveWorker {
    limiter: Arc<FailureLimiter>,
    group: Group,
}

impl Drop for LiveWorker {
    fn drop(&mut self) {
        let mut table = self.limiter.lock();
        if let Some(count) = table.live_workers.get_mut(&self.group) {
            *count -= 1;
            if *count == 0 {
                table.live_workers.remove(&self.group);
            }
        }
    }
}

impl FailureLimiter {
    /// A limiter with these limits.
    pub fn new(limits: FailureLimits) -> Self {
        FailureLimiter {
            limits,
            table: Mutex::new(Table::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Err(retry_after)` when `ip` has failed too often recently.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let table = self.lock();
        let Some(entry) = table.groups.get(&Group::of(ip)) else {
            return Ok(());
        };
        if let Some(until) = entry.locked_until.filter(|until| *until > now) {
            return Err(until - now);
        }
        let round_ends = entry.first + self.limits.window;
        let global_over = table.global > self.limits.max_global_failures
            && table
                .global_since
                .is_some_and(|since| since + self.limits.window > now);
        if global_over && entry.count + entry.key_count > 0 && round_ends > now {
            return Err(round_ends - now);
        }
        Ok(())
    }

    /// The same for a worker connecting from `ip`: an address that holds a live authenticated
    /// worker is never locked out (another host behind the same address, or a guesser, must
    /// not cut the house's real workers off); its wrong attempts still count.
    pub fn check_worker(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        if self.lock().live_workers.contains_key(&Group::of(ip)) {
            return Ok(());
        }
        self.check(ip, now)
    }

    /// Records one failed attempt from `ip`: a wrong worker secret or admin token.
    pub fn record_failure(&self, ip: IpAddr, now: Instant) {
        self.record(ip, now, false);
    }

    /// Records a wrong client API key from `ip` (see [`FailureLimits::max_key_failures`]).
    pub fn record_key_failure(&self, ip: IpAddr, now: Instant) {
        self.record(ip, now, true);
    }

    fn record(&self, ip: IpAddr, now: Instant, key: bool) {
        let limits = &self.limits;
        let window = limits.window;
        let mut table = self.lock();
        match table.global_since {
            Some(since) if since + window > now => table.global += 1,
            _ => {
                table.global = 1;
                table.global_since = Some(now);
            }
        }
        if table.groups.len() >= limits.max_tracked {
            let alive = |f: &Failures| {
                f.first + window > now || f.locked_until.is_some_and(|until| until > now)
            };
            table.groups.retain(|_, f| alive(f));
            if table.groups.len() >= limits.max_tracked {
                // Still full of live entries: forget the oldest to stay bounded.
                if let Some(oldest) = table
                    .groups
                    .iter()
                    .min_by_key(|(_, f)| f.first)
                    .map(|(group, _)| *group)
                {
                    table.groups.remove(&oldest);
                }
            }
        }
        let entry = table.groups.entry(Group::of(ip)).or_insert(Failures {
            count: 0,
            key_count: 0,
            first: now,
            strikes: 0,
            locked_until: None,
        });
        // When the last round ended (its lockout, or its window), if it did.
        let ended = match entry.locked_until {
            // Locked: the lockout stands as it is.
            Some(until) if until > now => return,
            Some(until) => Some(until),
            None => Some(entry.first + window).filter(|end| *end <= now),
        };
        if let Some(ended) = ended {
            // A new round, remembering the strikes until the address was quiet for the cap.
            if now >= ended + MAX_LOCKOUT {
                entry.strikes = 0;
            }
            entry.locked_until = None;
            entry.count = 0;
            entry.key_count = 0;
            entry.first = now;
        }
        if key {
            entry.key_count += 1;
        } else {
            entry.count += 1;
        }
        if entry.count >= limits.max_failures || entry.key_count >= limits.max_key_failures {
            entry.strikes += 1;
            let lockout = window
                .saturating_mul(1 << (entry.strikes - 1).min(16))
                .min(MAX_LOCKOUT.max(window));
            entry.locked_until = Some(entry.first + lockout);
        }
    }

    /// Forgets `ip`'s failures after a successful attempt.
    pub fn record_success(&self, ip: IpAddr) {
        self.lock().groups.remove(&Group::of(ip));
    }

    /// An authenticated worker connected from `ip`; its address stays open to workers (see
    /// [`FailureLimiter::check_worker`]) while the returned guard lives.
    pub fn worker_connected(self: &Arc<Self>, ip: IpAddr) -> LiveWorker {
        let group = Group::of(ip);
        *self.lock().live_workers.entry(group).or_default() += 1;
        LiveWorker {
            limiter: Arc::clone(self),
            group,
        }
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
            ..FailureLimits::default()
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
            ..FailureLimits::default()
        });
        let now = Instant::now();
        for last in 0..50 {
            limiter.record_failure(ip(last), now);
        }
        assert!(limiter.lock().groups.len() <= 4);
    }

    fn limiter(max_failures: u32, window_secs: u64) -> Arc<FailureLimiter> {
        Arc::new(FailureLimiter::new(FailureLimits {
            max_failures,
            window: Duration::from_secs(window_secs),
            ..FailureLimits::default()
        }))
    }

    #[test]
    fn each_lockout_in_a_row_lasts_twice_as_long_up_to_the_cap() {
        let limiter = limiter(3, 10);
        let mut now = Instant::now();
        let mut lockouts = Vec::new();
        for _ in 0..8 {
            for _ in 0..3 {
                limiter.record_failure(ip(1), now);
            }
            let wait = limiter.check(ip(1), now).unwrap_err();
            lockouts.push(wait.as_secs());
            now += wait;
            assert!(limiter.check(ip(1), now).is_ok(), "it ends by itself");
        }
        assert_eq!(lockouts, [10, 20, 40, 80, 160, 320, 600, 600]);
        // Quiet for the cap: back to the first lockout's length.
        now += MAX_LOCKOUT;
        for _ in 0..3 {
            limiter.record_failure(ip(1), now);
        }
        assert_eq!(limiter.check(ip(1), now).unwrap_err().as_secs(), 10);
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64_and_a_mapped_ipv4_as_itself() {
        let limiter = limiter(3, 10);
        let now = Instant::now();
        for last in 1..=3u16 {
            let addr = std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, last);
            limiter.record_failure(IpAddr::V6(addr), now);
        }
        let same_64 = std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 9, 9, 9, 9);
        assert!(limiter.check(IpAddr::V6(same_64), now).is_err());
        let other_64 = std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 3, 0, 0, 0, 1);
        assert!(limiter.check(IpAddr::V6(other_64), now).is_ok());
        let mapped = std::net::Ipv4Addr::new(127, 0, 0, 7).to_ipv6_mapped();
        for _ in 0..3 {
            limiter.record_failure(IpAddr::V6(mapped), now);
        }
        assert!(limiter.check(ip(7), now).is_err());
    }

    #[test]
    fn past_the_global_budget_every_address_that_failed_waits() {
        let limiter = Arc::new(FailureLimiter::new(FailureLimits {
            max_failures: 3,
            window: Duration::from_secs(10),
            max_global_failures: 10,
            ..FailureLimits::default()
        }));
        let now = Instant::now();
        for last in 0..11 {
            limiter.record_failure(ip(last), now);
        }
        assert!(
            limiter.check(ip(0), now).is_err(),
            "one failure is enough now"
        );
        assert!(
            limiter.check(ip(200), now).is_ok(),
            "addresses that never failed pass"
        );
        assert!(limiter.check(ip(0), now + Duration::from_secs(11)).is_ok());
    }

    #[test]
    fn wrong_client_keys_lock_an_address_out_only_past_their_own_larger_budget() {
        let limiter = limiter(3, 10);
        let now = Instant::now();
        for _ in 0..19 {
            limiter.record_key_failure(ip(9), now);
        }
        assert!(
            limiter.check(ip(9), now).is_ok(),
            "a client with a revoked key"
        );
        limiter.record_key_failure(ip(9), now);
        assert!(limiter.check(ip(9), now).is_err(), "a guesser");
    }

    #[test]
    fn an_address_with_a_live_worker_stays_open_to_workers() {
        let limiter = limiter(3, 10);
        let now = Instant::now();
        let live = limiter.worker_connected(ip(5));
        for _ in 0..3 {
            limiter.record_failure(ip(5), now);
        }
        assert!(limiter.check(ip(5), now).is_err(), "other credentials wait");
        assert!(
            limiter.check_worker(ip(5), now).is_ok(),
            "workers still join"
        );
        drop(live);
        assert!(limiter.check_worker(ip(5), now).is_err());
    }
}
