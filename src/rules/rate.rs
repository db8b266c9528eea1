//! Request rate per key (nginx's `limit_req`, pingap's `limit`): `rate_limit = { rate,
//! burst, key, delay, status, fleet, max_keys }`, decided at ① by GCRA (the generic cell rate
//! algorithm, which nginx's leaky bucket amounts to): each key holds one number, its
//! theoretical arrival time (TAT); a request is let through when the TAT it would leave is
//! within `count + burst` emission intervals of now (a bucket of `count + burst` requests that
//! refills at `rate`). With `delay`, those beyond `count` wait their turn instead (nginx's
//! `delay`). Rejected: the rule's status (429) with `Retry-After`.
//!
//! Every request a rule applies to, let through or not, gets the IETF RateLimit fields
//! (draft-ietf-httpapi-ratelimit-headers-11): `RateLimit-Policy: "NAME";q=COUNT;w=SECONDS` and
//! `RateLimit: "NAME";r=REMAINING;t=SECONDS`, those of one let through at ④ (kept in the
//! request's context at ①). The field of a request that found its bucket full (under a limit
//! set well above a client's rate, most requests) is the same every time: made once at load.
//!
//! Keys live in a bounded map (quick_cache: `max_keys` entries of 8-byte SipHash keys and an
//! 8-byte TAT, evicting the cold ones first: an attacker rotating addresses fills the cold side
//! and cannot grow it; a key evicted starts again with a full bucket). Time is the handed
//! clock's monotonic reading ([`Clock::monotonic_ns`]), which tests move.
//!
//! `fleet = true`: the decision is made in the fleet's Redis, one atomic Lua script per request
//! (the same GCRA, the TAT under `NS:rl:NAME:KEY` with a lifetime of the TAT's distance), a
//! wait at ①, on the nodes' wall clocks (they agree within NTP's milliseconds). When Redis is
//! not connected or does not answer within `[cache.shared]`'s `timeout` (100 ms unless set),
//! the node decides alone with its local limiter (logged once, counted in the fleet's
//! `local_decisions`: `larder_rate_limit_local_decisions_total` in /metrics).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use fred::interfaces::LuaInterface;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use quick_cache::sync::{Cache, EntryAction, EntryResult};

use super::limit_key::{Key, KeyOf};
use crate::body::{Body, RequestBody};
use crate::clock::Clock;
use crate::config::rules::RateLimitConfig;
use crate::fleet::Fleet;
use crate::http::text_response;
use crate::phases::{Cx, Edit, Step, Verdict};

pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// GCRA's shape: the emission interval and how far ahead the TAT may run, in one unit of time
/// (nanoseconds locally, microseconds in Redis).
#[derive(Debug, Clone, Copy)]
pub struct Gcra {
    /// The emission interval: the period over the count.
    pub t: u64,
    /// How far ahead of now the TAT may be for a request to pass at once (`count` intervals,
    /// or `count + burst` without `delay`).
    pub now_limit: u64,
    /// How far ahead it may be for a request to pass at all (`count + burst` intervals).
    pub limit: u64,
}

/// One decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Let through: how long it waits first (`delay`); rejected: how long until it would pass.
    pub wait: u64,
    /// How far ahead of now the TAT is after it (rejected: before it): the time until the
    /// bucket is full again.
    pub debt: u64,
}

impl Gcra {
    pub fn new(cfg: &RateLimitConfig, unit_per_sec: u64) -> Gcra {
        let per = cfg.rate.per.as_secs().saturating_mul(unit_per_sec);
        let t = (per / cfg.rate.count).max(1);
        let count = cfg.rate.count;
        let burst = cfg.burst.get() as u64;
        let limit = t.saturating_mul(count.saturating_add(burst));
        Gcra {
            t,
            now_limit: if cfg.delay {
                t.saturating_mul(count)
            } else {
                limit
            },
            limit,
        }
    }

