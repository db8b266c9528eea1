//! The value types of settings: bounded integers, sizes and durations with their units and
//! ranges, fractions, scale factors. Each validates itself while deserializing, so errors carry
//! the value's span.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

/// Bytes in a KiB, MiB, GiB (for size bounds: `ByteSize<{ 8 * KIB }, MIB>`).
pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Milliseconds in a second, a minute, an hour (for duration bounds: `Dur<100, HOUR_MS>`).
pub const SECOND_MS: u64 = 1000;
pub const MINUTE_MS: u64 = 60 * SECOND_MS;
pub const HOUR_MS: u64 = 60 * MINUTE_MS;
/// The longest duration any setting takes (8760h, a year) unless its type says less: beyond,
/// adding it to a clock reading can overflow, which panics.
pub const YEAR_MS: u64 = 8760 * HOUR_MS;

/// Worker threads at most (`workers`, `--workers`, `[compression] threads`, an image route's
/// `workers`). Each is an OS thread with its stack (and with `per-core` its own runtime and
/// listening sockets); past the number of cores more only add switching, and 1024 is above the
/// hardware threads of the largest servers. Unbounded, `workers = 100000000` had the runtime
/// allocate for each until memory ran out, and the port never opened.
pub const MAX_WORKERS: i64 = 1024;

/// A worker-thread count: 0 means one per core.
pub type Workers = Bounded<0, MAX_WORKERS>;

/// An integer within `LO..=HI`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounded<const LO: i64, const HI: i64>(pub i64);

impl<const LO: i64, const HI: i64> Bounded<LO, HI> {
    /// `v` if it is within the bounds.
    pub fn new(v: i64) -> Result<Self, String> {
        if (LO..=HI).contains(&v) {
            Ok(Bounded(v))
        } else {
            Err(format!("{v} is out of range (must be {LO} to {HI})"))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }

    /// The value as a count (a negative one as 0).
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(0)
    }
}

/// As the command line writes it (`--workers 4`).
impl<const LO: i64, const HI: i64> FromStr for Bounded<LO, HI> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let v = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a whole number from {LO} to {HI}"))?;
        Self::new(v)
    }
}

impl<'de, const LO: i64, const HI: i64> Deserialize<'de> for Bounded<LO, HI> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(i64::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// `v` if it is within `lo..=hi`, else an error giving the range in `show`'s words ("must be at
/// least 8KiB", "must be 100ms to 1h"; a bound at the end of `u64` is no bound).
fn within(v: u64, lo: u64, hi: u64, show: fn(u64) -> String) -> Result<u64, String> {
    if (lo..=hi).contains(&v) {
        return Ok(v);
    }
    let range = match (lo > 0, hi < u64::MAX) {
        (true, true) => format!("must be {} to {}", show(lo), show(hi)),
        (true, false) => format!("must be at least {}", show(lo)),
        _ => format!("must be at most {}", show(hi)),
    };
    Err(format!("{} is out of range ({range})", show(v)))
}

/// A whole number with a unit (`"64KiB"`, `"250ms"`, `"10"`) as a count of the smallest unit:
/// `units` maps each spelling (lowercase) to its multiple; `kind`, `example` and `unit_help`
/// word the errors.
fn parse_with_unit(
    s: &str,
    units: &[(&str, u64)],
    kind: &str,
    example: &str,
    unit_help: &str,
) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid {kind} `{s}` (expected e.g. {example})"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let (_, mult) = units
        .iter()
        .find(|(u, _)| *u == unit)
        .ok_or_else(|| format!("invalid {kind} unit in `{s}` (use {unit_help})"))?;
    n.checked_mul(*mult)
        .ok_or_else(|| format!("{kind} `{s}` is too large"))
}

/// A size in bytes within `MIN..=MAX`, written as a number or a string like `"256MiB"`,
/// `"16KB"`, `"1g"`. Without bounds, any size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize<const MIN: u64 = 0, const MAX: u64 = { u64::MAX }>(pub u64);

