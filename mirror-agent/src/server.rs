//! HTTP/1 serving with bounds, for the API and the metrics: at most `max_connections`
//! connections at once (more wait in the listen backlog until one closes), a request's head
//! within `header_timeout` (hyper's header read timeout, which also closes keep-alive
//! connections left idle), its body and handling within `request_timeout` (tower's timeout:
//! 408), and nothing stalled for longer than `idle_timeout` (tokio-io-timeout on the socket:
//! a client that stops reading its answer). Every connection's descriptor and buffers are
//! freed when it closes.

use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::serve::Listener;
use axum::{Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio_io_timeout::TimeoutStream;
use tower::ServiceBuilder;

use crate::views::ErrorBody;

/// What one server allows its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: u32,
    /// From the connection's start, or the end of the previous answer, to the end of a
    /// request's headers.
    pub header_timeout: Duration,
    /// Reading a request's body and handling it.
    pub request_timeout: Duration,
    /// A read or write of the connection that waits this long ends it.
    pub idle_timeout: Duration,
}

/// The answer to a request that took longer than `request_timeout`, in the API's error form.
fn timed_out(limit: Duration) -> Response {
    let error = format!(
        "the request was not read and handled within {limit:?} (api.request_timeout); \
         it may still take effect: check before repeating it"
    );
    (StatusCode::REQUEST_TIMEOUT, Json(ErrorBody { error })).into_response()
}

/// Serves `app` on `listener` within `limits`, until the task is dropped.
pub async fn serve<L: Listener>(mut listener: L, app: Router, limits: Limits, what: &'static str) {
    let limit = limits.request_timeout;
    let app = app.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(move |_: tower::BoxError| async move { timed_out(limit) }))
            .timeout(limit),
    );
    let slots = Arc::new(Semaphore::new(limits.max_connections as usize));
    loop {
        // A slot first: beyond the limit, connections wait in the kernel's backlog, holding
        // none of our descriptors.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        if slots.available_permits() == 0 {
            tracing::debug!(server = what, max = limits.max_connections, "connection limit reached");
        }
        let (io, _) = listener.accept().await;
        let mut io = TimeoutStream::new(io);
        io.set_read_timeout(Some(limits.idle_timeout));
        io.set_write_timeout(Some(limits.idle_timeout));
        let io = TokioIo::new(Box::pin(io));
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(io, service);
            if let Err(e) = conn.await {
                tracing::debug!(server = what, error = %e, "connection closed");
            }
            drop(slot);
        });
    }
}
