//! The records of a push route: held in memory (a sorted map by id, so a pattern is a range),
//! every change numbered by one sequence, kept in a bounded history for resuming subscribers,
//! and written to the durable log ([`super::log`]) before it is acknowledged or published.
//!
//! A write takes the state's lock only to check its preconditions, apply the change and queue
//! its frame; the log's writer thread commits queued frames in groups, then publishes the
//! changes to the subscribers ([`super::fanout`]) in sequence order and acknowledges them.
//! Readers may see a change a moment before it is durable (it is never acknowledged to its
//! writer before); subscribers see it only after.
//!
//! Groups (`[[...push.group]]`) bound the count of records of an id pattern (the least
//! recently written is removed) and their lifetime (removed `ttl` after their last write).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::HeaderValue;
use serde_json::Value;
use tokio::sync::oneshot;

use super::fanout::{self, Event, Fanout, Topic};
use super::filter::IdPattern;
use super::log::{self, Log};
use crate::compress::Encoding;
use crate::config::{CompressionConfig, GroupConfig, PushConfig};

/// A record as stored: its value, its serialized text (what GET and events send), its
/// entity-tag and the sequence number of its last change.
pub struct Record {
    pub value: Value,
    pub json: Bytes,
    pub etag: HeaderValue,
    pub seq: u64,
    /// When it was last written, in milliseconds since the Unix epoch.
    pub t: u64,
    /// Compressed copies for GET, made off the async workers after the first request
    /// that could use them (that one, like a cache fill's first client, gets identity).
    encoded: OnceLock<Vec<(Encoding, Bytes)>>,
    compressing: std::sync::atomic::AtomicBool,
}

/// Records this large or larger are sent compressed to clients that accept it.
pub const COMPRESS_ABOVE: usize = 1024;

impl Record {
    fn new(value: Value, json: Bytes, seq: u64, t: u64) -> Record {
        Record {
            value,
            json,
            etag: HeaderValue::try_from(format!("\"s{seq}\"")).expect("ASCII"),
            seq,
            t,
            encoded: OnceLock::new(),
            compressing: Default::default(),
        }
    }

    /// The record's compressed copies (gzip, br, zstd), smallest first, once made: empty for
    /// small records, and until a blocking-pool thread has made them (the first call for a
    /// large record starts that).
    pub fn encoded(self: &Arc<Self>) -> &[(Encoding, Bytes)] {
        if let Some(v) = self.encoded.get() {
            return v;
        }
        if self.json.len() >= COMPRESS_ABOVE
            && !self
                .compressing
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            let r = Arc::clone(self);
            let make = move || {
                r.encoded.get_or_init(|| compress(&r.json));
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(make)),
                Err(_) => make(),
            }
        }
        self.encoded.get().map_or(&[], Vec::as_slice)
    }
}

/// `json` in every compressed coding that makes it smaller, smallest first.
fn compress(json: &[u8]) -> Vec<(Encoding, Bytes)> {
    // Levels that keep a 1 MiB record's compression in the milliseconds.
    let cfg = CompressionConfig {
        brotli_level: crate::config::Bounded(5),
        zstd_level: crate::config::Bounded(6),
        gzip_level: crate::config::Bounded(6),
        ..Default::default()
    };
    let mut v: Vec<(Encoding, Bytes)> = (Encoding::COMPRESSED.iter())
        .map(|&e| (e, crate::compress::encode(json, e, &cfg)))
        .filter(|(_, b)| b.len() < json.len())
        .collect();
    v.sort_by_key(|(_, b)| b.len());
    v
}

/// A record with its id.
pub type Named = (Arc<str>, Arc<Record>);

/// One change: the record before and after (None: absent).
pub struct Change {
    pub seq: u64,
    pub id: Arc<str>,
    pub old: Option<Arc<Record>>,
    pub new: Option<Arc<Record>>,
}

/// What a write does to its record.
pub enum Write {
    Put(Value),
    /// A JSON merge patch (RFC 7396).
    Patch(Value),
    /// Sets one member (a path of object keys) of an existing record.
    Member(Vec<String>, Value),
    Delete,
}

/// The preconditions of a write.
#[derive(Default)]
pub struct Conditions {
    pub if_match: Option<HeaderValue>,
    pub if_none_match: Option<HeaderValue>,
}

#[derive(Debug)]
pub enum WriteError {
    NotFound,
    PreconditionFailed,
    /// A member path through a value that is not an object.
    Conflict(String),
    TooLarge(usize),
    /// The log could not be written; the store refuses writes until restarted.
    Storage,
}

