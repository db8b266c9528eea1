//! Metrics: what the server counts, and the Prometheus text the admin listener serves at
//! `/metrics`.
//!
//! Requests are counted where each one completes (the server's per-request completion point)
//! into the current worker thread's own shard: plain loads and stores of atomics that only that
//! thread writes, so the hit path pays no shared atomic read-modify-write and no lock. A scrape
//! sums the shards. Each server has its own [`Metrics`], handed to its routers and connections
//! where they are built (no process-global registry): whoever counts borrows it, and a thread
//! meeting a server for the first time makes its shard from it. Gauges that live elsewhere (open connections, the cache, TLS handshakes,
//! ACME) are read at scrape time through functions the server registers.
//!
//! The exposition is prometheus-client's OpenMetrics text encoder, fed by one collector that
//! reads the shards and the registered figures at scrape time.
//!
//! The one hit ratio larder states anywhere ([`HIT_RESULTS`] over [`LOOKUP_RESULTS`]) is
//! defined here, with requests by route and status class for the admin status.
//!
//! Labels: `route` (the listener's address and the route's host and path prefix), `method`
//! (GET, HEAD, POST, other), `status` (1xx..5xx), `cache` (the cache-status the response
//! carries: HIT, MISS, EXPIRED, REVALIDATED, STALE, BYPASS, or none) and `encoding` (the
//! content coding of the body sent: identity, gzip, br, zstd, other).
//!
//! Bytes: the body bytes of each response by route and coding (a body of known length is
//! counted when its head is ready; a streamed one chunk by chunk as it is sent), and the bytes a
//! stored compressed variant saved: the identity body's length less the variant's, noted by the
//! delivery that chose it. What a handler knows of its response (cache result, stored coding,
//! bytes saved, why it was not stored) travels with the response ([`Outcome`], in its body),
//! not through thread-locals.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Method classes.
pub const METHODS: [&str; 4] = ["GET", "HEAD", "POST", "other"];
/// Cache results, in the order of [`CacheResult`].
pub const CACHE: [&str; 7] = [
    "none",
    "HIT",
    "MISS",
    "EXPIRED",
    "REVALIDATED",
    "STALE",
    "BYPASS",
];
/// The one hit ratio larder states (the dashboard, `larder stats`, docs/operations.md's alert
/// and the Grafana dashboard use it): hits / lookups, where the lookups are the requests that
/// looked the cache up (cache result HIT, STALE, REVALIDATED, MISS or EXPIRED: not BYPASS, not
/// none) and the hits those answered with a stored body (HIT, STALE, REVALIDATED: a 304 from
/// the origin on revalidation still sends the stored body).
pub const HIT_RESULTS: [usize; 3] = [
    CacheResult::Hit as usize,
    CacheResult::Stale as usize,
    CacheResult::Revalidated as usize,
];
/// The cache results that count as lookups of [`HIT_RESULTS`]'s ratio.
pub const LOOKUP_RESULTS: [usize; 5] = [
    CacheResult::Hit as usize,
    CacheResult::Stale as usize,
    CacheResult::Revalidated as usize,
    CacheResult::Miss as usize,
    CacheResult::Expired as usize,
];
/// The hit ratio's definition as the dashboard states it.
pub const HIT_RATIO_DEFINITION: &str = "hits (HIT + STALE + REVALIDATED) / lookups (HIT + STALE + REVALIDATED + MISS + EXPIRED); BYPASS and uncached routes are not lookups";

/// (hits, lookups) of requests counted by cache result (indexed as [`CACHE`]).
pub fn hits_and_lookups(by_cache: &[u64; CACHE.len()]) -> (u64, u64) {
    let sum = |of: &[usize]| of.iter().map(|i| by_cache[*i]).sum::<u64>();
    (sum(&HIT_RESULTS), sum(&LOOKUP_RESULTS))
}

/// Status classes of [`Metrics::by_route_status`].
pub const STATUS_NAMES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Content codings of the bytes sent, in the order of `crate::compress::Encoding`, then any
/// other.
pub const ENCODINGS: [&str; 5] = ["identity", "gzip", "br", "zstd", "other"];
/// The [`ENCODINGS`] index of a coding larder does not know.
pub const OTHER_CODING: usize = 4;
const STATUS_CLASSES: usize = 5;
/// Upper bounds of the request-duration histogram's buckets, in seconds.
pub const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];
/// [`BUCKETS`] in nanoseconds, which a completed request is compared against.
const BUCKET_NANOS: [u64; 12] = {
    let mut out = [0u64; 12];
    let mut i = 0;
    while i < BUCKETS.len() {
        out[i] = (BUCKETS[i] * 1e9) as u64;
        i += 1;
    }
    out
};

/// Now on the monotonic clock (the one `std::time::Instant` reads), in nanoseconds: a
/// request's start and end are two of these, subtracted without `Duration`'s checks.
#[inline]
pub fn clock() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write; CLOCK_MONOTONIC exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// The cache result of a response, as the handler that made it noted it ([`Outcome`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CacheResult {
    None = 0,
    Hit,
    Miss,
    Expired,
    Revalidated,
    Stale,
    Bypass,
}

thread_local! {
    /// This thread's shards, one per server running in the process (tests run many), by the id
    /// of the server's [`Metrics`]. Counters only: a request's outcome travels in its response.
    static SHARDS: RefCell<Vec<(u64, Arc<Shard>)>> = const { RefCell::new(Vec::new()) };
}

