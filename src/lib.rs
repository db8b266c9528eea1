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
//!   [`real_ip`]: who the client is behind trusted proxies (their X-Forwarded-For, Forwarded or
//!   X-Real-IP), per request; behind a PROXY protocol header, per connection (the accept loop).
//! - [`route`]: pick the handler by host and path prefix, and run the route's [`phases`]
//!   around it, the same for every handler:
//!
//!   ```text
//!   route ─▶ ① request ─▶ handler ──────────────────────────────────▶ ④ deliver ─▶ ⑤ log
//!            (may answer)   proxy miss / pass: ② upstream request ─▶ origin ─▶ ③ upstream response
//!   ```
//!
//!   ① and ④ in [`route`] (`phased`), ⑤ where the access log line is written
//!   ([`route::Observed::finish`]), ② and ③ in the proxy's fill and pass. A route without
//!   steps holds `None`: one `Option` checked per request, not a branch per kind of rule.
//! - [`rules`]: a route's rules (docs/rules.md), compiled into its phases' steps when the
//!   router is built: conditions on the request ([`rules::when`]) and one action each
//!   (access by address, header edits, fixed answers, the cache key's parts and lifetimes,
//!   splits and mirrors, ...), the same for every handler.
//! - [`proxy`]: the caching proxy's journey (`proxy/journey.rs`): lookup → coalesce → fill
//!   (`proxy/fill.rs`, in steps: fetch → revalidate → admit → store and respond) → deliver;
//!   beside it what the cache does not serve (`proxy/pass.rs`: pass, forward, tunnel) and the
//!   adaptation of responses not delivered from the store (`proxy/adapt.rs`: range cut,
//!   recode, compression on the fly).
//! - [`upstream`]: the fetch: a route's pool of backends, one chosen by its balance among
//!   those healthy (active checks, passive ejection), retried elsewhere when an idempotent
//!   request failed before any answer; the exchange with it (larder's own HTTP/1.1
//!   connections in `upstream/h1.rs`; TLS and HTTP/2 through hyper-util's client).
//! - [`cache`]: one façade, [`cache::Cache`], over the stored responses: the byte-bounded memory
//!   tier and the tiers below it, each a `Storage` that one walk reads in order
//!   ([`cache::Cache::find`], [`cache::tiers`]: a disk tier kept across restarts, a tier in
//!   the fleet's Redis shared by every node, with leases), immutable entries
//!   ([`cache::entry`]) and their versioned record ([`cache::record`]), keys and a request's
//!   key ([`cache::key`]), miss coalescing ([`cache::coalesce`]) and the RFC 9111 policy
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
//! subscribers (SSE, WebSocket), along its own path: request → store → durable log → the
//! store's observers, in commit order: fan-out → subscriber streams; with `share`, the fleet's
//! log in Redis ([`push::replicate`]).
//!
//! [`fleet`] is what the nodes share through one Redis (`[cache.shared]`): the connection, signed
//! values, blobs (image originals), the replicated logs (push) and the purge stream. The server
//! opens it once at start and hands it to the cache (its shared tier) and, through each router
//! built, to images and push, as it hands them the cache; none of them reaches it through another.
//!
//! [`socket`] writes to plain TCP sockets, the server's and the upstream's, with `send` or
//! `sendmsg` rather than `writev` (cheaper in the kernel), and large stored bodies, which
//! [`mapped`] keeps in memory files, with `sendfile` (no copy into the socket). [`clock`] holds the cache's wall
//! clock ([`clock::Clock`]: freshness, Age, the stale windows, bans, the tiers' lifetimes; built
//! by [`server::start_with`] and handed to the cache, which the handlers read it from, so that
//! tests move it instead of sleeping) and a coarse monotonic clock for deadlines that tolerate
//! milliseconds (the request-head deadline, the static re-stat).
//!
//! [`service`] is larder as a service of the system: systemd's notifications (ready, watchdog,
//! reloading, stopping), giving up root after binding, the PID file.
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
//! it back (the `layout` test below checks it, and the same inside every folder: no file imports
//! one that imports it back; a folder's mod.rs may import its files):
//!
//! 1. [`config`]: plain data (each part of the program gets its own typed slice; the handlers
//!    build their runtime objects from it). It imports nothing of larder's (the layout test checks).
//!    [`metrics`]; [`body`] (metrics: a response's body carries its outcome); [`memory`] (the
//!    count of freed memory the trim service reads); [`upgrade`]; [`mapped`] (large bodies in
//!    memory files); [`socket`] (writes to TCP sockets with `send`/`sendmsg`/`sendfile`;
//!    mapped); [`clock`].
//! 2. [`http`] (body); [`phases`] (body, clock); [`compress`] (body, config); [`range`], [`inbound`] (body, http);
//!    [`real_ip`] (config, http);
//!    [`interim`] (http); [`respond`] (body, config); [`tls`] (config); [`access_log`]
//!    (config, metrics); [`service`] (config).
//! 3. [`fleet`] (config).
//! 4. [`cache`] (compress, config, http, inbound, metrics, clock, fleet, mapped); [`upstream`] (body,
//!    config, http, interim, metrics, socket, upgrade).
//! 5. [`deliver`] (cache, compress, http, range, metrics); [`admin`] (cache, config, http,
//!    metrics, tls, upstream: a configuration checked as `larder check` does); [`otel`] (body, config, upstream).
//! 6. The handlers: [`proxy`] (also upstream, phases), [`static_files`] (also clock), [`images`]
//!    (also fleet, access_log: what the log says of an image request, and upstream:
//!    originals from an origin), [`push`] (also fleet) (the lines
//!    above); [`rules`] (body, config, phases, admin,
//!    http, inbound, respond, fleet, upstream, metrics, clock, and [`proxy`] for the decisions the
//!    cache and traffic rules leave it: `proxy::Steer`).
//! 7. [`route`] (the handlers, admin, interim, inbound, metrics, access_log, otel, phases,
//!    real_ip, tls, upstream, fleet), [`server`] (route, rules, interim, memory, tls, metrics,
//!    access_log, otel, upstream, socket, clock, fleet, service), [`cli`] (config, tls).
//!
//! Within every folder too, no file imports a sibling that imports it back (its `mod.rs` aside;
//! the `layout` test checks).

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
pub mod mapped;
pub mod memory;
pub mod metrics;
pub mod otel;
pub mod phases;
pub mod proxy;
pub mod push;
pub mod range;
pub mod real_ip;
pub mod respond;
pub mod route;
pub mod rules;
pub mod server;
pub mod service;
pub mod socket;
pub mod static_files;
pub mod stats;
pub mod tls;
pub mod upgrade;
pub mod upstream;

