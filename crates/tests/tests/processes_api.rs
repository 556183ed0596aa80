//! The brain's HTTP surface and add-ons as separate processes: a revocation POST to a pod that no longer answers,
//! auth and malformed requests, and lease-guarded compiles from two processes against one tex2pdf service.

use std::time::Duration;

use serde_json::{Value, json};
use tests::{
    BrainProcess, DoubleProcess, INTERNAL_HEADER, INTERNAL_SECRET, callback_server, holders, test_database, token,
    wait_for_callbacks,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revocation_for_a_pod_that_no_longer_answers_runs_the_handler_on_the_revoking_pod() {
    let (uri, db) = test_database("unanswering").await;
    // A long staleness: the killed pod still looks alive when the revocation comes, so the POST is tried and fails.
    let env = [("BRAIN_HEARTBEAT_STALENESS_MS", "60000")];
    let mut a = BrainProcess::start(&uri, db.name(), "pod-a", &env).await;
    let b = BrainProcess::start(&uri, db.name(), "pod-b", &env).await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let body = json!({
        "type": "webhook", "projectId": "p1", "payload": { "callbackUrl": callback },
        "inline": { "name": "job", "levels": { "project": 1 } },
    });
    let r = http.post(format!("{}/api/v1/leases", a.base)).bearer_auth(token("t1", "u1")).json(&body).send().await;
    let lease = r.unwrap().json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned();
    a.kill9().await;
    let r = http
        .post(format!("{}/internal/lease/admin/revoke", b.base))
        .header(INTERNAL_HEADER, INTERNAL_SECRET)
        .json(&json!({ "token": lease }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let calls = wait_for_callbacks(&seen, 1, Duration::from_secs(30)).await;
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0]["token"].as_str(), calls[0]["reason"].as_str(), calls[0]["handledBy"].as_str()),
        (Some(lease.as_str()), Some("revoke"), Some("pod-b"))
    );
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_tokens_foreign_tenants_and_malformed_bodies_are_refused_and_write_nothing() {
    let (uri, db) = test_database("http_refusals").await;
    let a = BrainProcess::start(&uri, db.name(), "pod-a", &[]).await;
    let http = reqwest::Client::new();
    let (callback, _) = callback_server().await;
    let url = format!("{}/api/v1/leases", a.base);
    let body = json!({ "type": "webhook", "lease": "tex", "projectId": "p1", "payload": { "callbackUrl": callback } });
    let forged = lease_brain::auth::JwtKeys::new("not-the-configured-secret").mint("t1", "u1", &[], 600);
    assert_eq!(http.post(&url).json(&body).send().await.unwrap().status(), 401);
    assert_eq!(http.post(&url).bearer_auth(forged).json(&body).send().await.unwrap().status(), 401);
    for (bad, field) in [
        (json!({ "type": "unknown", "lease": "tex", "projectId": "p1" }), "type"),
        (
            json!({ "type": "webhook", "lease": "no such name!", "projectId": "p1", "payload": { "callbackUrl": callback } }),
            "lease",
        ),
        (json!({ "type": "webhook", "projectId": 7 }), "body"),
    ] {
        let r = http.post(&url).bearer_auth(token("t1", "u1")).json(&bad).send().await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        assert_eq!(r.json::<Value>().await.unwrap()["field"], field, "{bad}");
    }
    assert!(holders(&db).await.is_empty(), "a refused request wrote a holder");

    let r = http.post(&url).bearer_auth(token("tx", "u1")).json(&body).send().await.unwrap();
    let lease = r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned();
    let before = holders(&db).await;
    let foreign = token("ty", "u1");
    let r = http.delete(format!("{url}/{lease}")).bearer_auth(&foreign).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = http.post(format!("{url}/{lease}/check")).bearer_auth(&foreign).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(holders(&db).await, before, "another tenant changed the lease");
    let r = http.post(format!("{}/internal/lease/admin/sweep", a.base)).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_compiles_of_one_project_from_two_processes_never_overload_the_service() {
    let (uri, db) = test_database("tex_processes").await;
    // A service that takes 6 jobs at once (more would be answered with 429), each job 300 ms.
    let double = DoubleProcess::start(6, 300).await;
    let env = [("BRAIN_TEX2PDF_URL", double.url.as_str()), ("BRAIN_TEX2PDF_POLL_MS", "100")];
    let pods = [
        BrainProcess::start(&uri, db.name(), "pod-a", &env).await,
        BrainProcess::start(&uri, db.name(), "pod-b", &env).await,
    ];
    let http = reqwest::Client::new();
    let compiles: Vec<_> = (0..20)
        .map(|i| {
            let (http, base) = (http.clone(), pods[i % 2].base.clone());
            tokio::spawn(async move {
                let r = http
                    .post(format!("{base}/api/v1/projects/p1/tex/compile"))
                    .bearer_auth(token("t1", &format!("u{i}")))
                    .json(&json!({ "source": format!("\\documentclass{{article}} % {i}") }))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let code = if status == 200 { None } else { r.json::<Value>().await.ok().map(|v| v["code"].clone()) };
                (status, code)
            })
        })
        .collect();
    let (mut pdfs, mut busy) = (0, 0);
    for c in compiles {
        match c.await.unwrap() {
            (200, _) => pdfs += 1,
            (429, Some(code)) if code == "LEASE_BUSY" => busy += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    let stats: Value = http.get(format!("{}/stats", double.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(stats["rejected429"], 0, "the service was overloaded despite the lease: {stats}");
    assert_eq!(stats["maxConcurrentPerProject"]["t1/p1"], 1, "{stats}");
    assert!(stats["maxConcurrent"].as_u64().unwrap() <= 6, "{stats}");
    assert_eq!(stats["submitted"].as_u64().unwrap(), pdfs, "every submitted job became a PDF: {stats}");
    assert_eq!(pdfs + busy, 20);
    assert!(pdfs >= 1);
    let _ = db.drop().await;
}
