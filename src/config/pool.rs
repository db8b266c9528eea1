//! The settings of upstream pools: a `[pool.NAME]` table (its backends, how one is chosen, how
//! their health is judged, retries, TLS to them), and a proxy route's `upstream` (one URL or a
//! list, an inline pool) or `pool` (a named one). Plain data: `crate::upstream` builds the
//! running pools from it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use http::header::HeaderName;
use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::net::Upstream;
use super::units::{Bounded, Dur, HOUR_MS};

/// A pool of backends that proxy routes share (`[pool.NAME]`), or the inline pool of a route's
/// `upstream`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// The backends: URLs (`"http://10.0.0.1:8080"`) or tables with `url`, `weight`, `backup`.
    pub backends: Vec<BackendConfig>,
    /// How a request's backend is chosen among those up.
    #[serde(default)]
    pub balance: Balance,
    /// What `balance = "hash"` hashes: "uri" (path and query), "client" (the client's address),
    /// "header:NAME" or "cookie:NAME". A request without the header or cookie is balanced
    /// round-robin.
    #[serde(default)]
    pub hash_on: HashOn,
    /// Active health checks; none by default for a named pool, a TCP check for an inline pool
    /// of several backends.
    pub health: Option<HealthConfig>,
    /// Passive health: ejection after consecutive failures seen by real requests.
    #[serde(default)]
    pub passive: PassiveConfig,
    /// Further backends tried for an idempotent request without a body whose exchange failed
    /// before any byte of a response came back (0: none).
    #[serde(default = "PoolConfig::default_retries")]
    pub retries: Bounded<0, 16>,
    /// The longest time spent on one request across its tries; no retry starts after it.
    #[serde(default = "PoolConfig::default_retry_timeout")]
    pub retry_timeout: Dur<1, HOUR_MS>,
    /// At least 1ms (0 failed every connection).
    #[serde(default = "PoolConfig::default_connect_timeout")]
    pub connect_timeout: Dur<1, HOUR_MS>,
    /// Idle keep-alive connections kept per backend.
    #[serde(default = "PoolConfig::default_max_idle")]
    pub max_idle: usize,
    /// How long an idle keep-alive connection is kept.
    #[serde(default = "PoolConfig::default_idle_timeout")]
    pub idle_timeout: Dur<1, HOUR_MS>,
    /// Speak HTTP/2 to the backends: negotiated by ALPN with `https://` backends (HTTP/1.1 if
    /// the backend does not offer it), with prior knowledge (h2c) with `http://` ones. gRPC
    /// needs it.
    #[serde(default)]
    pub http2: bool,
    /// TLS to `https://` backends.
    #[serde(default)]
    pub tls: UpstreamTlsConfig,
}

impl PoolConfig {
    /// A pool of `backends` with every other setting at its default.
    pub fn of(backends: Vec<BackendConfig>) -> PoolConfig {
        PoolConfig {
            backends,
            balance: Balance::default(),
            hash_on: HashOn::default(),
            health: None,
            passive: PassiveConfig::default(),
            retries: Self::default_retries(),
            retry_timeout: Self::default_retry_timeout(),
            connect_timeout: Self::default_connect_timeout(),
            max_idle: Self::default_max_idle(),
            idle_timeout: Self::default_idle_timeout(),
            http2: false,
            tls: UpstreamTlsConfig::default(),
        }
    }
    fn default_retries() -> Bounded<0, 16> {
        Bounded(2)
    }
    fn default_retry_timeout() -> Dur<1, HOUR_MS> {
        Dur(Duration::from_secs(30))
    }
    pub(super) fn default_connect_timeout() -> Dur<1, HOUR_MS> {
        Dur(Duration::from_secs(5))
    }
    pub(super) fn default_max_idle() -> usize {
        1024
    }
    fn default_idle_timeout() -> Dur<1, HOUR_MS> {
        Dur(Duration::from_secs(60))
    }

    /// Whether any backend speaks TLS.
    pub fn uses_tls(&self) -> bool {
        (self.backends.iter()).any(|b| b.url.scheme == http::uri::Scheme::HTTPS)
    }
}

/// One backend of a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    pub url: Upstream,
    /// Its share of requests against the others' (1 to 1000).
    pub weight: u32,
    /// Used only while every other (primary) backend is down.
    pub backup: bool,
}

impl BackendConfig {
    pub fn new(url: Upstream) -> BackendConfig {
        BackendConfig {
            url,
            weight: 1,
            backup: false,
        }
    }
}