/// What the handler that made a response knows of it and the server counts and logs when it
/// completes: the cache result, the coding of a stored body it chose and the bytes that coding
/// saved, and why a response fetched for the cache was not stored. It travels in the
/// response's own body ([`crate::body::Body::outcome`]), set by whoever builds the response,
/// so a response is counted with its own outcome whatever else ran on its thread meanwhile
/// (a background refresh's response, dropped, takes its outcome with it). `Copy`, one `u64`
/// (the body it rides in is no bigger for it: see [`crate::body`]): no allocation, no
/// extension map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The cache result (bits 0-3, an index into [`CACHE`]), the coding of a stored body plus
    /// one (bits 4-7; 0: none), why the response was not stored plus one (bits 8-15; 0: it
    /// was, or was not fetched for the cache) and the bytes the coding saved (bits 16-63).
    packed: u64,
}

/// Bits of [`Outcome`]'s fields.
const CACHE_BITS: u64 = 0xf;
const CODING_SHIFT: u32 = 4;
const REASON_SHIFT: u32 = 8;
const SAVED_SHIFT: u32 = 16;
const SAVED_MAX: u64 = (1 << (64 - SAVED_SHIFT)) - 1;
const _: () = assert!(CACHE.len() <= 16 && ENCODINGS.len() < 16);

impl Outcome {
    /// Notes the cache result.
    #[inline]
    pub fn set_cache(&mut self, r: CacheResult) {
        self.packed = (self.packed & !CACHE_BITS) | r as u64;
    }

    /// Notes that the body is a stored one in coding `encoding` (an index into [`ENCODINGS`])
    /// that is `saved` bytes smaller than the identity body (at most 2^48 - 1 counted).
    #[inline]
    pub fn set_delivered(&mut self, encoding: usize, saved: u64) {
        debug_assert!(encoding < ENCODINGS.len());
        let coding = (encoding as u64 + 1) & 0xf;
        let kept = self.packed & (CACHE_BITS | (0xff << REASON_SHIFT));
        self.packed = kept | (coding << CODING_SHIFT) | (saved.min(SAVED_MAX) << SAVED_SHIFT);
    }

    /// Notes why the response, fetched for the cache, was not stored: the reason's code
    /// (`crate::cache::policy::NoStoreReason::code`; below 255).
    #[inline]
    pub fn set_not_stored(&mut self, reason: u8) {
        let code = (reason as u64 + 1) & 0xff;
        self.packed = (self.packed & !(0xff << REASON_SHIFT)) | (code << REASON_SHIFT);
    }

    /// The cache result: an index into [`CACHE`].
    #[inline]
    pub fn cache(&self) -> usize {
        (self.packed & CACHE_BITS) as usize
    }

    /// The coding of a stored body sent (an index into [`ENCODINGS`]), when the body is one.
    #[inline]
    pub fn encoding(&self) -> Option<usize> {
        ((self.packed >> CODING_SHIFT) & 0xf)
            .checked_sub(1)
            .map(|e| e as usize)
    }

    /// The bytes the stored body's coding saved.
    #[inline]
    pub fn saved(&self) -> u64 {
        self.packed >> SAVED_SHIFT
    }

    /// Why the response was not stored, when a fill said so: the reason's code
    /// (`crate::cache::policy::NoStoreReason::from_code` names it).
    #[inline]
    pub fn no_store(&self) -> Option<u8> {
        (((self.packed >> REASON_SHIFT) & 0xff) as u8).checked_sub(1)
    }
}

/// The [`ENCODINGS`] index of a Content-Encoding field value (none: identity).
pub fn encoding_class(v: Option<&http::HeaderValue>) -> usize {
    match v.map(|v| v.as_bytes()) {
        None | Some(b"identity") => 0,
        Some(b"gzip") => 1,
        Some(b"br") => 2,
        Some(b"zstd") => 3,
        Some(_) => OTHER_CODING,
    }
}

/// One thread's counters. Only the owning thread stores; scrapes load. A shard is sized for
/// the routes registered when it was made: a thread that meets a route added since (a reload)
/// gets a new shard, and the old one stays summed ([`with_shard`]).
struct Shard {
    /// The routes it has counters for.
    routes: usize,
    /// routes × methods × status classes × cache results.
    requests: Box<[AtomicU64]>,
    /// routes × cache results × (buckets + the +Inf bucket).
    buckets: Box<[AtomicU64]>,
    /// routes × cache results: total duration in nanoseconds.
    nanos: Box<[AtomicU64]>,
    /// routes × encodings: body bytes sent.
    sent: Box<[AtomicU64]>,
    /// routes: bytes saved by stored compressed variants.
    saved: Box<[AtomicU64]>,
}

impl Shard {
    fn new(routes: usize) -> Shard {
        let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        let per_route_cache = routes * CACHE.len();
        Shard {
            routes,
            requests: zeros(routes * METHODS.len() * STATUS_CLASSES * CACHE.len()),
            buckets: zeros(per_route_cache * (BUCKETS.len() + 1)),
            nanos: zeros(per_route_cache),
            sent: zeros(routes * ENCODINGS.len()),
            saved: zeros(routes),
        }
    }
}

/// The value of counter `i` of a shard's `counters`, 0 past a shard made before route ids that
/// high existed.
#[inline]
fn read(counters: &[AtomicU64], i: usize) -> u64 {
    counters.get(i).map_or(0, |c| c.load(Ordering::Relaxed))
}

