//! The cache: a byte-bounded, scan-resistant in-memory store of [`Entry`]s, plus the in-flight
//! fills that coalesce misses (keyed by [`FillKey`]: a URL, or one variant of a URL that varies).
//!
//! Storage is `quick_cache` (S3-FIFO-like Clock-PRO, weighted by bytes; see docs/design.md for
//! why). Values are `Arc<Entry>`, so a hit is a hash lookup and a refcount increment. An entry is
//! never mutated; an update (compressed variants arriving, a revalidation) stores a new entry.

pub mod coalesce;
pub mod entry;
pub mod pending;
pub mod policy;
pub mod vary;

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName};
use quick_cache::sync::Cache as QuickCache;
use quick_cache::Weighter;

pub use coalesce::{FillOutcome, Inflight, Join};
pub use entry::Entry;
pub use pending::Pending;
pub use vary::Selection;
use vary::VaryKey;

use crate::compress::{Compressor, Encoding};
use crate::config::{CacheConfig, CompressionConfig};

/// The primary cache key: scheme, host (lowercase, without default port) and path with query.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey(Box<str>);

impl CacheKey {
    pub fn from_parts(scheme: &str, host: &str, path_and_query: &str) -> CacheKey {
        let mut s = String::with_capacity(scheme.len() + host.len() + path_and_query.len() + 3);
        s.push_str(scheme);
        s.push_str("://");
        for c in host.chars() {
            s.push(c.to_ascii_lowercase());
        }
        s.push_str(path_and_query);
        CacheKey(s.into_boxed_str())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What one fill produces, the key concurrent misses coalesce on: the response for a URL, or, once
/// the URL is known to vary on request fields (§4.1), the variant a request's values select (so
/// requests for different variants do not wait on each other's fills).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FillKey {
    url: CacheKey,
    variant: Option<VaryKey>,
}

impl FillKey {
    /// The fill of one variant of `url`.
    pub fn variant(url: CacheKey, variant: VaryKey) -> FillKey {
        FillKey {
            url,
            variant: Some(variant),
        }
    }
}

impl From<CacheKey> for FillKey {
    /// The fill of a URL whose response does not vary (or is not known yet).
    fn from(url: CacheKey) -> FillKey {
        FillKey { url, variant: None }
    }
}

/// What the store holds under one primary key: a response, or the variants of a response that
/// varies on request fields (§4.1), each stored whole.
#[derive(Clone)]
enum Slot {
    One(Arc<Entry>),
    Varied(Arc<Varied>),
}

struct Varied {
    names: Box<[HeaderName]>,
    variants: Vec<(VaryKey, Arc<Entry>)>,
    weight: u64,
}

/// Variants kept per URL at most; the oldest goes first (bounds memory a client can cause by
/// sending many distinct values of a selecting field).
const MAX_VARIANTS: usize = 32;

#[derive(Clone)]
struct ByBytes;

impl Weighter<CacheKey, Slot> for ByBytes {
    fn weight(&self, key: &CacheKey, val: &Slot) -> u64 {
        key.0.len() as u64
            + match val {
                Slot::One(e) => e.weight,
                Slot::Varied(v) => v.weight,
            }
    }
}

/// The shared response store.
pub struct Store {
    entries: QuickCache<CacheKey, Slot, ByBytes>,
    pub inflight: Arc<Inflight<FillKey>>,
    pub max_object_size: u64,
}

impl Store {
    pub fn new(cfg: &CacheConfig) -> Store {
        let capacity = cfg.max_size.0.max(1);
        // quick_cache wants an estimate of the item count; assume ~16 KiB per entry.
        let estimated = (capacity / (16 * 1024)).clamp(64, 1 << 22) as usize;
        // It splits the capacity into shards (4 per core by default) and admits nothing above
        // 97% of a shard: fewer shards where one would not hold a `max_object_size` response
        // with its head (90% of a shard, a power of two of them).
        let per_core = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64 * 4;
        let fit = (capacity / 10 * 9 / cfg.max_object_size.0.max(1)).clamp(1, per_core);
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(estimated)
            .weight_capacity(capacity)
            .shards(1 << fit.ilog2())
            .build()
            .expect("capacity and shard count are set");
        Store {
            entries: QuickCache::with_options(
                options,
                ByBytes,
                Default::default(),
                Default::default(),
            ),
            inflight: Arc::new(Inflight::default()),
            max_object_size: cfg.max_object_size.0,
        }
    }

    /// The entry stored under `key`, if it does not vary on request fields.
    #[inline]
    pub fn get(&self, key: &CacheKey) -> Option<Arc<Entry>> {
        match self.entries.get(key)? {
            Slot::One(e) => Some(e),
            Slot::Varied(_) => None,
        }
    }

    /// The stored response matching a request: the entry under `key`, or the variant whose
    /// selecting fields match the request's (§4.1).
    #[inline]
    pub fn lookup(&self, key: &CacheKey, request: &HeaderMap) -> Option<Arc<Entry>> {
        match self.entries.get(key)? {
            Slot::One(e) => Some(e),
            Slot::Varied(v) => {
                let want = VaryKey::of(&v.names, request);
                v.variants
                    .iter()
                    .find(|(k, _)| *k == want)
                    .map(|(_, e)| Arc::clone(e))
            }
        }
    }

