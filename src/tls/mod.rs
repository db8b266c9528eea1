//! HTTPS: a TLS listener's acceptor (rustls: TLS 1.2 and 1.3, ALPN h2 / http/1.1, session
//! resumption by cache and tickets), the handshake bounded in time and counted, a plain-HTTP
//! request to a TLS port answered with a 400 instead of a hang, certificates chosen by SNI and
//! re-read when their files change ([`certs`]), and the self-signed certificate of the quick
//! start and of `self_signed = true` ([`self_signed`]).
//!
//! The server hands each accepted TCP connection to [`Acceptor::accept`] and serves the
//! resulting stream like any other (the connection path is generic over its stream).

pub mod acme;
pub mod certs;
mod self_signed;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache};
use rustls::ServerConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

pub use certs::{CertStore, Error};
pub use self_signed::self_signed;

use crate::config::{CertConfig, Config, TlsConfig, TlsVersion, SELF_SIGNED_DIR};

/// The ALPN protocol of ACME's TLS-ALPN-01 validation handshakes (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// The crypto provider larder's TLS runs on (docs/design.md, "TLS").
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Handshakes of a TLS listener, by outcome.
#[derive(Debug, Default)]
pub struct Counters {
    /// Completed handshakes.
    pub handshakes: AtomicU64,
    /// Handshakes that failed (bad client hello, no common cipher or version, peer gone).
    pub failed: AtomicU64,
    /// Handshakes not done within the header timeout, closed.
    pub timed_out: AtomicU64,
    /// Connections that spoke plain HTTP to the TLS port (answered 400).
    pub plain_http: AtomicU64,
}

/// A snapshot of [`Counters`], summed over listeners.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub handshakes: u64,
    pub failed: u64,
    pub timed_out: u64,
    pub plain_http: u64,
}

impl Counters {
    pub fn snapshot(&self) -> Counts {
        Counts {
            handshakes: self.handshakes.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            plain_http: self.plain_http.load(Ordering::Relaxed),
        }
    }
}

impl std::ops::Add for Counts {
    type Output = Counts;
    fn add(self, o: Counts) -> Counts {
        Counts {
            handshakes: self.handshakes + o.handshakes,
            failed: self.failed + o.failed,
            timed_out: self.timed_out + o.timed_out,
            plain_http: self.plain_http + o.plain_http,
        }
    }
}

/// What a TLS listener accepts connections with.
pub struct Acceptor {
    acceptor: tokio_rustls::TlsAcceptor,
    /// The listener's certificates (to re-read them).
    pub certs: Arc<CertStore>,
    pub counters: Arc<Counters>,
    /// How often the certificate files are checked for changes (zero: never).
    pub watch_interval: Duration,
    /// The listener's ACME service, when its certificate comes from a CA.
    pub acme: Option<Arc<acme::Acme>>,
}

/// The answer to a plain-HTTP request on a TLS port (as nginx's 497 turned 400).
const PLAIN_HTTP_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n\
content-length: 44\r\nconnection: close\r\n\r\nthis port speaks HTTPS: use an https:// URL\n";

/// The first byte of a TLS record carrying a handshake message (the ClientHello).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

