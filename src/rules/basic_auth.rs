//! Basic authentication (nginx's `auth_basic`, pingap's `basic_auth`): the users of an htpasswd
//! file as Apache's `htpasswd -B` writes it (bcrypt; `{SHA}` too), the file read again when it
//! changes ([`Watched`]). A request without valid credentials is answered 401 with
//! `WWW-Authenticate: Basic realm="..."`; the user's name goes into the request's notes
//! (`user`).
//!
//! bcrypt is slow by design (milliseconds a check), so a successful check is remembered: a
//! bounded map from SHA-256 of `user:password` to the user, that lives as long as the file's
//! version it was checked against (a changed file starts an empty one), so a request behind
//! basic auth costs a hash and a lookup, not a bcrypt. A check that must run bcrypt runs it on
//! the blocking pool (the step waits), at most [`CHECKS_AT_ONCE`] at a time.
//!
//! `Authorization` is sent upstream unless `forward = false`; then it is removed at ② only, from
//! the request to the origin: the cache decides on the request as received (RFC 9111 §3.5), so
//! a response is shared between users only when the origin marks it so (`public`, `s-maxage`).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use http::{header, request, HeaderValue, Request, Response, StatusCode};
use tokio::sync::Semaphore;

use super::watch::Watched;
use crate::body::{Body, RequestBody};
use crate::clock::Clock;
use crate::config::rules_auth::{parse_htpasswd, BasicAuthConfig, PasswordHash};
use crate::http::text_response;
use crate::phases::{Cx, Step, Verdict};

/// Successful checks remembered per version of the file.
const REMEMBERED: usize = 10_000;

/// bcrypt checks running at once (each takes a blocking thread for milliseconds).
pub const CHECKS_AT_ONCE: usize = 4;

/// The longest `Authorization` value looked at (a longer one is refused without decoding).
const MAX_CREDENTIALS: usize = 4096;

/// One version of the htpasswd file: its users and the checks that succeeded against it.
pub struct Users {
    users: HashMap<String, PasswordHash>,
    ok: quick_cache::sync::Cache<[u8; 32], ()>,
}

fn users(text: &str) -> Result<Users, String> {
    Ok(Users {
        users: parse_htpasswd(text)?.into_iter().collect(),
        ok: quick_cache::sync::Cache::new(REMEMBERED),
    })
}

/// `basic_auth = { htpasswd, realm, forward }`.
pub struct BasicAuth {
    file: Watched<Users>,
    challenge: HeaderValue,
    forward: bool,
    checks: Arc<Semaphore>,
}

impl BasicAuth {
    pub fn new(cfg: &BasicAuthConfig, clock: &Clock) -> BasicAuth {
        BasicAuth {
            file: Watched::open(&cfg.htpasswd, clock, users),
            challenge: HeaderValue::from_str(&format!(
                "Basic realm=\"{}\", charset=\"UTF-8\"",
                cfg.realm.0
            ))
            .expect("a realm is printable ASCII without quotes"),
            forward: cfg.forward,
            checks: Arc::new(Semaphore::new(CHECKS_AT_ONCE)),
        }
    }

    fn refuse(&self) -> Response<Body> {
        refusal(&self.challenge)
    }
}

fn refusal(challenge: &HeaderValue) -> Response<Body> {
    let mut r = text_response(StatusCode::UNAUTHORIZED, "authentication required\n");
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, challenge.clone());
    r
}