    /// Stores an entry that does not vary.
    pub fn insert(&self, key: CacheKey, entry: Arc<Entry>) {
        self.entries.insert(key, Slot::One(entry));
    }

    /// Stores a response under `key`: as its one entry, or, if the response varies, as the variant
    /// its [`Selection`](vary::Selection) names (replacing the variants of an older Vary).
    pub fn store(&self, key: CacheKey, entry: Arc<Entry>) {
        let selection = &entry.selection;
        if !selection.varies() {
            self.insert(key, entry);
            return;
        }
        let (names, vkey) = (selection.names(), selection.key().clone());
        let mut variants = match self.entries.peek(&key) {
            Some(Slot::Varied(v)) if *v.names == *names => v
                .variants
                .iter()
                .filter(|(k, _)| *k != vkey)
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        if variants.len() >= MAX_VARIANTS {
            variants.remove(0);
        }
        let names = names.into();
        variants.push((vkey, entry));
        self.put_varied(key, names, variants);
    }

    /// The fill a miss for `request` joins: the URL's, or, when the URL is stored as varying,
    /// the fill of the variant the request selects.
    pub fn fill_key(&self, key: &CacheKey, request: &HeaderMap) -> FillKey {
        match self.entries.peek(key) {
            Some(Slot::Varied(v)) => FillKey::variant(key.clone(), VaryKey::of(&v.names, request)),
            _ => FillKey::from(key.clone()),
        }
    }

    fn put_varied(
        &self,
        key: CacheKey,
        names: Box<[HeaderName]>,
        variants: Vec<(VaryKey, Arc<Entry>)>,
    ) {
        let weight = variants.iter().map(|(_, e)| e.weight + 64).sum();
        self.entries.insert(
            key,
            Slot::Varied(Arc::new(Varied {
                names,
                variants,
                weight,
            })),
        );
    }

    /// Replaces `old` by `new` if `old` is still stored under `key` (a newer fill wins).
    pub fn upgrade(&self, key: &CacheKey, old: &Arc<Entry>, new: Arc<Entry>) -> bool {
        match self.entries.peek(key) {
            Some(Slot::One(cur)) if Arc::ptr_eq(&cur, old) => {
                let _ = self.entries.replace(key.clone(), Slot::One(new), true);
                true
            }
            Some(Slot::Varied(v)) if v.variants.iter().any(|(_, e)| Arc::ptr_eq(e, old)) => {
                let variants = v
                    .variants
                    .iter()
                    .map(|(k, e)| {
                        let e = if Arc::ptr_eq(e, old) {
                            Arc::clone(&new)
                        } else {
                            Arc::clone(e)
                        };
                        (k.clone(), e)
                    })
                    .collect();
                self.put_varied(key.clone(), v.names.clone(), variants);
                true
            }
            _ => false,
        }
    }

    /// Removes everything stored under `key` (every variant).
    pub fn remove(&self, key: &CacheKey) -> bool {
        self.entries.remove(key).is_some()
    }

    /// Removes every URL for which `doomed` is true of its key or of any of its entries; returns
    /// how many URLs were removed. Runs shard by shard, so lookups are never blocked for long.
    pub fn purge_where(&self, doomed: impl Fn(&CacheKey, &Entry) -> bool) -> usize {
        let removed = std::sync::atomic::AtomicUsize::new(0);
        self.entries.retain(|k, slot| {
            let kill = match slot {
                Slot::One(e) => doomed(k, e),
                Slot::Varied(v) => v.variants.iter().any(|(_, e)| doomed(k, e)),
            };
            if kill {
                removed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            !kill
        });
        removed.into_inner()
    }

    /// Removes every URL whose key starts with `prefix` (an image's purge, purge by prefix);
    /// returns how many were removed.
    pub fn remove_prefix(&self, prefix: &str) -> usize {
        self.purge_where(|k, _| k.0.starts_with(prefix))
    }

    /// Bytes held now.
    pub fn weight(&self) -> u64 {
        self.entries.weight()
    }

    /// Byte bound.
    pub fn capacity(&self) -> u64 {
        self.entries.capacity()
    }

    /// URLs stored now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Everything the caching handlers share: the store, the compressor and the cache settings.
pub struct Cache {
    pub store: Store,
    pub compressor: Compressor,
    pub cfg: CacheConfig,
}

impl Cache {
    pub fn new(cfg: CacheConfig, compression: CompressionConfig) -> Arc<Cache> {
        Arc::new(Cache {
            store: Store::new(&cfg),
            compressor: Compressor::new(compression),
            cfg,
        })
    }

    /// Computes the compressed variants of a just-stored entry in the background, fastest
    /// first, and publishes each as soon as it is ready: the stored entry is replaced by one
    /// that also holds it (unless a newer fill or a purge replaced it meanwhile, which stops the
    /// work). The last entry published carries no [`Pending`].
    pub fn spawn_variants(self: &Arc<Self>, key: CacheKey, entry: Arc<Entry>) {
        let cache = Arc::clone(self);
        tokio::spawn(async move {
            let _finish = pending::Finish(entry.pending.clone());
            let Some(identity) = entry.variant(Encoding::Identity).map(|v| v.body.clone()) else {
                return;
            };
            let store = Arc::clone(&cache);
            let pending = entry.pending.clone();
            let started = {
                let pending = pending.clone();
                move || {
                    if let Some(p) = pending {
                        p.start();
                    }
                }
            };
            let last = *Compressor::BUILD_ORDER.last().expect("codings");
            let mut current = entry;
            let publish = move |enc: Encoding, body: Option<Bytes>| -> bool {
                let mut bodies = current.bodies();
                let added = match body {
                    Some(b) if !current.has_encoding(enc) => {
                        bodies.push((enc, b));
                        true
                    }
                    _ => false,
                };
                if added || (enc == last && current.pending.is_some()) {
                    let mut next = current.with_bodies(bodies);
                    if enc == last {
                        next.pending = None;
                    }
                    let next = Arc::new(next);
                    if !store.store.upgrade(&key, &current, Arc::clone(&next)) {
                        return false;
                    }
                    current = next;
                }
                if let Some(p) = &pending {
                    p.tried(enc, added.then_some(&current));
                }
                true
            };
            cache
                .compressor
                .encode_each(identity, started, publish)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::Encoding;
    use crate::config::ByteSize;
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    #[test]
    fn key_lowercases_host_only() {
        let k = CacheKey::from_parts("http", "Example.COM", "/A?b=C");
        assert_eq!(k.as_str(), "http://example.com/A?b=C");
    }

    /// quick_cache splits `max_size` into 4 shards per core and admits nothing above 97% of a
    /// shard: with the embedded default's 64 MiB on 2 cores (8 MiB shards), a 15 MiB response
    /// under the 16 MiB `max_object_size` was never stored, though `check` accepted both.
    #[test]
    fn regression_objects_up_to_max_object_size_are_stored() {
        let cfg = CacheConfig {
            max_size: ByteSize(64 << 20),
            max_object_size: ByteSize(16 << 20),
            ..CacheConfig::default()
        };
        let store = Store::new(&cfg);
        let e = Entry::build(
            StatusCode::OK,
            HeaderMap::new(),
            vec![(Encoding::Identity, Bytes::from(vec![b'x'; 15 << 20]))],
            entry::tests_support::fresh(),
            false,
        );
        let key = CacheKey::from_parts("http", "h", "/big");
        store.insert(key.clone(), Arc::new(e));
        assert!(
            store.get(&key).is_some(),
            "a 15 MiB response was not stored"
        );
    }

    #[test]
    fn misses_of_a_varying_url_coalesce_per_variant() {
        use http::HeaderValue;
        let store = Store::new(&CacheConfig::default());
        let key = CacheKey::from_parts("http", "h", "/v");
        let lang = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("accept-language", HeaderValue::from_static(v));
            h
        };
        // Nothing known yet: every miss waits on the URL's fill.
        assert_eq!(
            store.fill_key(&key, &lang("en")),
            FillKey::from(key.clone())
        );
        assert_eq!(
            store.fill_key(&key, &lang("fr")),
            FillKey::from(key.clone())
        );
        let mut headers = HeaderMap::new();
        headers.insert("vary", HeaderValue::from_static("Accept-Language"));
        let mut e = Entry::build(
            StatusCode::OK,
            headers,
            vec![(Encoding::Identity, Bytes::from_static(b"en"))],
            entry::tests_support::fresh(),
            false,
        );
        e.selection = vary::Selection::of(&e.headers, &lang("en")).unwrap();
        store.store(key.clone(), Arc::new(e));
        // Known to vary: one fill per variant.
        let (en, fr) = (
            store.fill_key(&key, &lang("EN")),
            store.fill_key(&key, &lang("fr")),
        );
        assert_ne!(en, fr);
        assert_ne!(en, FillKey::from(key.clone()));
        assert!(store.lookup(&key, &lang("en")).is_some());
        assert!(store.lookup(&key, &lang("fr")).is_none());
    }

    #[test]
    fn stays_under_byte_bound() {
        let cfg = CacheConfig {
            max_size: ByteSize(1 << 20),
            ..CacheConfig::default()
        };
        let store = Store::new(&cfg);
        for i in 0..2000 {
            let e = Entry::build(
                StatusCode::OK,
                HeaderMap::new(),
                vec![(Encoding::Identity, Bytes::from(vec![b'x'; 4096]))],
                entry::tests_support::fresh(),
                false,
            );
            store.insert(
                CacheKey::from_parts("http", "h", &format!("/{i}")),
                Arc::new(e),
            );
            assert!(store.weight() <= store.capacity());
        }
        assert!(store.len() < 2000 && store.len() > 100, "{}", store.len());
    }
}