/// `n` bytes in the largest unit that writes it whole: `8KiB`, `1MiB`, `1000`.
pub fn show_size(n: u64) -> String {
    match n {
        0 => "0".into(),
        n if n % GIB == 0 => format!("{}GiB", n / GIB),
        n if n % MIB == 0 => format!("{}MiB", n / MIB),
        n if n % KIB == 0 => format!("{}KiB", n / KIB),
        n => n.to_string(),
    }
}

/// A size as written (`"64KiB"`), unbounded.
fn parse_size(s: &str) -> Result<u64, String> {
    const UNITS: &[(&str, u64)] = &[
        ("", 1),
        ("b", 1),
        ("k", KIB),
        ("kb", KIB),
        ("kib", KIB),
        ("m", MIB),
        ("mb", MIB),
        ("mib", MIB),
        ("g", GIB),
        ("gb", GIB),
        ("gib", GIB),
    ];
    let example = "512, \"64KiB\", \"256MiB\"";
    parse_with_unit(s, UNITS, "size", example, "B, KiB, MiB or GiB")
}

impl<const MIN: u64, const MAX: u64> ByteSize<MIN, MAX> {
    /// `n` bytes if within the bounds.
    pub fn new(n: u64) -> Result<Self, String> {
        within(n, MIN, MAX, show_size).map(ByteSize)
    }
}

impl<const MIN: u64, const MAX: u64> FromStr for ByteSize<MIN, MAX> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::new(parse_size(s)?)
    }
}

impl<'de, const MIN: u64, const MAX: u64> Deserialize<'de> for ByteSize<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Measured {
            expecting: "a size such as 1048576 or \"256MiB\"",
            number: |n| u64::try_from(n).map_err(|_| "a size cannot be negative".into()),
            make: Self::new,
            parse: parse_size,
        })
    }
}

/// Deserializes a measure written as a number or as a string with a unit (a size, a duration):
/// `number` turns a number into the count `make` takes, `parse` a string.
struct Measured<T> {
    expecting: &'static str,
    number: fn(i64) -> Result<u64, String>,
    make: fn(u64) -> Result<T, String>,
    parse: fn(&str) -> Result<u64, String>,
}

impl<T> de::Visitor<'_> for Measured<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.expecting)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        (self.number)(v).and_then(self.make).map_err(E::custom)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        match i64::try_from(v) {
            Ok(v) => self.visit_i64(v),
            Err(_) => Err(E::custom(format!("{v} is too large"))),
        }
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.parse)(v).and_then(self.make).map_err(E::custom)
    }
}

/// A duration within `MIN_MS..=MAX_MS` milliseconds, written as `"250ms"`, `"10s"`, `"5m"`,
/// `"1h"`, or a number of seconds. Without bounds, 0 to [`YEAR_MS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur<const MIN_MS: u64 = 0, const MAX_MS: u64 = YEAR_MS>(pub Duration);

/// `ms` milliseconds in the largest unit that writes it whole: `100ms`, `10s`, `1h`.
pub fn show_duration(ms: u64) -> String {
    match ms {
        0 => "0s".into(),
        ms if ms % HOUR_MS == 0 => format!("{}h", ms / HOUR_MS),
        ms if ms % MINUTE_MS == 0 => format!("{}m", ms / MINUTE_MS),
        ms if ms % SECOND_MS == 0 => format!("{}s", ms / SECOND_MS),
        ms => format!("{ms}ms"),
    }
}

/// A duration as written (`"250ms"`), in milliseconds.
fn parse_ms(s: &str) -> Result<u64, String> {
    const UNITS: &[(&str, u64)] = &[
        ("ms", 1),
        ("", SECOND_MS),
        ("s", SECOND_MS),
        ("m", MINUTE_MS),
        ("h", HOUR_MS),
        ("d", 24 * HOUR_MS),
    ];
    let example = "\"500ms\", \"10s\", \"5m\"";
    parse_with_unit(s, UNITS, "duration", example, "ms, s, m, h or d")
}

