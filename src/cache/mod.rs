//! The cache: one façade ([`Cache`]) over where responses are kept and how misses share a fill.
//! Handlers look up, store, upgrade, purge and join fills through it, never reaching past it, so
//! that tiers beyond memory (a disk tier, a shared tier) can go behind it.
//!
//! - [`key`]: the primary key ([`CacheKey`]) and the key misses coalesce on ([`FillKey`]).
//! - `memory`: the byte-bounded in-memory store of [`Entry`]s, the tier every hit comes from.
//! - [`tiers`]: where a memory miss looks next ([`Cache::find`], the walk: disk, then shared,
//!   then the shared tier's lease), and what fills write down: `disk` (a bounded store kept
//!   across restarts, a log of segment files) and `shared` (entry records in the fleet's Redis,
//!   [`crate::fleet`], handed in by the server's start like images' and push's, with leases so
//!   that a URL is fetched once for the fleet), each a
//!   `storage::Storage` to the walk (`storage.rs`: the trait and the tiers' counters, below
//!   both); `bans` keeps the purges those tiers apply when they read a record.
//! - [`entry`]: a stored response, immutable once built; [`record`] its versioned binary
//!   encoding, for tiers that keep bytes.
//! - [`coalesce`]: miss coalescing; [`pending`]: compressed variants on their way.
//! - `purge`: what an operator's purge names ([`Purge`]), which every tier applies.
//! - [`policy`]: the RFC 9111 rules; [`vary`]: which requests a stored response answers.
//!
//! An entry is never mutated; an update (compressed variants arriving, a revalidation) stores a
//! new entry.

mod bans;
pub mod coalesce;
mod disk;
pub mod entry;
pub mod key;
mod memory;
pub mod policy;
mod purge;
pub mod record;
mod shared;
mod storage;
pub mod tiers;
pub mod vary;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HeaderMap;

pub use coalesce::{FillOutcome, Inflight, Join};
pub use entry::pending::{self, Pending};
pub use entry::Entry;
pub use key::{cache_key, CacheKey, FillKey};
pub use purge::Purge;
pub use tiers::{Lease, Reach, Tier, TierCounts};
pub use vary::Selection;

use crate::clock::Clock;
use crate::compress::{Compressor, Encoding};
use crate::config::{CacheConfig, CompressionConfig};
use crate::fleet::Fleet;
use policy::RequestDirectives;

/// What the tiers below memory answered a memory miss ([`Cache::find`]).
pub enum Found {
    /// A stored response the request accepts as it is (fresh enough for its directives).
    Hit(Arc<Entry>),
    /// A stored response that must be revalidated first (or served stale where allowed).
    Stale(Arc<Entry>),
    /// Nothing stored answers it; with the URL's lease in the shared tier when the walk asked
    /// for it and got it (held until dropped: released once the fill's record is written).
    Miss(Option<Lease>),
}

/// The cache, as the handlers see it: stored responses, the fills in flight, the compressor that
/// builds stored responses' variants, the cache settings, and the wall clock freshness is read on.
pub struct Cache {
    /// The memory tier.
    memory: memory::Store,
    /// Fills in flight, by the key their misses coalesce on.
    fills: Arc<Inflight<FillKey>>,
    compressor: Compressor,
    cfg: CacheConfig,
    /// The tiers below memory, if any are set up.
    tiers: Option<Arc<tiers::Tiers>>,
    /// URLs whose last coalesced fill the policy refused to store, and until when their misses
    /// fetch each for itself (Varnish's hit-for-miss): see [`Cache::mark_uncacheable`].
    uncacheable: Mutex<HashMap<CacheKey, Instant>>,
    /// The wall clock freshness is read on (handed in: tests move it).
    clock: Clock,
}

/// How long a URL whose response may not be stored skips coalescing (Varnish's default
/// hit-for-miss time).
const HIT_FOR_MISS: Duration = Duration::from_secs(120);

/// URLs marked at most; beyond, the expired marks go, then all (a mark only saves waiting).
const MAX_UNCACHEABLE: usize = 100_000;

impl Cache {
    /// A cache in memory only (whatever `cfg` says of the tiers below), on the system clock.
    pub fn new(cfg: CacheConfig, compression: CompressionConfig) -> Arc<Cache> {
        Cache::in_memory(cfg, compression, Clock::system())
    }

