//! A minimal HTTP/1 client over the agent's Unix socket: mirrorctl's, and the agent's own
//! when it asks another to hand over.

use std::path::Path;

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;

use crate::views::ErrorBody;

/// Talks to one agent socket.
pub struct Client<'a> {
    socket: &'a Path,
}

impl<'a> Client<'a> {
    /// A client of the agent listening on `socket`.
    pub fn new(socket: &'a Path) -> Self {
        Self { socket }
    }

    /// Sends one request; a non-2xx reply becomes an error carrying the agent's message.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> anyhow::Result<T> {
        Ok(self.call_with_status(method, path, body).await?.1)
    }

    /// Like [`Client::call`], with the reply's status (201 Created or 200 OK tell whether a
    /// rule was added or was there already).
    pub async fn call_with_status<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> anyhow::Result<(StatusCode, T)> {
        let (status, body) = self.send(method, path, body).await?;
        let bytes = body.collect().await?.to_bytes();
        let value =
            serde_json::from_slice(&bytes).with_context(|| format!("reading the agent's reply to {path}"))?;
        Ok((status, value))
    }

    /// Sends a GET and writes the reply's body to `out` as it comes (a capture's pcapng);
    /// returns the bytes written. A non-2xx reply is an error carrying the agent's message.
    pub async fn download(&self, path: &str, out: &mut dyn std::io::Write) -> anyhow::Result<u64> {
        let (_, mut body) = self.send(Method::GET, path, None).await?;
        let mut n = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                out.write_all(&data)?;
                n += data.len() as u64;
            }
        }
        Ok(n)
    }

    /// Sends one request (its body JSON) and returns the reply's status and body; a
    /// non-2xx reply is an error carrying the agent's message.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> anyhow::Result<(StatusCode, hyper::body::Incoming)> {
        let stream = self.connect().await.with_context(|| {
            format!(
                "cannot reach the agent at {} (is mirror-agent running? see --socket)",
                self.socket.display()
            )
        })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "mirror-agent")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = resp.into_body().collect().await?.to_bytes();
            let msg = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            return Err(ApiFailure { status, message: msg }.into());
        }
        Ok((status, resp.into_body()))
    }
}

/// How long a command waits for an agent that is starting (it loads and verifies its programs
/// before it listens: about a second).
pub const STARTING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Client<'_> {
    /// Connects to the socket; while it is absent or refuses and an agent is starting (its
    /// lock names a live mirror-agent), tries again for up to [`STARTING_WAIT`].
    async fn connect(&self) -> std::io::Result<tokio::net::UnixStream> {
        let deadline = std::time::Instant::now() + STARTING_WAIT;
        loop {
            match tokio::net::UnixStream::connect(self.socket).await {
                Ok(s) => return Ok(s),
                Err(e) if std::time::Instant::now() < deadline && agent_starting(self.socket) => {
                    tracing::debug!(error = %e, "the agent is starting: waiting for its socket");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whether an agent holds this socket's lock (`<socket>.lock`, which holds its pid) and lives:
/// then it is starting, or handing over. Read, never locked: a starting agent is never
/// turned away by a command's probe.
fn agent_starting(socket: &Path) -> bool {
    let lock = format!("{}.lock", socket.display());
    let Ok(pid) = std::fs::read_to_string(lock) else { return false };
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", pid.trim())).unwrap_or_default();
    !pid.trim().is_empty() && comm.trim() == "mirror-agent"
}

/// The agent refused a request.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiFailure {
    /// HTTP status.
    pub status: StatusCode,
    /// The agent's message.
    pub message: String,
}
