//! A client of the container runtime's CRI (`runtime.v1.RuntimeService`, gRPC over the Unix
//! socket of containerd or CRI-O): the node's ready pod sandboxes, with each one's name,
//! namespace, UID, labels, addresses and network namespace.
//!
//! - Which socket: the first of `pods.cri` that exists and answers `Version` (by default
//!   containerd's and CRI-O's usual paths, under `/run` and `/var/run`).
//! - Time-bounded: connecting and each refresh (the list, and the status of sandboxes not seen
//!   before) must end within `pods.cri_timeout`; a runtime that does not is left alone for
//!   [`RETRY`] and the pods are named from `/proc` meanwhile.
//! - Cached: the list is asked again at most every [`MIN_INTERVAL`]; a sandbox's status (its
//!   addresses and namespace, which do not change while it lives) once.
//! - The log says which source is used, when that changes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tonic::client::Grpc;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

use super::cri_api as api;
use super::sandbox::{self, Sandbox};

/// The runtime's list is asked again at most this often.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// After a runtime failed to answer, it is asked again after this long.
pub const RETRY: Duration = Duration::from_secs(30);
/// Status requests in flight at once.
const CONCURRENT: usize = 16;

/// What one sandbox's status says, kept while the sandbox is listed.
#[derive(Debug, Clone, Default)]
struct Status {
    ips: Vec<std::net::IpAddr>,
    pid: Option<u32>,
    netns_path: Option<PathBuf>,
    host_network: bool,
}

struct Conn {
    path: PathBuf,
    grpc: Grpc<Channel>,
}

/// Which source the log said last.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Said {
    Nothing,
    Cri(PathBuf),
    Proc,
}

/// The CRI client: one task owns it.
pub struct Cri {
    sockets: Vec<PathBuf>,
    timeout: Duration,
    conn: Option<Conn>,
    statuses: HashMap<String, Status>,
    listed: Option<(Instant, Vec<Sandbox>)>,
    retry_at: Option<Instant>,
    said: Said,
}

impl Cri {
    /// A client that tries `sockets` in order (none: never asks), each call bounded by `timeout`.
    pub fn new(sockets: Vec<PathBuf>, timeout: Duration) -> Cri {
        Cri {
            sockets,
            timeout,
            conn: None,
            statuses: HashMap::new(),
            listed: None,
            retry_at: None,
            said: Said::Nothing,
        }
    }

    /// Whether a runtime answered the last time it was asked.
    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    /// The ready sandboxes of the node (from the cache when asked within [`MIN_INTERVAL`]);
    /// `None`: no runtime to ask, or it did not answer in time (the pods come from `/proc`).
    /// Never takes much longer than the timeout for each socket tried.
    pub async fn sandboxes(&mut self) -> Option<Vec<Sandbox>> {
        if let Some((at, list)) = &self.listed {
            if at.elapsed() < MIN_INTERVAL && self.conn.is_some() {
                return Some(list.clone());
            }
        }
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return None;
        }
        if self.conn.is_none() {
            self.conn = self.connect().await;
            if self.conn.is_none() {
                self.retry_at = Some(Instant::now() + RETRY);
                return None;
            }
        }
        let conn = self.conn.as_ref().expect("connected");
        let path = conn.path.clone();
        let grpc = conn.grpc.clone();
        match tokio::time::timeout(self.timeout, refresh(grpc, &mut self.statuses)).await {
            Ok(Ok(list)) => {
                self.retry_at = None;
                self.say(Said::Cri(path.clone()), || {
                    tracing::debug!(socket = %path.display(), "pod identity: from the container runtime (CRI)")
                });
                self.listed = Some((Instant::now(), list.clone()));
                Some(list)
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {:?}", self.timeout),
                };
                tracing::warn!(
                    socket = %path.display(),
                    %error,
                    retry_in = ?RETRY,
                    "pod identity: the container runtime (CRI) failed; from /proc until it answers"
                );
                self.said = Said::Proc;
                self.conn = None;
                self.listed = None;
                self.retry_at = Some(Instant::now() + RETRY);
                None
            }
        }
    }

    fn say(&mut self, now: Said, log: impl FnOnce()) {
        if self.said != now {
            log();
            self.said = now;
        }
    }

    /// The first socket that exists and answers `Version` in time.
    async fn connect(&mut self) -> Option<Conn> {
        let present: Vec<&PathBuf> = self.sockets.iter().filter(|p| p.exists()).collect();
        let mut errors = Vec::new();
        for path in &present {
            match tokio::time::timeout(self.timeout, connect(path)).await {
                Ok(Ok((grpc, v))) => {
                    tracing::debug!(
                        socket = %path.display(),
                        runtime = %v.runtime_name,
                        version = %v.runtime_version,
                        api = %v.runtime_api_version,
                        "pod identity: asking the container runtime (CRI)"
                    );
                    return Some(Conn { path: path.to_path_buf(), grpc });
                }
                Ok(Err(e)) => errors.push(format!("{}: {e}", path.display())),
                Err(_) => errors.push(format!("{}: no answer within {:?}", path.display(), self.timeout)),
            }
        }
        let sockets: Vec<String> = self.sockets.iter().map(|p| p.display().to_string()).collect();
        let said = if self.sockets.is_empty() {
            "pod identity: from /proc (pods.cri: none)".to_string()
        } else if present.is_empty() {
            format!("pod identity: from /proc (no CRI socket at {})", sockets.join(", "))
        } else {
            format!("pod identity: from /proc (no CRI answered: {})", errors.join("; "))
        };
        self.say(Said::Proc, || {
            if errors.is_empty() {
                tracing::debug!("{said}");
            } else {
                tracing::warn!("{said}");
            }
        });
        None
    }
}

