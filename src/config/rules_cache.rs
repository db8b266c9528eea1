//! The settings of the cache and traffic rules (docs/rules.md, "Cache" and "Traffic"): the
//! cache key's parts (`cache_key`), lifetimes by status and clamps (`cache_ttl`), forced
//! caching (`cache_force`), a weighted split between pools (`split`) and a mirror to a shadow
//! pool (`mirror`). What is checked here, at load: globs compile, statuses are statuses or
//! classes, weights and bounds make sense; that the named pools exist is checked with the
//! whole file (`Config::check_rules`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::units::{ByteSize, Dur};

/// `cache_key = { query, keep, drop, headers, cookies }`: what the cache key is made of, for
/// the requests the rule applies to (the request sent upstream is unchanged).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheKeyConfig {
    /// The query's place in the key.
    #[serde(default)]
    pub query: QueryKey,
    /// Only these query parameters are in the key (globs on the name: `page`, `f_*`).
    #[serde(default)]
    pub keep: Vec<NameGlob>,
    /// These query parameters are not in the key (`utm_*`).
    #[serde(default)]
    pub drop: Vec<NameGlob>,
    /// These request header fields' values are added to the key (lower case).
    #[serde(default)]
    pub headers: Vec<KeyField>,
    /// These cookies' values are added to the key.
    #[serde(default)]
    pub cookies: Vec<String>,
}

/// What the key keeps of the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueryKey {
    /// The query as sent (less the dropped parameters, or only the kept ones).
    #[default]
    All,
    /// No query at all.
    None,
    /// The parameters sorted by name (then value), so that `?b=1&a=2` and `?a=2&b=1` share
    /// one entry.
    Sort,
}

/// A glob on a name: `*` matches any characters; anything else matches itself.
#[derive(Debug, Clone)]
pub struct NameGlob {
    pub source: String,
    regex: regex::Regex,
}

impl NameGlob {
    pub fn new(s: &str) -> Result<NameGlob, String> {
        if s.is_empty() {
            return Err("an empty parameter name".into());
        }
        let re: Vec<String> = s.split('*').map(regex::escape).collect();
        let regex = regex::Regex::new(&format!("^{}$", re.join(".*")))
            .map_err(|e| format!("`{s}`: {e}"))?;
        Ok(NameGlob {
            source: s.to_string(),
            regex,
        })
    }

    pub fn matches(&self, name: &str) -> bool {
        self.regex.is_match(name)
    }
}

impl PartialEq for NameGlob {
    fn eq(&self, other: &NameGlob) -> bool {
        self.source == other.source
    }
}

impl<'de> Deserialize<'de> for NameGlob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        NameGlob::new(&String::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// A request header field's name in a key (lower case, checked when read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyField(pub http::HeaderName);

impl<'de> Deserialize<'de> for KeyField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        http::HeaderName::from_bytes(s.as_bytes())
            .map(KeyField)
            .map_err(|_| de::Error::custom(format!("`{s}` is not a valid header name")))
    }
}

impl CacheKeyConfig {
    /// Whether the rule changes nothing (it needs at least one part).
    pub fn is_empty(&self) -> bool {
        self == &CacheKeyConfig::default()
    }
}

/// `cache_ttl = { status = { "200" = "10m", "404" = "30s", "5xx" = "5s" }, min, max }`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawTtl")]
pub struct CacheTtlConfig {
    /// The lifetime of a response of this status whose origin gives none (no `s-maxage`,
    /// `max-age` or `Expires`): replaces the heuristic of RFC 9111 §4.2.2, and makes a status
    /// storable that is not heuristically cacheable. Exact statuses first, then classes.
    pub status: Vec<(StatusMatch, Duration)>,
    /// The least lifetime of a stored response (the origin's own, if shorter, is raised).
    pub min: Option<Duration>,
    /// The most lifetime of a stored response (the origin's own, if longer, is cut).
    pub max: Option<Duration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTtl {
    #[serde(default)]
    status: BTreeMap<String, Dur>,
    min: Option<Dur>,
    max: Option<Dur>,
}

impl TryFrom<RawTtl> for CacheTtlConfig {
    type Error = String;
    fn try_from(r: RawTtl) -> Result<Self, String> {
        let mut status = Vec::new();
        for (k, v) in r.status {
            status.push((StatusMatch::parse(&k)?, v.0));
        }
        // Exact statuses before classes.
        status.sort_by_key(|(m, _)| matches!(m, StatusMatch::Class(_)));
        if let (Some(min), Some(max)) = (r.min, r.max) {
            if min.0 > max.0 {
                return Err(format!(
                    "`min` ({:?}) is longer than `max` ({:?})",
                    min.0, max.0
                ));
            }
        }
        if status.is_empty() && r.min.is_none() && r.max.is_none() {
            return Err("`cache_ttl` needs `status`, `min` or `max`".into());
        }
        Ok(CacheTtlConfig {
            status,
            min: r.min.map(|d| d.0),
            max: r.max.map(|d| d.0),
        })
    }
}

/// A status (`"404"`) or a class of them (`"5xx"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMatch {
    Code(u16),
    /// The hundreds digit: 2 for `2xx`.
    Class(u16),
}

