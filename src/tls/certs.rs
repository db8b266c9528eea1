//! Certificates: loading a chain and its key from PEM files (errors name the file), the
//! [`CertStore`] that picks one by SNI (exact name, then `*.` wildcard, then the default), and
//! re-reading the files when they change. A reload that fails keeps the certificates in use.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::CertConfig;

/// A certificate or key that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("{}: the key does not match the certificate {}", key.display(), cert.display())]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("TLS settings: {0}")]
    Config(String),
}

fn file_error(path: &Path, message: impl fmt::Display) -> Error {
    Error::File {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// Reads a certificate chain and its private key, and checks that they belong together.
pub fn load(cfg: &CertConfig, provider: &CryptoProvider) -> Result<CertifiedKey, Error> {
    let read = |path: &Path| std::fs::read(path).map_err(|e| file_error(path, e));
    let cert_pem = read(&cfg.cert)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(&cfg.cert, format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(file_error(
            &cfg.cert,
            "holds no certificate (PEM CERTIFICATE)",
        ));
    }
    webpki::EndEntityCert::try_from(&chain[0])
        .map_err(|e| file_error(&cfg.cert, format!("not a valid X.509 certificate: {e}")))?;
    let key_pem = read(&cfg.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        file_error(
            &cfg.key,
            format!("no private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
        )
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => Error::Mismatch {
            cert: cfg.cert.clone(),
            key: cfg.key.clone(),
        },
        e => file_error(&cfg.key, format!("unusable private key: {e}")),
    })
}

/// The names a certificate is served for: those configured, else its DNS names (lowercase).
fn names_of(cfg: &CertConfig, key: &CertifiedKey) -> Vec<String> {
    if !cfg.names.is_empty() {
        return cfg.names.iter().map(|n| n.to_ascii_lowercase()).collect();
    }
    let Some(leaf) = key.cert.first() else {
        return Vec::new();
    };
    match webpki::EndEntityCert::try_from(leaf) {
        Ok(ee) => ee
            .valid_dns_names()
            .map(|n| n.to_ascii_lowercase())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The certificates in use, indexed by name.
struct Table {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` certificates by `example.com`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    /// None only while an ACME listener waits for its first certificate.
    default: Option<Arc<CertifiedKey>>,
}

impl Table {
    /// The certificates of `certs`, then `acme`'s if it was obtained already (its files exist).
    fn build(
        certs: &[CertConfig],
        acme: Option<&CertConfig>,
        provider: &CryptoProvider,
    ) -> Result<Table, Error> {
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        let mut default = None;
        let obtained = acme.filter(|a| a.cert.is_file() && a.key.is_file());
        for cfg in certs.iter().chain(obtained) {
            let key = Arc::new(load(cfg, provider)?);
            for name in names_of(cfg, &key) {
                // The first certificate listed for a name wins.
                match name.strip_prefix("*.") {
                    Some(parent) => wildcard.entry(parent.to_string()),
                    None => exact.entry(name),
                }
                .or_insert_with(|| Arc::clone(&key));
            }
            default.get_or_insert(key);
        }
        if default.is_none() && acme.is_none() {
            return Err(Error::Config("no certificate configured".into()));
        }
        Ok(Table {
            exact,
            wildcard,
            default,
        })
    }

    fn pick(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let Some(name) = server_name else {
            return self.default.clone();
        };
        // rustls hands the SNI name over lowercased.
        if let Some(k) = self.exact.get(name) {
            return Some(Arc::clone(k));
        }
        // A wildcard covers exactly one label (RFC 6125 §6.4.3).
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(k) = self.wildcard.get(parent) {
                return Some(Arc::clone(k));
            }
        }
        self.default.clone()
    }
}

/// A listener's certificates: chosen per handshake by SNI, re-read on demand ([`reload`]) or
/// when their files change ([`reload_if_changed`]).
///
/// [`reload`]: CertStore::reload
/// [`reload_if_changed`]: CertStore::reload_if_changed
pub struct CertStore {
    certs: Vec<CertConfig>,
    /// Where an ACME certificate is kept (served once it exists).
    acme: Option<CertConfig>,
    /// TLS-ALPN-01 challenge certificates by domain, while an ACME order is open.
    challenges: RwLock<HashMap<String, Arc<CertifiedKey>>>,
    provider: Arc<CryptoProvider>,
    /// Swapped whole on reload: a handshake holds the table it started with.
    table: RwLock<Arc<Table>>,
    /// Modification times of the files when last read.
    seen: Mutex<Vec<Option<SystemTime>>>,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("certs", &self.certs)
            .finish()
    }
}

impl CertStore {
    /// Loads every certificate of `certs` (the first is the default).
    pub fn new(certs: Vec<CertConfig>, provider: Arc<CryptoProvider>) -> Result<CertStore, Error> {
        CertStore::with_acme(certs, None, provider)
    }

    /// [`CertStore::new`], and the ACME certificate kept at `acme` once it exists.
    pub fn with_acme(
        certs: Vec<CertConfig>,
        acme: Option<CertConfig>,
        provider: Arc<CryptoProvider>,
    ) -> Result<CertStore, Error> {
        let mut watched = certs.clone();
        watched.extend(acme.clone());
        let seen = modified(&watched);
        let table = Table::build(&certs, acme.as_ref(), &provider)?;
        Ok(CertStore {
            certs,
            acme,
            challenges: RwLock::default(),
            provider,
            table: RwLock::new(Arc::new(table)),
            seen: Mutex::new(seen),
        })
    }

    /// Re-reads every certificate. On error the certificates in use stay.
    pub fn reload(&self) -> Result<(), Error> {
        let seen = modified(&self.watched());
        let table = Table::build(&self.certs, self.acme.as_ref(), &self.provider)?;
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = seen;
        Ok(())
    }

    /// Re-reads the certificates if a file changed since they were read: Ok(true) when new
    /// ones are in use. A failed reload is not retried until a file changes again.
    pub fn reload_if_changed(&self) -> Result<bool, Error> {
        let now = modified(&self.watched());
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if *seen == now {
                return Ok(false);
            }
            *seen = now;
        }
        let table = Table::build(&self.certs, self.acme.as_ref(), &self.provider)?;
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        Ok(true)
    }

    fn watched(&self) -> Vec<CertConfig> {
        self.certs.iter().chain(&self.acme).cloned().collect()
    }

    /// The provider certificates are loaded with.
    pub fn provider(&self) -> &CryptoProvider {
        &self.provider
    }

    /// Serves `key` to TLS-ALPN-01 validation handshakes for `domain` (or stops, with None).
    pub fn set_challenge(&self, domain: &str, key: Option<Arc<CertifiedKey>>) {
        let mut c = self.challenges.write().unwrap_or_else(|e| e.into_inner());
        match key {
            Some(k) => c.insert(domain.to_ascii_lowercase(), k),
            None => c.remove(&domain.to_ascii_lowercase()),
        };
    }

    /// The certificate served for `server_name` (None: no SNI); None when there is none yet.
    pub fn pick(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let table = Arc::clone(&self.table.read().unwrap_or_else(|e| e.into_inner()));
        table.pick(server_name)
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let acme_validation = hello
            .alpn()
            .is_some_and(|mut p| p.any(|p| p == super::ACME_TLS_ALPN));
        if acme_validation {
            let name = hello.server_name()?;
            let c = self.challenges.read().unwrap_or_else(|e| e.into_inner());
            return c.get(name).cloned();
        }
        self.pick(hello.server_name())
    }
}

/// Modification times of every certificate and key file (None: unreadable now).
fn modified(certs: &[CertConfig]) -> Vec<Option<SystemTime>> {
    certs
        .iter()
        .flat_map(|c| [&c.cert, &c.key])
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::aws_lc_rs::default_provider())
    }

    fn write_cert(dir: &Path, stem: &str, names: &[&str]) -> CertConfig {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let ck = rcgen::generate_simple_self_signed(names).unwrap();
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, ck.cert.pem()).unwrap();
        std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
        CertConfig {
            cert,
            key,
            names: Vec::new(),
        }
    }

    impl CertStore {
        fn pick_some(&self, name: Option<&str>) -> Arc<CertifiedKey> {
            self.pick(name).expect("a certificate")
        }
    }

    fn leaf(k: &CertifiedKey) -> Vec<u8> {
        k.cert[0].to_vec()
    }

    #[test]
    fn sni_picks_exact_then_one_label_wildcard_then_default() {
        let dir = tempfile::tempdir().unwrap();
        let d = write_cert(dir.path(), "default", &["localhost"]);
        let a = write_cert(dir.path(), "a", &["a.example.com"]);
        let w = write_cert(dir.path(), "w", &["*.example.com"]);
        let store = CertStore::new(vec![d, a, w], provider()).unwrap();
        let (d, a, w) = (
            leaf(&store.pick_some(None)),
            leaf(&store.pick_some(Some("a.example.com"))),
            leaf(&store.pick_some(Some("b.example.com"))),
        );
        assert_ne!(d, a);
        assert_ne!(a, w);
        assert_eq!(
            leaf(&store.pick_some(Some("x.b.example.com"))),
            d,
            "one label only"
        );
        assert_eq!(leaf(&store.pick_some(Some("example.com"))), d);
        assert_eq!(leaf(&store.pick_some(Some("other.test"))), d);
        assert_eq!(leaf(&store.pick_some(Some("localhost"))), d);
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = write_cert(dir.path(), "a", &["a.test"]);
        let b = write_cert(dir.path(), "b", &["b.test"]);
        let missing = CertConfig {
            cert: dir.path().join("nope.pem"),
            ..a.clone()
        };
        let e = CertStore::new(vec![missing], provider())
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope.pem"), "{e}");
        let mismatched = CertConfig {
            key: b.key.clone(),
            ..a.clone()
        };
        let e = CertStore::new(vec![mismatched], provider()).unwrap_err();
        assert!(matches!(e, Error::Mismatch { .. }), "{e}");
        assert!(e.to_string().contains("b.key"), "{e}");
        std::fs::write(&b.cert, "garbage").unwrap();
        let e = CertStore::new(vec![b], provider()).unwrap_err().to_string();
        assert!(e.contains("b.pem") && e.contains("no certificate"), "{e}");
    }

    #[test]
    fn reload_if_changed_swaps_and_a_bad_file_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let a = write_cert(dir.path(), "a", &["a.test"]);
        let store = CertStore::new(vec![a.clone()], provider()).unwrap();
        let before = leaf(&store.pick_some(None));
        assert!(!store.reload_if_changed().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
        write_cert(dir.path(), "a", &["a.test"]);
        assert!(store.reload_if_changed().unwrap());
        let after = leaf(&store.pick_some(None));
        assert_ne!(before, after);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&a.key, "broken").unwrap();
        assert!(store.reload_if_changed().is_err());
        assert_eq!(
            leaf(&store.pick_some(None)),
            after,
            "the old certificate stays"
        );
    }
}
