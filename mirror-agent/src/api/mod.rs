//! The local API: HTTP/JSON on a Unix socket (mode 0600). Resources: rules, flows, pods,
//! events, status, counters, latency and its measurement groups, and the hand-over to a newer
//! agent. Bodies are the [`crate::views`]; bad requests get a 4xx with a message. Both sides
//! use this module: [`client`] is the client (mirrorctl's, and an agent's asking another to hand
//! over), [`text`] the views as both show them.

mod captures;
pub mod client;
pub mod text;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::Deserialize;

use crate::engine::Engine;
use crate::event_log::EventLog;
use crate::groups::Group;
use crate::pods::Pods;
use crate::views::{
    ErrorBody, EventQuery, EventView, FlowView, GroupView, HistogramView, MirrorView, NewRule, PodView,
    RuleView, SetGroup, StatusView,
};

/// What the API reports beyond the engine.
#[derive(Debug, Clone)]
pub struct AgentInfo {
    /// Configured attach mode.
    pub attach_mode: String,
    /// The mirror sink as last seen.
    pub mirror: MirrorView,
    /// What the maps' memory report needs of this node (none: the host could not be read).
    pub memory: Option<crate::memory::NodeMemory>,
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct ApiState {
    /// The data path.
    pub engine: Engine,
    /// Agent facts, updated as they change.
    pub info: Arc<Mutex<AgentInfo>>,
    /// Recent trigger events.
    pub events: Arc<EventLog>,
    /// The pods behind the attached veths.
    pub pods: Pods,
    /// Woken by `POST /v1/handover`: the agent leaves everything to a newer one.
    pub handover: Arc<tokio::sync::Notify>,
    /// The captures of the triggers (none: `recorder.enabled: false`).
    pub recorder: Option<crate::recorder::Recorder>,
}

/// An error reply.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody { error: self.1 })).into_response()
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// A JSON request body, whatever its `Content-Type` says: every body the API takes is JSON,
/// and `curl -d` sends `application/x-www-form-urlencoded` (a bare request, none), which
/// axum's `Json` refuses.
pub struct JsonBody<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for JsonBody<T> {
    type Rejection = String;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, String> {
        let bytes = axum::body::Bytes::from_request(req, state).await.map_err(|e| e.body_text())?;
        Json::<T>::from_bytes(&bytes).map(|Json(v)| JsonBody(v)).map_err(|e| e.body_text())
    }
}

/// The routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/rules", get(list_rules).post(add_rule))
        .route("/v1/rules/{id}", delete(del_rule))
        .route("/v1/flows", get(flows))
        .route("/v1/events", get(events))
        .route("/v1/status", get(status))
        .route("/v1/pods", get(pods))
        .route("/v1/counters", get(counters))
        .route("/v1/latency", get(latency))
        .route("/v1/latency/groups", get(groups))
        .route("/v1/latency/groups/{group}", axum::routing::put(set_group))
        .route("/v1/handover", axum::routing::post(handover))
        .merge(captures::routes())
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                "no such resource (see /v1/rules, /v1/flows, /v1/pods, /v1/events, /v1/captures, /v1/status, /v1/counters, /v1/latency)".into(),
            )
        })
        .with_state(state)
}

async fn list_rules(State(s): State<ApiState>) -> ApiResult<Vec<RuleView>> {
    Ok(Json(s.engine.rules().await?))
}

/// 201 and the new rule, or 200 and the rule that is the same (same canonical text): a rule
/// is never installed twice.
async fn add_rule(
    State(s): State<ApiState>,
    body: Result<JsonBody<NewRule>, String>,
) -> Result<(StatusCode, Json<RuleView>), ApiError> {
    let JsonBody(body) =
        body.map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("expected {{\"rule\": \"...\"}}: {e}")))?;
    let rule =
        crate::rules::parse(&body.rule).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    let added = s.engine.add_rule(rule).await.map_err(|e| {
        if let Some(o) = e.downcast_ref::<mirror_bpf::rule::capacity::CapacityError>() {
            return ApiError(StatusCode::CONFLICT, format!("rule not added: {o}"));
        }
        match e.downcast_ref::<mirror_bpf::Error>() {
            Some(mirror_bpf::Error::TooManyRules(_)) => ApiError(StatusCode::CONFLICT, e.to_string()),
            // The agent's configuration leaves out a protocol program the rule needs.
            Some(mirror_bpf::Error::ProtocolNotLoaded(why)) => {
                ApiError(StatusCode::CONFLICT, format!("rule not added: {why}"))
            }
            _ => e.into(),
        }
    })?;
    let view = added.view;
    if !added.created {
        tracing::info!(id = view.id, rule = %view.rule, "rule given again: it exists already");
        return Ok((StatusCode::OK, Json(view)));
    }
    tracing::info!(id = view.id, rule = %view.rule, "rule added");
    Ok((StatusCode::CREATED, Json(view)))
}