    fn in_memory(cfg: CacheConfig, compression: CompressionConfig, clock: Clock) -> Arc<Cache> {
        Arc::new(Cache {
            memory: memory::Store::new(&cfg),
            fills: Arc::new(Inflight::default()),
            compressor: Compressor::new(compression),
            cfg,
            tiers: None,
            uncacheable: Mutex::default(),
            clock,
        })
    }

    /// The cache `cfg` sets up, with its tiers below memory: the disk tier opened (and what an
    /// earlier process left in it recovered), and, when `fleet` is handed in (the server opens
    /// it from `[cache.shared]`, and hands the same one to images and push), the shared tier in
    /// it, this node following the fleet's purges. Its freshness is read on `clock`. Call it
    /// within the runtime that serves.
    pub async fn open(
        cfg: CacheConfig,
        compression: CompressionConfig,
        clock: Clock,
        fleet: Option<Arc<Fleet>>,
    ) -> Result<Arc<Cache>, tiers::OpenError> {
        let Some(tiers) = tiers::Tiers::open(&cfg, clock.clone(), fleet).await? else {
            return Ok(Cache::in_memory(cfg, compression, clock));
        };
        let tiers = Arc::new(tiers);
        let evicted = (tiers.disk.is_some() && !tiers.disk_all).then(|| {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<(CacheKey, Arc<Entry>)>(1024);
            let tiers = Arc::clone(&tiers);
            tokio::spawn(async move {
                while let Some((key, entry)) = rx.recv().await {
                    tiers.write_disk(&key, &entry, true);
                }
            });
            tx
        });
        let cache = Arc::new(Cache {
            memory: memory::Store::with_evictions(&cfg, evicted),
            fills: Arc::new(Inflight::default()),
            compressor: Compressor::new(compression),
            cfg,
            tiers: Some(Arc::clone(&tiers)),
            uncacheable: Mutex::default(),
            clock,
        });
        if let Some(shared) = &tiers.shared {
            // What was purged while this node was down applies before it serves (memory is
            // empty: only the tiers below hold anything to purge).
            let from = match shared.purges_so_far().await {
                Some((last, bans)) => {
                    tiers.purged_elsewhere(bans);
                    last
                }
                None => "0-0".into(),
            };
            let weak = Arc::downgrade(&cache);
            shared.follow(from, move |bans| {
                let Some(cache) = weak.upgrade() else { return };
                let tiers = Arc::clone(cache.tiers.as_ref().expect("tiers"));
                let purges = tiers.purged_elsewhere(bans);
                // Scans of the memory tier: off the async workers.
                tokio::task::spawn_blocking(move || {
                    for p in &purges {
                        cache.purge_memory(p);
                    }
                });
            });
        }
        Ok(cache)
    }

    /// The cache settings.
    #[inline]
    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// The wall clock the handlers read freshness and age on.
    #[inline]
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The compressor shared by the handlers (stored variants, on-the-fly coding).
    #[inline]
    pub fn compressor(&self) -> &Compressor {
        &self.compressor
    }

    // Lookup.

    /// The stored response matching a request: the entry under `key`, or the variant whose
    /// selecting fields match the request's (§4.1). The hit path: a hash probe and a refcount
    /// increment.
    #[inline]
    pub fn lookup(&self, key: &CacheKey, request: &HeaderMap) -> Option<Arc<Entry>> {
        let found = self.memory.lookup(key, request);
        if let Some(e) = &found {
            e.count_hit();
        }
        found
    }

    /// The entry stored under `key`, if it does not vary on request fields (files, images).
    #[inline]
    pub fn get(&self, key: &CacheKey) -> Option<Arc<Entry>> {
        let found = self.memory.get(key);
        if let Some(e) = &found {
            e.count_hit();
        }
        found
    }

    /// Whether there are tiers below memory to look in.
    #[inline]
    pub fn has_tiers(&self) -> bool {
        self.tiers.is_some()
    }

