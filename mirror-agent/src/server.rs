//! HTTP/1 serving with bounds, for the API and the metrics.
//!
//! Connections are accepted as they come and kept in a small registry (an id, how many
//! requests are in progress, since when it is idle). At most `max_connections` are kept:
//!
//! - When a new connection would exceed the limit, the one idle the longest (between requests,
//!   or still waiting for its first request's head) is closed to make room, and counted
//!   ([`Stats::evicted`]). A connection with a request in progress (from its head read until
//!   its answer is handed to the connection) is never closed so. Whatever the number of idle
//!   clients, or of ones slow to send a head, a new one (`mirrorctl status`) is accepted at
//!   once and answered.
//! - Only when every connection has a request in progress do new ones wait in the listen
//!   backlog, until one of those requests ends (within `request_timeout`).
//!
//! Each connection besides: a request's head within `header_timeout` (hyper's header read
//! timeout, which also closes keep-alive connections left idle), its body and handling within
//! `request_timeout` (tower's timeout: 408), and nothing stalled for longer than `idle_timeout`
//! (tokio-io-timeout on the socket: a client that stops reading its answer).
//!
//! A closed connection's descriptor and buffers are freed when its task drops it; a new
//! connection is accepted only once the one it replaced is gone, so a server holds at most
//! `max_connections` + 1 connections' descriptors (the one just accepted beside the one it
//! replaces).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::http::{header, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::serve::Listener;
use axum::{Json, Router};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{oneshot, Notify};
use tokio_io_timeout::TimeoutStream;
use tower::{ServiceBuilder, ServiceExt};

use crate::views::ErrorBody;

/// What one server allows its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections kept at once: beyond, the one idle the longest is closed.
    pub max_connections: u32,
    /// From the connection's start, or the end of the previous answer, to the end of a
    /// request's headers.
    pub header_timeout: Duration,
    /// Reading a request's body and handling it.
    pub request_timeout: Duration,
    /// A read or write of the connection that waits this long ends it.
    pub idle_timeout: Duration,
}

/// What a server counts of its connections (for the metrics).
#[derive(Debug, Default)]
pub struct Stats {
    open: AtomicU64,
    evicted: AtomicU64,
}

impl Stats {
    /// Connections whose descriptor the server holds now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Idle connections closed to make room for a new one, since the start.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }
}

/// One connection in the registry.
struct Entry {
    /// Requests in progress (one at most with HTTP/1; counted to be safe).
    busy: u32,
    /// While idle: its key in [`Registry::idle`] and since when.
    idle: Option<(u64, Instant)>,
    /// Told to close it; `None` once told (it is closing: its task drops it).
    close: Option<oneshot::Sender<()>>,
}

/// The connections a server holds.
struct Registry {
    max: usize,
    next_id: u64,
    /// Orders idle connections: the key a connection gets each time it becomes idle.
    next_idle: u64,
    conns: HashMap<u64, Entry>,
    /// Idle connections by the order they became idle (the first: idle the longest) → id.
    idle: BTreeMap<u64, u64>,
    /// Connections told to close whose task has not dropped them yet.
    closing: usize,
}

impl Registry {
    /// Connections not told to close.
    fn live(&self) -> usize {
        self.conns.len() - self.closing
    }

    /// Whether a new connection may be accepted: fewer than the limit, or one idle to close
    /// for it; and no more than one descriptor beyond the limit meanwhile.
    fn has_room(&self) -> bool {
        self.conns.len() <= self.max && (self.live() < self.max || !self.idle.is_empty())
    }

    fn set_idle(&mut self, id: u64) {
        let key = self.next_idle;
        self.next_idle += 1;
        self.idle.insert(key, id);
        if let Some(e) = self.conns.get_mut(&id) {
            e.idle = Some((key, Instant::now()));
        }
    }
}

