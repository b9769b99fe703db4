//! The manager's HTTPS front door: its own accept loop, TLS and HTTP/1.1 per connection,
//! with the limits that keep one client from starving the rest of the site.
//!
//! Every connection costs the manager a file descriptor, and descriptors are shared
//! with what the manager itself needs (SQLite, munged, heartbeats and the other calls to
//! storage servers). A client that opens connections and never finishes a request, or
//! keeps them idle, could otherwise hold every descriptor: other users' requests would
//! then time out and heartbeats could not open sockets. So:
//!
//! * `header_timeout`: the TLS handshake and the first request's head must be complete
//!   within this time of the accept, however the client paces its bytes; a request's
//!   body must arrive within this time of its head.
//! * `idle_timeout`: a kept-alive connection with no request in flight is closed after
//!   this time. A request in flight (an agent's long poll, a `?wait=` poll) is never cut.
//! * `max_connections` (all clients) and `max_connections_per_peer` (one peer): a
//!   connection over either cap is closed at once, before TLS, and logged (rate-limited).
//!   `max_connections` defaults to the descriptor limit minus a reserve for the
//!   manager's own use, so the manager never runs out of descriptors for API clients.
//!
//! Who a peer is, the caps' bookkeeping and the descriptor limit are shared with the
//! storage servers (`spillway_types::peer`, `spillway_types::rlimit`): a peer is the
//! remote IP address; a connection from this host itself is keyed by the uid owning the
//! connecting socket instead (from `/proc/net/tcp{,6}`), so one local user cannot use
//! up every local user's share. That works only for peers on the manager's host: users
//! of a remote login node share that node's address. Unlike the storage servers, the
//! manager gives root on its host a share like any uid.

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use spillway_types::peer::{Admitted, PeerLimits, PeerLookup, Refusal, Throttle};
use spillway_types::rlimit::is_resource_exhaustion;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

/// The limits of the front door (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
}

/// Descriptors kept for the manager's own use when `max_connections` is derived from
/// the descriptor limit: SQLite, munged (one per request being authenticated, at most
/// `BLOCKING_THREADS` at once), heartbeats and fragment calls (16 at once each), stage
/// connections to servers, logs. A quarter of the limit, at least 256 and at most 4096.
pub fn fd_reserve(nofile: u64) -> u64 {
    (nofile / 4).clamp(256, 4096)
}

/// Threads of the runtime's blocking pool (request authentication and database work):
/// bounds the descriptors requests use besides their connection.
pub const BLOCKING_THREADS: usize = 64;

/// Connections accepted in one go when several are waiting.
const ACCEPT_BATCH: usize = 256;

/// The most connections a derived `max_connections` allows (each costs memory for its
/// TLS state); a site with more compute nodes than this sets `max_connections`.
pub const DERIVED_MAX_CONNECTIONS: u64 = 16384;

/// `max_connections` when the configuration sets none: the descriptor limit minus the
/// reserve (at least half the limit when the limit is tiny), at most
/// `DERIVED_MAX_CONNECTIONS`.
pub fn derived_max_connections(nofile: u64) -> usize {
    let n = nofile
        .saturating_sub(fd_reserve(nofile))
        .max(nofile / 2)
        .clamp(1, DERIVED_MAX_CONNECTIONS);
    n as usize
}

/// The TLS setup of the front door: the manager's certificate chain and key, HTTP/1.1
/// only (the API's clients speak nothing else).
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot load TLS certificate {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("cannot load TLS key {}: {e}", key.display()))?;
    let mut cfg = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate/key: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

// ------------------------------------------------------------------ serving