#[cfg(test)]
mod layout {
    //! The imports form no circle: between the top-level modules, nor between the files of any
    //! folder (src/ read by `syn`, the items under `#[cfg(test)]` left out).
    //!
    //! An import is a path that names a module of larder: from `crate::`, `super::`, `self::`
    //! or a child module's name, in a `use`, in code or a type, or in a macro's tokens. It is an
    //! edge of the folder where the two files part: `super::codec::Raster` in images/avif.rs is
    //! avif → codec in src/images/, `crate::http::Etag` in cache/disk.rs is cache → http in src/.
    //!
    //! A folder's top (its mod.rs; lib.rs for src/) may import its files: that closes no circle.
    //! A file may use what its top defines (`super::ImageError`): an edge to the top, which leads
    //! nowhere. What the top only brings in with a `use` (`use codec::Limits;`, then
    //! `super::Limits` in a file) counts as importing the file it comes from, so no circle hides
    //! behind a re-export. Not followed: a module named through a `use` alias elsewhere
    //! (`use crate::images; images::avif::decode`).

    use std::collections::{BTreeMap, BTreeSet, VecDeque};
    use std::path::Path;

    use syn::visit::{self, Visit};

    /// Circles let stand for a while, each naming the work that removes it: (folder, its files
    /// in the circle, the work). None today: the last ones went with issue #40 (the tiers' trait
    /// and the fleet's module, push's observers, images' raster, upstream's send error). The test
    /// fails when one listed changes or is gone.
    const KNOWN_CIRCLES: &[(&str, &[&str], &str)] = &[];

    /// A module's path from the crate root: [] is lib.rs, ["images"] images/mod.rs,
    /// ["images", "codec"] images/codec.rs.
    type Module = Vec<String>;

