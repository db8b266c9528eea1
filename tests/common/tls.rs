//! HTTPS in tests: a test certificate authority that issues certificates for any names (written
//! as PEM files larder reads), and a client speaking HTTP/1.1 or HTTP/2 over TLS (rustls,
//! trusting only the test CA) that reports what the handshake chose.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::Got;

/// A certificate authority for tests.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate, PEM.
    pub pem: String,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "larder test CA");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// Issues a certificate for `names` and writes it and its key to `dir/{stem}.pem` and
    /// `dir/{stem}.key`; returns their paths.
    pub fn issue(&self, dir: &Path, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, stem);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (
            dir.join(format!("{stem}.pem")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    /// A client configuration trusting this CA only, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        client_trusting(&self.pem, alpn)
    }
}

/// A client configuration trusting the certificates in `pem` only, offering `alpn`.
pub fn client_trusting(pem: &str, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}

/// A TLS connection to larder: what the handshake chose.
pub struct Tls {
    pub stream: TlsStream<TcpStream>,
}

impl Tls {
    /// Connects to `addr` and does the handshake, sending `sni` as the server name.
    pub async fn connect(
        addr: SocketAddr,
        sni: &str,
        config: Arc<rustls::ClientConfig>,
    ) -> std::io::Result<Tls> {
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from(sni.to_string()).expect("a server name");
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await?;
        Ok(Tls { stream })
    }

    /// The protocol ALPN chose ("h2", "http/1.1"), "" when none.
    pub fn alpn(&self) -> String {
        let p = self.stream.get_ref().1.alpn_protocol().unwrap_or_default();
        String::from_utf8_lossy(p).into_owned()
    }

    /// The leaf certificate the server presented, DER.
    pub fn peer_leaf(&self) -> Vec<u8> {
        self.stream
            .get_ref()
            .1
            .peer_certificates()
            .expect("a certificate")[0]
            .to_vec()
    }

    /// Whether the session was resumed.
    pub fn resumed(&self) -> bool {
        matches!(
            self.stream.get_ref().1.handshake_kind(),
            Some(rustls::HandshakeKind::Resumed)
        )
    }

    /// Sends GET requests for `paths` one after another on this connection, over what ALPN chose,
    /// each with `headers`; returns the responses.
    pub async fn get_all(self, host: &str, paths: &[&str], headers: &[(&str, &str)]) -> Vec<Got> {
        let reqs: Vec<(&str, &str, &[u8])> = paths.iter().map(|p| ("GET", *p, &b""[..])).collect();
        self.send_all(host, &reqs, headers).await
    }

    /// Sends `(method, path, body)` requests one after another on this connection, over what
    /// ALPN chose, each with `headers`; returns the responses.
    pub async fn send_all(
        self,
        host: &str,
        reqs: &[(&str, &str, &[u8])],
        headers: &[(&str, &str)],
    ) -> Vec<Got> {
        let h2 = self.alpn() == "h2";
        let io = TokioIo::new(self.stream);
        let build = |&(method, path, body): &(&str, &str, &[u8])| {
            let uri = format!("https://{host}{path}");
            let mut b = Request::builder().method(method).uri(uri);
            if !h2 {
                b = b.header("host", host);
            }
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            b.body(http_body_util::Full::new(Bytes::copy_from_slice(body)))
                .unwrap()
        };
        let mut out = Vec::new();
        if h2 {
            let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .expect("h2 handshake");
            tokio::spawn(conn);
            for r in reqs {
                out.push(read(send.send_request(build(r)).await.expect("h2 response")).await);
            }
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .expect("h1 handshake");
            tokio::spawn(conn);
            for r in reqs {
                send.ready().await.expect("connection ready");
                out.push(read(send.send_request(build(r)).await.expect("h1 response")).await);
            }
        }
        out
    }
}

impl Tls {
    /// Over HTTP/2: sends each round's GET requests at once, as concurrent streams of this one
    /// connection, waits for all their responses, then pauses before the next round.
    pub async fn h2_rounds(
        self,
        host: &str,
        rounds: &[Vec<String>],
        pause: std::time::Duration,
    ) -> Vec<Vec<Got>> {
        assert_eq!(self.alpn(), "h2");
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(self.stream))
                .await
                .expect("h2 handshake");
        tokio::spawn(conn);
        let mut out = Vec::new();
        for paths in rounds {
            let streams = paths.iter().map(|path| {
                let mut send = send.clone();
                let req = Request::get(format!("https://{host}{path}"))
                    .body(http_body_util::Empty::<Bytes>::new())
                    .unwrap();
                async move { read(send.send_request(req).await.expect("h2 response")).await }
            });
            out.push(futures_util::future::join_all(streams).await);
            tokio::time::sleep(pause).await;
        }
        out
    }
}

async fn read(r: http::Response<hyper::body::Incoming>) -> Got {
    let (parts, body) = r.into_parts();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("body").to_bytes(),
    }
}

/// One GET over a new TLS connection (SNI `host`, ALPN `alpn`).
pub async fn https_get(
    addr: SocketAddr,
    host: &str,
    ca: &TestCa,
    alpn: &[&[u8]],
    path: &str,
    headers: &[(&str, &str)],
) -> Got {
    let tls = Tls::connect(addr, host, ca.client_config(alpn))
        .await
        .expect("TLS handshake");
    tls.get_all(host, &[path], headers).await.remove(0)
}

/// An HTTP/3 client (quinn + h3) trusting the test CA: one QUIC connection to `addr` (UDP).
pub struct H3 {
    send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    _endpoint: quinn::Endpoint,
}

impl H3 {
    pub async fn connect(addr: SocketAddr, sni: &str, ca: &TestCa) -> H3 {
        let mut tls = (*ca.client_config(&[b"h3"])).clone();
        tls.enable_early_data = false;
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS");
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
        let conn = endpoint
            .connect(addr, sni)
            .unwrap()
            .await
            .expect("QUIC handshake");
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
            .await
            .expect("h3 connection");
        tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
        H3 {
            send,
            _endpoint: endpoint,
        }
    }

    /// One request on a new stream of this connection; the whole response.
    pub async fn send(
        &mut self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Got {
        let mut b = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut stream = self
            .send
            .send_request(b.body(()).unwrap())
            .await
            .expect("h3 request");
        if !body.is_empty() {
            stream
                .send_data(Bytes::copy_from_slice(body))
                .await
                .expect("h3 body");
        }
        stream.finish().await.expect("h3 finish");
        let head = stream.recv_response().await.expect("h3 response");
        let mut data = Vec::new();
        while let Some(mut chunk) = stream.recv_data().await.expect("h3 data") {
            use bytes::Buf;
            data.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
        }
        let (parts, ()) = head.into_parts();
        Got {
            status: parts.status,
            headers: parts.headers,
            body: data.into(),
        }
    }
}
