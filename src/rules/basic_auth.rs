//! Basic authentication (nginx's `auth_basic`, pingap's `basic_auth`): the users of an htpasswd
//! file as Apache's `htpasswd -B` writes it (bcrypt; `{SHA}` too), the file read again when it
//! changes ([`Watched`]). A request without valid credentials is answered 401 with
//! `WWW-Authenticate: Basic realm="..."`; the user's name goes into the request's notes
//! (`user`).
//!
//! bcrypt is slow by design (milliseconds a check), so a successful check is remembered: a
//! bounded map ([`REMEMBERED_BYTES`]) from the `Authorization` value as sent to the user it
//! names, that lives as long as the file's version it was checked against (a changed file
//! starts an empty one), so a request behind basic auth costs one keyed hash of that value and
//! a lookup (compared in constant time), not a base64 decode, a SHA-256 or a bcrypt. Only a
//! check that succeeded is remembered. A check that must run bcrypt runs it on the blocking
//! pool (the step waits), at most [`CHECKS_AT_ONCE`] at a time.
//!
//! `Authorization` is sent upstream unless `forward = false`; then it is removed at ② only, from
//! the request to the origin: the cache decides on the request as received (RFC 9111 §3.5), so
//! a response is shared between users only when the origin marks it so (`public`, `s-maxage`).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use base64::Engine;
use http::{header, request, HeaderValue, Request, Response, StatusCode};
use quick_cache::Equivalent;
use tokio::sync::Semaphore;

use super::watch::Watched;
use crate::body::{Body, RequestBody};
use crate::clock::Clock;
use crate::config::rules_auth::{parse_htpasswd, BasicAuthConfig, PasswordHash};
use crate::http::text_response;
use crate::phases::{Cx, Step, Verdict};

/// Successful checks remembered per version of the file (about).
const REMEMBERED: usize = 10_000;

/// The most bytes the remembered checks of one version of the file hold (values and the map's
/// own, [`Weight`]): 10,000 `Authorization` values of 200 bytes.
const REMEMBERED_BYTES: u64 = 10_000 * 256;

/// bcrypt checks running at once (each takes a blocking thread for milliseconds).
pub const CHECKS_AT_ONCE: usize = 4;

/// The longest `Authorization` value looked at (a longer one is refused without decoding).
const MAX_CREDENTIALS: usize = 4096;

/// An `Authorization` value whose check succeeded, as it was sent (the remembered map's key):
/// compared in constant time.
struct Good(Box<[u8]>);

/// An `Authorization` value looked up in the remembered map (without copying it).
struct Offered<'a>(&'a [u8]);

impl Hash for Good {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write(&self.0);
    }
}

impl Hash for Offered<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write(self.0);
    }
}

impl PartialEq for Good {
    fn eq(&self, other: &Good) -> bool {
        Offered(&other.0).equivalent(self)
    }
}

impl Eq for Good {}

impl Equivalent<Good> for Offered<'_> {
    /// The time taken tells nothing of how much of a remembered value matched (aws-lc's
    /// `CRYPTO_memcmp`: one pass that ORs the bytes' differences, without the optimization
    /// barrier `subtle` puts on every byte).
    fn equivalent(&self, key: &Good) -> bool {
        aws_lc_rs::constant_time::verify_slices_are_equal(self.0, &key.0).is_ok()
    }
}

/// A remembered check's weight: its value's bytes and about what the map keeps beside them.
#[derive(Clone)]
struct Weight;

impl quick_cache::Weighter<Good, Arc<str>> for Weight {
    fn weight(&self, key: &Good, user: &Arc<str>) -> u64 {
        (key.0.len() + user.len() + 56) as u64
    }
}

/// One version of the htpasswd file: its users and the checks that succeeded against it.
pub struct Users {
    users: HashMap<String, PasswordHash>,
    ok: quick_cache::sync::Cache<Good, Arc<str>, Weight>,
}

