//! Tenant Insights (spec §9) over real HTTP on loopback, lease state in the real MongoDB (one database per test):
//! the JSON endpoints' tenant binding, roles, drift and revocation, and the page in a real headless Chromium.

mod support;

use std::time::Duration;

use mongodb::bson::{Document, doc};
use serde_json::{Value, json};
use support::*;

/// A webhook lease of the bundled `browser` definition (levels global, tenant, user).
fn named_body(callback: &str, project: &str) -> Value {
    json!({
        "type": "webhook",
        "lease": "browser",
        "projectId": project,
        "holderRef": "job-named",
        "payload": { "callbackUrl": callback, "secret": "s3cret-value" },
    })
}

/// Acquires and returns the lease token.
async fn lease(http: &reqwest::Client, base: &str, bearer: &str, body: Value) -> String {
    let r = acquire(http, base, bearer, body).await;
    assert_eq!(r.status(), 201);
    r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned()
}

/// Two tenants with an inline (project level) and a named (global, tenant, user levels) lease each.
async fn two_tenants(http: &reqwest::Client, base: &str, callback: &str) -> ([String; 2], [String; 2]) {
    let (a, b) = (token("ta", "ua"), token("tb", "ub"));
    let a_leases = [
        lease(http, base, &a, webhook_body(callback, "pa")).await,
        lease(http, base, &a, named_body(callback, "pa")).await,
    ];
    let b_leases = [
        lease(http, base, &b, webhook_body(callback, "pb")).await,
        lease(http, base, &b, named_body(callback, "pb")).await,
    ];
    (a_leases, b_leases)
}

async fn get(http: &reqwest::Client, url: String, bearer: Option<&str>) -> reqwest::Response {
    let req = http.get(url);
    let req = match bearer {
        Some(b) => req.bearer_auth(b),
        None => req,
    };
    req.send().await.unwrap()
}

