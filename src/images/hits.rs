//! The results a route has served, by the request that asked for them: the next request for
//! a cached result is answered from its own bytes (path with query, and the formats its Accept
//! lists of those larder negotiates), without parsing the URL, checking its signature, loading its original or
//! making its key again.
//!
//! An entry stands for what was verified when the result was served (signature, expiry,
//! options, source allowed, original loaded), so it holds only while that still does:
//! - the route's configuration: the index is the route's, and a reload builds new routes (a
//!   new key, salt, preset or limit starts with an empty index);
//! - the URL's expiry (imgproxy's `exp`), kept as `until`;
//! - the original: the memory copy it was loaded from must still be stored and fresh
//!   ([`Sources::still_holds`]): a changed `root` file after `ROOT_VALID`, a fetched original
//!   past its freshness, a purged one sends the request the whole way again;
//! - the result: looked up in the cache on every request (a purge or eviction is seen).
//!
//! zimg's results are named by their upload's MD5: they have no original to check (a DELETE
//! purges them). Bounded in bytes ([`CAPACITY`] a route, the least used forgotten first).

use std::sync::Arc;
use std::time::SystemTime;

use crate::access_log::ImageServed;
use crate::cache::CacheKey;

use super::params::Accepted;
use super::source::{Held, Sources};

/// Bytes of requests and keys an image route keeps (about 40,000 requests of imgproxy URLs).
pub const CAPACITY: u64 = 8 << 20;

/// What a request asks for: its path with query, and the formats its Accept lists.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Asked {
    accept: Accepted,
    path: Box<str>,
}

/// [`Asked`] borrowed from a request (hashed alike: its fields are hashed in the same order).
#[derive(Hash)]
struct AskedRef<'a> {
    accept: Accepted,
    path: &'a str,
}

impl quick_cache::Equivalent<Asked> for AskedRef<'_> {
    fn equivalent(&self, k: &Asked) -> bool {
        self.accept == k.accept && self.path == &*k.path
    }
}

/// The result a request was found to ask for, and what must still hold for it to be served.
#[derive(Debug)]
pub struct Known {
    /// The result's cache key.
    pub result: CacheKey,
    /// The original's memory copy (None: zimg's, named by its MD5).
    pub held: Option<Held>,
    /// The URL expires after this (imgproxy's `exp`).
    pub until: Option<SystemTime>,
    /// What the access log says of it.
    pub served: ImageServed,
}

impl Known {
    /// Whether the request may still be answered from the index at `now`.
    pub fn holds(&self, sources: &Sources, now: SystemTime) -> bool {
        self.until.is_none_or(|u| now < u)
            && (self.held.as_ref()).is_none_or(|h| sources.still_holds(h, now))
    }

    fn weight(&self) -> u64 {
        (self.result.as_str().len() + self.served.presets.len() + size_of::<Known>()) as u64
    }
}

#[derive(Clone)]
struct ByBytes;

impl quick_cache::Weighter<Asked, Arc<Known>> for ByBytes {
    fn weight(&self, k: &Asked, v: &Arc<Known>) -> u64 {
        (k.path.len() + size_of::<Asked>()) as u64 + v.weight()
    }
}

/// A route's index of the requests it answered with a cached result.
pub struct Hits {
    known: quick_cache::sync::Cache<Asked, Arc<Known>, ByBytes>,
}

impl Default for Hits {
    fn default() -> Hits {
        Hits {
            known: quick_cache::sync::Cache::with_weighter(
                (CAPACITY / 256) as usize,
                CAPACITY,
                ByBytes,
            ),
        }
    }
}

impl Hits {
    /// What the request for `path` (with its query) accepting `accept` was found to ask.
    pub fn get(&self, path: &str, accept: Accepted) -> Option<Arc<Known>> {
        self.known.get(&AskedRef { accept, path })
    }

    /// Remembers that the request for `path` accepting `accept` asks for `known`.
    pub fn learn(&self, path: &str, accept: Accepted, known: Known) {
        let asked = Asked {
            accept,
            path: path.into(),
        };
        self.known.insert(asked, Arc::new(known));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(result: &str) -> Known {
        Known {
            result: CacheKey::from_string(result.into()),
            held: None,
            until: None,
            served: ImageServed {
                grammar: "zimg",
                presets: Box::from(""),
            },
        }
    }

    #[test]
    fn found_by_path_and_accepted_formats() {
        let accept = |v: &'static str| {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::ACCEPT, http::HeaderValue::from_static(v));
            Accepted::of(&h, false)
        };
        let none = Accepted::default();
        let hits = Hits::default();
        hits.learn("/a?w=1", none, known("img://a"));
        hits.learn("/a?w=1", accept("image/webp"), known("img://b"));
        hits.learn("/a?w=1", accept("image/avif"), known("img://c"));
        let got = |p, a| hits.get(p, a).map(|k| k.result.as_str().to_string());
        assert_eq!(got("/a?w=1", none).as_deref(), Some("img://a"));
        assert_eq!(
            got("/a?w=1", accept("image/webp")).as_deref(),
            Some("img://b")
        );
        assert_eq!(
            got("/a?w=1", accept("image/avif")).as_deref(),
            Some("img://c")
        );
        // An animation's negotiated AVIF is WebP where that is listed too: not the same answer.
        assert_eq!(got("/a?w=1", accept("image/avif,image/webp")), None);
        assert_eq!(got("/a?w=2", none), None);
    }

    #[test]
    fn bounded_in_bytes() {
        let hits = Hits::default();
        let long = "x".repeat(4096);
        for i in 0..(2 * CAPACITY / 4096) {
            hits.learn(
                &format!("/{i}{long}"),
                Accepted::default(),
                known("img://a"),
            );
        }
        assert!(hits.known.weight() <= CAPACITY, "{}", hits.known.weight());
        assert!(hits.known.len() < (CAPACITY / 4096) as usize);
    }
}
