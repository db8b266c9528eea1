//! Clocks. [`Clock`]: the wall clock the cache and its handlers read for freshness, age, the
//! stale windows, purge bans and the lower tiers' lifetimes, handed to them where they are built
//! (by [`crate::server::start_with`]), so that a test can move it forward instead of sleeping;
//! and, moved by the same offset, a monotonic reading ([`Clock::monotonic_ns`]) for rate limits.
//! Beside it, a coarse monotonic clock for deadlines that tolerate a few milliseconds of error.
//!
//! `Instant::now()` reads the TSC through the vDSO: about 29 ns per call in this VM under load
//! (perf, 10,000 connections), and a request read several of them. `CLOCK_MONOTONIC_COARSE` is
//! the time of the kernel's last tick (1-4 ms old), read from the vDSO's data page without the
//! TSC. It suits the request-head deadline (seconds, checked at watchdog ticks) and the static
//! files' once-a-second re-stat; nothing that measures a duration uses it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// The wall clock of the cache: `SystemTime::now()`, or, for a clock made with
/// [`Clock::adjustable`], that plus how far it was moved with [`Clock::advance`] ([`Clock::manual`]:
/// the time it was made plus that). Cheap to clone
/// and to read: the system clock is `SystemTime::now()` behind one branch; an adjustable one adds
/// a relaxed atomic load (no lock, no allocation, no dynamic call).
#[derive(Clone, Debug, Default)]
pub struct Clock {
    /// Nanoseconds added to the system time (shared by every clone); `None`: the system clock.
    offset: Option<Arc<AtomicU64>>,
    /// A clock that stands still but when moved ([`Clock::manual`]): the time it was made.
    still: Option<(SystemTime, Instant)>,
}

impl Clock {
    /// The system's wall clock, as it is.
    pub fn system() -> Clock {
        Clock {
            offset: None,
            still: None,
        }
    }

    /// A clock that reads the system's time until moved forward with [`Clock::advance`]; its
    /// clones move with it.
    pub fn adjustable() -> Clock {
        Clock {
            offset: Some(Arc::new(AtomicU64::new(0))),
            still: None,
        }
    }

    /// A clock that stands still at the time it was made until moved forward with
    /// [`Clock::advance`] (its clones move with it): for tests of rates, where the time a
    /// loaded machine takes between two requests must not count.
    pub fn manual() -> Clock {
        Clock {
            offset: Some(Arc::new(AtomicU64::new(0))),
            still: Some((SystemTime::now(), Instant::now())),
        }
    }

    /// The time now.
    #[inline]
    pub fn now(&self) -> SystemTime {
        match &self.offset {
            None => SystemTime::now(),
            Some(o) => {
                let now = self.still.map_or_else(SystemTime::now, |(at, _)| at);
                now + Duration::from_nanos(o.load(Ordering::Relaxed))
            }
        }
    }

    /// Moves the clock (and its clones) forward by `by`; whether it could (the system clock
    /// cannot be moved, and an offset stops at about 584 years).
    pub fn advance(&self, by: Duration) -> bool {
        let Some(o) = &self.offset else { return false };
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        o.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(by))
            .is_ok()
    }

    /// Nanoseconds of the monotonic clock (`Instant`, from an origin of the process's), plus how
    /// far this clock was moved forward: what rate limits measure intervals on (a step of the
    /// wall clock does not refill or drain them), and what a test moves with [`Clock::advance`].
    #[inline]
    pub fn monotonic_ns(&self) -> u64 {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        let origin = ORIGIN.get_or_init(Instant::now);
        let at = self.still.map_or_else(Instant::now, |(_, at)| at);
        let ns =
            u64::try_from(at.saturating_duration_since(*origin).as_nanos()).unwrap_or(u64::MAX);
        match &self.offset {
            None => ns,
            Some(o) => ns.saturating_add(o.load(Ordering::Relaxed)),
        }
    }
}

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
    fn an_adjustable_clock_moves_forward_with_its_clones() {
        let clock = Clock::adjustable();
        let copy = clock.clone();
        let before = SystemTime::now();
        assert!(copy.advance(Duration::from_secs(3600)));
        let t = clock.now();
        assert!(t >= before + Duration::from_secs(3600), "{t:?}");
        assert!(t < SystemTime::now() + Duration::from_secs(3660), "{t:?}");
        // The system clock stays where the system says.
        let system = Clock::system();
        assert!(!system.advance(Duration::from_secs(3600)));
        assert!(system.now() < SystemTime::now() + Duration::from_secs(60));
        // An offset that would overflow is refused, not wrapped.
        assert!(!clock.advance(Duration::MAX));
        assert!(clock.now() >= before + Duration::from_secs(3600));
    }

    #[test]
    fn the_monotonic_reading_moves_with_the_offset() {
        let clock = Clock::adjustable();
        let a = clock.monotonic_ns();
        assert!(clock.advance(Duration::from_secs(5)));
        let b = clock.monotonic_ns();
        assert!(b - a >= 5_000_000_000, "{a} {b}");
        assert!(b - a < 65_000_000_000, "{a} {b}");
        let system = Clock::system();
        assert!(system.monotonic_ns() <= clock.monotonic_ns());
        // A manual clock stands still until moved.
        let manual = Clock::manual();
        let (t, m) = (manual.now(), manual.monotonic_ns());
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!((manual.now(), manual.monotonic_ns()), (t, m));
        assert!(manual.advance(Duration::from_millis(1)));
        assert_eq!(manual.now(), t + Duration::from_millis(1));
        assert_eq!(manual.monotonic_ns(), m + 1_000_000);
    }

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
