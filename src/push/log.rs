//! The push store's durable change log: an append-only file of framed JSON changes, written
//! by one thread that commits in groups (every change that arrived while the previous `fsync`
//! ran goes out in the next write and `fsync`), read back at start, and compacted into a
//! snapshot when it grows past twice the live records.
//!
//! A frame is `[length u32 LE][CRC-32 u32 LE][payload]`; the payload a JSON object:
//! `{"seq":N,"id":"..","t":MS,"v":VALUE}` sets a record, the same without `v` removes it, and
//! `{"snapshot":N,"records":K}` opens a compacted file: K record frames follow, and frames
//! after them with `seq <= N` are already in it.
//! A torn or corrupt frame ends the log: recovery truncates it there (the write it held was
//! never acknowledged, since acknowledgement waits for the `fsync` of its frame). A commit that
//! fails (a full disk) cuts the file back to its last whole frame at once, and the next commit
//! tries that again first if it failed too, so writing resumes by itself when there is room.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// Frames larger than this are corrupt (a record is at most 64 MiB).
const MAX_FRAME: usize = 80 << 20;

/// One change as the log holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
    pub seq: u64,
    pub id: String,
    /// Milliseconds since the Unix epoch.
    pub t: u64,
    /// The new value; None: removed.
    pub value: Option<Value>,
}

#[derive(Deserialize)]
struct Line {
    #[serde(default)]
    snapshot: Option<u64>,
    #[serde(default)]
    records: u64,
    #[serde(default)]
    seq: u64,
    #[serde(default)]
    id: String,
    #[serde(default)]
    t: u64,
    #[serde(default)]
    v: Option<Value>,
}

/// Encodes a set (`json`: the value's serialized text) or a removal (None).
pub fn frame(out: &mut Vec<u8>, seq: u64, id: &str, t: u64, json: Option<&[u8]>) {
    let id = serde_json::to_string(id).expect("a string serializes");
    let mut payload = format!("{{\"seq\":{seq},\"id\":{id},\"t\":{t}").into_bytes();
    if let Some(json) = json {
        payload.extend_from_slice(b",\"v\":");
        payload.extend_from_slice(json);
    }
    payload.push(b'}');
    push_frame(out, &payload);
}

fn push_frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The log file of a store directory.
pub fn path(dir: &Path) -> PathBuf {
    dir.join("changes.log")
}

/// What recovery read: the changes in order (a snapshot's records as sets), the file's valid
/// length, and what was cut off.
pub struct Recovered {
    pub changes: Vec<Logged>,
    pub valid_len: u64,
    /// Bytes of a torn or corrupt tail that were cut off.
    pub cut: u64,
}

/// Reads the log at `path` (missing: empty), cuts a torn tail off, and returns its changes.
pub fn recover(path: &Path) -> io::Result<Recovered> {
    let mut data = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut data)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut changes = Vec::new();
    let mut at = 0usize;
    let mut covered = 0u64;
    let mut in_snapshot = 0u64;
    while data.len() - at >= 8 {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
        if len > MAX_FRAME || data.len() - at - 8 < len {
            break;
        }
        let payload = &data[at + 8..at + 8 + len];
        if crc32fast::hash(payload) != crc {
            break;
        }
        let Ok(line) = serde_json::from_slice::<Line>(payload) else {
            break;
        };
        at += 8 + len;
        if let Some(s) = line.snapshot {
            covered = s;
            in_snapshot = line.records;
            continue;
        }
        if in_snapshot > 0 {
            in_snapshot -= 1;
        } else if line.seq <= covered {
            // Taken into the snapshot, and appended after it was written.
            continue;
        }
        changes.push(Logged {
            seq: line.seq,
            id: line.id,
            t: line.t,
            value: line.v,
        });
    }
    let cut = (data.len() - at) as u64;
    if cut > 0 {
        let f = OpenOptions::new().write(true).open(path)?;
        f.set_len(at as u64)?;
        f.sync_all()?;
    }
    Ok(Recovered {
        changes,
        valid_len: at as u64,
        cut,
    })
}

