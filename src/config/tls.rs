//! The settings of HTTPS: a listener's `tls` table (its certificates, chosen by SNI, and how
//! they are re-read), and a route's redirect to HTTPS and HSTS header. Plain data: the server
//! loads the files (`crate::tls`).

use std::path::PathBuf;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::headers::HeaderValueCfg;
use super::units::{Bounded, Dur, HOUR_MS, YEAR_MS};

/// A listener's `tls` table: the listener speaks TLS 1.2 and 1.3, with ALPN choosing HTTP/2 or
/// HTTP/1.1.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The default certificate chain (PEM, leaf first), for clients that send no SNI or a name
    /// no certificate is for. With `key`; or list them under `certificates`.
    pub cert: Option<PathBuf>,
    /// The private key of `cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// More certificates, each chosen for the names it is valid for (its subject alternative
    /// DNS names, exact or `*.` wildcard) or the `names` given. Without `cert`, the first is
    /// the default.
    #[serde(default)]
    pub certificates: Vec<CertConfig>,
    /// Offer HTTP/2 through ALPN (HTTP/1.1 always).
    #[serde(default = "yes")]
    pub http2: bool,
    /// Also serve HTTP/3 (QUIC) on the same address and port over UDP, advertised to TCP clients
    /// with `Alt-Svc`.
    #[serde(default)]
    pub http3: bool,
    /// The oldest protocol version accepted: "1.2" or "1.3".
    #[serde(default)]
    pub min_version: TlsVersion,
    /// How often the certificate and key files are checked for changes; changed files are
    /// re-read and new connections get them (open ones keep theirs). "0s": never.
    #[serde(default = "TlsConfig::default_watch")]
    pub watch_interval: Dur<0, HOUR_MS>,
    /// Sessions kept for resumption by session id (TLS 1.2, and TLS 1.3 stateful tickets);
    /// 0 turns the cache off.
    #[serde(default = "TlsConfig::default_session_cache")]
    pub session_cache: Bounded<0, 10_000_000>,
    /// Resumption by session tickets (encrypted with keys rotated every 6 hours).
    #[serde(default = "yes")]
    pub session_tickets: bool,
    /// Certificates obtained and renewed from an ACME CA (Let's Encrypt).
    pub acme: Option<AcmeConfig>,
    /// Serve a self-signed certificate for localhost, 127.0.0.1 and ::1, made once and kept
    /// under [`SELF_SIGNED_DIR`] (as `--tls-self-signed` does): for trying HTTPS locally. Not
    /// with `cert`, `certificates` or `acme`.
    #[serde(default)]
    pub self_signed: bool,
    /// Where `self_signed` keeps its certificate: `[server] state_dir` plus `tls`, set by
    /// [`super::Config::set_state_dir`] (empty: [`SELF_SIGNED_DIR`]).
    #[serde(skip)]
    pub self_signed_dir: PathBuf,
}

/// Where `self_signed = true` keeps its certificate and key when no state directory was set
/// (relative to the working directory; the default `[server] state_dir` plus `tls`).
pub const SELF_SIGNED_DIR: &str = "larder-state/tls";

/// A listener's `[listener.tls.acme]`: larder obtains a certificate for `domains` from the CA,
/// answering its TLS-ALPN-01 challenge on this listener, keeps it under `state_dir` and renews
/// it before it expires.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeConfig {
    /// The names the certificate is for (DNS names that resolve to this listener, port 443).
    pub domains: Vec<String>,
    /// Contact URLs for the account (`mailto:ops@example.com`).
    #[serde(default)]
    pub contact: Vec<String>,
    /// The CA's ACME directory.
    #[serde(default = "AcmeConfig::default_directory")]
    pub directory: String,
    /// A CA certificate (PEM) to trust for the directory's HTTPS, instead of the system's
    /// (a private or test CA such as pebble).
    pub directory_ca: Option<PathBuf>,
    /// `state_dir` as written, if it was.
    #[serde(default, rename = "state_dir")]
    pub given_state_dir: Option<PathBuf>,
    /// Where the account key, the certificate and its key are kept (0700; keys 0600): the one
    /// given, else `[server] state_dir` plus `acme`, set by [`super::Config::set_state_dir`].
    #[serde(skip)]
    pub state_dir: PathBuf,
    /// Renew when the certificate expires within this long.
    #[serde(default = "AcmeConfig::default_renew_before")]
    pub renew_before: Dur<{ HOUR_MS }, YEAR_MS>,
    /// How often the certificate's expiry is checked (and a failed order retried).
    #[serde(default = "AcmeConfig::default_check_interval")]
    pub check_interval: Dur<100, { 24 * HOUR_MS }>,
    /// How the CA validates the domains: `"tls-alpn-01"` on this listener (port 443), or
    /// `"http-01"` on a plain listener (port 80) answering `/.well-known/acme-challenge/`.
    #[serde(default)]
    pub challenge: AcmeChallenge,
}

