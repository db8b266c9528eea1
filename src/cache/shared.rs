//! The shared tier: entry records ([`super::record`]) in Redis or Valkey, one server or a
//! cluster, read by every node on a miss of its own tiers. Only the [`Cache`](super::Cache)
//! façade reaches it, through [`super::tiers`]. Client: fred (docs/design.md "Tiers").
//!
//! Keys, under the configured namespace `ns`:
//!
//! - `ns:e:<url key>`: an entry record, expiring when the entry is of no more use (its
//!   remaining lifetime, its stale windows, longer when it can be revalidated);
//! - `ns:l:<url key>`: the lease of the node fetching the URL (SET NX PX), so that misses for
//!   one URL on several nodes make one origin fetch; released (compare and delete) once the
//!   record is written, expiring on its own if that node dies;
//! - `ns:t:<tag>`: the keys of the records carrying a tag (purge by tag);
//! - `ns:b:<name>`: blobs other handlers share (image originals), not expiring;
//! - `{ns:log:<name>}:changes` and `{ns:log:<name>}:state`: a replicated log (push records of a
//!   route shared by every node): a stream of changes and a hash of the latest values;
//! - `ns:purges`: a stream of purges (capped), which every node follows to apply each to its
//!   memory and disk, and reads from where it stopped after a disconnection.
//!
//! The client connects in the background, and again after a disconnection, with backoff (100 ms
//! doubling to 2 s): a node started before Redis connects when Redis comes. While it is not
//! connected no command is sent (a miss pays nothing for the tier) and nothing is counted as an
//! error. Once connected, every command is bounded by `timeout`: when Redis is down or slow, a
//! command fails, is counted and logged (once per ten seconds, naming the server), and larder goes
//! on as if there were no shared tier.
//!
//! What is read back is checked, since anything with access to Redis can write there: an entry
//! record carries its CRC-32 ([`super::record`]), an image original is checked against its MD5
//! name (`images/storage.rs`); with a fleet key (`shared_key`) every entry record and blob is
//! written as `b"LDS1" | HMAC-SHA256 | value`, the MAC over the namespace, the kind, the key it
//! is stored under and the value (so a record copied to another key fails), and anything
//! unsigned or signed otherwise is refused (counted in `refused`): write access to Redis is not
//! write access to every node's responses. Not covered, with or without the key: leases, tag
//! indexes and the purge stream (a forged entry costs origin fetches, not a response), and the
//! replicated logs of push records (docs/scaling.md).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scan::Scanner;
use futures_util::StreamExt;

use aws_lc_rs::{constant_time, hmac};

use super::bans::Ban;
use super::key::CacheKey;
use super::tiers::Stats;
use super::Purge;
use crate::config::SharedConfig;

/// Purges kept in the stream for nodes that were away.
const STREAM_CAP: i64 = 10_000;

/// What a value signed with the fleet key starts with, before its MAC.
const SIGNED: &[u8; 4] = b"LDS1";
/// The MAC's length (HMAC-SHA256).
const MAC: usize = 32;

/// What a signed value is: an entry record or a blob (part of what the MAC covers).
#[derive(Clone, Copy)]
enum Kind {
    Entry,
    Blob,
}

/// The shared store.
pub(super) struct Shared {
    client: Client,
    cfg: SharedConfig,
    cluster: bool,
    /// This process's name in purge messages and lease tokens.
    node: String,
    leases: AtomicU64,
    last_warning: std::sync::Mutex<Option<Instant>>,
    /// The fleet key: every value written is signed with it, every value read must be.
    signer: Option<hmac::Key>,
    /// The server's URL as logs show it (no password).
    shown_url: String,
    pub(super) stats: Stats,
}

/// The shared tier did not answer (not connected, or the command failed or timed out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unavailable;

/// Why the shared tier could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("shared tier: {0}")]
pub struct OpenError(String);

/// What asking for a URL's lease gave.
pub(super) enum Leasing {
    /// This node fetches; others wait until the lease is released or expires.
    Held(Lease),
    /// Another node filled the URL meanwhile: its record.
    Filled(Bytes),
    /// No lease (Redis unavailable, or the wait ran out): fetch without one.
    None,
}

