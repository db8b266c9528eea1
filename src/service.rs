//! larder as a service of the system: what it tells systemd (`Type=notify`: READY once
//! listening, WATCHDOG pings, RELOADING/READY around a reload, STOPPING at shutdown), giving up
//! root after binding (`[server] user`, `group`), and the PID file (`[server] pid_file`).
//!
//! The notifications go to the datagram socket NOTIFY_SOCKET names (the `sd-notify` crate);
//! without it, as when larder is not run by systemd, each is a no-op. A failed notification is
//! logged at debug and otherwise ignored: it never stops the server.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sd_notify::NotifyState;

use crate::config::{lookup_group, lookup_user, UserIds};

fn notify(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::debug!(error = %e, "cannot notify the service manager");
    }
}

/// Tells the service manager larder is ready: its listeners are bound and accepting.
pub fn ready() {
    notify(&[NotifyState::Ready]);
}

/// Tells the service manager a reload begins (with the monotonic time systemd 253 asks for).
/// Follow it with [`ready`] once the reload is over, applied or refused.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// Tells the service manager larder is stopping (finishing in-flight requests).
pub fn stopping() {
    notify(&[NotifyState::Stopping]);
}

/// The interval at which to ping the watchdog (half the service's `WatchdogSec`), when
/// systemd asked for pings (WATCHDOG_USEC, and WATCHDOG_PID naming this process).
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return None;
    }
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// Pings the watchdog every `every`, forever: run it as a task of the runtime that serves, so
/// that a runtime stuck is a runtime that stops pinging, and systemd restarts it.
pub async fn watchdog(every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        notify(&[NotifyState::Watchdog]);
    }
}

/// The PID file: written at start, removed when dropped (at exit).
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    /// Writes this process's id and a newline to `path` (replacing the file atomically, so a
    /// reader never sees it half written).
    pub fn write(path: &Path) -> io::Result<PidFile> {
        let tmp = path.with_extension("pid.tmp");
        std::fs::write(&tmp, format!("{}\n", std::process::id()))?;
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        Ok(PidFile {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the PID file");
        }
    }
}

/// Why the process could not give up root.
#[derive(Debug, thiserror::Error)]
pub enum DropError {
    #[error("no user `{0}` on this system")]
    NoUser(String),
    #[error("no group `{0}` on this system")]
    NoGroup(String),
    #[error("cannot change to user `{user}`: {source}")]
    Change { user: String, source: io::Error },
    #[error("still root after changing to user `{0}`")]
    StillRoot(String),
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Gives up root for `user` (its primary group, or `group`): supplementary groups cleared,
/// then the group, then the user (real, effective and saved ids, in every thread: glibc
/// applies set*id to the whole process). Afterwards the process must not be able to become
/// root again: that is checked, and an error returned if it could.
pub fn drop_to(user: &str, group: Option<&str>) -> Result<UserIds, DropError> {
    let mut ids = lookup_user(user).ok_or_else(|| DropError::NoUser(user.into()))?;
    if let Some(g) = group {
        ids.gid = lookup_group(g).ok_or_else(|| DropError::NoGroup(g.into()))?;
    }
    let change = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(DropError::Change {
                user: user.into(),
                source: io::Error::last_os_error(),
            })
        }
    };
    // SAFETY: plain system calls on ids; the group list is one valid gid.
    unsafe {
        change(libc::setgroups(1, &ids.gid))?;
        change(libc::setgid(ids.gid))?;
        change(libc::setuid(ids.uid))?;
    }
    // SAFETY: as above. Back to root must now fail.
    let regained = unsafe { libc::setuid(0) == 0 || libc::geteuid() == 0 };
    if regained && ids.uid != 0 {
        return Err(DropError::StillRoot(user.into()));
    }
    Ok(ids)
}
