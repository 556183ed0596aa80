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
//! `GET /insights` serves one self-contained page over these endpoints (inline script and style, no external asset,
//! no build step). Sign-in is a token form; `/insights#token=…` also signs in, after which the page strips the
//! fragment with `history.replaceState`, so the token never reaches a server log, a `Referer`, the address bar or
//! the history. The token is kept in the tab's `sessionStorage` (gone with the tab, never in `localStorage`) and
//! only goes into the API calls' `Authorization` header; "Sign out" removes it. While signed in, the page reloads
//! every 5 s (the "Auto-refresh" checkbox pauses it), one load at a time; a 401 or 403 shows the error and stops the
//! refresh until the next sign-in. "Revoke" asks for confirmation, then calls the revoke endpoint above.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lease_shared::LeaseError;
use lease_shared::store::{CounterKey, HolderRecord};
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

/// Whether the counter `id` belongs to `tenant`: level tenant, project or user, scope `tenant` or `tenant/…`.
/// Global counters belong to no tenant.
pub fn is_tenant_counter(id: &str, tenant: &str) -> bool {
    CounterKey::parse(id).is_some_and(|k| k.belongs_to_tenant(tenant))
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
    // The tenant's holders book its counters (and the global ones, which are left out).
    let booked = crate::ops::booked_by(&holders);
    let views = crate::ops::counter_rows(&counters, &booked, |id, _| is_tenant_counter(id, &claims.tenant));
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

/// The page: static, so it needs no token; the token goes only into the API calls.
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

/// The Insights page: inline CSS and JS, no external assets. Every value is set as text, never as HTML.
/// Hooks for tests and tools: `<body data-state>` is `signed-out`, `loading` (the first load of a sign-in),
/// `ready` or `error`; `<body data-refresh>` is `on` while auto-refresh is armed; each holder row has
/// `data-token`, each counter row `data-counter`; the ids `sign-in-form`, `token-input`, `sign-in`, `sign-out`,
/// `auto-refresh`, `refresh`, `updated`, `error` and `notice`.
const PAGE: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tenant Insights</title>
<style>
[hidden] { display: none !important; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 1rem 1.5rem; color: #222; }
header { display: flex; flex-wrap: wrap; align-items: center; gap: .5rem 1.5rem; }
h1 { font-size: 1.3rem; margin: 0; } h2 { font-size: 1.1rem; margin: 1.25rem 0 .4rem; }
form, #session { display: flex; flex-wrap: wrap; align-items: center; gap: .5rem; }
#token-input { width: 22rem; max-width: 60vw; }
table { border-collapse: collapse; width: 100%; }
#counters { width: auto; min-width: 50%; }
th, td { border-bottom: 1px solid #ddd; padding: .25rem .45rem; text-align: left; vertical-align: top; }
/* Long tokens, ids and names wrap instead of widening the table past a laptop screen. */
td { overflow-wrap: anywhere; }
th { background: #f4f4f4; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code { font: 12px/1.3 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.drift { color: #b00020; font-weight: bold; white-space: nowrap; }
#error { color: #b00020; white-space: pre-wrap; }
#error:empty, #notice:empty { display: none; }
.muted, #updated { color: #666; }
</style>
</head>
<body data-state="loading" data-refresh="off">
<header>
<h1>Tenant Insights <span id="tenant" class="muted"></span></h1>
<form id="sign-in-form" hidden>
<label for="token-input">Token</label>
<input id="token-input" type="password" autocomplete="off" spellcheck="false" required
 placeholder="a tenant ADMIN bearer token">
<button id="sign-in" type="submit">Sign in</button>
</form>
<div id="session" hidden>
<label><input id="auto-refresh" type="checkbox" checked> Auto-refresh</label>
<span id="updated"></span>
<button id="refresh" type="button">Refresh</button>
<button id="sign-out" type="button">Sign out</button>
</div>
</header>
<p id="error" role="alert"></p>
<p id="notice" role="status"></p>
<main id="content" hidden>
<h2>Leases</h2>
<table id="holders"><thead><tr><th>Token</th><th>Type</th><th>Lease</th><th>Resource</th><th>Project</th><th>User</th>
<th>Pod</th><th>State</th><th>Idle / TTL</th><th>Payload keys</th><th></th></tr></thead><tbody></tbody></table>
<h2>Counters</h2>
<table id="counters"><thead><tr><th>Counter</th><th>Level</th><th>Count</th><th>Booked</th><th>Drift</th></tr></thead>
<tbody></tbody></table>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const KEY = "lease-insights-token";
const REFRESH_MS = 5000;

// The token lives in this tab's sessionStorage only (a variable if storage is unavailable).
let memoryToken = "";
function getToken() { try { return sessionStorage.getItem(KEY) || ""; } catch { return memoryToken; } }
function setToken(t) {
  memoryToken = t;
  try { if (t) sessionStorage.setItem(KEY, t); else sessionStorage.removeItem(KEY); } catch { /* memory only */ }
}

// session changes at every sign-in and sign-out: a load of an older session renders nothing.
let session = 0, timer = 0, inflight = null, again = false, authFailed = false;

function setState(s) { document.body.dataset.state = s; }

async function api(method, path) {
  const r = await fetch(path, { method, headers: { Authorization: "Bearer " + getToken() }, cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    const e = new Error(r.status + " " + (body.code || r.statusText) + (body.message ? ": " + body.message : ""));
    e.status = r.status;
    throw e;
  }
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

function emptyRow(tbody, text) {
  const td = tbody.insertRow().insertCell();
  td.colSpan = tbody.parentElement.tHead.rows[0].cells.length;
  td.className = "muted";
  td.textContent = text;
}

function code(text) { const e = document.createElement("code"); e.textContent = text; return e; }

function clock() { return new Date().toTimeString().slice(0, 8); }

// Auto-refresh runs while signed in, enabled and not refused; one timer at a time, armed after a load ends.
function schedule() {
  clearTimeout(timer);
  timer = 0;
  const on = !!getToken() && $("auto-refresh").checked && !authFailed;
  document.body.dataset.refresh = on ? "on" : "off";
  $("auto-refresh").disabled = authFailed;
  if (on) timer = setTimeout(refresh, REFRESH_MS);
}

// Loads never overlap: a refresh asked for during a load runs once that load has ended.
function refresh() {
  if (inflight) { again = true; return inflight; }
  clearTimeout(timer);
  inflight = (async () => {
    do { again = false; await load(); } while (again && getToken());
    inflight = null;
    schedule();
  })();
  return inflight;
}

async function load() {
  const mine = session;
  if (!getToken()) return;
  if (document.body.dataset.state !== "ready") setState("loading");
  try {
    const [l, c] = await Promise.all([api("GET", "api/v1/insights/leases"), api("GET", "api/v1/insights/counters")]);
    if (mine !== session) return;
    $("tenant").textContent = "— " + l.tenant;
    const hb = $("holders").tBodies[0], cb = $("counters").tBodies[0];
    hb.replaceChildren(); cb.replaceChildren();
    for (const h of l.holders) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "revoke";
      b.textContent = "Revoke";
      b.addEventListener("click", () => revoke(h.token, b));
      const tr = row(hb, [code(h.token), h.type, h.lease, h.resource, h.project, h.user,
        h.pod + (h.podBound ? " (bound)" : ""), h.state, h.idleSeconds + " s / " + h.ttlSeconds + " s",
        h.payloadKeys.join(", "), b]);
      tr.dataset.token = h.token;
    }
    if (!l.holders.length) emptyRow(hb, "no leases");
    for (const k of c.counters) {
      const drift = k.drift ? "DRIFT " + (k.drift > 0 ? "+" : "") + k.drift : "";
      const tr = row(cb, [code(k.id), k.level, k.count, k.booked, drift]);
      tr.dataset.counter = k.id;
      if (k.drift) tr.lastChild.className = "drift";
    }
    if (!c.counters.length) emptyRow(cb, "no counters");
    $("content").hidden = false;
    $("error").textContent = "";
    $("updated").textContent = "updated " + clock();
    setState("ready");
  } catch (e) {
    if (mine !== session) return;
    // A refused token stays refused: stop refreshing until the next sign-in.
    if (e.status === 401 || e.status === 403) authFailed = true;
    $("error").textContent = e.message + (authFailed ? " — sign in again with a tenant ADMIN token" : "");
    setState("error");
  }
}

async function revoke(t, button) {
  if (!confirm("Revoke lease " + t + "? Its handler runs as for any reap.")) return;
  button.disabled = true;
  try {
    await api("POST", "api/v1/insights/leases/" + encodeURIComponent(t) + "/revoke");
    $("notice").textContent = "Revoked " + t + " at " + clock() + ".";
  } catch (e) {
    $("notice").textContent = "Revoke " + t + " failed: " + e.message;
  }
  await refresh();
}

// Nothing of the previous session stays on screen.
function clearView(signedIn) {
  $("sign-in-form").hidden = signedIn;
  $("session").hidden = !signedIn;
  $("content").hidden = true;
  for (const id of ["tenant", "updated", "error", "notice"]) $(id).textContent = "";
  $("holders").tBodies[0].replaceChildren();
  $("counters").tBodies[0].replaceChildren();
}

function signIn(t) {
  setToken(t);
  session++;
  authFailed = false;
  $("token-input").value = "";
  clearView(true);
  setState("loading");
  refresh();
}

function signOut() {
  setToken("");
  session++;
  clearView(false);
  setState("signed-out");
  schedule();
  $("token-input").focus();
}

// A token in the fragment (/insights#token=…) signs in, then leaves the URL and the history entry.
function takeFragmentToken() {
  const t = new URLSearchParams(location.hash.slice(1)).get("token");
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  return t ? t.trim() : "";
}

$("sign-in-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const t = $("token-input").value.trim().replace(/^Bearer\s+/i, "");
  if (t) signIn(t);
});
$("sign-out").addEventListener("click", signOut);
$("refresh").addEventListener("click", () => refresh());
$("auto-refresh").addEventListener("change", () => { if (!inflight) schedule(); });
window.addEventListener("hashchange", () => { const t = takeFragmentToken(); if (t) signIn(t); });

const fragment = takeFragmentToken();
if (fragment) signIn(fragment);
else if (getToken()) signIn(getToken());
else { clearView(false); setState("signed-out"); }
</script>
</body>
</html>
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tenants_own_non_global_counters_belong_to_it() {
        assert!(is_tenant_counter("r|tenant|t1", "t1"));
        assert!(is_tenant_counter("r|project|t1/p1", "t1"));
        assert!(is_tenant_counter("r|user|t1/u1", "t1"));
        assert!(!is_tenant_counter("r|global|*", "t1"));
        assert!(!is_tenant_counter("r|tenant|t10", "t1"));
        assert!(!is_tenant_counter("r|project|t10/p1", "t1"));
        assert!(!is_tenant_counter("garbage", "t1"));
    }
}
