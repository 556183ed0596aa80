//! The operator's endpoints (spec §9), behind the internal shared secret, across all tenants. The operator CLI
//! (`anus`) acts through them — only a brain has the handler registry and pod routing — and reads through them
//! when it has no MongoDB of its own (a brain on the embedded store).
//!
//! - `POST /internal/lease/admin/revoke` `{token, tenantId?}`, `POST …/revoke-pod` `{pod}`: revocations, handlers
//!   run as for any reap;
//! - `POST …/sweep`: a reaper round now; `POST …/reconcile` `{safetyMs?}`: a reconcile pass (no handler involved);
//! - `GET …/holders?tenant=&resource=&pod=&type=`, `GET …/holders/{token}`, `GET …/counters?resource=`,
//!   `GET …/definition?name=&tenant=&project=`: the views of [`crate::ops`];
//! - `GET|PUT|DELETE /internal/documents`: config documents; writes tell every pod (cache invalidation).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use lease_shared::{LeaseError, ReconcileOptions, Reconciler};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{ApiError, body, internal};
use crate::ops::{self, HolderFilter};
use crate::server::AppState;

/// The operator's routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/internal/lease/admin/revoke", post(revoke))
        .route("/internal/lease/admin/revoke-pod", post(revoke_pod))
        .route("/internal/lease/admin/sweep", post(sweep))
        .route("/internal/lease/admin/reconcile", post(reconcile))
        .route("/internal/lease/admin/holders", get(holders))
        .route("/internal/lease/admin/holders/{token}", get(holder))
        .route("/internal/lease/admin/counters", get(counters))
        .route("/internal/lease/admin/definition", get(definition))
        .route("/internal/documents", get(read_document).put(write_document).delete(delete_document))
}

/// A query string parsed into `T`, or `INVALID_REQUEST` naming what is wrong.
fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(t)| t).map_err(|e| ApiError::invalid("query", e.body_text()))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RevokeBody {
    token: String,
    tenant_id: Option<String>,
}

/// Revokes one holder (reason `revoke`; with `tenantId`, only if it belongs to that tenant).
async fn revoke(State(state): State<AppState>, headers: HeaderMap, bytes: Bytes) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let b: RevokeBody = body(&bytes)?;
    let holder = match state.leases.reaper().revoke(&b.token, b.tenant_id.as_deref()).await {
        Ok(h) => h,
        Err(LeaseError::Lost { .. }) => return Err(ApiError::NoSuch(format!("no holder {}", b.token))),
        Err(e) => return Err(e.into()),
    };
    Ok(Json(json!({ "status": "revoked", "token": holder.token, "pod": holder.pod, "type": holder.lease_type })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RevokePodBody {
    pod: String,
}

/// Revokes every holder of a pod (reason `revoke`); handlers dispatch as for any reap.
async fn revoke_pod(State(state): State<AppState>, headers: HeaderMap, bytes: Bytes) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let b: RevokePodBody = body(&bytes)?;
    let revoked = state.leases.reaper().revoke_pod(&b.pod).await.map_err(LeaseError::from)?;
    let tokens: Vec<&str> = revoked.iter().map(|h| h.token.as_str()).collect();
    Ok(Json(json!({ "status": "revoked", "count": revoked.len(), "tokens": tokens })))
}

/// One sweep round now: idle reap, dead-pod reap, reconcile, with handlers.
async fn sweep(State(state): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let report = state.sweeper.sweep_once().await.map_err(LeaseError::from)?;
    Ok(Json(serde_json::to_value(report).unwrap_or_default()))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReconcileBody {
    safety_ms: Option<u64>,
}

/// One reconcile pass with the given safety margin (default that of [`ReconcileOptions`]).
async fn reconcile(State(state): State<AppState>, headers: HeaderMap, bytes: Bytes) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let b: ReconcileBody = if bytes.is_empty() { ReconcileBody::default() } else { body(&bytes)? };
    let mut options = ReconcileOptions::default();
    if let Some(ms) = b.safety_ms {
        options.safety = Duration::from_millis(ms);
    }
    let report = Reconciler::new(state.leases.store().clone(), options).run().await.map_err(LeaseError::from)?;
    Ok(Json(serde_json::to_value(report).unwrap_or_default()))
}

async fn holders(
    State(state): State<AppState>,
    headers: HeaderMap,
    filter: Result<Query<HolderFilter>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let filter = query(filter)?;
    let rows = ops::holders(state.leases.store().as_ref(), &state.liveness, &filter).await.map_err(LeaseError::from)?;
    Ok(Json(json!({ "holders": rows })))
}

async fn holder(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    match ops::holder(state.leases.store().as_ref(), &state.liveness, &token).await.map_err(LeaseError::from)? {
        Some(row) => Ok(Json(serde_json::to_value(row).unwrap_or_default())),
        None => Err(ApiError::NoSuch(format!("no holder {token}"))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CountersQuery {
    resource: Option<String>,
}

async fn counters(
    State(state): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<CountersQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let q = query(q)?;
    let rows = ops::counters(state.leases.store().as_ref(), q.resource.as_deref()).await.map_err(LeaseError::from)?;
    Ok(Json(json!({ "counters": rows })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DefinitionQuery {
    name: String,
    tenant: String,
    project: String,
}

/// The merged definition as an acquisition in the scope would see it now (every layer read anew).
async fn definition(
    State(state): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<DefinitionQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let q = query(q)?;
    match ops::definition(&state.definitions, &q.tenant, &q.project, &q.name).await? {
        Some(view) => Ok(Json(serde_json::to_value(view).unwrap_or_default())),
        None => Err(ApiError::NoSuch(format!("no layer defines lease {:?}", q.name))),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DocumentKey {
    tenant_id: String,
    project_id: String,
    path: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DocumentBody {
    tenant_id: String,
    project_id: String,
    path: String,
    content: String,
}

/// One config document's content as stored (not merged).
async fn read_document(
    State(state): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<DocumentKey>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let k = query(q)?;
    let content =
        state.definitions.documents().get(&k.tenant_id, &k.project_id, &k.path).await.map_err(LeaseError::from)?;
    match content {
        Some(content) => Ok(Json(json!({
            "tenantId": k.tenant_id, "projectId": k.project_id, "path": k.path, "content": content,
        }))),
        None => Err(ApiError::NoSuch(format!("no document {} in {}/{}", k.path, k.tenant_id, k.project_id))),
    }
}

/// Writes a config document: drops this pod's affected cache entries and tells every live pod.
async fn write_document(
    State(state): State<AppState>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let d: DocumentBody = body(&bytes)?;
    state.definitions.put_document(&d.tenant_id, &d.project_id, &d.path, &d.content).await?;
    Ok(Json(json!({ "status": "written" })))
}

/// Deletes a config document (idempotent: reports whether it existed) and tells every live pod.
async fn delete_document(
    State(state): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<DocumentKey>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    internal(&state, &headers)?;
    let k = query(q)?;
    let existed = state.definitions.delete_document(&k.tenant_id, &k.project_id, &k.path).await?;
    Ok(Json(json!({ "status": if existed { "deleted" } else { "absent" } })))
}
