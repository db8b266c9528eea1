//! A coarse monotonic clock for deadlines that tolerate a few milliseconds of error.
//!
//! `Instant::now()` reads the TSC through the vDSO: about 29 ns per call in this VM under load
//! (perf, 10,000 connections), and a request read several of them. `CLOCK_MONOTONIC_COARSE` is
//! the time of the kernel's last tick (1-4 ms old), read from the vDSO's data page without the
//! TSC. It suits the request-head deadline (seconds, checked at watchdog ticks) and the static
//! files' once-a-second re-stat; nothing that measures a duration uses it.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Milliseconds of the coarse monotonic clock (an arbitrary origin, never going back).
pub fn coarse_ms() -> u64 {
    let d = coarse();
    d.as_secs() * 1000 + u64::from(d.subsec_millis())
}

/// The coarse clock as an [`Instant`]: at most a few milliseconds behind `Instant::now()`.
///
/// Both clocks count from the same origin (`CLOCK_MONOTONIC`), but an `Instant` cannot be
/// built from a raw time: this is an anchor `Instant` read once (with the coarse time then)
/// plus how far the coarse clock has moved since.
pub fn coarse_instant() -> Instant {
    static ANCHOR: OnceLock<(Instant, Duration)> = OnceLock::new();
    let (at, coarse_at) = ANCHOR.get_or_init(|| (Instant::now(), coarse()));
    *at + coarse().saturating_sub(*coarse_at)
}

fn coarse() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        // Not on this kernel (none we run on): the precise clock, from its own origin.
        return Instant::now().duration_since(*PRECISE_ORIGIN.get_or_init(Instant::now));
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

static PRECISE_ORIGIN: OnceLock<Instant> = OnceLock::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_precise_clock_within_a_few_milliseconds() {
        let start = coarse_instant();
        let ms = coarse_ms();
        std::thread::sleep(Duration::from_millis(60));
        let later = coarse_instant();
        let now = Instant::now();
        // The anchor pairs an `Instant` with the coarse time of the same moment, so the coarse
        // instant lags the precise one by at most about two ticks (4 ms each at HZ=250).
        assert!(
            later <= now + Duration::from_millis(10),
            "{later:?} ahead of {now:?}"
        );
        assert!(
            now - later < Duration::from_millis(10),
            "{:?} behind",
            now - later
        );
        assert!(later - start >= Duration::from_millis(50));
        assert!(coarse_ms() - ms >= 50);
    }

    #[test]
    fn never_goes_back() {
        let mut last = coarse_instant();
        for _ in 0..100_000 {
            let t = coarse_instant();
            assert!(t >= last);
            last = t;
        }
    }
}