pub enum Written {
    Created(Arc<Record>),
    Replaced(Arc<Record>),
    Deleted,
}

/// A subscription's start: its receiver (taken before anything was read, so nothing falls
/// between), the events to send first, and the sequence number that the first live event
/// must pass (earlier ones are already in what is sent first).
pub struct Start {
    pub rx: fanout::Receiver,
    pub first: Vec<Arc<Event>>,
    pub skip_to: u64,
}

struct Group {
    pattern: IdPattern,
    max: Option<usize>,
    ttl: Option<Duration>,
    /// The group's records by the sequence number of their last write: oldest first.
    order: BTreeMap<u64, Arc<str>>,
}

impl Group {
    /// The groups of `cfg`, with no records yet.
    fn all(cfg: &[GroupConfig]) -> Vec<Group> {
        (cfg.iter())
            .map(|g| Group {
                pattern: g.pattern.clone(),
                max: g.max.map(|m| m.0 as usize),
                ttl: g.ttl.map(|t| t.0),
                order: BTreeMap::new(),
            })
            .collect()
    }

    /// Whether `other` has the same pattern and limits (whatever records each counts).
    fn same_limits(&self, other: &Group) -> bool {
        self.pattern == other.pattern && self.max == other.max && self.ttl == other.ttl
    }
}

struct State {
    records: BTreeMap<Arc<str>, Arc<Record>>,
    seq: u64,
    history: VecDeque<Arc<Change>>,
    history_max: usize,
    groups: Vec<Group>,
    /// Bytes the live records take in a compacted log (about).
    live_bytes: u64,
    failed: bool,
}

struct Job {
    frames: Vec<u8>,
    changes: Vec<Arc<Change>>,
    ack: Option<oneshot::Sender<io::Result<()>>>,
}

/// A push route's records.
pub struct Store {
    state: Arc<Mutex<State>>,
    pub fanout: Arc<Fanout>,
    jobs: Mutex<mpsc::Sender<Job>>,
    max_record: AtomicUsize,
    /// Between heartbeats, in milliseconds.
    heartbeat_ms: AtomicU64,
    dir: PathBuf,
    /// Its link to the other nodes, when its route shares its records (`share = true`).
    pub replica: OnceLock<Arc<super::replicate::Replica>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Stores open in this process, by directory: a reload that keeps a push route keeps its
/// store (two stores must never append to one log).
fn open_stores() -> &'static Mutex<HashMap<PathBuf, Weak<Store>>> {
    static OPEN: OnceLock<Mutex<HashMap<PathBuf, Weak<Store>>>> = OnceLock::new();
    OPEN.get_or_init(Mutex::default)
}

/// The stores open now.
pub fn open() -> Vec<Arc<Store>> {
    let open = open_stores().lock().expect("stores");
    let mut v: Vec<Arc<Store>> = open.values().filter_map(Weak::upgrade).collect();
    v.sort_by(|a, b| a.dir.cmp(&b.dir));
    v
}

/// What opening a store found.
#[derive(Debug, Default)]
pub struct Opened {
    pub records: usize,
    pub changes: usize,
    pub cut: u64,
}

