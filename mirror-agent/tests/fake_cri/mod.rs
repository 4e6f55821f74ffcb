//! A fake container runtime: a tonic server of `runtime.v1.RuntimeService` (`Version`,
//! `ListPodSandbox`, `PodSandboxStatus`) on a Unix socket, answering with the sandboxes a test
//! sets, as containerd does (the verbose `info` JSON with the pause process's `pid` and the
//! network namespace's path). It can be made to hang, as a runtime that stopped answering; an
//! endpoint that never answers at all is [`Silent`].

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use mirror_agent::pods::cri_api as api;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::{Grpc, NamedService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// A sandbox the fake runtime lists.
#[derive(Debug, Clone, Default)]
pub struct FakeSandbox {
    /// Its id.
    pub id: String,
    /// The pod's name, namespace and UID.
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// The pod's labels.
    pub labels: Vec<(String, String)>,
    /// `status.network` addresses.
    pub ips: Vec<IpAddr>,
    /// The pause process, in the verbose info.
    pub pid: Option<u32>,
    /// The network namespace's path, in the verbose info's runtime spec.
    pub netns_path: Option<String>,
    /// `hostNetwork`.
    pub host_network: bool,
}

/// What the fake runtime answers, and what it was asked.
#[derive(Debug, Default)]
pub struct State {
    /// The ready sandboxes.
    pub sandboxes: Vec<FakeSandbox>,
    /// Every call hangs (a runtime that stopped answering).
    pub hang: bool,
    /// Calls per method.
    pub calls: HashMap<String, u32>,
}

#[derive(Clone)]
struct Service(Arc<Mutex<State>>);

impl NamedService for Service {
    const NAME: &'static str = api::SERVICE;
}

fn list(state: &State) -> api::ListPodSandboxResponse {
    let items = state
        .sandboxes
        .iter()
        .map(|s| api::PodSandbox {
            id: s.id.clone(),
            metadata: Some(api::PodSandboxMetadata {
                name: s.name.clone(),
                uid: s.uid.clone(),
                namespace: s.namespace.clone(),
                attempt: 0,
            }),
            state: api::PodSandboxState::SandboxReady as i32,
            created_at: 1,
            labels: s.labels.iter().cloned().collect(),
            ..Default::default()
        })
        .collect();
    api::ListPodSandboxResponse { items }
}

fn status(
    state: &State,
    req: &api::PodSandboxStatusRequest,
) -> Result<api::PodSandboxStatusResponse, Status> {
    let s = state
        .sandboxes
        .iter()
        .find(|s| s.id == req.pod_sandbox_id)
        .ok_or_else(|| Status::not_found(format!("no sandbox {}", req.pod_sandbox_id)))?;
    let mut ips = s.ips.iter().map(IpAddr::to_string);
    let network = api::PodSandboxNetworkStatus {
        ip: ips.next().unwrap_or_default(),
        additional_ips: ips.map(|ip| api::PodIp { ip }).collect(),
    };
    let mode = if s.host_network { api::NamespaceMode::Node } else { api::NamespaceMode::Pod };
    let mut info = HashMap::new();
    if req.verbose && (s.pid.is_some() || s.netns_path.is_some()) {
        // containerd's shape: the netns in the runtime spec, the pause process's pid.
        let namespaces: Vec<serde_json::Value> = s
            .netns_path
            .iter()
            .map(|p| serde_json::json!({"type": "network", "path": p}))
            .chain([serde_json::json!({"type": "pid"})])
            .collect();
        let doc = serde_json::json!({
            "pid": s.pid.unwrap_or(0),
            "processStatus": "running",
            "runtimeSpec": {"linux": {"namespaces": namespaces}},
        });
        info.insert("info".to_string(), doc.to_string());
    }
    Ok(api::PodSandboxStatusResponse {
        status: Some(api::PodSandboxStatus {
            id: s.id.clone(),
            metadata: None,
            state: api::PodSandboxState::SandboxReady as i32,
            created_at: 1,
            network: Some(network),
            linux: Some(api::LinuxPodSandboxStatus {
                namespaces: Some(api::Namespace {
                    options: Some(api::NamespaceOption { network: mode as i32, ..Default::default() }),
                }),
            }),
            labels: s.labels.iter().cloned().collect(),
            ..Default::default()
        }),
        info,
        ..Default::default()
    })
}

/// Answers one unary call of `method` with `answer`, after hanging if the state says so.
async fn unary<Req, Resp>(
    state: Arc<Mutex<State>>,
    req: http::Request<Body>,
    answer: fn(&State, &Req) -> Result<Resp, Status>,
) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Default + Send + 'static,
{
    let handler = tower::service_fn(move |r: Request<Req>| {
        let state = state.clone();
        async move {
            let hang = {
                let mut st = state.lock().unwrap();
                *st.calls
                    .entry(std::any::type_name::<Req>().rsplit("::").next().unwrap().to_string())
                    .or_default() += 1;
                st.hang
            };
            if hang {
                std::future::pending::<()>().await;
            }
            let st = state.lock().unwrap();
            answer(&st, r.get_ref()).map(Response::new)
        }
    });
    Grpc::new(ProstCodec::<Resp, Req>::default()).unary(handler, req).await
}

impl tower::Service<http::Request<Body>> for Service {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            Ok(match req.uri().path() {
                api::VERSION => {
                    unary(state, req, |_, _: &api::VersionRequest| {
                        Ok(api::VersionResponse {
                            version: "0.1.0".into(),
                            runtime_name: "fake-runtime".into(),
                            runtime_version: "1.0".into(),
                            runtime_api_version: "v1".into(),
                        })
                    })
                    .await
                }
                api::LIST_POD_SANDBOX => {
                    unary(state, req, |st, _: &api::ListPodSandboxRequest| Ok(list(st))).await
                }
                api::POD_SANDBOX_STATUS => unary(state, req, status).await,
                other => Status::unimplemented(format!("{other}: not in the fake runtime")).into_http(),
            })
        })
    }
}

