//! Tenant Insights (spec §9): the operational view of one tenant for its ADMIN.
//!
//! Everything is bound to the tenant of the bearer token and needs the role [`ADMIN_ROLE`]:
//! - `GET /api/v1/insights/leases`: the tenant's holders (payload keys only — values may hold secrets);
//! - `GET /api/v1/insights/counters`: the tenant's counters of the tenant, project and user levels, each with the
//!   number of the tenant's holders booking it and the drift between the two (the global level belongs to no
//!   tenant and only shows in `anus`);
//! - `POST /api/v1/insights/leases/{token}/revoke`: a revocation (a reap by operator decision; the handler runs
//!   through the reaper's listener). The tenant is part of the delete filter: another tenant's token is
//!   `NOT_FOUND` and stays untouched.
//!
//! `GET /insights` serves one self-contained page over these endpoints; it reads the token from the URL fragment
//! (`/insights#token=…`), so the token never reaches a server log or a `Referer`.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lease_shared::LeaseError;
use lease_shared::store::{CounterKey, CounterRecord, HolderRecord};
use serde::Serialize;

use crate::api::{ApiError, bearer_claims};
use crate::auth::Claims;
use crate::server::AppState;

/// The role a token needs for Tenant Insights.
pub const ADMIN_ROLE: &str = "ADMIN";

/// The Tenant Insights routes: the page and its JSON endpoints.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/insights", get(page))
        .route("/api/v1/insights/leases", get(leases))
        .route("/api/v1/insights/counters", get(counters))
        .route("/api/v1/insights/leases/{token}/revoke", post(revoke))
}

/// One holder as Insights shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderView {
    /// The lease token.
    pub token: String,
    /// The handler type.
    #[serde(rename = "type")]
    pub lease_type: String,
    /// The definition's name.
    pub lease: String,
    /// The counted resource.
    pub resource: String,
    /// The holder's project.
    pub project: String,
    /// The holder's user, if any.
    pub user: Option<String>,
    /// The pod that acquired the lease.
    pub pod: String,
    /// Whether the resource dies with the pod.
    pub pod_bound: bool,
    /// `PENDING` or `HELD`.
    pub state: String,
    /// Seconds since the last touch, by store time.
    pub idle_seconds: i64,
    /// Idle time after which the holder may be reaped.
    pub ttl_seconds: u64,
    /// The payload's keys, sorted; never its values.
    pub payload_keys: Vec<String>,
}

impl HolderView {
    /// The view of `h` at store time `now_ms`.
    pub fn new(h: &HolderRecord, now_ms: i64) -> Self {
        HolderView {
            token: h.token.clone(),
            lease_type: h.lease_type.clone(),
            lease: h.lease.clone(),
            resource: h.resource.clone(),
            project: h.project_id.clone(),
            user: h.user_id.clone(),
            pod: h.pod.clone(),
            pod_bound: h.pod_bound,
            state: h.state.as_str().to_owned(),
            idle_seconds: (now_ms - h.last_seen_at_ms).max(0) / 1000,
            ttl_seconds: h.ttl_seconds,
            // A serde_json map iterates its keys in order.
            payload_keys: h.payload.keys().cloned().collect(),
        }
    }
}

/// One counter of the tenant with what its holders book.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CounterView {
    /// The counter's `_id` (`<resource>|<level>|<scope>`).
    pub id: String,
    /// The counted resource.
    pub resource: String,
    /// `tenant`, `project` or `user`.
    pub level: String,
    /// `<tenant>`, `<tenant>/<project>` or `<tenant>/<user>`.
    pub scope: String,
    /// Slots taken according to the counter.
    pub count: i64,
    /// Holders of the tenant booking this counter: the value reconcile corrects the count to.
    pub booked: i64,
    /// `count - booked`: non-zero is drift from a crash window, not a display error.
    pub drift: i64,
}

/// The key of `id` if it is a counter of `tenant`: level tenant, project or user, scope `tenant` or
/// `tenant/…`. Global counters belong to no tenant.
pub fn tenant_counter_key(id: &str, tenant: &str) -> Option<CounterKey> {
    CounterKey::parse(id).filter(|k| k.belongs_to_tenant(tenant))
}