async fn del_rule(
    State(s): State<ApiState>,
    id: Result<UrlPath<u32>, axum::extract::rejection::PathRejection>,
) -> ApiResult<RuleView> {
    let UrlPath(id) =
        id.map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("rule id must be a number: {e}")))?;
    let view = s.engine.del_rule(id).await.map_err(|e| match e.downcast_ref::<mirror_bpf::Error>() {
        Some(mirror_bpf::Error::NoSuchRule(_)) => ApiError(StatusCode::NOT_FOUND, e.to_string()),
        _ => e.into(),
    })?;
    tracing::info!(id, rule = %view.rule, "rule deleted");
    Ok(Json(view))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FlowQuery {
    limit: Option<usize>,
}

async fn flows(
    State(s): State<ApiState>,
    q: Result<Query<FlowQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Vec<FlowView>> {
    let q = q.map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("expected ?limit=N: {e}")))?;
    let mut flows = s.engine.flows().await?;
    s.pods.annotate(&mut flows);
    // Top flows: mirrored first, then by bytes.
    flows.sort_by_key(|f| (f.rule_id.is_none(), std::cmp::Reverse(f.forward.bytes + f.reverse.bytes)));
    flows.truncate(q.limit.unwrap_or(usize::MAX));
    Ok(Json(flows))
}

/// Recent trigger events after `after`, oldest first; with `wait`, a request that finds none
/// waits for the next (long poll: `mirrorctl events -f`).
async fn events(
    State(s): State<ApiState>,
    q: Result<Query<EventQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Vec<EventView>> {
    let Query(q) = q.map_err(|e| {
        ApiError(StatusCode::BAD_REQUEST, format!("expected ?after=SEQ&limit=N&wait=SECONDS: {e}"))
    })?;
    let wait = std::time::Duration::from_secs(q.wait);
    if wait > crate::event_log::MAX_WAIT {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("wait={} is more than {} seconds", q.wait, crate::event_log::MAX_WAIT.as_secs()),
        ));
    }
    Ok(Json(s.events.wait_after(q.after, q.limit.unwrap_or(100), wait).await))
}

async fn status(State(s): State<ApiState>) -> ApiResult<StatusView> {
    let st = s.engine.status().await?;
    let info = s.info.lock().expect("info lock").clone();
    Ok(Json(StatusView {
        version: env!("CARGO_PKG_VERSION").into(),
        attach_mode: info.attach_mode,
        // Known from an attach in auto mode; else what the kernel offers.
        tcx_available: st.tcx_available.unwrap_or_else(mirror_bpf::tcx_supported),
        adopted: st.adopted,
        interfaces: st.interfaces,
        // The data path's word on whether copies go anywhere; the sink's own ifindex.
        mirror: MirrorView { ifindex: info.mirror.ifindex.filter(|_| st.mirror_ifindex != 0), ..info.mirror },
        counters: st.counters,
        attach_latency: st.attach_latency,
        tracing: st.tracing,
        net_cpu: st.net_cpu,
        pods: s.pods.list(),
        protocols: st.protocols,
        programs: st.programs,
        dns_rcodes: crate::api::text::rcode_counts(&st.dns_rcodes).collect(),
        drops: st.drops.clone(),
        pod_drops: s.pods.name_drops(&st.pod_drops),
        memory: info.memory.as_ref().map(|m| m.report(st.map_sizes)),
    }))
}

async fn pods(State(s): State<ApiState>) -> ApiResult<Vec<PodView>> {
    Ok(Json(s.pods.list()))
}

/// A newer agent (started with `--take-over`) asks for the data path: this one leaves it
/// attached and pinned, closes its socket and releases its lock (see [`crate::handover`]).
async fn handover(State(s): State<ApiState>) -> (StatusCode, Json<serde_json::Value>) {
    s.handover.notify_one();
    (StatusCode::ACCEPTED, Json(serde_json::json!({"handing_over": true})))
}

async fn latency(State(s): State<ApiState>) -> ApiResult<Vec<HistogramView>> {
    Ok(Json(s.engine.latency().await?))
}

async fn groups(State(s): State<ApiState>) -> ApiResult<Vec<GroupView>> {
    Ok(Json(s.engine.groups(None).await?))
}

async fn set_group(
    State(s): State<ApiState>,
    UrlPath(name): UrlPath<String>,
    body: Result<JsonBody<SetGroup>, String>,
) -> ApiResult<Vec<GroupView>> {
    let JsonBody(body) = body.map_err(|e| {
        ApiError(StatusCode::BAD_REQUEST, format!("expected {{\"enabled\": true|false}}: {e}"))
    })?;
    let group = Group::from_name(&name).ok_or_else(|| {
        ApiError(StatusCode::NOT_FOUND, format!("no measurement group '{name}' (groups: {})", Group::names()))
    })?;
    Ok(Json(s.engine.groups(Some((group, body.enabled))).await?))
}

async fn counters(State(s): State<ApiState>) -> ApiResult<BTreeMap<String, u64>> {
    Ok(Json(s.engine.status().await?.counters))
}

/// Binds the API socket (mode 0600, in a 0700 directory created if needed). A socket left by
/// a dead agent is replaced; one that answers belongs to a running agent and is an error.
pub async fn bind(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            anyhow::bail!("{} is in use: is another mirror-agent running?", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener =
        tokio::net::UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}
