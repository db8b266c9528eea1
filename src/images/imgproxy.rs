//! imgproxy's URL grammar: `/SIGNATURE/OPTION/OPTION/.../plain/SOURCE@EXT` (the source
//! percent-encoded) and `/SIGNATURE/OPTION/.../BASE64URL_SOURCE.EXT` (the source base64url,
//! possibly split by `/`). The signature is checked first (HMAC-SHA256 of salt + path with any
//! configured key pair, truncated to `signature_size` bytes, compared in constant time), then
//! the route's `default` preset and each option are applied ([`Options::apply_with`], presets
//! `pr` expanded in place; with `only_presets`, imgproxy's IMGPROXY_ONLY_PRESETS, the options
//! segment is preset names only, `/SIGNATURE/thumb:sharp/plain/SOURCE`), then the source is
//! decoded. An expired URL (`exp`) is a 403 too.

use std::time::SystemTime;

use aws_lc_rs::hmac;
use base64::Engine as _;
use percent_encoding::percent_decode_str;
use subtle::ConstantTimeEq as _;

use crate::config::image_options::Options;
use crate::config::ImgproxyConfig;

use super::grammar::{Grammar, GrammarError, Parsed, SourceRef};

/// Bytes of `s`, two hex digits each (checked at load, so a bad pair here is skipped).
fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The signature of `path` (from its `/`, after the signature segment) with `key` and `salt`,
/// as imgproxy makes it: base64url without padding of the first `size` bytes of the HMAC.
pub fn sign(key: &[u8], salt: &[u8], path: &str, size: usize) -> String {
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mut ctx = hmac::Context::with_key(&k);
    ctx.update(salt);
    ctx.update(path.as_bytes());
    let tag = ctx.sign();
    let mac = tag.as_ref();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&mac[..size.min(mac.len())])
}

/// Whether `sig` signs `path` with one of `cfg`'s key pairs (every pair is tried, so the time
/// taken says nothing of which matched).
fn signed(sig: &str, path: &str, cfg: &ImgproxyConfig) -> bool {
    let Ok(given) =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig.trim_end_matches('='))
    else {
        return false;
    };
    let size = cfg.signature_size.get() as usize;
    let mut ok = subtle::Choice::from(0);
    for pair in &cfg.keys {
        let (Some(key), Some(salt)) = (unhex(&pair.key), unhex(&pair.salt)) else {
            continue;
        };
        let k = hmac::Key::new(hmac::HMAC_SHA256, &key);
        let mut ctx = hmac::Context::with_key(&k);
        ctx.update(&salt);
        ctx.update(path.as_bytes());
        let tag = ctx.sign();
        let want = &tag.as_ref()[..size.min(tag.as_ref().len())];
        ok |= want.ct_eq(&given);
    }
    bool::from(ok)
}

/// imgproxy's options that redefine limits (IMGPROXY_ALLOW_SECURITY_OPTIONS).
const SECURITY_OPTIONS: [&str; 10] = [
    "max_src_resolution",
    "msr",
    "max_src_file_size",
    "msfs",
    "max_animation_frames",
    "maf",
    "max_animation_frame_resolution",
    "mafr",
    "max_result_dimension",
    "mrd",
];

fn bad(reason: impl Into<String>) -> GrammarError {
    GrammarError::Bad(reason.into())
}

