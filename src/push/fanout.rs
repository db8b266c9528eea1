//! Fan-out: every change goes to the subscribers whose pattern and filter it concerns, with
//! its bytes serialized once.
//!
//! Subscribers with the same pattern and filter share a [`Topic`] (one broadcast ring of
//! events), so a change is evaluated once per distinct filter and pushed into each ring once;
//! every subscriber of a ring reads the same `Bytes`. A subscriber that falls more than the
//! ring's size behind finds it has lagged: it gets a `reset` event and is closed, and the others
//! never wait for it (the ring overwrites; memory stays bounded by the ring).
//!
//! For a topic, a change is a `set` when the new value passes the filter, and a `remove` when
//! the record was removed or no longer passes but passed before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::broadcast;

use super::filter::{Filter, IdPattern};
use super::store::{Change, Record};

/// A change as a subscriber receives it: its SSE event and its WebSocket message's shared tail
/// (after `{"sub":NAME,`). `seq` 0 is a heartbeat.
pub struct Event {
    pub seq: u64,
    pub sse: Bytes,
    /// `sse` as one HTTP/1.1 chunk, for streams larder writes itself (`super::sse`).
    pub chunk: Bytes,
    pub ws_tail: Bytes,
}

impl Event {
    fn new(seq: u64, sse: Bytes, ws_tail: Bytes) -> Event {
        Event {
            seq,
            chunk: chunk(&sse),
            sse,
            ws_tail,
        }
    }
}

/// `data` framed as one HTTP/1.1 chunk.
pub fn chunk(data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(data.len() + 12);
    b.put_slice(format!("{:x}\r\n", data.len()).as_bytes());
    b.put_slice(data);
    b.put_slice(b"\r\n");
    b.freeze()
}

/// The subscribers of one pattern and filter.
pub struct Topic {
    pub pattern: IdPattern,
    pub filter: Filter,
    pub tx: broadcast::Sender<Arc<Event>>,
}

impl Topic {
    /// Whether the record `id`, as `rec`, is one the topic's subscribers see.
    pub fn shows(&self, id: &str, rec: Option<&Record>) -> bool {
        rec.is_some_and(|r| self.pattern.matches(id) && self.filter.eval(id, &r.value))
    }

    /// What `change` is to this topic: a set, a remove, or nothing.
    pub fn sees(&self, c: &Change) -> Option<bool> {
        if !self.pattern.matches(&c.id) {
            return None;
        }
        if self.shows(&c.id, c.new.as_deref()) {
            Some(true)
        } else if self.shows(&c.id, c.old.as_deref()) {
            Some(false)
        } else {
            None
        }
    }
}

/// The topics of a push route.
pub struct Fanout {
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    /// Events a subscriber may fall behind by (in topics made from now on).
    queue: AtomicUsize,
    heartbeat: Arc<Event>,
}

impl Fanout {
    pub fn new(queue: usize) -> Fanout {
        Fanout {
            topics: RwLock::default(),
            queue: AtomicUsize::new(queue.max(1)),
            heartbeat: Arc::new(Event::new(0, Bytes::from_static(b":\n\n"), Bytes::new())),
        }
    }

    /// The ring size of topics made from now on (a reload).
    pub fn set_queue(&self, queue: usize) {
        self.queue.store(queue.max(1), Ordering::Relaxed);
    }

    /// The topic of `pattern` and `filter`, made if none has them.
    pub fn topic(&self, pattern: &IdPattern, filter: &Filter) -> Arc<Topic> {
        let key = format!("{}\n{}", pattern.as_str(), filter.canonical());
        if let Some(t) = self.topics.read().expect("topics").get(&key) {
            return Arc::clone(t);
        }
        let mut topics = self.topics.write().expect("topics");
        Arc::clone(topics.entry(key).or_insert_with(|| {
            Arc::new(Topic {
                pattern: pattern.clone(),
                filter: filter.clone(),
                tx: broadcast::channel(self.queue.load(Ordering::Relaxed)).0,
            })
        }))
    }

    /// Sends each change, in order, to the topics it concerns.
    pub fn publish(&self, changes: &[Arc<Change>]) {
        let topics = self.topics.read().expect("topics");
        if topics.is_empty() {
            return;
        }
        for c in changes {
            let (mut set, mut remove) = (None, None);
            for t in topics.values() {
                if t.tx.receiver_count() == 0 {
                    continue;
                }
                let ev = match t.sees(c) {
                    Some(true) => set.get_or_insert_with(|| Arc::new(set_event(c))),
                    Some(false) => remove.get_or_insert_with(|| Arc::new(remove_event(c))),
                    None => continue,
                };
                let _ = t.tx.send(Arc::clone(ev));
            }
        }
    }

    /// A heartbeat to every subscriber; topics nobody subscribes to any more are dropped.
    pub fn heartbeat(&self) {
        let mut topics = self.topics.write().expect("topics");
        topics.retain(|_, t| t.tx.receiver_count() > 0);
        for t in topics.values() {
            let _ = t.tx.send(Arc::clone(&self.heartbeat));
        }
    }

    /// Subscribers now (each SSE stream or WebSocket subscription counts once).
    pub fn subscribers(&self) -> usize {
        let topics = self.topics.read().expect("topics");
        topics.values().map(|t| t.tx.receiver_count()).sum()
    }

    /// Distinct topics now.
    pub fn topics(&self) -> usize {
        self.topics.read().expect("topics").len()
    }
}

fn set_event(c: &Change) -> Event {
    let rec = c.new.as_deref().expect("a set has a new value");
    render(c.seq, "set", &c.id, Some(&rec.json))
}

fn remove_event(c: &Change) -> Event {
    render(c.seq, "remove", &c.id, None)
}

/// An event's SSE text and WebSocket tail. `seq` 0 writes no `id:` line (events of an `init`).
pub fn render(seq: u64, kind: &str, id: &str, value: Option<&[u8]>) -> Event {
    let id_json = serde_json::to_string(id).expect("a string serializes");
    let vlen = value.map_or(0, <[u8]>::len);
    let mut sse = BytesMut::with_capacity(vlen + id.len() + 64);
    if seq != 0 {
        sse.put_slice(format!("id: {seq}\n").as_bytes());
    }
    sse.put_slice(format!("event: {kind}\ndata: {{\"id\":{id_json}").as_bytes());
    let mut ws = BytesMut::with_capacity(vlen + id.len() + 64);
    ws.put_slice(format!("\"event\":\"{kind}\",\"seq\":{seq},\"id\":{id_json}").as_bytes());
    if let Some(v) = value {
        sse.put_slice(b",\"value\":");
        sse.put_slice(v);
        ws.put_slice(b",\"value\":");
        ws.put_slice(v);
    }
    sse.put_slice(b"}\n\n");
    ws.put_slice(b"}");
    Event::new(seq, sse.freeze(), ws.freeze())
}

/// A control event (`init`, `reset`) with a JSON payload.
pub fn control(seq: u64, kind: &str, data: &str) -> Event {
    let sse = if seq != 0 {
        format!("id: {seq}\nevent: {kind}\ndata: {data}\n\n")
    } else {
        format!("event: {kind}\ndata: {data}\n\n")
    };
    let ws = format!("\"event\":\"{kind}\",\"seq\":{seq},\"data\":{data}}}");
    Event::new(seq, sse.into(), ws.into())
}