/// A URL's lease, held while this node fetches it. Released when dropped.
pub struct Lease {
    shared: Arc<Shared>,
    key: String,
    token: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let shared = Arc::clone(&self.shared);
        let (key, token) = (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { shared.release(&key, &token).await });
        }
    }
}

impl Shared {
    /// A client for the configured server or cluster, connecting (and reconnecting) in the
    /// background with backoff: an unreachable server at start is not an error, only a tier
    /// that misses until it comes.
    pub(super) fn connect(cfg: &SharedConfig) -> Result<Shared, OpenError> {
        let url = cfg.client_url();
        let shown_url = without_password(&url);
        let mut config =
            Config::from_url(&url).map_err(|e| OpenError(format!("{shown_url}: {e}")))?;
        // The first connection is retried like any later one (by default a failed first
        // attempt ends the client's connection task, and it never connects).
        config.fail_fast = false;
        let cluster = config.server.is_clustered();
        let timeout = cfg.timeout.0;
        let client = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = timeout.max(Duration::from_millis(500));
                c.internal_command_timeout = timeout.max(Duration::from_secs(1));
                c.max_command_attempts = 1;
                c.tcp = TcpConfig {
                    nodelay: Some(true),
                    ..Default::default()
                };
            })
            .with_performance_config(|p| {
                p.default_command_timeout = timeout;
            })
            // Attempts for ever, 100 ms apart doubling to 2 s.
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 2000, 2))
            .build()
            .map_err(|e| OpenError(e.to_string()))?;
        let signer =
            (cfg.shared_key.as_deref()).map(|k| hmac::Key::new(hmac::HMAC_SHA256, k.as_bytes()));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let shared = Shared {
            client,
            cfg: cfg.clone(),
            cluster,
            node: format!("{:x}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff),
            leases: AtomicU64::new(0),
            last_warning: std::sync::Mutex::new(None),
            signer,
            shown_url,
            stats: Stats::default(),
        };
        shared.watch(&shared.client, "commands");
        shared.client.connect();
        Ok(shared)
    }

    /// Logs `client`'s connection errors (at most one per ten seconds) and its connections.
    fn watch(&self, client: &Client, connection: &'static str) {
        let url = self.shown_url.clone();
        let mut errors = client.error_rx();
        let mut connects = client.reconnect_rx();
        tokio::spawn(async move {
            let mut last: Option<Instant> = None;
            loop {
                tokio::select! {
                    e = errors.recv() => match e {
                        Ok((error, _)) => {
                            if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                                last = Some(Instant::now());
                                tracing::warn!(
                                    server = %url,
                                    connection,
                                    error = %error,
                                    "shared tier not connected; serving from memory, disk and \
                                     origin, connecting again in the background"
                                );
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(_) => return,
                    },
                    c = connects.recv() => match c {
                        Ok(_) => {
                            last = None;
                            tracing::info!(server = %url, connection, "shared tier connected");
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(_) => return,
                    },
                }
            }
        });
    }

    /// Waits (at most `within`) for the first connection, so that the first requests after a
    /// start find the shared tier; whether it came. A failed attempt ends the wait (the client
    /// goes on trying in the background).
    pub(super) async fn connected(&self, within: Duration) -> bool {
        let mut errors = self.client.error_rx();
        let failed = async {
            while let Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) = errors.recv().await
            {
            }
        };
        tokio::select! {
            c = tokio::time::timeout(within, self.client.wait_for_connect()) => matches!(c, Ok(Ok(()))),
            () = failed => self.client.is_connected(),
        }
    }

    /// Whether the client is connected now (commands are sent only then).
    pub(super) fn is_connected(&self) -> bool {
        self.client.is_connected()
    }

    /// The server's URL as logs show it.
    pub(super) fn shown_url(&self) -> &str {
        &self.shown_url
    }

    fn key(&self, kind: &str, rest: &str) -> String {
        format!("{}:{kind}:{rest}", self.cfg.namespace)
    }

    /// Runs one command within the timeout; a failure is counted, logged now and then, and
    /// `None`. Not connected, the command is not sent (nothing waits, nothing is counted): `None`.
    async fn run<T>(&self, what: &str, command: impl Future<Output = FredResult<T>>) -> Option<T> {
        if !self.client.is_connected() {
            return None;
        }
        match tokio::time::timeout(self.cfg.timeout.0, command).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.failed(what, &e.to_string());
                None
            }
            Err(_) => {
                self.failed(what, "timed out");
                None
            }
        }
    }

    fn failed(&self, what: &str, why: &str) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_warning.lock().expect("not poisoned");
        if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::warn!(
                server = %self.shown_url,
                command = what,
                error = why,
                "shared tier unavailable; serving from memory, disk and origin"
            );
        }
    }

    /// The record stored under `key`: `Ok(None)` when there is none (or none that passes its
    /// signature), `Err` when the tier is unavailable (not connected, or the command failed).
    pub(super) async fn read(&self, key: &CacheKey) -> Result<Option<Bytes>, Unavailable> {
        let found = self.read_quiet(key).await;
        let counter = match found {
            Ok(Some(_)) => &self.stats.hits,
            _ => &self.stats.misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Writes `record` under `key` for `ttl`, and indexes it under its tags.
    pub(super) async fn write(
        &self,
        key: &CacheKey,
        record: Bytes,
        ttl: Duration,
        tags: &[Box<str>],
    ) {
        if record.len() as u64 > self.cfg.max_object_size.0 {
            return;
        }
        let record = self.seal(Kind::Entry, key.as_str(), record);
        let k = self.key("e", key.as_str());
        let ms = ttl.as_millis().clamp(1, i64::MAX as u128) as i64;
        let set =
            self.client
                .set::<(), _, _>(k.clone(), record, Some(Expiration::PX(ms)), None, false);
        if self.run("SET", set).await.is_some() {
            self.stats.writes.fetch_add(1, Ordering::Relaxed);
        }
        for tag in tags {
            let t = self.key("t", tag);
            let _ = self
                .run("SADD", self.client.sadd::<(), _, _>(t.clone(), k.clone()))
                .await;
            // The index lives as long as its longest record (GT: never shortened).
            let expire = self.client.expire::<(), _>(t, ms / 1000 + 1, None);
            let _ = self.run("EXPIRE", expire).await;
        }
    }

    /// Takes the lease of `key` or, when another node holds it, waits (at most the lease's
    /// duration) for that node's record.
    pub(super) async fn lease(self: &Arc<Self>, key: &CacheKey) -> Leasing {
        let lk = self.key("l", key.as_str());
        let token = format!(
            "{}/{}",
            self.node,
            self.leases.fetch_add(1, Ordering::Relaxed)
        );
        let duration = self.cfg.lease.0;
        let deadline = Instant::now() + duration;
        let mut waited = false;
        loop {
            let ms = duration.as_millis() as i64;
            let take = self.client.set::<Option<String>, _, _>(
                lk.clone(),
                token.clone(),
                Some(Expiration::PX(ms)),
                Some(SetOptions::NX),
                false,
            );
            match self.run("SET NX", take).await {
                None => return Leasing::None,
                Some(Some(_)) => {
                    let lease = Lease {
                        shared: Arc::clone(self),
                        key: lk,
                        token,
                    };
                    // The node that held the lease may have written its record and let the
                    // lease go between this node's read and its SET: look once more, so that
                    // a record written is never fetched again (the lease is let go at once).
                    if let Ok(Some(record)) = self.read_quiet(key).await {
                        self.stats.lease_waits.fetch_add(1, Ordering::Relaxed);
                        return Leasing::Filled(record);
                    }
                    return Leasing::Held(lease);
                }
                Some(None) => {} // held by another node
            }
            // Wait for the holder's record, polling; take the lease if it goes without one.
            loop {
                if Instant::now() >= deadline {
                    return Leasing::None;
                }
                tokio::time::sleep(Duration::from_millis(if waited { 20 } else { 5 })).await;
                waited = true;
                if let Ok(Some(record)) = self.read_quiet(key).await {
                    self.stats.lease_waits.fetch_add(1, Ordering::Relaxed);
                    return Leasing::Filled(record);
                }
                let held: Option<Option<String>> =
                    self.run("GET", self.client.get(lk.clone())).await;
                match held {
                    None => return Leasing::None,
                    Some(None) => break, // released without a record: try to take it
                    Some(Some(_)) => {}
                }
            }
        }
    }

    /// A read, not counted (waiting on a lease, each poll is not a miss).
    async fn read_quiet(&self, key: &CacheKey) -> Result<Option<Bytes>, Unavailable> {
        let k = self.key("e", key.as_str());
        let value: Option<Bytes> = self
            .run("GET", self.client.get(k))
            .await
            .ok_or(Unavailable)?;
        Ok(value.and_then(|v| self.open(Kind::Entry, key.as_str(), v)))
    }

    /// `value` as it is written under `name`: signed when there is a fleet key.
    fn seal(&self, kind: Kind, name: &str, value: Bytes) -> Bytes {
        let Some(signer) = &self.signer else {
            return value;
        };
        let mac = self.mac(signer, kind, name, &value);
        let mut out = Vec::with_capacity(SIGNED.len() + MAC + value.len());
        out.extend_from_slice(SIGNED);
        out.extend_from_slice(mac.as_ref());
        out.extend_from_slice(&value);
        out.into()
    }

    /// The value `stored` under `name` holds, if it is signed with the fleet key for `name`
    /// (or, without a fleet key, as it is: the record's own checksum is checked on decoding).
    /// Refused, it is counted and logged (now and then), and `None`.
    fn open(&self, kind: Kind, name: &str, stored: Bytes) -> Option<Bytes> {
        let Some(signer) = &self.signer else {
            return Some(stored);
        };
        let head = SIGNED.len() + MAC;
        let signed = stored.len() >= head && stored[..SIGNED.len()] == SIGNED[..];
        if signed {
            let mac = self.mac(signer, kind, name, &stored[head..]);
            if constant_time::verify_slices_are_equal(mac.as_ref(), &stored[SIGNED.len()..head])
                .is_ok()
            {
                return Some(stored.slice(head..));
            }
        }
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_warning.lock().expect("not poisoned");
        if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::warn!(
                server = %self.shown_url,
                key = name,
                why = if signed { "signed with another key, or altered" } else { "not signed" },
                "shared tier value refused (shared_key)"
            );
        }
        None
    }

    /// HMAC-SHA256 of a value and where it is stored: the namespace, its kind and its name,
    /// each length-prefixed, then the value.
    fn mac(&self, signer: &hmac::Key, kind: Kind, name: &str, value: &[u8]) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(signer);
        let ns = self.cfg.namespace.as_bytes();
        ctx.update(&(ns.len() as u64).to_be_bytes());
        ctx.update(ns);
        ctx.update(match kind {
            Kind::Entry => b"e",
            Kind::Blob => b"b",
        });
        ctx.update(&(name.len() as u64).to_be_bytes());
        ctx.update(name.as_bytes());
        ctx.update(value);
        ctx.sign()
    }

    async fn release(&self, key: &str, token: &str) {
        const RELEASE: &str =
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
        let eval = self.client.eval::<i64, _, _, _>(RELEASE, key, token);
        let _ = self.run("EVAL", eval).await;
    }

    /// A blob stored by [`Shared::put_blob`] (an image original), if any.
    pub(super) async fn get_blob(&self, name: &str) -> Option<Bytes> {
        let k = self.key("b", name);
        let stored: Bytes = self.run("GET", self.client.get(k)).await.flatten()?;
        self.open(Kind::Blob, name, stored)
    }

    /// Stores a blob that does not expire (signed with the fleet key, if any); whether the
    /// server took it.
    pub(super) async fn put_blob(&self, name: &str, data: Bytes) -> bool {
        let k = self.key("b", name);
        let data = self.seal(Kind::Blob, name, data);
        let set = self.client.set::<(), _, _>(k, data, None, None, false);
        self.run("SET", set).await.is_some()
    }

    pub(super) async fn delete_blob(&self, name: &str) {
        let k = self.key("b", name);
        let _ = self.run("DEL", self.client.del::<i64, _>(k)).await;
    }

    /// Drops the record under `key`.
    pub(super) async fn delete(&self, key: &CacheKey) {
        let k = self.key("e", key.as_str());
        let _ = self.run("DEL", self.client.del::<i64, _>(k)).await;
    }

    /// Removes what `target` names from the shared tier, and tells every node (through the
    /// purge stream) to remove it from its memory and disk.
    pub(super) async fn purge(&self, target: &Purge, ban: &Ban) {
        self.stats.purges_sent.fetch_add(1, Ordering::Relaxed);
        let fields = vec![
            ("node", self.node.clone()),
            ("kind", ban.kind.clone()),
            ("target", ban.target.clone()),
            ("at", ban.at_ms.to_string()),
        ];
        let stream = format!("{}:purges", self.cfg.namespace);
        let add = self.client.xadd::<String, _, _, _, _>(
            stream,
            false,
            ("MAXLEN", "~", STREAM_CAP),
            "*",
            fields,
        );
        let _ = self.run("XADD", add).await;
        let keys: Vec<String> = match target {
            Purge::Url(k) => vec![self.key("e", k.as_str())],
            Purge::Tag(tag) => {
                let t = self.key("t", tag);
                let members: Option<Vec<String>> =
                    self.run("SMEMBERS", self.client.smembers(t.clone())).await;
                let mut keys = members.unwrap_or_default();
                keys.push(t);
                keys
            }
            Purge::Prefix(prefix) => self.scan(&self.key("e", prefix)).await,
        };
        // One key per command: in a cluster, keys of one DEL must share a slot.
        for k in keys {
            let _ = self.run("DEL", self.client.del::<i64, _>(k)).await;
        }
    }

    /// Keys starting with `prefix`, on every primary of a cluster (at most a bounded time).
    async fn scan(&self, prefix: &str) -> Vec<String> {
        let pattern = format!("{}*", glob_escape(prefix));
        let mut keys = Vec::new();
        let deadline = Instant::now() + self.cfg.timeout.0 * 50;
        let mut pages = if self.cluster {
            self.client.scan_cluster(pattern, Some(1000), None).boxed()
        } else {
            self.client.scan(pattern, Some(1000), None).boxed()
        };
        while let Ok(Some(page)) = tokio::time::timeout_at(deadline.into(), pages.next()).await {
            match page {
                Ok(mut page) => {
                    if let Some(results) = page.take_results() {
                        keys.extend(results.into_iter().filter_map(|k| k.into_string()));
                    }
                }
                Err(e) => {
                    self.failed("SCAN", &e.to_string());
                    break;
                }
            }
        }
        keys
    }

    /// Every purge the stream holds (what was purged while this node was away), and the id
    /// of the last: read at start, before serving. `None` when Redis did not answer.
    pub(super) async fn purges_so_far(&self) -> Option<(String, Vec<Ban>)> {
        type Records = Vec<(String, Vec<(String, String)>)>;
        let stream = format!("{}:purges", self.cfg.namespace);
        let range =
            self.client
                .xrange::<Records, _, _, _>(stream, "-", "+", Some(STREAM_CAP as u64));
        let records = self.run("XRANGE", range).await?;
        let last = records
            .last()
            .map_or_else(|| "0-0".to_string(), |(id, _)| id.clone());
        let bans = (records.into_iter())
            .map(|(id, fields)| StreamEntry { id, fields })
            .map(|e| Ban {
                kind: e.field("kind").into(),
                target: e.field("target").into(),
                at_ms: e.field("at").parse().unwrap_or(0),
            })
            .collect();
        Some((last, bans))
    }

    /// Follows the purge stream after the entry `from`, calling `apply` with the purges other
    /// nodes made, a batch at a time, until the process ends.
    pub(super) fn follow(
        self: &Arc<Self>,
        from: String,
        apply: impl Fn(Vec<Ban>) + Send + Sync + 'static,
    ) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<StreamEntry>>(16);
        self.follow_stream(format!("{}:purges", self.cfg.namespace), from, tx);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            while let Some(entries) = rx.recv().await {
                let bans: Vec<Ban> = (entries.into_iter())
                    .filter(|e| e.field("node") != me.node)
                    .map(|e| Ban {
                        kind: e.field("kind").into(),
                        target: e.field("target").into(),
                        at_ms: e.field("at").parse().unwrap_or(0),
                    })
                    .collect();
                me.stats
                    .purges_received
                    .fetch_add(bans.len() as u64, Ordering::Relaxed);
                if !bans.is_empty() {
                    apply(bans);
                }
            }
        });
    }

    /// Reads `stream` from after the entry `from`, for ever, on a connection of its own (XREAD
    /// blocks it), sending each batch of entries to `tx` (waiting when its reader is behind);
    /// ends when `tx`'s receiver is gone.
    fn follow_stream(
        self: &Arc<Self>,
        stream: String,
        from: String,
        tx: tokio::sync::mpsc::Sender<Vec<StreamEntry>>,
    ) {
        let me = Arc::clone(self);
        let reader = self.client.clone_new();
        self.watch(&reader, "stream");
        reader.connect();
        // Blocks up to a second on the server: beyond the commands' timeout.
        let reader = reader.with_options(&Options {
            timeout: Some(Duration::from_secs(3)),
            ..Default::default()
        });
        tokio::spawn(async move {
            let mut last = from;
            while !tx.is_closed() {
                if !reader.is_connected() {
                    // Connecting in the background: wait for it, sending nothing.
                    let _ = tokio::time::timeout(Duration::from_secs(1), reader.wait_for_connect())
                        .await;
                    continue;
                }
                type Records = Vec<(String, Vec<(String, String)>)>;
                let read = reader.xread::<Value, _, _>(
                    Some(1000),
                    Some(1000),
                    stream.clone(),
                    last.clone(),
                );
                let got =
                    tokio::time::timeout(Duration::from_secs(3) + me.cfg.timeout.0, read).await;
                let value = match got {
                    Ok(Ok(v)) => v,
                    Ok(Err(e)) => {
                        me.failed("XREAD", &e.to_string());
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    }
                    Err(_) => {
                        me.failed("XREAD", "timed out");
                        continue;
                    }
                };
                if value.is_null() {
                    continue;
                }
                let Ok(mut streams) = value
                    .flatten_array_values(2)
                    .convert::<Vec<(String, Records)>>()
                else {
                    continue;
                };
                let Some((_, records)) = streams.pop() else {
                    continue;
                };
                let Some((id, _)) = records.last() else {
                    continue;
                };
                last = id.clone();
                let entries = (records.into_iter())
                    .map(|(id, fields)| StreamEntry { id, fields })
                    .collect();
                if tx.send(entries).await.is_err() {
                    return;
                }
            }
        });
    }

    /// The replicated log `name` (see [`SharedLog`]).
    pub(super) fn log(self: &Arc<Self>, name: &str) -> SharedLog {
        // One hash slot for both keys (a cluster runs the scripts on one node).
        let tag = format!("{{{}:log:{name}}}", self.cfg.namespace);
        SharedLog {
            shared: Arc::clone(self),
            stream: format!("{tag}:changes"),
            state: format!("{tag}:state"),
        }
    }
}

