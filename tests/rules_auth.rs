//! The authentication rules (docs/rules.md, "Access: authentication") through a real larder in
//! front of a real origin, with credentials made by other implementations: htpasswd files
//! written by Apache's `htpasswd -B` (and rewritten while larder runs), JWTs and keys made by
//! PyJWT and Python's `cryptography` (HS256, RS256, ES256, EdDSA; PEM keys and a JWKS file),
//! and an auth service for forward auth written here, which counts what it is asked. Also: what
//! the cache shares between authenticated users (RFC 9111 §3.5 holds behind the rules).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// An origin that says in its body what it was sent: the path and the headers that credential
/// rules add or remove. `/public...` answers are marked shareable, `/private...` are not.
async fn echo() -> Origin {
    Origin::start(|req, _| {
        let mut body = req.path.clone();
        for name in ["authorization", "x-api-key", "x-user", "x-role", "x-token"] {
            if let Some(v) = req.headers.get(name) {
                body.push_str(&format!("\n{name}: {}", v.to_str().unwrap()));
            }
        }
        let reply = Reply::ok(body);
        if req.path.starts_with("/public") {
            reply.header("cache-control", "public, max-age=60")
        } else if req.path.starts_with("/private") {
            reply.header("cache-control", "max-age=60")
        } else {
            reply
        }
    })
    .await
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {b64}")
}

