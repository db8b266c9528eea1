//! The tiers below memory, as the [`Cache`](super::Cache) façade uses them: the walk a memory
//! miss makes through them ([`Tiers::walk`]: each [`Storage`] in order, disk then shared, then
//! the shared tier's lease), what a fill writes down, and how a purge reaches them.
//!
//! A record read from below is decoded ([`Entry::decode`]), checked against the purges made
//! since it was stored (`bans.rs`) and against the request's selecting fields (a tier
//! keeps one record per URL), and promoted: stored in memory, and on disk when it came from the
//! shared tier. Its age counts from when the origin answered, across restarts and nodes
//! (the record keeps wall-clock times).

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::mpsc;

use super::bans::{Ban, Bans};
use super::disk::Disk;
use super::entry::Entry;
use super::key::CacheKey;
use super::purge::Purge;
use super::shared::{Leasing, Shared};
use super::storage::{Storage, Unavailable};
use crate::clock::Clock;
use crate::config::{CacheConfig, DiskWrite};
use crate::fleet::Fleet;

pub use super::shared::Lease;
pub use super::storage::{Tier, TierCounts};

/// A write to the shared tier, waiting in its queue.
struct SharedWrite {
    key: CacheKey,
    record: Bytes,
    ttl: Duration,
    tags: Box<[Box<str>]>,
    /// Released once the record is written.
    lease: Option<Lease>,
}

/// Queues of shared-tier writes, and writes waiting in each at most (beyond, a write is
/// dropped: it is a cache).
const WRITE_QUEUES: usize = 8;
const WRITE_QUEUE: usize = 1024;

/// How far a walk below memory goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// This node's own tiers (the disk): what a miss reads before it coalesces (a disk hit needs
    /// no fill).
    Node,
    /// Down to the shared tier, without its lease (`only-if-cached`).
    Fleet,
    /// Down to the shared tier, and, when nothing answers, the URL's lease there (the leader of
    /// a fill: the fleet then fetches it once).
    Lease,
}

/// What a walk below memory found.
pub(super) enum Walked {
    /// A stored response that answers the request, and the tier it came from.
    Found(Box<Entry>, Tier),
    /// Nothing; this node holds the URL's lease in the shared tier until the guard drops.
    Leased(Lease),
    /// Nothing (and no lease: not asked for, no shared tier, or it is unavailable).
    Miss,
}

/// What asking for a lease gave.
enum Leased {
    Held(Lease),
    /// The node holding it filled the URL: its entry.
    Filled(Box<Entry>),
    No,
}

/// Why a tier could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Disk(#[from] super::disk::OpenError),
}

/// The tiers below memory.
pub(super) struct Tiers {
    pub(super) disk: Option<Arc<Disk>>,
    pub(super) shared: Option<Arc<Shared>>,
    /// Every tier, in the order a memory miss reads them: disk, then shared.
    below: Vec<Arc<dyn Storage>>,
    /// Queues of writes to the shared tier, by the key's hash: one URL's writes land in the
    /// order they were made (a record written before its variants were built never lands
    /// after the complete one), different URLs' in parallel.
    writes: Vec<mpsc::Sender<SharedWrite>>,
    pub(super) bans: Bans,
    /// Whether the disk tier gets every stored response (else only the evicted).
    pub(super) disk_all: bool,
    /// The longest a stale response may still be served, by the cache settings.
    grace: Duration,
    /// Which disk hits go into memory.
    pub(super) doorkeeper: Doorkeeper,
    /// The cache-status field every delivery of a record adds ([`Entry::reserve_stamp`]).
    status_header: http::HeaderName,
    /// The cache's wall clock (records' lifetimes, bans' times).
    clock: Clock,
}

/// Which disk hits are promoted to memory: a record read from the disk goes into memory on its
/// second read within a while, not on its first (TinyLFU's doorkeeper, the CDNs' "cache on
/// second hit"). An object read once (a crawler, a scan) then costs a disk read, not the eviction
/// of something memory holds for a reason, nor the insert and the eviction's free; an object read
/// again goes in on that read. A direct-mapped table of recent keys' hashes, about one slot per
/// 8 KiB of memory: a key whose slot another key took since is read from disk once more.
pub(super) struct Doorkeeper {
    hasher: RandomState,
    slots: Box<[AtomicU64]>,
}