/// The user and password of `Authorization: Basic ...` (RFC 7617), if well formed.
pub fn credentials(value: &HeaderValue) -> Option<(String, String)> {
    let v = value.as_bytes();
    if v.len() > MAX_CREDENTIALS || v.len() < 6 || !v[..6].eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(v[6..].trim_ascii())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    for p in parts {
        ctx.update(p);
    }
    let mut out = [0; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// The hash an unknown user's password is checked against: bcrypt at `htpasswd -B`'s default
/// cost (5), made once.
fn unknown_user() -> &'static PasswordHash {
    static HASH: std::sync::OnceLock<PasswordHash> = std::sync::OnceLock::new();
    HASH.get_or_init(|| PasswordHash::Bcrypt(bcrypt::hash("no such user", 5).unwrap_or_default()))
}

/// Whether `password` is the one `hash` was made from.
fn verify(password: &str, hash: &PasswordHash) -> bool {
    use subtle::ConstantTimeEq;
    match hash {
        PasswordHash::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
        PasswordHash::Sha1(h) => {
            let d = aws_lc_rs::digest::digest(
                &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
                password.as_bytes(),
            );
            d.as_ref().ct_eq(h).into()
        }
    }
}

impl Step for BasicAuth {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let Some((user, password)) = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(credentials)
        else {
            return Verdict::Answer(self.refuse());
        };
        let Some(file) = self.file.get() else {
            return Verdict::Answer(text_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "authentication is not available\n",
            ));
        };
        let key = sha256(&[user.as_bytes(), b":", password.as_bytes()]);
        if file.ok.get(&key).is_some() {
            cx.notes.push(("user", user.into()));
            return Verdict::Next;
        }
        // An unknown user costs a bcrypt too (against a hash of htpasswd's default cost), so
        // that the time of a refusal does not tell which user names exist.
        let (hash, known) = match file.users.get(&user) {
            Some(h) => (h.clone(), true),
            None => (unknown_user().clone(), false),
        };
        let checks = Arc::clone(&self.checks);
        let challenge = self.challenge.clone();
        Verdict::Wait(Box::pin(async move {
            let _permit = checks.acquire_owned().await.expect("never closed");
            let good = tokio::task::spawn_blocking(move || verify(&password, &hash))
                .await
                .unwrap_or(false)
                && known;
            if !good {
                return Err(refusal(&challenge));
            }
            file.ok.insert(key, ());
            Ok(Some(
                Box::new(move |_: &mut Request<RequestBody>, cx: &mut Cx| {
                    cx.notes.push(("user", user.into()))
                }) as crate::phases::Edit,
            ))
        }))
    }

    fn upstream_request(&self, req: &mut request::Parts, _cx: &Cx) {
        if !self.forward {
            req.headers.remove(header::AUTHORIZATION);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(auth: &str) -> Request<RequestBody> {
        use http_body_util::BodyExt;
        let body = http_body_util::Empty::<bytes::Bytes>::new()
            .map_err(|never| match never {})
            .boxed();
        (Request::builder()
            .uri("/")
            .header(header::AUTHORIZATION, auth))
        .body(RequestBody::Stream(body))
        .unwrap()
    }

    #[test]
    fn credentials_are_read_as_rfc_7617_says() {
        let v = |s: &str| credentials(&HeaderValue::from_str(s).unwrap());
        assert_eq!(v("Basic YTpiOmM="), Some(("a".into(), "b:c".into())));
        assert_eq!(v("basic  YTpi "), Some(("a".into(), "b".into())));
        assert_eq!(v("Bearer YTpi"), None);
        assert_eq!(v("Basic YWI="), None, "no colon");
        assert_eq!(v("Basic !!"), None);
    }

    /// A bcrypt check runs once: the next request with the same credentials is let through at
    /// once (no wait), with the user in the notes.
    #[tokio::test]
    async fn a_good_check_is_remembered_and_names_the_user() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("users");
        let sha = {
            use base64::Engine;
            let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, b"old");
            base64::engine::general_purpose::STANDARD.encode(d.as_ref())
        };
        let bcrypt = bcrypt::hash("pw", 4).unwrap();
        std::fs::write(&file, format!("ann:{bcrypt}\nold:{{SHA}}{sha}\n")).unwrap();
        let cfg = BasicAuthConfig {
            htpasswd: file,
            realm: crate::config::rules_auth::Realm("r".into()),
            forward: true,
        };
        let step = BasicAuth::new(&cfg, &Clock::system());
        let auth = format!("Basic {}", {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode("ann:pw")
        });
        let mut cx = Cx::new("127.0.0.1:1".parse().unwrap());
        let mut req = request(&auth);
        let Verdict::Wait(w) = step.request(&mut req, &mut cx) else {
            panic!("the first check runs bcrypt")
        };
        let edit = w.await.ok().flatten().expect("the password is right");
        edit(&mut req, &mut cx);
        assert_eq!(cx.note("user"), Some("ann"));
        let mut cx = Cx::new("127.0.0.1:1".parse().unwrap());
        assert!(matches!(step.request(&mut req, &mut cx), Verdict::Next));
        assert_eq!(cx.note("user"), Some("ann"));
        // {SHA} entries (htpasswd -s) are taken too; a wrong password is refused.
        for (user, pw, good) in [
            ("old", "old", true),
            ("old", "new", false),
            ("ann", "no", false),
            ("nobody", "no such user", false),
        ] {
            let auth = format!("Basic {}", {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"))
            });
            let mut cx = Cx::new("127.0.0.1:1".parse().unwrap());
            let Verdict::Wait(w) = step.request(&mut request(&auth), &mut cx) else {
                panic!("checked")
            };
            assert_eq!(w.await.is_ok(), good, "{user}:{pw}");
        }
    }
}