/// The tenant's counters (sorted by id), each with its booked holders and drift.
pub fn counter_views(tenant: &str, counters: &[CounterRecord], holders: &[HolderRecord]) -> Vec<CounterView> {
    let mut booked: BTreeMap<&str, i64> = BTreeMap::new();
    for l in holders.iter().filter(|h| h.tenant_id == tenant).flat_map(|h| &h.levels) {
        *booked.entry(l.as_str()).or_default() += 1;
    }
    let mut views: Vec<CounterView> = counters
        .iter()
        .filter_map(|c| {
            let key = tenant_counter_key(&c.id, tenant)?;
            let b = booked.get(c.id.as_str()).copied().unwrap_or(0);
            Some(CounterView {
                id: c.id.clone(),
                resource: key.resource,
                level: key.level.as_str().to_owned(),
                scope: key.scope,
                count: c.count,
                booked: b,
                drift: c.count - b,
            })
        })
        .collect();
    views.sort_by(|a, b| a.id.cmp(&b.id));
    views
}

/// The verified claims of a tenant ADMIN (`UNAUTHORIZED` without a valid token, `FORBIDDEN` without the role).
fn admin(state: &AppState, headers: &HeaderMap) -> Result<Claims, ApiError> {
    let claims = bearer_claims(state.jwt.as_ref(), headers)?;
    if claims.roles.iter().any(|r| r == ADMIN_ROLE) { Ok(claims) } else { Err(ApiError::Forbidden(ADMIN_ROLE)) }
}

async fn leases(State(state): State<AppState>, headers: HeaderMap) -> Result<Json<serde_json::Value>, ApiError> {
    let claims = admin(&state, &headers)?;
    let store = state.leases.store();
    let now = store.store_now_ms().await.map_err(LeaseError::from)?;
    let mut holders: Vec<HolderView> = store
        .tenant_holders(&claims.tenant)
        .await
        .map_err(LeaseError::from)?
        .iter()
        .map(|h| HolderView::new(h, now))
        .collect();
    holders.sort_by(|a, b| (&a.resource, &a.token).cmp(&(&b.resource, &b.token)));
    Ok(Json(serde_json::json!({ "tenant": claims.tenant, "holders": holders })))
}

async fn counters(State(state): State<AppState>, headers: HeaderMap) -> Result<Json<serde_json::Value>, ApiError> {
    let claims = admin(&state, &headers)?;
    let store = state.leases.store();
    let counters = store.tenant_counters(&claims.tenant).await.map_err(LeaseError::from)?;
    let holders = store.tenant_holders(&claims.tenant).await.map_err(LeaseError::from)?;
    let views = counter_views(&claims.tenant, &counters, &holders);
    Ok(Json(serde_json::json!({ "tenant": claims.tenant, "counters": views })))
}

async fn revoke(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let claims = admin(&state, &headers)?;
    match state.leases.reaper().revoke(&token, Some(&claims.tenant)).await {
        Ok(h) => {
            tracing::info!(token = %h.token, tenant = %claims.tenant, user = %claims.sub, "insights: holder revoked");
            Ok(Json(serde_json::json!({ "status": "revoked", "token": h.token })))
        }
        // Unknown, already gone, or another tenant's: the same answer, nothing changed.
        Err(LeaseError::Lost { .. }) => Err(ApiError::NotFound),
        Err(e) => Err(e.into()),
    }
}

/// The page: static, so it needs no token; the token stays in the fragment and goes only into the API calls.
async fn page() -> Response {
    let mut response = Html(PAGE).into_response();
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; \
             base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    response
}

