//! The `push` handler's settings (`push = { dir = "..." }` on a route): live JSON records that
//! clients write over HTTP and subscribe to over SSE or WebSocket (`crate::push`).

use std::path::PathBuf;

use serde::Deserialize;

use super::units::{Bounded, ByteSize, Dur, HOUR_MS, KIB, MIB};

/// A push route: its records, who may write and read them, and the limits of its subscribers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushConfig {
    /// Directory of the route's records and change log (created at start if missing, 0700).
    pub dir: PathBuf,
    /// The bearer token writes need (PUT, PATCH, DELETE). With neither `token` nor `jwt`,
    /// every write is refused (403): a push route is never writable by anyone by default.
    #[serde(default)]
    pub token: Option<String>,
    /// JSON Web Tokens that may write (and, with `read_needs_jwt`, read) the ids their claims
    /// name.
    #[serde(default)]
    pub jwt: Option<JwtConfig>,
    /// Share the route's records with every node through the shared tier (`[cache.shared]`):
    /// a change written on any node reaches the subscribers of all of them.
    #[serde(default)]
    pub share: bool,
    /// Reads and subscriptions need a JWT whose `larder.subscribe` patterns cover them
    /// (otherwise they are public).
    #[serde(default)]
    pub read_needs_jwt: bool,
    /// Largest record (its JSON text); larger writes get 413 before their body is read whole.
    #[serde(default = "PushConfig::default_max_record")]
    pub max_record_size: ByteSize<2, { 64 * MIB }>,
    /// Changes kept for resuming subscribers (`Last-Event-ID`); an older id gets a `reset`.
    #[serde(default = "PushConfig::default_history")]
    pub history: Bounded<1, 10_000_000>,
    /// Bytes of the values the history holds at most (the JSON text of each change's values
    /// before and after); the oldest changes are dropped beyond it.
    #[serde(default = "PushConfig::default_history_bytes")]
    pub history_bytes: ByteSize<{ 64 * KIB }>,
    /// Events a subscriber may have waiting; one that falls further behind gets a `reset`
    /// event and is closed (it resumes from the history when it reconnects).
    #[serde(default = "PushConfig::default_queue")]
    pub queue: Bounded<1, 1_000_000>,
    /// Bytes of events a subscriber may have waiting (per pattern and filter subscribed to);
    /// one that falls further behind is reset like one past `queue`.
    #[serde(default = "PushConfig::default_queue_bytes")]
    pub queue_bytes: ByteSize<{ 64 * KIB }>,
    /// A comment line sent to every SSE subscriber this often, so that proxies in between do
    /// not cut idle streams (and WebSocket pings as often).
    #[serde(default = "PushConfig::default_heartbeat")]
    pub heartbeat: Dur<100>,
    /// Largest WebSocket message a client may send (frames over it close the socket, 1009).
    #[serde(default = "PushConfig::default_ws_max_message")]
    pub ws_max_message: ByteSize<128, { 64 * MIB }>,
    /// Origins allowed to call the route from a browser (CORS): exact origins or `"*"`.
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// Groups of ids with a maximum count (oldest evicted) or a time to live.
    #[serde(default, rename = "group")]
    pub groups: Vec<GroupConfig>,
    /// `GET` of the route's root from a browser (Accept: text/html) shows a page of live
    /// records.
    #[serde(default)]
    pub demo: bool,
}

/// A group of ids, by pattern (`cars/*`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// The ids of the group: an id pattern (`*` matches one segment or a suffix: `cars/*`).
    #[serde(rename = "match")]
    pub pattern: IdPattern,
    /// Most records the group holds; writing one more removes the least recently written.
    #[serde(default)]
    pub max: Option<Bounded<1, 100_000_000>>,
    /// Records of the group are removed this long after their last write.
    #[serde(default)]
    pub ttl: Option<Dur<1000>>,
}

/// How a push route checks JSON Web Tokens (RFC 7519), as Mercure authorizes publishers: the
/// `larder` claim holds `publish` and `subscribe` lists of id patterns.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The HS256 shared secret.
    #[serde(default)]
    pub secret: Option<String>,
    /// An RS256 public key (PEM file).
    #[serde(default)]
    pub public_key: Option<PathBuf>,
    /// How far a token's `exp` and `nbf` may be off (clocks of the issuer and of larder
    /// disagree): a token is taken until `exp` plus this, and from `nbf` minus this. Whole
    /// seconds (jsonwebtoken counts in seconds), at most an hour.
    #[serde(default = "JwtConfig::default_leeway")]
    pub leeway: Dur<0, HOUR_MS>,
}

