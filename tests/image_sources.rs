//! The image proxy's originals (`larder::images::source`): fetched from a real origin once
//! however many loads ask at once, kept by its caching headers (no-store: fetched each time; a
//! stale one revalidated with its ETag), refused over `max_source_size` before being read in
//! full, errors never cached; absolute sources only from `allow_sources` (compared parsed);
//! relative paths that cannot leave the origin or the root. Plus the image route without
//! `dir` and, for the lead to enable once the imgproxy glue is merged, the quick start end to
//! end.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{one_route, Larder, Origin, Reply};
use larder::cache::Cache;
use larder::clock::Clock;
use larder::config::{CacheConfig, CompressionConfig, ImagesConfig};
use larder::images::source::{SourceError, SourceRef, Sources};
use larder::upstream::Pools;

/// The sources of an image route whose origin is `origin`, as `keys` changes it, on a cache
/// in memory read on a clock the test moves.
async fn sources(origin: &str, keys: impl FnOnce(&mut ImagesConfig)) -> (Arc<Sources>, Clock) {
    sources_at(Clock::adjustable(), origin, keys).await
}

/// [`sources`] on `clock` (an origin started on it dates its replies by it).
async fn sources_at(
    clock: Clock,
    origin: &str,
    keys: impl FnOnce(&mut ImagesConfig),
) -> (Arc<Sources>, Clock) {
    let cache = Cache::open(
        CacheConfig::default(),
        CompressionConfig::default(),
        clock.clone(),
        None,
    )
    .await
    .unwrap();
    let mut cfg = ImagesConfig::new_origin(origin.to_string());
    keys(&mut cfg);
    (
        Arc::new(Sources::new(&cfg, cache, &Pools::default())),
        clock,
    )
}

fn rel(p: &str) -> SourceRef {
    SourceRef::Relative(p.into())
}

#[tokio::test]
async fn concurrent_loads_fetch_once_and_a_fresh_original_is_not_fetched_again() {
    let clock = Clock::adjustable();
    let origin = Origin::start_at(&clock, |seen, _| {
        if seen
            .headers
            .get("if-none-match")
            .is_some_and(|v| v == "\"v1\"")
        {
            return Reply::ok("")
                .status(304)
                .header("cache-control", "max-age=60");
        }
        Reply::ok("the original bytes")
            .header("cache-control", "max-age=60")
            .header("etag", "\"v1\"")
            // Long enough for every load to join the first one's fetch.
            .delay(Duration::from_millis(300))
    })
    .await;
    let (s, clock) = sources_at(clock, &origin.url(), |_| {}).await;
    let mut loads = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let s = Arc::clone(&s);
        loads.spawn(async move { s.load(&rel("photo.jpg")).await });
    }
    let mut ids = Vec::new();
    while let Some(got) = loads.join_next().await {
        let o = got.unwrap().unwrap();
        assert_eq!(&o.data[..], b"the original bytes");
        ids.push(o.id);
    }
    assert_eq!(origin.hits(), 1, "20 concurrent loads, one fetch");
    assert!(ids.iter().all(|i| *i == ids[0]));
    assert_eq!(origin.seen()[0].path, "/photo.jpg");
    // Within its freshness: from the cache.
    let again = s.load(&rel("photo.jpg")).await.unwrap();
    assert_eq!(origin.hits(), 1);
    assert_eq!(again.id, ids[0]);
    // Stale: revalidated with its ETag; the 304 keeps the bytes and the id.
    clock.advance(Duration::from_secs(61));
    let revalidated = s.load(&rel("photo.jpg")).await.unwrap();
    assert_eq!(origin.hits(), 2);
    assert_eq!(origin.seen()[1].headers["if-none-match"], "\"v1\"");
    assert_eq!(&revalidated.data[..], b"the original bytes");
    assert_eq!(revalidated.id, ids[0]);
    // Fresh again for another minute.
    s.load(&rel("photo.jpg")).await.unwrap();
    assert_eq!(origin.hits(), 2);
}

