//! The HTTP surface of the brain (DESIGN.md): the tenant-bound lease API and the internal endpoints. Errors are
//! mapped to codes and statuses here, and only here.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post, put};
use axum::{Json, Router};
use lease_shared::{DefinitionDocument, LeaseError, LeaseRef, LeaseRequest, Payload};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::auth::{Claims, JwtKeys, internal_secret_matches};
use crate::dispatch::{INTERNAL_SECRET_HEADER, RevokedHolder, WebhookHandler};
use crate::server::AppState;

/// Every error the HTTP surface answers with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A lease error with its own code.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// Missing, malformed, expired or wrongly signed credentials.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// A valid token without the role the endpoint needs (`FORBIDDEN`, 403).
    #[error("forbidden: this endpoint needs the {0} role")]
    Forbidden(&'static str),
    /// No such lease in the caller's tenant.
    #[error("no such lease in this tenant")]
    NotFound,
    /// Nothing of that name (an operator's look-up): `NOT_FOUND`, 404, with the message.
    #[error("{0}")]
    NoSuch(String),
    /// A malformed body or parameter.
    #[error("invalid request: {field}: {message}")]
    Invalid {
        /// The offending field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The lease API is not configured (no JWT secret).
    #[error("the lease API is disabled: no JWT secret is configured")]
    Disabled,
    /// An MCP tool call failed (see [`ToolFailure`] for codes and statuses).
    #[error("{message}")]
    Tool {
        /// What failed.
        kind: ToolFailure,
        /// The diagnosis.
        message: String,
    },
    /// A tex compile ended with the compiler's error (`TEX_COMPILE_FAILED`, 422).
    #[error("the tex compile failed; see the log")]
    TexCompileFailed {
        /// The end of the compiler's log.
        log: String,
    },
    /// A tex compile was aborted because its lease was revoked or lost while it ran (`TEX_COMPILE_ABORTED`, 409).
    #[error("the tex compile was aborted ({cause}): its lease was revoked or lost; the remote job expires on its own")]
    TexCompileAborted {
        /// `revoke`, `idle` or `pod` (a revocation reached the poll loop), or `lost` (its check found the lease gone).
        cause: String,
    },
    /// The tex2pdf service answered 429 (`TEX_REMOTE_OVERLOADED`, 503): only without a lease in front of it.
    #[error("the tex2pdf service is overloaded")]
    TexRemoteOverloaded {
        /// The service's `Retry-After`, in seconds.
        retry_after_secs: Option<u64>,
    },
    /// The tex2pdf service failed, answered outside its contract or did not finish in time (`TEX_REMOTE_ERROR`,
    /// 502).
    #[error("tex2pdf: {0}")]
    TexRemote(String),
}

/// Why an MCP tool call failed (lease refusals stay [`ApiError::Lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFailure {
    /// `TOOL_ERROR`, 502: the MCP server or its transport failed.
    Failed,
    /// `MCP_SESSION_REVOKED`, 409: the session's lease was lost; the session was closed and the next call opens a
    /// new one.
    SessionRevoked,
    /// `TOOL_NOT_FOUND`, 404: no tool of that name is configured.
    NotFound,
}

impl ToolFailure {
    /// The stable machine code.
    pub fn code(self) -> &'static str {
        match self {
            ToolFailure::Failed => "TOOL_ERROR",
            ToolFailure::SessionRevoked => "MCP_SESSION_REVOKED",
            ToolFailure::NotFound => "TOOL_NOT_FOUND",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            ToolFailure::Failed => StatusCode::BAD_GATEWAY,
            ToolFailure::SessionRevoked => StatusCode::CONFLICT,
            ToolFailure::NotFound => StatusCode::NOT_FOUND,
        }
    }
}