    /// What the tiers below memory hold for a request memory missed ([`Cache::lookup`]: the
    /// hit path stays a hash probe), as far as `reach`: the disk's record, then the shared
    /// tier's, then (with [`Reach::Lease`]) the URL's lease in the shared tier, or, when another
    /// node holds it, that node's response once it is stored. A hit or a stale entry by
    /// `directives` on the cache's clock. A record found is promoted to memory: from the disk on
    /// its second read (the doorkeeper, docs/design.md "Tiers"), or at once when stale or
    /// lacking its compressed variants (what replaces it in memory needs it there); from the
    /// shared tier at once, and to the disk. Without tiers, a miss at once.
    pub async fn find(
        self: &Arc<Self>,
        key: &CacheKey,
        request: &HeaderMap,
        directives: &RequestDirectives,
        reach: Reach,
    ) -> Found {
        let Some(tiers) = &self.tiers else {
            return Found::Miss(None);
        };
        let entry = match tiers.walk(key, request, reach).await {
            tiers::Walked::Found(entry, Tier::Disk) => {
                if !entry.lacks_variants()
                    && entry.freshness.is_fresh(self.clock.now())
                    && !tiers.doorkeeper.admit(key)
                {
                    Arc::new(*entry)
                } else {
                    self.promote(key, *entry, false)
                }
            }
            tiers::Walked::Found(entry, Tier::Shared) => self.promote(key, *entry, true),
            tiers::Walked::Leased(lease) => return Found::Miss(Some(lease)),
            tiers::Walked::Miss => return Found::Miss(None),
        };
        if directives.accepts(&entry.freshness, self.clock.now()) {
            Found::Hit(entry)
        } else {
            Found::Stale(entry)
        }
    }

    /// Stores an entry read from below in memory (and on disk, `to_disk`), building the
    /// compressed variants a record written before they were ready lacks. Its large bodies go
    /// into memory files now (a record served once and dropped is not worth one).
    fn promote(self: &Arc<Self>, key: &CacheKey, entry: Entry, to_disk: bool) -> Arc<Entry> {
        let mut entry = entry.into_mapped();
        let partial = entry.lacks_variants();
        if partial {
            entry.pending = Some(Pending::new());
        }
        let entry = Arc::new(entry);
        self.memory.store(key.clone(), Arc::clone(&entry));
        if partial {
            self.spawn_variants(key.clone(), Arc::clone(&entry));
        } else if to_disk {
            if let Some(t) = &self.tiers {
                t.write_disk(key, &entry, false);
            }
        }
        entry
    }

    // Store.

    /// Stores a response under `key`: as its one entry, or, if it varies, as the variant its
    /// [`Selection`] names (replacing the variants of an older Vary). In memory only: files and
    /// fixed responses.
    pub fn store(&self, key: CacheKey, entry: Arc<Entry>) {
        self.memory.store(key, entry);
    }

    /// Stores a response fetched from an origin (or made from one): in memory, and written
    /// down to the tiers below, after which `lease` is released. Its compressed variants, when
    /// they come, are written again ([`Cache::upgrade`]).
    pub fn store_filled(&self, key: CacheKey, entry: Arc<Entry>, lease: Option<Lease>) {
        {
            let mut marks = self.uncacheable.lock().expect("uncacheable");
            if !marks.is_empty() {
                marks.remove(&key);
            }
        }
        if let Some(t) = &self.tiers {
            t.write(&key, &entry, entry.pending.is_none(), lease);
        }
        self.memory.store(key, entry);
    }

    /// Replaces `old` by `new` if `old` is still stored under `key` (a newer fill or a purge
    /// wins); whether it was. A complete `new` (no variants pending) is written to the tiers
    /// below.
    pub fn upgrade(&self, key: &CacheKey, old: &Arc<Entry>, new: Arc<Entry>) -> bool {
        let complete = new.pending.is_none();
        let tiered = complete.then(|| Arc::clone(&new));
        let done = self.memory.upgrade(key, old, new);
        if let (true, Some(t), Some(new)) = (done, &self.tiers, tiered) {
            t.write(key, &new, true, None);
        }
        done
    }

    // Purge.

    /// Removes everything stored under `key`, every variant (an invalidation, an outdated
    /// response), here and in the tiers below; whether anything was in memory.
    pub fn remove(&self, key: &CacheKey) -> bool {
        if let Some(t) = &self.tiers {
            t.forget(key);
        }
        self.memory.remove(key)
    }

    /// Removes what `target` names, from every tier and, through the shared tier, every node;
    /// returns how many URLs were removed from memory. A prefix or a tag scans the store shard
    /// by shard: call it from a blocking thread.
    pub fn purge(&self, target: &Purge) -> usize {
        if let Some(t) = &self.tiers {
            t.purge(target);
        }
        self.purge_memory(target)
    }

    /// Removes what `target` names from memory.
    fn purge_memory(&self, target: &Purge) -> usize {
        match target {
            Purge::Url(key) => usize::from(self.memory.remove(key)),
            Purge::Prefix(prefix) => self.purge_where(|k, _| k.as_str().starts_with(&**prefix)),
            Purge::Tag(tag) => self.purge_where(|_, e| e.tags.iter().any(|t| **t == **tag)),
        }
    }