/// Inflates a counter directly in MongoDB: drift as a crash window leaves it.
async fn bump_counter(db: &mongodb::Database, id: &str) {
    let r = db
        .collection::<Document>("resource_lease_counters")
        .update_one(doc! { "_id": id }, doc! { "$inc": { "count": 1_i64 } })
        .await
        .unwrap();
    assert_eq!(r.matched_count, 1, "no counter {id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn insights_json_is_tenant_bound_admin_only_shows_drift_and_revokes() {
    let (uri, db) = test_database("insights_json").await;
    let mut pod = Pod::start(&uri, db.name(), "pod-a").await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let ([a_inline, a_named], [b_inline, b_named]) = two_tenants(&http, &pod.base, &callback).await;
    let admin = admin_token("ta", "boss");
    let leases_url = format!("{}/api/v1/insights/leases", pod.base);
    let counters_url = format!("{}/api/v1/insights/counters", pod.base);

    // Holders: only tenant A's, payload keys but never values.
    let r = get(&http, leases_url.clone(), Some(&admin)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["tenant"], "ta");
    let listed = v["holders"].as_array().unwrap();
    let mut tokens: Vec<&str> = listed.iter().map(|h| h["token"].as_str().unwrap()).collect();
    tokens.sort_unstable();
    let mut want = vec![a_inline.as_str(), a_named.as_str()];
    want.sort_unstable();
    assert_eq!(tokens, want);
    let named = listed.iter().find(|h| h["token"] == a_named.as_str()).unwrap();
    assert_eq!(
        (named["type"].as_str(), named["lease"].as_str(), named["resource"].as_str()),
        (Some("webhook"), Some("browser"), Some("browser"))
    );
    assert_eq!((named["project"].as_str(), named["user"].as_str()), (Some("pa"), Some("ua")));
    assert_eq!((named["pod"].as_str(), named["podBound"].as_bool()), (Some("pod-a"), Some(false)));
    assert_eq!(named["state"], "HELD");
    assert!(named["idleSeconds"].as_i64().is_some_and(|s| (0..60).contains(&s)), "{named}");
    assert_eq!(named["payloadKeys"], json!(["callbackUrl", "secret"]));
    let text = v.to_string();
    assert!(!text.contains("s3cret-value") && !text.contains(&callback), "payload values leaked: {text}");
    assert!(!text.contains(&b_inline) && !text.contains(&b_named) && !text.contains("\"tb"), "{text}");

    // Counters: A's tenant / project / user levels; no global, nothing of B; no drift yet.
    let counters = |bearer: String| {
        let (http, url) = (http.clone(), counters_url.clone());
        async move { get(&http, url, Some(&bearer)).await.json::<Value>().await.unwrap() }
    };
    let v = counters(admin.clone()).await;
    let ids: Vec<&str> = v["counters"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["browser|tenant|ta", "browser|user|ta/ua", "mcp-inline:ta/pa/remote|project|ta/pa"]);
    for c in v["counters"].as_array().unwrap() {
        assert_eq!((c["count"].as_i64(), c["booked"].as_i64(), c["drift"].as_i64()), (Some(1), Some(1), Some(0)));
    }
    assert!(
        db.collection::<Document>("resource_lease_counters")
            .find_one(doc! { "_id": "browser|global|*" })
            .await
            .unwrap()
            .is_some()
    );

    bump_counter(&db, "browser|tenant|ta").await;
    let v = counters(admin.clone()).await;
    let c = v["counters"].as_array().unwrap().iter().find(|c| c["id"] == "browser|tenant|ta").unwrap().clone();
    assert_eq!((c["count"].as_i64(), c["booked"].as_i64(), c["drift"].as_i64()), (Some(2), Some(1), Some(1)));
    assert_eq!((c["level"].as_str(), c["scope"].as_str()), (Some("tenant"), Some("ta")));

    // Authentication and the ADMIN role.
    for url in [&leases_url, &counters_url] {
        let r = get(&http, url.clone(), None).await;
        assert_eq!(r.status(), 401);
        assert_eq!(r.json::<Value>().await.unwrap()["code"], "UNAUTHORIZED");
        let r = get(&http, url.clone(), Some(&token("ta", "ua"))).await;
        assert_eq!(r.status(), 403);
        assert_eq!(r.json::<Value>().await.unwrap()["code"], "FORBIDDEN");
    }
    let revoke_url = |t: &str| format!("{}/api/v1/insights/leases/{t}/revoke", pod.base);
    let r = http.post(revoke_url(&a_inline)).bearer_auth(token("ta", "ua")).send().await.unwrap();
    assert_eq!(r.status(), 403, "revoke without ADMIN");
    let r = http.post(revoke_url(&a_inline)).send().await.unwrap();
    assert_eq!(r.status(), 401, "revoke without a token");

    // Revocation: another tenant's or an unknown token is NOT_FOUND and changes nothing.
    let before = holders(&db).await;
    for t in [b_inline.as_str(), "no-such-token"] {
        let r = http.post(revoke_url(t)).bearer_auth(&admin).send().await.unwrap();
        assert_eq!(r.status(), 404, "{t}");
        assert_eq!(r.json::<Value>().await.unwrap()["code"], "NOT_FOUND");
    }
    assert_eq!(holders(&db).await, before, "a refused revoke changed a holder");

    // Revoking an own holder: gone, its slots returned, its webhook called back with reason revoke.
    let r = http.post(revoke_url(&a_inline)).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "revoked");
    let left: Vec<String> =
        holders(&db).await.iter().map(|h| h.get_str("_id").unwrap_or_default().to_owned()).collect();
    let tokens_left = get(&http, leases_url.clone(), Some(&admin)).await.json::<Value>().await.unwrap();
    let tokens_left: Vec<&str> =
        tokens_left["holders"].as_array().unwrap().iter().map(|h| h["token"].as_str().unwrap()).collect();
    assert_eq!(tokens_left, [a_named.as_str()], "db holders: {left:?}");
    let calls = wait_for_callbacks(&seen, 1).await;
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0]["token"].as_str(), calls[0]["reason"].as_str()), (Some(a_inline.as_str()), Some("revoke")));
    let v = counters(admin.clone()).await;
    let c =
        v["counters"].as_array().unwrap().iter().find(|c| c["id"] == "mcp-inline:ta/pa/remote|project|ta/pa").cloned();
    assert_eq!(c.map(|c| (c["count"].as_i64(), c["booked"].as_i64())), Some((Some(0), Some(0))), "slot returned");
    let check = http
        .post(format!("{}/api/v1/leases/{a_inline}/check", pod.base))
        .bearer_auth(token("ta", "ua"))
        .send()
        .await
        .unwrap();
    assert_eq!(check.status(), 410, "the revoked holder learns at its next check");
    assert_eq!(holders(&db).await.len(), 3, "B's holders are untouched");
    pod.stop().await;
    let _ = db.drop().await;
}

