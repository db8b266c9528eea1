//! HTTP-dates (RFC 9110 §5.6.7), read and written once for every handler.
//!
//! Two readers, because the RFC asks for two behaviours:
//! - [`parse`]: a request's validators (If-Modified-Since, If-Unmodified-Since, If-Range). A
//!   recipient MUST ignore them when they are not a valid HTTP-date (§13.1.3, §13.1.4), so only
//!   the three forms of the grammar are taken.
//! - [`parse_lenient`]: a response's dates (Date, Expires, Last-Modified), read by the cache as a
//!   robust recipient (§5.6.7 encourages it): names in any case and a wrong weekday are taken.
//!
//! HTTP-dates have one-second resolution: compare times with [`secs`].

use std::time::{SystemTime, UNIX_EPOCH};

use http::header::HeaderValue;

/// A request field's HTTP-date, in any of the three forms of the grammar; None if the value is
/// not exactly one valid HTTP-date.
#[inline]
pub fn parse(v: &HeaderValue) -> Option<SystemTime> {
    httpdate::parse_http_date(v.to_str().ok()?).ok()
}

/// An HTTP-date in any of its three forms. Beyond the strict grammar, as a robust recipient:
/// names in the wrong case (`THU`, `AUG`, `gmt`) and a weekday that does not match the date are
/// accepted (the date itself decides). Anything else is None.
pub fn parse_lenient(s: &str) -> Option<SystemTime> {
    if let Ok(t) = httpdate::parse_http_date(s) {
        return Some(t);
    }
    // Normalise the case of every alphabetic token: "Thu", "Aug", "GMT".
    let mut fixed = String::with_capacity(s.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.eq_ignore_ascii_case("gmt") {
            out.push_str("GMT");
        } else {
            for (i, c) in word.chars().enumerate() {
                out.push(if i == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                });
            }
        }
        word.clear();
    };
    for c in s.trim().chars() {
        if c.is_ascii_alphabetic() {
            word.push(c);
        } else {
            flush(&mut word, &mut fixed);
            fixed.push(c);
        }
    }
    flush(&mut word, &mut fixed);
    if let Ok(t) = httpdate::parse_http_date(&fixed) {
        return Some(t);
    }
    // A wrong weekday: the leading day name is redundant; try each in the same form.
    const SHORT: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const LONG: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let day_len = fixed.find(|c: char| !c.is_ascii_alphabetic())?;
    let names = if day_len == 3 { SHORT } else { LONG };
    if !names
        .iter()
        .any(|n| n.eq_ignore_ascii_case(&fixed[..day_len]))
    {
        return None;
    }
    names
        .iter()
        .find_map(|n| httpdate::parse_http_date(&format!("{n}{}", &fixed[day_len..])).ok())
}

/// `t` as a field value (IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn value(t: SystemTime) -> HeaderValue {
    HeaderValue::from_str(&httpdate::fmt_http_date(t)).expect("an HTTP-date is a valid value")
}

/// Whole seconds since the epoch (0 before it): the resolution HTTP-dates compare at.
#[inline]
pub fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_in_any_case_and_with_a_wrong_weekday() {
        let want = httpdate::parse_http_date("Thu, 18 Aug 2050 02:01:18 GMT").unwrap();
        for s in [
            "Thu, 18 Aug 2050 02:01:18 GMT",
            "THU, 18 Aug 2050 02:01:18 GMT",
            "Thu, 18 AUG 2050 02:01:18 GMT",
            "Thu, 18 Aug 2050 02:01:18 gMT",
            "Mon, 18 Aug 2050 02:01:18 GMT",
            "Thursday, 18-Aug-50 02:01:18 GMT",
            "Thu Aug 18 02:01:18 2050",
        ] {
            assert_eq!(parse_lenient(s), Some(want), "{s}");
        }
        // Asctime with the weekday of another date: the date decides.
        assert!(parse_lenient("Thu Aug  8 02:01:18 2050").is_some());
        for s in [
            "Thu, 18 Aug 2050 02:01:18 UTC",
            "Thu, 18 Aug 2050 02:01:18 AEST",
            "Xyz, 18 Aug 2050 02:01:18 GMT",
            "0",
            "",
        ] {
            assert_eq!(parse_lenient(s), None, "{s}");
        }
    }

    #[test]
    fn request_dates_follow_the_grammar() {
        let hv = |s| HeaderValue::from_static(s);
        let want = httpdate::parse_http_date("Thu, 18 Aug 2050 02:01:18 GMT").ok();
        assert_eq!(parse(&hv("Thu, 18 Aug 2050 02:01:18 GMT")), want);
        assert_eq!(parse(&hv("Thursday, 18-Aug-50 02:01:18 GMT")), want);
        assert_eq!(parse(&hv("Thu Aug 18 02:01:18 2050")), want);
        // Not a valid HTTP-date: ignored, as §13.1.3 requires.
        assert_eq!(parse(&hv("THU, 18 AUG 2050 02:01:18 GMT")), None);
        assert_eq!(
            parse(&hv(
                "Thu, 18 Aug 2050 02:01:18 GMT, Fri, 19 Aug 2050 02:01:18 GMT"
            )),
            None
        );
    }

    #[test]
    fn written_and_compared_by_the_second() {
        let t = httpdate::parse_http_date("Thu, 18 Aug 2050 02:01:18 GMT").unwrap();
        assert_eq!(value(t), "Thu, 18 Aug 2050 02:01:18 GMT");
        assert_eq!(secs(t + std::time::Duration::from_millis(999)), secs(t));
        assert_eq!(secs(UNIX_EPOCH - std::time::Duration::from_secs(1)), 0);
    }
}