/// The open log, appended to by the writer thread only.
pub struct Log {
    file: File,
    path: PathBuf,
    /// Bytes of whole, committed frames.
    pub len: u64,
    /// A failed commit may have left bytes past `len` that are not cut off yet.
    torn: bool,
    /// A compaction renamed its snapshot over the log but could not open it: nothing can be
    /// appended any more (the file held is the old one, unlinked).
    pub broken: bool,
}

impl Log {
    /// Opens (creating) the log for appending at `valid_len`.
    pub fn open(path: &Path, valid_len: u64) -> io::Result<Log> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        file.seek(SeekFrom::End(0))?;
        let len = file.metadata()?.len();
        debug_assert_eq!(len, valid_len);
        if let Some(dir) = path.parent() {
            sync_dir(dir);
        }
        Ok(Log {
            file,
            path: path.to_path_buf(),
            len,
            torn: false,
            broken: false,
        })
    }

    /// Appends `frames` and makes them durable; or, failing, cuts the file back to the frames
    /// committed before (none of `frames` stays).
    pub fn commit(&mut self, frames: &[u8]) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other("the change log was lost in a compaction"));
        }
        if self.torn {
            self.cut_back()?;
        }
        match (self.file.write_all(frames)).and_then(|()| self.file.sync_data()) {
            Ok(()) => {
                self.len += frames.len() as u64;
                Ok(())
            }
            Err(e) => {
                // A partial write leaves a torn frame; a failed sync, frames that may or may not
                // be on disk. Either way they were not acknowledged: cut them off.
                self.torn = true;
                if let Err(cut) = self.cut_back() {
                    tracing::error!(error = %cut, "push: cutting a failed write off the change log failed; retried at the next write");
                }
                Err(e)
            }
        }
    }

    /// Truncates the file to its committed frames (appends go to the end: `O_APPEND`).
    fn cut_back(&mut self) -> io::Result<()> {
        self.file.set_len(self.len)?;
        self.file.sync_all()?;
        self.torn = false;
        Ok(())
    }

    /// Replaces the log with a snapshot: `seq` and the frames of every live record. The new
    /// file is written and synced beside the old one, then renamed over it. If that fails, the
    /// new file is removed and the log stays as it was (unless the snapshot could not be
    /// opened after its rename: then `broken`).
    pub fn compact(&mut self, seq: u64, count: usize, records: &[u8]) -> io::Result<()> {
        let tmp = self.path.with_extension("log.tmp");
        let res = self.write_snapshot(&tmp, seq, count, records);
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        let len = res?;
        if let Some(dir) = self.path.parent() {
            sync_dir(dir);
        }
        match Log::open(&self.path.clone(), len) {
            Ok(log) => *self = log,
            Err(e) => {
                self.broken = true;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Writes the snapshot to `tmp`, syncs it and renames it over the log: its length.
    fn write_snapshot(
        &self,
        tmp: &Path,
        seq: u64,
        count: usize,
        records: &[u8],
    ) -> io::Result<u64> {
        let mut out = Vec::with_capacity(records.len() + 32);
        push_frame(
            &mut out,
            format!("{{\"snapshot\":{seq},\"records\":{count}}}").as_bytes(),
        );
        out.extend_from_slice(records);
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .mode(0o600)
                .open(tmp)?;
            f.write_all(&out)?;
            f.sync_all()?;
        }
        std::fs::rename(tmp, &self.path)?;
        Ok(out.len() as u64)
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// A tmpfs of `size` mounted under a test's directory (as root), unmounted when dropped: a
/// file system that fills, for the tests of what a failed write leaves (here and the store's).
#[cfg(test)]
pub(crate) struct Tmpfs(pub PathBuf);

#[cfg(test)]
impl Tmpfs {
    pub(crate) fn mount(dir: &Path, size: &str) -> Tmpfs {
        let mnt = dir.join("small");
        std::fs::create_dir(&mnt).unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mnt)
            .status()
            .expect("mount runs");
        assert!(
            st.success(),
            "mounting a tmpfs for the test failed (needs root)"
        );
        Tmpfs(mnt)
    }
}

#[cfg(test)]
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_torn_tail_is_cut_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path());
        let mut log = Log::open(&p, 0).unwrap();
        let mut frames = Vec::new();
        frame(&mut frames, 1, "a", 10, Some(br#"{"x":1}"#));
        frame(&mut frames, 2, "b", 11, Some(br#"[1,2]"#));
        frame(&mut frames, 3, "a", 12, None);
        log.commit(&frames).unwrap();
        let whole = frames.len() as u64;
        let mut torn = Vec::new();
        frame(&mut torn, 4, "c", 13, Some(b"true"));
        log.commit(&torn[..torn.len() - 3]).unwrap();
        drop(log);
        let r = recover(&p).unwrap();
        assert_eq!(r.changes.len(), 3);
        assert_eq!(r.changes[1].value, Some(json!([1, 2])));
        assert_eq!(r.changes[2].value, None);
        assert_eq!(r.valid_len, whole);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), whole);
        // A flipped byte inside a frame ends the log there too.
        let mut bytes = std::fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n - 2] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(recover(&p).unwrap().changes.len(), 2);
    }

    /// A commit that fails part way (a full file system: a tmpfs mounted for the test) leaves
    /// nothing of its frames: the file is cut back to its whole frames at once, and once there
    /// is room the next commit succeeds without reopening the log.
    #[test]
    fn a_failed_commit_is_cut_back_to_its_last_whole_frame() {
        let dir = tempfile::tempdir().unwrap();
        let small = Tmpfs::mount(dir.path(), "64k");
        let mnt = small.0.clone();
        let p = path(&mnt);
        let mut log = Log::open(&p, 0).unwrap();
        let mut first = Vec::new();
        frame(&mut first, 1, "a", 1, Some(b"1"));
        log.commit(&first).unwrap();
        // Fill the file system but for 8 KiB, then commit a 20 KB frame: part of it is written.
        let filler = mnt.join("filler");
        std::fs::write(&filler, vec![0u8; 56 * 1024]).unwrap();
        let mut big = Vec::new();
        let value = format!("\"{}\"", "x".repeat(20_000));
        frame(&mut big, 2, "b", 2, Some(value.as_bytes()));
        let e = log.commit(&big).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(28), "ENOSPC: {e}");
        assert_eq!(log.len, first.len() as u64);
        assert_eq!(
            std::fs::metadata(&p).unwrap().len(),
            first.len() as u64,
            "cut back"
        );
        // Room again: the same log takes the write.
        std::fs::remove_file(&filler).unwrap();
        log.commit(&big).unwrap();
        drop(log);
        let r = recover(&p).unwrap();
        let seqs: Vec<u64> = r.changes.iter().map(|c| c.seq).collect();
        assert_eq!((seqs, r.cut), (vec![1, 2], 0));
    }

    #[test]
    fn a_snapshot_replaces_what_it_covers() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path());
        let mut log = Log::open(&p, 0).unwrap();
        let mut frames = Vec::new();
        for i in 1..=5 {
            frame(&mut frames, i, "a", i, Some(i.to_string().as_bytes()));
        }
        log.commit(&frames).unwrap();
        let mut snap = Vec::new();
        frame(&mut snap, 5, "a", 5, Some(b"5"));
        log.compact(5, 1, &snap).unwrap();
        // A change taken into the snapshot but appended after it is skipped; a new one kept.
        let mut after = Vec::new();
        frame(&mut after, 5, "a", 5, Some(b"5"));
        frame(&mut after, 6, "b", 6, Some(b"6"));
        log.commit(&after).unwrap();
        let r = recover(&p).unwrap();
        let seqs: Vec<u64> = r.changes.iter().map(|c| c.seq).collect();
        assert_eq!(seqs, [5, 6]);
    }
}