/// The Chromium binary: `LEASE_CHROMIUM`, else Debian's `/usr/bin/chromium`; never skipped.
fn chromium() -> String {
    if let Ok(path) = std::env::var("LEASE_CHROMIUM") {
        return path;
    }
    let default = "/usr/bin/chromium";
    assert!(
        std::path::Path::new(default).exists(),
        "no Chromium: LEASE_CHROMIUM is unset and {default} is missing; run scripts/chromium.sh (or scripts/test.sh, \
         which runs it)"
    );
    default.to_owned()
}

/// The DOM of `url` once its load finished (`<body data-state="ready">` or `"error"`), by headless Chromium.
/// `--virtual-time-budget` lets the page's fetches run before the dump; should a dump still come early, it is
/// taken again (bounded).
async fn dump_dom(url: &str) -> String {
    let binary = chromium();
    let mut last = String::new();
    for attempt in 0..5 {
        // A fresh profile per run, removed afterwards.
        let profile = std::env::temp_dir().join(format!("lease-chromium-{}-{:x}", std::process::id(), rand_u32()));
        std::fs::create_dir_all(&profile).unwrap();
        let mut cmd = tokio::process::Command::new(&binary);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--virtual-time-budget=10000", "--dump-dom", url])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
            .await
            .unwrap_or_else(|_| panic!("chromium ({binary}) did not finish within 90 s"))
            .unwrap_or_else(|e| panic!("cannot run chromium ({binary}): {e}; run scripts/chromium.sh"));
        let _ = std::fs::remove_dir_all(&profile);
        last = String::from_utf8_lossy(&out.stdout).into_owned();
        if last.contains(r#"data-state="ready""#) || last.contains(r#"data-state="error""#) {
            return last;
        }
        eprintln!(
            "chromium dump {attempt} not finished (exit {:?}); stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    panic!("the page never finished loading in chromium; last dump:\n{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_insights_page_renders_the_tenants_leases_and_drift_in_a_real_browser() {
    let binary = chromium();
    let (uri, db) = test_database("insights_page").await;
    let mut pod = Pod::start(&uri, db.name(), "pod-a").await;
    let http = reqwest::Client::new();
    let (callback, _) = callback_server().await;
    let (a_leases, b_leases) = two_tenants(&http, &pod.base, &callback).await;
    bump_counter(&db, "browser|user|ta/ua").await;

    let page = http.get(format!("{}/insights", pod.base)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = page.text().await.unwrap();
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"), "the page loads no external asset");

    let url = format!("{}/insights#token={}", pod.base, admin_token("ta", "boss"));
    let dom = dump_dom(&url).await;
    assert!(dom.contains(r#"data-state="ready""#), "{binary}: the page did not render: {dom}");
    for t in &a_leases {
        assert!(dom.contains(t.as_str()), "tenant A's lease {t} is missing: {dom}");
    }
    for t in &b_leases {
        assert!(!dom.contains(t.as_str()), "tenant B's lease {t} leaked into A's page");
    }
    assert!(dom.contains("DRIFT +1") && dom.contains(r#"class="drift""#), "no drift marker: {dom}");
    assert!(dom.contains("browser|user|ta/ua") && !dom.contains("browser|global|*"), "{dom}");
    assert!(dom.contains(">Revoke</button>"), "no revoke buttons: {dom}");
    assert!(!dom.contains("s3cret-value"), "a payload value reached the page");

    // Without the ADMIN role the page says so.
    let dom = dump_dom(&format!("{}/insights#token={}", pod.base, token("ta", "ua"))).await;
    assert!(dom.contains(r#"data-state="error""#) && dom.contains("403 FORBIDDEN"), "{dom}");
    pod.stop().await;
    let _ = db.drop().await;
}
