//! The recorder's captures: `GET /v1/captures` lists them, `GET /v1/captures/{id}` streams
//! one's pcapng, `DELETE /v1/captures/{id}` deletes one.

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use super::{ApiError, ApiResult, ApiState};
use crate::recorder::Recorder;
use crate::views::CaptureView;

pub(super) fn routes() -> Router<ApiState> {
    Router::new().route("/v1/captures", get(list)).route("/v1/captures/{id}", get(fetch).delete(remove))
}

fn recorder(s: &ApiState) -> Result<&Recorder, ApiError> {
    s.recorder.as_ref().ok_or_else(|| {
        ApiError(StatusCode::NOT_FOUND, "the recorder is off (recorder.enabled: false)".into())
    })
}

type Id = Result<UrlPath<u64>, axum::extract::rejection::PathRejection>;

fn id_of(id: Id) -> Result<u64, ApiError> {
    id.map(|UrlPath(id)| id)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("a capture's id is a number: {e}")))
}

fn no_such(id: u64) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no capture {id} on this node (see mirrorctl captures)"))
}

async fn list(State(s): State<ApiState>) -> ApiResult<Vec<CaptureView>> {
    Ok(Json(recorder(&s)?.list().await?))
}

/// The pcapng file, streamed; headers name its packets and state.
async fn fetch(State(s): State<ApiState>, id: Id) -> Result<Response, ApiError> {
    let id = id_of(id)?;
    let (path, view) = recorder(&s)?.get(id).await?.ok_or_else(|| no_such(id))?;
    if view.uploaded {
        return Err(ApiError(
            StatusCode::GONE,
            format!(
                "capture {id} was uploaded to object storage ({}) and deleted from this node",
                view.key.as_deref().unwrap_or("?")
            ),
        ));
    }
    let file = tokio::fs::File::open(&path).await.map_err(|_| no_such(id))?;
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-pcapng".to_string()),
            (header::HeaderName::from_static("x-capture-state"), view.state),
        ],
        body,
    )
        .into_response())
}

async fn remove(State(s): State<ApiState>, id: Id) -> ApiResult<serde_json::Value> {
    let id = id_of(id)?;
    match recorder(&s)?.remove(id).await? {
        Ok(true) => Ok(Json(serde_json::json!({"deleted": id}))),
        Ok(false) => Err(no_such(id)),
        Err(why) => Err(ApiError(StatusCode::CONFLICT, why)),
    }
}