/// Runs Apache's htpasswd with `args`.
fn htpasswd(args: &[&str]) {
    let bin = apt("htpasswd", "apache2-utils");
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn route(origin: &Origin, path: &str, rule: &str) -> String {
    format!(
        r#"
  [[listener.route]]
  path = "{path}"
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    {rule}
"#,
        origin = origin.url()
    )
}

fn config(routes: &[String]) -> String {
    format!("[[listener]]\naddr = \"127.0.0.1:0\"\n{}", routes.concat())
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_from_an_htpasswd_file_read_again_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("users");
    let f = file.to_str().unwrap();
    htpasswd(&["-cbB", f, "alice", "wonderland"]);
    let origin = echo().await;
    let clock = larder::clock::Clock::adjustable();
    let log = dir.path().join("access.log");
    let logged = format!(
        "[access_log]\npath = {:?}\nformat = \"{{user}} {{uri}} {{status}}\"\n",
        log.display().to_string()
    );
    let larder = Larder::start_at(
        &(logged
            + &config(&[
                route(
                    &origin,
                    "/kept/",
                    &format!(r#"basic_auth = {{ htpasswd = "{f}", realm = "members" }}"#),
                ),
                route(
                    &origin,
                    "/",
                    &format!(r#"basic_auth = {{ htpasswd = "{f}", forward = false }}"#),
                ),
            ])),
        clock,
    )
    .await;
    let c = client();

    // No credentials, a wrong password, an unknown user: 401 with the realm; the origin is
    // not asked.
    let r = get(&c, &larder.url("/kept/a"), &[]).await;
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Basic realm=\"members\", charset=\"UTF-8\"")
    );
    for auth in [
        basic("alice", "wrong"),
        basic("bob", "wonderland"),
        "Basic !!".into(),
    ] {
        let r = get(&c, &larder.url("/kept/a"), &[("authorization", &auth)]).await;
        assert_eq!(r.status, 401, "{auth}");
    }
    assert_eq!(origin.hits(), 0);

    // The right password: through, Authorization sent on (as nginx does) ...
    let alice = basic("alice", "wonderland");
    let r = get(&c, &larder.url("/kept/a"), &[("authorization", &alice)]).await;
    assert_eq!(r.status, 200);
    assert!(
        r.text().contains(&format!("authorization: {alice}")),
        "{}",
        r.text()
    );
    // ... or not, with `forward = false`.
    let r = get(&c, &larder.url("/b"), &[("authorization", &alice)]).await;
    assert_eq!(r.status, 200);
    assert!(!r.text().contains("authorization"), "{}", r.text());

    // The file rewritten by htpasswd: bob added, alice's password changed. Within the second
    // the old file still holds; once the clock has moved, the new one does, and alice's
    // remembered check went with the old file.
    htpasswd(&["-bB", f, "bob", "builder"]);
    htpasswd(&["-bB", f, "alice", "changed"]);
    let bob = basic("bob", "builder");
    larder.advance(Duration::from_secs(2));
    let r = get(&c, &larder.url("/kept/a"), &[("authorization", &bob)]).await;
    assert_eq!(r.status, 200, "bob, added to the file");
    let r = get(&c, &larder.url("/kept/a"), &[("authorization", &alice)]).await;
    assert_eq!(
        r.status, 401,
        "alice's old password, remembered before the change"
    );
    let r = get(
        &c,
        &larder.url("/kept/a"),
        &[("authorization", &basic("alice", "changed"))],
    )
    .await;
    assert_eq!(r.status, 200);

    // A user deleted with htpasswd -D is refused once the file is read again.
    htpasswd(&["-D", f, "bob"]);
    larder.advance(Duration::from_secs(2));
    let r = get(&c, &larder.url("/kept/a"), &[("authorization", &bob)]).await;
    assert_eq!(r.status, 401);

    // The access log names the user a request was let in as (nginx's $remote_user).
    let mut text = String::new();
    for _ in 0..500 {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "- /kept/a 401", "{text}");
    assert_eq!(lines[4], "alice /kept/a 200", "{text}");
    assert_eq!(lines[6], "bob /kept/a 200", "{text}");
    assert_eq!(lines[9], "- /kept/a 401", "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn behind_basic_auth_the_cache_shares_only_what_the_origin_marks_public() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("users");
    let f = file.to_str().unwrap();
    htpasswd(&["-cbB", f, "alice", "a-password"]);
    htpasswd(&["-bB", f, "bob", "b-password"]);
    let origin = echo().await;
    for forward in [true, false] {
        let larder = Larder::start(&config(&[route(
            &origin,
            "/",
            &format!(r#"basic_auth = {{ htpasswd = "{f}", forward = {forward} }}"#),
        )]))
        .await;
        let c = client();
        let alice = basic("alice", "a-password");
        let bob = basic("bob", "b-password");
        let before = origin.hits();

        // `public, max-age=60`: stored for alice, a HIT for bob.
        let r = get(
            &c,
            &larder.url("/public/page"),
            &[("authorization", &alice)],
        )
        .await;
        assert_eq!((r.status.as_u16(), r.cache()), (200, "MISS"));
        let r = get(&c, &larder.url("/public/page"), &[("authorization", &bob)]).await;
        assert_eq!(
            (r.status.as_u16(), r.cache()),
            (200, "HIT"),
            "forward = {forward}"
        );
        assert_eq!(origin.hits(), before + 1);
        // Still behind the rule: no credentials, no page (the rule runs before the cache).
        assert_eq!(get(&c, &larder.url("/public/page"), &[]).await.status, 401);

        // Without `public`, an answer to a request with credentials is not shared, even where
        // larder does not send the credentials on (§3.5 is about the request as received).
        get(
            &c,
            &larder.url("/private/page"),
            &[("authorization", &alice)],
        )
        .await;
        let r = get(&c, &larder.url("/private/page"), &[("authorization", &bob)]).await;
        assert_eq!(r.status, 200);
        assert_ne!(r.cache(), "HIT", "forward = {forward}");
        assert_eq!(origin.hits(), before + 3);
        larder.shutdown().await;
    }
}

#[test]
fn auth_files_are_checked_at_load_naming_the_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let md5 = dir.path().join("md5");
    let f = md5.to_str().unwrap();
    // htpasswd's old default, MD5-crypt ($apr1$): refused, with how to fix it.
    htpasswd(&["-cbm", f, "carol", "pw"]);
    let base = "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/\"\nrespond = {}\n[[listener.route.rule]]\n";
    let load = |rule: &str| {
        let path = dir.path().join("larder.toml");
        std::fs::write(&path, format!("{base}{rule}\n")).unwrap();
        larder::config::Config::load(&path)
            .map(drop)
            .map_err(|e| e.to_string())
    };
    let e = load(&format!(r#"basic_auth = {{ htpasswd = "{f}" }}"#)).unwrap_err();
    assert!(e.contains("line 7") && e.contains("htpasswd"), "{e}");
    assert!(e.contains("$apr1$") && e.contains("htpasswd -B"), "{e}");
    let e = load(r#"basic_auth = { htpasswd = "/nonexistent/users" }"#).unwrap_err();
    assert!(
        e.contains("line 7") && e.contains("htpasswd") && e.contains("/nonexistent/users"),
        "{e}"
    );
    let e = load(r#"jwt = { public_key = "/nonexistent/key.pem" }"#).unwrap_err();
    assert!(e.contains("line 7") && e.contains("public_key"), "{e}");
    let e = load(r#"api_key = { keys_file = "/nonexistent/keys" }"#).unwrap_err();
    assert!(e.contains("keys_file"), "{e}");
    let good = dir.path().join("good");
    htpasswd(&["-cbB", good.to_str().unwrap(), "dave", "pw"]);
    load(&format!(
        r#"basic_auth = {{ htpasswd = "{}" }}"#,
        good.display()
    ))
    .unwrap();
    // What parsing alone catches.
    for (rule, says) in [
        (r#"jwt = { secret = "short" }"#, "16 bytes"),
        (
            r#"jwt = { secret = "0123456789abcdef0123", algorithms = ["RS256"] }"#,
            "HS256",
        ),
        (
            r#"jwt = { secret = "0123456789abcdef0123", algorithms = ["none"] }"#,
            "not an algorithm",
        ),
        (
            r#"api_key = { header = "x-k", query = "k", keys = { a = "12345678" } }"#,
            "one place",
        ),
        (r#"api_key = { keys = { a = "short" } }"#, "8 to 512"),
        (
            r#"forward_auth = { url = "ftp://x/check" }"#,
            "http:// or https://",
        ),
        (
            r#"basic_auth = { htpasswd = "/x", realm = "a\"b" }"#,
            "realm",
        ),
    ] {
        let e = larder::config::Config::parse(&format!("{base}{rule}\n"), "t")
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(e.contains(says) && e.contains("line 7"), "{rule}: {e}");
    }
    // docs/rules.md's example parses (its files aside: parsing does not read them).
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/rules.md"))
        .unwrap();
    let section = &doc[doc.find("## Access: authentication").unwrap()..];
    let start = section.find("```toml\n").unwrap() + 8;
    let example = &section[start..start + section[start..].find("```").unwrap()];
    let text = format!("[[listener]]\naddr = \"127.0.0.1:1\"\n{example}");
    larder::config::Config::parse(&text, "docs/rules.md").unwrap();
    // So does the example configuration's commented authentication block, uncommented.
    let ex =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("larder.example.toml"))
            .unwrap();
    let block: String = ex[ex.find("# [[policy.members]]").unwrap()..]
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.starts_with("# ("))
        .map(|l| format!("{}\n", l.strip_prefix("# ").unwrap_or(l)))
        .collect();
    larder::config::Config::parse(&format!("{block}{base}respond = {{}}\n"), "example").unwrap();
    // The example's htpasswd file holds demo/demo (bcrypt, as `htpasswd -nbB demo demo` wrote it).
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/edge.htpasswd");
    let text = std::fs::read_to_string(example).unwrap();
    let users = larder::config::rules_auth::parse_htpasswd(&text).unwrap();
    assert_eq!(users.len(), 1);
    assert_eq!(users[0].0, "demo");
    assert!(text.starts_with("demo:$2y$"));
}

#[tokio::test(flavor = "multi_thread")]
async fn api_keys_in_a_header_or_a_query_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "# holders\nbob:bob-key-5678\n").unwrap();
    let origin = echo().await;
    let larder = Larder::start(&config(&[
        route(
            &origin,
            "/h/",
            r#"api_key = { header = "x-api-key", keys = { alice = "alice-key-1234" } }"#,
        ),
        route(
            &origin,
            "/q/",
            &format!(
                r#"api_key = {{ query = "key", keys_file = "{}" }}"#,
                keys.display()
            ),
        ),
        route(
            &origin,
            "/f/",
            r#"api_key = { keys = { alice = "alice-key-1234" }, forward = true }"#,
        ),
    ]))
    .await;
    let c = client();
    assert_eq!(get(&c, &larder.url("/h/a"), &[]).await.status, 401);
    let r = get(&c, &larder.url("/h/a"), &[("x-api-key", "alice-key-123")]).await;
    assert_eq!(r.status, 401);
    let r = get(&c, &larder.url("/h/a"), &[("x-api-key", "alice-key-1234")]).await;
    assert_eq!(r.status, 200);
    assert!(
        !r.text().contains("x-api-key"),
        "the key is not sent on: {}",
        r.text()
    );
    let r = get(&c, &larder.url("/q/a?x=1&key=bob-key-5678&y=2"), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        "/q/a?x=1&y=2",
        "the key's parameter is not sent on"
    );
    assert_eq!(
        get(&c, &larder.url("/q/a?key=alice-key-1234"), &[])
            .await
            .status,
        401
    );
    let r = get(&c, &larder.url("/f/a"), &[("x-api-key", "alice-key-1234")]).await;
    assert!(
        r.text().contains("x-api-key: alice-key-1234"),
        "{}",
        r.text()
    );

    // A reload recompiles the rules: alice's key replaced by carol's.
    larder
        .reload(&config(&[route(
            &origin,
            "/h/",
            r#"api_key = { keys = { carol = "carol-key-9999" } }"#,
        )]))
        .unwrap();
    let r = get(&c, &larder.url("/h/a"), &[("x-api-key", "alice-key-1234")]).await;
    assert_eq!(r.status, 401);
    let r = get(&c, &larder.url("/h/a"), &[("x-api-key", "carol-key-9999")]).await;
    assert_eq!(r.status, 200);
}

/// Keys and tokens made by PyJWT and `cryptography`: for each algorithm, a good token, an
/// expired one, one for another audience and one signed by another key; the public keys as
/// PEM files and together in a JWKS file (with `kid`s).
fn pyjwt(dir: &Path) -> serde_json::Value {
    pyjwt_kids(dir, "1")
}

/// [`pyjwt`], the JWKS's `kid`s ending in `-{kid}`.
fn pyjwt_kids(dir: &Path, kid: &str) -> serde_json::Value {
    let python = pip(PIP_PACKAGES);
    let script = r#"
import json, sys, time, jwt
from jwt.algorithms import RSAAlgorithm, ECAlgorithm, OKPAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa, ec, ed25519

d = sys.argv[1]
now = int(time.time())
def pem(k):
    return k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
secret = "a-shared-secret-of-32-bytes-long!"
keys = {
    "RS256": (rsa.generate_private_key(public_exponent=65537, key_size=2048), rsa.generate_private_key(public_exponent=65537, key_size=2048), RSAAlgorithm),
    "ES256": (ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1()), ECAlgorithm),
    "EdDSA": (ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate(), OKPAlgorithm),
}
out = {"secret": secret, "tokens": {}}
jwks = {"keys": []}
def tokens(alg, key, other, kid):
    claims = {"sub": "user-" + alg, "role": "admin", "iss": "https://issuer.test", "aud": "larder", "exp": now + 600}
    h = {"kid": kid} if kid else None
    return {
        "good": jwt.encode(claims, key, algorithm=alg, headers=h),
        "expired": jwt.encode(dict(claims, exp=now - 3600), key, algorithm=alg, headers=h),
        "wrong_aud": jwt.encode(dict(claims, aud="someone-else"), key, algorithm=alg, headers=h),
        "wrong_key": jwt.encode(claims, other, algorithm=alg, headers=h),
        "not_yet": jwt.encode(dict(claims, nbf=now + 3600), key, algorithm=alg, headers=h),
    }
out["tokens"]["HS256"] = tokens("HS256", secret, "another-secret-of-32-bytes-long!!", None)
for alg, (key, other, algo) in keys.items():
    open(f"{d}/{alg}.pem", "wb").write(pem(key))
    out["tokens"][alg] = tokens(alg, key, other, None)
    out["tokens"][alg + "-kid"] = tokens(alg, key, other, "k-" + alg + "-" + sys.argv[2])
    jwk = json.loads(algo.to_jwk(key.public_key()))
    jwk["kid"] = "k-" + alg + "-" + sys.argv[2]
    jwks["keys"].append(jwk)
json.dump(jwks, open(f"{d}/jwks.json", "w"))
print(json.dumps(out))
"#;
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(dir)
        .arg(kid)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn jwts_signed_by_pyjwt_with_every_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    let made = pyjwt(dir.path());
    let d = dir.path().display();
    let origin = echo().await;
    let common = r#"issuer = "https://issuer.test", audience = "larder", claims_to_headers = { "x-user" = "sub", "x-role" = "role" }"#;
    let secret = made["secret"].as_str().unwrap();
    let larder = Larder::start(&config(&[
        route(
            &origin,
            "/HS256/",
            &format!(r#"jwt = {{ secret = "{secret}", {common} }}"#),
        ),
        route(
            &origin,
            "/RS256/",
            &format!(r#"jwt = {{ public_key = "{d}/RS256.pem", {common} }}"#),
        ),
        route(
            &origin,
            "/ES256/",
            &format!(
                r#"jwt = {{ public_key = "{d}/ES256.pem", algorithms = ["ES256"], {common} }}"#
            ),
        ),
        route(
            &origin,
            "/EdDSA/",
            &format!(r#"jwt = {{ public_key = "{d}/EdDSA.pem", {common} }}"#),
        ),
        route(
            &origin,
            "/jwks/",
            &format!(r#"jwt = {{ jwks = "{d}/jwks.json", {common} }}"#),
        ),
        route(
            &origin,
            "/cookie/",
            &format!(r#"jwt = {{ secret = "{secret}", cookie = "session", {common} }}"#),
        ),
    ]))
    .await;
    let c = client();
    let bearer = |t: &serde_json::Value| format!("Bearer {}", t.as_str().unwrap());

    // No token: a bare challenge (RFC 6750 §3.1: no error code without credentials).
    let r = get(&c, &larder.url("/RS256/a"), &[]).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    let r = get(
        &c,
        &larder.url("/RS256/a"),
        &[("authorization", "Basic eDp5")],
    )
    .await;
    assert_eq!(r.status, 401);

    for (alg, path) in [
        ("HS256", "/HS256/"),
        ("RS256", "/RS256/"),
        ("ES256", "/ES256/"),
        ("EdDSA", "/EdDSA/"),
        ("RS256-kid", "/jwks/"),
        ("ES256-kid", "/jwks/"),
        ("EdDSA-kid", "/jwks/"),
    ] {
        let t = &made["tokens"][alg];
        let url = larder.url(&format!("{path}a"));
        let r = get(&c, &url, &[("authorization", &bearer(&t["good"]))]).await;
        assert_eq!(r.status, 200, "{alg}: {}", r.text());
        let sub = format!("user-{}", alg.trim_end_matches("-kid"));
        assert!(
            r.text().contains(&format!("x-user: {sub}")),
            "{alg}: {}",
            r.text()
        );
        assert!(r.text().contains("x-role: admin"), "{alg}: {}", r.text());
        for bad in ["expired", "wrong_aud", "wrong_key", "not_yet"] {
            let r = get(&c, &url, &[("authorization", &bearer(&t[bad]))]).await;
            assert_eq!(r.status, 401, "{alg} {bad}");
            assert_eq!(
                r.header("www-authenticate"),
                Some("Bearer error=\"invalid_token\""),
                "{alg} {bad}"
            );
        }
    }
    // A token of another algorithm than the route's key: refused (no algorithm confusion).
    let hs = bearer(&made["tokens"]["HS256"]["good"]);
    assert_eq!(
        get(&c, &larder.url("/RS256/a"), &[("authorization", &hs)])
            .await
            .status,
        401
    );
    let es = bearer(&made["tokens"]["ES256"]["good"]);
    assert_eq!(
        get(&c, &larder.url("/RS256/a"), &[("authorization", &es)])
            .await
            .status,
        401
    );

    // A forged x-user from the client is replaced by the claim; the token from a cookie.
    let cookie = format!(
        "a=1; session={}",
        made["tokens"]["HS256"]["good"].as_str().unwrap()
    );
    let r = get(
        &c,
        &larder.url("/cookie/a"),
        &[("cookie", &cookie), ("x-user", "forged")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("x-user: user-HS256"), "{}", r.text());
    assert!(!r.text().contains("forged"), "{}", r.text());
}

/// A policy: a `jwt` rule (a JWKS file, two audiences taken) and a response header from a claim.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_feeds_a_header_template() {
    let dir = tempfile::tempdir().unwrap();
    let made = pyjwt(dir.path());
    let origin = echo().await;
    let larder = Larder::start(&format!(
        r#"
[[policy.signed_in]]
jwt = {{ jwks = "{d}/jwks.json", audience = ["larder", "other"] }}
[[policy.signed_in]]
response_headers = {{ set = {{ "x-claim-sub" = "$jwt_claim_sub" }} }}

[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/"
  proxy = {{ upstream = "{origin}" }}
    [[listener.route.rule]]
    use = "signed_in"
"#,
        d = dir.path().display(),
        origin = origin.url()
    ))
    .await;
    let c = client();
    let t = format!(
        "Bearer {}",
        made["tokens"]["EdDSA-kid"]["good"].as_str().unwrap()
    );
    let r = get(&c, &larder.url("/x"), &[("authorization", &t)]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-claim-sub"), Some("user-EdDSA"));
}

/// A token in a query parameter is removed from the request to the origin (it would end in
/// the origin's logs) unless `forward = true`; one in a cookie is forwarded unless `forward =
/// false`, which removes that cookie alone.
#[tokio::test(flavor = "multi_thread")]
async fn where_a_jwt_was_read_decides_whether_the_origin_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let made = pyjwt(dir.path());
    let origin = echo().await;
    let jwks = format!("{}/jwks.json", dir.path().display());
    let larder = Larder::start(&config(&[
        route(
            &origin,
            "/q/",
            &format!(r#"jwt = {{ jwks = "{jwks}", query = "token" }}"#),
        ),
        route(
            &origin,
            "/qf/",
            &format!(r#"jwt = {{ jwks = "{jwks}", query = "token", forward = true }}"#),
        ),
        route(
            &origin,
            "/c/",
            &format!(r#"jwt = {{ jwks = "{jwks}", cookie = "jwt", forward = false }}"#),
        ),
    ]))
    .await;
    let token = made["tokens"]["EdDSA-kid"]["good"].as_str().unwrap();
    let c = client();
    let r = get(&c, &larder.url(&format!("/q/a?x=1&token={token}")), &[]).await;
    assert_eq!(r.status, 200);
    let r = get(&c, &larder.url(&format!("/qf/a?token={token}")), &[]).await;
    assert_eq!(r.status, 200);
    let cookie = format!("theme=dark; jwt={token}");
    let r = get(&c, &larder.url("/c/a"), &[("cookie", &cookie)]).await;
    assert_eq!(r.status, 200);
    let seen = origin.seen();
    let at = |prefix: &str| seen.iter().find(|s| s.path.starts_with(prefix)).unwrap();
    assert_eq!(at("/q/").path, "/q/a?x=1");
    assert_eq!(at("/qf/").path, format!("/qf/a?token={token}"));
    assert_eq!(at("/c/").headers["cookie"], "theme=dark");
}

/// The auth service of the forward-auth test: `Bearer good` is allowed (with `x-user`),
/// `Bearer bad` refused 401 with its challenge, `Bearer boom` fails (500), `Bearer slow`
/// answers after 5 s.
async fn auth_service() -> Origin {
    Origin::start(|req, _| {
        let auth = req
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match auth {
            Some("Bearer good") => Reply::ok("")
                .header("x-user", "ann")
                .header("x-other", "no"),
            Some("Bearer bad") => Reply::ok("go away\n")
                .status(401)
                .header("www-authenticate", "Bearer realm=\"auth\""),
            Some("Bearer teapot") => Reply::ok("").status(418),
            Some("Bearer slow") => Reply::ok("").delay(Duration::from_secs(5)),
            _ => Reply::ok("").status(500),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn forward_auth_asks_a_service_remembers_its_allows_and_fails_closed() {
    let origin = echo().await;
    let auth = auth_service().await;
    let check = format!("{}/check", auth.url());
    let clock = larder::clock::Clock::adjustable();
    let larder = Larder::start_at(
        &config(&[
            route(
                &origin,
                "/open/",
                &format!(r#"forward_auth = {{ url = "{check}", response_headers = ["x-user"], fail_open = true }}"#),
            ),
            route(
                &origin,
                "/gone/",
                r#"forward_auth = { url = "http://127.0.0.1:9/check" }"#,
            ),
            route(
                &origin,
                "/",
                &format!(
                    r#"forward_auth = {{ url = "{check}", request_headers = ["authorization"], response_headers = ["x-user"], cache_for = "30s", timeout = "300ms" }}"#
                ),
            ),
        ]),
        clock,
    )
    .await;
    let c = client();
    let good = [("authorization", "Bearer good"), ("x-user", "forged")];

    // Allowed: the chosen answer header replaces the client's; the service saw the request's
    // method, URI, host and client.
    let r = get(&c, &larder.url("/a?b=1"), &good).await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("x-user: ann"), "{}", r.text());
    assert!(!r.text().contains("forged"), "{}", r.text());
    let seen = auth.seen().pop().unwrap();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("GET", "/check")
    );
    assert_eq!(seen.headers["x-forwarded-uri"], "/a?b=1");
    assert_eq!(seen.headers["x-forwarded-method"], "GET");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert!(seen.headers.get("x-forwarded-host").is_some());

    // Remembered for 30 s by the Authorization value: no second subrequest, the header still
    // copied; after 30 s, asked again.
    let asked = auth.hits();
    for _ in 0..3 {
        let r = get(&c, &larder.url("/a"), &good).await;
        assert!(r.text().contains("x-user: ann"), "{}", r.text());
    }
    assert_eq!(auth.hits(), asked);
    larder.advance(Duration::from_secs(31));
    assert_eq!(get(&c, &larder.url("/a"), &good).await.status, 200);
    assert_eq!(auth.hits(), asked + 1);

    // Refused: the service's 401, challenge and body go to the client, each time (refusals
    // are not remembered); the origin is not asked.
    let before = origin.hits();
    for _ in 0..2 {
        let r = get(&c, &larder.url("/a"), &[("authorization", "Bearer bad")]).await;
        assert_eq!(r.status, 401);
        assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"auth\""));
        assert_eq!(r.text(), "go away\n");
    }
    assert_eq!(auth.hits(), asked + 3);
    // Another status: 403. The service failing (500), timing out, or not there: 503.
    let r = get(&c, &larder.url("/a"), &[("authorization", "Bearer teapot")]).await;
    assert_eq!(r.status, 403);
    let r = get(&c, &larder.url("/a"), &[("authorization", "Bearer boom")]).await;
    assert_eq!(r.status, 503);
    let r = get(&c, &larder.url("/a"), &[("authorization", "Bearer slow")]).await;
    assert_eq!(r.status, 503);
    assert_eq!(get(&c, &larder.url("/gone/a"), &good).await.status, 503);
    assert_eq!(origin.hits(), before);

    // fail_open: a failing service lets the request through (nothing copied); a refusal
    // still refuses.
    let r = get(
        &c,
        &larder.url("/open/a"),
        &[("authorization", "Bearer boom"), ("x-user", "forged")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(!r.text().contains("x-user"), "{}", r.text());
    let r = get(
        &c,
        &larder.url("/open/a"),
        &[("authorization", "Bearer bad")],
    )
    .await;
    assert_eq!(r.status, 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_jwks_url_is_fetched_on_an_unknown_kid_and_refreshed() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (first, second) = (pyjwt_kids(one.path(), "1"), pyjwt_kids(two.path(), "2"));
    let served = one.path().join("served.json");
    std::fs::copy(one.path().join("jwks.json"), &served).unwrap();
    let file = served.clone();
    let keys = Origin::start(move |_, _| {
        Reply::ok(std::fs::read(&file).unwrap()).header("content-type", "application/json")
    })
    .await;
    let origin = echo().await;
    let clock = larder::clock::Clock::adjustable();
    let larder = Larder::start_at(
        &config(&[route(
            &origin,
            "/",
            &format!(
                r#"jwt = {{ jwks = "{}/jwks.json", jwks_refresh = "5m", jwks_min_refresh = "10s" }}"#,
                keys.url()
            ),
        )]),
        clock,
    )
    .await;
    let c = client();
    let bearer = |made: &serde_json::Value, alg: &str| {
        format!("Bearer {}", made["tokens"][alg]["good"].as_str().unwrap())
    };

    // The first token: the keys are fetched (once), then known.
    for alg in ["RS256-kid", "ES256-kid", "EdDSA-kid"] {
        let r = get(
            &c,
            &larder.url("/a"),
            &[("authorization", &bearer(&first, alg))],
        )
        .await;
        assert_eq!(r.status, 200, "{alg}");
    }
    assert_eq!(keys.hits(), 1);

    // The issuer rotates its keys: a new kid. Within `jwks_min_refresh` of the last fetch it is
    // not fetched again (a client cannot make larder fetch on every request) ...
    std::fs::copy(two.path().join("jwks.json"), &served).unwrap();
    let new = bearer(&second, "ES256-kid");
    assert_eq!(
        get(&c, &larder.url("/a"), &[("authorization", &new)])
            .await
            .status,
        401
    );
    assert_eq!(keys.hits(), 1);
    // ... after it, the unknown kid fetches the new set.
    larder.advance(Duration::from_secs(11));
    assert_eq!(
        get(&c, &larder.url("/a"), &[("authorization", &new)])
            .await
            .status,
        200
    );
    assert_eq!(keys.hits(), 2);
    let old = bearer(&first, "ES256-kid");
    assert_eq!(
        get(&c, &larder.url("/a"), &[("authorization", &old)])
            .await
            .status,
        401
    );

    // Every `jwks_refresh` the set is fetched again in the background (the request goes on
    // with the keys it has).
    larder.advance(Duration::from_secs(301));
    assert_eq!(
        get(&c, &larder.url("/a"), &[("authorization", &new)])
            .await
            .status,
        200
    );
    for _ in 0..500 {
        if keys.hits() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(keys.hits(), 3);
}