    /// The decision for a request at `now` on a key whose TAT is `tat` (0: none), and the TAT
    /// it leaves (None: unchanged).
    pub fn decide(&self, tat: u64, now: u64) -> (Decision, Option<u64>) {
        let tat = tat.max(now);
        let next = tat.saturating_add(self.t);
        let debt = next - now;
        if debt > self.limit {
            let d = Decision {
                allowed: false,
                wait: debt - self.limit,
                debt: tat - now,
            };
            return (d, None);
        }
        let d = Decision {
            allowed: true,
            wait: debt.saturating_sub(self.now_limit),
            debt,
        };
        (d, Some(next))
    }

    /// The decision on a request that finds its key's bucket full (no TAT ahead of now).
    pub fn full(&self) -> Decision {
        self.decide(0, 0).0
    }

    /// Requests that may still pass at once after `d`.
    pub fn remaining(&self, d: &Decision) -> u64 {
        if !d.allowed || d.wait > 0 {
            return 0;
        }
        (self.now_limit - d.debt) / self.t
    }
}

/// The `RateLimit` field of decision `d` of `g` (times in `unit`s a second) for the rule whose
/// name is `quoted` (a structured-field string).
fn field(quoted: &str, g: &Gcra, d: &Decision, unit: u64) -> HeaderValue {
    let (r, t) = match d.allowed {
        true => (g.remaining(d), secs_up(d.debt, unit)),
        false => (0, secs_up(d.wait, unit)),
    };
    // The name serialized once; two integers after it (what `sf_item` would write).
    let v = format!("{quoted};r={r};t={t}");
    // The string's buffer becomes the value's (no second copy).
    HeaderValue::from_maybe_shared(bytes::Bytes::from(v)).expect("serialized structured field")
}

/// Whole seconds of `n` units, rounded up.
fn secs_up(n: u64, unit_per_sec: u64) -> u64 {
    n.div_ceil(unit_per_sec)
}

/// `rate_limit = { ... }`.
pub struct RateLimit(Arc<Inner>);

struct Inner {
    name: String,
    key: KeyOf,
    status: StatusCode,
    /// In nanoseconds, for the local limiter.
    gcra: Gcra,
    /// In microseconds, for the fleet's.
    fleet_gcra: Gcra,
    policy: HeaderValue,
    /// The rule's name as a structured-field string (`"api"`), which each `RateLimit` field
    /// starts with.
    quoted: String,
    /// The `RateLimit` field of a request that found its bucket full (most requests under a
    /// limit set well above their rate), made once: locally and in the fleet's units.
    full: HeaderValue,
    fleet_full: HeaderValue,
    local: Cache<u64, u64>,
    clock: Clock,
    fleet: Option<Arc<Fleet>>,
    warned: AtomicBool,
}

/// What a request let through carries to ④: its `RateLimit` field.
struct Fields(HeaderValue);

/// GCRA in Redis: KEYS[1] the key's TAT; ARGV now, interval, now_limit, limit (microseconds).
/// Returns {allowed, wait, debt}.
const SCRIPT: &str = r#"
local now = tonumber(ARGV[1])
local t = tonumber(ARGV[2])
local soon = tonumber(ARGV[3])
local most = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local debt = tat + t - now
if debt > most then
  return {0, debt - most, tat - now}
end
redis.call('SET', KEYS[1], string.format('%.0f', tat + t), 'PX', math.floor(debt / 1000) + 1000)
local wait = 0
if debt > soon then wait = debt - soon end
return {1, wait, debt}
"#;

const NS: u64 = 1_000_000_000;
const US: u64 = 1_000_000;

impl RateLimit {
    pub fn new(
        name: &str,
        cfg: &RateLimitConfig,
        clock: &Clock,
        fleet: Option<&Arc<Fleet>>,
    ) -> RateLimit {
        let window = cfg.rate.per.as_secs().max(1);
        let policy = sf_item(name, &[("q", cfg.rate.count as i64), ("w", window as i64)]);
        if cfg.fleet && fleet.is_none() {
            tracing::warn!(
                rule = name,
                "rate_limit: fleet = true without [cache.shared]: decided on this node alone"
            );
        }
        let quoted = sf_item_unit(name, &[], None);
        let (gcra, fleet_gcra) = (Gcra::new(cfg, NS), Gcra::new(cfg, US));
        let full = |g: Gcra, unit| field(&quoted, &g, &g.full(), unit);
        RateLimit(Arc::new(Inner {
            name: name.to_string(),
            key: KeyOf::new(&cfg.key, cfg.missing),
            status: StatusCode::from_u16(cfg.status.0).unwrap_or(StatusCode::TOO_MANY_REQUESTS),
            full: full(gcra, NS),
            fleet_full: full(fleet_gcra, US),
            gcra,
            fleet_gcra,
            policy: HeaderValue::from_str(&policy).expect("serialized structured field"),
            quoted,
            local: Cache::new(cfg.max_keys.as_usize().max(1)),
            clock: clock.clone(),
            fleet: if cfg.fleet { fleet.cloned() } else { None },
            warned: AtomicBool::new(false),
        }))
    }

    fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
}

impl Inner {
    /// The local decision for the key hashed `h` at `now` (the clock's monotonic reading).
    fn local(&self, h: u64, now: u64) -> (Decision, u64) {
        let g = self.gcra;
        let decided = self.local.entry(&h, None, |_, tat| {
            let (d, next) = g.decide(*tat, now);
            if let Some(n) = next {
                *tat = n;
            }
            EntryAction::Retain(d)
        });
        let d = match decided {
            EntryResult::Retained(d) => d,
            EntryResult::Vacant(guard) | EntryResult::Replaced(guard, _) => {
                let (d, next) = g.decide(0, now);
                let _ = guard.insert(next.unwrap_or(now));
                d
            }
            // Neither removes nor waits: decided as a new key.
            _ => g.decide(0, now).0,
        };
        (d, NS)
    }

    /// The `RateLimit` field of a decision (times in `unit`s a second).
    fn field(&self, d: &Decision, unit: u64) -> HeaderValue {
        let (g, full) = match unit == NS {
            true => (&self.gcra, &self.full),
            false => (&self.fleet_gcra, &self.fleet_full),
        };
        // Its bucket was full: the field made at load (a reference count, no formatting).
        if *d == g.full() {
            return full.clone();
        }
        field(&self.quoted, g, d, unit)
    }

    /// The answer to a request rejected by `d`.
    fn reject(&self, d: &Decision, unit: u64) -> Response<Body> {
        let mut r = text_response(self.status, "too many requests\n");
        let h = r.headers_mut();
        h.insert(RETRY_AFTER, HeaderValue::from(secs_up(d.wait, unit).max(1)));
        h.append(RATELIMIT_POLICY, self.policy.clone());
        h.append(RATELIMIT, self.field(d, unit));
        r
    }

    /// The fleet's decision for `key`, or None when Redis is away.
    async fn fleet(&self, fleet: &Fleet, key: &Key) -> Option<Decision> {
        let now =
            u64::try_from((self.clock.now().duration_since(UNIX_EPOCH).ok()?).as_micros()).ok()?;
        let g = self.fleet_gcra;
        let k = fleet.key("rl", &format!("{}:{}", self.name, key.fleet_name()));
        let args = vec![now, g.t, g.now_limit, g.limit];
        let eval = fleet.client().eval::<Vec<i64>, _, _, _>(SCRIPT, k, args);
        let v = fleet.run("EVAL", eval).await?;
        let n = |i: usize| v.get(i).map(|n| (*n).max(0) as u64);
        Some(Decision {
            allowed: n(0)? == 1,
            wait: n(1)?,
            debt: n(2)?,
        })
    }

    fn fell_back(&self) {
        if let Some(f) = &self.fleet {
            f.counts.local_decisions.fetch_add(1, Ordering::Relaxed);
        }
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                rule = self.name.as_str(),
                "rate_limit: the fleet's Redis is away; deciding on this node alone until it is back"
            );
        }
    }
}

/// `"NAME";k=v;...` (RFC 9651 item, a string with integer parameters).
fn sf_item(name: &str, params: &[(&str, i64)]) -> String {
    sf_item_unit(name, params, None)
}

/// The `RateLimit-Policy` field of `max` concurrent requests (`in_flight`).
pub fn concurrent_policy(name: &str, max: u32) -> HeaderValue {
    let v = sf_item_unit(name, &[("q", i64::from(max))], Some("concurrent-requests"));
    HeaderValue::from_str(&v).expect("serialized structured field")
}