    /// Removes every URL for which `doomed` is true of its key or of any of its entries; returns
    /// how many URLs were removed. Scans shard by shard, so lookups are never blocked for long.
    pub fn purge_where(&self, doomed: impl Fn(&CacheKey, &Entry) -> bool) -> usize {
        self.memory.purge_where(doomed)
    }

    /// The URLs stored under `prefix` (at most `limit`, in no order), each with its entries.
    /// Reads every shard once (the admin API's listing).
    pub fn entries_under(&self, prefix: &str, limit: usize) -> Vec<(CacheKey, Vec<Arc<Entry>>)> {
        self.memory.entries_under(prefix, limit)
    }

    /// The `limit` URLs whose entries were looked up most (every variant counted), most first,
    /// with their lookups and bytes: a scan of every entry (call it off the async workers).
    pub fn top(&self, limit: usize) -> Vec<(CacheKey, u64, u64)> {
        let mut all: Vec<(CacheKey, u64, u64)> = (self.memory.entries_under("", usize::MAX))
            .into_iter()
            .map(|(k, es)| {
                let hits = es.iter().map(|e| e.hits()).sum();
                let bytes = es.iter().map(|e| e.weight).sum();
                (k, hits, bytes)
            })
            .collect();
        let n = limit.min(all.len());
        if n < all.len() && n > 0 {
            all.select_nth_unstable_by(n - 1, |a, b| b.1.cmp(&a.1));
        }
        all.truncate(n);
        all.sort_by_key(|t| std::cmp::Reverse(t.1));
        all
    }

    // Fills.

    /// The fill a miss for `request` joins: the URL's, or, when the URL is stored as varying,
    /// the fill of the variant the request selects.
    pub fn fill_key(&self, key: &CacheKey, request: &HeaderMap) -> FillKey {
        self.memory.fill_key(key, request)
    }

    /// Marks `key` as answered with a response the policy may not store: for
    /// [`HIT_FOR_MISS`] its misses fetch each for itself instead of waiting on another
    /// request's fill only to be released by it (under concurrency, every request would wait
    /// one origin round trip behind another). A fill that stores the key removes the mark.
    pub fn mark_uncacheable(&self, key: &CacheKey) {
        let now = Instant::now();
        let mut marks = self.uncacheable.lock().expect("uncacheable");
        if marks.len() >= MAX_UNCACHEABLE {
            marks.retain(|_, until| *until > now);
            if marks.len() >= MAX_UNCACHEABLE {
                marks.clear();
            }
        }
        marks.insert(key.clone(), now + HIT_FOR_MISS);
    }

