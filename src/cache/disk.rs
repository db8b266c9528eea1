//! The disk tier: entry records ([`super::record`]) in a bounded store on disk, read back on a
//! memory miss and kept across restarts. Only the [`Cache`](super::Cache) façade reaches it,
//! through [`super::tiers`], which reads it as a [`Storage`](super::storage::Storage).
//!
//! A log of segments (docs/design.md "Disk: a segment log"): records are appended to the newest
//! segment file by one writer thread (never on a worker), an in-memory index maps a key's hash
//! to the record's place, and whole segments are deleted oldest first beyond `max_size`. On start
//! the index is rebuilt by reading the segments' record heads; a torn tail is cut off.
//!
//! A read happens on the worker itself when the record is in the page cache
//! (`preadv2(RWF_NOWAIT)`: it never waits for the drive) and on tokio's blocking pool when it is
//! not, so a hit costs one system call and no thread hop. Every record read is checked: magic,
//! length, CRC-32 over everything after it, and the full key. Then
//! [`Entry::decode`](super::Entry::decode) checks every length: a torn or corrupt record is a miss
//! and is dropped, never served.
//!
//! Record layout (integers big-endian):
//!
//! ```text
//! b"LDR1" | u32 crc32 (of what follows) | u8 kind (1 record, 2 removal)
//! u32 key length | u32 value length | key | value
//! ```

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::io::{self, BufReader, Read};
use std::mem::MaybeUninit;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::key::CacheKey;
use super::storage::{Reading, Stats, Storage, Tier, TierCounts};
use crate::config::DiskConfig;

const MAGIC: &[u8; 4] = b"LDR1";
/// Magic, CRC, kind, key length, value length.
const HEAD: usize = 4 + 4 + 1 + 4 + 4;
const PUT: u8 = 1;
const REMOVE: u8 = 2;
/// Segments are at most this large (and at most an eighth of `max_size`).
const MAX_SEGMENT: u64 = 64 * 1024 * 1024;
/// Keys longer than this are not stored (a cache key is a URL, bounded well below it).
const MAX_KEY: usize = 64 * 1024;
/// Writes waiting for the writer thread; beyond it a write is dropped (it is a cache).
const QUEUE: usize = 4096;
/// The writer gathers at most this many bytes into one `pwrite`.
const BATCH: usize = 1024 * 1024;

/// The disk store.
pub(super) struct Disk {
    shared: Arc<Shared>,
    writer: mpsc::SyncSender<Op>,
    max_record: usize,
    pub(super) stats: Arc<Stats>,
}

/// What the workers and the writer thread share.
struct Shared {
    hasher: RandomState,
    state: Mutex<State>,
    /// When a failure was last logged: a failing drive logs once per ten seconds, not once per
    /// read or write (every failure is counted in `errors`).
    last_warning: Mutex<Option<Instant>>,
}

struct State {
    /// Where the newest record of each key's hash is.
    index: HashMap<u64, Loc>,
    /// Every segment, oldest first; the last is the one being written.
    segments: VecDeque<Segment>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Loc {
    segment: u64,
    offset: u32,
    len: u32,
}

struct Segment {
    id: u64,
    file: Arc<File>,
    /// Bytes written (final for all but the last).
    len: u64,
}

enum Op {
    Put(String, Bytes),
    Remove(String),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Why the disk tier could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("disk tier at {dir}: {why}")]
pub struct OpenError {
    dir: String,
    why: String,
}

/// Why a stored record was not served.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("record is corrupt: {0}")]
    Corrupt(&'static str),
}

impl Disk {
    /// Opens (or creates) the store in `cfg.dir`, recovering what an earlier process wrote.
    pub(super) async fn open(cfg: &DiskConfig) -> Result<Disk, OpenError> {
        let dir = cfg.dir.clone();
        let capacity = cfg.max_size.0;
        let opened = tokio::task::spawn_blocking(move || open_blocking(&dir, capacity)).await;
        let fail = |why: String| OpenError {
            dir: cfg.dir.display().to_string(),
            why,
        };
        let (shared, writer) = match opened {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(fail(e.to_string())),
            Err(e) => return Err(fail(e.to_string())),
        };
        let segment = writer.segment_size;
        let stats = Arc::new(Stats::default());
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("larder-disk".into())
            .spawn(move || writer.run(rx, &thread_stats))
            .map_err(|e| fail(e.to_string()))?;
        Ok(Disk {
            shared,
            writer: tx,
            max_record: usize::try_from(segment).unwrap_or(usize::MAX) - HEAD - MAX_KEY,
            stats,
        })
    }