/// [`sf_item`], with a quota unit (`qu`) after the integers.
fn sf_item_unit(name: &str, params: &[(&str, i64)], unit: Option<&str>) -> String {
    let mut ser = sfv::ListSerializer::new();
    let clean: String = name.chars().filter(|c| (' '..='~').contains(c)).collect();
    let name = sfv::StringRef::from_str(&clean).unwrap_or(sfv::StringRef::constant("limit"));
    let mut item = ser.bare_item(name);
    for (k, v) in params {
        let key = sfv::KeyRef::from_str(k).expect("a valid key");
        let v = sfv::Integer::try_from(*v).unwrap_or(sfv::integer(0));
        item = item.parameter(key, v);
    }
    if let Some(u) = unit {
        let u = sfv::StringRef::from_str(u).expect("a valid string");
        item = item.parameter(sfv::KeyRef::constant("qu"), u);
    }
    drop(item);
    ser.finish().expect("one item")
}

impl Step for RateLimit {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let me = &self.0;
        let Some(key) = me.key.of(req, cx) else {
            return Verdict::Next;
        };
        if let Some(fleet) = &me.fleet {
            if fleet.is_connected() {
                let (me, fleet, id) = (Arc::clone(me), Arc::clone(fleet), self.id());
                return Verdict::Wait(Box::pin(async move {
                    let (d, unit) = match me.fleet(&fleet, &key).await {
                        Some(d) => (d, US),
                        None => {
                            me.fell_back();
                            me.local(me.key.hash(&key), me.clock.monotonic_ns())
                        }
                    };
                    me.after(d, unit, id).await
                }));
            }
            me.fell_back();
        }
        let (d, unit) = me.local(me.key.hash(&key), cx.monotonic_ns(&me.clock));
        if !d.allowed {
            return Verdict::Answer(me.reject(&d, unit));
        }
        if d.wait > 0 {
            let (me, id) = (Arc::clone(me), self.id());
            return Verdict::Wait(Box::pin(async move { me.after(d, unit, id).await }));
        }
        cx.stash(self.id(), Fields(me.field(&d, unit)));
        Verdict::Next
    }

    fn deliver(&self, resp: &mut Response<Body>, cx: &Cx) {
        if let Some(Fields(v)) = cx.stashed::<Fields>(self.id()) {
            let h = resp.headers_mut();
            h.append(RATELIMIT_POLICY, self.0.policy.clone());
            h.append(RATELIMIT, v.clone());
        }
    }

    fn upstream(&self) -> bool {
        false
    }

    fn fields(&self) -> usize {
        2
    }
}

