//! The brain's HTTP lease API and revocation dispatch over real HTTP on loopback, with lease state in the real
//! MongoDB (one database per test).

mod support;

use std::sync::Arc;
use std::time::Duration;

use lease_brain::auth::JwtKeys;
use serde_json::{Value, json};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_api_round_trip_busy_and_idempotent_release() {
    let (uri, db) = test_database("api_round_trip").await;
    let mut pod = Pod::start(&uri, db.name(), "pod-a").await;
    let http = reqwest::Client::new();
    let (callback, _) = callback_server().await;
    let bearer = token("t1", "u1");

    let r = acquire(&http, &pod.base, &bearer, webhook_body(&callback, "p1")).await;
    assert_eq!(r.status(), 201);
    let granted: Value = r.json().await.unwrap();
    let lease = granted["token"].as_str().unwrap().to_owned();
    assert_eq!(granted["resource"], "mcp-inline:t1/p1/remote");
    assert_eq!(granted["levels"]["project"], 1);

    let busy = acquire(&http, &pod.base, &bearer, webhook_body(&callback, "p1")).await;
    assert_eq!(busy.status(), 429);
    assert!(busy.headers().get("retry-after").is_some(), "LEASE_BUSY carries Retry-After");
    let busy: Value = busy.json().await.unwrap();
    assert_eq!(
        (busy["code"].as_str(), busy["level"].as_str(), busy["count"].as_i64()),
        (Some("LEASE_BUSY"), Some("project"), Some(1))
    );

    let check =
        http.post(format!("{}/api/v1/leases/{lease}/check", pod.base)).bearer_auth(&bearer).send().await.unwrap();
    assert_eq!(check.status(), 200);
    let put = http
        .put(format!("{}/api/v1/leases/{lease}/payload", pod.base))
        .bearer_auth(&bearer)
        .json(&json!({ "callbackUrl": callback, "jobId": "j-9" }))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    assert_eq!(holders(&db).await[0].get_document("payload").unwrap().get_str("jobId").unwrap(), "j-9");

    let release = |bearer: String| {
        let (http, url) = (http.clone(), format!("{}/api/v1/leases/{lease}", pod.base));
        async move { http.delete(url).bearer_auth(bearer).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    assert_eq!(release(bearer.clone()).await["status"], "ok");
    assert_eq!(release(bearer.clone()).await["status"], "already-released");
    let lost =
        http.post(format!("{}/api/v1/leases/{lease}/check", pod.base)).bearer_auth(&bearer).send().await.unwrap();
    assert_eq!(lost.status(), 410);
    assert_eq!(lost.json::<Value>().await.unwrap()["code"], "LEASE_LOST");
    pod.stop().await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_are_checked_and_tenants_cannot_touch_each_others_leases() {
    let (uri, db) = test_database("api_auth").await;
    let mut pod = Pod::start(&uri, db.name(), "pod-a").await;
    let http = reqwest::Client::new();
    let (callback, _) = callback_server().await;

    let body = webhook_body(&callback, "p1");
    let no_token = http.post(format!("{}/api/v1/leases", pod.base)).json(&body).send().await.unwrap();
    assert_eq!(no_token.status(), 401);
    let expired = JwtKeys::new(JWT_SECRET).mint("t1", "u1", &[], 0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(acquire(&http, &pod.base, &expired, body.clone()).await.status(), 401);
    let forged = JwtKeys::new("another-secret-entirely").mint("t1", "u1", &[], 600);
    assert_eq!(acquire(&http, &pod.base, &forged, body.clone()).await.status(), 401);
    assert!(holders(&db).await.is_empty(), "a refused token wrote something");

    let owner = token("tx", "u1");
    let r = acquire(&http, &pod.base, &owner, body).await;
    let lease = r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned();
    let before = holders(&db).await;
    let other = token("ty", "u1");
    let url = format!("{}/api/v1/leases/{lease}", pod.base);
    assert_eq!(http.post(format!("{url}/check")).bearer_auth(&other).send().await.unwrap().status(), 404);
    let put = http.put(format!("{url}/payload")).bearer_auth(&other).json(&json!({})).send().await.unwrap();
    assert_eq!(put.status(), 404);
    assert_eq!(http.delete(&url).bearer_auth(&other).send().await.unwrap().status(), 404);
    assert_eq!(holders(&db).await, before, "another tenant changed the lease");

    let internal = format!("{}/internal/lease/admin/revoke", pod.base);
    let r = http.post(&internal).json(&json!({ "token": lease })).send().await.unwrap();
    assert_eq!(r.status(), 401, "internal endpoint without the secret");
    let r = http
        .post(&internal)
        .header("x-vance-internal-secret", "wrong")
        .json(&json!({ "token": lease }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(holders(&db).await, before);
    pod.stop().await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_requests_are_invalid_and_write_nothing() {
    let (uri, db) = test_database("api_invalid").await;
    let mut pod = Pod::start(&uri, db.name(), "pod-a").await;
    let http = reqwest::Client::new();
    let bearer = token("t1", "u1");
    let url = format!("{}/api/v1/leases", pod.base);
    let raw = http
        .post(&url)
        .bearer_auth(&bearer)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    assert_eq!(raw.json::<Value>().await.unwrap()["code"], "INVALID_REQUEST");
    for (body, field) in [
        (json!({ "type": "no-such-type", "lease": "tex", "projectId": "p1" }), "type"),
        (
            json!({ "type": "webhook", "lease": "../etc", "projectId": "p1", "payload": { "callbackUrl": "http://x" } }),
            "lease",
        ),
        (
            json!({ "type": "webhook", "inline": { "name": "x", "levels": { "global": 99 } }, "projectId": "p1", "payload": { "callbackUrl": "http://x" } }),
            "levels.global",
        ),
        (
            json!({ "type": "webhook", "inline": { "name": "x", "levels": { "project": 0 } }, "projectId": "p1", "payload": { "callbackUrl": "http://x" } }),
            "inline.levels.project",
        ),
        (json!({ "type": "webhook", "lease": "tex", "projectId": "p1" }), "payload.callbackUrl"),
        (json!({ "type": "webhook", "lease": "tex", "projectId": "p1", "extra": 1 }), "body"),
    ] {
        let r = acquire(&http, &pod.base, &bearer, body.clone()).await;
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!((v["code"].as_str(), v["field"].as_str()), (Some("INVALID_REQUEST"), Some(field)), "{body}");
    }
    assert!(holders(&db).await.is_empty(), "an invalid request wrote a holder");
    pod.stop().await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revocation_via_another_pod_runs_the_handler_of_the_holder_pod_or_of_the_reaper_when_it_is_dead() {
    let (uri, db) = test_database("api_dispatch").await;
    let mut a = Pod::start(&uri, db.name(), "pod-a").await;
    let mut b = Pod::start(&uri, db.name(), "pod-b").await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let bearer = token("t1", "u1");
    let revoke = |base: &str, lease: &str| {
        http.post(format!("{base}/internal/lease/admin/revoke"))
            .header("x-vance-internal-secret", INTERNAL_SECRET)
            .json(&json!({ "token": lease }))
            .send()
    };

    // Live foreign pod: B forwards to A, A's webhook handler calls back.
    let r = acquire(&http, &a.base, &bearer, webhook_body(&callback, "p1")).await;
    let lease = r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned();
    assert_eq!(revoke(&b.base, &lease).await.unwrap().status(), 200);
    let calls = wait_for_callbacks(&seen, 1).await;
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0]["token"].as_str(), calls[0]["reason"].as_str()), (Some(lease.as_str()), Some("revoke")));
    assert_eq!(calls[0]["handledBy"], "pod-a", "the holder's own pod runs the handler");
    let check = http.post(format!("{}/api/v1/leases/{lease}/check", a.base)).bearer_auth(&bearer).send().await.unwrap();
    assert_eq!(check.status(), 410, "the revoked holder learns at its next check");

    // Dead pod, not pod-bound: A stops; B runs the handler itself with the payload.
    let r = acquire(&http, &a.base, &bearer, webhook_body(&callback, "p2")).await;
    let lease = r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned();
    a.stop().await;
    assert_eq!(revoke(&b.base, &lease).await.unwrap().status(), 200);
    let calls = wait_for_callbacks(&seen, 2).await;
    assert_eq!(calls.len(), 2, "the reaper pod ran the handler of the dead pod's lease");
    assert_eq!(calls[1]["token"].as_str(), Some(lease.as_str()));
    assert_eq!(calls[1]["handledBy"], "pod-b");

    // A pod that still looks alive but no longer answers: the POST fails and counts as unreachable.
    let mut c = Pod::start(&uri, db.name(), "pod-c").await;
    let r = acquire(&http, &c.base, &bearer, webhook_body(&callback, "p3")).await;
    let lease = r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned();
    c.kill();
    assert_eq!(revoke(&b.base, &lease).await.unwrap().status(), 200);
    let calls = wait_for_callbacks(&seen, 3).await;
    assert_eq!(calls.len(), 3);
    assert_eq!((calls[2]["token"].as_str(), calls[2]["handledBy"].as_str()), (Some(lease.as_str()), Some("pod-b")));
    b.stop().await;
    let _ = db.drop().await;
}

/// The dispatch matrix cell that HTTP cannot reach (the lease API only grants non-pod-bound leases): a dead
/// pod's pod-bound holder is only released, its handler runs nowhere.
#[tokio::test]
async fn dead_pod_bound_holder_is_released_only() {
    use lease_brain::cluster::{ClusterService, ClusterStore, LeasePodLiveness, MemoryClusterStore};
    use lease_brain::dispatch::{Dispatched, HandlerRegistry, LeaseRevocationDispatcher, WebhookHandler};
    use lease_shared::RevocationReason;
    use lease_shared::store::{HolderRecord, HolderState};

    let store: Arc<dyn ClusterStore> = Arc::new(MemoryClusterStore::default());
    store.register("gone", "http://127.0.0.1:9").await.unwrap();
    store.mark_stopped("gone").await.unwrap();
    let cluster = ClusterService::new(store, "me".into(), "http://127.0.0.1:1".into(), Duration::from_secs(5));
    let mut registry = HandlerRegistry::default();
    registry.register(Arc::new(WebhookHandler::new("me")));
    let dispatcher = LeaseRevocationDispatcher::new(Arc::new(registry), LeasePodLiveness::new(cluster), "s".into());
    let mut holder = HolderRecord {
        token: "t".into(),
        lease_type: "webhook".into(),
        lease: "l".into(),
        resource: "r".into(),
        tenant_id: "t1".into(),
        project_id: "p1".into(),
        user_id: None,
        holder_ref: String::new(),
        pod: "gone".into(),
        pod_bound: true,
        state: HolderState::Held,
        levels: vec![],
        payload: Default::default(),
        ttl_seconds: 60,
        acquired_at_ms: 0,
        last_seen_at_ms: 0,
    };
    assert_eq!(dispatcher.dispatch(&holder, RevocationReason::Pod).await, Dispatched::ReleasedOnly);
    holder.pod_bound = false;
    assert_eq!(dispatcher.dispatch(&holder, RevocationReason::Pod).await, Dispatched::Local);
    holder.pod = "me".into();
    holder.pod_bound = true;
    assert_eq!(dispatcher.dispatch(&holder, RevocationReason::Idle).await, Dispatched::Local, "own pod is alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn config_change_posted_to_one_pod_changes_the_caps_of_the_next_acquire_on_another() {
    let (uri, db) = test_database("api_config").await;
    let mut a = Pod::start(&uri, db.name(), "pod-a").await;
    let mut b = Pod::start(&uri, db.name(), "pod-b").await;
    let http = reqwest::Client::new();
    let (callback, _) = callback_server().await;
    let bearer = token("t1", "u1");
    let tex = |project: &str| json!({ "type": "webhook", "lease": "tex", "projectId": project, "payload": { "callbackUrl": callback } });
    // The bundled tex definition caps a project at 1; B caches it with its first acquire.
    let first = acquire(&http, &b.base, &bearer, tex("p1")).await;
    assert_eq!(first.status(), 201);
    assert_eq!(first.json::<Value>().await.unwrap()["levels"]["project"], 1);

    // The tenant raises its project cap to 2 and waits no longer than 0 ms — written through pod A.
    let write = http
        .put(format!("{}/internal/documents", a.base))
        .header("x-vance-internal-secret", INTERNAL_SECRET)
        .json(&json!({
            "tenantId": "t1", "projectId": "_tenant", "path": "_vance/config/lease/tex.yaml",
            "content": "name: tex\nlevels:\n  project: 2\nwaitMs: 0\n",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(write.status(), 200);
    let second = acquire(&http, &b.base, &bearer, tex("p1")).await;
    assert_eq!(second.status(), 201, "pod B still used its cached cap of 1");
    assert_eq!(second.json::<Value>().await.unwrap()["levels"]["project"], 2);
    let third = acquire(&http, &b.base, &bearer, tex("p1")).await;
    assert_eq!(third.status(), 429, "the new cap of 2 binds, with the new waitMs of 0");

    let unauthorized = http
        .post(format!("{}/internal/documents/changed", b.base))
        .json(&json!({ "tenant": "t1", "project": "_tenant", "path": "_vance/config/lease/tex.yaml" }))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    a.stop().await;
    b.stop().await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_revokes_a_pod_and_a_sweep_reaps_the_holders_of_a_stopped_pod() {
    let (uri, db) = test_database("api_admin").await;
    let mut a = Pod::start(&uri, db.name(), "pod-a").await;
    let mut b = Pod::start(&uri, db.name(), "pod-b").await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let bearer = token("t1", "u1");
    let admin = |base: &str, what: &str, body: Value| {
        http.post(format!("{base}/internal/lease/admin/{what}"))
            .header("x-vance-internal-secret", INTERNAL_SECRET)
            .json(&body)
            .send()
    };
    for p in ["p1", "p2"] {
        assert_eq!(acquire(&http, &a.base, &bearer, webhook_body(&callback, p)).await.status(), 201);
    }
    let r: Value = admin(&b.base, "revoke-pod", json!({ "pod": "pod-a" })).await.unwrap().json().await.unwrap();
    assert_eq!(r["count"], 2);
    assert_eq!(wait_for_callbacks(&seen, 2).await.len(), 2, "each revoked holder's handler ran");
    assert!(holders(&db).await.is_empty());

    // A stopped pod's holders are reaped (reason pod) by the next sweep of a live pod.
    for p in ["p3", "p4"] {
        assert_eq!(acquire(&http, &a.base, &bearer, webhook_body(&callback, p)).await.status(), 201);
    }
    a.stop().await;
    let r: Value = admin(&b.base, "sweep", json!({})).await.unwrap().json().await.unwrap();
    assert_eq!(r["pod"], 2, "{r}");
    assert!(holders(&db).await.is_empty());
    let calls = wait_for_callbacks(&seen, 4).await;
    assert_eq!(calls.len(), 4);
    assert!(calls[2..].iter().all(|c| c["reason"] == "pod" && c["handledBy"] == "pod-b"), "{calls:?}");
    let unauthorized = http.post(format!("{}/internal/lease/admin/sweep", b.base)).send().await.unwrap();
    assert_eq!(unauthorized.status(), 401);
    b.stop().await;
    let _ = db.drop().await;
}