impl ApiError {
    /// `INVALID_REQUEST` on `field`.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        ApiError::Invalid { field: field.to_owned(), message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        let (status, body, retry_after) = match &self {
            ApiError::Lease(e) => match e {
                LeaseError::Busy(b) => (
                    StatusCode::TOO_MANY_REQUESTS,
                    json!({
                        "code": e.code(), "message": message, "resource": b.resource, "level": b.level.as_str(),
                        "scope": b.scope, "count": b.count, "cap": b.cap, "retryAfterMs": b.retry_after_ms,
                    }),
                    // Whole seconds, rounded up, at least one.
                    Some(b.retry_after_ms.map_or(1, |ms| ms.div_ceil(1000).max(1))),
                ),
                LeaseError::Unavailable { .. } => {
                    tracing::error!(error = %e, "lease store unavailable");
                    (StatusCode::SERVICE_UNAVAILABLE, json!({ "code": e.code(), "message": message }), None)
                }
                LeaseError::Lost { token } => {
                    (StatusCode::GONE, json!({ "code": e.code(), "message": message, "token": token }), None)
                }
                LeaseError::InvalidRequest { field, .. } => {
                    (StatusCode::BAD_REQUEST, json!({ "code": e.code(), "message": message, "field": field }), None)
                }
                _ => (StatusCode::INTERNAL_SERVER_ERROR, json!({ "code": "INTERNAL", "message": message }), None),
            },
            ApiError::Unauthorized(_) => {
                (StatusCode::UNAUTHORIZED, json!({ "code": "UNAUTHORIZED", "message": "unauthorized" }), None)
            }
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, json!({ "code": "FORBIDDEN", "message": message }), None),
            ApiError::NotFound | ApiError::NoSuch(_) => {
                (StatusCode::NOT_FOUND, json!({ "code": "NOT_FOUND", "message": message }), None)
            }
            ApiError::Invalid { field, .. } => (
                StatusCode::BAD_REQUEST,
                json!({ "code": "INVALID_REQUEST", "message": message, "field": field }),
                None,
            ),
            ApiError::Disabled => {
                (StatusCode::SERVICE_UNAVAILABLE, json!({ "code": "LEASE_UNAVAILABLE", "message": message }), None)
            }
            ApiError::Tool { kind, .. } => (kind.status(), json!({ "code": kind.code(), "message": message }), None),
            ApiError::TexCompileFailed { log } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({ "code": "TEX_COMPILE_FAILED", "message": message, "log": log }),
                None,
            ),
            ApiError::TexCompileAborted { cause } => (
                StatusCode::CONFLICT,
                json!({ "code": "TEX_COMPILE_ABORTED", "message": message, "cause": cause }),
                None,
            ),
            ApiError::TexRemoteOverloaded { retry_after_secs } => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "code": "TEX_REMOTE_OVERLOADED", "message": message }),
                Some(retry_after_secs.unwrap_or(1)),
            ),
            ApiError::TexRemote(_) => {
                (StatusCode::BAD_GATEWAY, json!({ "code": "TEX_REMOTE_ERROR", "message": message }), None)
            }
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The lease API and internal routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/leases", post(acquire))
        .route("/api/v1/leases/{token}/check", post(check))
        .route("/api/v1/leases/{token}/payload", put(update_payload))
        .route("/api/v1/leases/{token}", delete(release))
        .route("/internal/lease/revoked", post(revoked))
        .route("/internal/documents/changed", post(documents_changed))
        .merge(crate::admin::routes())
        .merge(crate::insights::routes())
}

async fn documents_changed(
    State(state): State<AppState>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let change: lease_shared::DocumentChanged = body(&bytes)?;
    state.definitions.invalidate(&change);
    Ok(Json(json!({ "status": "ok" })))
}

fn claims(state: &AppState, headers: &HeaderMap) -> Result<Claims, ApiError> {
    bearer_claims(state.jwt.as_ref(), headers)
}

/// The verified claims of the request's bearer token (`UNAUTHORIZED` otherwise; the lease API answers 503 when no
/// JWT secret is configured). Add-on routes authenticate with this too.
pub fn bearer_claims(jwt: Option<&JwtKeys>, headers: &HeaderMap) -> Result<Claims, ApiError> {
    let keys = jwt.ok_or(ApiError::Disabled)?;
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| ApiError::Unauthorized("missing bearer token".to_owned()))?;
    keys.verify(bearer.trim()).map_err(|e| {
        tracing::info!(error = %e, "lease API token refused");
        ApiError::Unauthorized(e.0)
    })
}