impl StatusMatch {
    fn parse(s: &str) -> Result<StatusMatch, String> {
        let bad = || format!("`{s}` is neither a status (\"404\") nor a class (\"5xx\")");
        let lower = s.to_ascii_lowercase();
        if let Some(d) = lower.strip_suffix("xx") {
            return match d.parse::<u16>() {
                Ok(c @ 2..=5) if d.len() == 1 => Ok(StatusMatch::Class(c)),
                _ => Err(bad()),
            };
        }
        match s.parse::<u16>() {
            Ok(c @ 200..=599) if s.len() == 3 => Ok(StatusMatch::Code(c)),
            _ => Err(bad()),
        }
    }
}

impl CacheTtlConfig {
    /// The lifetime this rule gives a response of `status` whose origin gives none.
    pub fn for_status(&self, status: u16) -> Option<Duration> {
        self.status.iter().find_map(|(m, d)| {
            let hit = match *m {
                StatusMatch::Code(c) => c == status,
                StatusMatch::Class(c) => status / 100 == c,
            };
            hit.then_some(*d)
        })
    }

    /// `lifetime` within `min` and `max`.
    pub fn clamp(&self, lifetime: Duration) -> Duration {
        let l = self.min.map_or(lifetime, |m| lifetime.max(m));
        self.max.map_or(l, |m| l.min(m))
    }
}

/// `cache_force = { ttl = "5m" }`: successes and redirects the origin marked uncacheable are
/// stored for `ttl` (never a `private` one; `Set-Cookie` is not stored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheForceConfig {
    pub ttl: Dur<1000>,
}

/// `split = { pools = { blue = 90, green = 10 }, sticky = "cookie:NAME", cache = "pass" }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawSplit")]
pub struct SplitConfig {
    /// The pools (`[pool.NAME]`) and their weights, in name order.
    pub pools: Vec<(String, u32)>,
    pub sticky: Sticky,
    pub cache: SplitCache,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSplit {
    pools: BTreeMap<String, u32>,
    #[serde(default)]
    sticky: Sticky,
    #[serde(default)]
    cache: SplitCache,
}

impl TryFrom<RawSplit> for SplitConfig {
    type Error = String;
    fn try_from(r: RawSplit) -> Result<Self, String> {
        let total: u64 = r.pools.values().map(|&w| u64::from(w)).sum();
        if total == 0 {
            return Err("`split.pools` needs a pool with a weight above 0".into());
        }
        if total > u64::from(u32::MAX) {
            return Err("`split.pools`: the weights add up to more than 4294967295".into());
        }
        Ok(SplitConfig {
            pools: r.pools.into_iter().filter(|(_, w)| *w > 0).collect(),
            sticky: r.sticky,
            cache: r.cache,
        })
    }
}

/// What keeps a client on one side of a split.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Sticky {
    /// A hash of this cookie's value (of the client's address when the request has none).
    Cookie(String),
    /// A hash of the client's address.
    #[default]
    Client,
    /// Each request on its own, by weight.
    None,
}

impl<'de> Deserialize<'de> for Sticky {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "client" => Ok(Sticky::Client),
            "none" => Ok(Sticky::None),
            _ => match s.strip_prefix("cookie:") {
                Some(c) if !c.is_empty() => Ok(Sticky::Cookie(c.to_string())),
                _ => Err(de::Error::custom(format!(
                    "`{s}`: sticky is \"cookie:NAME\", \"client\" or \"none\""
                ))),
            },
        }
    }
}