/// The ACME challenge larder answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum AcmeChallenge {
    #[default]
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
    #[serde(rename = "http-01")]
    Http01,
}

impl AcmeConfig {
    fn default_directory() -> String {
        "https://acme-v02.api.letsencrypt.org/directory".into()
    }

    fn default_renew_before() -> Dur<{ HOUR_MS }, YEAR_MS> {
        Dur(std::time::Duration::from_secs(30 * 24 * 3600))
    }

    fn default_check_interval() -> Dur<100, { 24 * HOUR_MS }> {
        Dur(std::time::Duration::from_secs(3600))
    }
}

fn yes() -> bool {
    true
}

impl TlsConfig {
    fn default_watch() -> Dur<0, HOUR_MS> {
        Dur(std::time::Duration::from_secs(5))
    }

    fn default_session_cache() -> Bounded<0, 10_000_000> {
        Bounded(10_000)
    }

    /// The TLS settings of the command line's quick start: one certificate and its key.
    pub fn single(cert: PathBuf, key: PathBuf) -> TlsConfig {
        TlsConfig {
            cert: Some(cert),
            key: Some(key),
            certificates: Vec::new(),
            http2: true,
            http3: false,
            min_version: TlsVersion::default(),
            watch_interval: Self::default_watch(),
            session_cache: Self::default_session_cache(),
            session_tickets: true,
            acme: None,
            self_signed: false,
            self_signed_dir: PathBuf::new(),
        }
    }

    /// Why the certificate settings do not go together, and the key to blame: a listener
    /// needs one source of certificates, and `self_signed` is one only alone.
    pub fn certificate_sources_error(&self) -> Option<(&'static str, &'static str)> {
        let others = self.cert.is_some() || !self.certificates.is_empty() || self.acme.is_some();
        if self.self_signed && others {
            return Some((
                "self_signed",
                "`self_signed` makes the listener's only certificate: leave out `cert`, \
                 `certificates` and `acme`, or `self_signed`",
            ));
        }
        if !self.self_signed && !others {
            return Some((
                "certificates",
                "needs a certificate: `cert` and `key`, `certificates`, `acme`, or \
                 `self_signed = true`",
            ));
        }
        None
    }

    /// Every certificate, the default first: `cert` and `key`, then `certificates`.
    pub fn all(&self) -> Vec<CertConfig> {
        let top = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(CertConfig {
                cert: cert.clone(),
                key: key.clone(),
                names: Vec::new(),
            }),
            _ => None,
        };
        top.into_iter()
            .chain(self.certificates.iter().cloned())
            .collect()
    }
}

/// One certificate chain and its key.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The server names (exact, or `*.example.com`) to serve this certificate for; empty: the
    /// DNS names the certificate itself lists.
    #[serde(default)]
    pub names: Vec<String>,
}

/// The oldest TLS version a listener accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum TlsVersion {
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

/// A route's `redirect_https`: answer every request with a permanent redirect (308) to the
/// same URL over HTTPS. `true`, or a table with the HTTPS port when it is not 443.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RedirectConfig {
    pub port: Option<u16>,
}

impl<'de> Deserialize<'de> for RedirectConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RedirectConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, or a table such as { port = 8443 }")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RedirectConfig, E> {
                if v {
                    Ok(RedirectConfig::default())
                } else {
                    Err(E::custom("`false` redirects nothing: leave the key out"))
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RedirectConfig, A::Error> {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Table {
                    port: Option<u16>,
                }
                let t = Table::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RedirectConfig { port: t.port })
            }
        }
        d.deserialize_any(V)
    }
}

/// A route's `hsts`: the `Strict-Transport-Security` value its responses carry on a TLS
/// listener (RFC 6797: never sent over plain HTTP, where browsers ignore it).
pub type HstsConfig = HeaderValueCfg;