/// The Insights page: inline CSS and JS, no external assets. Every value is set as text, never as HTML. When a
/// load has finished, `<body data-state>` is `ready` (or `error`).
const PAGE: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tenant Insights</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #222; }
h1 { font-size: 1.3rem; } h2 { font-size: 1.1rem; margin-top: 1.5rem; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #ddd; padding: .3rem .5rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 12px; }
.drift { color: #b00020; font-weight: bold; }
#error { color: #b00020; white-space: pre-wrap; }
.muted { color: #777; }
</style>
</head>
<body data-state="loading">
<h1>Tenant Insights <span id="tenant" class="muted"></span></h1>
<p id="error" role="alert"></p>
<h2>Leases</h2>
<table id="holders"><thead><tr><th>Token</th><th>Type</th><th>Lease</th><th>Resource</th><th>Project</th><th>User</th>
<th>Pod</th><th>Pod-bound</th><th>State</th><th>Idle</th><th>Payload keys</th><th></th></tr></thead><tbody></tbody></table>
<h2>Counters</h2>
<table id="counters"><thead><tr><th>Counter</th><th>Level</th><th>Count</th><th>Booked</th><th>Drift</th></tr></thead>
<tbody></tbody></table>
<script>
"use strict";
const token = new URLSearchParams(location.hash.slice(1)).get("token") || "";
const $ = (id) => document.getElementById(id);

async function api(method, path) {
  const r = await fetch(path, { method, headers: { Authorization: "Bearer " + token }, cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(r.status + " " + (body.code || r.statusText) + (body.message ? ": " + body.message : ""));
  return body;
}

function row(tbody, cells) {
  const tr = tbody.insertRow();
  for (const c of cells) {
    const td = tr.insertCell();
    if (c instanceof Node) td.append(c);
    else if (typeof c === "number") { td.className = "num"; td.textContent = String(c); }
    else td.textContent = c == null ? "-" : String(c);
  }
  return tr;
}

function code(text) { const e = document.createElement("code"); e.textContent = text; return e; }

async function revoke(t) {
  if (!confirm("Revoke lease " + t + "? Its handler runs as for any reap.")) return;
  try { await api("POST", "api/v1/insights/leases/" + encodeURIComponent(t) + "/revoke"); }
  catch (e) { $("error").textContent = "revoke: " + e.message; }
  await load();
}

async function load() {
  document.body.dataset.state = "loading";
  if (!token) {
    $("error").textContent = "No token: open this page as /insights#token=<a tenant ADMIN token>.";
    document.body.dataset.state = "error";
    return;
  }
  try {
    const [l, c] = await Promise.all([api("GET", "api/v1/insights/leases"), api("GET", "api/v1/insights/counters")]);
    $("tenant").textContent = "— " + l.tenant;
    const hb = $("holders").tBodies[0], cb = $("counters").tBodies[0];
    hb.replaceChildren(); cb.replaceChildren();
    for (const h of l.holders) {
      const b = document.createElement("button");
      b.textContent = "Revoke";
      b.addEventListener("click", () => revoke(h.token));
      row(hb, [code(h.token), h.type, h.lease, h.resource, h.project, h.user, h.pod, h.podBound ? "yes" : "no",
        h.state, h.idleSeconds + " s", h.payloadKeys.join(", "), b]);
    }
    if (!l.holders.length) row(hb, ["no leases"]);
    for (const k of c.counters) {
      const tr = row(cb, [code(k.id), k.level, k.count, k.booked, k.drift ? "DRIFT " + (k.drift > 0 ? "+" : "") + k.drift : ""]);
      if (k.drift) tr.lastChild.className = "drift";
    }
    if (!c.counters.length) row(cb, ["no counters"]);
    $("error").textContent = "";
    document.body.dataset.state = "ready";
  } catch (e) {
    $("error").textContent = e.message;
    document.body.dataset.state = "error";
  }
}

load();
</script>
</body>
</html>
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tenants_own_non_global_counters_belong_to_it() {
        assert!(tenant_counter_key("r|tenant|t1", "t1").is_some());
        assert!(tenant_counter_key("r|project|t1/p1", "t1").is_some());
        assert!(tenant_counter_key("r|user|t1/u1", "t1").is_some());
        assert!(tenant_counter_key("r|global|*", "t1").is_none());
        assert!(tenant_counter_key("r|tenant|t10", "t1").is_none());
        assert!(tenant_counter_key("r|project|t10/p1", "t1").is_none());
        assert!(tenant_counter_key("garbage", "t1").is_none());
    }
}