impl Store {
    /// Opens the store in `cfg.dir` (creating it), replaying its log; or the one already open
    /// there (whose settings [`Store::configure`] changes).
    pub fn open(cfg: &PushConfig) -> io::Result<(Arc<Store>, Opened)> {
        let dir = &cfg.dir;
        let heartbeat = cfg.heartbeat.0;
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let key = dir.canonicalize()?;
        let mut open = open_stores().lock().expect("stores");
        if let Some(s) = open.get(&key).and_then(Weak::upgrade) {
            return Ok((s, Opened::default()));
        }
        let path = log::path(&key);
        let rec = log::recover(&path)?;
        let mut st = State {
            records: BTreeMap::new(),
            seq: 0,
            history: VecDeque::new(),
            history_max: cfg.history.0 as usize,
            groups: Group::all(&cfg.groups),
            live_bytes: 0,
            failed: false,
        };
        let opened = Opened {
            changes: rec.changes.len(),
            cut: rec.cut,
            records: 0,
        };
        for c in rec.changes {
            let new = c.value.map(|v| {
                let json = Bytes::from(serde_json::to_vec(&v).expect("a value serializes"));
                Arc::new(Record::new(v, json, c.seq, c.t))
            });
            let id: Arc<str> = c.id.into();
            st.seq = st.seq.max(c.seq);
            st.apply(&id, c.seq, new);
        }
        let opened = Opened {
            records: st.records.len(),
            ..opened
        };
        let log = Log::open(&path, rec.valid_len)?;
        let state = Arc::new(Mutex::new(st));
        let fanout = Arc::new(Fanout::new(cfg.queue.0 as usize));
        let (tx, rx) = mpsc::channel();
        let (w_state, w_fanout) = (Arc::clone(&state), Arc::clone(&fanout));
        // Committed changes are published from a task on the server's runtime when there is
        // one: the subscribers it wakes go to that worker's own queue, not the runtime's
        // shared one (as wakes from another thread would).
        let publish = match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<Arc<Change>>>();
                let f = Arc::clone(&fanout);
                rt.spawn(async move {
                    while let Some(changes) = rx.recv().await {
                        f.publish(&changes);
                    }
                });
                Publish::Task(tx)
            }
            Err(_) => Publish::Here,
        };
        std::thread::Builder::new()
            .name("larder-push-log".into())
            .spawn(move || writer(rx, log, w_state, w_fanout, publish))?;
        let store = Arc::new(Store {
            state,
            fanout,
            jobs: Mutex::new(tx),
            max_record: AtomicUsize::new(cfg.max_record_size.0 as usize),
            heartbeat_ms: AtomicU64::new(heartbeat.as_millis() as u64),
            dir: key.clone(),
            replica: OnceLock::new(),
        });
        open.insert(key, Arc::downgrade(&store));
        // Heartbeats to idle subscribers and expiry of groups' records, until the store goes.
        let weak = Arc::downgrade(&store);
        let tick_of = |heartbeat: Duration| {
            heartbeat.clamp(Duration::from_millis(10), Duration::from_secs(1))
        };
        let mut tick = tick_of(heartbeat);
        std::thread::Builder::new()
            .name("larder-push-tick".into())
            .spawn(move || {
                let mut since_beat = Duration::ZERO;
                loop {
                    std::thread::sleep(tick);
                    let Some(store) = weak.upgrade() else { return };
                    since_beat += tick;
                    // A reload may have changed it.
                    let heartbeat =
                        Duration::from_millis(store.heartbeat_ms.load(Ordering::Relaxed));
                    tick = tick_of(heartbeat);
                    if since_beat >= heartbeat {
                        since_beat = Duration::ZERO;
                        store.fanout.heartbeat();
                    }
                    store.expire();
                }
            })?;
        Ok((store, opened))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Applies a push route's settings to its open store (a reload): the history's length
    /// (shortened at once), the ring of topics made from now on, the largest record, the
    /// heartbeat, and the groups (their records counted again; those over a new maximum are
    /// removed now, as changes like any other; a new TTL applies at the next second's expiry).
    pub fn configure(&self, cfg: &PushConfig) {
        (self.max_record).store(cfg.max_record_size.0 as usize, Ordering::Relaxed);
        (self.heartbeat_ms).store(cfg.heartbeat.0.as_millis() as u64, Ordering::Relaxed);
        self.fanout.set_queue(cfg.queue.0 as usize);
        let mut st = self.state.lock().expect("state");
        st.history_max = cfg.history.0 as usize;
        while st.history.len() > st.history_max {
            st.history.pop_front();
        }
        let mut fresh = Group::all(&cfg.groups);
        let same = fresh.len() == st.groups.len()
            && fresh.iter().zip(&st.groups).all(|(a, b)| a.same_limits(b));
        if same || st.failed {
            return;
        }
        for g in &mut fresh {
            for (id, r) in &st.records {
                if g.pattern.matches(id) {
                    g.order.insert(r.seq, Arc::clone(id));
                }
            }
        }
        st.groups = fresh;
        let changes = st.evict_over_max(None);
        if !changes.is_empty() {
            self.submit(&changes, None);
        }
    }

    /// The record `id`.
    pub fn get(&self, id: &str) -> Option<Arc<Record>> {
        self.state.lock().expect("state").records.get(id).cloned()
    }

    /// The longest id among the stored records that is a proper segment prefix of `path`,
    /// and the rest of the path (a member path).
    pub fn split_member<'p>(&self, path: &'p str) -> Option<(&'p str, &'p str)> {
        let st = self.state.lock().expect("state");
        let mut cut = path.len();
        while let Some(i) = path[..cut].rfind('/') {
            cut = i;
            if st.records.contains_key(&path[..i]) {
                return Some((&path[..i], &path[i + 1..]));
            }
        }
        None
    }

    /// The records of `topic` now, and the sequence number they are current at.
    pub fn list(&self, topic: &Topic) -> (Vec<Named>, u64) {
        let st = self.state.lock().expect("state");
        (st.matching(topic).collect(), st.seq)
    }

    /// The sequence number of the last change.
    pub fn seq(&self) -> u64 {
        self.state.lock().expect("state").seq
    }

    pub fn len(&self) -> usize {
        self.state.lock().expect("state").records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes `w` to the record `id` once `cond` holds, and returns when the change is durable.
    pub async fn write(
        &self,
        id: &str,
        w: Write,
        cond: &Conditions,
    ) -> Result<Written, WriteError> {
        let (ack, written) = {
            let mut st = self.state.lock().expect("state");
            if st.failed {
                return Err(WriteError::Storage);
            }
            let old = st.records.get(id).cloned();
            let etag = old.as_ref().map(|r| &r.etag);
            if let Some(im) = &cond.if_match {
                if !crate::http::etag::list_matches(im, etag, true) {
                    return Err(WriteError::PreconditionFailed);
                }
            }
            if let Some(inm) = &cond.if_none_match {
                if crate::http::etag::list_matches(inm, etag, false) {
                    return Err(WriteError::PreconditionFailed);
                }
            }
            let value = match w {
                Write::Delete if old.is_none() => return Err(WriteError::NotFound),
                Write::Delete => None,
                Write::Put(v) => Some(v),
                Write::Patch(p) => {
                    let Some(old) = &old else {
                        return Err(WriteError::NotFound);
                    };
                    let mut v = old.value.clone();
                    merge_patch(&mut v, p);
                    Some(v)
                }
                Write::Member(path, m) => {
                    let Some(old) = &old else {
                        return Err(WriteError::NotFound);
                    };
                    let mut v = old.value.clone();
                    set_member(&mut v, &path, m)?;
                    Some(v)
                }
            };
            let t = now_ms();
            let new = match value {
                Some(v) => {
                    let json = serde_json::to_vec(&v).expect("a value serializes");
                    let max_record = self.max_record.load(Ordering::Relaxed);
                    if json.len() > max_record {
                        return Err(WriteError::TooLarge(max_record));
                    }
                    st.seq += 1;
                    Some(Arc::new(Record::new(v, json.into(), st.seq, t)))
                }
                None => {
                    st.seq += 1;
                    None
                }
            };
            let written = match (&new, &old) {
                (Some(r), None) => Written::Created(Arc::clone(r)),
                (Some(r), Some(_)) => Written::Replaced(Arc::clone(r)),
                (None, _) => Written::Deleted,
            };
            let id: Arc<str> = match st.records.get_key_value(id) {
                Some((k, _)) => Arc::clone(k),
                None => id.into(),
            };
            let seq = st.seq;
            let mut changes = vec![st.apply(&id, seq, new)];
            changes.extend(st.evict_over_max(Some(&id)));
            let (tx, rx) = oneshot::channel();
            self.submit(&changes, Some(tx));
            (rx, written)
        };
        match ack.await {
            Ok(Ok(())) => Ok(written),
            _ => Err(WriteError::Storage),
        }
    }

    /// Removes the records of groups with a `ttl` whose last write is older than it.
    pub fn expire(&self) {
        let mut st = self.state.lock().expect("state");
        if st.failed {
            return;
        }
        let now = now_ms();
        let mut expired: Vec<Arc<str>> = Vec::new();
        for g in &st.groups {
            let Some(ttl) = g.ttl else { continue };
            for id in g.order.values() {
                let Some(r) = st.records.get(id) else {
                    continue;
                };
                if r.t + ttl.as_millis() as u64 > now {
                    break;
                }
                expired.push(Arc::clone(id));
            }
        }
        if expired.is_empty() {
            return;
        }
        expired.sort();
        expired.dedup();
        let changes: Vec<Arc<Change>> = (expired.iter())
            .map(|id| {
                st.seq += 1;
                let seq = st.seq;
                st.apply(id, seq, None)
            })
            .collect();
        self.submit(&changes, None);
    }

    /// Queues `changes` (already applied, under the state's lock) for the log's writer.
    fn submit(&self, changes: &[Arc<Change>], ack: Option<oneshot::Sender<io::Result<()>>>) {
        let mut frames = Vec::new();
        for c in changes {
            let t = c.new.as_ref().map_or_else(now_ms, |r| r.t);
            log::frame(
                &mut frames,
                c.seq,
                &c.id,
                t,
                c.new.as_ref().map(|r| &r.json[..]),
            );
        }
        let job = Job {
            frames,
            changes: changes.to_vec(),
            ack,
        };
        // The writer ends only when the store is dropped.
        let _ = self.jobs.lock().expect("jobs").send(job);
    }

    /// Starts a subscription to `topic`: from now (with the matching records first when
    /// `init`), or resuming after the change `since` (from the history; a `reset` and the
    /// matching records when the history no longer reaches back that far).
    pub fn subscribe(&self, topic: &Arc<Topic>, since: Option<u64>, init: bool) -> Start {
        let st = self.state.lock().expect("state");
        let rx = topic.subscribe();
        let now = st.seq;
        let mut first = Vec::new();
        let covered =
            |l: u64| l == now || (l < now && st.history.front().is_some_and(|c| c.seq <= l + 1));
        match since {
            Some(l) if covered(l) => {
                for c in st.history.iter().filter(|c| c.seq > l) {
                    match topic.sees(c) {
                        Some(true) => first.push(Arc::new(fanout::render(
                            c.seq,
                            "set",
                            &c.id,
                            c.new.as_ref().map(|r| &r.json[..]),
                        ))),
                        Some(false) => {
                            first.push(Arc::new(fanout::render(c.seq, "remove", &c.id, None)))
                        }
                        None => {}
                    }
                }
            }
            _ => {
                if since.is_some() {
                    first.push(Arc::new(fanout::control(
                        0,
                        "reset",
                        "{\"reason\":\"gap\"}",
                    )));
                }
                if init || since.is_some() {
                    for (id, r) in st.matching(topic) {
                        first.push(Arc::new(fanout::render(0, "set", &id, Some(&r.json))));
                    }
                }
                first.push(Arc::new(fanout::control(
                    now,
                    "init",
                    &format!("{{\"seq\":{now}}}"),
                )));
            }
        }
        Start {
            rx,
            first,
            skip_to: now,
        }
    }
}

