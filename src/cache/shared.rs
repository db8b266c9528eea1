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
//! - `ns:purges`: a stream of purges (capped), which every node follows to apply each to its
//!   memory and disk, and reads from where it stopped after a disconnection.
//!
//! Every command is bounded by `timeout`: when Redis is down or slow, a command fails, is
//! counted and logged (once per ten seconds), and larder goes on as if there were no shared
//! tier.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scan::Scanner;
use futures_util::StreamExt;

use super::bans::Ban;
use super::key::CacheKey;
use super::tiers::Stats;
use super::Purge;
use crate::config::SharedConfig;

/// Purges kept in the stream for nodes that were away.
const STREAM_CAP: i64 = 10_000;

/// The shared store.
pub(super) struct Shared {
    client: Client,
    cfg: SharedConfig,
    cluster: bool,
    /// This process's name in purge messages and lease tokens.
    node: String,
    leases: AtomicU64,
    last_warning: std::sync::Mutex<Option<Instant>>,
    pub(super) stats: Stats,
}

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
    /// background: an unreachable server at start is not an error, only a tier that misses.
    pub(super) fn connect(cfg: &SharedConfig) -> Result<Shared, OpenError> {
        let url = cfg.client_url();
        let config = Config::from_url(&url).map_err(|e| OpenError(format!("{url}: {e}")))?;
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
            .set_policy(ReconnectPolicy::new_constant(0, 250))
            .build()
            .map_err(|e| OpenError(e.to_string()))?;
        client.connect();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        Ok(Shared {
            client,
            cfg: cfg.clone(),
            cluster,
            node: format!("{:x}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff),
            leases: AtomicU64::new(0),
            last_warning: std::sync::Mutex::new(None),
            stats: Stats::default(),
        })
    }

    fn key(&self, kind: &str, rest: &str) -> String {
        format!("{}:{kind}:{rest}", self.cfg.namespace)
    }

    /// Runs one command within the timeout; a failure is counted, logged now and then, and
    /// `None`.
    async fn run<T>(&self, what: &str, command: impl Future<Output = FredResult<T>>) -> Option<T> {
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
                command = what,
                error = why,
                "shared tier unavailable; serving from memory, disk and origin"
            );
        }
    }

    /// The record stored under `key`, if any.
    pub(super) async fn read(&self, key: &CacheKey) -> Option<Bytes> {
        let k = self.key("e", key.as_str());
        let found: Option<Bytes> = self.run("GET", self.client.get(k)).await.flatten();
        let counter = match found {
            Some(_) => &self.stats.hits,
            None => &self.stats.misses,
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
                    return Leasing::Held(Lease {
                        shared: Arc::clone(self),
                        key: lk,
                        token,
                    })
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
                if let Some(record) = self.read_quiet(key).await {
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

    /// A read while waiting on a lease (not counted as a miss each time).
    async fn read_quiet(&self, key: &CacheKey) -> Option<Bytes> {
        let k = self.key("e", key.as_str());
        self.run("GET", self.client.get(k)).await.flatten()
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
        self.run("GET", self.client.get(k)).await.flatten()
    }

    /// Stores a blob that does not expire; whether the server took it.
    pub(super) async fn put_blob(&self, name: &str, data: Bytes) -> bool {
        let k = self.key("b", name);
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

    /// Follows the purge stream, from its start (a restarted node learns what was purged while
    /// it was away), calling `apply` with the purges other nodes made, a batch at a time, until
    /// the process ends.
    pub(super) fn follow(self: &Arc<Self>, apply: impl Fn(Vec<Ban>) + Send + Sync + 'static) {
        let me = Arc::clone(self);
        let reader = self.client.clone_new();
        reader.connect();
        // Blocks up to a second on the server: beyond the commands' timeout.
        let reader = reader.with_options(&Options {
            timeout: Some(Duration::from_secs(3)),
            ..Default::default()
        });
        tokio::spawn(async move {
            let stream = format!("{}:purges", me.cfg.namespace);
            let mut last = "0-0".to_string();
            loop {
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
                let mut bans = Vec::with_capacity(records.len());
                for (id, fields) in records {
                    last = id;
                    let field = |name: &str| {
                        fields
                            .iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    };
                    if field("node") == me.node {
                        continue;
                    }
                    me.stats.purges_received.fetch_add(1, Ordering::Relaxed);
                    bans.push(Ban {
                        kind: field("kind"),
                        target: field("target"),
                        at_ms: field("at").parse().unwrap_or(0),
                    });
                }
                if !bans.is_empty() {
                    apply(bans);
                }
            }
        });
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
    fn globs_are_escaped() {
        assert_eq!(
            super::glob_escape("http://h/a*[b]?"),
            "http://h/a\\*\\[b\\]\\?"
        );
    }
}
