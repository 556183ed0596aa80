//! The MCP add-on end to end: the tool-call endpoint, lease-guarded sessions, revocation and the `mcp` handler
//! across pods — against the real `@modelcontextprotocol/server-everything` (behind a recording proxy) and the
//! real MongoDB.

mod support;

#[path = "../../mcp-client/tests/support/mod.rs"]
mod mcp_support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::Method;
use lease_brain::dispatch::RevokedHolder;
use lease_shared::store::{HolderRecord, LeaseStore, MongoStore};
use lease_shared::{ResourceLeaseService, RevocationReason, StaticDefinitions};
use mcp_support::{EverythingHttp, RecordingProxy};
use serde_json::{Value, json};
use support::{INTERNAL_SECRET, Pod, test_database, token};

/// A hang guard for waiting on asynchronous effects; never a timing assertion.
const PATIENCE: Duration = Duration::from_secs(60);

/// A brain pod on a runtime of its own, so that it can be killed the way a process dies: every task of the pod
/// (server, heartbeat, sweeper, pooled sessions) stops at once, without any shutdown step — no stopped mark, no
/// session `DELETE`, no lease release.
struct IsolatedPod {
    base: String,
    runtime: Option<tokio::runtime::Runtime>,
}

impl IsolatedPod {
    async fn start(uri: &str, db: &str, pod_id: &str) -> IsolatedPod {
        let port = support::free_port();
        let config = support::pod_config(uri, db, pod_id, port, &[]);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name(format!("{pod_id}-rt"))
            .build()
            .expect("pod runtime");
        runtime.spawn(lease_brain::server::run(config, std::future::pending()));
        let base = format!("http://127.0.0.1:{port}");
        support::await_ready(&base, pod_id).await;
        IsolatedPod { base, runtime: Some(runtime) }
    }

    /// Kills the pod: its runtime is shut down from a thread outside any runtime, so that nothing dropped there
    /// can spawn a cleanup anywhere (the pod's own runtime refuses new tasks while it shuts down).
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            std::thread::spawn(move || runtime.shutdown_background()).join().expect("kill the pod runtime");
        }
    }
}

impl Drop for IsolatedPod {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Brain {
    http: reqwest::Client,
}

impl Brain {
    fn new() -> Brain {
        Brain { http: reqwest::Client::new() }
    }