    /// Whether misses of `key` fetch each for itself (see [`Cache::mark_uncacheable`]).
    pub fn is_uncacheable(&self, key: &CacheKey) -> bool {
        let mut marks = self.uncacheable.lock().expect("uncacheable");
        match marks.get(key) {
            None => false,
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                marks.remove(key);
                false
            }
        }
    }

    /// Joins the fill of `key`, leading it if none is in flight.
    pub fn join(&self, key: &FillKey) -> Join {
        self.fills.join(key)
    }

    /// The entry under `key` (one that does not vary), filled once for all concurrent callers:
    /// the leader runs `fill` (unless a fill stored it meanwhile) and stores nothing itself;
    /// followers wait for its entry (at most `coalesce_timeout`) and fill themselves if it
    /// produced none.
    pub async fn fill_once<F, Fut>(&self, key: &CacheKey, fill: F) -> Option<Arc<Entry>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Option<Arc<Entry>>>,
    {
        let fill_key = FillKey::from(key.clone());
        let timeout = self.cfg.coalesce_timeout.0;
        self.fills
            .once(&fill_key, timeout, || self.get(key), fill)
            .await
    }

    /// Waits until what was given to the disk tier is on disk.
    pub async fn flush(&self) {
        if let Some(disk) = self.tiers.as_ref().and_then(|t| t.disk.as_ref()) {
            disk.flush().await;
        }
    }

    // Status.

    /// URLs stored now.
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held now.
    pub fn weight(&self) -> u64 {
        self.memory.weight()
    }

    /// Byte bound.
    pub fn capacity(&self) -> u64 {
        self.memory.capacity()
    }

    /// What each tier below memory did since start (none without tiers).
    pub fn tier_counts(&self) -> Vec<TierCounts> {
        self.tiers.as_ref().map_or_else(Vec::new, |t| t.counts())
    }

    /// The tiers' counts as metric families (`/metrics`).
    pub fn metric_families(&self) -> Vec<crate::metrics::Family> {
        let counts = self.tier_counts();
        if counts.is_empty() {
            return Vec::new();
        }
        let family =
            |name, help, value: fn(&TierCounts) -> u64, only_shared: bool| crate::metrics::Family {
                name,
                help,
                counter: true,
                samples: (counts.iter())
                    .filter(|c| !only_shared || c.tier == Tier::Shared)
                    .map(|c| (vec![("tier", c.tier.as_str().to_string())], value(c)))
                    .collect(),
            };
        vec![
            family("larder_cache_tier_hits", "Memory misses a tier below answered.", |c| c.hits, false),
            family("larder_cache_tier_misses", "Memory misses a tier below did not answer.", |c| c.misses, false),
            family("larder_cache_tier_writes", "Records written to a tier below.", |c| c.writes, false),
            family(
                "larder_cache_tier_errors",
                "Failed reads (disk); failed or timed-out commands (shared: larder went on without it).",
                |c| c.errors,
                false,
            ),
            family(
                "larder_cache_lease_waits",
                "Misses answered by another node's fill after waiting on its lease.",
                |c| c.lease_waits,
                true,
            ),
            crate::metrics::Family {
                name: "larder_cache_shared_connected",
                help: "Whether the shared tier's client is connected (1) or connecting (0).",
                counter: false,
                samples: (counts.iter())
                    .filter_map(|c| c.connected)
                    .map(|on| (vec![("tier", "shared".to_string())], on as u64))
                    .collect(),
            },
            family("larder_cache_purges_sent", "Purges sent to the other nodes.", |c| c.purges_sent, true),
            family(
                "larder_cache_tier_refused",
                "Values read from the shared tier refused for their signature (shared_key).",
                |c| c.refused,
                true,
            ),
            family(
                "larder_cache_purges_received",
                "Purges other nodes made, applied here.",
                |c| c.purges_received,
                true,
            ),
            family(
                "larder_rate_limit_local_decisions",
                "Fleet-wide rate limits (fleet = true) decided on this node alone: Redis was away.",
                |c| c.local_decisions,
                true,
            ),
        ]
    }

    /// Fills in flight now.
    pub fn fills_in_flight(&self) -> usize {
        self.fills.len()
    }

    // Variants.

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
                    if !store.upgrade(&key, &current, Arc::clone(&next)) {
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
    use crate::cache::entry::tests_support::fresh;
    use http::{HeaderValue, StatusCode};

    fn entry(tags: &[&str]) -> Arc<Entry> {
        let mut e = Entry::build(
            StatusCode::OK,
            HeaderMap::new(),
            vec![(Encoding::Identity, Bytes::from_static(b"x"))],
            fresh(),
            false,
        );
        e.tags = tags.iter().map(|t| Box::from(*t)).collect();
        Arc::new(e)
    }

    #[test]
    fn purge_by_url_prefix_and_tag() {
        let cache = Cache::new(CacheConfig::default(), CompressionConfig::default());
        let key = |p: &str| CacheKey::from_parts("http", "h", p);
        cache.store(key("/a/1"), entry(&["red"]));
        cache.store(key("/a/2"), entry(&[]));
        cache.store(key("/b"), entry(&["red", "blue"]));
        cache.store(key("/c"), entry(&[]));
        assert_eq!(cache.purge(&Purge::Tag("blue".into())), 1);
        assert!(cache.get(&key("/b")).is_none());
        assert_eq!(cache.purge(&Purge::Prefix("http://h/a/".into())), 2);
        assert_eq!(cache.purge(&Purge::Url(key("/c"))), 1);
        assert_eq!(cache.purge(&Purge::Url(key("/c"))), 0);
        assert!(cache.is_empty());
    }

    #[test]
    fn upgrade_replaces_only_the_current_entry() {
        let cache = Cache::new(CacheConfig::default(), CompressionConfig::default());
        let key = CacheKey::from_parts("http", "h", "/u");
        let mut request = HeaderMap::new();
        request.insert("accept", HeaderValue::from_static("*/*"));
        let (old, newer, newest) = (entry(&[]), entry(&["n"]), entry(&["m"]));
        cache.store(key.clone(), Arc::clone(&old));
        assert!(cache.upgrade(&key, &old, Arc::clone(&newer)));
        // `old` is gone: a late upgrade of it loses to the newer entry.
        assert!(!cache.upgrade(&key, &old, newest));
        let got = cache.lookup(&key, &request).unwrap();
        assert!(Arc::ptr_eq(&got, &newer));
    }
}
