//! Invariants of every parser of untrusted input, shared by the libFuzzer targets in `fuzz/`
//! (nightly, `cargo fuzz run NAME`) and by the bounded smoke run in `tests/fuzz_smoke.rs`.
//! Each function must never panic, and asserts what its parser guarantees.
#![allow(dead_code)]

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Cache-Control and the request directives built from it.
pub fn cache_control(data: &[u8]) {
    let Ok(v) = HeaderValue::from_bytes(data) else {
        return;
    };
    let mut h = HeaderMap::new();
    h.insert(http::header::CACHE_CONTROL, v.clone());
    h.insert(http::header::PRAGMA, v);
    let cc = larder::cache::policy::CacheControl::from_headers(&h, &http::header::CACHE_CONTROL);
    if let Some(m) = cc.max_age {
        assert!(m <= 2_147_483_648);
    }
    let _ = larder::cache::policy::RequestDirectives::from_headers(&h);
}

/// Accept-Encoding negotiation always yields one of the offered codings or identity.
pub fn accept_encoding(data: &[u8]) {
    use larder::compress::{AcceptEncoding, Encoding};
    let Ok(v) = HeaderValue::from_bytes(data) else {
        return;
    };
    let ae = AcceptEncoding::parse(Some(&v));
    let offered = [Encoding::Br, Encoding::Gzip];
    let chosen = ae.choose(&offered);
    assert!(offered.contains(&chosen) || chosen == Encoding::Identity);
}

/// Range parsing: every range returned lies inside the representation.
pub fn range(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let len = u64::from_le_bytes(data[..8].try_into().unwrap()) % (1 << 40);
    match larder::range::parse(&data[8..], len) {
        larder::range::Decision::Partial(ranges) => {
            assert!(!ranges.is_empty() && ranges.len() <= larder::range::MAX_RANGES);
            for r in ranges {
                assert!(r.first <= r.last && r.last < len, "{r:?} of {len}");
            }
        }
        larder::range::Decision::Full | larder::range::Decision::Unsatisfiable => {}
    }
}

/// A static path either is refused or yields plain segments that cannot climb out of the root.
pub fn static_path(data: &[u8]) {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(segments) = larder::static_files::safe_segments(path, false) {
        for s in segments {
            assert!(s != ".." && s != "." && !s.is_empty(), "{path:?} -> {s:?}");
            assert!(!s.contains(['/', '\\', '\0']), "{path:?} -> {s:?}");
            assert!(!s.starts_with('.'), "dotfile {path:?}");
        }
    }
}

/// Image URL parameters: parse and normalize without panicking; the key is order-independent.
pub fn image_params(data: &[u8]) {
    let Ok(q) = std::str::from_utf8(data) else {
        return;
    };
    let _ = larder::images::params::Params::parse(q);
    let mut parts: Vec<&str> = q.split('&').collect();
    parts.reverse();
    let reversed = parts.join("&");
    if let (Ok(a), Ok(b)) = (
        larder::images::params::Params::parse(q),
        larder::images::params::Params::parse(&reversed),
    ) {
        // Duplicated keys may legitimately resolve differently in reverse order.
        let keys: Vec<&str> = q
            .split('&')
            .map(|kv| kv.split('=').next().unwrap_or(""))
            .collect();
        let unique = keys.iter().collect::<std::collections::HashSet<_>>().len() == keys.len();
        if unique {
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{q:?}");
        }
    }
}

/// Image sniffing reads headers only and never panics on any bytes; nor does reading the
/// embedded colour profile, whatever format the bytes are taken for.
pub fn image_sniff(data: &[u8]) {
    use larder::images::sniff::ImageFormat;
    let _ = larder::images::sniff::format(data);
    let _ = larder::images::sniff::probe(data);
    let _ = larder::images::sniff::avif_header(data);
    let _ = larder::images::sniff::boxes_fit(data);
    for f in [
        ImageFormat::Jpeg,
        ImageFormat::Png,
        ImageFormat::Webp,
        ImageFormat::Avif,
        ImageFormat::Jxl,
        ImageFormat::Heic,
    ] {
        let _ = larder::images::colour::embedded(data, f);
    }
}

/// Configuration text never panics the loader.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = larder::config::Config::parse(text, "fuzz");
}

/// Vary normalization never panics and is deterministic.
pub fn vary(data: &[u8]) {
    let Ok(v) = HeaderValue::from_bytes(data) else {
        return;
    };
    let mut resp = HeaderMap::new();
    resp.insert(http::header::VARY, v.clone());
    if let Some(names) = larder::cache::vary::selecting_names(&resp) {
        let mut req = HeaderMap::new();
        for n in names.iter() {
            req.append(n.clone(), v.clone());
        }
        let a = larder::cache::vary::VaryKey::of(&names, &req);
        let b = larder::cache::vary::VaryKey::of(&names, &req);
        assert_eq!(a, b);
    }
    let _ = HeaderName::from_bytes(data);
}