impl State {
    /// The records `topic` shows.
    fn matching<'a>(
        &'a self,
        topic: &'a Topic,
    ) -> impl Iterator<Item = (Arc<str>, Arc<Record>)> + 'a {
        let p = topic.pattern.as_str();
        let prefix = &p[..p.find('*').unwrap_or(p.len())];
        (self.records.range::<str, _>((
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Unbounded,
        )))
        .take_while(move |(id, _)| id.starts_with(prefix))
        .filter(|(id, r)| topic.shows(id, Some(r)))
        .map(|(id, r)| (Arc::clone(id), Arc::clone(r)))
    }

    /// Sets (or with None removes) the record `id` as change `seq`, keeping groups and the
    /// history current.
    fn apply(&mut self, id: &Arc<str>, seq: u64, new: Option<Arc<Record>>) -> Arc<Change> {
        let old = match &new {
            Some(r) => self.records.insert(Arc::clone(id), Arc::clone(r)),
            None => self.records.remove(id),
        };
        if let Some(o) = &old {
            self.live_bytes = self
                .live_bytes
                .saturating_sub((o.json.len() + id.len() + 48) as u64);
        }
        if let Some(n) = &new {
            self.live_bytes += (n.json.len() + id.len() + 48) as u64;
        }
        for g in &mut self.groups {
            if !g.pattern.matches(id) {
                continue;
            }
            if let Some(o) = &old {
                g.order.remove(&o.seq);
            }
            if let Some(n) = &new {
                g.order.insert(n.seq, Arc::clone(id));
            }
        }
        let change = Arc::new(Change {
            seq,
            id: Arc::clone(id),
            old,
            new,
        });
        if self.history.len() >= self.history_max {
            self.history.pop_front();
        }
        self.history.push_back(Arc::clone(&change));
        change
    }

    /// Removes the oldest records of the groups (of `id`, or all) that hold more than their
    /// maximum.
    fn evict_over_max(&mut self, id: Option<&str>) -> Vec<Arc<Change>> {
        let mut out = Vec::new();
        for gi in 0..self.groups.len() {
            let g = &self.groups[gi];
            let Some(max) = g.max else { continue };
            if id.is_some_and(|id| !g.pattern.matches(id)) {
                continue;
            }
            while self.groups[gi].order.len() > max {
                let (_, oldest) = self.groups[gi]
                    .order
                    .first_key_value()
                    .map(|(k, v)| (*k, Arc::clone(v)))
                    .expect("over max, so not empty");
                self.seq += 1;
                let seq = self.seq;
                out.push(self.apply(&oldest, seq, None));
            }
        }
        out
    }
}