    /// Writes `record` under `key` (replacing what was there), in the background.
    pub(super) fn write(&self, key: &CacheKey, record: Bytes) {
        if record.len() > self.max_record || key.as_str().len() > MAX_KEY {
            return;
        }
        // A full queue drops the write: the next fill writes it again.
        let _ = self
            .writer
            .try_send(Op::Put(key.as_str().to_owned(), record));
    }

    /// The record stored under `key`; `None` on a miss or any read error (counted).
    pub(super) async fn read(&self, key: &CacheKey) -> Option<Bytes> {
        let found = match self.load(key.as_str()).await {
            Ok(found) => found,
            Err(e) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                self.shared.warn("read", &e.to_string());
                // A record that cannot be read is dropped.
                self.remove(key);
                None
            }
        };
        let counter = match found {
            Some(_) => &self.stats.hits,
            None => &self.stats.misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    async fn load(&self, key: &str) -> Result<Option<Bytes>, ReadError> {
        let hash = self.shared.hash(key.as_bytes());
        let (file, loc, aging) = {
            let state = self.shared.lock();
            let Some(&loc) = state.index.get(&hash) else {
                return Ok(None);
            };
            let Some(segment) = state.segment(loc.segment) else {
                return Ok(None);
            };
            (segment.file.clone(), loc, state.aging(loc.segment))
        };
        let len = loc.len as usize;
        let mut buf = Vec::with_capacity(len);
        let got = read_cached(
            &file,
            &mut buf.spare_capacity_mut()[..len],
            u64::from(loc.offset),
        );
        // SAFETY: the first `got` bytes of the spare capacity were written by the read.
        unsafe { buf.set_len(got) };
        if got < len {
            // Not (all) in the page cache: the drive is read on the blocking pool.
            buf.resize(len, 0);
            let offset = u64::from(loc.offset) + got as u64;
            buf = tokio::task::spawn_blocking(move || {
                file.read_exact_at(&mut buf[got..], offset).map(|()| buf)
            })
            .await
            .map_err(|e| io::Error::other(e.to_string()))??;
        }
        let value = check(Bytes::from(buf), key.as_bytes())?;
        if aging {
            // Read from a segment about to be deleted: written again at the head of the log, so
            // that what is read stays and what is not goes first (CacheLib's reinsertion).
            let _ = self.writer.try_send(Op::Put(key.to_owned(), value.clone()));
        }
        Ok(Some(value))
    }

    /// Drops the record under `key`, if any (at once for reads; a removal mark in the log keeps
    /// it gone across a restart).
    pub(super) fn remove(&self, key: &CacheKey) {
        let hash = self.shared.hash(key.as_str().as_bytes());
        self.shared.lock().index.remove(&hash);
        // Also when nothing was indexed: a write still queued lands before the mark.
        let _ = self.writer.try_send(Op::Remove(key.as_str().to_owned()));
    }

    /// Waits until what was written so far reached the disk (tests, shutdown).
    pub(super) async fn flush(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A full queue is waited for here (shutdown, tests), never on the request path.
        let writer = self.writer.clone();
        let sent = tokio::task::spawn_blocking(move || writer.send(Op::Flush(tx)).is_ok()).await;
        if sent.unwrap_or(false) {
            let _ = rx.await;
        }
    }
}

impl Storage for Disk {
    fn tier(&self) -> Tier {
        Tier::Disk
    }

    /// A read error is a miss here (counted in `errors`): the walk goes on to the shared tier.
    fn read<'a>(&'a self, key: &'a CacheKey) -> Reading<'a> {
        Box::pin(async move { Ok(Disk::read(self, key).await) })
    }

    fn unusable(&self, key: &CacheKey) {
        Disk::remove(self, key);
    }

    fn remove(&self, key: &CacheKey) {
        Disk::remove(self, key);
    }

