//! Coverage feedback for the fuzzer, on stable Rust.
//!
//! Built with `RUSTFLAGS="-C instrument-coverage --cfg fuzz_coverage"` (what `scripts/fuzz.sh`
//! does), every crate of the binary counts how often each of its code regions ran, in counters
//! LLVM's profiling runtime keeps in one section of the executable. The fuzzer zeroes them before
//! an input and reads them after: an input that reached a region no input reached before, or
//! reached one a new number of times (counts are bucketed 1, 2, 3, 4–7, 8–15, 16–31, 32–127,
//! 128+, as libFuzzer and AFL do, so loops that run longer count as new behaviour), is kept and
//! mutated further. That is what lets mutations climb past the checks a blind mutator keeps
//! failing.
//!
//! Counters are process-wide: a guided run must be the only test running (`--test-threads 1`).
//! Without the flags this is inert, and the fuzzer mutates its seeds blindly.

/// The counters of the regions every instrumented crate has, as LLVM's runtime lays them out.
#[cfg(fuzz_coverage)]
fn counters() -> &'static mut [u64] {
    // The runtime (profiler_builtins, linked by `-C instrument-coverage`) keeps the counters of
    // all instrumented code between these two addresses; rustc's counters are 64-bit.
    extern "C" {
        fn __llvm_profile_begin_counters() -> *mut u8;
        fn __llvm_profile_end_counters() -> *mut u8;
    }
    // SAFETY: the runtime's section bounds, valid for the life of the process; the counters are
    // plain integers the instrumented code increments (no other invariant to break), and a
    // guided run is single-threaded, so nothing else writes them while the slice lives.
    unsafe {
        let begin = __llvm_profile_begin_counters();
        let end = __llvm_profile_end_counters();
        let bytes = end as usize - begin as usize;
        assert_eq!(bytes % 8, 0, "64-bit counters");
        std::slice::from_raw_parts_mut(begin.cast::<u64>(), bytes / 8)
    }
}

/// The bucket bit of a count (0 for a region that did not run).
fn bucket(count: u64) -> u8 {
    match count {
        0 => 0,
        1 => 1,
        2 => 2,
        3 => 4,
        4..=7 => 8,
        8..=15 => 16,
        16..=31 => 32,
        32..=127 => 64,
        _ => 128,
    }
}

/// What every input so far reached: a bucket mask per counter.
pub struct Coverage {
    seen: Vec<u8>,
}

impl Coverage {
    /// Whether this build counts coverage.
    pub fn available() -> bool {
        cfg!(fuzz_coverage)
    }

    pub fn new() -> Coverage {
        #[cfg(fuzz_coverage)]
        let len = counters().len();
        #[cfg(not(fuzz_coverage))]
        let len = 0;
        Coverage { seen: vec![0; len] }
    }

    /// Zeroes the counters before an input runs.
    pub fn start(&self) {
        #[cfg(fuzz_coverage)]
        counters().fill(0);
    }

    /// Records what the input since [`Coverage::start`] reached; true if anything was new.
    pub fn novel(&mut self) -> bool {
        #[cfg(fuzz_coverage)]
        {
            self.record(counters())
        }
        #[cfg(not(fuzz_coverage))]
        {
            false
        }
    }

    fn record(&mut self, counts: &[u64]) -> bool {
        let mut new = false;
        for (seen, &count) in self.seen.iter_mut().zip(counts) {
            let bit = bucket(count);
            if *seen & bit != bit {
                *seen |= bit;
                new = true;
            }
        }
        new
    }

    /// Regions any input reached.
    pub fn regions_reached(&self) -> usize {
        self.seen.iter().filter(|&&mask| mask != 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_regions_and_new_count_buckets_are_novel_and_repeats_are_not() {
        let mut coverage = Coverage { seen: vec![0; 4] };
        assert!(coverage.record(&[1, 0, 0, 0]));
        assert!(!coverage.record(&[1, 0, 0, 0]), "the same again");
        assert!(
            coverage.record(&[1, 5, 0, 0]),
            "a region not reached before"
        );
        assert!(!coverage.record(&[1, 6, 0, 0]), "the same bucket (4–7)");
        assert!(coverage.record(&[1, 9, 0, 0]), "a loop that ran longer");
        assert!(!coverage.record(&[0, 0, 0, 0]), "less is not new");
        assert_eq!(coverage.regions_reached(), 2);
    }
}
