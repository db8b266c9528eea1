//! The limits' settings (docs/rules.md, "Limits"; issue #41 item 4), the parts that name no
//! template: a request rate (`"5/s"`, nginx's `"10r/s"`, `"100/m"`), a byte rate
//! (`"100KiB/s"`), `limit_rate = { rate, after }`, what a missing key falls back to, and a
//! rejection's status. The rules that take a key (`rate_limit`, `in_flight`) are in
//! `rules.rs`, whose keys may be templates.

use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::units::{Bounded, ByteSize};

/// A request rate: `count` requests per `per` (a whole number of seconds, so that the
/// `RateLimit-Policy` field can state it: its window is in seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u64,
    pub per: Duration,
}

impl Rate {
    /// `"5/s"`, `"10r/s"` (nginx), `"100/m"`, `"1000/h"`, `"50000/d"`, `"5/10s"`.
    pub fn parse(s: &str) -> Result<Rate, String> {
        let bad = || {
            format!(
                "`{s}` is not a rate: write requests per period, as \"5/s\", \"10r/s\", \"100/m\", \"1000/h\" or \"5/10s\""
            )
        };
        let (count, per) = s.trim().split_once('/').ok_or_else(bad)?;
        let count = count.trim();
        let count = count.strip_suffix('r').unwrap_or(count);
        let count: u64 = count.parse().map_err(|_| bad())?;
        if count == 0 || count > 1_000_000_000 {
            return Err(format!("`{s}`: the count must be 1 to 1000000000"));
        }
        let per = per.trim();
        let split = per.find(|c: char| !c.is_ascii_digit()).unwrap_or(per.len());
        let (n, unit) = per.split_at(split);
        let n: u64 = match n {
            "" => 1,
            n => n.parse().map_err(|_| bad())?,
        };
        let unit = match unit {
            "s" | "sec" => 1,
            "m" | "min" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => return Err(bad()),
        };
        let secs = n
            .checked_mul(unit)
            .filter(|s| (1..=86_400 * 366).contains(s));
        let secs = secs.ok_or_else(|| format!("`{s}`: the period must be 1 s to a year"))?;
        Ok(Rate {
            count,
            per: Duration::from_secs(secs),
        })
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Rate::parse(&String::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// Bytes per second: `"100KiB/s"` (a size, then `/s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRate(pub u64);

impl<'de> Deserialize<'de> for ByteRate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let size = s.trim().strip_suffix("/s").ok_or_else(|| {
            de::Error::custom(format!(
                "`{s}` is not a byte rate: write a size per second, as \"100KiB/s\""
            ))
        })?;
        let n: ByteSize<1, { 1 << 40 }> = size.parse().map_err(de::Error::custom)?;
        Ok(ByteRate(n.0))
    }
}

/// `limit_rate = { rate = "100KiB/s", after = "1MiB" }` (nginx's `limit_rate` and
/// `limit_rate_after`): each response's body is sent at most at `rate` once its first `after`
/// bytes went at full speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitRateConfig {
    pub rate: ByteRate,
    /// Sent at full speed first (none unless set).
    pub after: Option<ByteSize>,
}

/// What a limit does with a request whose key is missing (no such header, no claim, no API key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Missing {
    /// Counted under the client's address (the default).
    #[default]
    Client,
    /// Not limited by this rule.
    Skip,
}

/// The status a limit answers with: 4xx or 5xx (429 unless set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitStatus(pub u16);

impl Default for LimitStatus {
    fn default() -> Self {
        LimitStatus(429)
    }
}

impl<'de> Deserialize<'de> for LimitStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = Bounded::<400, 599>::deserialize(d)?;
        Ok(LimitStatus(n.get() as u16))
    }
}

/// The most keys a limit keeps (`max_keys`): 1 to 100 million; 1,000,000 unless set.
pub type MaxKeys = Bounded<1, 100_000_000>;

/// `max_keys`'s default.
pub fn default_max_keys() -> MaxKeys {
    Bounded(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_as_nginx_and_pingap_write_them() {
        let r = |s| Rate::parse(s).unwrap();
        assert_eq!(
            r("5/s"),
            Rate {
                count: 5,
                per: Duration::from_secs(1)
            }
        );
        assert_eq!(
            r("10r/s"),
            Rate {
                count: 10,
                per: Duration::from_secs(1)
            }
        );
        assert_eq!(r("100/m").per, Duration::from_secs(60));
        assert_eq!(r("30r/m").count, 30);
        assert_eq!(r("5/10s").per, Duration::from_secs(10));
        assert_eq!(r("1000/h").per, Duration::from_secs(3600));
        for bad in ["5", "0/s", "5/x", "a/s", "5/0s", "-1/s", ""] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
    }
}