/// What the cache does with a split route's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SplitCache {
    /// Not looked up, not stored: each side answers for itself (a split compares backends).
    #[default]
    Pass,
    /// Cached, the pool's name part of the key: each side has its own entries.
    PerPool,
    /// Cached under the same key whichever pool filled it (nginx's split_clients with
    /// proxy_cache).
    Shared,
}

/// `mirror = { pool = "shadow", max_in_flight = 16, timeout = "10s", body = false,
/// max_body = "64KiB" }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorConfig {
    pub pool: String,
    /// Mirrors in flight at once; one more is dropped (and counted).
    #[serde(default = "default_in_flight")]
    pub max_in_flight: InFlight,
    /// How long a mirror may take (its slot is then freed).
    #[serde(default = "default_mirror_timeout")]
    pub timeout: Dur<1, 300_000>,
    /// Mirror the request's body too, when it is complete and at most `max_body` (else the
    /// head alone goes).
    #[serde(default)]
    pub body: bool,
    /// The largest body a mirror carries (copied as the client sends it: held until complete).
    #[serde(default = "default_max_body")]
    pub max_body: ByteSize<0, { 16 << 20 }>,
}

fn default_max_body() -> ByteSize<0, { 16 << 20 }> {
    ByteSize(64 << 10)
}

/// 1 to 10,000 mirrors in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight(pub usize);

impl<'de> Deserialize<'de> for InFlight {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        match n {
            1..=10_000 => Ok(InFlight(n as usize)),
            _ => Err(de::Error::custom(format!(
                "max_in_flight is {n}: it goes from 1 to 10000"
            ))),
        }
    }
}

fn default_in_flight() -> InFlight {
    InFlight(16)
}

fn default_mirror_timeout() -> Dur<1, 300_000> {
    Dur(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_classes() {
        let t: CacheTtlConfig = toml::from_str(
            r#"status = { "5xx" = "5s", "404" = "30s", "500" = "1s" }
               min = "1m"
               max = "1d""#,
        )
        .unwrap();
        assert_eq!(t.for_status(404), Some(Duration::from_secs(30)));
        assert_eq!(t.for_status(500), Some(Duration::from_secs(1)));
        assert_eq!(t.for_status(503), Some(Duration::from_secs(5)));
        assert_eq!(t.for_status(200), None);
        assert_eq!(t.clamp(Duration::from_secs(5)), Duration::from_secs(60));
        assert_eq!(
            t.clamp(Duration::from_secs(90_000)),
            Duration::from_secs(86_400)
        );
        for bad in [
            r#"status = { "6xx" = "1s" }"#,
            r#"status = { "99" = "1s" }"#,
            r#"status = { "ok" = "1s" }"#,
            r#"min = "1h"
               max = "1m""#,
            "",
        ] {
            assert!(toml::from_str::<CacheTtlConfig>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn globs_and_splits() {
        let g = NameGlob::new("utm_*").unwrap();
        assert!(g.matches("utm_source") && !g.matches("xutm_a"));
        assert!(NameGlob::new("a.b").unwrap().matches("a.b"));
        assert!(!NameGlob::new("a.b").unwrap().matches("axb"));
        let s: SplitConfig = toml::from_str(r#"pools = { blue = 9, green = 1, off = 0 }"#).unwrap();
        assert_eq!(s.pools, vec![("blue".into(), 9), ("green".into(), 1)]);
        assert_eq!((s.sticky, s.cache), (Sticky::Client, SplitCache::Pass));
        assert!(toml::from_str::<SplitConfig>(r#"pools = { a = 0 }"#).is_err());
        assert!(toml::from_str::<SplitConfig>(
            r#"pools = { a = 1 }
               sticky = "cookie:""#
        )
        .is_err());
        assert!(toml::from_str::<MirrorConfig>(r#"pool = "s""#).is_ok());
        assert!(toml::from_str::<MirrorConfig>(
            r#"pool = "s"
               max_in_flight = 0"#
        )
        .is_err());
    }
}