fn users(text: &str) -> Result<Users, String> {
    Ok(Users {
        users: parse_htpasswd(text)?.into_iter().collect(),
        ok: quick_cache::sync::Cache::with_weighter(REMEMBERED, REMEMBERED_BYTES, Weight),
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
        let Some(value) = req.headers().get(header::AUTHORIZATION) else {
            return Verdict::Answer(self.refuse());
        };
        let file = self.file.get_in(cx);
        // The value as sent, checked before against this version of the file.
        let sent = Offered(value.as_bytes());
        let remembered = (file.as_ref())
            .filter(|_| sent.0.len() <= MAX_CREDENTIALS)
            .and_then(|f| f.ok.get(&sent));
        if let Some(user) = remembered {
            cx.notes.push(("user", user));
            return Verdict::Next;
        }
        let Some((user, password)) = credentials(value) else {
            return Verdict::Answer(self.refuse());
        };
        let Some(file) = file else {
            return Verdict::Answer(text_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "authentication is not available\n",
            ));
        };
        let sent = Good(value.as_bytes().into());
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
            let user: Arc<str> = user.into();
            file.ok.insert(sent, Arc::clone(&user));
            Ok(Some(
                Box::new(move |_: &mut Request<RequestBody>, cx: &mut Cx| {
                    cx.notes.push(("user", user))
                }) as crate::phases::Edit,
            ))
        }))
    }

    fn upstream_request(&self, req: &mut request::Parts, _cx: &Cx) {
        if !self.forward {
            req.headers.remove(header::AUTHORIZATION);
        }
    }

    fn upstream(&self) -> bool {
        !self.forward
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

    fn basic(user_password: &str) -> String {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(user_password);
        format!("Basic {b64}")
    }

    /// None: let through at once (a remembered check); Some(good): checked with bcrypt.
    async fn check(step: &BasicAuth, auth: &str) -> Option<bool> {
        let mut cx = Cx::new("127.0.0.1:1".parse().unwrap());
        match step.request(&mut request(auth), &mut cx) {
            Verdict::Next => None,
            Verdict::Wait(w) => Some(w.await.is_ok()),
            Verdict::Answer(_) => panic!("well-formed credentials are checked"),
        }
    }

    /// Only a check that succeeded is remembered, by the `Authorization` value as sent, and
    /// only for the version of the file it was made against: a wrong password runs bcrypt (and
    /// is refused) every time; once the file changes, a remembered value is checked again
    /// against the new file.
    #[tokio::test]
    async fn only_good_checks_are_remembered_and_a_changed_file_forgets_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("users");
        let line = |user: &str, pw: &str| format!("{user}:{}\n", bcrypt::hash(pw, 4).unwrap());
        std::fs::write(&file, line("ann", "pw")).unwrap();
        let cfg = BasicAuthConfig {
            htpasswd: file.clone(),
            realm: crate::config::rules_auth::Realm("r".into()),
            forward: true,
        };
        let clock = Clock::manual();
        let step = BasicAuth::new(&cfg, &clock);
        let good = basic("ann:pw");
        for _ in 0..2 {
            assert_eq!(check(&step, &basic("ann:no")).await, Some(false));
        }
        assert_eq!(check(&step, &good).await, Some(true));
        assert_eq!(check(&step, &good).await, None, "remembered");
        // The same credentials sent otherwise are another value: checked on their own.
        let spaced = good.replacen("Basic ", "basic  ", 1);
        assert_eq!(check(&step, &spaced).await, Some(true));
        assert_eq!(check(&step, &spaced).await, None);
        // Ann's password changes: within the second, the file is not looked at again.
        std::fs::write(&file, line("ann", "new") + &line("bob", "b")).unwrap();
        assert_eq!(check(&step, &good).await, None);
        clock.advance(std::time::Duration::from_secs(2));
        assert_eq!(
            check(&step, &good).await,
            Some(false),
            "forgotten, checked again"
        );
        assert_eq!(check(&step, &good).await, Some(false));
        assert_eq!(check(&step, &basic("ann:new")).await, Some(true));
        assert_eq!(check(&step, &basic("ann:new")).await, None);
    }
}
