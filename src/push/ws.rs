//! A push route's WebSocket sessions (RFC 6455, framed by tokio-tungstenite): one socket, any
//! number of named subscriptions, and reads of single records, in JSON messages.
//!
//! Client to server:
//!
//! ```json
//! {"op": "get", "id": "cars/42"}
//! {"op": "subscribe", "name": "cheap", "match": "cars/*", "filter": "price < 100",
//!  "init": true, "since": 1234}
//! {"op": "unsubscribe", "name": "cheap"}
//! ```
//!
//! Server to client: `{"sub": NAME, "event": "set"|"remove", "seq": N, "id": ..., "value":
//! ...}`, `{"sub": NAME, "event": "init"|"reset", "seq": N, "data": {...}}` (the same events as
//! SSE, `since` resuming like `Last-Event-ID`), `{"op": "get", "id": ..., "value": ...}`, and
//! `{"error": ..., "op": ...}` for a request it refused. Pings go out every heartbeat; a
//! message over the route's limit closes the socket with 1009.
//!
//! A peer that does not read is bounded like any other: every write (a message, the pong to a
//! ping, which tungstenite queues as it reads the ping) is awaited before the next frame is
//! read, so what waits for the peer is at most one message and one pong, and a write
//! that waits two heartbeats ends the session (the socket is dropped: a close frame would wait
//! behind what the peer has not read).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::stream::{AbortHandle, Abortable};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame, Role};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

use super::auth::Allowed;
use super::filter::{Filter, IdPattern};
use super::store::{Start, Store};
use crate::upgrade::Upgraded;

/// What a session needs of its route: the store, and the route's settings for sessions.
pub(crate) struct Route {
    pub store: Arc<Store>,
    /// `ws_max_message`.
    pub max_message: usize,
    /// `queue`: events waiting for the socket, of all its subscriptions.
    pub queue: usize,
    pub heartbeat: std::time::Duration,
}

/// Subscriptions one socket may hold at once.
const MAX_SUBSCRIPTIONS: usize = 64;

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Request {
    Get {
        id: String,
    },
    Subscribe {
        name: String,
        #[serde(rename = "match", default)]
        pattern: Option<String>,
        #[serde(default)]
        filter: Option<String>,
        #[serde(default = "yes")]
        init: bool,
        #[serde(default)]
        since: Option<u64>,
    },
    Unsubscribe {
        name: String,
    },
}

fn yes() -> bool {
    true
}

/// The upgraded connection: what hyper read past the request comes first.
struct Rewind {
    pre: Bytes,
    io: Box<dyn crate::upgrade::Io>,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre.split_to(n));
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// An event of one subscription, or its end.
enum Out {
    Event(Bytes),
    Ended(String, &'static str),
}

fn message(sub_json: &[u8], tail: &[u8]) -> Bytes {
    let mut m = BytesMut::with_capacity(sub_json.len() + tail.len() + 8);
    m.put_slice(b"{\"sub\":");
    m.put_slice(sub_json);
    m.put_u8(b',');
    m.put_slice(tail);
    m.freeze()
}

fn error(op: &str, text: &str) -> Message {
    Message::text(serde_json::json!({ "op": op, "error": text }).to_string())
}

/// Runs a session on the socket handed over after the 101.
pub(crate) async fn session(route: Route, up: Upgraded, read: Allowed) {
    let io = Rewind {
        pre: up.read_ahead,
        io: up.io,
    };
    let max = route.max_message;
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max));
    let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
    let (mut tx, mut rx) = ws.split();
    // Events of every subscription, bounded: a socket that cannot keep up loses its
    // subscriptions (each gets a `reset`), never the route's memory.
    let (ev_tx, mut ev_rx) = mpsc::channel::<Out>(route.queue);
    let mut subs: HashMap<String, AbortHandle> = HashMap::new();
    let heartbeat = route.heartbeat;
    // How long one write may wait for the peer to read: past it, the session ends.
    let patience = heartbeat * 2;
    let mut ping = tokio::time::interval(heartbeat);
    ping.tick().await;
    let mut reason: Option<CloseFrame> = None;
    let mut stalled = false;
    loop {
        let out: Write = tokio::select! {
            m = rx.next() => match m {
                None => break,
                Some(Err(tungstenite::Error::Capacity(_))) => {
                    reason = Some(CloseFrame { code: CloseCode::Size, reason: "message too large".into() });
                    break;
                }
                Some(Err(_)) => break,
                Some(Ok(Message::Text(t))) => Write::Send(handle(&route, &read, t.as_bytes(), &mut subs, &ev_tx)),
                Some(Ok(Message::Binary(b))) => Write::Send(handle(&route, &read, &b, &mut subs, &ev_tx)),
                Some(Ok(Message::Close(_))) => break,
                // tungstenite has queued the pong; it goes before the next frame is read (its
                // reads never wait for a write, so pongs to a peer that does not read would
                // pile up in its write buffer, one per ping read).
                Some(Ok(Message::Ping(_))) => Write::Flush,
                Some(Ok(_)) => Write::Nothing,
            },
            e = ev_rx.recv() => match e {
                Some(Out::Event(b)) => Write::Send(Message::Text(
                    tungstenite::Utf8Bytes::try_from(b).expect("events are JSON text"),
                )),
                Some(Out::Ended(name, why)) => {
                    subs.remove(&name);
                    let sub = serde_json::to_string(&name).expect("a string serializes");
                    Write::Send(Message::text(format!(
                        "{{\"sub\":{sub},\"event\":\"reset\",\"seq\":0,\"data\":{{\"reason\":\"{why}\"}}}}"
                    )))
                }
                None => Write::Nothing,
            },
            _ = ping.tick() => Write::Send(Message::Ping(Bytes::new())),
        };
        // Every write waits for the peer's socket (nothing more is read meanwhile), and at
        // most `patience`.
        let wrote = match out {
            Write::Send(m) => tokio::time::timeout(patience, tx.send(m)).await,
            Write::Flush => tokio::time::timeout(patience, tx.flush()).await,
            Write::Nothing => continue,
        };
        match wrote {
            Ok(Ok(())) => {}
            Ok(Err(_)) => break,
            Err(_) => {
                // The peer reads nothing: a close frame would wait behind what it has not
                // read, so the connection is dropped without one.
                stalled = true;
                break;
            }
        }
    }
    for (_, h) in subs {
        h.abort();
    }
    if stalled {
        return;
    }
    // The closing handshake waits for the peer at most `patience` too.
    let _ = tokio::time::timeout(patience, async {
        if let Some(r) = reason {
            let _ = tx.send(Message::Close(Some(r))).await;
        }
        let _ = tx.close().await;
    })
    .await;
}

