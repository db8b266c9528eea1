//! ACME against a real ACME server: Let's Encrypt's test server pebble (built with Go by
//! tests/provision) with its challenge-test DNS server answering 127.0.0.1 for every name. larder
//! obtains a certificate by answering the TLS-ALPN-01 challenge on its own listener, serves it,
//! reuses it after a restart without a new order, renews it when it is due, and keeps serving
//! the one it has when the CA cannot be reached.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const PEBBLE: &str = "github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.1";
const CHALLTESTSRV: &str = "github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv@v2.10.1";

/// pebble and its DNS server, killed when dropped.
struct Pebble {
    _dns: Child,
    pebble: Child,
    directory: String,
    management: SocketAddr,
}

fn start_pebble(dir: &Path, ca: &TestCa, tls_port: u16, http_port: u16) -> Pebble {
    let pebble = go_install(PEBBLE, "pebble");
    let challtestsrv = go_install(CHALLTESTSRV, "pebble-challtestsrv");
    let (dns, dns_admin, acme, management) = (free_port(), free_port(), free_port(), free_port());
    let quiet = |c: &mut std::process::Command| {
        c.stdout(Stdio::null()).stderr(Stdio::null());
    };
    let mut c = std::process::Command::new(challtestsrv);
    c.args(["-dnsserver", &dns.to_string(), "-defaultIPv4", "127.0.0.1"])
        .args([
            "-defaultIPv6",
            "",
            "-http01",
            "",
            "-https01",
            "",
            "-tlsalpn01",
            "",
            "-doh",
            "",
        ])
        .args(["-management", &dns_admin.to_string()]);
    quiet(&mut c);
    let dns_child = Child(c.spawn().expect("start pebble-challtestsrv"));
    // pebble's own HTTPS certificate, from the test CA the client trusts.
    let (cert, key) = ca.issue(dir, "pebble", &["localhost", "127.0.0.1"]);
    let config = serde_json::json!({"pebble": {
        "listenAddress": acme.to_string(),
        "managementListenAddress": management.to_string(),
        "certificate": cert, "privateKey": key,
        "httpPort": http_port, "tlsPort": tls_port,
        "ocspResponderURL": "", "externalAccountBindingRequired": false,
        "keyAlgorithm": "ecdsa",
        "profiles": {"default": {"description": "default", "validityPeriod": 7776000}}
    }});
    let config_path = dir.join("pebble.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let mut c = std::process::Command::new(pebble);
    c.arg("-config")
        .arg(&config_path)
        .args(["-dnsserver", &dns.to_string()])
        // No random waits before validating; no nonce rejected on purpose; a new validation
        // for every order (so a renewal answers a challenge again).
        .env("PEBBLE_VA_NOSLEEP", "1")
        .env("PEBBLE_WFE_NONCEREJECT", "0")
        .env("PEBBLE_AUTHZREUSE", "0");
    quiet(&mut c);
    let pebble_child = Child(c.spawn().expect("start pebble"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(acme).is_err() {
        assert!(Instant::now() < deadline, "pebble did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Pebble {
        _dns: dns_child,
        pebble: pebble_child,
        directory: format!("https://{acme}/dir"),
        management,
    }
}

/// A TLS listener on `port` whose certificate comes from pebble.
fn acme_config(port: u16, p: &Pebble, ca_file: &Path, state: &Path, renew_before: &str) -> String {
    format!(
        r#"
[[listener]]
addr = "127.0.0.1:{port}"
  [listener.tls]
    [listener.tls.acme]
    domains = ["acme.test"]
    contact = ["mailto:ops@acme.test"]
    directory = "{}"
    directory_ca = {:?}
    state_dir = {:?}
    renew_before = "{renew_before}"
    check_interval = "200ms"
  [[listener.route]]
  respond = {{ body = "served over ACME" }}
"#,
        p.directory,
        ca_file.display().to_string(),
        state.display().to_string()
    )
}

/// Waits until `done` holds for larder's ACME state (or fails after 60 s).
async fn wait_acme(
    larder: &Larder,
    done: impl Fn(&larder::tls::acme::AcmeStatus) -> bool,
) -> larder::tls::acme::AcmeStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = larder.acme_status().remove(0);
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "ACME did not get there: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client trusting `root` (PEM) only.
fn trusting(root: &str) -> Arc<rustls::ClientConfig> {
    client_trusting(root, &[b"http/1.1"])
}

/// pebble's root certificate (it makes a new one at each start), from its management port.
async fn pebble_root(p: &Pebble, ca: &TestCa) -> String {
    let t = Tls::connect(p.management, "localhost", ca.client_config(&[b"http/1.1"]))
        .await
        .unwrap();
    let root = t.get_all("localhost", &["/roots/0"], &[]).await.remove(0);
    assert_eq!(root.status, 200);
    root.text()
}

fn stored_leaf(state: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_file(state.join("acme.test.pem"))
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread")]
async fn certificate_obtained_served_reused_renewed_and_kept_when_the_ca_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let ca_file: PathBuf = dir.path().join("test-ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let state = dir.path().join("state");
    let port = free_port().port();
    let mut pebble = start_pebble(dir.path(), &ca, port, 1);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    // Issuance: no certificate at first; the order is validated through larder's listener.
    let l1 = Larder::start(&acme_config(port, &pebble, &ca_file, &state, "1h")).await;
    let s = wait_acme(&l1, |s| s.obtained == 1).await;
    assert_eq!((s.orders, s.failures), (1, 0), "{s:?}");
    assert!(s.not_after.unwrap() > std::time::SystemTime::now() + Duration::from_secs(80 * 86400));
    // The certificate chains to pebble's root (fetched from its management port).
    let pebble_root = pebble_root(&pebble, &ca).await;
    let t = Tls::connect(addr, "acme.test", trusting(&pebble_root))
        .await
        .unwrap();
    let first = t.peer_leaf();
    assert_eq!(first, stored_leaf(&state));
    assert_eq!(
        t.get_all("acme.test", &["/"], &[]).await[0].text(),
        "served over ACME"
    );
    // Kept with private permissions.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(state.clone()), 0o700);
    assert_eq!(mode(state.join("acme.test.key")), 0o600);
    assert_eq!(mode(state.join("account.json")), 0o600);
    l1.shutdown().await;

    // Restart: the stored certificate is served at once, and no new order is placed.
    let l2 = Larder::start(&acme_config(port, &pebble, &ca_file, &state, "1h")).await;
    let t = Tls::connect(addr, "acme.test", trusting(&pebble_root))
        .await
        .unwrap();
    assert_eq!(t.peer_leaf(), first);
    let s = wait_acme(&l2, |s| s.not_after.is_some()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(l2.acme_status()[0].orders, 0, "{s:?}");
    l2.shutdown().await;

    // Due for renewal (90 days left, renew within a year): a new certificate replaces it.
    let l3 = Larder::start(&acme_config(port, &pebble, &ca_file, &state, "8760h")).await;
    let s = wait_acme(&l3, |s| s.obtained >= 1).await;
    assert_eq!(s.failures, 0, "{s:?}");
    let t = Tls::connect(addr, "acme.test", trusting(&pebble_root))
        .await
        .unwrap();
    let renewed = t.peer_leaf();
    assert_ne!(renewed, first);
    assert_eq!(renewed, stored_leaf(&state));
    l3.shutdown().await;

    // The CA is gone: renewal fails, is counted, and the certificate in use stays.
    let _ = pebble.pebble.0.kill();
    let _ = pebble.pebble.0.wait();
    let l4 = Larder::start(&acme_config(port, &pebble, &ca_file, &state, "8760h")).await;
    let s = wait_acme(&l4, |s| s.failures >= 1).await;
    assert!(s.last_error.is_some(), "{s:?}");
    let t = Tls::connect(addr, "acme.test", trusting(&pebble_root))
        .await
        .unwrap();
    assert_eq!(t.peer_leaf(), renewed);
    l4.shutdown().await;
}

/// HTTP-01: the CA asks a plain listener for `/.well-known/acme-challenge/<token>`; larder
/// answers it before routing (here the plain listener redirects everything else to HTTPS).
#[tokio::test(flavor = "multi_thread")]
async fn http01_is_answered_by_the_plain_listener() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let ca_file: PathBuf = dir.path().join("test-ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let state = dir.path().join("state");
    let (tls_port, http_port) = (free_port().port(), free_port().port());
    let pebble = start_pebble(dir.path(), &ca, tls_port, http_port);
    let config = acme_config(tls_port, &pebble, &ca_file, &state, "1h").replace(
        "    check_interval = \"200ms\"\n",
        "    check_interval = \"200ms\"\n    challenge = \"http-01\"\n",
    ) + &format!(
        "\n[[listener]]\naddr = \"127.0.0.1:{http_port}\"\n  [[listener.route]]\n  redirect_https = true\n"
    );
    let larder = Larder::start(&config).await;
    let s = wait_acme(&larder, |s| s.obtained == 1).await;
    assert_eq!(s.failures, 0, "{s:?}");
    let addr: SocketAddr = format!("127.0.0.1:{tls_port}").parse().unwrap();
    let t = Tls::connect(addr, "acme.test", ca.client_config(&[b"http/1.1"])).await;
    // Not trusted by the test CA: pebble issued it. Its leaf is the stored one.
    assert!(t.is_err());
    let root = pebble_root(&pebble, &ca).await;
    let t = Tls::connect(addr, "acme.test", trusting(&root))
        .await
        .unwrap();
    assert_eq!(t.peer_leaf(), stored_leaf(&state));
    // The token is taken down after the order; other paths still redirect.
    let c = client();
    let r = get(
        &c,
        &format!("http://127.0.0.1:{http_port}/.well-known/acme-challenge/x"),
        &[("host", "acme.test")],
    )
    .await;
    assert_eq!(r.status, 308);
}