/// The fake runtime, serving until dropped.
pub struct FakeCri {
    /// Its socket.
    pub socket: PathBuf,
    /// What it answers (change it while it runs).
    pub state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeCri {
    /// Serves on `socket` (created; its directory must exist).
    pub fn start(socket: &Path, sandboxes: Vec<FakeSandbox>) -> FakeCri {
        let state = Arc::new(Mutex::new(State { sandboxes, ..State::default() }));
        let listener = std::os::unix::net::UnixListener::bind(socket)
            .unwrap_or_else(|e| panic!("binding {}: {e}", socket.display()));
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let svc = Service(state.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::from_std(listener).expect("a tokio listener");
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("the fake CRI server");
            });
        });
        FakeCri { socket: socket.to_path_buf(), state, stop: Some(stop), thread: Some(thread) }
    }

    /// Calls of a request type so far (e.g. `ListPodSandboxRequest`).
    pub fn calls(&self, request: &str) -> u32 {
        self.state.lock().unwrap().calls.get(request).copied().unwrap_or(0)
    }
}

impl Drop for FakeCri {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Hanging calls would keep a graceful shutdown waiting: the thread is left to end with
        // the process then.
        if !self.state.lock().unwrap().hang {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A socket that accepts connections (the kernel's backlog does) and never answers: a runtime
/// that hangs.
pub struct Silent {
    _listener: std::os::unix::net::UnixListener,
    path: PathBuf,
}

impl Silent {
    /// Binds `path`.
    pub fn bind(path: &Path) -> Silent {
        let l = std::os::unix::net::UnixListener::bind(path)
            .unwrap_or_else(|e| panic!("binding {}: {e}", path.display()));
        Silent { _listener: l, path: path.to_path_buf() }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
