//! Metrics: what the server counts, and the Prometheus text the admin listener serves at
//! `/metrics`.
//!
//! Requests are counted where each one completes (the server's per-request completion point)
//! into the current worker thread's own shard: plain loads and stores of atomics that only that
//! thread writes, so the hit path pays no shared atomic read-modify-write and no lock. A scrape
//! sums the shards. Gauges that live elsewhere (open connections, the cache, TLS handshakes,
//! ACME) are read at scrape time through functions the server registers.
//!
//! Labels: `route` (the listener's address and the route's host and path prefix), `method`
//! (GET, HEAD, POST, other), `status` (1xx..5xx) and `cache` (the cache-status the response
//! carries: HIT, MISS, EXPIRED, REVALIDATED, STALE, BYPASS, or none).

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

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
const STATUS_CLASSES: usize = 5;
/// Upper bounds of the request-duration histogram's buckets, in seconds.
pub const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

/// The cache result of a response, as the handler that made it noted it ([`note_cache`]).
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
    /// The cache result of the response this thread made last, taken when it completes (a
    /// response is made and completes in the same poll of its task).
    static NOTED: Cell<u8> = const { Cell::new(0) };
    /// This thread's shards, one per server running in the process (tests run many).
    static SHARDS: RefCell<Vec<(u64, Arc<Shard>)>> = const { RefCell::new(Vec::new()) };
}

/// Notes the cache result of the response being made on this thread.
#[inline]
pub fn note_cache(r: CacheResult) {
    NOTED.with(|n| n.set(r as u8));
}

/// One thread's counters. Only the owning thread stores; scrapes load.
struct Shard {
    /// routes × methods × status classes × cache results.
    requests: Box<[AtomicU64]>,
    /// routes × cache results × (buckets + the +Inf bucket).
    buckets: Box<[AtomicU64]>,
    /// routes × cache results: total duration in nanoseconds.
    nanos: Box<[AtomicU64]>,
}

impl Shard {
    fn new(routes: usize) -> Shard {
        let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        let per_route_cache = routes * CACHE.len();
        Shard {
            requests: zeros(routes * METHODS.len() * STATUS_CLASSES * CACHE.len()),
            buckets: zeros(per_route_cache * (BUCKETS.len() + 1)),
            nanos: zeros(per_route_cache),
        }
    }
}

/// Adds `by` to a counter only this thread writes.
#[inline]
fn bump(c: &AtomicU64, by: u64) {
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

type GaugeFn = Box<dyn Fn(&mut String) + Send + Sync>;

/// A server's metrics.
pub struct Metrics {
    id: u64,
    routes: Mutex<Vec<String>>,
    shards: Mutex<Vec<Arc<Shard>>>,
    /// Families written at scrape time by the parts that own the figures.
    gauges: Mutex<Vec<GaugeFn>>,
}

/// Every server's metrics, for a thread meeting a server for the first time.
static SERVERS: Mutex<Vec<(u64, Weak<Metrics>)>> = Mutex::new(Vec::new());

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let m = Arc::new(Metrics {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            routes: Mutex::default(),
            shards: Mutex::default(),
            gauges: Mutex::default(),
        });
        let mut all = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|(_, w)| w.strong_count() > 0);
        all.push((m.id, Arc::downgrade(&m)));
        m
    }

    /// Adds a route (before serving starts): its id for [`Metrics::record`].
    pub fn route(&self, label: String) -> u32 {
        let mut r = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        r.push(label);
        (r.len() - 1) as u32
    }

    /// The server's id, for [`record`].
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Registers a writer of families read at scrape time (Prometheus text, with HELP and
    /// TYPE lines).
    pub fn gauge(&self, write: impl Fn(&mut String) + Send + Sync + 'static) {
        (self.gauges.lock().unwrap_or_else(|e| e.into_inner())).push(Box::new(write));
    }

    fn new_shard(&self) -> Arc<Shard> {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner()).len();
        let shard = Arc::new(Shard::new(routes.max(1)));
        (self.shards.lock().unwrap_or_else(|e| e.into_inner())).push(Arc::clone(&shard));
        shard
    }

    /// The Prometheus text exposition of everything counted.
    pub fn render(&self) -> String {
        let routes = self
            .routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let shards = self
            .shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let sum = |f: fn(&Shard) -> &[AtomicU64], i: usize| -> u64 {
            shards.iter().map(|s| f(s)[i].load(Ordering::Relaxed)).sum()
        };
        let mut out = String::with_capacity(4096);
        out.push_str("# HELP larder_requests_total Requests answered, by route, method, status class and cache result.\n# TYPE larder_requests_total counter\n");
        for (r, route) in routes.iter().enumerate() {
            for (m, method) in METHODS.iter().enumerate() {
                for s in 0..STATUS_CLASSES {
                    for (c, cache) in CACHE.iter().enumerate() {
                        let i = request_index(r as u32, m, s, c);
                        let n = sum(|s| &s.requests, i);
                        if n > 0 {
                            let _ = writeln!(
                                out,
                                "larder_requests_total{{route=\"{}\",method=\"{method}\",status=\"{}xx\",cache=\"{cache}\"}} {n}",
                                escape(route),
                                s + 1
                            );
                        }
                    }
                }
            }
        }
        out.push_str("# HELP larder_request_duration_seconds Time from a request's head to its response's head, by route and cache result.\n# TYPE larder_request_duration_seconds histogram\n");
        for (r, route) in routes.iter().enumerate() {
            for (c, cache) in CACHE.iter().enumerate() {
                let rc = r * CACHE.len() + c;
                let base = rc * (BUCKETS.len() + 1);
                let total: u64 = (0..=BUCKETS.len())
                    .map(|b| sum(|s| &s.buckets, base + b))
                    .sum();
                if total == 0 {
                    continue;
                }
                let labels = format!("route=\"{}\",cache=\"{cache}\"", escape(route));
                let mut cumulative = 0;
                for (b, le) in BUCKETS.iter().enumerate() {
                    cumulative += sum(|s| &s.buckets, base + b);
                    let _ = writeln!(
                        out,
                        "larder_request_duration_seconds_bucket{{{labels},le=\"{le}\"}} {cumulative}"
                    );
                }
                let _ = writeln!(
                    out,
                    "larder_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {total}"
                );
                let secs = sum(|s| &s.nanos, rc) as f64 / 1e9;
                let _ = writeln!(
                    out,
                    "larder_request_duration_seconds_sum{{{labels}}} {secs}"
                );
                let _ = writeln!(
                    out,
                    "larder_request_duration_seconds_count{{{labels}}} {total}"
                );
            }
        }
        for g in self.gauges.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            g(&mut out);
        }
        out
    }
}

