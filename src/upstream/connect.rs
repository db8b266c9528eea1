//! A pool's HTTP client: keep-alive connections per backend. Plain HTTP/1.1 backends are
//! larder's own connections (`h1.rs`); TLS (rustls through hyper-rustls: the system's roots
//! and the pool's `ca`, SNI, a client certificate, or no verification when the pool says
//! `insecure`) and HTTP/2 go through hyper-util's pooled client. Both answer with an
//! [`Answer`] or a [`SendError`] (in `send_error.rs`, which `h1.rs` imports too) that says
//! whether the connection failed and whether the request may be sent again.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::ResponseFuture;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

pub use super::h1::Checkin;
pub use super::send_error::SendError;
use crate::body::Body;
use crate::config::{PoolConfig, UpstreamTlsConfig};

/// The client of one pool: larder's own HTTP/1.1 connections when no backend speaks TLS or
/// HTTP/2; hyper-util's client with a plain connector for h2c; else one whose connector
/// speaks both.
#[derive(Clone)]
pub enum Client {
    H1(Arc<super::h1::Conns>),
    Plain(hyper_util::client::legacy::Client<Bare<HttpConnector>, Body>),
    Tls(hyper_util::client::legacy::Client<Bare<HttpsConnector<HttpConnector>>, Body>),
}

/// A connector whose connections tell hyper-util nothing beyond HTTP/2 and proxying: hyper-util's
/// TCP connection otherwise attaches its addresses (`HttpInfo`) to every response, which
/// allocates the response's extension map on each proxied request (about 1,100 instructions
/// with its drop) for a value larder never reads.
#[derive(Clone)]
pub struct Bare<C>(C);

impl<C: tower_service::Service<http::Uri>> tower_service::Service<http::Uri> for Bare<C> {
    type Response = BareIo<C::Response>;
    type Error = C::Error;
    type Future = futures_util::future::MapOk<C::Future, fn(C::Response) -> Self::Response>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        futures_util::TryFutureExt::map_ok(self.0.call(uri), BareIo)
    }
}

/// A connection of [`Bare`]: the inner one, reporting no extra information.
pub struct BareIo<T>(T);

impl<T: Connection> Connection for BareIo<T> {
    fn connected(&self) -> Connected {
        let inner = self.0.connected();
        let c = Connected::new().proxy(inner.is_proxied());
        if inner.is_negotiated_h2() {
            c.negotiated_h2()
        } else {
            c
        }
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for BareIo<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for BareIo<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}

impl Client {
    /// Builds the client of `cfg`; an unreadable CA or client certificate is an error naming
    /// the file.
    pub fn new(cfg: &PoolConfig) -> Result<Client, String> {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(cfg.connect_timeout.0));
        http.set_nodelay(true);
        let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
        builder
            .pool_idle_timeout(cfg.idle_timeout.0)
            .pool_max_idle_per_host(cfg.max_idle)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new());
        if !cfg.uses_tls() && !cfg.http2 {
            return Ok(Client::H1(super::h1::Conns::new(cfg)));
        }
        if !cfg.uses_tls() {
            builder.http2_only(true);
            return Ok(Client::Plain(builder.build(Bare(http))));
        }
        http.enforce_http(false);
        let tls = tls_config(&cfg.tls)?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let connector = match &cfg.tls.sni {
            Some(name) => {
                let name = ServerName::try_from(name.clone())
                    .map_err(|_| format!("sni `{name}` is not a DNS name or address"))?;
                connector
                    .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
            }
            None => connector,
        };
        let connector = if cfg.http2 {
            connector.enable_all_versions().wrap_connector(http)
        } else {
            connector.enable_http1().wrap_connector(http)
        };
        Ok(Client::Tls(builder.build(Bare(connector))))
    }

    /// Sends `req` (its URI absolute); the response head comes through the returned future
    /// (boxed: a few bytes for the callers' futures to move).
    pub fn request(&self, req: Request<Body>) -> Sent {
        match self {
            Client::H1(c) => Sent::H1(c.send(req, false)),
            Client::Plain(c) => Sent::Legacy(c.request(req)),
            Client::Tls(c) => Sent::Legacy(c.request(req)),
        }
    }

    /// Sends `req` again after a connection turned out closed: on a new connection where the
    /// client can say so.
    pub fn resend(&self, req: Request<Body>) -> Sent {
        match self {
            Client::H1(c) => Sent::H1(c.send(req, true)),
            _ => self.request(req),
        }
    }
}

/// A response head and, on larder's own connections, the connection to give back once its
/// body is done with.
pub struct Answer {
    response: Response<Incoming>,
    checkin: Option<Checkin>,
}

impl Answer {
    pub(super) fn new(response: Response<Incoming>, checkin: Option<Checkin>) -> Answer {
        Answer { response, checkin }
    }

    pub fn into_parts(self) -> (Response<Incoming>, Option<Checkin>) {
        (self.response, self.checkin)
    }

    pub fn status(&self) -> http::StatusCode {
        self.response.status()
    }
}

/// The future of [`Client::request`].
pub enum Sent {
    H1(super::h1::Sending),
    Legacy(ResponseFuture),
}

impl Future for Sent {
    type Output = Result<Answer, SendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Sent::H1(f) => (f.as_mut().poll(cx))
                .map(|r| r.map(|(response, checkin)| Answer::new(response, Some(checkin)))),
            Sent::Legacy(f) => Pin::new(f).poll(cx).map(|r| match r {
                Ok(response) => Ok(Answer::new(response, None)),
                Err(e) => Err(SendError::Legacy(e)),
            }),
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The system's trusted roots, read once.
fn native_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "reading the system's trusted certificates");
        }
        found.certs
    })
}

fn tls_config(tls: &UpstreamTlsConfig) -> Result<ClientConfig, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if tls.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
    } else {
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(native_roots().iter().cloned());
        if let Some(ca) = &tls.ca {
            let certs = CertificateDer::pem_file_iter(ca)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            if certs.is_empty() {
                return Err(format!("{}: no certificate in it", ca.display()));
            }
            for c in certs {
                roots.add(c).map_err(|e| format!("{}: {e}", ca.display()))?;
            }
        }
        builder.with_root_certificates(roots)
    };
    // ALPN (h2, http/1.1) is hyper-rustls's to set, from the versions enabled.
    let config = match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("{}: {e}", cert.display()))?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("{}: {e}", cert.display()))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(config)
}

/// `insecure = true`: any certificate is accepted (the handshake's signatures are still
/// checked, so the connection is encrypted, but to whoever answers).
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