/// One entry of a stream: its id (`<ms>-<n>`) and fields.
#[derive(Debug, Clone)]
pub struct StreamEntry {
    pub id: String,
    fields: Vec<(String, String)>,
}

impl StreamEntry {
    /// A field's value ("" when absent).
    pub fn field(&self, name: &str) -> &str {
        (self.fields.iter())
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// Changes kept in a replicated log's stream for nodes that were away.
const LOG_CAP: i64 = 100_000;

/// A log of keyed text values (push records) every node shares: each change is appended to a
/// stream and applied to a hash of the latest values in one script, so that a new node can
/// start from the hash and follow the stream from the point the hash was read at.
pub struct SharedLog {
    shared: Arc<Shared>,
    stream: String,
    state: String,
}

/// A new node's starting point: the latest value of every key, and the stream id it reflects.
pub struct Snapshot {
    pub at: String,
    pub values: Vec<(String, String)>,
}

impl SharedLog {
    /// This node's name in the entries it appends (field `node`).
    pub fn node(&self) -> &str {
        &self.shared.node
    }

    /// Appends a change of `key` (its new value, or `None` when deleted), numbered `n` by this
    /// node (field `n`); the entry's stream id, or `None` when the shared tier did not take it.
    pub async fn append(&self, key: &str, value: Option<&str>, n: u64) -> Option<String> {
        const APPEND: &str = "local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', \
             'node', ARGV[2], 'key', ARGV[3], 'value', ARGV[4], 'deleted', ARGV[5], 'n', ARGV[6]) \
             if ARGV[5] == '1' then redis.call('HDEL', KEYS[2], ARGV[3]) \
             else redis.call('HSET', KEYS[2], ARGV[3], ARGV[4]) end return id";
        let args = vec![
            LOG_CAP.to_string(),
            self.shared.node.clone(),
            key.to_string(),
            value.unwrap_or("").to_string(),
            if value.is_none() { "1" } else { "0" }.to_string(),
            n.to_string(),
        ];
        let keys = vec![self.stream.clone(), self.state.clone()];
        let eval = self
            .shared
            .client
            .eval::<String, _, _, _>(APPEND, keys, args);
        self.shared.run("EVAL", eval).await
    }

    /// The latest value of every key and the stream id they reflect.
    pub async fn snapshot(&self) -> Option<Snapshot> {
        const SNAPSHOT: &str =
            "local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1) \
             local at = '0-0' if #last > 0 then at = last[1][1] end \
             return {at, redis.call('HGETALL', KEYS[2])}";
        let keys = vec![self.stream.clone(), self.state.clone()];
        let eval = self
            .shared
            .client
            .eval::<Value, _, _, _>(SNAPSHOT, keys, Vec::<String>::new());
        let value = self.shared.run("EVAL", eval).await?;
        let (at, flat): (String, Vec<String>) = value.convert().ok()?;
        let values = flat
            .chunks_exact(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect();
        Some(Snapshot { at, values })
    }

    /// Follows the log from after the entry `from`: every batch of entries (this node's own
    /// included) is sent to `tx`, in order.
    pub fn follow(&self, from: String, tx: tokio::sync::mpsc::Sender<Vec<StreamEntry>>) {
        self.shared.follow_stream(self.stream.clone(), from, tx);
    }
}

/// `url` with the password in it (`scheme://user:password@host`) replaced by `***`, for logs.
fn without_password(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    let Some(at) = url[start..end].rfind('@').map(|i| start + i) else {
        return url.to_string();
    };
    match url[start..at].find(':').map(|i| start + i) {
        Some(colon) => format!("{}:***{}", &url[..colon], &url[at..]),
        None => format!("{}***{}", &url[..start], &url[at..]),
    }
}

/// `s` with Redis glob characters escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_not_shown() {
        let shown = super::without_password;
        assert_eq!(shown("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(shown("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(shown("redis://:pw@h:1"), "redis://:***@h:1");
        assert_eq!(shown("redis://tok@h:1"), "redis://***@h:1");
        assert_eq!(
            shown("redis-cluster://u:p@w@a:1?node=b:2"),
            "redis-cluster://u:***@a:1?node=b:2"
        );
    }

    #[test]
    fn globs_are_escaped() {
        assert_eq!(
            super::glob_escape("http://h/a*[b]?"),
            "http://h/a\\*\\[b\\]\\?"
        );
    }
}