impl JwtConfig {
    /// jsonwebtoken's own default.
    fn default_leeway() -> Dur<0, HOUR_MS> {
        Dur(std::time::Duration::from_secs(60))
    }
}

impl PushConfig {
    /// A push route storing under `dir`, with `token` for writes.
    pub fn new_dir(dir: PathBuf, token: Option<String>) -> PushConfig {
        PushConfig {
            share: false,
            dir,
            token,
            jwt: None,
            read_needs_jwt: false,
            max_record_size: Self::default_max_record(),
            history: Self::default_history(),
            history_bytes: Self::default_history_bytes(),
            queue: Self::default_queue(),
            queue_bytes: Self::default_queue_bytes(),
            heartbeat: Self::default_heartbeat(),
            ws_max_message: Self::default_ws_max_message(),
            cors_origins: Vec::new(),
            groups: Vec::new(),
            demo: false,
        }
    }

    fn default_max_record() -> ByteSize<2, { 64 * MIB }> {
        ByteSize(MIB)
    }
    fn default_history() -> Bounded<1, 10_000_000> {
        Bounded(100_000)
    }
    /// With the embedded default's 64 MiB memory cache in mind: a route's history holds
    /// about as much (each value is held parsed beside its text, about as large again).
    fn default_history_bytes() -> ByteSize<{ 64 * KIB }> {
        ByteSize(32 * MIB)
    }
    fn default_queue() -> Bounded<1, 1_000_000> {
        Bounded(1024)
    }
    fn default_queue_bytes() -> ByteSize<{ 64 * KIB }> {
        ByteSize(16 * MIB)
    }
    fn default_heartbeat() -> Dur<100> {
        Dur(std::time::Duration::from_secs(15))
    }
    fn default_ws_max_message() -> ByteSize<128, { 64 * MIB }> {
        ByteSize(64 * 1024)
    }
}

/// Whether `id` is a record id: 1 to 512 bytes of segments separated by `/`, each of
/// `A-Z a-z 0-9 _ - . ~ : @`, none empty, `.` or `..`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 512 && id.split('/').all(valid_segment)
}

fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.~:@".contains(&b))
}

/// A pattern of ids: segments as in an id, where a `*` segment matches any one segment, and a
/// last `*` any number of them (at least one); `*` alone matches every id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdPattern(String);

impl IdPattern {
    /// Every id.
    pub fn all() -> IdPattern {
        IdPattern("*".into())
    }

    pub fn parse(s: &str) -> Result<IdPattern, String> {
        let ok = !s.is_empty()
            && s.len() <= 512
            && s.split('/').all(|seg| seg == "*" || valid_segment(seg));
        if ok {
            Ok(IdPattern(s.to_string()))
        } else {
            Err(format!(
                "`{s}` is not an id pattern (segments of A-Z a-z 0-9 _ - . ~ : @ or `*`, \
                 separated by `/`)"
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `id` is one of the pattern's.
    pub fn matches(&self, id: &str) -> bool {
        let mut pat = self.0.split('/').peekable();
        let mut ids = id.split('/');
        while let Some(p) = pat.next() {
            let last = pat.peek().is_none();
            match ids.next() {
                None => return false,
                Some(_) if p == "*" && last => return true,
                Some(seg) if p == "*" || p == seg => {}
                Some(_) => return false,
            }
        }
        ids.next().is_none()
    }
}

impl<'de> Deserialize<'de> for IdPattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        IdPattern::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_patterns() {
        assert!(valid_id("cars/42"));
        assert!(valid_id("a.b~c:d@e_f-g"));
        for bad in [
            "", "/a", "a/", "a//b", "a/../b", ".", "a b", "é", "a?b", "a%2Fb",
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
        let p = |s| IdPattern::parse(s).unwrap();
        assert!(p("*").matches("x") && p("*").matches("cars/42/wheel"));
        assert!(p("cars/*").matches("cars/42") && p("cars/*").matches("cars/42/w"));
        assert!(!p("cars/*").matches("cars") && !p("cars/*").matches("carsx/1"));
        assert!(p("cars/*/w").matches("cars/1/w") && !p("cars/*/w").matches("cars/1/x"));
        assert!(!p("cars/*/w").matches("cars/1/w/z"));
        assert!(p("cars/1").matches("cars/1") && !p("cars/1").matches("cars/12"));
        assert!(IdPattern::parse("cars/**").is_err() && IdPattern::parse("").is_err());
    }
}