/// An entry record, as a disk or shared tier reads it back: decoding never panics, and what
/// decodes is a whole entry: it writes a record that reads back to the same record, and it
/// can be served.
pub fn entry_record(data: &[u8]) {
    use larder::cache::Entry;
    // The checksum made right, so that the input reaches the checks behind it.
    let mut data = data.to_vec();
    larder::cache::record::set_checksum(&mut data);
    let Ok(entry) = Entry::decode(data.into()) else {
        return;
    };
    let record = entry.encode().expect("a decoded entry encodes");
    let again = Entry::decode(record.clone()).expect("a written record decodes");
    assert_eq!(again.encode().expect("encodes"), record);
    let _ = entry.freshness.current_age(std::time::SystemTime::now());
    let mut request = HeaderMap::new();
    request.insert(
        http::header::ACCEPT_ENCODING,
        HeaderValue::from_static("gzip"),
    );
    request.insert(http::header::RANGE, HeaderValue::from_static("bytes=1-"));
    let _ = larder::deliver::from_entry(
        &entry,
        &http::Method::GET,
        &request,
        larder::deliver::CacheStatus::Hit,
        &HeaderName::from_static("x-cache"),
        std::time::SystemTime::now(),
    );
}

/// A named check.
pub type Check = (&'static str, fn(&[u8]));

/// All checks by name, for the smoke run.
/// Push filters and id patterns (from URLs and WebSocket messages): a parse either fails or
/// yields a filter whose canonical text parses to the same canonical text, and evaluation
/// never panics; an accepted id is one the pattern syntax accepts too.
pub fn push_filter(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(f) = larder::push::filter::Filter::parse(text) {
        let canon = f.canonical();
        let again = larder::push::filter::Filter::parse(&canon).expect("canonical text parses");
        assert_eq!(again.canonical(), canon);
        let v = serde_json::json!({"a": 1, "b": {"c": [1, "x"]}, "price": 9.5});
        let _ = f.eval("cars/1", &v);
    }
    if larder::config::push::valid_id(text) {
        let p = larder::config::IdPattern::parse(text).expect("an id is a pattern");
        assert!(p.matches(text));
    }
}

/// imgproxy's and thumbor's URLs (the path after an image route's prefix): a parse either
/// fails with a 400/403 or yields options whose cache key is stable, and whose geometry on a
/// 640x856 source either fails or stays inside the limits, its crop inside the source.
pub fn image_proxy_url(data: &[u8]) {
    use larder::config::image_options::OptionList;
    use larder::config::{ImgproxyConfig, ThumborConfig};
    use larder::images::{imgproxy, pipeline, raster::Limits, thumbor};
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let mut cfg = ImgproxyConfig::default();
    cfg.presets.insert(
        "thumb".into(),
        OptionList::parse("rs:fill:100:100/q:80").unwrap(),
    );
    let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
    let parsed = [
        imgproxy::parse(path, &cfg, now),
        thumbor::parse(path, &ThumborConfig::default()),
    ];
    let limits = Limits {
        max_upscale: 2.0,
        ..Limits::DEFAULT
    };
    for p in parsed.into_iter().flatten() {
        assert_eq!(p.options.key(), p.options.clone().key());
        if let Ok(g) = pipeline::geometry(640, 856, &p.options, &limits) {
            assert!(
                g.out.0 <= limits.max_dim && g.out.1 <= limits.max_dim,
                "{g:?}"
            );
            assert!(g.out.0 >= 1 && g.out.1 >= 1, "{g:?}");
            let plan = g.plan();
            let (x, y, w, h) = plan.crop;
            assert!(
                x >= -0.5 && y >= -0.5 && w > 0.0 && h > 0.0,
                "{g:?} {plan:?}"
            );
            assert!(x + w <= 640.5 && y + h <= 856.5, "{g:?} {plan:?}");
        }
    }
}

pub const ALL: [Check; 11] = [
    ("cache_control", cache_control),
    ("accept_encoding", accept_encoding),
    ("range", range),
    ("static_path", static_path),
    ("image_params", image_params),
    ("image_sniff", image_sniff),
    ("config", config),
    ("vary", vary),
    ("entry_record", entry_record),
    ("push_filter", push_filter),
    ("image_proxy_url", image_proxy_url),
];
