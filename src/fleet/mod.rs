//! The fleet: what larder's nodes share through one Redis or Valkey (a server or a cluster,
//! `[cache.shared]`): the connection ([`Fleet`]), signed values (entry records, blobs), blobs
//! other handlers share (image originals), the replicated logs of push records ([`log`]), and
//! the purge stream. The server opens it once at start ([`Fleet::start`], from `[cache.shared]`)
//! and hands it to the cache's shared tier (`cache/shared.rs`, entry records and leases, the
//! purge stream), to images (originals) and to push (`share`) where their handlers are built
//! (a reload keeps the same one); it imports none of them (it knows keys and values, not
//! entries). Client: fred (docs/design.md "Tiers").
//!
//! Keys, under the configured namespace `ns`:
//!
//! - `ns:e:<url key>`, `ns:l:<url key>`, `ns:t:<tag>`: the cache's shared tier (entry records,
//!   leases, tag indexes: `cache/shared.rs`);
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
//! record carries its CRC-32 (`cache/record.rs`), an image original is checked against its MD5
//! name (`images/storage.rs`); with a fleet key (`shared_key`) every entry record and blob is
//! written as `b"LDS1" | HMAC-SHA256 | value`, the MAC over the namespace, the kind, the key it
//! is stored under and the value (so a record copied to another key fails), and anything
//! unsigned or signed otherwise is refused (counted in `refused`): write access to Redis is not
//! write access to every node's responses. Not covered, with or without the key: leases, tag
//! indexes and the purge stream (a forged entry costs origin fetches, not a response), and the
//! replicated logs of push records (docs/scaling.md).

pub mod log;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scan::Scanner;
use futures_util::StreamExt;

use aws_lc_rs::{constant_time, hmac};

use crate::config::SharedConfig;

pub use log::{SharedLog, Snapshot, StreamEntry};

/// Purges kept in the stream for nodes that were away.
const STREAM_CAP: i64 = 10_000;

/// What a value signed with the fleet key starts with, before its MAC.
const SIGNED: &[u8; 4] = b"LDS1";
/// The MAC's length (HMAC-SHA256).
const MAC: usize = 32;

/// What a signed value is: an entry record or a blob (part of what the MAC covers).
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Entry,
    Blob,
}

/// The connection to the fleet's Redis, and what is said through it.
pub struct Fleet {
    client: Client,
    cfg: SharedConfig,
    cluster: bool,
    /// This process's name in purge messages, log entries and lease tokens.
    node: String,
    last_warning: std::sync::Mutex<Option<Instant>>,
    /// The fleet key: every value written is signed with it, every value read must be.
    signer: Option<hmac::Key>,
    /// The server's URL as logs show it (no password).
    shown_url: String,
    /// What went through it (read by the cache's tier counts).
    pub counts: Counts,
}

/// What the connection did since start, counted as it happens.
#[derive(Default)]
pub struct Counts {
    /// Commands that failed or timed out.
    pub errors: AtomicU64,
    /// Values refused for their signature (`shared_key`).
    pub refused: AtomicU64,
    /// Purges sent to and received from the other nodes.
    pub purges_sent: AtomicU64,
    pub purges_received: AtomicU64,
    /// Fleet-wide rate limits decided on this node alone because Redis was away
    /// (`rules/rate.rs`).
    pub local_decisions: AtomicU64,
}

/// Why the connection could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("shared tier: {0}")]
pub struct OpenError(String);

impl Fleet {
    /// The fleet `cfg` (`[cache.shared]`) names, as the server opens it once at start and hands
    /// it to the cache, images and push: connecting, waited for 2 s at most (a Redis that is
    /// down delays the start by that much, then is connected to in the background).
    pub async fn start(cfg: &SharedConfig) -> Result<Arc<Fleet>, OpenError> {
        let fleet = Fleet::connect(cfg)?;
        if !fleet.connected(Duration::from_secs(2)).await {
            tracing::warn!(
                server = fleet.shown_url(),
                "shared tier not reachable at start; serving without it until it is \
                 (connecting in the background)"
            );
        }
        Ok(Arc::new(fleet))
    }