/// The log's writer: commits queued changes in groups, then publishes and acknowledges them;
/// compacts the log when it has grown past twice the live records.
/// Where the writer publishes committed changes.
enum Publish {
    /// On the runtime, through this task.
    Task(tokio::sync::mpsc::UnboundedSender<Vec<Arc<Change>>>),
    /// From the writer thread itself (no runtime: tools and tests of the store alone).
    Here,
}

fn writer(
    rx: mpsc::Receiver<Job>,
    mut log: Log,
    state: Arc<Mutex<State>>,
    fanout: Arc<Fanout>,
    publish: Publish,
) {
    const COMPACT_MIN: u64 = 8 << 20;
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < 4096 {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let frames: Vec<u8> = if jobs.len() == 1 {
            std::mem::take(&mut jobs[0].frames)
        } else {
            jobs.iter().flat_map(|j| j.frames.iter().copied()).collect()
        };
        let res = log.commit(&frames);
        if let Err(e) = &res {
            tracing::error!(error = %e, "push: the change log could not be written; writes are refused until restart");
            state.lock().expect("state").failed = true;
        } else {
            match &publish {
                Publish::Task(tx) => {
                    let all: Vec<Arc<Change>> = jobs
                        .iter()
                        .flat_map(|j| j.changes.iter().cloned())
                        .collect();
                    if tx.send(all).is_err() {
                        for j in &jobs {
                            fanout.publish(&j.changes);
                        }
                    }
                }
                Publish::Here => {
                    for j in &jobs {
                        fanout.publish(&j.changes);
                    }
                }
            }
        }
        for j in jobs {
            if let Some(ack) = j.ack {
                let _ = ack.send(match &res {
                    Ok(()) => Ok(()),
                    Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                });
            }
        }
        if res.is_err() {
            continue;
        }
        let live = state.lock().expect("state").live_bytes;
        if log.len > COMPACT_MIN.max(2 * live) {
            let (seq, records) = {
                let st = state.lock().expect("state");
                let records: Vec<(Arc<str>, Arc<Record>)> = (st.records.iter())
                    .map(|(k, v)| (Arc::clone(k), Arc::clone(v)))
                    .collect();
                (st.seq, records)
            };
            let mut frames = Vec::with_capacity(live as usize);
            for (id, r) in &records {
                log::frame(&mut frames, r.seq, id, r.t, Some(&r.json));
            }
            match log.compact(seq, records.len(), &frames) {
                Ok(()) => tracing::debug!(bytes = log.len, "push: change log compacted"),
                Err(e) => {
                    tracing::error!(error = %e, "push: compacting the change log failed");
                    state.lock().expect("state").failed = true;
                }
            }
        }
    }
}

