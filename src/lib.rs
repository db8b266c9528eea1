//! larder: a web accelerator. One binary in front of origin servers: a caching reverse proxy that
//! stores every cacheable text body once per encoding, a static file server, and fixed responses.
//!
//! # Layout, along the path a request takes
//!
//! - [`server`]: start ([`server::start`], the runtime, the admin listener) → listen and accept
//!   (the connection bound, h2c sniffing, or the TLS handshake of [`tls`]: certificates by SNI,
//!   ALPN, re-read when their files change, obtained and renewed by ACME; HTTP/3 over QUIC on
//!   the same port) → one connection's life with hyper over any
//!   [`server::Stream`] (HTTP/1.1, h2c; limits, idle watchdog, parking) → graceful shutdown;
//!   beside them the IO wrapper and the background services. [`interim`] (1xx responses
//!   forwarded to HTTP/1.1 clients, through the server's IO wrapper) and [`memory`] (returning
//!   freed memory) sit low, since handlers use them too.
//! - [`inbound`]: what every request must satisfy before routing; its one authority (Host).
//! - [`route`]: pick the handler by host and path prefix.
//! - [`proxy`]: the caching proxy's journey: lookup → coalesce → fill (`proxy/fill.rs`, in
//!   phases: fetch → revalidate → admit → store and respond) → deliver.
//! - [`upstream`]: the fetch: a route's pool of backends, one chosen by its balance among
//!   those healthy (active checks, passive ejection), retried elsewhere when an idempotent
//!   request failed before any answer; the exchange with it (larder's own HTTP/1.1
//!   connections in `upstream/h1.rs`; TLS and HTTP/2 through hyper-util's client).
//! - [`cache`]: one façade, [`cache::Cache`], over the stored responses: the byte-bounded memory
//!   tier and the tiers below it, each a `Storage` that one walk reads in order
//!   ([`cache::Cache::find`], [`cache::tiers`]: a disk tier kept across restarts, a tier in
//!   the fleet's Redis shared by every node, with leases), immutable entries
//!   ([`cache::entry`]) and their versioned record ([`cache::record`]), keys
//!   ([`cache::key`]), miss coalescing ([`cache::coalesce`]) and the RFC 9111 policy
//!   ([`cache::policy`]).
//! - [`deliver`]: a stored entry to a response; the hot path of a hit.
//! - [`range`]: Range / If-Range and 206 bodies (single or multipart), from memory or a file.
//!
//! Beside the path: [`config`] (typed settings), [`compress`] (codings and negotiation),
//! [`static_files`] (files from a root: memory-cached small files with pre-compressed
//! siblings, streamed large files, path safety), [`images`] (upload, store by MD5, transform,
//! cached results), [`respond`] (fixed responses, the redirect to HTTPS), [`metrics`] (requests
//! counted per worker thread, the OpenMetrics exposition, bytes sent and saved), [`access_log`]
//! (a line per request, written by a thread of its own), [`otel`] (a span per request,
//! exported to OpenTelemetry over OTLP), [`stats`] (`larder stats`), [`admin`] (who may purge, the
//! admin API and its dashboard), [`body`] (the response and request body types).
//!
//! [`push`] is a handler of its own: live JSON records written over HTTP and pushed to
//! subscribers (SSE, WebSocket), along its own path: request → store → durable log →
//! fan-out → subscriber streams; with `share`, the fleet's log in Redis ([`push::replicate`]).
//!
//! [`fleet`] is what the nodes share through one Redis (`[cache.shared]`): the connection, signed
//! values, blobs (image originals), the replicated logs (push) and the purge stream; the cache's
//! shared tier, images and push each use it.
//!
//! [`socket`] writes to plain TCP sockets, the server's and the upstream's, with `send` or
//! `sendmsg` rather than `writev` (cheaper in the kernel). [`clock`] holds the cache's wall
//! clock ([`clock::Clock`]: freshness, Age, the stale windows, bans, the tiers' lifetimes; built
//! by [`server::start_with`] and handed to the cache, which the handlers read it from, so that
//! tests move it instead of sleeping) and a coarse monotonic clock for deadlines that tolerate
//! milliseconds (the request-head deadline, the static re-stat).
//!
//! [`upgrade`] hands an HTTP/1.1 connection, after its 101, from the server to the handler that
//! answered it (WebSocket pass-through, push's WebSocket sessions).
//!
//! [`http`] holds the HTTP helpers every handler shares, written once: preconditions and the
//! 304 ([`http::conditional`]), entity-tags, HTTP-dates, the proxy's hop-by-hop / Via /
//! X-Forwarded-* fields ([`http::fields`]), query strings ([`http::query`]), short text and
//! JSON responses, and why an upstream exchange failed ([`http::FetchError`]).
//!
//! # Who imports whom
//!
//! Bottom up; each line imports only from lines above it, so no module imports one that imports
//! it back:
//!
//! 1. [`config`]: plain data (each part of the program gets its own typed slice; the handlers
//!    build their runtime objects from it). It imports nothing of larder's (a test in it checks).
//!    [`metrics`]; [`body`] (metrics: a response's body carries its outcome); [`memory`] (the
//!    count of freed memory the trim service reads); [`upgrade`]; [`socket`] (writes to TCP
//!    sockets with `send`/`sendmsg`); [`clock`].
//! 2. [`http`] (body); [`compress`] (body, config); [`range`], [`inbound`] (body, http);
//!    [`interim`] (http); [`respond`] (body, config); [`tls`] (config); [`access_log`]
//!    (config, metrics).
//! 3. [`fleet`] (config).
//! 4. [`cache`] (compress, config, http, metrics, clock, fleet); [`upstream`] (body, config,
//!    http, interim, metrics, socket, upgrade).
//! 5. [`deliver`] (cache, compress, http, range, metrics); [`admin`] (cache, config, http,
//!    metrics); [`otel`] (body, config, upstream).
//! 6. The handlers: [`proxy`] (also upstream), [`static_files`] (also clock), [`images`] (also
//!    fleet), [`push`] (also fleet) (the lines above).
//! 7. [`route`] (the handlers, admin, interim, inbound, metrics, access_log, otel, tls,
//!    upstream), [`server`] (route, interim, memory, tls, metrics, access_log, otel, upstream,
//!    socket, clock), [`cli`] (config, tls).
//!
//! Within the folders of [`cache`] and [`fleet`] too, no file imports a sibling that imports it
//! back (its `mod.rs` aside; a test checks).

