//! The host's HTTP listeners (the TCP API, `api.sock`, the metrics port):
//! the accept loop and each connection's life under `http.*`'s limits.
//!
//! - A connection budget per listener (`http.max_connections`): a listener
//!   at its budget accepts nothing until one of its connections closes, so
//!   idle TCP clients can fill the TCP budget but never take `api.sock`'s,
//!   where run tokens and operators on the host connect.
//! - A client that started a request has `http.header_timeout_secs` to
//!   finish its headers; a connection silent with no request in flight for
//!   `http.idle_timeout_secs` is closed. A request being answered (a turn
//!   may take minutes) is never cut.
//! - On shutdown, each connection finishes the request it is serving and
//!   closes; the caller bounds that with `http.drain_secs`.
//!
//! Must never: let one listener's clients use another's budget, close a
//! connection in the middle of an answer, or hold a descriptor for a
//! connection past its budget.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::config::HttpConfig;

/// How one listener treats its connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl ConnLimits {
    pub fn of(http: &HttpConfig) -> Self {
        Self {
            header_timeout: Duration::from_secs(http.header_timeout_secs),
            idle_timeout: Duration::from_secs(http.idle_timeout_secs),
            max_connections: http.max_connections,
        }
    }

    /// The same timeouts with a budget of at most `cap` connections.
    pub fn capped(self, cap: usize) -> Self {
        Self {
            max_connections: self.max_connections.min(cap),
            ..self
        }
    }
}

/// Serves `router` on `listener` until `shutdown`, then waits for every
/// connection to finish the request it is serving.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: ConnLimits,
    shutdown: CancellationToken,
) where
    L: Listener,
    L::Io: Unpin,
{
    let budget = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    loop {
        // The permit first: at the budget nothing is accepted, so no
        // descriptor is taken for a client that cannot be served.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = budget.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        // axum's `accept` waits out and logs accept errors (EMFILE included).
        let (io, _) = tokio::select! {
            _ = shutdown.cancelled() => break,
            c = listener.accept() => c,
        };
        let (router, stop) = (router.clone(), shutdown.clone());
        connections.spawn(async move {
            connection(io, router, limits, stop).await;
            drop(permit);
        });
    }
    connections.close();
    connections.wait().await;
}

/// What a connection's watchdog reads: milliseconds since `base` (+1, so 0
/// means "never") of the last byte either way and of the first byte of a
/// request head not yet served; requests being answered.
struct Activity {
    base: Instant,
    last_io: AtomicU64,
    head_started: AtomicU64,
    in_flight: AtomicUsize,
    /// Told when the deadline moves earlier or away (a head starts, a
    /// request starts or ends), so the watchdog re-arms.
    moved: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            last_io: AtomicU64::new(1),
            head_started: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            moved: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    fn at(&self, mark: u64) -> Instant {
        self.base + Duration::from_millis(mark.saturating_sub(1))
    }

    fn read(&self) {
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if self
            .head_started
            .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.moved.notify_one();
        }
    }

    fn wrote(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
    }

    /// When the connection is due to close if nothing changes; `None`
    /// while a request is being answered.
    fn deadline(&self, limits: &ConnLimits) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        match self.head_started.load(Ordering::SeqCst) {
            0 => Some(self.at(self.last_io.load(Ordering::SeqCst)) + limits.idle_timeout),
            started => Some(self.at(started) + limits.header_timeout),
        }
    }
}

/// Counts a request as in flight until its answer's head is written out.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(a: &Arc<Activity>) -> Self {
        a.in_flight.fetch_add(1, Ordering::SeqCst);
        // Its head is complete: what the reader sees next is its body or
        // the next request.
        a.head_started.store(0, Ordering::SeqCst);
        a.moved.notify_one();
        Self(a.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Body bytes read while it was served are not a new request's head.
        self.0.head_started.store(0, Ordering::SeqCst);
        self.0.last_io.store(self.0.now(), Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.moved.notify_one();
    }
}

/// A connection's socket, noting each byte that crosses it.
struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// One connection: HTTP/1.1 with keep-alive, closed by its watchdog when
/// silent or slow, or gracefully on shutdown.
async fn connection<I>(io: I, router: Router, limits: ConnLimits, shutdown: CancellationToken)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        inner: io,
        activity: activity.clone(),
    });
    let seen = activity.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let guard = InFlight::enter(&seen);
        let router = router.clone();
        async move {
            let answer = router.oneshot(req.map(axum::body::Body::new)).await;
            drop(guard);
            answer
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut draining = false;
    loop {
        let deadline = activity.deadline(&limits);
        let watchdog = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                // Answering: look again a little later.
                None => tokio::time::sleep(limits.idle_timeout.min(Duration::from_secs(5))).await,
            }
        };
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = shutdown.cancelled(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = activity.moved.notified() => {}
            _ = watchdog => {
                if activity
                    .deadline(&limits)
                    .is_some_and(|at| at <= Instant::now())
                {
                    // Dropping the connection closes the socket.
                    return;
                }
            }
        }
    }
}

/// Runs `f` to its end, or until `drain` has passed since `shutdown`.
pub async fn until_drained<F: Future>(f: F, shutdown: &CancellationToken, drain: Duration) -> bool {
    tokio::select! {
        _ = f => true,
        _ = async { shutdown.cancelled().await; tokio::time::sleep(drain).await } => false,
    }
}
