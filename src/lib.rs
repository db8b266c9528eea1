//! larder: a web accelerator. One binary in front of origin servers: a caching reverse proxy that
//! stores every cacheable text body once per encoding, a static file server, and fixed responses.
//!
//! # Layout, along the path a request takes
//!
//! - [`server`]: start ([`server::start`], the runtime, the admin listener) → listen and accept
//!   (the connection bound, h2c sniffing) → one connection's life with hyper over any
//!   [`server::Stream`] (HTTP/1.1, h2c; limits, idle watchdog, parking) → graceful shutdown;
//!   beside them the IO wrapper, [`server::interim`] (1xx responses forwarded to HTTP/1.1
//!   clients) and the background services (returning freed memory).
//! - [`inbound`]: what every request must satisfy before routing; its one authority (Host).
//! - [`route`]: pick the handler by host and path prefix.
//! - [`proxy`]: the caching proxy's journey: lookup → coalesce → fill (`proxy/fill.rs`, in
//!   phases: fetch ([`proxy::upstream`]) → revalidate → admit → store and respond) → deliver.
//! - [`cache`]: one façade, [`cache::Cache`], over the stored responses: the byte-bounded memory
//!   tier, immutable entries ([`cache::entry`]) and their versioned record ([`cache::record`]),
//!   keys ([`cache::key`]), miss coalescing ([`cache::coalesce`]) and the RFC 9111 policy
//!   ([`cache::policy`]).
//! - [`deliver`]: a stored entry to a response; the hot path of a hit.
//! - [`range`]: Range / If-Range and 206 bodies (single or multipart), from memory or a file.
//!
//! Beside the path: [`config`] (typed settings), [`compress`] (codings and negotiation),
//! [`static_files`] (files from a root: memory-cached small files with pre-compressed
//! siblings, streamed large files, path safety), [`images`] (upload, store by MD5, transform, cached results), [`respond`] (fixed responses), [`body`] (the response body type).

pub mod admin;
pub mod body;
pub mod cache;
pub mod cli;
pub mod compress;
pub mod config;
pub mod deliver;
pub mod images;
pub mod inbound;
pub mod proxy;
pub mod range;
pub mod respond;
pub mod route;
pub mod server;
pub mod static_files;