fn request_index(route: u32, method: usize, status: usize, cache: usize) -> usize {
    ((route as usize * METHODS.len() + method) * STATUS_CLASSES + status) * CACHE.len() + cache
}

/// A label value with `\`, `"` and newlines escaped (Prometheus text format).
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Counts one completed request of server `server` on `route` (this thread's shard): its
/// method class, status and the cache result its handler noted, and its duration.
#[inline]
pub fn record(server: u64, route: u32, method: usize, status: u16, started: Instant) {
    let cache = NOTED.with(|n| n.replace(0)) as usize;
    let status = (usize::from(status / 100)).clamp(1, 5) - 1;
    let nanos = started.elapsed().as_nanos() as u64;
    SHARDS.with(|shards| {
        let mut shards = shards.borrow_mut();
        let at = match shards.iter().position(|(id, _)| *id == server) {
            Some(at) => at,
            None => {
                let Some(m) = (SERVERS.lock().unwrap_or_else(|e| e.into_inner()).iter())
                    .find(|(id, _)| *id == server)
                    .and_then(|(_, w)| w.upgrade())
                else {
                    return;
                };
                shards.push((server, m.new_shard()));
                shards.len() - 1
            }
        };
        let shard = &shards[at].1;
        let Some(c) = shard
            .requests
            .get(request_index(route, method, status, cache))
        else {
            return;
        };
        bump(c, 1);
        let rc = route as usize * CACHE.len() + cache;
        let secs = nanos as f64 / 1e9;
        let b = BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(BUCKETS.len());
        bump(&shard.buckets[rc * (BUCKETS.len() + 1) + b], 1);
        bump(&shard.nanos[rc], nanos);
    });
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
    fn counts_per_thread_are_summed_at_scrape() {
        let m = Metrics::new();
        let r = m.route("127.0.0.1:80 */".into());
        let id = m.id();
        let t0 = Instant::now();
        note_cache(CacheResult::Hit);
        record(id, r, 0, 200, t0);
        std::thread::scope(|s| {
            s.spawn(|| {
                note_cache(CacheResult::Hit);
                record(id, r, 0, 200, t0);
                record(id, r, 3, 404, t0);
            });
        });
        let text = m.render();
        assert!(
            text.contains(
                "larder_requests_total{route=\"127.0.0.1:80 */\",method=\"GET\",status=\"2xx\",cache=\"HIT\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("method=\"other\",status=\"4xx\",cache=\"none\"} 1"),
            "{text}"
        );
        assert!(text.contains(
            "larder_request_duration_seconds_count{route=\"127.0.0.1:80 */\",cache=\"HIT\"} 2"
        ));
    }
}
