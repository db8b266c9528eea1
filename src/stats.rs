//! `larder stats`: a running larder's statistics from its admin API, as varnishstat shows
//! Varnish's: totals and per-second rates of requests by cache result, the hit ratio (since
//! start and over the last interval, as `crate::metrics::HIT_RESULTS` defines it), bytes with
//! units, connections and the cache, refreshed every second; or the status JSON once, for scripts.
//! Beside it, `larder probe`: a health check of a running larder (a container's HEALTHCHECK,
//! which has no curl).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// `GET /_larder/status` from the admin listener at `admin`.
pub async fn fetch(admin: SocketAddr, token: &str) -> Result<serde_json::Value, String> {
    let (status, body) = admin_request(admin, token, http::Method::GET, "/_larder/status").await?;
    if !status.is_success() {
        return Err(format!(
            "the admin API answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))
}

/// One request to the admin API at `admin` with the bearer `token`: its status and body.
pub async fn admin_request(
    admin: SocketAddr,
    token: &str,
    method: http::Method,
    path: &str,
) -> Result<(http::StatusCode, Bytes), String> {
    let tcp = tokio::net::TcpStream::connect(admin)
        .await
        .map_err(|e| format!("cannot reach the admin API at {admin}: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, admin.to_string())
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
}

/// `larder reload`: asks the running larder to reload its configuration file; the answer
/// says what needs a restart, or why the file was refused.
pub async fn reload(admin: SocketAddr, token: &str) -> Result<String, String> {
    let (status, body) = admin_request(admin, token, http::Method::POST, "/_larder/reload").await?;
    let v: serde_json::Value = serde_json::from_slice(&body).map_err(|_| {
        format!(
            "the admin API answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        )
    })?;
    if status.is_success() {
        let restart: Vec<&str> = (v["needs_restart"].as_array().into_iter().flatten())
            .filter_map(|x| x.as_str())
            .collect();
        Ok(if restart.is_empty() {
            "configuration reloaded".into()
        } else {
            format!(
                "configuration reloaded; these changes apply at the next start: {}",
                restart.join(", ")
            )
        })
    } else {
        Err(format!(
            "reload refused, the running configuration stays: {}",
            v["error"].as_str().unwrap_or("unknown error")
        ))
    }
}

/// Runs `larder stats`: once (`--once`, JSON with `--json`), or refreshed every second.
pub async fn run(admin: SocketAddr, token: &str, once: bool, json: bool) -> Result<(), String> {
    let mut last = fetch(admin, token).await?;
    if once {
        if json {
            println!("{last}");
        } else {
            print!("{}", render(&last, None));
        }
        return Ok(());
    }
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = fetch(admin, token).await?;
        if json {
            println!("{now}");
        } else {
            // Clear the screen and go home, as varnishstat redraws.
            print!("\x1b[2J\x1b[H{}", render(&now, Some(&last)));
        }
        last = now;
    }
}

/// `n` bytes in the unit that keeps it short: B, KiB, MiB, GiB, TiB (binary, as the dashboard).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The table of `now`, with per-second rates against `before` (one second earlier).
pub fn render(now: &serde_json::Value, before: Option<&serde_json::Value>) -> String {
    use std::fmt::Write as _;
    let n = |v: &serde_json::Value, path: &[&str]| {
        path.iter()
            .try_fold(v, |v, k| v.get(k))
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "larder {}   up {}s   connections {} / {}",
        now["version"].as_str().unwrap_or("?"),
        n(now, &["uptime_seconds"]),
        n(now, &["connections", "open"]),
        n(now, &["connections", "max"])
    );
    let _ = writeln!(
        out,
        "cache: {} URLs, {} of {}, {} fills in flight",
        n(now, &["cache", "urls"]),
        bytes(n(now, &["cache", "bytes"])),
        bytes(n(now, &["cache", "capacity"])),
        n(now, &["cache", "fills_in_flight"])
    );
    for t in now["cache"]["tiers"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "{} tier: {} hits, {} misses, {} writes, {} errors",
            t["tier"].as_str().unwrap_or("?"),
            n(t, &["hits"]),
            n(t, &["misses"]),
            n(t, &["writes"]),
            n(t, &["errors"])
        );
    }
    let _ = writeln!(out, "{:<14}{:>14}{:>12}", "requests", "total", "per second");
    let mut keys: Vec<&str> = vec!["total"];
    if let Some(m) = now["requests"]["by_cache"].as_object() {
        keys.extend(m.keys().map(String::as_str));
    }
    for k in keys {
        let path: Vec<&str> = if k == "total" {
            vec!["requests", "total"]
        } else {
            vec!["requests", "by_cache", k]
        };
        let total = n(now, &path);
        let rate = before.map(|b| total.saturating_sub(n(b, &path)));
        let _ = writeln!(
            out,
            "{:<14}{:>14}{:>12}",
            k,
            total,
            rate.map_or("-".into(), |r| r.to_string())
        );
    }
    // The one hit ratio (crate::metrics::HIT_RESULTS over LOOKUP_RESULTS), as the server
    // counts it: since start, and over the last interval.
    let ratio = |v: &serde_json::Value| {
        (
            n(v, &["hit_ratio", "hits"]),
            n(v, &["hit_ratio", "lookups"]),
        )
    };
    let (hits, lookups) = ratio(now);
    let pct = |h: u64, l: u64| {
        if l == 0 {
            "-".to_string()
        } else {
            format!("{:.1}%", 100.0 * h as f64 / l as f64)
        }
    };
    let last = before.map(|b| {
        let (h0, l0) = ratio(b);
        pct(hits.saturating_sub(h0), lookups.saturating_sub(l0))
    });
    let _ = writeln!(
        out,
        "{:<14}{:>14}{:>12}",
        "hit ratio",
        pct(hits, lookups),
        last.unwrap_or_else(|| "-".into())
    );
    if now["bytes"].is_object() {
        let _ = writeln!(
            out,
            "{:<14}{:>14}{:>12}",
            "body bytes", "total", "per second"
        );
        for k in ["sent", "saved"] {
            let total = n(now, &["bytes", k]);
            let rate = before.map(|b| total.saturating_sub(n(b, &["bytes", k])));
            let _ = writeln!(
                out,
                "{:<14}{:>14}{:>12}",
                k,
                bytes(total),
                rate.map_or("-".into(), |r| format!("{}/s", bytes(r)))
            );
        }
    }
    out
}

/// `larder probe`: `GET path` from the listener at `addr` (plain HTTP), within `timeout`:
/// Ok with the status line when it answers 2xx or 3xx, else why not.
pub async fn probe(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String, String> {
    let ask = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("cannot reach {addr}: {e}"))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = http::Request::builder()
            .uri(path)
            .header(http::header::HOST, addr.to_string())
            .header(http::header::USER_AGENT, "larder-probe")
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("`{path}`: {e}"))?;
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(resp.status())
    };
    let status = tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| format!("{addr} did not answer within {timeout:?}"))??;
    if status.is_success() || status.is_redirection() {
        Ok(format!("{addr}{path}: {status}"))
    } else {
        Err(format!("{addr}{path} answered {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_differences() {
        let at = |hits: u64, misses: u64| {
            serde_json::json!({
                "version": "0.1.0", "uptime_seconds": 10,
                "connections": {"open": 3, "max": 100},
                "cache": {"urls": 1, "bytes": 10, "capacity": 100, "fills_in_flight": 0,
                          "tiers": [{"tier": "disk", "hits": 7, "misses": 2, "writes": 9, "errors": 0}]},
                "requests": {"total": hits + misses, "by_cache": {"HIT": hits, "MISS": misses}},
                "hit_ratio": {"hits": hits, "lookups": hits + misses},
                "bytes": {"sent": hits * 10, "saved": hits * 30},
            })
        };
        let table = render(&at(150, 10), Some(&at(100, 9)));
        assert!(
            table.contains("HIT                      150          50"),
            "{table}"
        );
        assert!(
            table.contains("total                    160          51"),
            "{table}"
        );
        // Since start 150 / 160; over the last second 50 / 51.
        assert!(
            table.contains("hit ratio              93.8%       98.0%"),
            "{table}"
        );
        assert!(table.contains("cache: 1 URLs, 10 B of 100 B"), "{table}");
        assert!(
            table.contains("disk tier: 7 hits, 2 misses, 9 writes, 0 errors"),
            "{table}"
        );
        assert!(
            table.contains("saved                4.4 KiB   1.5 KiB/s"),
            "{table}"
        );
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(5 << 30), "5.0 GiB");
    }
}
