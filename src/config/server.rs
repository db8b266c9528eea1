//! The `[server]` section: worker threads and their layout, connection limits, timeouts; the
//! process as a service (the user it runs as, its PID file, state directory, process log), with
//! the look-up of a user or group by name that checking those keys needs.

use std::path::PathBuf;
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
    /// Started as root, larder binds its listeners, then runs as this user (as nginx's
    /// `user`): with its primary group, or `group`. It refuses to run on as root when the change
    /// fails. Ignored when not started as root.
    pub user: Option<String>,
    /// The group with `user` (instead of the user's primary group).
    pub group: Option<String>,
    /// A file larder writes its process id to once listening, and removes at exit (its
    /// directory must stay writable by `user` for the removal, e.g. /run/larder/).
    pub pid_file: Option<PathBuf>,
    /// Where larder keeps what it makes for itself (the self-signed certificate, under `tls/`);
    /// `--state-dir` overrides it.
    pub state_dir: PathBuf,
    /// The process log's format, `text` or `json`; `--log-format` overrides it.
    pub log_format: ProcessLogFormat,
    /// The process log's level (error, warn, info, debug, trace); `--log-level` overrides it,
    /// and without either RUST_LOG is honoured, else `info`.
    pub log_level: Option<LogLevel>,
}

/// How the process log is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ProcessLogFormat {
    /// One line of text per event (coloured on a terminal unless NO_COLOR is set).
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`), for log shippers.
    Json,
}

/// The most detailed level the process log shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The level's name as tracing's filters spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// A user's ids, as the system's user database has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserIds {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
}

/// Looks user `name` up in the system's user database (getpwnam_r: /etc/passwd, or NSS).
pub fn lookup_user(name: &str) -> Option<UserIds> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: zeroed is a valid passwd (null pointers, zero ids); getpwnam_r fills it with
    // pointers into `buf`, which outlives the reads below (only the ids are read).
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    (rc == 0 && !found.is_null()).then_some(UserIds {
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
    })
}

/// Looks group `name` up in the system's group database (getgrnam_r).
pub fn lookup_group(name: &str) -> Option<libc::gid_t> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: as in lookup_user: the result points into `buf`; only the id is read.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    (rc == 0 && !found.is_null()).then_some(grp.gr_gid)
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
            user: None,
            group: None,
            pid_file: None,
            state_dir: PathBuf::from("larder-state"),
            log_format: ProcessLogFormat::Text,
            log_level: None,
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
