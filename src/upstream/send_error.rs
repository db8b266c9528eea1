//! Why an exchange with a backend failed before its response head ([`SendError`]), and whether
//! it may be sent again. A leaf: both clients (`h1.rs`, larder's own connections, and
//! `connect.rs`, hyper-util's) answer with it, and it imports neither.

/// Why an exchange failed before its response head.
#[derive(Debug)]
pub enum SendError {
    /// No connection to the backend (refused, unreachable, unresolved, not within
    /// connect_timeout).
    Connect(std::io::Error),
    /// hyper's error on an open connection; `reused`: a pooled one (not new for this request).
    Http { error: hyper::Error, reused: bool },
    /// hyper-util's client's error.
    Legacy(hyper_util::client::legacy::Error),
}

impl SendError {
    /// No connection was made.
    pub fn is_connect(&self) -> bool {
        match self {
            SendError::Connect(_) => true,
            SendError::Http { .. } => false,
            SendError::Legacy(e) => e.is_connect(),
        }
    }

    /// Whether a pooled connection closed before a response head arrived (nothing was
    /// answered, so an idempotent request may be sent again): hyper saw the close itself (end
    /// of input, a canceled or closed connection), or an I/O error under it is a reset or a
    /// broken pipe (the origin's close arriving as larder wrote or read). A new connection
    /// that does this is the backend's failure, not a race with its idle timeout.
    pub fn closed_before_answer(&self) -> bool {
        match self {
            SendError::Connect(_) | SendError::Http { reused: false, .. } => false,
            SendError::Http { error, .. } => closed(error),
            SendError::Legacy(e) => {
                !e.is_connect() && std::error::Error::source(e).is_some_and(closed)
            }
        }
    }
}

/// Whether `e` or an error under it says the connection was closed (see
/// [`SendError::closed_before_answer`]).
fn closed(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                return true;
            }
        } else if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            );
        }
        cur = c.source();
    }
    false
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(e) => write!(f, "connect: {e}"),
            SendError::Http { error, .. } => error.fmt(f),
            SendError::Legacy(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::Connect(e) => e.source(),
            SendError::Http { error, .. } => error.source(),
            SendError::Legacy(e) => e.source(),
        }
    }
}