impl<'de> Deserialize<'de> for BackendConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            url: Upstream,
            #[serde(default = "one")]
            weight: Bounded<1, 1000>,
            #[serde(default)]
            backup: bool,
        }
        fn one() -> Bounded<1, 1000> {
            Bounded(1)
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Url(String),
            Table(Table),
        }
        match Form::deserialize(d).map_err(|_| {
            de::Error::custom(
                "a backend is a URL (\"http://host:port\") or a table { url, weight, backup }",
            )
        })? {
            Form::Url(s) => Ok(BackendConfig::new(s.parse().map_err(de::Error::custom)?)),
            Form::Table(t) => Ok(BackendConfig {
                url: t.url,
                weight: t.weight.get() as u32,
                backup: t.backup,
            }),
        }
    }
}

/// How a pool chooses a backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Smooth weighted round-robin (nginx's).
    #[default]
    RoundRobin,
    /// The backend with the fewest requests in flight against its weight.
    LeastConn,
    /// Consistent hashing (ketama, nginx's `hash ... consistent`) of `hash_on`: a key stays on
    /// its backend, and adding or removing one moves only that one's share of keys.
    Hash,
}

/// What `balance = "hash"` hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HashOn {
    #[default]
    Uri,
    Client,
    Header(HeaderName),
    Cookie(String),
}

impl<'de> Deserialize<'de> for HashOn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.split_once(':') {
            None if s == "uri" => Ok(HashOn::Uri),
            None if s == "client" => Ok(HashOn::Client),
            Some(("header", name)) => HeaderName::try_from(name.trim())
                .map(HashOn::Header)
                .map_err(|_| de::Error::custom(format!("`{name}` is not a header name"))),
            Some(("cookie", name)) if !name.trim().is_empty() => {
                Ok(HashOn::Cookie(name.trim().to_string()))
            }
            _ => Err(de::Error::custom(format!(
                "`{s}`: expected \"uri\", \"client\", \"header:NAME\" or \"cookie:NAME\""
            ))),
        }
    }
}

/// Active health checks of a pool's backends (`[pool.NAME.health]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// "http" (a GET of `path`, expecting `status`) or "tcp" (a connection opens).
    #[serde(default)]
    pub check: HealthCheck,
    /// The path an HTTP check asks for.
    #[serde(default = "HealthConfig::default_path")]
    pub path: String,
    /// The statuses a passing HTTP check answers (none given: any 2xx or 3xx).
    #[serde(default)]
    pub status: Vec<Bounded<100, 599>>,
    /// The Host an HTTP check sends (default: the backend's host and port).
    pub host: Option<String>,
    /// Time between two checks of a backend.
    #[serde(default = "HealthConfig::default_interval")]
    pub interval: Dur<100, HOUR_MS>,
    /// A check that takes longer fails.
    #[serde(default = "HealthConfig::default_timeout")]
    pub timeout: Dur<1, HOUR_MS>,
    /// Consecutive failed checks that take a backend out.
    #[serde(default = "HealthConfig::default_fall")]
    pub fall: Bounded<1, 100>,
    /// Consecutive passed checks that bring it back.
    #[serde(default = "HealthConfig::default_rise")]
    pub rise: Bounded<1, 100>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            check: HealthCheck::default(),
            path: Self::default_path(),
            status: Vec::new(),
            host: None,
            interval: Self::default_interval(),
            timeout: Self::default_timeout(),
            fall: Self::default_fall(),
            rise: Self::default_rise(),
        }
    }
}

impl HealthConfig {
    fn default_path() -> String {
        "/".into()
    }
    fn default_interval() -> Dur<100, HOUR_MS> {
        Dur(Duration::from_secs(2))
    }
    fn default_timeout() -> Dur<1, HOUR_MS> {
        Dur(Duration::from_secs(1))
    }
    fn default_fall() -> Bounded<1, 100> {
        Bounded(3)
    }
    fn default_rise() -> Bounded<1, 100> {
        Bounded(2)
    }

    /// The TCP check an inline pool of several backends gets.
    pub fn tcp() -> HealthConfig {
        HealthConfig {
            check: HealthCheck::Tcp,
            ..HealthConfig::default()
        }
    }

    /// Whether an HTTP check passes with `status`.
    pub fn passes(&self, status: u16) -> bool {
        if self.status.is_empty() {
            (200..400).contains(&status)
        } else {
            self.status.iter().any(|s| s.get() == i64::from(status))
        }
    }
}

/// The kind of active check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthCheck {
    #[default]
    Http,
    Tcp,
}