    async fn put_document(&self, base: &str, tenant: &str, project: &str, path: &str, content: &str) {
        let r = self
            .http
            .put(format!("{base}/internal/documents"))
            .header("x-vance-internal-secret", INTERNAL_SECRET)
            .json(&json!({ "tenantId": tenant, "projectId": project, "path": path, "content": content }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }

    /// Configures the tool `everything` for tenant t1 (tenant layer) at `endpoint`, with auth, `lease: browser`,
    /// and lets the bundled `browser` definition (user 1) fail at once instead of waiting 5 s.
    async fn configure(&self, base: &str, endpoint: &str) {
        let tool = format!(
            "transport: streamable-http\nendpoint: {endpoint}\nheaders:\n  Authorization: Bearer tool-secret\n  \
             X-Api-Key: key-1\nlease: browser\n"
        );
        self.put_document(base, "t1", "_tenant", "_vance/config/tools/everything.yaml", &tool).await;
        self.put_document(base, "t1", "_tenant", "_vance/config/lease/browser.yaml", "name: browser\nwaitMs: 0\n")
            .await;
    }

    async fn call(
        &self,
        base: &str,
        project: &str,
        user: &str,
        body: Value,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let r = self
            .http
            .post(format!("{base}/api/v1/projects/{project}/tools/everything/call"))
            .bearer_auth(token("t1", user))
            .json(&body)
            .send()
            .await
            .unwrap();
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        (status, r.json().await.unwrap_or(Value::Null), headers)
    }

    async fn echo(&self, base: &str, project: &str, user: &str, text: &str) -> (u16, Value) {
        let (status, body, _) =
            self.call(base, project, user, json!({ "name": "echo", "arguments": { "message": text } })).await;
        (status, body)
    }

    async fn admin(&self, base: &str, what: &str, body: Value) -> Value {
        let r = self
            .http
            .post(format!("{base}/internal/lease/admin/{what}"))
            .header("x-vance-internal-secret", INTERNAL_SECRET)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }
}

fn text_of(result: &Value) -> String {
    result["content"].as_array().map(|c| c.iter().filter_map(|b| b["text"].as_str()).collect()).unwrap_or_default()
}

async fn lease_holders(db: &mongodb::Database) -> Vec<HolderRecord> {
    MongoStore::new(db).holders(None).await.expect("holders")
}

async fn holder_of(db: &mongodb::Database, user: &str) -> HolderRecord {
    let mut found: Vec<HolderRecord> =
        lease_holders(db).await.into_iter().filter(|h| h.user_id.as_deref() == Some(user)).collect();
    assert_eq!(found.len(), 1, "{user} holds {} leases", found.len());
    found.remove(0)
}

fn session_of(h: &HolderRecord) -> String {
    h.payload.get("sessionId").and_then(|v| v.as_str()).expect("payload.sessionId").to_owned()
}

/// Waits (without a time limit assertion; [`PATIENCE`] only guards a hang) until `proxy` saw a `DELETE` of
/// `session_id`.
async fn wait_for_delete(proxy: &RecordingProxy, session_id: &str) -> mcp_support::Recorded {
    let start = Instant::now();
    loop {
        if let Some(d) =
            proxy.with_method(Method::DELETE).into_iter().find(|d| d.header("mcp-session-id") == Some(session_id))
        {
            return d;
        }
        assert!(start.elapsed() < PATIENCE, "no DELETE of session {session_id}: {:?}", proxy.requests());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tool_calls_through_the_brain_are_lease_guarded_and_revocation_reopens_the_session() {
    let (uri, db) = test_database("mcp_e2e").await;
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let mut pod = Pod::start(&uri, db.name(), "pod-a").await;
    let brain = Brain::new();
    brain.configure(&pod.base, &proxy.endpoint()).await;

    // echo end to end: the tools/call result JSON.
    let (status, result) = brain.echo(&pod.base, "p1", "u1", "hello brain").await;
    assert_eq!(status, 200, "{result}");
    assert!(text_of(&result).contains("hello brain"), "{result}");
    assert_eq!(result["isError"], false);
    let first = holder_of(&db, "u1").await;
    assert_eq!((first.lease_type.as_str(), first.resource.as_str(), first.pod.as_str()), ("mcp", "browser", "pod-a"));
    assert!(!first.pod_bound, "an HTTP session lives on in the MCP server");
    let posts = proxy.with_method(Method::POST);
    assert!(posts.iter().all(|p| p.header("authorization") == Some("Bearer tool-secret")), "configured auth");

    // The same user in another project: user cap 1 → LEASE_BUSY with its diagnosis; another user is admitted.
    let (status, busy, headers) =
        brain.call(&pod.base, "p2", "u1", json!({ "name": "echo", "arguments": { "message": "x" } })).await;
    assert_eq!(status, 429, "{busy}");
    assert_eq!((busy["code"].as_str(), busy["level"].as_str()), (Some("LEASE_BUSY"), Some("user")));
    assert_eq!(
        (busy["scope"].as_str(), busy["count"].as_i64(), busy["cap"].as_i64()),
        (Some("t1/u1"), Some(1), Some(1))
    );
    assert!(headers.get("retry-after").is_some());
    let (status, other) = brain.echo(&pod.base, "p1", "u2", "second user").await;
    assert_eq!(status, 200, "{other}");

    // An operator revokes u1's lease: the handler closes the pooled session (DELETE), the next call opens a new
    // session with a new lease.
    let revoked = brain.admin(&pod.base, "revoke", json!({ "token": first.token })).await;
    assert_eq!(revoked["type"], "mcp");
    let delete = wait_for_delete(&proxy, &session_of(&first)).await;
    assert_eq!(delete.header("authorization"), Some("Bearer tool-secret"));
    assert_eq!(delete.header("x-api-key"), Some("key-1"));
    let (status, again) = brain.echo(&pod.base, "p1", "u1", "after revocation").await;
    assert_eq!(status, 200, "{again}");
    let second = holder_of(&db, "u1").await;
    assert_ne!(second.token, first.token);
    assert_ne!(session_of(&second), session_of(&first));

    // A revocation whose handler never runs (`anus lease revoke --force`: straight in MongoDB): the next call
    // finds the lease lost, closes the session and fails; the call after that opens a new session.
    let types: HashSet<String> = ["mcp".to_owned()].into();
    let direct = ResourceLeaseService::new(
        Arc::new(MongoStore::new(&db)),
        Arc::new(StaticDefinitions::default()),
        Arc::new(types),
        None,
    );
    direct.reaper().revoke(&second.token, None).await.expect("forced revoke");
    let (status, lost) = brain.echo(&pod.base, "p1", "u1", "lost").await;
    assert_eq!(status, 409, "{lost}");
    assert_eq!(lost["code"], "MCP_SESSION_REVOKED");
    wait_for_delete(&proxy, &session_of(&second)).await;
    let (status, reopened) = brain.echo(&pod.base, "p1", "u1", "reopened").await;
    assert_eq!(status, 200, "{reopened}");
    let third = holder_of(&db, "u1").await;
    assert!(third.token != second.token && session_of(&third) != session_of(&second));

    // Errors: unknown tool, no token, malformed body, a tool the server does not have.
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/api/v1/projects/p1/tools/nothing/call", pod.base))
        .bearer_auth(token("t1", "u1"))
        .json(&json!({ "name": "echo" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "TOOL_NOT_FOUND");
    let r =
        http.post(format!("{}/api/v1/projects/p1/tools/everything/call", pod.base)).json(&json!({ "name": "echo" }));
    assert_eq!(r.send().await.unwrap().status(), 401);
    let (status, invalid, _) = brain.call(&pod.base, "p1", "u1", json!({ "tool": "echo" })).await;
    assert_eq!((status, invalid["code"].as_str()), (400, Some("INVALID_REQUEST")));
    let (status, missing, _) = brain.call(&pod.base, "p1", "u1", json!({ "name": "no-such-tool" })).await;
    assert!(
        (status == 200 && missing["isError"] == true) || (status == 502 && missing["code"] == "TOOL_ERROR"),
        "{status} {missing}"
    );

    // Graceful shutdown closes every pooled session and releases their leases.
    let open_sessions = [session_of(&third), session_of(&holder_of(&db, "u2").await)];
    pod.stop().await;
    for s in &open_sessions {
        wait_for_delete(&proxy, s).await;
        assert!(!mcp_support::session_status(&server, s).await.is_success());
    }
    assert!(lease_holders(&db).await.is_empty(), "shutdown released every lease");
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_pods_http_session_is_deleted_by_the_reaper_pod_unless_the_tool_moved() {
    let (uri, db) = test_database("mcp_dead_pod").await;
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let moved_to = RecordingProxy::start(&server.base).await;
    let mut b = Pod::start(&uri, db.name(), "pod-b").await;
    let mut a = IsolatedPod::start(&uri, db.name(), "pod-a").await;
    let brain = Brain::new();
    brain.configure(&b.base, &proxy.endpoint()).await;

    let (status, result) = brain.echo(&a.base, "p1", "u1", "on pod a").await;
    assert_eq!(status, 200, "{result}");
    let holder = holder_of(&db, "u1").await;
    let session_id = session_of(&holder);
    assert_eq!((holder.pod.as_str(), holder.pod_bound), ("pod-a", false));

    // Pod A dies with its session open. Once its heartbeat is stale, a sweep on B reaps its lease and B — the
    // reaper pod — sends the session DELETE with the configured auth.
    a.kill();
    assert!(mcp_support::session_status(&server, &session_id).await.is_success(), "a killed pod sends nothing");
    let start = Instant::now();
    // (B's own scheduled sweep may get there first; either way the lease goes through B's dispatcher.)
    while lease_holders(&db).await.iter().any(|h| h.pod == "pod-a") {
        let swept = brain.admin(&b.base, "sweep", json!({})).await;
        assert!(start.elapsed() < PATIENCE, "pod-a's lease was never reaped: {swept}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let delete = wait_for_delete(&proxy, &session_id).await;
    assert_eq!(delete.header("authorization"), Some("Bearer tool-secret"));
    assert_eq!(delete.header("x-api-key"), Some("key-1"));
    assert!(
        !mcp_support::session_status(&server, &session_id).await.is_success(),
        "the server forgot the dead pod's session"
    );
    assert!(lease_holders(&db).await.is_empty());

    // Pod C dies with an open session after the tool moved to another endpoint: the reaper sends nothing.
    let mut c = IsolatedPod::start(&uri, db.name(), "pod-c").await;
    let (status, result) = brain.echo(&c.base, "p1", "u2", "on pod c").await;
    assert_eq!(status, 200, "{result}");
    let holder = holder_of(&db, "u2").await;
    let session_id = session_of(&holder);
    brain.configure(&b.base, &moved_to.endpoint()).await;
    c.kill();
    let deletes_before = proxy.with_method(Method::DELETE).len();
    // The dispatcher's "dead, not pod-bound" cell, run synchronously: B's handler decides with the holder record
    // (the route answers once the handler has finished).
    let r = brain
        .http
        .post(format!("{}/internal/lease/revoked", b.base))
        .header("x-vance-internal-secret", INTERNAL_SECRET)
        .json(&RevokedHolder { holder, reason: RevocationReason::Pod })
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(proxy.with_method(Method::DELETE).len(), deletes_before, "no DELETE to the old endpoint");
    assert!(moved_to.requests().is_empty(), "nothing to the new endpoint");
    assert!(
        mcp_support::session_status(&server, &session_id).await.is_success(),
        "the session was left to its own expiry"
    );
    b.stop().await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_pooled_session_is_closed_and_its_slot_returned_long_before_the_lease_ttl() {
    let (uri, db) = test_database("mcp_idle").await;
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let mut pod = Pod::start_with(&uri, db.name(), "pod-a", &[("BRAIN_MCP_IDLE_CLOSE_MS", "300")]).await;
    let brain = Brain::new();
    brain.configure(&pod.base, &proxy.endpoint()).await;

    let (status, result) = brain.echo(&pod.base, "p1", "u1", "then idle").await;
    assert_eq!(status, 200, "{result}");
    let holder = holder_of(&db, "u1").await;
    assert_eq!(holder.ttl_seconds, 300, "the browser lease would hold its slot for five minutes");
    // Closed by the pod's idle loop: the session DELETE, and the lease released (not reaped: no revocation).
    wait_for_delete(&proxy, &session_of(&holder)).await;
    let start = Instant::now();
    while !lease_holders(&db).await.is_empty() {
        assert!(start.elapsed() < PATIENCE, "the idle session's lease was never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The user's single slot is free again: another project's session opens at once (waitMs 0).
    let (status, result) = brain.echo(&pod.base, "p2", "u1", "fresh").await;
    assert_eq!(status, 200, "{result}");
    pod.stop().await;
    let _ = db.drop().await;
}
