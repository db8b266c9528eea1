//! Push records shared by every node (`share = true` on a push route, with `[cache.shared]`):
//! a change written on one node reaches the subscribers of every node.
//!
//! Each node keeps its own store (its log, its sequence numbers, its subscribers) and the
//! fleet shares one replicated log in Redis (`crate::fleet::SharedLog`, named by the route's
//! path): a stream of changes and a hash of the latest values, written together by one script.
//!
//! - The replica observes the store ([`Observer`]): the store's writer hands it every change
//!   committed here, in commit order, whatever became of the request that made it; a
//!   client's change ([`Source::Write`], not one applied from the log or a group's removal) is
//!   queued, numbered by its sequence number, and appended to the log by one publisher task,
//!   in that order. So the log has this node's changes of a record in the order they were
//!   committed.
//! - A follower task reads the log from where this node stopped (a cursor file in the store's
//!   directory; a new node starts from the hash) and applies each change to the store, unless
//!   the store holds that value already, or this node has a change of that record of its own
//!   that the log has not shown yet (the number carried in the entry): that change comes later in the log, and is applied when it comes. Every node
//!   thus ends with the record the log wrote last, whatever the interleaving of writes on
//!   several nodes (a local write racing an applied one is restored when its own entry comes).
//!
//! When Redis is unavailable, writes are still acknowledged and served here, and their changes
//! wait (in order, up to 4096) to be appended once it is back; beyond that a change is not
//! shared (a warning).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::record::{Change, Observer, Source};
use super::store::{Conditions, Store, Write, WriteError};
use crate::fleet::{SharedLog, StreamEntry};

/// Changes waiting to be appended at most (beyond, a change is not shared).
const QUEUE: usize = 4096;

/// A store's link to the fleet's log.
pub struct Replica {
    queue: mpsc::Sender<(String, Option<Bytes>, u64)>,
    own: Arc<Mutex<Own>>,
}

/// This node's changes the log has not shown back yet.
#[derive(Default)]
struct Own {
    /// By record id, the number (sequence number) of the last change queued.
    latest: HashMap<String, u64>,
}

impl Replica {
    /// Starts publishing this store's committed changes to `log` (registered as the store's
    /// observer of the fleet, once) and applying the log's changes to it.
    pub fn start(store: &Arc<Store>, log: SharedLog) {
        store.share_with(|| {
            let (queue, rx) = mpsc::channel(QUEUE);
            let own = Arc::new(Mutex::new(Own::default()));
            let log = Arc::new(log);
            tokio::spawn(publish(Arc::clone(&log), rx));
            tokio::spawn(follow(Arc::downgrade(store), log, Arc::clone(&own)));
            Arc::new(Replica { queue, own })
        });
    }
}

impl Observer for Replica {
    /// Queues the clients' changes (the record's JSON, or `None`: deleted), in commit order.
    /// Never waits: when the queue is full (Redis away for long), a change is not shared (a
    /// warning).
    fn committed(&self, changes: &[Arc<Change>]) {
        let mut own = self.own.lock().expect("own");
        for c in changes.iter().filter(|c| c.source == Source::Write) {
            let json = c.new.as_ref().map(|r| r.json.clone());
            match self.queue.try_send((c.id.to_string(), json, c.seq)) {
                Ok(()) => {
                    own.latest.insert(c.id.to_string(), c.seq);
                }
                Err(_) => {
                    tracing::warn!(id = &*c.id, "push: sharing queue full; change not shared")
                }
            }
        }
    }
}

async fn publish(log: Arc<SharedLog>, mut rx: mpsc::Receiver<(String, Option<Bytes>, u64)>) {
    while let Some((id, json, n)) = rx.recv().await {
        let text = json.as_ref().map(|j| String::from_utf8_lossy(j));
        // Retried, in order, until Redis takes it (the queue bounds what waits meanwhile).
        let mut wait = Duration::from_millis(100);
        while log.append(&id, text.as_deref(), n).await.is_none() {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
        }
    }
}

/// Where this node stopped reading the log.
fn cursor_file(store: &Store) -> PathBuf {
    store.dir().join("shared.cursor")
}

async fn follow(store: Weak<Store>, log: Arc<SharedLog>, own: Arc<Mutex<Own>>) {
    let Some(s) = store.upgrade() else { return };
    let file = cursor_file(&s);
    let from = match std::fs::read_to_string(&file) {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        // A new node: every record's latest value first, then the changes after them.
        _ => loop {
            if let Some(snap) = log.snapshot().await {
                for (key, value) in snap.values {
                    apply(&s, &key, Some(value)).await;
                }
                let _ = std::fs::write(&file, &snap.at);
                break snap.at;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        },
    };
    drop(s);
    let (tx, mut rx) = mpsc::channel::<Vec<StreamEntry>>(16);
    log.follow(from, tx);
    while let Some(entries) = rx.recv().await {
        let Some(s) = store.upgrade() else { return };
        for e in &entries {
            let key = e.field("key");
            {
                let mut own = own.lock().expect("own");
                let latest = own.latest.get(key).copied();
                if e.field("node") == log.node() {
                    let n: u64 = e.field("n").parse().unwrap_or(0);
                    match latest {
                        // A later change of ours is still to come.
                        Some(l) if n < l => continue,
                        Some(l) if n == l => {
                            own.latest.remove(key);
                        }
                        _ => {}
                    }
                } else if latest.is_some() {
                    // Ours, not shown yet, comes after this one.
                    continue;
                }
            }
            let value = (e.field("deleted") != "1").then(|| e.field("value").to_string());
            apply(&s, key, value).await;
        }
        if let Some(last) = entries.last() {
            let _ = std::fs::write(&file, &last.id);
        }
    }
}

/// Makes the record `key` hold `value` (or be absent), unless it does already.
async fn apply(store: &Store, key: &str, value: Option<String>) {
    let current = store.get(key);
    let w = match (&value, &current) {
        (None, None) => return,
        (Some(v), Some(r)) if r.json[..] == *v.as_bytes() => return,
        (None, Some(_)) => Write::Delete,
        (Some(v), _) => match serde_json::from_str(v) {
            Ok(v) => Write::Put(v),
            Err(e) => {
                tracing::warn!(key, error = %e, "push: a shared change that is not JSON");
                return;
            }
        },
    };
    match (store.write_from(key, w, &Conditions::default(), Source::Fleet)).await {
        Ok(_) | Err(WriteError::NotFound) => {}
        Err(e) => tracing::warn!(key, error = ?e, "push: a shared change not applied"),
    }
}