/// Adds `by` to a counter only this thread writes.
#[inline]
fn bump(c: &AtomicU64, by: u64) {
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

/// A family of figures read at scrape time from the part of the server that owns them.
pub struct Family {
    /// The name without the `_total` suffix the encoder adds to counters.
    pub name: &'static str,
    pub help: &'static str,
    /// Counter or gauge.
    pub counter: bool,
    /// Each sample's labels and value.
    pub samples: Vec<(Vec<(&'static str, String)>, u64)>,
}

impl Family {
    /// A family of one sample without labels.
    pub fn one(name: &'static str, help: &'static str, counter: bool, value: u64) -> Family {
        Family {
            name,
            help,
            counter,
            samples: vec![(Vec::new(), value)],
        }
    }
}

type FamiliesFn = Box<dyn Fn() -> Vec<Family> + Send + Sync>;

/// What a scrape reads: the routes, every thread's shard, the registered figures.
#[derive(Default)]
struct State {
    routes: Mutex<Vec<String>>,
    shards: Mutex<Vec<Arc<Shard>>>,
    families: Mutex<Vec<FamiliesFn>>,
    images: ImageCounters,
}

/// A server's metrics. Each server makes its own and hands it to its routers and connections
/// (there is no registry of them in the process): whoever counts a request borrows it, and a
/// thread without a shard of it makes one from it ([`with_shard`]).
pub struct Metrics {
    /// Unique in the process, never reused: the key of this thread's shard in `SHARDS`.
    id: u64,
    state: Arc<State>,
    registry: Registry,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let state = Arc::new(State::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Collect(Arc::clone(&state))));
        Arc::new(Metrics {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            state,
            registry,
        })
    }

    /// Adds a route (before serving starts): its id for [`record`].
    pub fn route(&self, label: String) -> u32 {
        let mut r = lock(&self.state.routes);
        r.push(label);
        (r.len() - 1) as u32
    }

    /// Registers figures read at each scrape.
    pub fn families(&self, read: impl Fn() -> Vec<Family> + Send + Sync + 'static) {
        lock(&self.state.families).push(Box::new(read));
    }

    fn new_shard(&self) -> Arc<Shard> {
        let routes = lock(&self.state.routes).len();
        let shard = Arc::new(Shard::new(routes.max(1)));
        lock(&self.state.shards).push(Arc::clone(&shard));
        shard
    }

    /// Requests answered so far by cache result (indexed as [`CACHE`]), over all routes.
    pub fn totals_by_cache(&self) -> [u64; 7] {
        let routes = lock(&self.state.routes).len();
        let shards = lock(&self.state.shards).clone();
        let mut t = [0u64; 7];
        for s in &shards {
            for r in 0..routes {
                for m in 0..METHODS.len() {
                    for st in 0..STATUS_CLASSES {
                        for (c, slot) in t.iter_mut().enumerate() {
                            *slot += read(&s.requests, request_index(r as u32, m, st, c));
                        }
                    }
                }
            }
        }
        t
    }

    /// Requests answered so far on each route (its label), by status class (indexed as
    /// [`STATUS_NAMES`]).
    pub fn by_route_status(&self) -> Vec<(String, [u64; STATUS_CLASSES])> {
        let routes = lock(&self.state.routes).clone();
        let shards = lock(&self.state.shards).clone();
        let mut out: Vec<(String, [u64; STATUS_CLASSES])> = routes
            .into_iter()
            .map(|r| (r, [0; STATUS_CLASSES]))
            .collect();
        for s in &shards {
            for (r, (_, counts)) in out.iter_mut().enumerate() {
                for m in 0..METHODS.len() {
                    for (st, slot) in counts.iter_mut().enumerate() {
                        for c in 0..CACHE.len() {
                            *slot += read(&s.requests, request_index(r as u32, m, st, c));
                        }
                    }
                }
            }
        }
        out
    }

    /// Body bytes sent over all routes, by coding (indexed as [`ENCODINGS`]), and the bytes
    /// stored compressed variants saved.
    pub fn bytes(&self) -> ([u64; ENCODINGS.len()], u64) {
        let shards = lock(&self.state.shards).clone();
        let mut sent = [0u64; ENCODINGS.len()];
        let mut saved = 0;
        for s in &shards {
            for (i, c) in s.sent.iter().enumerate() {
                sent[i % ENCODINGS.len()] += c.load(Ordering::Relaxed);
            }
            saved += s
                .saved
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .sum::<u64>();
        }
        (sent, saved)
    }

    /// Requests by duration over every route and cache result: one count per bucket of
    /// [`BUCKETS`] (not cumulative), the last for longer ones.
    pub fn durations(&self) -> [u64; BUCKETS.len() + 1] {
        let shards = lock(&self.state.shards).clone();
        let mut out = [0u64; BUCKETS.len() + 1];
        for s in &shards {
            for (i, c) in s.buckets.iter().enumerate() {
                out[i % (BUCKETS.len() + 1)] += c.load(Ordering::Relaxed);
            }
        }
        out
    }

    /// The image routes' figures ([`ImageCounters`]).
    #[inline]
    pub fn images(&self) -> &ImageCounters {
        &self.state.images
    }

    /// Everything counted, in the OpenMetrics text format (what `/metrics` serves).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The collector behind the registry: reads the shards and the figures at scrape time.
struct Collect(Arc<State>);

impl std::fmt::Debug for Collect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("larder metrics")
    }
}

/// A counter or gauge value as the encoder takes it.
struct Value(u64, bool);

impl EncodeMetric for Value {
    fn encode(
        &self,
        mut e: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        if self.1 {
            e.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&self.0, None)
        } else {
            e.encode_gauge(&self.0)
        }
    }

    fn metric_type(&self) -> MetricType {
        if self.1 {
            MetricType::Counter
        } else {
            MetricType::Gauge
        }
    }
}