impl Acceptor {
    /// Loads the listener's certificates and builds its TLS configuration; `http01` is where
    /// its ACME orders put up HTTP-01 answers.
    /// With `self_signed`, its certificate is made first if it does not exist yet.
    pub fn new(cfg: &TlsConfig, http01: &Arc<acme::Http01>) -> Result<Acceptor, Error> {
        let provider = provider();
        let mut all = cfg.all();
        if cfg.self_signed {
            let dir = if cfg.self_signed_dir.as_os_str().is_empty() {
                std::path::Path::new(SELF_SIGNED_DIR)
            } else {
                cfg.self_signed_dir.as_path()
            };
            let (cert, key) = self_signed(dir)?;
            tracing::info!(
                "self-signed certificate for localhost in {} (curl --cacert {} ...)",
                cert.display(),
                cert.display()
            );
            all.push(CertConfig {
                cert,
                key,
                names: Vec::new(),
            });
        }
        let certs = Arc::new(CertStore::with_acme(
            all,
            cfg.acme.as_ref().map(acme::stored),
            Arc::clone(&provider),
        )?);
        let versions: &[&rustls::SupportedProtocolVersion] = match cfg.min_version {
            TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            TlsVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let mut sc = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(|e| Error::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&certs) as _);
        sc.alpn_protocols = if cfg.http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        if cfg.acme.is_some() {
            sc.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
        }
        let cache = cfg.session_cache.get() as usize;
        sc.session_storage = if cache > 0 {
            ServerSessionMemoryCache::new(cache)
        } else {
            Arc::new(NoServerSessionStorage {})
        };
        if cfg.session_tickets {
            sc.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()
                .map_err(|e| Error::Config(e.to_string()))?;
        } else if cache == 0 {
            // No way to resume: sending TLS 1.3 tickets would only cost the client.
            sc.send_tls13_tickets = 0;
        }
        let acme = (cfg.acme.clone())
            .map(|a| Arc::new(acme::Acme::new(a, Arc::clone(&certs), Arc::clone(http01))));
        Ok(Acceptor {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(sc)),
            acme,
            certs,
            counters: Arc::default(),
            watch_interval: cfg.watch_interval.0,
        })
    }

    /// The TLS handshake of a new connection, within `timeout` (the header timeout): the
    /// stream, and whether ALPN chose HTTP/2. None when it failed, timed out, or the client
    /// spoke plain HTTP (answered 400 and closed); each is counted.
    pub async fn accept(
        &self,
        stream: TcpStream,
        timeout: Duration,
    ) -> Option<(TlsStream<TcpStream>, bool)> {
        let counters = &self.counters;
        let handshake = async {
            let mut first = [0u8; 1];
            match stream.peek(&mut first).await {
                Ok(1) if first[0] != TLS_HANDSHAKE_RECORD => {
                    counters.plain_http.fetch_add(1, Ordering::Relaxed);
                    let mut stream = stream;
                    let _ = stream.write_all(PLAIN_HTTP_ANSWER).await;
                    let _ = stream.shutdown().await;
                    return Err(None);
                }
                Ok(1) => {}
                _ => return Err(Some(io::ErrorKind::UnexpectedEof.into())),
            }
            self.acceptor.accept(stream).await.map_err(Some)
        };
        match tokio::time::timeout(timeout, handshake).await {
            Ok(Ok(mut tls)) => {
                counters.handshakes.fetch_add(1, Ordering::Relaxed);
                let alpn = tls.get_ref().1.alpn_protocol();
                if alpn == Some(ACME_TLS_ALPN) {
                    // A CA's validation: the handshake was the answer; no HTTP follows.
                    let _ = tls.shutdown().await;
                    return None;
                }
                let h2 = alpn == Some(b"h2");
                Some((tls, h2))
            }
            Ok(Err(None)) => None,
            Ok(Err(Some(e))) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                counters.timed_out.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

impl Acceptor {
    /// The TLS configuration of the listener's HTTP/3 endpoint: the same certificates (and their
    /// re-reading), TLS 1.3 only as QUIC requires, ALPN `h3`.
    pub fn quic_tls(&self) -> Result<ServerConfig, Error> {
        let mut sc = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| Error::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&self.certs) as _);
        sc.alpn_protocols = vec![b"h3".to_vec()];
        // QUIC's 0-RTT is not offered: a replayed request could repeat a write.
        sc.max_early_data_size = 0;
        Ok(sc)
    }
}

/// Loads every TLS listener's certificates, as starting would (`larder check`).
pub fn check(cfg: &Config) -> Result<(), Error> {
    for l in &cfg.listeners {
        if let Some(tls) = &l.tls {
            Acceptor::new(tls, &Arc::default()).map_err(|e| match e {
                Error::Config(m) => Error::Config(format!("listener {}: {m}", l.addr)),
                e => e,
            })?;
        }
    }
    Ok(())
}

/// The background service that re-reads a listener's certificates when their files change:
/// new connections get the new ones, open ones keep theirs. A failed read is logged and the
/// certificates in use stay.
pub async fn watch(
    certs: Arc<CertStore>,
    every: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let store = Arc::clone(&certs);
        match tokio::task::spawn_blocking(move || store.reload_if_changed()).await {
            Ok(Ok(true)) => tracing::info!("certificates re-read"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot re-read certificates; serving the ones loaded before")
            }
            Err(e) => tracing::error!(error = %e, "certificate watcher failed"),
        }
    }
}
