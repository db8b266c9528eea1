//! ACME (RFC 8555): a listener's certificate obtained from a CA (Let's Encrypt, or any ACME
//! server) and renewed before it expires, by a background service. The CA's challenge is
//! answered by larder itself: TLS-ALPN-01 (RFC 8737) by the listener, where while an order is
//! open a validation handshake (ALPN `acme-tls/1`) gets a certificate carrying the challenge's
//! digest; or HTTP-01 by every plain listener, which answers
//! `/.well-known/acme-challenge/<token>` from [`Http01`] before routing.
//!
//! What is kept under `state_dir` (0700): the account's credentials (`account.json`) and the
//! certificate and its key (`<first domain>.pem`, `.key`; keys 0600), written whole and then
//! renamed into place, so a restart serves the stored certificate without a new order. A
//! renewal that fails is logged, counted in [`AcmeStatus`] and retried at the next check; the
//! certificate in use stays until a new one is in place.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::CertStore;
use crate::config::{AcmeChallenge, AcmeConfig, CertConfig};

/// Where HTTP-01 challenges are answered (RFC 8555 §8.3).
pub const HTTP01_PREFIX: &str = "/.well-known/acme-challenge/";

/// The HTTP-01 tokens of the open orders and their key authorizations, shared by every ACME
/// listener and every plain listener of the server.
#[derive(Debug, Default)]
pub struct Http01(std::sync::RwLock<std::collections::HashMap<String, String>>);

impl Http01 {
    /// The key authorization to answer for `path` (`/.well-known/acme-challenge/<token>`).
    pub fn answer(&self, path: &str) -> Option<String> {
        let token = path.strip_prefix(HTTP01_PREFIX)?;
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()
    }

    fn set(&self, token: &str, key_authorization: Option<String>) {
        let mut t = self.0.write().unwrap_or_else(|e| e.into_inner());
        match key_authorization {
            Some(k) => t.insert(token.to_string(), k),
            None => t.remove(token),
        };
    }
}

/// Where an ACME listener's certificate stands, for logs, the admin API and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcmeStatus {
    /// Orders placed with the CA since start.
    pub orders: u64,
    /// Certificates obtained since start.
    pub obtained: u64,
    /// Orders that failed since start.
    pub failures: u64,
    /// When the certificate in use expires.
    pub not_after: Option<SystemTime>,
    /// Why the last order failed, until one succeeds.
    pub last_error: Option<String>,
}

/// One listener's ACME state.
pub struct Acme {
    cfg: AcmeConfig,
    certs: Arc<CertStore>,
    http01: Arc<Http01>,
    status: Mutex<AcmeStatus>,
}

/// Where the certificate of `cfg` is kept.
pub fn stored(cfg: &AcmeConfig) -> CertConfig {
    let stem = cfg.domains.first().map_or("acme", String::as_str);
    CertConfig {
        cert: cfg.state_dir.join(format!("{stem}.pem")),
        key: cfg.state_dir.join(format!("{stem}.key")),
        names: Vec::new(),
    }
}

impl Acme {
    pub fn new(cfg: AcmeConfig, certs: Arc<CertStore>, http01: Arc<Http01>) -> Acme {
        Acme {
            cfg,
            certs,
            http01,
            status: Mutex::default(),
        }
    }

    /// The first domain of the certificate (its name in logs and metrics).
    pub fn domain(&self) -> &str {
        self.cfg.domains.first().map_or("", String::as_str)
    }

    /// How often the certificate's expiry is checked.
    pub fn check_interval(&self) -> Duration {
        self.cfg.check_interval.0
    }

    pub fn status(&self) -> AcmeStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn update(&self, f: impl FnOnce(&mut AcmeStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Obtains a certificate if there is none or it expires within `renew_before`.
    pub async fn check(&self) {
        let not_after = expiry(&stored(&self.cfg).cert);
        self.update(|s| s.not_after = not_after);
        let renew_at = SystemTime::now() + self.cfg.renew_before.0;
        if not_after.is_some_and(|t| t > renew_at) {
            return;
        }
        self.update(|s| s.orders += 1);
        match self.obtain().await {
            Ok(()) => {
                let not_after = expiry(&stored(&self.cfg).cert);
                tracing::info!(domains = ?self.cfg.domains, "ACME certificate obtained");
                self.update(|s| {
                    s.obtained += 1;
                    s.not_after = not_after;
                    s.last_error = None;
                });
            }
            Err(e) => {
                tracing::error!(domains = ?self.cfg.domains, error = %e,
                    "ACME order failed; serving the certificate in use, retrying at the next check");
                self.update(|s| {
                    s.failures += 1;
                    s.last_error = Some(e);
                });
            }
        }
        for d in &self.cfg.domains {
            self.certs.set_challenge(d, None);
        }
    }

    /// One order: account, authorizations (TLS-ALPN-01 or HTTP-01), CSR, certificate, stored
    /// and served.
    async fn obtain(&self) -> Result<(), String> {
        let account = self.account().await?;
        let ids: Vec<Identifier> = (self.cfg.domains.iter())
            .map(|d| Identifier::Dns(d.clone()))
            .collect();
        let mut order = account
            .new_order(&NewOrder::new(&ids))
            .await
            .map_err(|e| format!("new order: {e}"))?;
        let mut tokens = Vec::new();
        let validated = self.validate(&mut order, &mut tokens).await;
        for t in &tokens {
            self.http01.set(t, None);
        }
        validated?;
        self.finish(&mut order).await
    }

    /// Answers every pending authorization's challenge and waits for the order to be ready;
    /// the HTTP-01 tokens put up go to `tokens` (to be taken down).
    async fn validate(
        &self,
        order: &mut instant_acme::Order,
        tokens: &mut Vec<String>,
    ) -> Result<(), String> {
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.map_err(|e| format!("authorization: {e}"))?;
            match authz.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => return Err(format!("authorization is {other:?}")),
            }
            let kind = match self.cfg.challenge {
                AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
                AcmeChallenge::Http01 => ChallengeType::Http01,
            };
            let mut challenge = authz
                .challenge(kind.clone())
                .ok_or_else(|| format!("the CA offers no {kind:?} challenge"))?;
            let domain = challenge.identifier().to_string();
            let key_authorization = challenge.key_authorization();
            if kind == ChallengeType::TlsAlpn01 {
                let key = self.challenge_key(&domain, key_authorization.digest().as_ref())?;
                self.certs.set_challenge(&domain, Some(key));
            } else {
                let token = challenge.token.clone();
                self.http01
                    .set(&token, Some(key_authorization.as_str().to_string()));
                tokens.push(token);
            }
            challenge
                .set_ready()
                .await
                .map_err(|e| format!("challenge for {domain}: {e}"))?;
        }
        let retry = RetryPolicy::new().timeout(Duration::from_secs(90));
        match order.poll_ready(&retry).await {
            Ok(OrderStatus::Ready) => Ok(()),
            Ok(other) => Err(format!("order is {other:?}, not ready")),
            Err(e) => Err(format!("waiting for validation: {e}")),
        }
    }

