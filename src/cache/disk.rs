//! The disk tier: entry records ([`super::record`]) in a bounded store on disk, read back on a
//! memory miss and kept across restarts. Only the [`Cache`](super::Cache) façade reaches it,
//! through [`super::tiers`].
//!
//! Storage is foyer's block engine (docs/design.md "Tiers"): records are appended to large
//! blocks written by its flusher tasks (never on a worker), an in-memory index maps a key to its
//! place, and full blocks are reclaimed oldest first beyond `max_size`. On start the index is
//! rebuilt by scanning the blocks. Every record read is checked against the 64-bit checksum
//! foyer wrote with it, and then decoded by [`Entry::decode`](super::Entry::decode), which
//! checks every length: a torn or corrupt record is a miss and is dropped, never served.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use foyer::{
    BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder,
    HybridCacheProperties, Load, Location, PsyncIoEngineConfig, RecoverMode,
};

use super::key::CacheKey;
use super::tiers::Stats;
use crate::config::DiskConfig;

/// Blocks of this size are written whole (a record larger than a block is not stored).
const BLOCK: usize = 16 * 1024 * 1024;

/// The disk store.
pub(super) struct Disk {
    store: HybridCache<String, Bytes>,
    max_record: usize,
    pub(super) stats: Stats,
}

/// Why the disk tier could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("disk tier at {dir}: {why}")]
pub struct OpenError {
    dir: String,
    why: String,
}

impl Disk {
    /// Opens (or creates) the store in `cfg.dir`, recovering what an earlier process wrote.
    pub(super) async fn open(cfg: &DiskConfig) -> Result<Disk, OpenError> {
        let fail = |why: String| OpenError {
            dir: cfg.dir.display().to_string(),
            why,
        };
        std::fs::create_dir_all(&cfg.dir).map_err(|e| fail(e.to_string()))?;
        let capacity = usize::try_from(cfg.max_size.0).unwrap_or(usize::MAX);
        // Whole blocks: at least four, so that one can be reclaimed while others fill.
        let block = BLOCK.min(capacity / 4).max(1 << 20);
        let device = FsDeviceBuilder::new(&cfg.dir)
            .with_capacity(capacity)
            .build()
            .map_err(|e| fail(e.to_string()))?;
        let store = HybridCacheBuilder::new()
            .with_name("larder-disk")
            // The memory part of foyer's hybrid cache is unused: records go to disk directly
            // (larder's own memory tier is above this one).
            .memory(1 << 20)
            .with_weighter(|k: &String, v: &Bytes| k.len() + v.len())
            .storage()
            // pread/pwrite on tokio's blocking pool (io_uring's engine polls a thread without
            // sleeping: docs/design.md "Tiers").
            .with_io_engine_config(PsyncIoEngineConfig::new())
            .with_engine_config(BlockEngineConfig::new(device).with_block_size(block))
            .with_recover_mode(RecoverMode::Quiet)
            .build()
            .await
            .map_err(|e| fail(e.to_string()))?;
        Ok(Disk {
            store,
            max_record: block - 4096,
            stats: Stats::default(),
        })
    }

    /// Writes `record` under `key` (replacing what was there), in the background.
    pub(super) fn write(&self, key: &CacheKey, record: Bytes) {
        if record.len() > self.max_record {
            return;
        }
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.store.insert_with_properties(
            key.as_str().to_owned(),
            record,
            HybridCacheProperties::default().with_location(Location::OnDisk),
        );
    }

    /// The record stored under `key`; `None` on a miss or any read error (counted).
    pub(super) async fn read(&self, key: &CacheKey) -> Option<Bytes> {
        let found = match self.store.storage().load(key.as_str()).await {
            Ok(Load::Entry { value, .. }) => Some(value),
            Ok(Load::Piece { piece, .. }) => Some(piece.value().clone()),
            Ok(Load::Throttled | Load::Miss) => None,
            Err(e) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(key = key.as_str(), error = %e, "disk tier read failed");
                // A record that cannot be read is dropped.
                self.remove(key);
                None
            }
        };
        let counter = match found {
            Some(_) => &self.stats.hits,
            None => &self.stats.misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Drops the record under `key`, if any.
    pub(super) fn remove(&self, key: &CacheKey) {
        self.store.remove(key.as_str());
    }

    /// Waits until what was written so far reached the disk (tests, shutdown).
    pub(super) async fn flush(&self) {
        self.store.storage().wait().await;
    }
}