/// Accepts the request only with the internal shared secret (compared in constant time).
pub(crate) fn internal(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let presented = headers.get(INTERNAL_SECRET_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if internal_secret_matches(presented, &state.internal_secret) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized("internal secret missing or wrong".to_owned()))
    }
}

/// Parses a JSON body into `T`, answering `INVALID_REQUEST` (not axum's plain-text rejection) when it fails.
pub fn body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::invalid("body", e.to_string()))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AcquireBody {
    #[serde(rename = "type")]
    lease_type: String,
    lease: Option<String>,
    inline: Option<Value>,
    project_id: String,
    #[serde(default)]
    holder_ref: String,
    #[serde(default)]
    payload: Payload,
}

async fn acquire(State(state): State<AppState>, headers: HeaderMap, bytes: Bytes) -> Result<Response, ApiError> {
    let claims = claims(&state, &headers)?;
    let b: AcquireBody = body(&bytes)?;
    let lease = match (b.lease, b.inline) {
        (Some(name), None) => LeaseRef::Name(name),
        (None, Some(inline)) => {
            // JSON is YAML: the inline object goes through the same parser (and its errors) as a config document.
            let doc = DefinitionDocument::parse(&inline.to_string())
                .map_err(|e| ApiError::invalid(&format!("inline.{}", e.field), e.problem))?;
            LeaseRef::Inline(doc)
        }
        (None, None) => LeaseRef::None,
        (Some(_), Some(_)) => return Err(ApiError::invalid("lease", "give either lease or inline, not both")),
    };
    // Remote consumers are not pod-bound: their resource does not live in this pod.
    let pod_bound = false;
    if b.lease_type == WebhookHandler::TYPE && !b.payload.get("callbackUrl").is_some_and(Value::is_string) {
        return Err(ApiError::invalid("payload.callbackUrl", "a webhook lease needs a callbackUrl in its payload"));
    }
    let request = LeaseRequest::new(b.lease_type, lease, claims.tenant, b.project_id)
        .user(claims.sub)
        .holder_ref(b.holder_ref)
        .pod(state.pod_id.clone(), pod_bound)
        .payload(b.payload);
    let lease = state.leases.acquire(request).await?;
    let (resource, ttl, levels) = (lease.resource().map(str::to_owned), lease.ttl_seconds(), lease.levels());
    let levels =
        levels.map(|c| json!({ "global": c.global, "tenant": c.tenant, "project": c.project, "user": c.user }));
    let token = lease.detach();
    let body =
        json!({ "token": token, "resource": resource, "levels": levels, "ttlSeconds": ttl, "noop": token.is_none() });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn check(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let claims = claims(&state, &headers)?;
    if state.leases.check_for_tenant(&token, &claims.tenant).await? {
        Ok(Json(json!({ "status": "ok" })))
    } else {
        Err(ApiError::NotFound)
    }
}

async fn update_payload(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(token): Path<String>,
    bytes: Bytes,
) -> Result<Json<Value>, ApiError> {
    let claims = claims(&state, &headers)?;
    let payload: Payload = body(&bytes)?;
    if state.leases.update_payload_for_tenant(&token, &claims.tenant, &payload).await? {
        Ok(Json(json!({ "status": "ok" })))
    } else {
        Err(ApiError::NotFound)
    }
}

async fn release(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let claims = claims(&state, &headers)?;
    match state.leases.release_for_tenant(&token, &claims.tenant).await? {
        Some(outcome) => Ok(Json(json!({ "status": outcome.as_str() }))),
        None => Err(ApiError::NotFound),
    }
}

async fn revoked(State(state): State<AppState>, headers: HeaderMap, bytes: Bytes) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let RevokedHolder { holder, reason } = body(&bytes)?;
    let outcome = state.dispatcher.run_local(&holder, reason).await;
    Ok(Json(json!({ "status": format!("{outcome:?}") })))
}