/// The registry and what waits on it.
struct Shared {
    registry: Mutex<Registry>,
    /// Woken when a connection closes, becomes idle or busy: the accept loop looks again
    /// whether it has room.
    changed: Notify,
    stats: Arc<Stats>,
    what: &'static str,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Nothing panics while holding it; a poisoned lock still holds a consistent registry.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until a new connection may be accepted.
    async fn room(&self) {
        let mut said = false;
        while !self.lock().has_room() {
            if !said {
                tracing::debug!(
                    server = self.what,
                    "every connection has a request in progress: new ones wait"
                );
                said = true;
            }
            // `notify_one` keeps a permit: a change between the check and here is not missed.
            self.changed.notified().await;
        }
    }

    /// Enters a new connection, idle until its first request; closes the connection idle the
    /// longest if that makes one too many. Returns its id and what tells it to close.
    fn register(&self) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut reg = self.lock();
        let id = reg.next_id;
        reg.next_id += 1;
        reg.conns.insert(id, Entry { busy: 0, idle: None, close: Some(tx) });
        reg.set_idle(id);
        if reg.live() > reg.max {
            self.evict_oldest(&mut reg, id);
        }
        self.stats.open.store(reg.conns.len() as u64, Ordering::Relaxed);
        (id, rx)
    }

    /// Tells the connection idle the longest, other than `new`, to close.
    fn evict_oldest(&self, reg: &mut Registry, new: u64) {
        let Some((&key, &id)) = reg.idle.first_key_value() else { return };
        if id == new {
            // Every other connection has a request in progress: one too many until one ends.
            return;
        }
        reg.idle.remove(&key);
        let Some(e) = reg.conns.get_mut(&id) else { return };
        let since = e.idle.take().map(|(_, t)| t.elapsed());
        if let Some(close) = e.close.take() {
            let _ = close.send(());
            reg.closing += 1;
        }
        self.stats.evicted.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            server = self.what,
            connection = id,
            idle = ?since,
            max = reg.max,
            "connection limit reached: closing the connection idle the longest"
        );
    }

    /// A request begins on `id`: `None` if the connection was told to close meanwhile.
    fn begin(self: &Arc<Self>, id: u64) -> Option<InFlight> {
        let mut reg = self.lock();
        let e = reg.conns.get_mut(&id)?;
        e.close.as_ref()?;
        e.busy += 1;
        if let Some((key, _)) = e.idle.take() {
            reg.idle.remove(&key);
            drop(reg);
            // The accept loop may have no room any more.
            self.changed.notify_one();
        }
        Some(InFlight { shared: self.clone(), id })
    }

    /// A request of `id` has ended.
    fn end(&self, id: u64) {
        let mut reg = self.lock();
        let Some(e) = reg.conns.get_mut(&id) else { return };
        e.busy = e.busy.saturating_sub(1);
        if e.busy == 0 && e.close.is_some() {
            reg.set_idle(id);
            drop(reg);
            self.changed.notify_one();
        }
    }

    /// The connection's task has dropped it.
    fn remove(&self, id: u64) {
        let mut reg = self.lock();
        if let Some(e) = reg.conns.remove(&id) {
            if let Some((key, _)) = e.idle {
                reg.idle.remove(&key);
            }
            if e.close.is_none() {
                reg.closing -= 1;
            }
        }
        self.stats.open.store(reg.conns.len() as u64, Ordering::Relaxed);
        drop(reg);
        self.changed.notify_one();
    }
}

/// A request in progress: its connection is not closed to make room until it is dropped
/// (with the answer's body, once hyper has taken all of it).
struct InFlight {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.end(self.id);
    }
}

/// Leaves the registry when the connection's task ends, however it ends.
struct Registered {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.shared.remove(self.id);
    }
}

/// An answer's body that keeps its request in progress until hyper drops it.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Tracked {
    type Data = <Body as hyper::body::Body>::Data;
    type Error = <Body as hyper::body::Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The answer to a request that took longer than `request_timeout`, in the API's error form.
