//! The test bed of the integration tests (all but fuzz_smoke, which feeds the parsers alone):
//! start an origin and larder, talk to larder with a client or with raw bytes. Everything is
//! real HTTP over loopback sockets.
//!
//! - `origin`: the test origin, which answers what the test says and records what it was asked;
//!   origins that speak raw bytes.
//! - `larder`: larder started in-process from TOML text, and what tests read of its state (the
//!   one place tests call the server and look into the cache); the binary, for process tests.
//! - `client`: hyper's client, requests and whole responses; h2c; decoding bodies.
//! - `raw`: requests written as bytes and responses read back one at a time.
//! - `images`: test images.
//! - `tls`: a test certificate authority and an HTTPS client (HTTP/1.1 or HTTP/2 by ALPN).
//! - `components`: the real components some tests need (redis-server, pebble, Chromium, ...),
//!   found where tests/provision installs them (a missing one fails at once, naming it).
// Each test binary uses a part of the bed.
#![allow(dead_code, unused_imports)]

mod client;
mod components;
mod images;
mod larder;
mod origin;
mod raw;
mod tls;

pub use self::client::*;
pub use self::components::*;
pub use self::images::*;
pub use self::larder::*;
pub use self::origin::*;
pub use self::raw::*;
pub use self::tls::*;