    fn counts(&self) -> TierCounts {
        self.stats.snapshot(Tier::Disk)
    }
}

impl Shared {
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Logs a failure, at most once per ten seconds.
    fn warn(&self, what: &str, why: &str) {
        let mut last = self.last_warning.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::warn!(
                operation = what,
                error = why,
                "disk tier failed (logged once per 10 s)"
            );
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the index consistent (every change is one
        // insert or remove), so a poisoned lock is used as it is.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    fn segment(&self, id: u64) -> Option<&Segment> {
        let first = self.segments.front()?.id;
        self.segments
            .get(usize::try_from(id.checked_sub(first)?).ok()?)
    }

    /// Whether segment `id` is among the oldest quarter, the next to be deleted.
    fn aging(&self, id: u64) -> bool {
        let (Some(first), n) = (self.segments.front(), self.segments.len() as u64) else {
            return false;
        };
        n >= 4 && id < first.id + n / 4
    }
}

/// Reads what the page cache holds of `buf.len()` bytes at `offset`, without waiting for the
/// drive; returns how many bytes were read (fewer, even none, when some are not cached).
#[cfg(target_os = "linux")]
fn read_cached(file: &File, buf: &mut [MaybeUninit<u8>], offset: u64) -> usize {
    use std::os::fd::AsRawFd;
    let mut got = 0;
    while got < buf.len() {
        let rest = &mut buf[got..];
        let iov = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        let Ok(at) = libc::off_t::try_from(offset + got as u64) else {
            break;
        };
        // SAFETY: `iov` describes `rest`, a live, exclusively borrowed buffer of `iov_len`
        // bytes (the kernel only writes to it), and the descriptor is open for as long as
        // `file` is borrowed.
        let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) };
        // EAGAIN (not cached), EOPNOTSUPP (a file system without it), EOF or an error: the
        // blocking read that follows finishes the job or reports the error.
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    got
}

#[cfg(not(target_os = "linux"))]
fn read_cached(_: &File, _: &mut [MaybeUninit<u8>], _: u64) -> usize {
    0
}

/// The value of a whole record read for `key`, after checking it.
fn check(record: Bytes, key: &[u8]) -> Result<Bytes, ReadError> {
    let head = parse_head(&record).ok_or(ReadError::Corrupt("bad head"))?;
    if head.kind != PUT || HEAD + head.key_len + head.value_len != record.len() {
        return Err(ReadError::Corrupt("bad length"));
    }
    if crc32fast::hash(&record[8..]) != head.crc {
        return Err(ReadError::Corrupt("checksum mismatch"));
    }
    if &record[HEAD..HEAD + head.key_len] != key {
        // Another key with the same hash replaced it: a miss, not an error.
        return Err(ReadError::Corrupt("another key"));
    }
    Ok(record.slice(HEAD + head.key_len..))
}

struct Head {
    crc: u32,
    kind: u8,
    key_len: usize,
    value_len: usize,
}

fn parse_head(b: &[u8]) -> Option<Head> {
    if b.len() < HEAD || &b[..4] != MAGIC {
        return None;
    }
    let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let head = Head {
        crc: u32_at(4),
        kind: b[8],
        key_len: u32_at(9) as usize,
        value_len: u32_at(13) as usize,
    };
    (matches!(head.kind, PUT | REMOVE) && head.key_len <= MAX_KEY).then_some(head)
}

/// Appends one record to `out`.
fn encode(out: &mut Vec<u8>, kind: u8, key: &[u8], value: &[u8]) {
    let start = out.len();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.seg"))
}

/// The writer thread's side: the segment being written and the bound.
struct Writer {
    dir: PathBuf,
    shared: Arc<Shared>,
    capacity: u64,
    segment_size: u64,
    /// The segment being written (also the last of `State::segments`).
    active: Arc<File>,
    active_id: u64,
    active_len: u64,
    /// Kept open: the lock that keeps a second process out of the directory.
    _lock: File,
}

/// Opens the directory: takes its lock, rebuilds the index from the segments, starts a new one.
fn open_blocking(dir: &Path, capacity: u64) -> io::Result<(Arc<Shared>, Writer)> {
    std::fs::create_dir_all(dir)?;
    let lock = lock_dir(dir)?;
    let mut ids: Vec<u64> = std::fs::read_dir(dir)?
        .filter_map(|e| {
            let name = e.ok()?.file_name();
            let id = name.to_str()?.strip_suffix(".seg")?;
            u64::from_str_radix(id, 16).ok()
        })
        .collect();
    ids.sort_unstable();
    let segment_size = (capacity / 8).clamp(1 << 20, MAX_SEGMENT);
    let shared = Arc::new(Shared {
        hasher: RandomState::new(),
        state: Mutex::new(State {
            index: HashMap::new(),
            segments: VecDeque::new(),
        }),
        last_warning: Mutex::new(None),
    });
    {
        let mut state = shared.lock();
        for &id in &ids {
            let path = segment_path(dir, id);
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            let len = recover(&file, id, &shared, &mut state.index)?;
            if len == 0 {
                // Started and never written (or torn in its first record).
                std::fs::remove_file(&path)?;
                continue;
            }
            if len < file.metadata()?.len() {
                // A torn tail (the process died mid-write): cut off.
                tracing::info!(segment = %path.display(), kept = len, "disk tier: torn tail cut");
                file.set_len(len)?;
            }
            state.segments.push_back(Segment {
                id,
                file: Arc::new(file),
                len,
            });
        }
    }
    let active_id = ids.last().map_or(0, |id| id + 1);
    let active = Arc::new(create_segment(dir, active_id)?);
    let writer = Writer {
        dir: dir.to_owned(),
        shared: shared.clone(),
        capacity,
        segment_size,
        active: active.clone(),
        active_id,
        active_len: 0,
        _lock: lock,
    };
    let doomed = {
        let mut state = shared.lock();
        state.segments.push_back(Segment {
            id: active_id,
            file: active,
            len: 0,
        });
        writer.evict(&mut state)
    };
    writer.delete(doomed);
    Ok((shared, writer))
}

/// Takes an exclusive lock on `dir/LOCK` for as long as the returned file is open.
fn lock_dir(dir: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))?;
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor owned by `file`, open for the call.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io::Error::other(
                "in use by another larder process (one process per directory)",
            ));
        }
    }
    Ok(file)
}

