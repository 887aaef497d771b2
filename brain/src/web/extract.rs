//! What every handler shares: JSON bodies and query parameters whose rejections are JSON
//! errors, the admin request that carries the web caller, and the API's call timeout.

use std::future::Future;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use super::ApiError;
use super::auth::Authed;

/// How long one API call may take before it answers 504.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A JSON body whose rejection is a JSON error too.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        // An empty body is the message with every field at its default: a length of 0, or
        // neither a length nor a chunked body (HTTP/1.1's "no body", as `curl -X POST` sends).
        let h = req.headers();
        let empty = match h.get(header::CONTENT_LENGTH) {
            Some(v) => v == "0",
            None => !h.contains_key(header::TRANSFER_ENCODING),
        };
        if empty {
            return serde_json::from_str("{}")
                .map(Body)
                .map_err(|e| ApiError::bad_request(e.to_string()));
        }
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(e) => Err(json_rejection(e)),
        }
    }
}

fn json_rejection(e: JsonRejection) -> ApiError {
    let status = e.status();
    ApiError::new(
        status,
        "invalid_argument",
        format!(
            "the request body is not what this endpoint takes: {}",
            e.body_text()
        ),
    )
}

/// Query parameters whose rejection is a JSON error.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;
    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Params(q.0))
            .map_err(|e: QueryRejection| {
                ApiError::bad_request(format!("bad query parameters: {}", e.body_text()))
            })
    }
}

/// An admin request for `method` (`Admin/ListTasks`) carrying the web caller; refused unless
/// the gRPC role table lets the web API make it.
pub fn request<T>(a: &Authed, method: &str, msg: T) -> Result<tonic::Request<T>, ApiError> {
    crate::api::roles::web_may(method)?;
    let mut r = tonic::Request::new(msg);
    r.extensions_mut().insert(a.caller.clone());
    Ok(r)
}

/// Runs an admin call with the API's timeout.
pub async fn within<T>(
    f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => Ok(r?.into_inner()),
        Err(_) => Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "deadline_exceeded",
            format!("the brain did not answer within {CALL_TIMEOUT:?}; try again"),
        )),
    }
}

pub type Answer<T> = Result<Json<T>, ApiError>;
