//! The figures the metrics read at scrape time (`/metrics` on the admin listener): connections,
//! the cache and its tiers, origins' 1xx responses dropped, TLS handshakes and ACME
//! certificates, the pools, push routes, the access log.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::cache::Cache;
use crate::interim;
use crate::tls;

/// The figures read at scrape time: connections, the cache, origins' 1xx responses dropped,
/// TLS handshakes and ACME certificates.
pub(super) fn register(
    m: &crate::metrics::Metrics,
    cache: &Arc<Cache>,
    conns: &Arc<Semaphore>,
    max_conns: usize,
    interim_dropped: &interim::Dropped,
    proxy_refused: &Arc<std::sync::atomic::AtomicU64>,
    tls: &[Arc<tls::Acceptor>],
) {
    use crate::metrics::Family;
    let (conns, cache) = (Arc::clone(conns), Arc::clone(cache));
    let dropped = Arc::clone(interim_dropped);
    let refused = Arc::clone(proxy_refused);
    m.families(move || {
        let open = max_conns - conns.available_permits();
        vec![
            Family::one(
                "larder_connections_open",
                "Client connections open now (TCP and QUIC).",
                false,
                open as u64,
            ),
            Family::one(
                "larder_connections_max",
                "The bound on open connections (max_connections).",
                false,
                max_conns as u64,
            ),
            Family::one(
                "larder_cache_entries",
                "Responses stored (each variant counts).",
                false,
                cache.len() as u64,
            ),
            Family::one(
                "larder_cache_bytes",
                "Bytes the cache holds.",
                false,
                cache.weight(),
            ),
            Family::one(
                "larder_cache_capacity_bytes",
                "The cache's size bound.",
                false,
                cache.capacity(),
            ),
            Family::one(
                "larder_cache_fills_in_flight",
                "Origin fetches filling the cache now.",
                false,
                cache.fills_in_flight() as u64,
            ),
            Family::one(
                "larder_interim_dropped",
                "Origins' 1xx responses dropped at their bounds.",
                true,
                dropped.load(Ordering::Relaxed),
            ),
            Family::one(
                "larder_proxy_protocol_refused",
                "Connections closed on a proxy_protocol listener: no valid PROXY header in time.",
                true,
                refused.load(Ordering::Relaxed),
            ),
        ]
    });
    if tls.is_empty() {
        return;
    }
    let tls = tls.to_vec();
    m.families(move || {
        let c = (tls.iter()).fold(tls::Counts::default(), |s, a| s + a.counters.snapshot());
        let outcome = |o: &str, n: u64| (vec![("outcome", o.to_string())], n);
        let mut out = vec![Family {
            name: "larder_tls_handshakes",
            help: "TLS handshakes on TLS listeners, by outcome.",
            counter: true,
            samples: vec![
                outcome("done", c.handshakes),
                outcome("failed", c.failed),
                outcome("timed_out", c.timed_out),
                outcome("plain_http", c.plain_http),
            ],
        }];
        let acme: Vec<_> = (tls.iter())
            .filter_map(|a| a.acme.as_ref())
            .map(|a| (a.domain().to_string(), a.status()))
            .collect();
        if !acme.is_empty() {
            let expiry = |s: &tls::acme::AcmeStatus| {
                (s.not_after)
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs())
            };
            out.push(Family {
                name: "larder_acme_certificate_expiry_seconds",
                help: "When the ACME certificate in use expires (Unix time; 0: none yet).",
                counter: false,
                samples: (acme.iter())
                    .map(|(d, s)| (vec![("domain", d.clone())], expiry(s)))
                    .collect(),
            });
            out.push(Family {
                name: "larder_acme_failures",
                help: "ACME orders that failed since start.",
                counter: true,
                samples: (acme.iter())
                    .map(|(d, s)| (vec![("domain", d.clone())], s.failures))
                    .collect(),
            });
        }
        out
    });
}

/// The families of the parts that count for themselves: the pools (replaced whole by a
/// reload), push routes, the cache's tiers, and the access log's dropped lines.
pub(super) fn register_families(
    m: &crate::metrics::Metrics,
    cache: &Arc<Cache>,
    pools: &Arc<std::sync::RwLock<crate::upstream::Pools>>,
    push: &Arc<crate::push::Stores>,
    access_log: &Option<Arc<crate::access_log::AccessLog>>,
) {
    let running = Arc::clone(pools);
    m.families(move || running.read().expect("not poisoned").metric_families());
    let push = Arc::clone(push);
    m.families(move || push.metric_families());
    let tiered = Arc::clone(cache);
    m.families(move || tiered.metric_families());
    if let Some(log) = access_log {
        let log = Arc::clone(log);
        m.families(move || {
            vec![crate::metrics::Family::one(
                "larder_access_log_dropped",
                "Access log lines dropped because the writer fell behind.",
                true,
                log.dropped(),
            )]
        });
    }
}