fn create_segment(dir: &Path, id: u64) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(segment_path(dir, id))
}

/// Reads the record heads of one segment into `index`; returns the length of its intact
/// prefix. Values are skipped, not checked: every read checks its record.
fn recover(
    file: &File,
    id: u64,
    shared: &Shared,
    index: &mut HashMap<u64, Loc>,
) -> io::Result<u64> {
    let size = file.metadata()?.len();
    let mut r = BufReader::with_capacity(64 * 1024, file);
    let mut at = 0u64;
    let mut head = [0u8; HEAD];
    let mut key = Vec::new();
    loop {
        if r.read_exact(&mut head).is_err() {
            return Ok(at);
        }
        let Some(h) = parse_head(&head) else {
            return Ok(at);
        };
        let len = (HEAD + h.key_len + h.value_len) as u64;
        if at + len > size || len > u64::from(u32::MAX) {
            return Ok(at);
        }
        key.resize(h.key_len, 0);
        r.read_exact(&mut key)?;
        r.seek_relative(h.value_len as i64)?;
        let hash = shared.hash(&key);
        if h.kind == PUT {
            let loc = Loc {
                segment: id,
                offset: at as u32,
                len: len as u32,
            };
            index.insert(hash, loc);
        } else {
            index.remove(&hash);
        }
        at += len;
    }
}

impl Writer {
    /// Writes what comes in until every sender is gone.
    fn run(mut self, rx: mpsc::Receiver<Op>, stats: &Stats) {
        let mut buf = Vec::with_capacity(BATCH);
        // Index changes that become true once `buf` is written: (hash, place or removal).
        let mut pending: Vec<(u64, Option<Loc>)> = Vec::new();
        while let Ok(first) = rx.recv() {
            let mut next = Some(first);
            while let Some(op) = next.take() {
                match op {
                    Op::Put(key, value) => {
                        self.append(&mut buf, &mut pending, PUT, &key, &value, stats);
                    }
                    Op::Remove(key) => {
                        self.append(&mut buf, &mut pending, REMOVE, &key, &[], stats);
                    }
                    Op::Flush(done) => {
                        self.write_out(&mut buf, &mut pending, stats);
                        if let Err(e) = self.active.sync_data() {
                            self.shared.warn("sync", &e.to_string());
                        }
                        let _ = done.send(());
                    }
                }
                if buf.len() < BATCH {
                    next = rx.try_recv().ok();
                }
            }
            self.write_out(&mut buf, &mut pending, stats);
        }
    }

