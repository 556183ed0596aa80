//! Several brain processes on one MongoDB: revocation dispatch across pods, dead pods, graceful shutdown,
//! concurrency through the HTTP API, config changes across pods.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use mongodb::bson::doc;
use rand::Rng;
use serde_json::{Value, json};
use tests::{
    BrainProcess, DoubleProcess, INTERNAL_HEADER, INTERNAL_SECRET, callback_server, counters, holders, test_database,
    token, wait_for_callbacks,
};

fn webhook(lease: Value, project: &str, callback: &str) -> Value {
    let mut body = json!({ "type": "webhook", "projectId": project, "payload": { "callbackUrl": callback } });
    match lease {
        Value::String(name) => body["lease"] = Value::String(name),
        inline => body["inline"] = inline,
    }
    body
}

async fn acquire(http: &reqwest::Client, base: &str, bearer: &str, body: &Value) -> reqwest::Response {
    http.post(format!("{base}/api/v1/leases")).bearer_auth(bearer).json(body).send().await.unwrap()
}

async fn granted_token(r: reqwest::Response) -> String {
    assert_eq!(r.status(), 201);
    r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_pods_lease_on_a_revoked_via_b_runs_the_handler_on_a() {
    let (uri, db) = test_database("three_pods").await;
    let a = BrainProcess::start(&uri, db.name(), "pod-a", &[]).await;
    let b = BrainProcess::start(&uri, db.name(), "pod-b", &[]).await;
    let c = BrainProcess::start(&uri, db.name(), "pod-c", &[]).await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let bearer = token("t1", "u1");
    let inline = json!({ "name": "job", "levels": { "project": 1 }, "ttlSeconds": 60 });

    let lease = granted_token(acquire(&http, &a.base, &bearer, &webhook(inline.clone(), "p1", &callback)).await).await;
    let r = http
        .post(format!("{}/internal/lease/admin/revoke", b.base))
        .header(INTERNAL_HEADER, INTERNAL_SECRET)
        .json(&json!({ "token": lease }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let calls = wait_for_callbacks(&seen, 1, Duration::from_secs(10)).await;
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0]["token"].as_str(), calls[0]["handledBy"].as_str()), (Some(lease.as_str()), Some("pod-a")));
    // The holder learns on its next check, on any pod.
    let r = http.post(format!("{}/api/v1/leases/{lease}/check", c.base)).bearer_auth(&bearer).send().await.unwrap();
    assert_eq!(r.status(), 410);
    // The slot is free again for the next acquirer, on the third pod.
    granted_token(acquire(&http, &c.base, &bearer, &webhook(inline, "p1", &callback)).await).await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_pod_is_reaped_by_a_live_pod_which_runs_the_handlers_of_its_non_pod_bound_leases() {
    let (uri, db) = test_database("kill9").await;
    let mut a = BrainProcess::start(&uri, db.name(), "pod-a", &[]).await;
    let _b = BrainProcess::start(&uri, db.name(), "pod-b", &[]).await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let bearer = token("t1", "u1");
    let inline = json!({ "name": "job", "levels": { "project": 1 }, "ttlSeconds": 600 });
    let mut tokens = Vec::new();
    for p in ["p1", "p2"] {
        tokens
            .push(granted_token(acquire(&http, &a.base, &bearer, &webhook(inline.clone(), p, &callback)).await).await);
    }
    a.kill9().await;
    // Staleness 1.5 s + reap interval 0.3 s: well within the deadline; the TTL (600 s) plays no part.
    let calls = wait_for_callbacks(&seen, 2, Duration::from_secs(30)).await;
    assert_eq!(calls.len(), 2, "the dead pod's leases were not reaped: {calls:?}");
    for c in &calls {
        assert_eq!((c["reason"].as_str(), c["handledBy"].as_str()), (Some("pod"), Some("pod-b")), "{c}");
        assert!(tokens.iter().any(|t| c["token"] == t.as_str()));
    }
    assert!(holders(&db).await.is_empty(), "the dead pod's holders are gone");
    let counts: i64 = counters(&db).await.iter().map(|c| c.get_i64("count").unwrap_or(0)).sum();
    assert_eq!(counts, 0, "their slots are returned");
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_marks_the_pod_stopped_and_exits_cleanly() {
    let (uri, db) = test_database("sigterm").await;
    let mut a = BrainProcess::start(&uri, db.name(), "pod-a", &[]).await;
    assert!(a.terminate().await, "the brain did not exit successfully on SIGTERM");
    let pod = db.collection::<mongodb::bson::Document>("cluster_pods").find_one(doc! { "_id": "pod-a" }).await.unwrap();
    assert_eq!(pod.expect("registered").get_bool("stopped"), Ok(true));
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_clients_on_three_pods_never_exceed_a_cap_and_counters_end_equal_to_holders() {
    let (uri, db) = test_database("http_load").await;
    let pods = [
        BrainProcess::start(&uri, db.name(), "pod-a", &[]).await,
        BrainProcess::start(&uri, db.name(), "pod-b", &[]).await,
        BrainProcess::start(&uri, db.name(), "pod-c", &[]).await,
    ];
    let http = reqwest::Client::new();
    let (callback, _) = callback_server().await;
    // The definition is written once, through pod A, at the System layer; B and C use it on their next acquire.
    let caps = HashMap::from([("global", 3), ("tenant", 2), ("project", 1), ("user", 1)]);
    let r = http
        .put(format!("{}/internal/documents", pods[0].base))
        .header(INTERNAL_HEADER, INTERNAL_SECRET)
        .json(&json!({
            "tenantId": "_vance", "projectId": "_tenant", "path": "_vance/config/lease/hammer.yaml",
            "content": "name: hammer\nlevels: {global: 3, tenant: 2, project: 1, user: 1}\nwaitMs: 0\nttlSeconds: 60\n",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let stop = Arc::new(AtomicBool::new(false));
    let (granted, busy) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut clients = Vec::new();
    for i in 0..24 {
        let (http, base, callback) = (http.clone(), pods[i % 3].base.clone(), callback.clone());
        let (stop, granted, busy) = (stop.clone(), granted.clone(), busy.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (t, p, u) = {
                    let mut rng = rand::rng();
                    (rng.random_range(0..2), rng.random_range(0..2), rng.random_range(0..3))
                };
                let bearer = token(&format!("t{t}"), &format!("u{u}"));
                let body = webhook(json!("hammer"), &format!("p{p}"), &callback);
                let r = acquire(&http, &base, &bearer, &body).await;
                match r.status().as_u16() {
                    201 => {
                        granted.fetch_add(1, Ordering::Relaxed);
                        let lease = r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned();
                        let url = format!("{base}/api/v1/leases/{lease}");
                        assert_eq!(
                            http.post(format!("{url}/check")).bearer_auth(&bearer).send().await.unwrap().status(),
                            200
                        );
                        let released: Value =
                            http.delete(&url).bearer_auth(&bearer).send().await.unwrap().json().await.unwrap();
                        assert_eq!(released["status"], "ok");
                    }
                    429 => {
                        busy.fetch_add(1, Ordering::Relaxed);
                    }
                    s => panic!("unexpected status {s}: {}", r.text().await.unwrap_or_default()),
                }
            }
        }));
    }
    let sampler = {
        let (db, stop) = (db.clone(), stop.clone());
        tokio::spawn(async move {
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut booked: HashMap<String, i64> = HashMap::new();
                for h in holders(&db).await {
                    for l in h.get_array("levels").unwrap() {
                        *booked.entry(l.as_str().unwrap().to_owned()).or_default() += 1;
                    }
                }
                for (id, n) in booked {
                    let level = id.split('|').nth(1).unwrap();
                    assert!(n <= caps[level], "{n} holders book {id} (cap {})", caps[level]);
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            samples
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let samples = sampler.await.unwrap();
    let (granted, busy) = (granted.load(Ordering::Relaxed), busy.load(Ordering::Relaxed));
    eprintln!("granted {granted}, busy {busy}, samples {samples}");
    assert!(granted > 50 && busy > 0 && samples > 20, "too little contention to prove anything");
    assert!(holders(&db).await.is_empty());
    for c in counters(&db).await {
        assert_eq!(c.get_i64("count").unwrap(), 0, "counter {} drifted", c.get_str("_id").unwrap());
    }
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_pod_bound_compile_is_only_released_while_a_webhook_lease_runs_its_handler_on_the_reaper() {
    let (uri, db) = test_database("kill9_bound").await;
    // Jobs run for a minute: the compile is still polling when its pod dies.
    let double = DoubleProcess::start(0, 60_000).await;
    let env = [("BRAIN_TEX2PDF_URL", double.url.as_str())];
    let mut a = BrainProcess::start(&uri, db.name(), "pod-a", &env).await;
    let b = BrainProcess::start(&uri, db.name(), "pod-b", &env).await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let bearer = token("t1", "u1");
    let inline = json!({ "name": "job", "levels": { "project": 1 }, "ttlSeconds": 600 });
    granted_token(acquire(&http, &a.base, &bearer, &webhook(inline, "p1", &callback)).await).await;
    let compile = {
        let (http, url, bearer) = (http.clone(), format!("{}/api/v1/projects/p2/tex/compile", a.base), bearer.clone());
        tokio::spawn(async move { http.post(url).bearer_auth(bearer).json(&json!({ "source": "x" })).send().await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !holders(&db).await.iter().any(|h| h.get_str("type") == Ok("tex") && h.get_str("state") == Ok("HELD")) {
        assert!(tokio::time::Instant::now() < deadline, "the compile never held its lease");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let tex = holders(&db).await.into_iter().find(|h| h.get_str("type") == Ok("tex")).unwrap();
    assert_eq!(tex.get_bool("podBound"), Ok(true));

    a.kill9().await;
    assert!(compile.await.unwrap().is_err(), "the compile's pod is dead: its caller loses the connection");
    let calls = wait_for_callbacks(&seen, 1, Duration::from_secs(30)).await;
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0]["reason"].as_str(), calls[0]["handledBy"].as_str()), (Some("pod"), Some("pod-b")));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !holders(&db).await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the dead pod's tex holder was never reaped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The reaper dispatches a holder after deleting it: its metric may land just after the holders are gone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let text = http.get(format!("{}/metrics", b.base)).send().await.unwrap().text().await.unwrap();
        let dispatched = text.lines().filter(|l| l.starts_with("vance_lease_dispatch_total")).count();
        if dispatched >= 2 || tokio::time::Instant::now() >= deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let count = |outcome: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with("vance_lease_dispatch_total") && l.contains(&format!("outcome=\"{outcome}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(count("released-only"), 1.0, "the pod-bound compile is only released: {metrics}");
    assert_eq!(count("local"), 1.0, "the webhook lease's handler ran on the reaper pod");
    let total: i64 = counters(&db).await.iter().map(|c| c.get_i64("count").unwrap_or(0)).sum();
    assert_eq!(total, 0, "every slot of the dead pod is returned");
    let _ = db.drop().await;
}