/// Passive health (`[pool.NAME.passive]`): a backend whose requests fail `max_fails` times in
/// a row (connection refused or reset, no answer in time, and a 5xx when `on_5xx`) is ejected
/// for `fail_timeout`; then one request probes it, and it takes full traffic again only once
/// that one succeeds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PassiveConfig {
    /// Consecutive failures that eject a backend; 0 turns passive ejection off.
    #[serde(default = "PassiveConfig::default_max_fails")]
    pub max_fails: Bounded<0, 1000>,
    /// How long an ejected backend stays out before its probe.
    #[serde(default = "PassiveConfig::default_fail_timeout")]
    pub fail_timeout: Dur<1, HOUR_MS>,
    /// Whether a 5xx response (500, 502, 503, 504) counts as a failure.
    #[serde(default = "yes")]
    pub on_5xx: bool,
}

fn yes() -> bool {
    true
}

impl Default for PassiveConfig {
    fn default() -> Self {
        PassiveConfig {
            max_fails: Self::default_max_fails(),
            fail_timeout: Self::default_fail_timeout(),
            on_5xx: true,
        }
    }
}

impl PassiveConfig {
    fn default_max_fails() -> Bounded<0, 1000> {
        Bounded(3)
    }
    fn default_fail_timeout() -> Dur<1, HOUR_MS> {
        Dur(Duration::from_secs(10))
    }
}

/// TLS to a pool's `https://` backends (`[pool.NAME.tls]`): certificates are verified against
/// the system's roots (and `ca`) unless `insecure`; the backend's host name is sent as SNI
/// unless `sni` names another.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// More trusted CA certificates (PEM), for backends with a private CA.
    pub ca: Option<PathBuf>,
    /// Skip verifying the backends' certificates (never the default: a man in the middle then
    /// reads everything).
    #[serde(default)]
    pub insecure: bool,
    /// The server name sent and verified, instead of each backend's host.
    pub sni: Option<String>,
    /// A client certificate chain (PEM), for backends that require one; with `client_key`.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// A proxy route's backends: `upstream = "http://..."` or a list (an inline pool), or
/// `pool = "NAME"`.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamRef {
    Inline(Vec<BackendConfig>),
    Pool(String),
}

/// The one or several URLs of `upstream`.
pub(super) fn upstream_list<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<BackendConfig>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        One(BackendConfig),
        Many(Vec<BackendConfig>),
    }
    Ok(Some(
        match Form::deserialize(d).map_err(|_| {
            de::Error::custom("expected a URL (\"http://host:port\") or a list of them")
        })? {
            Form::One(b) => vec![b],
            Form::Many(v) => v,
        },
    ))
}

/// The named pools (`[pool.NAME]`).
pub type Pools = BTreeMap<String, PoolConfig>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_are_urls_or_tables() {
        let p: PoolConfig = toml::from_str(
            "backends = [\"http://127.0.0.1:1\", { url = \"https://b:2\", weight = 3, backup = true }]",
        )
        .unwrap();
        assert_eq!(p.backends.len(), 2);
        assert_eq!(p.backends[0].weight, 1);
        assert!(!p.backends[0].backup);
        assert_eq!(p.backends[1].weight, 3);
        assert!(p.backends[1].backup);
        assert!(p.uses_tls());
        assert!(
            toml::from_str::<PoolConfig>("backends = [{ url = \"http://a:1\", weight = 0 }]")
                .is_err()
        );
    }

    #[test]
    fn hash_on_forms() {
        #[derive(Deserialize)]
        struct T {
            h: HashOn,
        }
        let h = |s: &str| toml::from_str::<T>(&format!("h = \"{s}\"")).map(|t| t.h);
        assert_eq!(h("uri").unwrap(), HashOn::Uri);
        assert_eq!(h("client").unwrap(), HashOn::Client);
        assert_eq!(
            h("header:X-User").unwrap(),
            HashOn::Header(HeaderName::from_static("x-user"))
        );
        assert_eq!(h("cookie:sid").unwrap(), HashOn::Cookie("sid".into()));
        assert!(h("cookie:").is_err());
        assert!(h("path").is_err());
    }

    #[test]
    fn health_status_defaults_to_2xx_and_3xx() {
        let h = HealthConfig::default();
        assert!(h.passes(200) && h.passes(302) && !h.passes(404) && !h.passes(503));
        let h: HealthConfig = toml::from_str("status = [204]").unwrap();
        assert!(h.passes(204) && !h.passes(200));
    }
}