    fn append(
        &mut self,
        buf: &mut Vec<u8>,
        pending: &mut Vec<(u64, Option<Loc>)>,
        kind: u8,
        key: &str,
        value: &[u8],
        stats: &Stats,
    ) {
        let len = (HEAD + key.len() + value.len()) as u64;
        if self.active_len + buf.len() as u64 + len > self.segment_size {
            self.write_out(buf, pending, stats);
            self.rotate();
        }
        let offset = self.active_len + buf.len() as u64;
        encode(buf, kind, key.as_bytes(), value);
        let hash = self.shared.hash(key.as_bytes());
        let loc = (kind == PUT).then_some(Loc {
            segment: self.active_id,
            offset: offset as u32,
            len: len as u32,
        });
        pending.push((hash, loc));
    }

    /// Writes the gathered records, then makes them visible in the index.
    fn write_out(
        &mut self,
        buf: &mut Vec<u8>,
        pending: &mut Vec<(u64, Option<Loc>)>,
        stats: &Stats,
    ) {
        if buf.is_empty() {
            return;
        }
        let written = self.active.write_all_at(buf, self.active_len);
        if let Err(e) = written {
            // Nothing of this batch is indexed; the file's end is cut back to what is.
            stats.errors.fetch_add(1, Ordering::Relaxed);
            self.shared.warn("write", &e.to_string());
            let _ = self.active.set_len(self.active_len);
            buf.clear();
            pending.clear();
            return;
        }
        self.active_len += buf.len() as u64;
        buf.clear();
        let mut puts = 0;
        {
            let mut state = self.shared.lock();
            for (hash, loc) in pending.drain(..) {
                match loc {
                    Some(loc) => {
                        state.index.insert(hash, loc);
                        puts += 1;
                    }
                    None => {
                        state.index.remove(&hash);
                    }
                }
            }
            if let Some(last) = state.segments.back_mut() {
                last.len = self.active_len;
            }
        }
        stats.writes.fetch_add(puts, Ordering::Relaxed);
    }

    /// Starts the next segment, deleting the oldest beyond the bound.
    fn rotate(&mut self) {
        let id = self.active_id + 1;
        let file = match create_segment(&self.dir, id) {
            Ok(f) => Arc::new(f),
            Err(e) => {
                // Keep the full segment: writes that do not fit are dropped until this works.
                self.shared.warn("start a segment", &e.to_string());
                return;
            }
        };
        let doomed = {
            let mut state = self.shared.lock();
            state.segments.push_back(Segment {
                id,
                file: file.clone(),
                len: 0,
            });
            self.evict(&mut state)
        };
        self.active = file;
        self.active_id = id;
        self.active_len = 0;
        self.delete(doomed);
    }

    /// Takes the oldest segments out of the index until the rest, with a whole segment of room
    /// for the one being written, fits the bound; returns them for deletion.
    fn evict(&self, state: &mut State) -> Vec<u64> {
        let mut doomed = Vec::new();
        let mut total: u64 = state.segments.iter().map(|s| s.len).sum();
        while state.segments.len() > 1 && total + self.segment_size > self.capacity {
            let old = state.segments.pop_front().expect("more than one segment");
            total -= old.len;
            doomed.push(old.id);
        }
        if !doomed.is_empty() {
            let first = state.segments.front().map_or(u64::MAX, |s| s.id);
            state.index.retain(|_, loc| loc.segment >= first);
        }
        doomed
    }