impl<const MIN_MS: u64, const MAX_MS: u64> Dur<MIN_MS, MAX_MS> {
    /// `ms` milliseconds if within the bounds.
    pub fn from_ms(ms: u64) -> Result<Self, String> {
        within(ms, MIN_MS, MAX_MS, show_duration).map(|ms| Dur(Duration::from_millis(ms)))
    }
}

impl<const MIN_MS: u64, const MAX_MS: u64> FromStr for Dur<MIN_MS, MAX_MS> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::from_ms(parse_ms(s)?)
    }
}

impl<'de, const MIN_MS: u64, const MAX_MS: u64> Deserialize<'de> for Dur<MIN_MS, MAX_MS> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Measured {
            expecting: "a duration such as \"10s\" or \"500ms\"",
            number: |secs| {
                u64::try_from(secs)
                    .map_err(|_| "a duration cannot be negative".to_string())?
                    .checked_mul(SECOND_MS)
                    .ok_or_else(|| format!("duration {secs} is too large"))
            },
            make: Self::from_ms,
            parse: parse_ms,
        })
    }
}

/// A fraction: a finite number from 0 to 1 (an integer is taken too: `0`, `1`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fraction(pub f64);

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if (0.0..=1.0).contains(&v) {
            Ok(Fraction(v))
        } else {
            Err(de::Error::custom(format!(
                "{v} is out of range (must be a number from 0 to 1)"
            )))
        }
    }
}

/// A scale factor from 1.0 (no enlargement) to 16.0, written as a number (`1`, `2.5`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Upscale(pub f64);

impl<'de> Deserialize<'de> for Upscale {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !(1.0..=16.0).contains(&v) {
            return Err(de::Error::custom(format!(
                "{v} is out of range (must be 1.0 to 16.0; 1.0 never enlarges)"
            )));
        }
        Ok(Upscale(v))
    }
}

pub(super) fn yes() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{err, MIN};
    use crate::config::Config;

    #[test]
    fn sizes_and_durations() {
        assert_eq!("64KiB".parse::<ByteSize>().unwrap(), ByteSize(65536));
        assert_eq!("3".parse::<ByteSize>().unwrap(), ByteSize(3));
        assert!("-3".parse::<ByteSize>().is_err());
        assert_eq!(
            "250ms".parse::<Dur>().unwrap(),
            Dur(Duration::from_millis(250))
        );
        assert!("5 fortnights".parse::<Dur>().is_err());
    }

    #[test]
    fn bounded_sizes_durations_and_fractions() {
        type Head = ByteSize<{ 8 * KIB }, MIB>;
        assert_eq!("16KiB".parse::<Head>().unwrap(), ByteSize(16 * KIB));
        let e = "1KiB".parse::<Head>().unwrap_err();
        assert!(
            e.contains("1KiB") && e.contains("must be 8KiB to 1MiB"),
            "{e}"
        );
        let e = ByteSize::<MIB>::new(0).unwrap_err();
        assert!(e.contains("must be at least 1MiB"), "{e}");
        type Timeout = Dur<100, HOUR_MS>;
        assert!("0s".parse::<Timeout>().unwrap_err().contains("100ms to 1h"));
        assert!("2h".parse::<Timeout>().is_err());
        assert!("100ms".parse::<Timeout>().is_ok());
        // Once an overflow panic; now an error, as is anything past a year.
        assert!("99999999999999999h".parse::<Dur>().is_err());
        assert!("8761h".parse::<Dur>().is_err());
        assert_eq!(
            "8760h".parse::<Dur>().unwrap().0,
            Duration::from_millis(YEAR_MS)
        );
        assert!("2000".parse::<Workers>().unwrap_err().contains("0 to 1024"));
        for bad in ["-3.5", "nan", "inf", "1.01"] {
            let e = err(&format!("[cache]\nheuristic_fraction = {bad}\n{MIN}"));
            assert!(e.contains("line 2, key `cache.heuristic_fraction`"), "{e}");
        }
        let c = Config::parse(&format!("[cache]\nheuristic_fraction = 1\n{MIN}"), "t").unwrap();
        assert_eq!(c.cache.heuristic_fraction, Fraction(1.0));
    }
}