impl Doorkeeper {
    fn new(memory_bytes: u64) -> Doorkeeper {
        let n = (memory_bytes / 8192)
            .clamp(1024, 1 << 20)
            .next_power_of_two();
        Doorkeeper {
            hasher: RandomState::new(),
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether `key` was read recently (it is let in now); otherwise notes that it was.
    pub(super) fn admit(&self, key: &CacheKey) -> bool {
        let h = self.hasher.hash_one(key.as_str()) | 1; // never 0, an empty slot
        let slot = &self.slots[h as usize & (self.slots.len() - 1)];
        if slot.load(Ordering::Relaxed) == h {
            slot.store(0, Ordering::Relaxed);
            true
        } else {
            slot.store(h, Ordering::Relaxed);
            false
        }
    }
}

impl Tiers {
    /// The tiers `cfg` sets up, the shared tier in `fleet` when one is handed in; `None` when
    /// there are none.
    pub(super) async fn open(
        cfg: &CacheConfig,
        clock: Clock,
        fleet: Option<Arc<Fleet>>,
    ) -> Result<Option<Tiers>, OpenError> {
        if cfg.disk.is_none() && fleet.is_none() {
            return Ok(None);
        }
        let disk = match &cfg.disk {
            Some(d) => Some(Arc::new(Disk::open(d).await?)),
            None => None,
        };
        let shared = fleet.map(|fleet| Arc::new(Shared::new(fleet)));
        let writes = match &shared {
            None => Vec::new(),
            Some(shared) => (0..WRITE_QUEUES)
                .map(|_| {
                    let (tx, mut rx) = mpsc::channel::<SharedWrite>(WRITE_QUEUE);
                    let shared = Arc::clone(shared);
                    tokio::spawn(async move {
                        while let Some(w) = rx.recv().await {
                            shared.write(&w.key, w.record, w.ttl, &w.tags).await;
                            drop(w.lease);
                        }
                    });
                    tx
                })
                .collect(),
        };
        let bans = Bans::load(
            cfg.disk.as_ref().map(|d| d.dir.join("bans.json")),
            clock.now(),
        );
        let grace = [
            cfg.stale_while_revalidate.0,
            cfg.stale_if_error.0,
            cfg.stale_if_disconnected.0,
        ]
        .into_iter()
        .max()
        .unwrap_or_default();
        let mut below: Vec<Arc<dyn Storage>> = Vec::new();
        if let Some(d) = &disk {
            below.push(Arc::clone(d) as Arc<dyn Storage>);
        }
        if let Some(s) = &shared {
            below.push(Arc::clone(s) as Arc<dyn Storage>);
        }
        Ok(Some(Tiers {
            disk,
            shared,
            below,
            writes,
            bans,
            disk_all: cfg.disk.as_ref().is_some_and(|d| d.write == DiskWrite::All),
            grace,
            doorkeeper: Doorkeeper::new(cfg.max_size.0),
            status_header: cfg.status_header.0.clone(),
            clock,
        }))
    }

    /// What each tier did since start.
    pub(super) fn counts(&self) -> Vec<TierCounts> {
        self.below.iter().map(|t| t.counts()).collect()
    }

    /// What the tiers below memory hold for a request memory missed, as far as `reach`: each
    /// tier's record in turn, the first that answers the request; with [`Reach::Lease`], when
    /// none does, the URL's lease in the shared tier (or, when another node holds it, that
    /// node's response once it is stored). A tier that does not answer ends the walk (a miss
    /// waits for an unavailable tier once at most, and asks it for no lease).
    pub(super) async fn walk(&self, key: &CacheKey, request: &HeaderMap, reach: Reach) -> Walked {
        for tier in &self.below {
            if reach == Reach::Node && tier.tier() == Tier::Shared {
                return Walked::Miss;
            }
            match tier.read(key).await {
                Err(Unavailable) => return Walked::Miss,
                Ok(None) => {}
                Ok(Some(record)) => match self.usable(key, record, request) {
                    Some(entry) => return Walked::Found(Box::new(entry), tier.tier()),
                    None => tier.unusable(key),
                },
            }
        }
        if reach != Reach::Lease {
            return Walked::Miss;
        }
        match self.lease(key, request).await {
            Leased::Held(lease) => Walked::Leased(lease),
            Leased::Filled(entry) => Walked::Found(entry, Tier::Shared),
            Leased::No => Walked::Miss,
        }
    }

    /// Takes the shared tier's lease of `key`, or the record of the node that held it.
    async fn lease(&self, key: &CacheKey, request: &HeaderMap) -> Leased {
        let Some(shared) = &self.shared else {
            return Leased::No;
        };
        match shared.lease(key).await {
            Leasing::Held(lease) => Leased::Held(lease),
            Leasing::Filled(record) => match self.usable(key, record, request) {
                Some(entry) => Leased::Filled(Box::new(entry)),
                None => Leased::No,
            },
            Leasing::None => Leased::No,
        }
    }

    /// A record, decoded, if it is whole, not purged since, and answers `request`.
    fn usable(&self, key: &CacheKey, record: Bytes, request: &HeaderMap) -> Option<Entry> {
        let mut entry = match Entry::decode(record) {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(key = key.as_str(), error = %e, "stored record not read");
                return None;
            }
        };
        if self.bans.bans(key, &entry) || !entry.selection.matches(request) {
            return None;
        }
        entry.reserve_stamp(&self.status_header);
        Some(entry)
    }

    /// Writes `entry` down: to the shared tier, then releases `lease` (so that the nodes waiting
    /// on it find the record); to the disk when `complete` (its compressed variants built) and
    /// the disk takes every response. In the background.
    pub(super) fn write(
        &self,
        key: &CacheKey,
        entry: &Arc<Entry>,
        complete: bool,
        lease: Option<Lease>,
    ) {
        let to_disk = complete && self.disk_all && self.disk.is_some();
        if !to_disk && self.writes.is_empty() {
            return;
        }
        let Ok(record) = entry.encode() else {
            return;
        };
        if let (true, Some(disk)) = (to_disk, &self.disk) {
            disk.write(key, record.clone());
        }
        if !self.writes.is_empty() {
            let mut h = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(key, &mut h);
            let queue = &self.writes[std::hash::Hasher::finish(&h) as usize % self.writes.len()];
            let _ = queue.try_send(SharedWrite {
                key: key.clone(),
                record,
                ttl: self.ttl(entry),
                tags: entry.tags.clone(),
                lease,
            });
        }
    }

    /// Writes an entry to the disk: one read from the shared tier, or, with `evicted`, one
    /// memory let go of (`write = "evicted"`); the disk takes each only in its own mode.
    pub(super) fn write_disk(&self, key: &CacheKey, entry: &Entry, evicted: bool) {
        if let (Some(disk), true) = (&self.disk, self.disk_all != evicted) {
            if let Ok(record) = entry.encode() {
                disk.write(key, record);
            }
        }
    }

    /// Drops `key`'s records here and in the shared tier (an invalidation by this node).
    pub(super) fn forget(&self, key: &CacheKey) {
        for tier in &self.below {
            tier.remove(key);
        }
    }

    /// How long a record of `entry` is of use: its remaining lifetime, then its stale windows,
    /// and, when it can be revalidated, as long again as its lifetime (a 304 is cheaper than a
    /// full fetch).
    fn ttl(&self, entry: &Entry) -> Duration {
        let f = &entry.freshness;
        let now = self.clock.now();
        let stale = [f.stale_while_revalidate, f.stale_if_error, self.grace]
            .into_iter()
            .max()
            .unwrap_or_default();
        let revalidatable = entry.etag.is_some() || entry.last_modified.is_some();
        let keep = f.lifetime.saturating_sub(f.current_age(now))
            + stale
            + if revalidatable {
                f.lifetime
            } else {
                Duration::ZERO
            };
        keep.max(Duration::from_secs(1))
    }

    /// Applies a purge made on this node: kept as a ban, dropped from the disk (a URL), and sent
    /// to the shared tier and every other node.
    pub(super) fn purge(&self, target: &Purge) {
        let ban = Ban::of(target, self.clock.now());
        if let (Some(disk), Purge::Url(key)) = (&self.disk, target) {
            disk.remove(key);
        }
        self.bans.add(ban.clone());
        if let Some(shared) = &self.shared {
            let (shared, target) = (Arc::clone(shared), target.clone());
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { shared.purge(&target, &ban).await });
            }
        }
    }

    /// Applies purges other nodes made (from the purge stream): kept as bans, dropped from the
    /// disk; the purges themselves are returned for the memory tier.
    pub(super) fn purged_elsewhere(&self, bans: Vec<Ban>) -> Vec<Purge> {
        let purges: Vec<Purge> = bans.iter().filter_map(Ban::purge).collect();
        if let Some(disk) = &self.disk {
            for p in &purges {
                if let Purge::Url(key) = p {
                    disk.remove(key);
                }
            }
        }
        self.bans.add_all(bans);
        purges
    }
}
