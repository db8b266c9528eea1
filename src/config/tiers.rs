//! The cache tiers below memory (`[cache.disk]`, `[cache.shared]`): a bounded on-disk store kept
//! across restarts, and a tier shared by every node through Redis or Valkey (`crate::cache`).

use std::path::PathBuf;

use serde::Deserialize;

use super::units::{ByteSize, Dur, GIB, MIB};

/// `[cache.disk]`: responses written to a bounded store on disk, read back on a memory miss
/// (also after a restart).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    /// Directory of the store (created if missing). One larder process per directory.
    pub dir: PathBuf,
    /// Bytes the store may take on disk; the oldest blocks are reclaimed beyond it.
    #[serde(default = "DiskConfig::default_max_size")]
    pub max_size: ByteSize<{ 64 * MIB }>,
    /// Which responses are written: `all` (every response stored in memory, so that a restart
    /// keeps them) or `evicted` (only those that fall out of memory).
    #[serde(default)]
    pub write: DiskWrite,
}

impl DiskConfig {
    fn default_max_size() -> ByteSize<{ 64 * MIB }> {
        ByteSize(GIB)
    }

    /// The quick-start form (`--disk DIR`).
    pub fn at(dir: PathBuf) -> DiskConfig {
        DiskConfig {
            dir,
            max_size: Self::default_max_size(),
            write: DiskWrite::All,
        }
    }
}

/// When the disk tier is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskWrite {
    #[default]
    All,
    Evicted,
}

/// `[cache.shared]`: a tier every node shares, in Redis or Valkey (one server or a cluster).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedConfig {
    /// `redis://host:port[/db]`, or a cluster: `redis+cluster://host:port[,host:port...]`
    /// (or further nodes as `?node=host:port`); user and password in the URL as usual.
    #[serde(default)]
    pub url: Option<String>,
    /// A cluster's nodes, `host:port` each (instead of `url`).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// The longest any one command may take; beyond it the command counts as failed and larder
    /// goes on without the shared tier (memory, disk, origin).
    #[serde(default = "SharedConfig::default_timeout")]
    pub timeout: Dur<1, 60_000>,
    /// How long a node filling a URL holds its lease: other nodes missing the URL wait (at most
    /// this long) for its response instead of fetching it too.
    #[serde(default = "SharedConfig::default_lease")]
    pub lease: Dur<10, 600_000>,
    /// Prefix of every key larder writes, so that several fleets can share one server.
    #[serde(default = "SharedConfig::default_namespace")]
    pub namespace: String,
    /// Largest response written to the shared tier (all its encodings together).
    #[serde(default = "SharedConfig::default_max_object")]
    pub max_object_size: ByteSize<1, { 512 * MIB }>,
    /// The fleet key (at least 16 bytes, the same on every node): every node signs what it
    /// writes with it (HMAC-SHA256) and refuses what is not signed with it, so that write
    /// access to Redis is not write access to every node's responses.
    #[serde(default)]
    pub shared_key: Option<String>,
}

/// The shortest fleet key taken.
pub const MIN_SHARED_KEY: usize = 16;

impl SharedConfig {
    fn default_timeout() -> Dur<1, 60_000> {
        Dur(std::time::Duration::from_millis(100))
    }

    fn default_lease() -> Dur<10, 600_000> {
        Dur(std::time::Duration::from_secs(5))
    }

    fn default_namespace() -> String {
        "larder".into()
    }

    fn default_max_object() -> ByteSize<1, { 512 * MIB }> {
        ByteSize(16 * MIB)
    }

    /// The quick-start form (`--shared URL`).
    pub fn at(url: String) -> SharedConfig {
        SharedConfig {
            url: Some(url),
            nodes: Vec::new(),
            timeout: Self::default_timeout(),
            lease: Self::default_lease(),
            namespace: Self::default_namespace(),
            max_object_size: Self::default_max_object(),
            shared_key: None,
        }
    }