    /// Deletes segment files (a reader still holding one reads it to the end).
    fn delete(&self, ids: Vec<u64>) {
        for id in ids {
            if let Err(e) = std::fs::remove_file(segment_path(&self.dir, id)) {
                self.shared.warn("delete a segment", &e.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ByteSize, DiskWrite};

    fn cfg(dir: &Path, max: u64) -> DiskConfig {
        DiskConfig {
            dir: dir.to_owned(),
            max_size: ByteSize(max),
            write: DiskWrite::All,
        }
    }

    /// Opens again once the last `Disk` on `dir` is gone: its writer thread lets go of the
    /// directory's lock when it has drained its queue.
    async fn reopen(dir: &Path, max: u64) -> Disk {
        for _ in 0..200 {
            if let Ok(d) = Disk::open(&cfg(dir, max)).await {
                return d;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the directory stayed locked");
    }

    fn key(s: &str) -> CacheKey {
        CacheKey::from_string(s.to_owned())
    }

    fn body(i: usize, len: usize) -> Bytes {
        let mut v = format!("{i:08}").into_bytes();
        v.resize(len, b'a' + (i % 26) as u8);
        Bytes::from(v)
    }

    #[tokio::test]
    async fn written_records_are_read_back_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::open(&cfg(dir.path(), 64 << 20)).await.unwrap();
        for i in 0..100 {
            disk.write(&key(&format!("/k/{i}")), body(i, 5000));
        }
        disk.remove(&key("/k/7"));
        disk.flush().await;
        assert_eq!(disk.read(&key("/k/3")).await, Some(body(3, 5000)));
        assert_eq!(disk.read(&key("/k/7")).await, None);
        assert_eq!(disk.read(&key("/nope")).await, None);
        assert_eq!(disk.stats.writes.load(Ordering::Relaxed), 100);
        drop(disk);
        let disk = reopen(dir.path(), 64 << 20).await;
        for i in 0..100 {
            let want = (i != 7).then(|| body(i, 5000));
            assert_eq!(disk.read(&key(&format!("/k/{i}"))).await, want, "{i}");
        }
    }

    #[tokio::test]
    async fn a_second_process_cannot_open_the_same_directory() {
        let dir = tempfile::tempdir().unwrap();
        let _disk = Disk::open(&cfg(dir.path(), 64 << 20)).await.unwrap();
        let e = Disk::open(&cfg(dir.path(), 64 << 20)).await.err().unwrap();
        assert!(e.to_string().contains("another larder"), "{e}");
    }

    #[tokio::test]
    async fn the_oldest_segments_go_beyond_max_size_and_what_is_read_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        // 8 segments of 1 MiB; 100 KB records: 10 per segment, 70 kept at most.
        let disk = Disk::open(&cfg(dir.path(), 8 << 20)).await.unwrap();
        for i in 0..200 {
            disk.write(&key(&format!("/k/{i}")), body(i, 100_000));
            if i % 20 == 0 {
                disk.flush().await;
                // Read the first one each time it ages: it is written again and stays.
                disk.read(&key("/k/0")).await;
            }
        }
        disk.flush().await;
        assert_eq!(disk.read(&key("/k/5")).await, None, "the oldest went");
        assert_eq!(disk.read(&key("/k/199")).await, Some(body(199, 100_000)));
        assert_eq!(
            disk.read(&key("/k/0")).await,
            Some(body(0, 100_000)),
            "read, so kept"
        );
        let on_disk: u64 = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(on_disk <= 8 << 20, "{on_disk} bytes on disk");
    }

    #[tokio::test]
    async fn a_torn_tail_is_cut_and_a_corrupt_record_is_a_counted_miss() {
        let dir = tempfile::tempdir().unwrap();
        {
            let disk = Disk::open(&cfg(dir.path(), 64 << 20)).await.unwrap();
            for i in 0..3 {
                disk.write(&key(&format!("/k/{i}")), body(i, 3000));
            }
            disk.flush().await;
        }
        drop(reopen(dir.path(), 64 << 20).await);
        let seg = segment_path(dir.path(), 0);
        let mut bytes = std::fs::read(&seg).unwrap();
        let one = HEAD + "/k/0".len() + 3000;
        assert_eq!(bytes.len(), 3 * one);
        bytes[one + HEAD + 10] ^= 1; // inside /k/1's value
        bytes.truncate(3 * one - 100); // /k/2 torn
        std::fs::write(&seg, &bytes).unwrap();

        let disk = reopen(dir.path(), 64 << 20).await;
        assert_eq!(std::fs::metadata(&seg).unwrap().len(), 2 * one as u64);
        assert_eq!(disk.read(&key("/k/0")).await, Some(body(0, 3000)));
        assert_eq!(disk.read(&key("/k/1")).await, None);
        assert_eq!(disk.stats.errors.load(Ordering::Relaxed), 1);
        assert_eq!(disk.read(&key("/k/1")).await, None, "dropped");
        assert_eq!(disk.stats.errors.load(Ordering::Relaxed), 1);
        assert_eq!(disk.read(&key("/k/2")).await, None);
    }

    #[test]
    fn heads_that_lie_are_refused() {
        let mut rec = Vec::new();
        encode(&mut rec, PUT, b"/k", b"value");
        let ok = Bytes::from(rec.clone());
        assert_eq!(check(ok, b"/k").unwrap(), Bytes::from_static(b"value"));
        assert!(check(Bytes::from(rec.clone()), b"/x").is_err());
        let mut long = rec.clone();
        long[13..17].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(check(Bytes::from(long), b"/k").is_err());
        let mut magic = rec;
        magic[0] = b'X';
        assert!(parse_head(&magic).is_none());
    }
}