#[tokio::test]
async fn no_store_is_fetched_each_time_and_new_bytes_make_a_new_id() {
    let origin =
        Origin::start(|_, n| Reply::ok(format!("version {n}")).header("cache-control", "no-store"))
            .await;
    let (s, _) = sources(&origin.url(), |_| {}).await;
    let a = s.load(&rel("a.jpg")).await.unwrap();
    let b = s.load(&rel("a.jpg")).await.unwrap();
    let c = s.load(&rel("a.jpg")).await.unwrap();
    assert_eq!(origin.hits(), 3);
    assert_eq!(&c.data[..], b"version 2");
    assert_ne!(a.id, b.id, "the id names the bytes");
    assert_ne!(b.id, c.id);
}

#[tokio::test]
async fn a_declared_length_over_the_limit_is_refused_unread_and_not_cached() {
    let produced = Arc::new(AtomicU64::new(0));
    let p = Arc::clone(&produced);
    let origin = Origin::start(move |_, _| {
        Reply::generated(200 << 20, true, &p).header("cache-control", "max-age=600")
    })
    .await;
    let (s, _) = sources(&origin.url(), |c| c.max_source_size.0 = 1 << 20).await;
    let e = s.load(&rel("huge.jpg")).await.unwrap_err();
    assert!(matches!(e, SourceError::TooLarge(n) if n == 1 << 20), "{e}");
    assert_eq!(e.status(), 422);
    assert!(s.load(&rel("huge.jpg")).await.is_err());
    assert_eq!(origin.hits(), 2, "a refused original is not cached");
    // larder stopped reading at once: far less than the body was taken from the origin.
    let taken = produced.load(Ordering::SeqCst);
    assert!(taken < 50 << 20, "{taken} bytes produced");
}

#[tokio::test]
async fn a_chunked_body_growing_past_the_limit_is_cut_off_and_not_cached() {
    let produced = Arc::new(AtomicU64::new(0));
    let p = Arc::clone(&produced);
    let origin = Origin::start(move |_, _| {
        Reply::generated(200 << 20, false, &p).header("cache-control", "max-age=600")
    })
    .await;
    let (s, _) = sources(&origin.url(), |c| c.max_source_size.0 = 1 << 20).await;
    let e = s.load(&rel("huge.jpg")).await.unwrap_err();
    assert!(matches!(e, SourceError::TooLarge(_)), "{e}");
    assert!(s.load(&rel("huge.jpg")).await.is_err());
    assert_eq!(origin.hits(), 2, "a refused original is not cached");
    let taken = produced.load(Ordering::SeqCst);
    assert!(taken < 50 << 20, "{taken} bytes produced");
}

#[tokio::test]
async fn origin_errors_are_not_found_or_failed_and_never_cached() {
    let origin = Origin::start(|seen, _| {
        let status = if seen.path.starts_with("/missing") {
            404
        } else {
            500
        };
        Reply::ok("error page")
            .status(status)
            .header("cache-control", "max-age=600")
    })
    .await;
    let (s, _) = sources(&origin.url(), |_| {}).await;
    for _ in 0..2 {
        let e = s.load(&rel("missing.jpg")).await.unwrap_err();
        assert!(matches!(e, SourceError::NotFound), "{e}");
        assert_eq!(e.status(), 404);
        let e = s.load(&rel("broken.jpg")).await.unwrap_err();
        assert!(matches!(e, SourceError::Failed(_)), "{e}");
        assert_eq!(e.status(), 502);
    }
    assert_eq!(origin.hits(), 4, "no error is cached as an original");
}

#[tokio::test]
async fn a_stale_original_stands_in_for_a_failing_origin_within_stale_if_error() {
    let clock = Clock::adjustable();
    let origin = Origin::start_at(&clock, |_, n| match n {
        0 => Reply::ok("the original bytes")
            .header("cache-control", "max-age=60, stale-if-error=300")
            .header("etag", "\"v1\""),
        2 => Reply::ok("not found").status(404),
        _ => Reply::ok("error page").status(503),
    })
    .await;
    let (s, clock) = sources_at(clock, &origin.url(), |_| {}).await;
    let first = s.load(&rel("photo.jpg")).await.unwrap();
    // Stale, and the origin fails: the stale copy, within its stale-if-error.
    clock.advance(Duration::from_secs(120));
    let stood_in = s.load(&rel("photo.jpg")).await.unwrap();
    assert_eq!(origin.hits(), 2, "the origin was asked");
    assert_eq!(&stood_in.data[..], b"the original bytes");
    assert_eq!(stood_in.id, first.id);
    // A 404 is an answer, not a failure: the original is gone.
    let e = s.load(&rel("photo.jpg")).await.unwrap_err();
    assert!(matches!(e, SourceError::NotFound), "{e}");
    // Past stale-if-error (60 s fresh, 300 s more), a failure is a failure.
    clock.advance(Duration::from_secs(250));
    let e = s.load(&rel("photo.jpg")).await.unwrap_err();
    assert!(matches!(e, SourceError::Failed(_)), "{e}");
    assert_eq!(origin.hits(), 4);
}