/// What the session writes after an event: a message, the pong tungstenite queued, or nothing.
enum Write {
    Send(Message),
    Flush,
    Nothing,
}

/// Answers one client message.
fn handle(
    route: &Route,
    read: &Allowed,
    text: &[u8],
    subs: &mut HashMap<String, AbortHandle>,
    ev_tx: &mpsc::Sender<Out>,
) -> Message {
    let req: Request = match serde_json::from_slice(text) {
        Ok(r) => r,
        Err(e) => return error("", &format!("not a request: {e}")),
    };
    match req {
        Request::Get { id } => {
            if !read.id(&id) {
                return error("get", "not allowed");
            }
            match route.store.get(&id) {
                Some(r) => {
                    let id = serde_json::to_string(&id).expect("a string serializes");
                    let mut m = format!("{{\"op\":\"get\",\"id\":{id},\"value\":").into_bytes();
                    m.extend_from_slice(&r.json);
                    m.push(b'}');
                    Message::Text(tungstenite::Utf8Bytes::try_from(m).expect("JSON text"))
                }
                None => error("get", "no such record"),
            }
        }
        Request::Unsubscribe { name } => match subs.remove(&name) {
            Some(h) => {
                h.abort();
                Message::text(serde_json::json!({"op": "unsubscribe", "name": name}).to_string())
            }
            None => error("unsubscribe", "no such subscription"),
        },
        Request::Subscribe {
            name,
            pattern,
            filter,
            init,
            since,
        } => {
            if subs.contains_key(&name) {
                return error("subscribe", "a subscription of that name exists");
            }
            if subs.len() >= MAX_SUBSCRIPTIONS || name.len() > 256 {
                return error("subscribe", "too many subscriptions (or too long a name)");
            }
            let pattern = match IdPattern::parse(pattern.as_deref().unwrap_or("*")) {
                Ok(p) => p,
                Err(e) => return error("subscribe", &e),
            };
            if !read.pattern(&pattern) {
                return error("subscribe", "not allowed");
            }
            let filter = match Filter::parse(filter.as_deref().unwrap_or("")) {
                Ok(f) => f,
                Err(e) => return error("subscribe", &e.to_string()),
            };
            let topic = route.store.fanout.topic(&pattern, &filter);
            let start = route.store.subscribe(&topic, since, init);
            let sub_json = serde_json::to_string(&name).expect("a string serializes");
            let (handle, reg) = AbortHandle::new_pair();
            subs.insert(name.clone(), handle);
            let tx = ev_tx.clone();
            let ack =
                Message::text(serde_json::json!({"op": "subscribe", "name": name}).to_string());
            tokio::spawn(Abortable::new(
                forward(start, sub_json.into_bytes(), name, tx),
                reg,
            ));
            ack
        }
    }
}

/// Forwards a subscription's events into its socket's queue.
async fn forward(start: Start, sub: Vec<u8>, name: String, tx: mpsc::Sender<Out>) {
    let Start {
        mut rx,
        first,
        skip_to,
    } = start;
    for e in first {
        if tx
            .send(Out::Event(message(&sub, &e.ws_tail)))
            .await
            .is_err()
        {
            return;
        }
    }
    loop {
        let e = match rx.recv().await {
            Ok(e) => e,
            Err(RecvError::Lagged(_)) => {
                let _ = tx.send(Out::Ended(name, "overflow")).await;
                return;
            }
            Err(RecvError::Closed) => return,
        };
        if e.seq == 0 || e.seq <= skip_to {
            continue;
        }
        match tx.try_send(Out::Event(message(&sub, &e.ws_tail))) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                let _ = tx.send(Out::Ended(name, "overflow")).await;
                return;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}