impl Collector for Collect {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let state = &self.0;
        let routes = lock(&state.routes).clone();
        let shards = lock(&state.shards).clone();
        let sum = |f: fn(&Shard) -> &[AtomicU64], i: usize| -> u64 {
            shards.iter().map(|s| read(f(s), i)).sum()
        };
        let mut requests = encoder.encode_descriptor(
            "larder_requests",
            "Requests answered, by route, method, status class and cache result.",
            None,
            MetricType::Counter,
        )?;
        for (r, route) in routes.iter().enumerate() {
            for (m, method) in METHODS.iter().enumerate() {
                for s in 0..STATUS_CLASSES {
                    for (c, cache) in CACHE.iter().enumerate() {
                        let n = sum(|s| &s.requests, request_index(r as u32, m, s, c));
                        if n == 0 {
                            continue;
                        }
                        let status = format!("{}xx", s + 1);
                        let labels = [
                            ("route", route.as_str()),
                            ("method", method),
                            ("status", status.as_str()),
                            ("cache", cache),
                        ];
                        requests
                            .encode_family(&labels)?
                            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(
                                &n, None,
                            )?;
                    }
                }
            }
        }
        let mut durations = encoder.encode_descriptor(
            "larder_request_duration_seconds",
            "Time from a request's head to its response's head, by route and cache result.",
            None,
            MetricType::Histogram,
        )?;
        for (r, route) in routes.iter().enumerate() {
            for (c, cache) in CACHE.iter().enumerate() {
                let rc = r * CACHE.len() + c;
                let base = rc * (BUCKETS.len() + 1);
                let counts: Vec<u64> = (0..=BUCKETS.len())
                    .map(|b| sum(|s| &s.buckets, base + b))
                    .collect();
                let total: u64 = counts.iter().sum();
                if total == 0 {
                    continue;
                }
                let buckets: Vec<(f64, u64)> = (BUCKETS.iter().copied())
                    .chain([f64::MAX])
                    .zip(counts)
                    .collect();
                let secs = sum(|s| &s.nanos, rc) as f64 / 1e9;
                let labels = [("route", route.as_str()), ("cache", cache)];
                durations
                    .encode_family(&labels)?
                    .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                        secs, total, &buckets, None,
                    )?;
            }
        }
        let mut sent = encoder.encode_descriptor(
            "larder_sent_bytes",
            "Response body bytes sent, by route and content coding.",
            None,
            MetricType::Counter,
        )?;
        for (r, route) in routes.iter().enumerate() {
            for (e, encoding) in ENCODINGS.iter().enumerate() {
                let n = sum(|s| &s.sent, r * ENCODINGS.len() + e);
                if n == 0 {
                    continue;
                }
                let labels = [("route", route.as_str()), ("encoding", encoding)];
                Value(n, true).encode(sent.encode_family(&labels)?)?;
            }
        }
        let mut saved = encoder.encode_descriptor(
            "larder_saved_bytes",
            "Body bytes not sent because a stored compressed variant was sent instead of the \
             identity body (identity length less the variant's), by route.",
            None,
            MetricType::Counter,
        )?;
        for (r, route) in routes.iter().enumerate() {
            let n = sum(|s| &s.saved, r);
            if n == 0 {
                continue;
            }
            Value(n, true).encode(saved.encode_family(&[("route", route.as_str())])?)?;
        }
        state.images.encode(&mut encoder)?;
        for read in lock(&state.families).iter() {
            for f in read() {
                let kind = if f.counter {
                    MetricType::Counter
                } else {
                    MetricType::Gauge
                };
                let mut e = encoder.encode_descriptor(f.name, f.help, None, kind)?;
                if let [(labels, v)] = &f.samples[..] {
                    if labels.is_empty() {
                        Value(*v, f.counter).encode(e)?;
                        continue;
                    }
                }
                for (labels, v) in &f.samples {
                    let labels: Vec<(&str, &str)> =
                        labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    Value(*v, f.counter).encode(e.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

/// The URL grammars of image requests ([`ImageCounters`]'s `grammar` label), in the order of
/// `crate::images::grammar::Grammar`.
pub const GRAMMARS: [&str; 3] = ["zimg", "imgproxy", "thumbor"];
/// Image output formats ([`ImageCounters`]'s `format` label); the last for any other.
pub const IMAGE_FORMATS: [&str; 6] = ["jpeg", "png", "gif", "webp", "avif", "other"];
/// How an image proxy request's original was had ([`ImageCounters::source`]): from the memory
/// tier, from a tier below (disk, shared), fetched from the origin, shared with a concurrent
/// fetch of the same URL, read from `root`, a stale copy standing in for a failing origin; or
/// why not.
pub const SOURCE_OUTCOMES: [&str; 10] = [
    "memory",
    "tier",
    "fetched",
    "coalesced",
    "local",
    "stale",
    "not_found",
    "refused",
    "too_large",
    "error",
];
/// Why the transform pool refused a job ([`ImageCounters::rejected`]): its queue was full
/// (503), no worker and memory came free within `queue_timeout` (503), it needed more than the
/// whole `decode_memory` (422).
pub const POOL_REJECTIONS: [&str; 3] = ["queue_full", "timed_out", "over_budget"];
/// Upper bounds of the transform-time histogram's buckets, in seconds.
pub const IMAGE_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const IMAGE_BUCKET_NANOS: [u64; 11] = {
    let mut out = [0u64; 11];
    let mut i = 0;
    while i < IMAGE_BUCKETS.len() {
        out[i] = (IMAGE_BUCKETS[i] * 1e9) as u64;
        i += 1;
    }
    out
};
const TRANSFORM_KINDS: usize = GRAMMARS.len() * IMAGE_FORMATS.len();
/// The stages of a transform ([`ImageCounters::stage`]'s `stage` label): decoding (with the
/// orientation turn), resizing with the filters and canvas steps, encoding (with metadata).
pub const IMAGE_STAGES: [&str; 3] = ["decode", "resize", "encode"];

/// The [`IMAGE_BUCKETS`] index of `nanos` (the last: longer than all).
fn image_bucket(nanos: u64) -> usize {
    (IMAGE_BUCKET_NANOS.iter())
        .position(|le| nanos <= *le)
        .unwrap_or(IMAGE_BUCKETS.len())
}

/// What the image routes count (docs/metrics.md, "Images"): transforms by grammar and output
/// format, their time, the transform pool's queue and refusals, originals had by outcome, and
/// bytes. Shared atomics, not per-thread shards: each count goes with a transform or an
/// original's load (milliseconds of work), never with a cached image's delivery, so one
/// `fetch_add` is nothing beside it. A server without image routes exposes none of it.
pub struct ImageCounters {
    /// An image route counts into these: the families are exposed.
    used: AtomicBool,
    /// grammars × formats.
    transforms: [AtomicU64; TRANSFORM_KINDS],
    /// Transform time: one count per bucket of [`IMAGE_BUCKETS`] (not cumulative), then +Inf.
    buckets: [AtomicU64; IMAGE_BUCKETS.len() + 1],
    nanos: AtomicU64,
    /// The same per stage of [`IMAGE_STAGES`].
    stage_buckets: [[AtomicU64; IMAGE_BUCKETS.len() + 1]; IMAGE_STAGES.len()],
    stage_nanos: [AtomicU64; IMAGE_STAGES.len()],
    /// Jobs waiting for a worker and memory now.
    queued: AtomicU64,
    /// Time jobs spent queued, in nanoseconds.
    wait_nanos: AtomicU64,
    rejected: [AtomicU64; POOL_REJECTIONS.len()],
    sources: [AtomicU64; SOURCE_OUTCOMES.len()],
    /// Bytes of the originals transformed, of the results, and what the results saved
    /// (original less result, when smaller).
    source_bytes: AtomicU64,
    output_bytes: AtomicU64,
    saved: AtomicU64,
    /// The routes' kept decoded originals (`decoded_cache`): looked up and found, looked up
    /// and decoded, and the bytes held now.
    decoded_hits: AtomicU64,
    decoded_misses: AtomicU64,
    decoded_bytes: AtomicU64,
}

impl Default for ImageCounters {
    fn default() -> Self {
        ImageCounters {
            used: AtomicBool::new(false),
            transforms: std::array::from_fn(|_| AtomicU64::new(0)),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            nanos: AtomicU64::new(0),
            stage_buckets: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            stage_nanos: std::array::from_fn(|_| AtomicU64::new(0)),
            queued: AtomicU64::new(0),
            wait_nanos: AtomicU64::new(0),
            rejected: std::array::from_fn(|_| AtomicU64::new(0)),
            sources: std::array::from_fn(|_| AtomicU64::new(0)),
            source_bytes: AtomicU64::new(0),
            output_bytes: AtomicU64::new(0),
            saved: AtomicU64::new(0),
            decoded_hits: AtomicU64::new(0),
            decoded_misses: AtomicU64::new(0),
            decoded_bytes: AtomicU64::new(0),
        }
    }
}

/// A snapshot of [`ImageCounters`] for the admin status and the dashboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImageTotals {
    pub transforms: u64,
    /// Transforms by time: one count per bucket of [`IMAGE_BUCKETS`] (not cumulative), then
    /// longer ones.
    pub buckets: [u64; IMAGE_BUCKETS.len() + 1],
    pub queued: u64,
    pub rejected: u64,
    /// Originals had, by [`SOURCE_OUTCOMES`].
    pub sources: [u64; SOURCE_OUTCOMES.len()],
    pub saved: u64,
}

impl ImageCounters {
    /// An image route counts here: its families are exposed from now on.
    pub fn enable(&self) {
        self.used.store(true, Ordering::Relaxed);
    }

    /// One transform of `grammar` (an index into [`GRAMMARS`]) to `format` (into
    /// [`IMAGE_FORMATS`]) that took `nanos` (decode, resize and encode) from `source` bytes to
    /// `output` bytes.
    pub fn transformed(&self, grammar: usize, format: usize, nanos: u64, source: u64, output: u64) {
        let kind = grammar.min(GRAMMARS.len() - 1) * IMAGE_FORMATS.len()
            + format.min(IMAGE_FORMATS.len() - 1);
        self.transforms[kind].fetch_add(1, Ordering::Relaxed);
        self.buckets[image_bucket(nanos)].fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        self.source_bytes.fetch_add(source, Ordering::Relaxed);
        self.output_bytes.fetch_add(output, Ordering::Relaxed);
        self.saved
            .fetch_add(source.saturating_sub(output), Ordering::Relaxed);
    }

    /// One transform's `stage` (an index into [`IMAGE_STAGES`]) took `nanos`.
    pub fn stage(&self, stage: usize, nanos: u64) {
        let s = stage.min(IMAGE_STAGES.len() - 1);
        self.stage_buckets[s][image_bucket(nanos)].fetch_add(1, Ordering::Relaxed);
        self.stage_nanos[s].fetch_add(nanos, Ordering::Relaxed);
    }

    /// A job joins the pool's queue; [`ImageCounters::dequeued`] takes it off.
    pub fn enqueued(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
    }

    /// A queued job left the queue after `nanos` (it starts, or it was refused or dropped).
    pub fn dequeued(&self, nanos: u64) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
        self.wait_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The pool refused a job: `why` is an index into [`POOL_REJECTIONS`].
    pub fn rejected(&self, why: usize) {
        self.rejected[why.min(POOL_REJECTIONS.len() - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// An original had (or not) with `outcome`, an index into [`SOURCE_OUTCOMES`].
    pub fn source(&self, outcome: usize) {
        self.sources[outcome.min(SOURCE_OUTCOMES.len() - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// A kept decoded original looked up: found (`hit`) or decoded afresh.
    pub fn decoded_lookup(&self, hit: bool) {
        let c = if hit {
            &self.decoded_hits
        } else {
            &self.decoded_misses
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The bytes a route's kept decoded originals hold went from `was` to `now`.
    pub fn decoded_held(&self, was: u64, now: u64) {
        if now >= was {
            self.decoded_bytes.fetch_add(now - was, Ordering::Relaxed);
        } else {
            self.decoded_bytes.fetch_sub(was - now, Ordering::Relaxed);
        }
    }

    /// Totals so far; None when no image route counts here.
    pub fn totals(&self) -> Option<ImageTotals> {
        if !self.used.load(Ordering::Relaxed) {
            return None;
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Some(ImageTotals {
            transforms: self.transforms.iter().map(load).sum(),
            buckets: std::array::from_fn(|i| load(&self.buckets[i])),
            queued: load(&self.queued),
            rejected: self.rejected.iter().map(load).sum(),
            sources: std::array::from_fn(|i| load(&self.sources[i])),
            saved: load(&self.saved),
        })
    }

    fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if !self.used.load(Ordering::Relaxed) {
            return Ok(());
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut t = encoder.encode_descriptor(
            "larder_image_transforms",
            "Image transforms made (cached results not counted), by URL grammar and output \
             format.",
            None,
            MetricType::Counter,
        )?;
        for (g, grammar) in GRAMMARS.iter().enumerate() {
            for (f, format) in IMAGE_FORMATS.iter().enumerate() {
                let n = load(&self.transforms[g * IMAGE_FORMATS.len() + f]);
                if n > 0 {
                    counter(
                        t.encode_family(&[("grammar", *grammar), ("format", *format)])?,
                        n,
                    )?;
                }
            }
        }
        // Per bucket, not cumulative: the encoder adds them up.
        let histogram = |mut e: prometheus_client::encoding::MetricEncoder<'_>,
                         counts: &[AtomicU64],
                         nanos: &AtomicU64| {
            let counts: Vec<u64> = counts.iter().map(load).collect();
            let total = counts.iter().sum();
            let buckets: Vec<(f64, u64)> = (IMAGE_BUCKETS.iter().copied())
                .chain([f64::MAX])
                .zip(counts)
                .collect();
            e.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                load(nanos) as f64 / 1e9,
                total,
                &buckets,
                None,
            )
        };
        histogram(
            encoder.encode_descriptor(
                "larder_image_transform_duration_seconds",
                "Time of an image transform on the pool (decode, resize, encode).",
                None,
                MetricType::Histogram,
            )?,
            &self.buckets,
            &self.nanos,
        )?;
        let mut stages = encoder.encode_descriptor(
            "larder_image_stage_duration_seconds",
            "Time of each stage of an image transform: decode (with the orientation turn), \
             resize (crop and scale, filters, canvas, watermark), encode (with metadata).",
            None,
            MetricType::Histogram,
        )?;
        for (i, stage) in IMAGE_STAGES.iter().enumerate() {
            histogram(
                stages.encode_family(&[("stage", *stage)])?,
                &self.stage_buckets[i],
                &self.stage_nanos[i],
            )?;
        }
        Value(load(&self.queued), false).encode(encoder.encode_descriptor(
            "larder_image_queue_depth",
            "Image transforms waiting for a worker and memory now.",
            None,
            MetricType::Gauge,
        )?)?;
        encoder
            .encode_descriptor(
                "larder_image_queue_wait_seconds",
                "Time image transforms spent queued for a worker and memory (over the transforms \
                 made: the mean wait).",
                None,
                MetricType::Counter,
            )?
            .encode_counter::<prometheus_client::encoding::NoLabelSet, f64, u64>(
                &(load(&self.wait_nanos) as f64 / 1e9),
                None,
            )?;
        let mut r = encoder.encode_descriptor(
            "larder_image_rejections",
            "Image transforms the pool refused, by reason (queue_full and timed_out: 503; \
             over_budget: 422).",
            None,
            MetricType::Counter,
        )?;
        for (i, why) in POOL_REJECTIONS.iter().enumerate() {
            counter(
                r.encode_family(&[("reason", *why)])?,
                load(&self.rejected[i]),
            )?;
        }
        let mut s = encoder.encode_descriptor(
            "larder_image_sources",
            "Originals of image proxy requests, by outcome.",
            None,
            MetricType::Counter,
        )?;
        for (i, outcome) in SOURCE_OUTCOMES.iter().enumerate() {
            let n = load(&self.sources[i]);
            if n > 0 {
                counter(s.encode_family(&[("outcome", *outcome)])?, n)?;
            }
        }
        for (name, help, c) in [
            (
                "larder_image_source_bytes",
                "Bytes of the originals transformed.",
                &self.source_bytes,
            ),
            (
                "larder_image_output_bytes",
                "Bytes of the transforms' results.",
                &self.output_bytes,
            ),
            (
                "larder_image_saved_bytes",
                "Bytes the transforms' results saved: each original's length less its result's, \
                 when smaller.",
                &self.saved,
            ),
        ] {
            counter(
                encoder.encode_descriptor(name, help, None, MetricType::Counter)?,
                load(c),
            )?;
        }
        for (name, help, c) in [
            (
                "larder_image_decoded_cache_hits",
                "Image proxy transforms that took their decoded original from the route's \
                 decoded_cache (no decode).",
                &self.decoded_hits,
            ),
            (
                "larder_image_decoded_cache_misses",
                "Image proxy transforms that looked in the route's decoded_cache and decoded \
                 their original.",
                &self.decoded_misses,
            ),
        ] {
            counter(
                encoder.encode_descriptor(name, help, None, MetricType::Counter)?,
                load(c),
            )?;
        }
        Value(load(&self.decoded_bytes), false).encode(encoder.encode_descriptor(
            "larder_image_decoded_cache_bytes",
            "Bytes of decoded originals the image routes keep now (decoded_cache).",
            None,
            MetricType::Gauge,
        )?)?;
        Ok(())
    }
}

/// A counter's value written to `e`.
fn counter(
    e: prometheus_client::encoding::MetricEncoder<'_>,
    n: u64,
) -> Result<(), std::fmt::Error> {
    Value(n, true).encode(e)
}

fn request_index(route: u32, method: usize, status: usize, cache: usize) -> usize {
    ((route as usize * METHODS.len() + method) * STATUS_CLASSES + status) * CACHE.len() + cache
}

/// What a completed request sent: the body's coding (an index into [`ENCODINGS`]), its bytes
/// (those known when its head is ready) and the bytes its coding saved.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sent {
    pub encoding: usize,
    pub bytes: u64,
    pub saved: u64,
}

/// Counts one completed request of the server whose metrics are `m` on `route` (this thread's
/// shard): its method class, status, cache result ([`Outcome::cache`]), duration (`nanos`, from
/// [`clock`] readings) and bytes. The caller holds the metrics (the router, the connection):
/// a borrow, no reference count touched per request.
#[inline]
pub fn record(
    m: &Metrics,
    route: u32,
    method: usize,
    status: u16,
    cache: usize,
    nanos: u64,
    sent: Sent,
) {
    let status = (usize::from(status / 100)).clamp(1, 5) - 1;
    with_shard(m, route, |shard| {
        bump(
            &shard.requests[request_index(route, method, status, cache)],
            1,
        );
        let rc = route as usize * CACHE.len() + cache;
        let b = BUCKET_NANOS
            .iter()
            .position(|le| nanos <= *le)
            .unwrap_or(BUCKETS.len());
        bump(&shard.buckets[rc * (BUCKETS.len() + 1) + b], 1);
        bump(&shard.nanos[rc], nanos);
        let e = route as usize * ENCODINGS.len() + sent.encoding.min(ENCODINGS.len() - 1);
        bump(&shard.sent[e], sent.bytes);
        if sent.saved > 0 {
            bump(&shard.saved[route as usize], sent.saved);
        }
    });
}

/// Counts `bytes` more body bytes sent on `route` in coding `encoding` (a streamed body's
/// chunk, on the thread that polled it).
pub fn add_sent(m: &Metrics, route: u32, encoding: usize, bytes: u64) {
    with_shard(m, route, |shard| {
        let e = route as usize * ENCODINGS.len() + encoding.min(ENCODINGS.len() - 1);
        bump(&shard.sent[e], bytes);
    });
}

/// Runs `f` on this thread's shard of the server whose metrics are `m` that has counters for
/// `route`: made from `m` on the thread's first request of that server (a request may complete
/// on another worker thread than the one it started on: work-stealing, HTTP/2 streams), and
/// made anew (the old one stays summed at scrapes) when a reload registered routes since.
/// Shards are found by the metrics' id, never reused in the process (an address could be, by
/// a later server's metrics).
#[inline]
fn with_shard(m: &Metrics, route: u32, f: impl FnOnce(&Shard)) {
    SHARDS.with(|shards| {
        let mut shards = shards.borrow_mut();
        let found = shards.iter().position(|(id, _)| *id == m.id);
        let at = match found {
            Some(at) if (route as usize) < shards[at].1.routes => at,
            _ => {
                let shard = m.new_shard();
                if shard.routes <= route as usize {
                    return; // not a route of this server's
                }
                match found {
                    Some(at) => {
                        shards[at].1 = shard;
                        at
                    }
                    None => {
                        // The shards of servers gone (their metrics dropped) go with them.
                        shards.retain(|(_, s)| Arc::strong_count(s) > 1);
                        shards.push((m.id, shard));
                        shards.len() - 1
                    }
                }
            }
        };
        f(&shards[at].1);
    });
}

/// A streamed response body whose bytes are counted as they are sent ([`add_sent`]), on
/// whichever thread polls it: it holds the server's metrics (one reference count per streamed
/// body of unknown length, which is boxed anyway; bodies of known length are counted whole by
/// [`record`]).
pub struct CountedBody<B> {
    inner: B,
    metrics: Arc<Metrics>,
    route: u32,
    encoding: usize,
}

impl<B> CountedBody<B> {
    pub fn new(inner: B, metrics: Arc<Metrics>, route: u32, encoding: usize) -> CountedBody<B> {
        CountedBody {
            inner,
            metrics,
            route,
            encoding,
        }
    }
}

impl<B> http_body::Body for CountedBody<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, B::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                add_sent(&self.metrics, self.route, self.encoding, data.len() as u64);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The method class of `m` (an index into [`METHODS`]).
#[inline]
pub fn method_class(m: &http::Method) -> usize {
    match *m {
        http::Method::GET => 0,
        http::Method::HEAD => 1,
        http::Method::POST => 2,
        _ => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bucketed_in_nanoseconds() {
        assert_eq!(BUCKET_NANOS[0], 100_000);
        assert_eq!(BUCKET_NANOS[3], 1_000_000);
        assert_eq!(BUCKET_NANOS[11], 2_500_000_000);
        let (a, i, b) = (clock(), std::time::Instant::now(), clock());
        std::thread::sleep(std::time::Duration::from_millis(2));
        let (c, j) = (clock(), std::time::Instant::now());
        assert!(a <= b && b < c);
        // The same clock as Instant's: the two measure the same interval within 1 ms.
        let ours = c - a;
        let std = j.duration_since(i).as_nanos() as u64;
        assert!(ours.abs_diff(std) < 1_000_000, "{ours} vs {std}");
    }

    #[test]
    fn counts_per_thread_are_summed_at_scrape() {
        let m = Metrics::new();
        let r = m.route("127.0.0.1:80 */".into());
        // 300 µs: in the bucket up to 0.5 ms.
        let t0 = 300_000;
        let sent = |encoding, bytes, saved| Sent {
            encoding,
            bytes,
            saved,
        };
        let hit = CacheResult::Hit as usize;
        record(&m, r, 0, 200, hit, t0, sent(1, 100, 900));
        std::thread::scope(|s| {
            s.spawn(|| {
                record(&m, r, 0, 200, hit, t0, sent(1, 50, 450));
                record(&m, r, 3, 404, 0, t0, sent(0, 7, 0));
                add_sent(&m, r, 4, 5);
            });
        });
        let text = m.render();
        assert!(
            text.contains(
                "larder_requests_total{route=\"127.0.0.1:80 */\",method=\"GET\",status=\"2xx\",cache=\"HIT\"} 2"
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            text.contains("method=\"other\",status=\"4xx\",cache=\"none\"} 1"),
            "{text}"
        );
        assert!(text.contains(
            "larder_request_duration_seconds_count{route=\"127.0.0.1:80 */\",cache=\"HIT\"} 2"
        ));
        assert!(text.contains(
            "larder_request_duration_seconds_bucket{le=\"0.00025\",route=\"127.0.0.1:80 */\",cache=\"HIT\"} 0"
        ), "{text}");
        assert!(text.contains(
            "larder_request_duration_seconds_bucket{le=\"0.0005\",route=\"127.0.0.1:80 */\",cache=\"HIT\"} 2"
        ), "{text}");
        for line in [
            "larder_sent_bytes_total{route=\"127.0.0.1:80 */\",encoding=\"gzip\"} 150",
            "larder_sent_bytes_total{route=\"127.0.0.1:80 */\",encoding=\"identity\"} 7",
            "larder_sent_bytes_total{route=\"127.0.0.1:80 */\",encoding=\"other\"} 5",
            "larder_saved_bytes_total{route=\"127.0.0.1:80 */\"} 1350",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert_eq!(m.bytes(), ([7, 150, 0, 0, 5], 1350));
        let by_route = m.by_route_status();
        assert_eq!(
            by_route,
            vec![("127.0.0.1:80 */".to_string(), [0, 2, 0, 1, 0])]
        );
    }

    #[test]
    fn one_hit_ratio_hits_over_lookups() {
        let mut by_cache = [0u64; CACHE.len()];
        for (name, n) in [
            ("none", 100),
            ("HIT", 60),
            ("MISS", 10),
            ("EXPIRED", 5),
            ("REVALIDATED", 3),
            ("STALE", 2),
            ("BYPASS", 50),
        ] {
            by_cache[CACHE.iter().position(|c| *c == name).unwrap()] = n;
        }
        // BYPASS and none are not lookups; a revalidated or stale answer is a hit.
        assert_eq!(hits_and_lookups(&by_cache), (65, 80));
    }

    /// Each server's metrics count its own requests, on any thread, with no registry of
    /// servers: a thread makes its shard from the metrics it is lent, and drops the shards of
    /// servers gone when it meets a new one.
    #[test]
    fn each_server_counts_into_the_metrics_it_is_lent() {
        let (a, b) = (Metrics::new(), Metrics::new());
        let (ra, rb) = (a.route("a */".into()), b.route("b */".into()));
        let hit = CacheResult::Hit as usize;
        std::thread::scope(|s| {
            s.spawn(|| {
                record(&a, ra, 0, 200, hit, 1, Sent::default());
                record(&b, rb, 0, 200, hit, 1, Sent::default());
                record(&b, rb, 0, 200, hit, 1, Sent::default());
                let gone = Metrics::new();
                let r = gone.route("gone */".into());
                record(&gone, r, 0, 200, hit, 1, Sent::default());
                drop(gone);
                let next = Metrics::new();
                let r = next.route("next */".into());
                record(&next, r, 0, 200, hit, 1, Sent::default());
                // a's, b's and next's: gone's shard went when next's was made.
                SHARDS.with(|s| assert_eq!(s.borrow().len(), 3));
            });
        });
        assert_eq!(a.totals_by_cache()[hit], 1);
        assert_eq!(b.totals_by_cache()[hit], 2);
        assert!(!a.render().contains("b */"));
        assert!(!b.render().contains("a */"));
    }

    #[test]
    fn an_outcome_packs_cache_result_coding_saving_and_reason() {
        let none = Outcome::default();
        assert_eq!(
            (none.cache(), none.encoding(), none.saved(), none.no_store()),
            (0, None, 0, None)
        );
        let mut o = Outcome::default();
        o.set_cache(CacheResult::Stale);
        o.set_not_stored(2);
        o.set_delivered(2, 123_456_789);
        o.set_cache(CacheResult::Hit);
        assert_eq!(o.cache(), CacheResult::Hit as usize);
        assert_eq!(o.encoding(), Some(2));
        assert_eq!(o.saved(), 123_456_789);
        assert_eq!(o.no_store(), Some(2));
        o.set_delivered(0, u64::MAX);
        assert_eq!(
            (o.encoding(), o.saved()),
            (Some(0), (1 << 48) - 1),
            "clamped"
        );
        assert_eq!(
            (o.cache(), o.no_store()),
            (CacheResult::Hit as usize, Some(2)),
            "kept"
        );
        o.set_not_stored(0);
        o.set_cache(CacheResult::Bypass);
        assert_eq!(
            (o.cache(), o.encoding(), o.saved(), o.no_store()),
            (
                CacheResult::Bypass as usize,
                Some(0),
                (1 << 48) - 1,
                Some(0)
            ),
            "each field its own bits"
        );
        assert_eq!(std::mem::size_of::<Outcome>(), 8);
        let v = |s: &'static str| http::HeaderValue::from_static(s);
        assert_eq!(encoding_class(None), 0);
        assert_eq!(encoding_class(Some(&v("br"))), 2);
        assert_eq!(encoding_class(Some(&v("x-custom"))), 4);
    }
}