    /// One folder's edges: from → to → where one of them is written.
    type Graph = BTreeMap<String, BTreeMap<String, String>>;

    /// A file: where it is, the paths it writes and the names its `use` items bring in.
    struct Source {
        file: String,
        paths: Paths,
    }

    /// The paths of a file that may name a module of larder, each with the module it is written
    /// in (the file's, or an inline module's inside it).
    #[derive(Default)]
    struct Paths {
        scope: Module,
        found: Vec<(Module, Vec<String>)>,
        /// (scope, name, path): what a `use` brings in under a name.
        uses: Vec<(Module, String, Vec<String>)>,
    }

    /// `#[cfg(test)]` or `#[cfg(all(test, ...))]`.
    fn is_test(attrs: &[syn::Attribute]) -> bool {
        attrs.iter().any(|a| {
            a.path().is_ident("cfg")
                && a.meta.require_list().is_ok_and(|l| {
                    let t = l.tokens.to_string();
                    t == "test"
                        || (t.starts_with("all")
                            && t.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                                .any(|w| w == "test"))
                })
        })
    }

    /// The paths a `use` tree names, each with the name it brings in (none for a glob).
    fn flatten(
        tree: &syn::UseTree,
        prefix: &[String],
        out: &mut Vec<(Vec<String>, Option<String>)>,
    ) {
        let with = |i: &syn::Ident| [prefix, &[i.to_string()]].concat();
        match tree {
            syn::UseTree::Path(p) => flatten(&p.tree, &with(&p.ident), out),
            syn::UseTree::Name(n) if n.ident == "self" => {
                out.push((prefix.to_vec(), prefix.last().cloned()))
            }
            syn::UseTree::Name(n) => out.push((with(&n.ident), Some(n.ident.to_string()))),
            syn::UseTree::Rename(r) if r.ident == "self" => {
                out.push((prefix.to_vec(), Some(r.rename.to_string())))
            }
            syn::UseTree::Rename(r) => out.push((with(&r.ident), Some(r.rename.to_string()))),
            syn::UseTree::Glob(_) => out.push((prefix.to_vec(), None)),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| flatten(t, prefix, out)),
        }
    }

    /// The `a::b::c` paths in a macro's tokens, which syn leaves unparsed.
    fn scan(mut at: syn::buffer::Cursor, scope: &Module, found: &mut Vec<(Module, Vec<String>)>) {
        while !at.eof() {
            if let Some((inside, _, _, next)) = at.any_group() {
                scan(inside, scope, found);
                at = next;
            } else if let Some((ident, mut next)) = at.ident() {
                let mut segs = vec![ident.to_string()];
                while let Some((_, b)) = next.punct().filter(|(p, _)| p.as_char() == ':') {
                    let Some((_, c)) = b.punct().filter(|(p, _)| p.as_char() == ':') else {
                        break;
                    };
                    let Some((ident, d)) = c.ident() else { break };
                    segs.push(ident.to_string());
                    next = d;
                }
                if segs.len() > 1 {
                    found.push((scope.clone(), segs));
                }
                at = next;
            } else {
                match at.token_tree() {
                    Some((_, next)) => at = next,
                    None => break,
                }
            }
        }
    }

    impl<'ast> Visit<'ast> for Paths {
        fn visit_item(&mut self, i: &'ast syn::Item) {
            use syn::Item::*;
            let attrs: &[syn::Attribute] = match i {
                Const(i) => &i.attrs,
                Enum(i) => &i.attrs,
                ExternCrate(i) => &i.attrs,
                Fn(i) => &i.attrs,
                ForeignMod(i) => &i.attrs,
                Impl(i) => &i.attrs,
                Macro(i) => &i.attrs,
                Mod(i) => &i.attrs,
                Static(i) => &i.attrs,
                Struct(i) => &i.attrs,
                Trait(i) => &i.attrs,
                TraitAlias(i) => &i.attrs,
                Type(i) => &i.attrs,
                Union(i) => &i.attrs,
                Use(i) => &i.attrs,
                _ => &[],
            };
            if !is_test(attrs) {
                visit::visit_item(self, i);
            }
        }

        fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
            let attrs: &[syn::Attribute] = match i {
                syn::ImplItem::Const(i) => &i.attrs,
                syn::ImplItem::Fn(i) => &i.attrs,
                syn::ImplItem::Type(i) => &i.attrs,
                syn::ImplItem::Macro(i) => &i.attrs,
                _ => &[],
            };
            if !is_test(attrs) {
                visit::visit_impl_item(self, i);
            }
        }

        fn visit_trait_item(&mut self, i: &'ast syn::TraitItem) {
            let attrs: &[syn::Attribute] = match i {
                syn::TraitItem::Const(i) => &i.attrs,
                syn::TraitItem::Fn(i) => &i.attrs,
                syn::TraitItem::Type(i) => &i.attrs,
                syn::TraitItem::Macro(i) => &i.attrs,
                _ => &[],
            };
            if !is_test(attrs) {
                visit::visit_trait_item(self, i);
            }
        }

        fn visit_stmt(&mut self, s: &'ast syn::Stmt) {
            let attrs: &[syn::Attribute] = match s {
                syn::Stmt::Local(l) => &l.attrs,
                syn::Stmt::Macro(m) => &m.attrs,
                _ => &[],
            };
            if !is_test(attrs) {
                visit::visit_stmt(self, s);
            }
        }

        fn visit_field(&mut self, f: &'ast syn::Field) {
            if !is_test(&f.attrs) {
                visit::visit_field(self, f);
            }
        }

        fn visit_variant(&mut self, v: &'ast syn::Variant) {
            if !is_test(&v.attrs) {
                visit::visit_variant(self, v);
            }
        }

        fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
            self.scope.push(m.ident.to_string());
            visit::visit_item_mod(self, m);
            self.scope.pop();
        }

        fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
            if u.leading_colon.is_some() {
                return;
            }
            let mut out = Vec::new();
            flatten(&u.tree, &[], &mut out);
            for (segs, name) in out {
                if let Some(name) = name {
                    self.uses.push((self.scope.clone(), name, segs.clone()));
                }
                self.found.push((self.scope.clone(), segs));
            }
        }

        fn visit_path(&mut self, p: &'ast syn::Path) {
            if p.leading_colon.is_none() && p.segments.len() > 1 {
                let segs = p.segments.iter().map(|s| s.ident.to_string()).collect();
                self.found.push((self.scope.clone(), segs));
            }
            visit::visit_path(self, p);
        }

        fn visit_macro(&mut self, m: &'ast syn::Macro) {
            let tokens = syn::buffer::TokenBuffer::new2(m.tokens.clone());
            scan(tokens.begin(), &self.scope, &mut self.found);
            visit::visit_macro(self, m);
        }
    }

    /// Every module of src/ that is a file (main.rs, the binary's crate, left out).
    fn read() -> BTreeMap<Module, Source> {
        fn walk(src: &Path, dir: &Path, module: &[String], out: &mut BTreeMap<Module, Source>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let path = e.unwrap().path();
                let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
                let mut m = module.to_vec();
                if path.is_dir() {
                    m.push(stem);
                    walk(src, &path, &m, out);
                    continue;
                }
                let top = stem == "mod" || (module.is_empty() && stem == "lib");
                if path.extension().is_none_or(|x| x != "rs")
                    || (module.is_empty() && stem == "main")
                {
                    continue;
                }
                if !top {
                    m.push(stem);
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let ast =
                    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let mut paths = Paths {
                    scope: m.clone(),
                    ..Paths::default()
                };
                paths.visit_file(&ast);
                let file = path.strip_prefix(src).unwrap().display().to_string();
                out.insert(m, Source { file, paths });
            }
        }
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut out = BTreeMap::new();
        walk(&src, &src, &[], &mut out);
        out
    }

    struct Layout {
        files: BTreeMap<Module, Source>,
    }

    /// How a folder is shown: src/, src/images/.
    fn folder_name(m: &[String]) -> String {
        m.iter().fold("src/".to_string(), |s, p| format!("{s}{p}/"))
    }

    fn top_name(folder: &[String]) -> &'static str {
        if folder.is_empty() {
            "lib.rs"
        } else {
            "mod.rs"
        }
    }

    impl Layout {
        /// The path `segs`, written in module `scope`, from the crate root; none if it does not
        /// start in larder.
        fn absolute(&self, scope: &[String], segs: &[String]) -> Option<Vec<String>> {
            let (mut at, mut rest) = match segs.first()?.as_str() {
                "crate" => (Vec::new(), &segs[1..]),
                "self" | "super" => (scope.to_vec(), segs),
                child => {
                    let m = [scope, &[child.to_string()]].concat();
                    if !self.files.contains_key(&m) {
                        return None;
                    }
                    (scope.to_vec(), segs)
                }
            };
            while let Some(s) = rest.first() {
                match s.as_str() {
                    "self" => {}
                    "super" => {
                        at.pop()?;
                    }
                    _ => break,
                }
                rest = &rest[1..];
            }
            at.extend(rest.iter().cloned());
            Some(at)
        }

        fn is_top(&self, m: &[String]) -> bool {
            (self.files.keys()).any(|k| k.len() == m.len() + 1 && k.starts_with(m))
        }

        /// The file that defines what `path` names, following the names a folder's top brings
        /// in with `use`; and the top, if the path named an item of one (defined or brought in).
        fn locate(&self, path: &[String], hops: usize) -> (Module, Option<Module>) {
            let k = (0..=path.len())
                .rev()
                .find(|&k| self.files.contains_key(&path[..k]))
                .expect("lib.rs");
            let module = path[..k].to_vec();
            if k == path.len() || !self.is_top(&module) {
                return (module, None);
            }
            let brought = (self.files[&module].paths.uses.iter())
                .find(|(scope, name, _)| *scope == module && *name == path[k])
                .and_then(|(_, _, segs)| self.absolute(&module, segs));
            match brought {
                Some(to) if hops < 8 => {
                    let to = [&to[..], &path[k + 1..]].concat();
                    (self.locate(&to, hops + 1).0, Some(module))
                }
                _ => (module.clone(), Some(module)),
            }
        }

        /// Each folder's graph, and the edges of its files to what their top names.
        fn graphs(&self) -> (BTreeMap<Module, Graph>, BTreeMap<Module, Graph>) {
            let mut graphs: BTreeMap<Module, Graph> = BTreeMap::new();
            let mut via_top: BTreeMap<Module, Graph> = BTreeMap::new();
            for (from_module, source) in &self.files {
                for (scope, segs) in &source.paths.found {
                    let Some(path) = self.absolute(scope, segs) else {
                        continue;
                    };
                    let (to_module, top) = self.locate(&path, 0);
                    if to_module == *from_module {
                        continue;
                    }
                    let k = (from_module.iter().zip(&to_module))
                        .take_while(|(a, b)| a == b)
                        .count();
                    let folder = from_module[..k].to_vec();
                    let node = |m: &Module| {
                        m.get(k)
                            .map_or(top_name(&folder).to_string(), |s| s.clone())
                    };
                    let (from, to) = (node(from_module), node(&to_module));
                    if k == from_module.len() {
                        continue; // a top imports its files
                    }
                    let example = format!("{}: {}", source.file, segs.join("::"));
                    if top.as_ref() == Some(&folder) {
                        (via_top.entry(folder.clone()).or_default())
                            .entry(from.clone())
                            .or_default()
                            .insert(segs.join("::"), example.clone());
                    }
                    (graphs.entry(folder).or_default())
                        .entry(from)
                        .or_default()
                        .entry(to)
                        .or_insert(example);
                }
            }
            (graphs, via_top)
        }
    }

    /// Each folder's graph and its files' edges to what their top names, read once for the
    /// tests here.
    #[allow(clippy::type_complexity)]
    fn graphs() -> &'static (BTreeMap<Module, Graph>, BTreeMap<Module, Graph>) {
        static GRAPHS: std::sync::OnceLock<(BTreeMap<Module, Graph>, BTreeMap<Module, Graph>)> =
            std::sync::OnceLock::new();
        GRAPHS.get_or_init(|| Layout { files: read() }.graphs())
    }

    /// The strongly connected parts of more than one node (Tarjan), each sorted.
    fn circles(g: &Graph) -> Vec<Vec<String>> {
        struct State<'a> {
            g: &'a Graph,
            index: BTreeMap<&'a str, usize>,
            low: BTreeMap<&'a str, usize>,
            stack: Vec<&'a str>,
            out: Vec<Vec<String>>,
        }
        fn connect<'a>(v: &'a str, s: &mut State<'a>) {
            let n = s.index.len();
            s.index.insert(v, n);
            s.low.insert(v, n);
            s.stack.push(v);
            for w in s.g.get(v).into_iter().flat_map(|e| e.keys()) {
                if !s.index.contains_key(w.as_str()) {
                    connect(w, s);
                    s.low.insert(v, s.low[v].min(s.low[w.as_str()]));
                } else if s.stack.contains(&w.as_str()) {
                    s.low.insert(v, s.low[v].min(s.index[w.as_str()]));
                }
            }
            if s.low[v] == s.index[v] {
                let i = s.stack.iter().position(|x| *x == v).unwrap();
                let mut part: Vec<String> = s.stack.drain(i..).map(str::to_string).collect();
                if part.len() > 1 {
                    part.sort();
                    s.out.push(part);
                }
            }
        }
        let mut s = State {
            g,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            out: Vec::new(),
        };
        for v in g.keys() {
            if !s.index.contains_key(v.as_str()) {
                connect(v, &mut s);
            }
        }
        s.out
    }

    /// One circle through `part`, from its first node back to it, each step with where it is
    /// written.
    fn show(g: &Graph, part: &[String]) -> String {
        let start = &part[0];
        let mut came: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start.as_str()]);
        let mut last = None;
        'search: while let Some(v) = queue.pop_front() {
            for w in g[v].keys().filter(|w| part.contains(w)) {
                if w == start {
                    last = Some(v);
                    break 'search;
                }
                if !came.contains_key(w.as_str()) {
                    came.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let mut path = vec![start.as_str()];
        let mut v = last.expect("a circle");
        while v != start {
            path.push(v);
            v = came[v];
        }
        path.push(start);
        path.reverse();
        let steps: Vec<String> = (path.windows(2))
            .map(|w| format!("\n    {} -> {} ({})", w[0], w[1], g[w[0]][w[1]]))
            .collect();
        format!("{}{}", path.join(" -> "), steps.concat())
    }

    #[test]
    fn no_module_imports_one_that_imports_it_back() {
        let (graphs, _) = graphs();
        // The graph is read: a sample of what it must hold.
        let images = &graphs[&vec!["images".to_string()]];
        assert!(images["transform"].contains_key("codec"), "{images:?}");
        assert!(graphs[&Module::new()]["proxy"].contains_key("cache"));
        // The fleet sits below every module that uses it.
        for user in ["cache", "images", "push"] {
            let fleet = &graphs[&Module::new()]["fleet"];
            assert!(!fleet.contains_key(user), "fleet imports {user}");
        }
        let mut found = Vec::new();
        let mut known: BTreeSet<(String, Vec<String>)> = (KNOWN_CIRCLES.iter())
            .map(|(f, p, _)| (f.to_string(), p.iter().map(|s| s.to_string()).collect()))
            .collect();
        for (folder, g) in graphs {
            let name = folder_name(folder);
            for part in circles(g) {
                if !known.remove(&(name.clone(), part.clone())) {
                    found.push(format!("{name}: {}", show(g, &part)));
                }
            }
        }
        assert!(
            found.is_empty(),
            "import circles (a file imports one that imports it back):\n{}",
            found.join("\n")
        );
        assert!(
            known.is_empty(),
            "known circles no longer there as listed (remove them from KNOWN_CIRCLES): {known:?}"
        );
    }

    /// Config is plain data at the bottom of the graph: no file of it names another module of
    /// larder. Inside, the files form a ladder with mod.rs on top: they name a file
    /// (`super::units::Dur`), never what mod.rs defines or brings in (`super::Dur`).
    #[test]
    fn config_imports_nothing_of_larders_and_its_files_not_mod_rs() {
        let (graphs, via_top) = graphs();
        let (root, config): (Module, Module) = (vec![], vec!["config".to_string()]);
        assert!(
            !graphs[&root].contains_key("config"),
            "config imports {:?}",
            graphs[&root]["config"]
        );
        assert!(graphs[&config].len() > 10, "{:?}", graphs[&config]);
        assert!(
            !via_top.contains_key(&config),
            "config's files use mod.rs: {:?}",
            via_top[&config]
        );
    }
}