fn timed_out(limit: Duration) -> Response {
    let error = format!(
        "the request was not read and handled within {limit:?} (api.request_timeout); \
         it may still take effect: check before repeating it"
    );
    (StatusCode::REQUEST_TIMEOUT, Json(ErrorBody { error })).into_response()
}

/// The answer to a request whose head arrived just as its connection was being closed to make
/// room (it is not handled; the connection closes, so the client does not see it).
fn closing() -> Response {
    let error = "the connection was closed to make room for another (api.max_connections)".to_string();
    (StatusCode::SERVICE_UNAVAILABLE, [(header::CONNECTION, "close")], Json(ErrorBody { error }))
        .into_response()
}

/// Serves `app` on `listener` within `limits`, until the task is dropped; counts in `stats`.
pub async fn serve<L: Listener>(
    mut listener: L,
    app: Router,
    limits: Limits,
    what: &'static str,
    stats: Arc<Stats>,
) {
    let limit = limits.request_timeout;
    let app = app.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(move |_: tower::BoxError| async move { timed_out(limit) }))
            .timeout(limit),
    );
    let shared = Arc::new(Shared {
        registry: Mutex::new(Registry {
            max: limits.max_connections as usize,
            next_id: 0,
            next_idle: 0,
            conns: HashMap::new(),
            idle: BTreeMap::new(),
            closing: 0,
        }),
        changed: Notify::new(),
        stats,
        what,
    });
    loop {
        // Beyond the limit, a connection waits in the kernel's backlog, holding none of our
        // descriptors, only while every one we hold has a request in progress.
        shared.room().await;
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            // The room may be gone (the idle connection to close has a request now): look
            // again. (Accepting is cancel-safe: a connection is taken or left in the backlog.)
            () = shared.changed.notified() => continue,
        };
        let (id, close) = shared.register();
        let registered = Registered { shared: shared.clone(), id };
        let mut io = TimeoutStream::new(io);
        io.set_read_timeout(Some(limits.idle_timeout));
        io.set_write_timeout(Some(limits.idle_timeout));
        let io = TokioIo::new(Box::pin(io));
        let app = app.clone();
        let tracker = shared.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let in_flight = tracker.begin(id);
            let app = app.clone();
            async move {
                let Some(in_flight) = in_flight else { return Ok::<_, Infallible>(closing()) };
                let Ok(resp) = app.oneshot(req).await;
                Ok(resp.map(|body| Body::new(Tracked { body, _in_flight: in_flight })))
            }
        });
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(io, service);
            tokio::select! {
                // First: once told, the connection is dropped whatever it was about to read.
                biased;
                _ = close => {}
                r = conn => {
                    if let Err(e) = r {
                        tracing::debug!(server = what, error = %e, "connection closed");
                    }
                }
            }
            drop(registered);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::routing::get;
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use tokio::net::{UnixListener, UnixStream};

    const LIMITS: Limits = Limits {
        max_connections: 4,
        header_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(60),
    };

    /// A server on a Unix socket in a temporary directory: `/ok` answers at once, `/wait`
    /// once `release` is notified.
    struct Server {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        stats: Arc<Stats>,
        release: Arc<Notify>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Server {
        fn start(limits: Limits) -> Server {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("api.sock");
            let listener = UnixListener::bind(&path).unwrap();
            let release = Arc::new(Notify::new());
            let wait = release.clone();
            let app = Router::new().route("/ok", get(|| async { "ok" })).route(
                "/wait",
                get(move || {
                    let wait = wait.clone();
                    async move {
                        wait.notified().await;
                        "done"
                    }
                }),
            );
            let stats = Arc::new(Stats::default());
            let task = tokio::spawn(serve(listener, app, limits, "test", stats.clone()));
            Server { _dir: dir, path, stats, release, task }
        }

        /// A connection that sends nothing.
        async fn idle(&self) -> UnixStream {
            UnixStream::connect(&self.path).await.unwrap()
        }

        /// Sends `GET path` on a new connection and waits for the whole answer.
        async fn get(&self, path: &str) -> (StatusCode, String) {
            let stream = UnixStream::connect(&self.path).await.unwrap();
            get_on(stream, path).await
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    async fn get_on(stream: UnixStream, path: &str) -> (StatusCode, String) {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let req = Request::get(path).header("host", "agent").body(Empty::<Bytes>::new()).unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Whether the server closed `s` (EOF or reset), waiting up to `within`.
    async fn closed(s: &mut UnixStream, within: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 64];
        matches!(tokio::time::timeout(within, s.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "{what}: not within 5 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_connections_make_room_for_a_new_one() {
        let server = Server::start(LIMITS);
        let mut idle = Vec::new();
        for _ in 0..200 {
            idle.push(server.idle().await);
        }
        // The newest are kept, the oldest closed: whatever the number, a client is answered.
        let t = Instant::now();
        assert_eq!(server.get("/ok").await, (StatusCode::OK, "ok".into()));
        assert!(t.elapsed() < Duration::from_secs(1), "answered after {:?}", t.elapsed());
        let stats = &server.stats;
        until("connections closed", || stats.open() <= u64::from(LIMITS.max_connections)).await;
        // 200 idle and one served, 4 kept: 197 closed at least (the served one may be too, or
        // may still idle).
        assert!(stats.evicted() >= 197, "{} evicted", stats.evicted());
        for (i, s) in idle.iter_mut().take(190).enumerate() {
            assert!(closed(s, Duration::from_secs(1)).await, "idle connection {i} still open");
        }
        // The newest ones are still open.
        let last = idle.last_mut().unwrap();
        assert!(!closed(last, Duration::from_millis(100)).await, "the newest connection was closed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_with_a_request_in_progress_is_kept() {
        let server = Server::start(LIMITS);
        // The oldest connection: its request waits in the handler.
        let waiting = tokio::spawn({
            let stream = server.idle().await;
            async move { get_on(stream, "/wait").await }
        });
        let stats = server.stats.clone();
        until("the request in progress", || stats.open() == 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut idle = Vec::new();
        for _ in 0..100 {
            idle.push(server.idle().await);
        }
        assert_eq!(server.get("/ok").await, (StatusCode::OK, "ok".into()));
        until("evictions", || stats.evicted() >= 97).await;
        assert!(!waiting.is_finished(), "the request in progress ended: {:?}", waiting.await);
        server.release.notify_one();
        let answer = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert_eq!(answer, (StatusCode::OK, "done".into()));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn when_every_connection_is_busy_a_new_one_waits_for_a_request_to_end() {
        let limits = Limits { max_connections: 2, ..LIMITS };
        let server = Server::start(limits);
        let stats = server.stats.clone();
        let mut waiting = Vec::new();
        for _ in 0..2 {
            let stream = server.idle().await;
            waiting.push(tokio::spawn(get_on(stream, "/wait")));
        }
        until("two requests in progress", || stats.open() == 2).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Connects (the backlog), but is not served while both are busy.
        let stream = server.idle().await;
        let third = tokio::spawn(get_on(stream, "/ok"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!third.is_finished(), "answered while every connection was busy: {:?}", third.await);
        assert_eq!(stats.evicted(), 0);
        // One request ends: its connection is idle, closed for the new one.
        server.release.notify_one();
        let answer = tokio::time::timeout(Duration::from_secs(5), third).await.unwrap().unwrap();
        assert_eq!(answer, (StatusCode::OK, "ok".into()));
        server.release.notify_one();
        for w in waiting {
            let answer = tokio::time::timeout(Duration::from_secs(5), w).await.unwrap().unwrap();
            assert_eq!(answer, (StatusCode::OK, "done".into()));
        }
        assert!(stats.open() <= 3, "{} open", stats.open());
    }
}