#[tokio::test]
async fn the_source_timeout_ends_a_slow_fetch() {
    let origin = Origin::start(|_, _| Reply::ok("late").delay(Duration::from_secs(5))).await;
    let (s, _) = sources(&origin.url(), |c| {
        c.source_timeout.0 = Duration::from_millis(200)
    })
    .await;
    let e = s.load(&rel("slow.jpg")).await.unwrap_err();
    assert!(matches!(e, SourceError::Failed(_)), "{e}");
}

#[tokio::test]
async fn absolute_sources_only_from_the_allowlist_compared_parsed() {
    let origin = Origin::start(|_, _| Reply::ok("ok").header("cache-control", "max-age=60")).await;
    let base = origin.url();
    let port = origin.addr.port();
    let allowed = format!("{base}/ok/");
    let (s, _) = sources("http://127.0.0.1:9/", |c| c.allow_sources = vec![allowed]).await;
    let abs = |u: String| SourceRef::Absolute(u);
    let o = s.load(&abs(format!("{base}/ok/a.jpg"))).await.unwrap();
    assert_eq!(&o.data[..], b"ok");
    assert_eq!(origin.seen()[0].path, "/ok/a.jpg");
    for refused in [
        format!("{base}/other/a.jpg"),
        format!("{base}/ok/../secret.jpg"),
        format!("{base}/ok/%2e%2e/secret.jpg"),
        format!("http://127.0.0.1.evil.net:{port}/ok/a.jpg"),
        format!("http://127.0.0.1:{port}@evil.net/ok/a.jpg"),
        format!("https://127.0.0.1:{port}/ok/a.jpg"),
        "not a url".into(),
    ] {
        let e = s.load(&abs(refused.clone())).await.unwrap_err();
        assert!(matches!(e, SourceError::NotAllowed(_)), "{refused}: {e}");
        assert_eq!(e.status(), 403);
    }
    assert_eq!(origin.hits(), 1);
    // No allowlist: no absolute source at all.
    let (none, _) = sources(&base, |_| {}).await;
    let e = none
        .load(&abs(format!("{base}/ok/a.jpg")))
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::NotAllowed(_)), "{e}");
    assert_eq!(origin.hits(), 1);
}

#[tokio::test]
async fn relative_paths_cannot_leave_the_origin() {
    let origin = Origin::start(|_, _| Reply::ok("img").header("cache-control", "max-age=60")).await;
    let (s, _) = sources(&format!("{}/base/", origin.url()), |_| {}).await;
    for p in ["//evil.com/x.jpg", "http://evil.com/x.jpg", "a b/é.jpg"] {
        s.load(&rel(p)).await.unwrap();
    }
    let paths: Vec<String> = origin.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(
        paths,
        [
            "/base/evil.com/x.jpg",
            "/base/http:/evil.com/x.jpg",
            "/base/a%20b/%C3%A9.jpg"
        ]
    );
    for p in ["../x.jpg", "a/../../x.jpg"] {
        let e = s.load(&rel(p)).await.unwrap_err();
        assert!(matches!(e, SourceError::NotAllowed(_)), "{p}: {e}");
    }
    assert_eq!(origin.hits(), 3);
    assert!(origin
        .seen()
        .iter()
        .all(|s| s.headers["host"] == origin.addr.to_string()));
}