    /// A client for the configured server or cluster, connecting (and reconnecting) in the
    /// background with backoff: an unreachable server at start is not an error, only a tier
    /// that misses until it comes.
    pub fn connect(cfg: &SharedConfig) -> Result<Fleet, OpenError> {
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
        let fleet = Fleet {
            client,
            cfg: cfg.clone(),
            cluster,
            node: format!("{:x}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff),
            last_warning: std::sync::Mutex::new(None),
            signer,
            shown_url,
            counts: Counts::default(),
        };
        fleet.watch(&fleet.client, "commands");
        fleet.client.connect();
        Ok(fleet)
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
    pub async fn connected(&self, within: Duration) -> bool {
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
    pub fn is_connected(&self) -> bool {
        self.client.is_connected()
    }

    /// The server's URL as logs show it.
    pub fn shown_url(&self) -> &str {
        &self.shown_url
    }

    /// This process's name in purge messages, log entries and lease tokens.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The settings it was opened with.
    pub fn config(&self) -> &SharedConfig {
        &self.cfg
    }

    /// The client, for commands of the users' own (run them through [`Fleet::run`]).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The key `ns:<kind>:<rest>`.
    pub fn key(&self, kind: &str, rest: &str) -> String {
        format!("{}:{kind}:{rest}", self.cfg.namespace)
    }

    /// Runs one command within the timeout; a failure is counted, logged now and then, and
    /// `None`. Not connected, the command is not sent (nothing waits, nothing is counted): `None`.
    pub async fn run<T>(
        &self,
        what: &str,
        command: impl Future<Output = FredResult<T>>,
    ) -> Option<T> {
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
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
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

    /// `value` as it is written under `name`: signed when there is a fleet key.
    pub fn seal(&self, kind: Kind, name: &str, value: Bytes) -> Bytes {
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
    pub fn open(&self, kind: Kind, name: &str, stored: Bytes) -> Option<Bytes> {
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
        self.counts.refused.fetch_add(1, Ordering::Relaxed);
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

    /// A blob stored by [`Fleet::put_blob`] (an image original), if any.
    pub async fn get_blob(&self, name: &str) -> Option<Bytes> {
        let k = self.key("b", name);
        let stored: Bytes = self.run("GET", self.client.get(k)).await.flatten()?;
        self.open(Kind::Blob, name, stored)
    }

    /// Stores a blob that does not expire (signed with the fleet key, if any); whether the
    /// server took it.
    pub async fn put_blob(&self, name: &str, data: Bytes) -> bool {
        let k = self.key("b", name);
        let data = self.seal(Kind::Blob, name, data);
        let set = self.client.set::<(), _, _>(k, data, None, None, false);
        self.run("SET", set).await.is_some()
    }

    pub async fn delete_blob(&self, name: &str) {
        let k = self.key("b", name);
        let _ = self.run("DEL", self.client.del::<i64, _>(k)).await;
    }

    /// Tells every node (through the purge stream) of a purge made here: `fields` describe it
    /// (this node's name is added as `node`).
    pub async fn announce_purge(&self, fields: Vec<(&'static str, String)>) {
        self.counts.purges_sent.fetch_add(1, Ordering::Relaxed);
        let mut all = vec![("node", self.node.clone())];
        all.extend(fields);
        let stream = format!("{}:purges", self.cfg.namespace);
        let add = self.client.xadd::<String, _, _, _, _>(
            stream,
            false,
            ("MAXLEN", "~", STREAM_CAP),
            "*",
            all,
        );
        let _ = self.run("XADD", add).await;
    }

    /// Every purge the stream holds (what was purged while this node was away), and the id
    /// of the last: read at start, before serving. `None` when Redis did not answer.
    pub async fn purges_so_far(&self) -> Option<(String, Vec<StreamEntry>)> {
        type Records = Vec<(String, Vec<(String, String)>)>;
        let stream = format!("{}:purges", self.cfg.namespace);
        let range =
            self.client
                .xrange::<Records, _, _, _>(stream, "-", "+", Some(STREAM_CAP as u64));
        let records = self.run("XRANGE", range).await?;
        let last = records
            .last()
            .map_or_else(|| "0-0".to_string(), |(id, _)| id.clone());
        let entries = (records.into_iter())
            .map(|(id, fields)| StreamEntry::new(id, fields))
            .collect();
        Some((last, entries))
    }

    /// Follows the purge stream after the entry `from`, calling `apply` with the purges other
    /// nodes made, a batch at a time, until the process ends.
    pub fn follow_purges(
        self: &Arc<Self>,
        from: String,
        apply: impl Fn(Vec<StreamEntry>) + Send + Sync + 'static,
    ) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<StreamEntry>>(16);
        self.follow_stream(format!("{}:purges", self.cfg.namespace), from, tx);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            while let Some(entries) = rx.recv().await {
                let others: Vec<StreamEntry> = (entries.into_iter())
                    .filter(|e| e.field("node") != me.node)
                    .collect();
                me.counts
                    .purges_received
                    .fetch_add(others.len() as u64, Ordering::Relaxed);
                if !others.is_empty() {
                    apply(others);
                }
            }
        });
    }

    /// The replicated log `name` (see [`SharedLog`]).
    pub fn log(self: &Arc<Self>, name: &str) -> SharedLog {
        SharedLog::new(Arc::clone(self), name)
    }

    /// Keys starting with `prefix`, on every primary of a cluster (at most a bounded time).
    pub async fn scan(&self, prefix: &str) -> Vec<String> {
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

    /// Reads `stream` from after the entry `from`, for ever, on a connection of its own (XREAD
    /// blocks it), sending each batch of entries to `tx` (waiting when its reader is behind);
    /// ends when `tx`'s receiver is gone.
    pub(crate) fn follow_stream(
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
                    .map(|(id, fields)| StreamEntry::new(id, fields))
                    .collect();
                if tx.send(entries).await.is_err() {
                    return;
                }
            }
        });
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
