//! Micro-benchmarks of the cache's hot functions, and purge on a million-entry store.
//!
//! `cargo bench --bench cache` (add `-- purge` for the purge group only).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};

use larder::cache::policy::Freshness;
use larder::cache::{Cache, CacheKey, Entry};
use larder::compress::{AcceptEncoding, Encoding};
use larder::config::{ByteSize, CacheConfig, CompressionConfig};
use larder::deliver::{self, CacheStatus};

fn fresh() -> Freshness {
    Freshness::own(Duration::from_secs(3600), std::time::SystemTime::now())
}

fn json_entry() -> Entry {
    let body = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/demo/data.json"
    ))
    .unwrap();
    let cfg = CompressionConfig::default();
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    headers.insert(header::ETAG, HeaderValue::from_static("\"abc\""));
    headers.insert(
        header::DATE,
        HeaderValue::from_static("Sat, 21 Nov 2026 10:00:00 GMT"),
    );
    let bodies = Encoding::ALL
        .iter()
        .map(|e| (*e, larder::compress::encode(&body, *e, &cfg)))
        .collect();
    Entry::build(StatusCode::OK, headers, bodies, fresh(), true)
}

fn hot_path(c: &mut Criterion) {
    let entry = json_entry();
    let status_header = HeaderName::from_static("x-cache");
    let mut req = HeaderMap::new();
    req.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("gzip, deflate, br, zstd"),
    );
    req.insert(header::HOST, HeaderValue::from_static("example.com"));
    c.bench_function("deliver_hit_br", |b| {
        b.iter(|| {
            deliver::from_entry(
                black_box(&entry),
                &Method::GET,
                &req,
                CacheStatus::Hit,
                &status_header,
                // Read per delivery, as a hit does.
                std::time::SystemTime::now(),
            )
        })
    });
    let ae = HeaderValue::from_static("gzip, deflate, br;q=0.9, zstd;q=0.8, *;q=0.1");
    c.bench_function("accept_encoding_parse", |b| {
        b.iter(|| AcceptEncoding::parse(Some(black_box(&ae))).choose(entry.by_size()))
    });
    let store = Cache::new(CacheConfig::default(), CompressionConfig::default());
    let key = CacheKey::from_parts("http", "example.com", "/data.json");
    store.store(key.clone(), Arc::new(entry));
    c.bench_function("store_lookup", |b| {
        b.iter(|| {
            let k = CacheKey::from_parts("http", "example.com", black_box("/data.json"));
            store.lookup(&k, &req)
        })
    });
}

/// A store of `n` small entries; every hundredth is tagged "hot".
fn million(n: usize) -> Arc<Cache> {
    let store = Cache::new(
        CacheConfig {
            max_size: ByteSize(4 << 30),
            ..CacheConfig::default()
        },
        CompressionConfig::default(),
    );
    let body = Bytes::from_static(b"0123456789");
    for i in 0..n {
        let mut e = Entry::build(
            StatusCode::OK,
            HeaderMap::new(),
            vec![(Encoding::Identity, body.clone())],
            fresh(),
            false,
        );
        if i % 100 == 0 {
            e.tags = vec![Box::from("hot")].into_boxed_slice();
        }
        store.store(
            CacheKey::from_parts("http", "h", &format!("/{i}")),
            Arc::new(e),
        );
    }
    store
}

fn purge(c: &mut Criterion) {
    const N: usize = 1_000_000;
    let store = million(N);
    assert!(store.len() > N * 9 / 10, "store holds {}", store.len());
    let mut g = c.benchmark_group("purge");
    g.sample_size(10);
    // The scan itself: a tag that matches nothing, so the store stays the same size.
    g.bench_function("purge_by_tag_scan_1m_entries", |b| {
        b.iter(|| store.purge_where(|_, e| e.tags.iter().any(|t| &**t == "nothing")))
    });
    // Lookups while a purge scans the store in another thread, against lookups on an idle store.
    let probe = CacheKey::from_parts("http", "h", "/12345");
    let empty = HeaderMap::new();
    g.sample_size(50);
    g.bench_function("lookup_idle", |b| {
        b.iter(|| store.lookup(black_box(&probe), &empty))
    });
    let stop = Arc::new(AtomicBool::new(false));
    let purger = {
        let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                store.purge_where(|_, e| e.tags.iter().any(|t| &**t == "nothing"));
            }
        })
    };
    g.bench_function("lookup_during_purge_scan", |b| {
        b.iter(|| store.lookup(black_box(&probe), &empty))
    });
    // Worst single lookup while purging, printed for docs/benchmarks.md.
    let mut worst = Duration::ZERO;
    for _ in 0..200_000 {
        let t = Instant::now();
        black_box(store.lookup(&probe, &empty));
        worst = worst.max(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    purger.join().unwrap();
    println!("worst lookup of 200000 during purge scans: {worst:?}");
    // The real purge: 1% of a million entries.
    let t = Instant::now();
    let n = store.purge_where(|_, e| e.tags.iter().any(|t| &**t == "hot"));
    println!(
        "purged {n} tagged entries of {} in {:?}",
        store.len() + n,
        t.elapsed()
    );
    g.finish();
}

criterion_group!(benches, hot_path, purge);
criterion_main!(benches);
