//! The memory tier: a byte-bounded, scan-resistant map from [`CacheKey`] to what is stored under
//! it, one entry or the variants of a response that varies (§4.1). Only the [`Cache`] façade
//! reaches it.
//!
//! Storage is `quick_cache` (S3-FIFO-like Clock-PRO, weighted by bytes; see docs/design.md for
//! why). Values are `Arc<Entry>`, so a lookup is a hash probe and a refcount increment.
//!
//! [`Cache`]: super::Cache

use std::sync::Arc;

use http::header::{HeaderMap, HeaderName};
use quick_cache::sync::Cache as QuickCache;
use quick_cache::Weighter;

use super::entry::Entry;
use super::key::{CacheKey, FillKey};
use super::vary::VaryKey;
use crate::config::CacheConfig;

/// What the store holds under one primary key: a response, or the variants of a response that
/// varies on request fields (§4.1), each stored whole.
#[derive(Clone)]
pub(super) enum Slot {
    One(Arc<Entry>),
    Varied(Arc<Varied>),
}

pub(super) struct Varied {
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
        key.as_str().len() as u64
            + match val {
                Slot::One(e) => e.weight,
                Slot::Varied(v) => v.weight,
            }
    }
}

/// Where entries memory lets go of are sent (the disk tier's `write = "evicted"`): a bounded
/// queue; when it is full, an evicted entry is simply dropped (it is a cache).
pub(super) type EvictedTx = tokio::sync::mpsc::Sender<(CacheKey, Arc<Entry>)>;

/// quick_cache's hook on evictions: hands each evicted entry (of a varied URL, its newest
/// variant) to the queue, if there is one.
#[derive(Clone, Default)]
pub(super) struct Evictions(Option<EvictedTx>);

impl quick_cache::Lifecycle<CacheKey, Slot> for Evictions {
    type RequestState = ();

    #[inline]
    fn begin_request(&self) {}

    fn on_evict(&self, _: &mut (), key: CacheKey, slot: Slot) {
        let Some(tx) = &self.0 else { return };
        let entry = match slot {
            Slot::One(e) => e,
            Slot::Varied(v) => match v.variants.last() {
                Some((_, e)) => Arc::clone(e),
                None => return,
            },
        };
        let _ = tx.try_send((key, entry));
    }
}

/// The in-memory response store.
pub(super) struct Store {
    entries: QuickCache<CacheKey, Slot, ByBytes, quick_cache::DefaultHashBuilder, Evictions>,
}

impl Store {
    pub(super) fn new(cfg: &CacheConfig) -> Store {
        Store::with_evictions(cfg, None)
    }

    /// A store that sends what it evicts to `evicted`.
    pub(super) fn with_evictions(cfg: &CacheConfig, evicted: Option<EvictedTx>) -> Store {
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
                Evictions(evicted),
            ),
        }
    }

    /// The entry stored under `key`, if it does not vary on request fields.
    #[inline]
    pub(super) fn get(&self, key: &CacheKey) -> Option<Arc<Entry>> {
        match self.entries.get(key)? {
            Slot::One(e) => Some(e),
            Slot::Varied(_) => None,
        }
    }

    /// The stored response matching a request: the entry under `key`, or the variant whose
    /// selecting fields match the request's (§4.1).
    #[inline]
    pub(super) fn lookup(&self, key: &CacheKey, request: &HeaderMap) -> Option<Arc<Entry>> {
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

    /// Stores a response under `key`: as its one entry, or, if the response varies, as the variant
    /// its [`Selection`](super::Selection) names (replacing the variants of an older Vary).
    pub(super) fn store(&self, key: CacheKey, entry: Arc<Entry>) {
        let selection = &entry.selection;
        if !selection.varies() {
            self.entries.insert(key, Slot::One(entry));
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
    pub(super) fn fill_key(&self, key: &CacheKey, request: &HeaderMap) -> FillKey {
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
    pub(super) fn upgrade(&self, key: &CacheKey, old: &Arc<Entry>, new: Arc<Entry>) -> bool {
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
    pub(super) fn remove(&self, key: &CacheKey) -> bool {
        self.entries.remove(key).is_some()
    }

    /// Removes every URL for which `doomed` is true of its key or of any of its entries; returns
    /// how many URLs were removed. Runs shard by shard, so lookups are never blocked for long.
    pub(super) fn purge_where(&self, doomed: impl Fn(&CacheKey, &Entry) -> bool) -> usize {
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

    /// The URLs whose key starts with `prefix` (at most `limit`), each with its entries (one,
    /// or one per stored variant).
    pub(super) fn entries_under(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Vec<(CacheKey, Vec<Arc<Entry>>)> {
        let mut out = Vec::new();
        for (k, slot) in self.entries.iter() {
            if out.len() >= limit {
                break;
            }
            if !k.as_str().starts_with(prefix) {
                continue;
            }
            let entries = match &slot {
                Slot::One(e) => vec![Arc::clone(e)],
                Slot::Varied(v) => v.variants.iter().map(|(_, e)| Arc::clone(e)).collect(),
            };
            out.push((k, entries));
        }
        out
    }

    /// Bytes held now.
    pub(super) fn weight(&self) -> u64 {
        self.entries.weight()
    }

    /// Byte bound.
    pub(super) fn capacity(&self) -> u64 {
        self.entries.capacity()
    }

    /// URLs stored now.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::entry::tests_support::fresh;
    use crate::cache::vary::Selection;
    use crate::compress::Encoding;
    use crate::config::ByteSize;
    use bytes::Bytes;
    use http::StatusCode;

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
            fresh(),
            false,
        );
        let key = CacheKey::from_parts("http", "h", "/big");
        store.store(key.clone(), Arc::new(e));
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
            fresh(),
            false,
        );
        e.selection = Selection::of(&e.headers, &lang("en")).unwrap();
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
                fresh(),
                false,
            );
            store.store(
                CacheKey::from_parts("http", "h", &format!("/{i}")),
                Arc::new(e),
            );
            assert!(store.weight() <= store.capacity());
        }
        assert!(store.len() < 2000 && store.len() > 100, "{}", store.len());
    }
}