    /// Why the settings name no server, or a server in a form the client cannot use.
    pub fn check(&self) -> Result<(), String> {
        if let Some(key) = &self.shared_key {
            if key.len() < MIN_SHARED_KEY {
                return Err(format!(
                    "`shared_key` is {} bytes: it needs at least {MIN_SHARED_KEY} \
                     (for example `openssl rand -hex 32`)",
                    key.len()
                ));
            }
        }
        match (&self.url, self.nodes.is_empty()) {
            (None, true) => Err("set `url` (redis://host:port) or `nodes`".into()),
            (Some(_), false) => Err("set `url` or `nodes`, not both".into()),
            (Some(url), true) => {
                let scheme = url.split("://").next().unwrap_or("");
                let known = [
                    "redis",
                    "redis+cluster",
                    "redis-cluster",
                    "valkey",
                    "valkey-cluster",
                ];
                if !url.contains("://") || !known.contains(&scheme) {
                    return Err(format!(
                        "`{url}` is not a Redis URL: redis://host:port or \
                         redis+cluster://host:port (TLS to Redis is not built in)"
                    ));
                }
                Ok(())
            }
            (None, false) => match self.nodes.iter().find(|n| !n.contains(':')) {
                Some(n) => Err(format!("node `{n}` is not host:port")),
                None => Ok(()),
            },
        }
    }

    /// The client's URL: `+cluster` schemes and `nodes` written as the client reads them
    /// (`redis-cluster://first?node=second&node=third`).
    pub fn client_url(&self) -> String {
        match &self.url {
            Some(url) => {
                let url = url.replacen("redis+cluster://", "redis-cluster://", 1);
                // `redis+cluster://a:1,b:2,c:3[/...]`: the nodes after the first as `?node=`.
                match url.strip_prefix("redis-cluster://") {
                    Some(rest) if rest.split(['/', '?']).next().unwrap_or("").contains(',') => {
                        let end = rest.find(['/', '?']).unwrap_or(rest.len());
                        let (hosts, tail) = rest.split_at(end);
                        let mut hosts = hosts.split(',');
                        let mut out =
                            format!("redis-cluster://{}{tail}", hosts.next().unwrap_or(""));
                        for h in hosts {
                            out.push(if out.contains('?') { '&' } else { '?' });
                            out.push_str("node=");
                            out.push_str(h);
                        }
                        out
                    }
                    _ => url,
                }
            }
            None => {
                let mut url = format!("redis-cluster://{}", self.nodes[0]);
                for (i, n) in self.nodes[1..].iter().enumerate() {
                    url.push(if i == 0 { '?' } else { '&' });
                    url.push_str("node=");
                    url.push_str(n);
                }
                url
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let mut s = SharedConfig::at("redis+cluster://a:1".into());
        assert!(s.check().is_ok());
        assert_eq!(s.client_url(), "redis-cluster://a:1");
        s.url = Some("redis+cluster://a:1,b:2,c:3".into());
        assert_eq!(s.client_url(), "redis-cluster://a:1?node=b:2&node=c:3");
        s.url = Some("redis+cluster://u:p@a:1,b:2".into());
        assert_eq!(s.client_url(), "redis-cluster://u:p@a:1?node=b:2");
        s.url = Some("http://a".into());
        assert!(s.check().unwrap_err().contains("not a Redis URL"));
        s.url = None;
        s.nodes = vec!["a:1".into(), "b:2".into(), "c:3".into()];
        assert!(s.check().is_ok());
        assert_eq!(s.client_url(), "redis-cluster://a:1?node=b:2&node=c:3");
        s.nodes.push("d".into());
        assert!(s.check().is_err());
        s.nodes.pop();
        s.shared_key = Some("short".into());
        assert!(s.check().unwrap_err().contains("at least 16"));
        s.shared_key = Some("0123456789abcdef".into());
        assert!(s.check().is_ok());
    }
}