/// Serve `app` on `listener` until `shutdown` completes; then stop accepting, let
/// requests in flight finish for up to 2 s, and return.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let caps = PeerLimits::new(limits.max_connections, limits.max_connections_per_peer);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut peers = PeerLookup::new();
    let mut refused_log = Throttle::new(Duration::from_secs(10));
    let mut accept_log = Throttle::new(Duration::from_secs(10));
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let mut batch = match accepted {
            Ok(x) => vec![x],
            Err(e) => {
                let exhausted = is_resource_exhaustion(&e);
                if let Some(n) = accept_log.allow(Instant::now()) {
                    if exhausted {
                        tracing::error!(
                            "accept: {e}: the manager is out of descriptors or memory \
                             (max_connections is above what the process can hold?); \
                             {n} more since the last report"
                        );
                    } else {
                        tracing::warn!("accept: {e} ({n} more since the last report)");
                    }
                }
                if exhausted {
                    // The connection waits in the backlog; retrying at once would spin.
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
                continue;
            }
        };
        // Connections already waiting are taken together, so one look at /proc answers
        // for all of them (an error here shows again at the next accept).
        while batch.len() < ACCEPT_BATCH {
            match tokio::time::timeout(Duration::ZERO, listener.accept()).await {
                Ok(Ok(x)) => batch.push(x),
                _ => break,
            }
        }
        for (stream, addr) in batch {
            let Ok(ours) = stream.local_addr() else {
                continue; // already reset by the peer
            };
            let peer = peers.peer_of(addr, ours);
            let ticket = match caps.admit(peer) {
                Ok(t) => t,
                Err(why) => {
                    // Closed at once, before TLS: an over-cap connection holds a
                    // descriptor no longer than this.
                    drop(stream);
                    if let Some(n) = refused_log.allow(Instant::now()) {
                        let (cap, open) = match why {
                            Refusal::Total => ("max_connections", caps.open()),
                            Refusal::Peer => ("max_connections_per_peer", caps.open_from(&peer)),
                        };
                        tracing::warn!(
                            peer = %peer,
                            address = %addr,
                            "connection refused: {cap} reached ({open} open); \
                             {n} more refused since the last report"
                        );
                    }
                    continue;
                }
            };
            tokio::spawn(connection(
                stream,
                addr,
                ticket,
                acceptor.clone(),
                app.clone(),
                limits,
                stop_rx.clone(),
            ));
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let deadline = Instant::now() + Duration::from_secs(2);
    while caps.open() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the watchdog of one connection needs to know about its requests.
struct Activity {
    state: Mutex<ActState>,
    changed: Notify,
}

struct ActState {
    /// Requests whose head was received.
    requests: u64,
    /// Requests whose answer is not produced yet.
    in_flight: u32,
    /// When the last request was answered.
    idle_since: Instant,
}

impl Activity {
    fn lock(&self) -> std::sync::MutexGuard<'_, ActState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        {
            let mut st = self.lock();
            st.requests += 1;
            st.in_flight += 1;
        }
        self.changed.notify_one();
        InFlight(self.clone())
    }

    /// When the connection is to be closed unless something happens: `first` until
    /// the first request's head is in, then `idle_timeout` after the last answer; never
    /// while a request is in flight.
    fn deadline(&self, first: Instant, idle_timeout: Duration) -> Option<Instant> {
        let st = self.lock();
        if st.in_flight > 0 {
            None
        } else if st.requests == 0 {
            Some(first)
        } else {
            Some(st.idle_since + idle_timeout)
        }
    }
}

/// A request in flight; dropped when its answer is produced (or it is abandoned).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut st = self.0.lock();
            st.in_flight = st.in_flight.saturating_sub(1);
            st.idle_since = Instant::now();
        }
        self.0.changed.notify_one();
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