pub mod access_log;
pub mod admin;
pub mod body;
pub mod cache;
pub mod cli;
pub mod clock;
pub mod compress;
pub mod config;
pub mod deliver;
pub mod fleet;
pub mod http;
pub mod images;
pub mod inbound;
pub mod interim;
pub mod memory;
pub mod metrics;
pub mod otel;
pub mod proxy;
pub mod push;
pub mod range;
pub mod respond;
pub mod route;
pub mod server;
pub mod socket;
pub mod static_files;
pub mod stats;
pub mod tls;
pub mod upgrade;
pub mod upstream;

#[cfg(test)]
mod layout {
    //! The module graph stays a ladder: no top-level module imports one that imports it back.

    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// Top-level modules each top-level module names (`crate::x`), outside its tests.
    fn graph() -> BTreeMap<String, BTreeSet<String>> {
        fn walk(dir: &Path, top: Option<&str>, g: &mut BTreeMap<String, BTreeSet<String>>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let path = e.unwrap().path();
                let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                let module = top.map_or(name.clone(), str::to_string);
                if path.is_dir() {
                    walk(&path, Some(&module), g);
                    continue;
                }
                if path.extension().is_none_or(|x| x != "rs") || name == "lib" || name == "main" {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let code: String = text
                    .split("#[cfg(test)]")
                    .next()
                    .unwrap_or("")
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .collect::<Vec<_>>()
                    .join("\n");
                let uses = g.entry(module.clone()).or_default();
                for (i, _) in code.match_indices("crate::") {
                    let rest = &code[i + "crate::".len()..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    let target = &rest[..end];
                    if !target.is_empty() && target != module {
                        uses.insert(target.to_string());
                    }
                }
            }
        }
        let mut g = BTreeMap::new();
        walk(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            None,
            &mut g,
        );
        g
    }

    /// The first import loop in `g`, as the path around it.
    fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
        // Depth-first search for a cycle; report its path.
        fn visit(
            m: &str,
            g: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(i) = path.iter().position(|p| p == m) {
                let mut cycle = path[i..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            if done.contains(m) {
                return None;
            }
            path.push(m.to_string());
            for next in g.get(m).into_iter().flatten() {
                if let Some(c) = visit(next, g, path, done) {
                    return Some(c);
                }
            }
            path.pop();
            done.insert(m.to_string());
            None
        }
        let mut done = BTreeSet::new();
        g.keys()
            .find_map(|m| visit(m, g, &mut Vec::new(), &mut done))
    }

    /// The files of the folder `dir` of `src` (its `mod.rs` aside; a folder within it counts as
    /// one file, its `mod.rs`) and the sibling files each names (`super::x`), outside its tests.
    fn folder(dir: &str) -> BTreeMap<String, BTreeSet<String>> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
        // A file, or a folder of its own (its `mod.rs`).
        let files: BTreeMap<String, String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter_map(|p| match p.is_dir() {
                true => Some((p.file_name()?.to_owned(), p.join("mod.rs"))),
                false if p.extension().is_some_and(|x| x == "rs") => {
                    Some((p.file_stem()?.to_owned(), p))
                }
                false => None,
            })
            .filter(|(name, p)| name != "mod" && p.exists())
            .map(|(name, p)| {
                let name = name.to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&p).unwrap())
            })
            .collect();
        let mut g = BTreeMap::new();
        for (name, text) in &files {
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let uses: &mut BTreeSet<String> = g.entry(name.clone()).or_default();
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (i, _) in line.match_indices("super::") {
                    let rest = &line[i + "super::".len()..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    let target = &rest[..end];
                    if target != name && files.contains_key(target) {
                        uses.insert(target.to_string());
                    }
                }
            }
        }
        g
    }

    #[test]
    fn no_module_imports_one_that_imports_it_back() {
        let g = graph();
        if let Some(cycle) = cycle(&g) {
            panic!("import loop: {}", cycle.join(" -> "));
        }
        assert!(g["config"].is_empty(), "config imports {:?}", g["config"]);
        // The fleet sits below every module that uses it.
        for user in ["cache", "images", "push"] {
            assert!(!g["fleet"].contains(user), "fleet imports {user}");
        }
    }

    /// Nor does a file of these folders import a sibling that imports it back (the folder's
    /// `mod.rs` aside: it declares them all).
    #[test]
    fn no_file_of_a_folder_imports_one_that_imports_it_back() {
        for dir in ["cache", "cache/entry", "fleet"] {
            if let Some(cycle) = cycle(&folder(dir)) {
                panic!("import loop in src/{dir}: {}", cycle.join(" -> "));
            }
        }
    }
}