/// Connects to the runtime at `path` and asks its version.
async fn connect(path: &Path) -> anyhow::Result<(Grpc<Channel>, api::VersionResponse)> {
    let endpoint = Endpoint::from_shared(format!("unix:{}", path.display()))?;
    let channel = endpoint.connect().await?;
    let mut grpc = Grpc::new(channel);
    let v: api::VersionResponse =
        unary(&mut grpc, api::VERSION, api::VersionRequest { version: "v1".into() }).await?;
    Ok((grpc, v))
}

/// One unary call.
pub async fn unary<Req, Resp>(
    grpc: &mut Grpc<Channel>,
    method: &'static str,
    req: Req,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    grpc.ready().await.map_err(|e| tonic::Status::unavailable(format!("not ready: {e}")))?;
    // The caller bounds the call (a grpc-timeout here would race with it, and end it with a
    // less telling error).
    let req = tonic::Request::new(req);
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    Ok(grpc.unary(req, PathAndQuery::from_static(method), codec).await?.into_inner())
}

/// Lists the ready sandboxes and asks the status of those not seen before; forgets the status
/// of those gone.
async fn refresh(
    mut grpc: Grpc<Channel>,
    statuses: &mut HashMap<String, Status>,
) -> Result<Vec<Sandbox>, tonic::Status> {
    let ready = api::ListPodSandboxRequest {
        filter: Some(api::PodSandboxFilter {
            state: Some(api::PodSandboxStateValue { state: api::PodSandboxState::SandboxReady as i32 }),
            ..Default::default()
        }),
    };
    let list: api::ListPodSandboxResponse = unary(&mut grpc, api::LIST_POD_SANDBOX, ready).await?;
    let new: Vec<String> =
        list.items.iter().map(|s| s.id.clone()).filter(|id| !statuses.contains_key(id)).collect();
    let asked: Vec<(String, Result<api::PodSandboxStatusResponse, tonic::Status>)> =
        futures::stream::iter(new)
            .map(|id| {
                let mut grpc = grpc.clone();
                async move {
                    let req = api::PodSandboxStatusRequest { pod_sandbox_id: id.clone(), verbose: true };
                    (id, unary(&mut grpc, api::POD_SANDBOX_STATUS, req).await)
                }
            })
            .buffer_unordered(CONCURRENT)
            .collect()
            .await;
    for (id, got) in asked {
        match got {
            Ok(resp) => {
                statuses.insert(id, status_of(&resp));
            }
            // Gone since it was listed, or the runtime failed on it: listed without its status,
            // asked again next time.
            Err(e) => tracing::debug!(sandbox = %id, error = %e, "CRI PodSandboxStatus"),
        }
    }
    statuses.retain(|id, _| list.items.iter().any(|s| &s.id == id));
    Ok(list
        .items
        .into_iter()
        .map(|s| {
            let meta = s.metadata.unwrap_or_default();
            let st = statuses.get(&s.id).cloned().unwrap_or_default();
            Sandbox {
                id: s.id,
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                labels: s.labels.into_iter().collect(),
                ips: st.ips,
                pid: st.pid,
                netns_path: st.netns_path,
                host_network: st.host_network,
            }
        })
        .collect())
}

fn status_of(resp: &api::PodSandboxStatusResponse) -> Status {
    let (pid, netns_path) = sandbox::from_info(&resp.info);
    let st = resp.status.clone().unwrap_or_default();
    let net = st.network.unwrap_or_default();
    let ips = std::iter::once(net.ip)
        .chain(net.additional_ips.into_iter().map(|p| p.ip))
        .filter_map(|ip| ip.parse().ok())
        .collect();
    let host_network = st
        .linux
        .and_then(|l| l.namespaces)
        .and_then(|n| n.options)
        .is_some_and(|o| o.network == api::NamespaceMode::Node as i32);
    Status { ips, pid, netns_path, host_network }
}
