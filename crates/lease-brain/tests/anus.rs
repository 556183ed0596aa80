//! The operator CLI (`anus lease …`) as a real process against the real MongoDB and an in-process brain.

mod support;

use std::time::Duration;

use mongodb::bson::doc;
use serde_json::Value;
use support::*;

async fn anus(uri: &str, db: &str, brain: &str, secret: &str, args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_anus"))
        .env_clear()
        .env("BRAIN_MONGODB_URI", uri)
        .env("BRAIN_MONGODB_DATABASE", db)
        .env("ANUS_BRAIN_URL", brain)
        .env("BRAIN_INTERNAL_SECRET", secret)
        .arg("lease")
        .args(args)
        .output()
        .await
        .expect("run anus");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_lists_counts_shows_definitions_revokes_and_reconciles() {
    let (uri, db) = test_database("anus").await;
    let mut pod = Pod::start(&uri, db.name(), "pod-a").await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let bearer = token("t1", "u1");
    let mut leases = Vec::new();
    for p in ["p1", "p2", "p3"] {
        let r = acquire(&http, &pod.base, &bearer, webhook_body(&callback, p)).await;
        leases.push(r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned());
    }
    let (base, name) = (pod.base.clone(), db.name().to_owned());
    let run = |secret: &str, args: &[&str]| {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let (uri, name, base, secret) = (uri.clone(), name.clone(), base.clone(), secret.to_owned());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            anus(&uri, &name, &base, &secret, &args).await
        }
    };

    let (ok, out) = run(INTERNAL_SECRET, &["list", "--tenant", "t1"]).await;
    assert!(ok, "{out}");
    assert!(leases.iter().all(|t| out.contains(t.as_str())), "{out}");
    assert!(out.contains("pod-a (alive)"), "{out}");
    let (_, out) = run(INTERNAL_SECRET, &["list", "--tenant", "someone-else"]).await;
    assert!(!out.contains(leases[0].as_str()), "the tenant filter let another tenant's lease through: {out}");

    // Drift made by hand shows up beside the booked holders.
    let counters = db.collection::<mongodb::bson::Document>("resource_lease_counters");
    let drifted = "mcp-inline:t1/p1/remote|project|t1/p1";
    counters.update_one(doc! { "_id": drifted }, doc! { "$inc": { "count": 1_i64 } }).await.unwrap();
    let (ok, out) = run(INTERNAL_SECRET, &["counters"]).await;
    assert!(ok, "{out}");
    let line = out.lines().find(|l| l.starts_with(drifted)).expect("the counter is listed");
    assert!(line.contains("DRIFT +1"), "{line}");

    let (ok, out) = run(INTERNAL_SECRET, &["definition", "tex", "--tenant", "t1", "--project", "p1"]).await;
    assert!(ok && out.contains("resource: tex2pdf") && out.contains("global=Some(6)"), "{out}");

    // Through the brain: the handler runs. Without the secret: refused, nothing revoked.
    let (ok, out) = run("wrong-secret-wrong-secret", &["revoke", &leases[0]]).await;
    assert!(!ok && out.contains("401"), "{out}");
    let (ok, out) = run(INTERNAL_SECRET, &["revoke", &leases[0]]).await;
    assert!(ok, "{out}");
    assert_eq!(wait_for_callbacks(&seen, 1).await.len(), 1);

    // --force: directly in MongoDB, no handler.
    let (ok, out) = run(INTERNAL_SECRET, &["revoke-pod", "pod-a", "--force"]).await;
    assert!(ok && out.contains("revoked 2 holders") && out.contains("no handler ran"), "{out}");
    assert!(holders(&db).await.is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen.lock().unwrap().len(), 1, "a forced revocation ran a handler");

    // The hand-made drift is repaired by reconcile (safety margin shortened for the test).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (ok, out) = run(INTERNAL_SECRET, &["reconcile", "--safety-ms", "10"]).await;
    assert!(ok && out.contains(drifted), "{out}");
    let (_, out) = run(INTERNAL_SECRET, &["counters"]).await;
    assert!(!out.contains("DRIFT"), "{out}");
    pod.stop().await;
    let _ = db.drop().await;
}