/// Parses `path` (after the route's prefix, without its leading `/`). `now` decides `exp`.
pub fn parse(path: &str, cfg: &ImgproxyConfig, now: SystemTime) -> Result<Parsed, GrammarError> {
    let Some((sig, rest)) = path.split_once('/') else {
        return Err(bad("an imgproxy URL is /SIGNATURE/OPTIONS/SOURCE"));
    };
    if !cfg.keys.is_empty() && !signed(sig, &path[sig.len()..], cfg) {
        return Err(GrammarError::Signature("invalid signature"));
    }
    let mut options = Options::default();
    if let Some(d) = cfg.presets.get("default") {
        d.apply_to(&mut options).map_err(|e| bad(e.to_string()))?;
        // Named with the others (the access log says which presets served a request).
        options.presets.push("default".into());
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let start = if cfg.only_presets {
        // IMGPROXY_ONLY_PRESETS: the first segment is preset names and nothing else
        // (`thumb:sharp`); `pr:thumb` names a preset `pr`. An empty name (`//`, `thumb:`) is
        // refused as imgproxy refuses it: skipped, it served the source at its own size.
        let names: Vec<&str> = segments[0].split(':').collect();
        if names.iter().any(|n| n.is_empty()) {
            return Err(bad(
                "an empty preset name (this route takes only preset names)",
            ));
        }
        options
            .apply_with("pr", &names, &cfg.presets)
            .map_err(|e| bad(format!("{} (this route takes only preset names)", e.reason)))?;
        1
    } else {
        // Options are the segments before the first without a `:` (imgproxy's rule).
        let start = segments
            .iter()
            .position(|s| !s.contains(':'))
            .ok_or_else(|| bad("no source in the URL"))?;
        options_from(&segments[..start], &mut options, cfg)?;
        start
    };
    if start >= segments.len() {
        return Err(bad("no source in the URL"));
    }
    let (source, ext) = if segments[start] == "plain" {
        let joined = segments[start + 1..].join("/");
        let (src, ext) = match joined.rsplit_once('@') {
            Some((s, e)) if !e.contains('/') => (s.to_string(), e),
            _ => (joined.clone(), ""),
        };
        let src = percent_decode_str(&src)
            .decode_utf8()
            .map_err(|_| bad("the source is not UTF-8 once percent-decoded"))?
            .into_owned();
        (src, ext.to_string())
    } else {
        let joined = segments[start..].concat();
        let (enc, ext) = joined.split_once('.').unwrap_or((&joined, ""));
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(enc.trim_end_matches('='))
            .map_err(|_| bad("the source is neither `plain/...` nor base64url"))?;
        let src = String::from_utf8(bytes).map_err(|_| bad("the base64 source is not UTF-8"))?;
        (src, ext.to_string())
    };
    if !ext.is_empty() {
        options
            .apply("f", &[ext.as_str()])
            .map_err(|e| bad(format!("extension: {}", e.reason)))?;
    }
    if options.expires != 0 {
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if now > options.expires {
            return Err(GrammarError::Signature("the URL has expired"));
        }
    }
    Ok(Parsed {
        grammar: Grammar::Imgproxy,
        options,
        source: source_ref(&source)?,
    })
}

/// Applies URL options (`name:arg:arg` segments) to `options`.
fn options_from(
    segments: &[&str],
    options: &mut Options,
    cfg: &ImgproxyConfig,
) -> Result<(), GrammarError> {
    for seg in segments {
        let mut parts = seg.split(':');
        let name = parts.next().unwrap_or("");
        let args: Vec<&str> = parts.collect();
        // A URL may redefine the route's limits only where the route allows it (a preset, the
        // operator's own, may).
        if SECURITY_OPTIONS.contains(&name) && !cfg.allow_security_options {
            return Err(GrammarError::Signature(
                "security processing options are not allowed",
            ));
        }
        options
            .apply_with(name, &args, &cfg.presets)
            .map_err(|e| bad(e.to_string()))?;
    }
    Ok(())
}

/// What a decoded source names: `local:///path`, an `http(s)://` URL or a relative path.
fn source_ref(src: &str) -> Result<SourceRef, GrammarError> {
    if src.is_empty() || src.len() > 8192 || src.chars().any(char::is_control) {
        return Err(bad("empty or malformed source"));
    }
    if let Some(p) = src.strip_prefix("local://") {
        return Ok(SourceRef::Local(p.to_string()));
    }
    let lower = src.get(..8).unwrap_or(src).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Ok(SourceRef::Absolute(src.to_string()));
    }
    if let Some((scheme, _)) = src.split_once("://") {
        if scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-')
        {
            return Err(bad(format!("source scheme `{scheme}` is not supported")));
        }
    }
    Ok(SourceRef::Relative(src.trim_start_matches('/').to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::image_options::{OptionList, ResizeType};
    use crate::config::image_params::FormatChoice;
    use crate::config::KeyPair;
    use std::time::Duration;

    fn cfg() -> ImgproxyConfig {
        ImgproxyConfig::default()
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn plain_source_with_extension() {
        let p = parse(
            "insecure/rs:fill:100:100/plain/photo.jpg@webp",
            &cfg(),
            at(0),
        )
        .unwrap();
        assert_eq!(p.grammar, Grammar::Imgproxy);
        assert_eq!(p.source, SourceRef::Relative("photo.jpg".into()));
        assert_eq!(p.options.resize, ResizeType::Fill);
        assert_eq!(p.options.format, Some(FormatChoice::Webp));
        let p = parse("_/plain/a/b%20c.png", &cfg(), at(0)).unwrap();
        assert_eq!(p.source, SourceRef::Relative("a/b c.png".into()));
        assert_eq!(p.options.format, None);
        let p = parse(
            "x/w:10/plain/http%3A%2F%2Fexample.com%2Fa.jpg%3Fv%3D1@png",
            &cfg(),
            at(0),
        )
        .unwrap();
        assert_eq!(
            p.source,
            SourceRef::Absolute("http://example.com/a.jpg?v=1".into())
        );
        assert_eq!(p.options.format, Some(FormatChoice::Png));
        let p = parse("x/plain/local:///img/a.jpg", &cfg(), at(0)).unwrap();
        assert_eq!(p.source, SourceRef::Local("/img/a.jpg".into()));
        assert!(matches!(
            parse("x/plain/s3://bucket/a.jpg", &cfg(), at(0)),
            Err(GrammarError::Bad(_))
        ));
        assert!(matches!(
            parse("x/plain/a.jpg@bmp", &cfg(), at(0)),
            Err(GrammarError::Bad(_))
        ));
    }

    #[test]
    fn base64_source_split_by_slashes() {
        let enc = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode("http://example.com/images/curiosity.jpg");
        let (a, b) = enc.split_at(10);
        let p = parse(&format!("sig/rs:fit:50:50/{a}/{b}.webp"), &cfg(), at(0)).unwrap();
        assert_eq!(
            p.source,
            SourceRef::Absolute("http://example.com/images/curiosity.jpg".into())
        );
        assert_eq!(p.options.format, Some(FormatChoice::Webp));
        assert_eq!(p.options.width, 50);
        assert!(matches!(
            parse("sig/w:1/!!!", &cfg(), at(0)),
            Err(GrammarError::Bad(_))
        ));
    }

    #[test]
    fn options_errors_name_the_option() {
        let e = parse("x/rs:fill:abc/plain/a.jpg", &cfg(), at(0)).unwrap_err();
        assert!(
            matches!(&e, GrammarError::Bad(m) if m.contains("`rs`")),
            "{e}"
        );
        assert!(parse("x/w:10", &cfg(), at(0)).is_err());
    }

    #[test]
    fn presets_default_first() {
        let mut c = cfg();
        c.presets
            .insert("default".into(), OptionList::parse("q:50/w:20").unwrap());
        c.presets.insert(
            "thumb".into(),
            OptionList::parse("rs:fill:100:100").unwrap(),
        );
        let p = parse("x/pr:thumb/plain/a.jpg", &c, at(0)).unwrap();
        assert_eq!((p.options.width, p.options.quality), (100, 50));
        assert_eq!(p.options.presets, ["default", "thumb"]);
        let p = parse("x/plain/a.jpg", &c, at(0)).unwrap();
        assert_eq!(p.options.width, 20);
        assert!(parse("x/pr:nope/plain/a.jpg", &c, at(0)).is_err());
    }

    /// IMGPROXY_ONLY_PRESETS: the first segment names presets and nothing else.
    #[test]
    fn only_presets() {
        let mut c = cfg();
        c.only_presets = true;
        c.presets
            .insert("default".into(), OptionList::parse("q:50").unwrap());
        c.presets.insert(
            "thumb".into(),
            OptionList::parse("rs:fill:100:100").unwrap(),
        );
        c.presets
            .insert("narrow".into(), OptionList::parse("w:40").unwrap());
        let p = parse("x/thumb:narrow/plain/a.jpg@png", &c, at(0)).unwrap();
        assert_eq!((p.options.width, p.options.height), (40, 100));
        assert_eq!(p.options.quality, 50);
        assert_eq!(p.options.presets, ["default", "thumb", "narrow"]);
        assert_eq!(p.options.format, Some(FormatChoice::Png));
        assert_eq!(p.source, SourceRef::Relative("a.jpg".into()));
        for bad in [
            "x/pr:thumb/plain/a.jpg",
            "x/w:10/plain/a.jpg",
            "x/thumb/w:10/plain/a.jpg",
            "x/plain/a.jpg",
            "x/thumb",
            "x/",
            "x//plain/a.jpg",
            "x/:/plain/a.jpg",
            "x/thumb:/plain/a.jpg",
        ] {
            assert!(
                matches!(parse(bad, &c, at(0)), Err(GrammarError::Bad(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn expiry() {
        assert!(parse("x/exp:100/plain/a.jpg", &cfg(), at(100)).is_ok());
        assert_eq!(
            parse("x/exp:100/plain/a.jpg", &cfg(), at(101)).unwrap_err(),
            GrammarError::Signature("the URL has expired")
        );
    }

    #[test]
    fn signatures() {
        let mut c = cfg();
        c.keys = vec![
            KeyPair {
                key: "736563726574".into(),
                salt: "68656c6c6f".into(),
            },
            KeyPair {
                key: "6b6579".into(),
                salt: "73616c74".into(),
            },
        ];
        let path =
            "/rs:fill:300:400:0/g:sm/aHR0cDovL2V4YW1w/bGUuY29tL2ltYWdl/cy9jdXJpb3NpdHku/anBn.png";
        // The example of imgproxy's signing docs (key "secret", salt "hello").
        let sig = sign(b"secret", b"hello", path, 32);
        assert_eq!(sig, "oKfUtW34Dvo2BGQehJFR4Nr0_rIjOtdtzJ3QFsUcXH8");
        assert!(parse(&format!("{sig}{path}"), &c, at(0)).is_ok());
        let sig2 = sign(b"key", b"salt", path, 32);
        assert!(parse(&format!("{sig2}{path}"), &c, at(0)).is_ok());
        for bad in [
            "insecure",
            "_",
            &sig[..20],
            "oKfUtW34Dvo2BGQehJFR4Nr0_rIjOtdtzJ3QFsUcXH9",
        ] {
            assert_eq!(
                parse(&format!("{bad}{path}"), &c, at(0)).unwrap_err(),
                GrammarError::Signature("invalid signature"),
                "{bad}"
            );
        }
        // A tampered path fails with the right signature.
        let tampered = path.replace("300", "301");
        assert!(parse(&format!("{sig}{tampered}"), &c, at(0)).is_err());
        // Truncated signatures.
        c.signature_size = crate::config::Bounded(8);
        let short = sign(b"key", b"salt", path, 8);
        assert_eq!(short.len(), 11);
        assert!(parse(&format!("{short}{path}"), &c, at(0)).is_ok());
    }
}
