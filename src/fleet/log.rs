//! A replicated log of keyed text values in the fleet's Redis (push records of a route shared by
//! every node, `push/replicate.rs`): a stream of changes and a hash of the latest values.

use std::sync::Arc;

use fred::prelude::*;

use super::Fleet;

/// One entry of a stream: its id (`<ms>-<n>`) and fields.
#[derive(Debug, Clone)]
pub struct StreamEntry {
    pub id: String,
    fields: Vec<(String, String)>,
}

impl StreamEntry {
    pub(super) fn new(id: String, fields: Vec<(String, String)>) -> StreamEntry {
        StreamEntry { id, fields }
    }

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
    shared: Arc<Fleet>,
    stream: String,
    state: String,
}

/// A new node's starting point: the latest value of every key, and the stream id it reflects.
pub struct Snapshot {
    pub at: String,
    pub values: Vec<(String, String)>,
}

impl SharedLog {
    pub(super) fn new(fleet: Arc<Fleet>, name: &str) -> SharedLog {
        // One hash slot for both keys (a cluster runs the scripts on one node).
        let tag = format!("{{{}:log:{name}}}", fleet.config().namespace);
        SharedLog {
            shared: fleet,
            stream: format!("{tag}:changes"),
            state: format!("{tag}:state"),
        }
    }

    /// This node's name in the entries it appends (field `node`).
    pub fn node(&self) -> &str {
        self.shared.node()
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
            self.shared.node().to_string(),
            key.to_string(),
            value.unwrap_or("").to_string(),
            if value.is_none() { "1" } else { "0" }.to_string(),
            n.to_string(),
        ];
        let keys = vec![self.stream.clone(), self.state.clone()];
        let eval = self
            .shared
            .client()
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
        let eval =
            self.shared
                .client()
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