impl Inner {
    /// After a decision made in a wait: the answer, or (after the delay) the fields to stash.
    async fn after(
        self: Arc<Self>,
        d: Decision,
        unit: u64,
        id: usize,
    ) -> Result<Option<Edit>, Response<Body>> {
        if !d.allowed {
            return Err(self.reject(&d, unit));
        }
        if d.wait > 0 {
            let ns = d.wait.saturating_mul(NS / unit);
            tokio::time::sleep(Duration::from_nanos(ns)).await;
        }
        let field = self.field(&d, unit);
        Ok(Some(Box::new(move |_req, cx: &mut Cx| {
            cx.stash(id, Fields(field));
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rules::LimitKey;
    use crate::config::rules_limits::{Missing, Rate};
    use crate::config::Bounded;

    fn cfg(rate: &str, burst: i64, delay: bool) -> RateLimitConfig {
        RateLimitConfig {
            rate: Rate::parse(rate).unwrap(),
            burst: Bounded(burst),
            key: LimitKey::Client,
            missing: Missing::Client,
            delay,
            status: Default::default(),
            fleet: false,
            max_keys: Bounded(1000),
        }
    }

    #[test]
    fn five_a_second_lets_five_through_at_once_then_one_every_fifth() {
        let g = Gcra::new(&cfg("5/s", 0, false), NS);
        let mut tat = 0;
        let now = 10 * NS;
        for i in 0..5 {
            let (d, next) = g.decide(tat, now);
            assert!(d.allowed, "request {i}");
            assert_eq!(g.remaining(&d), 4 - i);
            tat = next.unwrap();
        }
        let (d, next) = g.decide(tat, now);
        assert!(!d.allowed);
        assert_eq!(next, None);
        assert_eq!(d.wait, NS / 5, "the next fits in 200 ms");
        // 200 ms later, one more.
        let (d, next) = g.decide(tat, now + NS / 5);
        assert!(d.allowed);
        assert_eq!(g.remaining(&d), 0);
        tat = next.unwrap();
        assert!(!g.decide(tat, now + NS / 5).0.allowed);
        // A second after that, the bucket is full again.
        let (d, _) = g.decide(tat, now + NS / 5 + NS);
        assert!(d.allowed);
        assert_eq!(g.remaining(&d), 4);
    }

    #[test]
    fn with_delay_those_beyond_the_count_wait_within_the_burst() {
        let g = Gcra::new(&cfg("2/s", 2, true), NS);
        let mut tat = 0;
        let now = NS;
        let mut waits = Vec::new();
        for _ in 0..4 {
            let (d, next) = g.decide(tat, now);
            assert!(d.allowed);
            waits.push(d.wait);
            tat = next.unwrap();
        }
        assert_eq!(waits, vec![0, 0, NS / 2, NS]);
        assert!(!g.decide(tat, now).0.allowed, "beyond the burst");
        // Without delay, the burst passes at once.
        let g = Gcra::new(&cfg("2/s", 2, false), NS);
        let mut tat = 0;
        for _ in 0..4 {
            let (d, next) = g.decide(tat, now);
            assert!(d.allowed && d.wait == 0);
            tat = next.unwrap();
        }
        assert!(!g.decide(tat, now).0.allowed);
    }

    /// The field of a request that found its bucket full is made once, and is the one that
    /// would be formatted for it; others are formatted.
    #[test]
    fn a_full_buckets_field_is_made_once_and_the_same() {
        let rl = RateLimit::new("api", &cfg("5/s", 2, false), &Clock::manual(), None);
        let me = &rl.0;
        let full = me.gcra.full();
        assert_eq!(me.field(&full, NS), r#""api";r=6;t=1"#);
        assert_eq!(me.field(&full, NS), field(&me.quoted, &me.gcra, &full, NS));
        assert_eq!(me.field(&me.fleet_gcra.full(), US), r#""api";r=6;t=1"#);
        let (d, next) = me.gcra.decide(NS + NS / 5, NS);
        assert_eq!(next, Some(NS + 2 * NS / 5));
        assert_eq!(me.field(&d, NS), r#""api";r=5;t=1"#);
    }

    #[test]
    fn fields_follow_the_draft() {
        assert_eq!(sf_item("api", &[("q", 5), ("w", 1)]), r#""api";q=5;w=1"#);
        assert_eq!(
            sf_item("a \"b\"", &[("r", 0), ("t", 1)]),
            r#""a \"b\"";r=0;t=1"#
        );
    }

    /// One million distinct keys in one limit's memory (issue #41: at most 100 MB). Prints the
    /// figure docs/design.md reports; asserts the bound loosely.
    #[test]
    fn a_million_keys_fit_in_well_under_100_mb() {
        let rss = || {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
            let pages: u64 = (statm.split(' ').nth(1))
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            pages * 4096
        };
        let before = rss();
        let n = 1_000_000u64;
        let cache: Cache<u64, u64> = Cache::new(n as usize);
        for i in 0..n {
            cache.insert(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i);
        }
        // A million more: an attacker's new keys evict, the map does not grow.
        for i in n..2 * n {
            cache.insert(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i);
        }
        assert!(cache.len() as u64 <= n);
        let bytes = cache.memory_used().total();
        let grown = rss().saturating_sub(before);
        println!(
            "1,000,000 keys: {bytes} bytes by quick_cache's count ({:.1} MB, {:.1} bytes a key); resident memory grew {:.1} MB",
            bytes as f64 / 1e6,
            bytes as f64 / 1e6,
            grown as f64 / 1e6
        );
        assert!(bytes < 100_000_000, "{bytes}");
    }
}
