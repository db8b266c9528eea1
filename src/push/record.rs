//! The leaf of push's ladder: a record as stored ([`Record`]), one numbered change of a record
//! ([`Change`]) and where it came from ([`Source`]), and the [`Observer`] trait through which
//! the store's writer hands every committed change, in commit order, to those that follow them
//! (the subscribers' fan-out, the fleet's log).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::HeaderValue;
use serde_json::Value;

use crate::compress::Encoding;
use crate::config::CompressionConfig;

/// A record as stored: its value, its serialized text (what GET and events send), its
/// entity-tag and the sequence number of its last change.
pub struct Record {
    pub value: Value,
    pub json: Bytes,
    pub etag: HeaderValue,
    pub seq: u64,
    /// When it was last written, in milliseconds since the Unix epoch.
    pub t: u64,
    /// Compressed copies for GET, made off the async workers after the first request
    /// that could use them (that one, like a cache fill's first client, gets identity).
    encoded: OnceLock<Vec<(Encoding, Bytes)>>,
    compressing: std::sync::atomic::AtomicBool,
}

/// Records this large or larger are sent compressed to clients that accept it.
pub const COMPRESS_ABOVE: usize = 1024;

impl Record {
    pub fn new(value: Value, json: Bytes, seq: u64, t: u64) -> Record {
        Record {
            value,
            json,
            etag: HeaderValue::try_from(format!("\"s{seq}\"")).expect("ASCII"),
            seq,
            t,
            encoded: OnceLock::new(),
            compressing: Default::default(),
        }
    }

    /// The record's compressed copies (gzip, br, zstd), smallest first, once made: empty for
    /// small records, and until a blocking-pool thread has made them (the first call for a
    /// large record starts that).
    pub fn encoded(self: &Arc<Self>) -> &[(Encoding, Bytes)] {
        if let Some(v) = self.encoded.get() {
            return v;
        }
        if self.json.len() >= COMPRESS_ABOVE
            && !self
                .compressing
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            let r = Arc::clone(self);
            let make = move || {
                r.encoded.get_or_init(|| compress(&r.json));
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(make)),
                Err(_) => make(),
            }
        }
        self.encoded.get().map_or(&[], Vec::as_slice)
    }
}

/// `json` in every compressed coding that makes it smaller, smallest first.
fn compress(json: &[u8]) -> Vec<(Encoding, Bytes)> {
    // Levels that keep a 1 MiB record's compression in the milliseconds.
    let cfg = CompressionConfig {
        brotli_level: crate::config::Bounded(5),
        zstd_level: crate::config::Bounded(6),
        gzip_level: crate::config::Bounded(6),
        ..Default::default()
    };
    let mut v: Vec<(Encoding, Bytes)> = (Encoding::COMPRESSED.iter())
        .map(|&e| (e, crate::compress::encode(json, e, &cfg)))
        .filter(|(_, b)| b.len() < json.len())
        .collect();
    v.sort_by_key(|(_, b)| b.len());
    v
}

/// A record with its id.
pub type Named = (Arc<str>, Arc<Record>);

/// What made a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A client's write on this node (HTTP, WebSocket): what the fleet is told of.
    Write,
    /// A change of the fleet's log applied here (not told back to the fleet).
    Fleet,
    /// A group's bound: the record was over its maximum or outlived its TTL (every node
    /// removes it by itself), or a change replayed from the log at start.
    Store,
}

/// One change: the record before and after (None: absent).
pub struct Change {
    pub seq: u64,
    pub id: Arc<str>,
    pub old: Option<Arc<Record>>,
    pub new: Option<Arc<Record>>,
    pub source: Source,
}

impl Change {
    /// What the change holds in the history: its id and the JSON text of its values before
    /// and after (an upper bound: a value may be held by two changes).
    pub fn weight(&self) -> u64 {
        let v = |r: &Option<Arc<Record>>| r.as_ref().map_or(0, |r| r.json.len());
        (self.id.len() + v(&self.old) + v(&self.new)) as u64
    }
}

/// Follows a store's committed changes. The store's writer thread calls every observer
/// registered on the store ([`super::store::Store::observe`]) with each group of changes it
/// committed, in commit (sequence) order, once they are durable and before their writes are
/// acknowledged, whatever became of the requests that made them.
pub trait Observer: Send + Sync {
    /// `changes`, committed, in sequence order. Called on the log's writer thread: it must
    /// not block (hand the changes on).
    fn committed(&self, changes: &[Arc<Change>]);
}

/// Now, in milliseconds since the Unix epoch (a record's `t`).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
