//! The server: listening, accepting and serving connections with hyper (HTTP/1.1 keep-alive and
//! pipelining, h2c by prior knowledge on the same port), the per-connection limits and timeouts,
//! background services, and graceful shutdown.
//!
//! Lifecycle: [`start`] binds every listener and spawns one accept loop each on the current
//! runtime (and on each per-core worker thread), registers the background services, and returns
//! a [`Handle`]. A connection task runs hyper's connection future and, in the same poll, an idle
//! watchdog and the shutdown signal; on shutdown it asks hyper to finish in-flight requests and
//! close. [`Handle::shutdown`] waits for the connections up to the grace period, and for the
//! background services.
//!
//! Along a connection's path, one file each:
//! - `start.rs`: the runtime, [`start`] (and [`start_with`], on a clock handed in), the admin
//!   listener, the [`Handle`].
//! - `gauges.rs`: the figures `/metrics` reads at scrape time (connections, cache, TLS, ...).
//! - `listen.rs`: binding, the accept loop and the connection bound, a plain-TCP connection's
//!   protocol (h2c sniffing), the open-files limit.
//! - `proxy_protocol.rs`: the PROXY header (v1/v2) a `proxy_protocol` listener's connections
//!   begin with, read before the h2c sniff or the TLS handshake: the connection's client.
//! - `connection.rs`: one connection's life over any [`Stream`]: hyper, the watchdog, parking.
//! - `io.rs`: the [`Stream`] trait, the IO wrapper hyper reads and writes through (HTTP/2's
//!   writes batched per poll), the watchdog's per-connection state.
//! - `h3.rs`: HTTP/3 over QUIC on a TLS listener's port (UDP), the same router.
//! - `background.rs`: services beside the connections, tied to the shutdown signal; the first
//!   is [`crate::memory`]'s, returning freed memory to the system.
//!
//! Two parts the server uses live outside it, because handlers below the router use them too
//! and the server imports the router: [`crate::interim`] (an origin's 1xx responses, queued by
//! the proxy's upstream client and written through this module's IO wrapper) and
//! [`crate::memory`] (the count of freed memory that image transforms add to).

mod background;
mod connection;
mod gauges;
mod h3;
mod io;
mod listen;
mod proxy_protocol;
mod reload;
mod start;

pub use io::Stream;
pub use listen::{fit_open_files, raise_nofile_limit, OpenFiles};
pub use start::{runtime, shutdown_signal, start, start_with, Error, Handle};