/// One connection: TLS, then HTTP/1.1 requests until the client closes, a limit is
/// reached or the manager stops. Dropping the connection closes the socket.
async fn connection(
    stream: TcpStream,
    addr: SocketAddr,
    _ticket: Admitted,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let first_deadline = Instant::now() + limits.header_timeout;
    let _ = stream.set_nodelay(true);
    let tls = tokio::select! {
        r = tokio::time::timeout_at(
            tokio::time::Instant::from_std(first_deadline),
            acceptor.accept(stream),
        ) => match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(peer = %addr, "TLS handshake failed: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!(peer = %addr, "closed: no TLS handshake within header_timeout");
                return;
            }
        },
        _ = stop.wait_for(|s| *s) => return,
    };
    let activity = Arc::new(Activity {
        state: Mutex::new(ActState {
            requests: 0,
            in_flight: 0,
            idle_since: Instant::now(),
        }),
        changed: Notify::new(),
    });
    let body_timeout = limits.header_timeout;
    let act = activity.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let guard = act.begin();
        let mut app = app.clone();
        let unread: Unread = Arc::new(Mutex::new(None));
        let within = Instant::now() + body_timeout;
        let mut req =
            req.map(|b| axum::body::Body::new(DeadlineBody::new(b, body_timeout, unread.clone())));
        // Handlers that want the client's address (agents) read it from here.
        req.extensions_mut().insert(ConnectInfo(addr));
        async move {
            let r = tower_service::Service::call(&mut app, req).await;
            let left = unread.lock().unwrap_or_else(|e| e.into_inner()).take();
            let r = match (r, left) {
                (Ok(mut resp), Some(body)) => {
                    if !drain(body, within).await {
                        resp.headers_mut().insert(
                            hyper::header::CONNECTION,
                            hyper::header::HeaderValue::from_static("close"),
                        );
                    }
                    Ok(resp)
                }
                (r, _) => r,
            };
            drop(guard);
            r
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper's own header timeout restarts whenever it waits for a head, kept-alive
    // connections included; the watchdog below bounds both instead.
    builder.keep_alive(true).header_read_timeout(None);
    let conn = builder.serve_connection(TokioIo::new(tls), svc);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        let changed = activity.changed.notified();
        let deadline = activity.deadline(first_deadline, limits.idle_timeout);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(peer = %addr, "connection: {e}");
                }
                return;
            }
            _ = changed => {}
            _ = sleep_until(deadline) => {
                // Looked at again: a request may have begun since.
                if activity
                    .deadline(first_deadline, limits.idle_timeout)
                    .is_some_and(|d| d <= Instant::now())
                {
                    let first = activity.lock().requests == 0;
                    tracing::debug!(
                        peer = %addr,
                        "closed: {}",
                        if first {
                            "no complete request head within header_timeout"
                        } else {
                            "idle for idle_timeout"
                        }
                    );
                    return;
                }
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bytes of a refused request body read and thrown away before the answer, at most.
/// A body over `MAX_BODY` is refused (413) as soon as the limit is passed; were the
/// connection closed with the rest unread, the kernel would answer the client's next
/// bytes with a reset and the client would see "Broken pipe" (or lose the answer)
/// instead of the 413 and its message. Beyond this much the connection is closed all
/// the same: no client sends a body this large in good faith.
pub const MAX_DRAIN: u64 = 64 << 20;

/// What a handler left unread of its request body, to drain before the answer.
type Unread = Arc<Mutex<Option<Incoming>>>;

/// Read what is left of `body` and throw it away, until its end, `MAX_DRAIN` bytes or
/// `deadline`: true when the end was reached (the connection may be kept).
async fn drain(mut body: Incoming, deadline: Instant) -> bool {
    let mut seen: u64 = 0;
    let read = async {
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            match frame {
                Ok(f) => {
                    seen += f.data_ref().map_or(0, |d| d.len() as u64);
                    if seen > MAX_DRAIN {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
        true
    };
    tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), read)
        .await
        .unwrap_or(false)
}

/// A request body that fails when it has not fully arrived within a time of its head,
/// so a client trickling a body cannot hold a request (and its connection) for long.
/// Dropped before its end (a body refused as too large, or never read), it leaves the
/// rest in `unread` for the connection to drain before it answers.
struct DeadlineBody {
    /// Always there until the drop.
    inner: Option<Incoming>,
    timer: Pin<Box<tokio::time::Sleep>>,
    unread: Unread,
}

impl DeadlineBody {
    fn new(inner: Incoming, within: Duration, unread: Unread) -> DeadlineBody {
        DeadlineBody {
            inner: Some(inner),
            timer: Box::pin(tokio::time::sleep(within)),
            unread,
        }
    }
}

impl Drop for DeadlineBody {
    fn drop(&mut self) {
        if let Some(b) = self.inner.take().filter(|b| !b.is_end_stream()) {
            *self.unread.lock().unwrap_or_else(|e| e.into_inner()) = Some(b);
        }
    }
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(r) => Poll::Ready(r.map(|f| f.map_err(BoxError::from))),
            Poll::Pending => {
                if this.timer.as_mut().poll(cx).is_ready() {
                    Poll::Ready(Some(Err(
                        "the request body did not arrive within header_timeout".into(),
                    )))
                } else {
                    Poll::Pending
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_limits_keep_a_reserve() {
        assert_eq!(derived_max_connections(1024), 768);
        assert_eq!(derived_max_connections(4096), 3072);
        assert_eq!(derived_max_connections(64), 32);
        assert_eq!(derived_max_connections(0), 1);
        assert_eq!(
            derived_max_connections(1 << 20),
            DERIVED_MAX_CONNECTIONS as usize
        );
        assert!(fd_reserve(1024) >= BLOCKING_THREADS as u64 + 64);
    }
}