#[tokio::test]
async fn root_sources_cannot_escape_and_their_id_follows_the_file() {
    let top = tempfile::tempdir().unwrap();
    let root = top.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/a.jpg"), b"inside").unwrap();
    std::fs::write(top.path().join("secret.jpg"), b"outside").unwrap();
    std::os::unix::fs::symlink(top.path().join("secret.jpg"), root.join("link.jpg")).unwrap();
    std::os::unix::fs::symlink(root.join("sub/a.jpg"), root.join("inner.jpg")).unwrap();
    let (s, clock) = sources("", |c| {
        c.origin = None;
        c.root = Some(root.clone());
    })
    .await;
    let a = s.load(&rel("sub/a.jpg")).await.unwrap();
    assert_eq!(&a.data[..], b"inside");
    let local = s
        .load(&SourceRef::Local("/sub/a.jpg".into()))
        .await
        .unwrap();
    assert_eq!(local.id, a.id);
    // A symlink within the root is followed; one pointing out of it is not.
    assert_eq!(
        &s.load(&rel("inner.jpg")).await.unwrap().data[..],
        b"inside"
    );
    for p in [
        "link.jpg",
        "../secret.jpg",
        "sub/../../secret.jpg",
        "nope.jpg",
        "sub",
    ] {
        let e = s.load(&rel(p)).await.unwrap_err();
        assert!(matches!(e, SourceError::NotFound), "{p}: {e}");
    }
    std::fs::write(root.join("sub/a.jpg"), b"inside, changed").unwrap();
    // Kept for ROOT_VALID (nginx's open_file_cache_valid), then looked at again.
    let kept = s.load(&rel("sub/a.jpg")).await.unwrap();
    assert_eq!(kept.id, a.id, "within ROOT_VALID, not read again");
    clock.advance(larder::images::source::ROOT_VALID);
    let b = s.load(&rel("sub/a.jpg")).await.unwrap();
    assert_ne!(a.id, b.id, "a changed file makes new result keys");
    assert_eq!(&b.data[..], b"inside, changed");
}

/// An image route with only `origin` takes no uploads, and says why.
#[tokio::test]
async fn a_route_without_dir_refuses_uploads_clearly() {
    let l = Larder::start(&one_route("", "images", "origin = \"http://127.0.0.1:9\"")).await;
    let got = common::send(
        &common::client(),
        "POST",
        &l.url("/upload"),
        &[("content-type", "image/png")],
        common::photo(),
    )
    .await;
    assert_eq!(got.status, 404);
    let text = String::from_utf8_lossy(&got.body);
    assert!(
        text.contains("no uploads") && text.contains("`dir`"),
        "{text}"
    );
}

/// The quick start's check, end to end: `--image-origin` serves imgproxy's and thumbor's URLs
/// from the origin, the original fetched once however many variants are asked.
#[tokio::test]
async fn the_quick_start_serves_originals_from_the_origin() {
    let photo = common::photo();
    let body = photo.clone();
    let origin = Origin::start(move |_, _| {
        Reply::ok(body.clone())
            .header("content-type", "image/jpeg")
            .header("cache-control", "max-age=3600")
    })
    .await;
    use clap::Parser;
    let url = origin.url();
    let cli = larder::cli::Cli::try_parse_from([
        "larder",
        "--image-origin",
        &url,
        "--listen",
        "127.0.0.1:0",
    ])
    .unwrap();
    let l = Larder::from_config(cli.config().unwrap().0).await;
    let _ = &photo;
    for (path, mime) in [
        ("/insecure/plain/photo.jpg", "image/jpeg"),
        ("/insecure/rs:fit:100:100/plain/photo.jpg", "image/jpeg"),
        (
            "/insecure/rs:fill:100:100/g:sm/plain/photo.jpg@webp",
            "image/webp",
        ),
        ("/unsafe/100x100/smart/photo.jpg", "image/jpeg"),
        ("/insecure/rs:fit:100:100/plain/photo.jpg", "image/jpeg"),
    ] {
        let got = common::send(&common::client(), "GET", &l.url(path), &[], b"").await;
        assert_eq!(got.status, 200, "{path}");
        assert_eq!(got.header("content-type"), Some(mime), "{path}");
    }
    assert_eq!(origin.hits(), 1);
    assert_eq!(origin.seen()[0].path, "/photo.jpg");
}