/// Applies a JSON merge patch (RFC 7396) to `target`.
pub fn merge_patch(target: &mut Value, patch: Value) {
    let Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let obj = target.as_object_mut().expect("made an object");
    for (k, v) in patch {
        if v.is_null() {
            obj.remove(&k);
        } else {
            merge_patch(obj.entry(k).or_insert(Value::Null), v);
        }
    }
}

/// Sets the member at `path` (object keys, objects made where missing) to `v`.
fn set_member(target: &mut Value, path: &[String], v: Value) -> Result<(), WriteError> {
    let mut at = target;
    for (i, key) in path.iter().enumerate() {
        let Value::Object(obj) = at else {
            return Err(WriteError::Conflict(path[..i].join("/")));
        };
        at = obj
            .entry(key.clone())
            .or_insert(Value::Object(Default::default()));
    }
    *at = v;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7396() {
        // The examples of RFC 7396 appendix A.
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (mut t, p, want) in cases {
            merge_patch(&mut t, p);
            assert_eq!(t, want);
        }
    }

    #[test]
    fn members_are_set_through_objects_only() {
        let mut v = json!({"a": {"b": 1}, "n": 3});
        set_member(&mut v, &["a".into(), "c".into()], json!(2)).unwrap();
        set_member(&mut v, &["x".into(), "y".into()], json!(true)).unwrap();
        assert_eq!(v, json!({"a": {"b": 1, "c": 2}, "n": 3, "x": {"y": true}}));
        assert!(matches!(
            set_member(&mut v, &["n".into(), "z".into()], json!(0)),
            Err(WriteError::Conflict(p)) if p == "n"
        ));
    }
}
