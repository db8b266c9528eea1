//! The `[server]` section: worker threads and their layout, connection limits, timeouts.

use std::time::Duration;

use serde::Deserialize;

use super::units::{Bounded, ByteSize, Dur, Workers, HOUR_MS, KIB, MIB};

/// Server-wide settings: threads, connection limits, timeouts.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Worker threads; 0 means one per core.
    pub workers: Workers,
    /// Open connections at most, over all listeners; at the bound, accepting pauses.
    pub max_connections: Bounded<1, 10_000_000>,
    /// Largest request head (request line plus headers) accepted; larger gets 431.
    /// At least 8 KiB (a browser's head with its cookies), at most 1 MiB (each connection may
    /// buffer that much).
    pub max_header_size: ByteSize<{ 8 * KIB }, MIB>,
    /// Most request header fields accepted (HTTP/1.1 and HTTP/2); more gets 431.
    pub max_headers: Bounded<1, 10_000>,
    /// Time a client has to send a complete request head (slowloris guard); 100ms to 1h (0
    /// timed every request out).
    pub header_read_timeout: Dur<100, HOUR_MS>,
    /// Keep-alive connections with no traffic for this long are closed; at least 100ms.
    pub idle_timeout: Dur<100>,
    /// An HTTP/1.1 connection idle this long hands its buffers back and waits, kept open, as a
    /// bare socket until its next request (nginx does the same on keep-alive); 0 keeps them.
    pub idle_release: Dur,
    /// While more connections than this are open, an HTTP/1.1 connection also hands its buffers
    /// back right after each response: with thousands of connections, state kept between
    /// requests has left the CPU's caches by the next request (docs/design.md, "Parking").
    pub release_above_connections: usize,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    pub shutdown_grace: Dur,
    /// Accept HTTP/2 with prior knowledge (h2c) on the same port as HTTP/1.1.
    pub h2c: bool,
    /// How the worker threads share the work (see docs/design.md, "Threads").
    pub threading: Threading,
    /// Work-stealing runtime: poll the global task queue every this many tasks. Low values keep
    /// service fair across thousands of connections (tail latency); tokio's default is 31.
    pub global_queue_interval: Bounded<1, 255>,
    /// How often the configuration file is checked for changes, reloaded when it changed (as
    /// SIGHUP does); "0s": never.
    pub watch_config: Dur<0, HOUR_MS>,
}

impl ServerConfig {
    /// The layout in force: `threading`, with `auto` decided by the worker count. One worker
    /// runs single-threaded: measured on this project's bench, it serves as many requests at
    /// 10-100 connections, with less CPU and a lower p99 at 1,000-10,000 and on the proxy's
    /// pass path (docs/design.md "Threads"). Several workers steal work from each other, and
    /// keep listener addresses changeable on reload.
    pub fn layout(&self) -> Layout {
        match self.threading {
            Threading::PerCore => Layout::PerCore,
            Threading::WorkStealing => Layout::WorkStealing,
            Threading::Auto if self.worker_count() == 1 => Layout::PerCore,
            Threading::Auto => Layout::WorkStealing,
        }
    }

    /// Worker threads this asks for (`workers`; 0 = one per core).
    pub fn worker_count(&self) -> usize {
        match self.workers.as_usize() {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

/// The layout of the worker threads, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Threading {
    /// `per-core` with one worker, `work-stealing` with several (docs/design.md "Threads").
    Auto,
    /// One single-threaded runtime per worker, each with its own `SO_REUSEPORT` listening
    /// socket: the kernel spreads connections, a connection stays on its thread.
    PerCore,
    /// One multi-threaded tokio runtime whose workers steal tasks from each other.
    WorkStealing,
}

/// The layout of the worker threads in force ([`ServerConfig::layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    PerCore,
    WorkStealing,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: Bounded(0),
            max_connections: Bounded(100_000),
            max_header_size: ByteSize(16 * 1024),
            max_headers: Bounded(100),
            header_read_timeout: Dur(Duration::from_secs(10)),
            idle_timeout: Dur(Duration::from_secs(60)),
            idle_release: Dur(Duration::from_secs(1)),
            release_above_connections: 512,
            shutdown_grace: Dur(Duration::from_secs(10)),
            h2c: true,
            threading: Threading::Auto,
            global_queue_interval: Bounded(2),
            watch_config: Dur(Duration::ZERO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MIN;
    use crate::config::Config;

    /// `threading = "auto"` (the default) runs one worker per-core and several work-stealing;
    /// an explicit layout is kept whatever the count.
    #[test]
    fn auto_threading_is_per_core_for_one_worker() {
        let layout = |server: &str| {
            Config::parse(&format!("[server]\n{server}\n{MIN}"), "t.toml")
                .unwrap()
                .server
                .layout()
        };
        assert_eq!(layout("workers = 1"), Layout::PerCore);
        assert_eq!(layout("workers = 1\nthreading = \"auto\""), Layout::PerCore);
        assert_eq!(layout("workers = 2"), Layout::WorkStealing);
        assert_eq!(
            layout("workers = 1\nthreading = \"work-stealing\""),
            Layout::WorkStealing
        );
        assert_eq!(
            layout("workers = 2\nthreading = \"per-core\""),
            Layout::PerCore
        );
    }
}