    /// A key and its CSR; the certificate; both stored and served.
    async fn finish(&self, order: &mut instant_acme::Order) -> Result<(), String> {
        let retry = RetryPolicy::new().timeout(Duration::from_secs(90));
        let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let csr = rcgen::CertificateParams::new(self.cfg.domains.clone())
            .and_then(|p| p.serialize_request(&key))
            .map_err(|e| format!("CSR: {e}"))?;
        order
            .finalize_csr(csr.der())
            .await
            .map_err(|e| format!("finalize: {e}"))?;
        let chain = order
            .poll_certificate(&retry)
            .await
            .map_err(|e| format!("certificate: {e}"))?;
        let files = stored(&self.cfg);
        // The key first: a certificate is only served with its key beside it.
        write_private(&files.key, key.serialize_pem().as_bytes())?;
        write_private(&files.cert, chain.as_bytes())?;
        self.certs.reload().map_err(|e| e.to_string())
    }

    /// The account: stored credentials, or a new account whose credentials are then stored.
    async fn account(&self) -> Result<Account, String> {
        let builder = || {
            match &self.cfg.directory_ca {
                Some(ca) => Account::builder_with_root(ca),
                None => Account::builder(),
            }
            .map_err(|e| format!("ACME client: {e}"))
        };
        let path = self.cfg.state_dir.join("account.json");
        if let Ok(text) = std::fs::read(&path) {
            let creds: AccountCredentials =
                serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            return builder()?
                .from_credentials(creds)
                .await
                .map_err(|e| format!("account: {e}"));
        }
        let contact: Vec<&str> = self.cfg.contact.iter().map(String::as_str).collect();
        let (account, creds) = builder()?
            .create(
                &NewAccount {
                    contact: &contact,
                    terms_of_service_agreed: true,
                    only_return_existing: false,
                },
                self.cfg.directory.clone(),
                None,
            )
            .await
            .map_err(|e| format!("new account at {}: {e}", self.cfg.directory))?;
        let json = serde_json::to_vec(&creds).map_err(|e| e.to_string())?;
        write_private(&path, &json)?;
        Ok(account)
    }

    /// The TLS-ALPN-01 certificate for `domain`: self-signed, with the acmeIdentifier
    /// extension holding the key authorization's SHA-256 digest (RFC 8737 §3).
    fn challenge_key(&self, domain: &str, digest: &[u8]) -> Result<Arc<CertifiedKey>, String> {
        let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let mut params =
            rcgen::CertificateParams::new(vec![domain.to_string()]).map_err(|e| e.to_string())?;
        params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
        let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
        let der = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
            .map_err(|e| e.to_string())?;
        // Not `CertifiedKey::from_der`: its check that the key matches parses the certificate
        // with webpki, which refuses the critical acmeIdentifier extension it does not know.
        let signer = (self.certs.provider().key_provider)
            .load_private_key(der)
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(CertifiedKey::new(
            vec![cert.der().clone()],
            signer,
        )))
    }
}

/// The background service of an ACME listener: a check at start, then every `check_interval`.
pub async fn run(
    acme: Arc<Acme>,
    every: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = acme.check() => {}
            _ = shutdown.changed() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// When the leaf certificate in `path` expires; None if it cannot be read.
pub fn expiry(path: &Path) -> Option<SystemTime> {
    let pem = std::fs::read(path).ok()?;
    let leaf = CertificateDer::pem_slice_iter(&pem).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&leaf).ok()?;
    let secs = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// Writes `bytes` to `path` through a temporary file renamed into place, mode 0600, in a
/// directory made 0700.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let fail = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| fail(dir, e))?;
    let tmp: PathBuf = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| fail(&tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| fail(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| fail(path, e))
}
