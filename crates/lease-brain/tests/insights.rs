//! Tenant Insights (spec §9) over real HTTP on loopback, lease state in the real MongoDB (one database per test):
//! the JSON endpoints' tenant binding, roles, drift and revocation, and the page in a real headless Chromium driven
//! by Playwright (`tests/browser/insights.cjs`), which leaves a screenshot in `target/test-output/`.

mod support;

use std::path::{Path, PathBuf};
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
        Path::new(default).exists(),
        "no Chromium: LEASE_CHROMIUM is unset and {default} is missing; run scripts/chromium.sh (or scripts/test.sh, \
         which runs it)"
    );
    default.to_owned()
}

/// The workspace root: home of `.cache/` and `target/`.
fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// playwright-core's package directory (the browser driver): `LEASE_PLAYWRIGHT_CORE`, else where
/// scripts/mcp-servers.sh installs it; never skipped.
fn playwright_core() -> PathBuf {
    if let Some(path) = std::env::var_os("LEASE_PLAYWRIGHT_CORE") {
        return path.into();
    }
    let default = workspace_root().join(".cache/npm/node_modules/playwright-core");
    assert!(
        default.join("package.json").exists(),
        "no playwright-core: LEASE_PLAYWRIGHT_CORE is unset and {} is missing; run scripts/mcp-servers.sh (or \
         scripts/test.sh, which runs it)",
        default.display()
    );
    default
}

/// Where tests leave files for CI to collect: `LEASE_TEST_OUTPUT`, else `<workspace>/target/test-output`.
fn test_output_dir() -> PathBuf {
    let dir = std::env::var_os("LEASE_TEST_OUTPUT")
        .map_or_else(|| workspace_root().join("target/test-output"), PathBuf::from);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// The tokens a page snapshot lists, as `data-token` of its holder rows.
fn listed(snapshot: &Value) -> Vec<String> {
    let mut tokens: Vec<String> =
        snapshot["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_owned()).collect();
    tokens.sort_unstable();
    tokens
}

fn sorted(tokens: &[&String]) -> Vec<String> {
    let mut v: Vec<String> = tokens.iter().map(|t| (*t).clone()).collect();
    v.sort_unstable();
    v
}

/// `HH:MM:SS`.
fn is_clock(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 8 && b[2] == b':' && b[5] == b':' && [0, 1, 3, 4, 6, 7].iter().all(|&i| b[i].is_ascii_digit())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_insights_page_signs_in_lists_the_tenants_leases_and_revokes_in_a_real_browser() {
    let binary = chromium();
    let driver = playwright_core();
    let screenshot = test_output_dir().join("insights-leases.png");
    // A screenshot of an earlier run must not pass for this one.
    let _ = std::fs::remove_file(&screenshot);
    let (uri, db) = test_database("insights_page").await;
    let mut pod = Pod::start(&uri, db.name(), "pod-a").await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let ([a_inline, a_named], [b_inline, b_named]) = two_tenants(&http, &pod.base, &callback).await;
    bump_counter(&db, "browser|user|ta/ua").await;
    let (admin_a, user_a, admin_b) = (admin_token("ta", "boss"), token("ta", "ua"), admin_token("tb", "boss"));

    let page = http.get(format!("{}/insights", pod.base)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = page.text().await.unwrap();
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"), "the page loads no external asset");

    // The browser session: the script waits for conditions and reports what it saw.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/insights.cjs");
    let mut node = tokio::process::Command::new("node");
    node.arg(&script)
        .env("LEASE_PLAYWRIGHT_CORE", &driver)
        .env("LEASE_CHROMIUM", &binary)
        .env("INSIGHTS_BASE", &pod.base)
        .env("INSIGHTS_ADMIN_A", &admin_a)
        .env("INSIGHTS_USER_A", &user_a)
        .env("INSIGHTS_ADMIN_B", &admin_b)
        .env("INSIGHTS_REVOKE", &a_inline)
        .env("INSIGHTS_FORGE", &a_named)
        .env("INSIGHTS_SCREENSHOT", &screenshot)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(180), node.output())
        .await
        .expect("the browser session did not finish within 180 s")
        .unwrap_or_else(|e| panic!("cannot run node {}: {e} (need Node.js 20+)", script.display()));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the browser session failed ({}):\n{stderr}\n{stdout}", out.status);
    let obs: Value = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON observations on stdout:\n{stdout}\nstderr:\n{stderr}"));
    eprintln!("chromium {} via playwright-core at {}", obs["browserVersion"], driver.display());

    // The page as served: the CSP forbids everything but itself.
    assert_eq!(obs["pageStatus"], 200);
    assert!(obs["csp"].as_str().is_some_and(|c| c.starts_with("default-src 'none'")), "{}", obs["csp"]);

    // Signed out: the sign-in form with a password field, no data, no token stored.
    let s = &obs["initial"];
    assert_eq!((s["state"].as_str(), s["refresh"].as_str()), (Some("signed-out"), Some("off")), "{s}");
    assert_eq!((s["signInVisible"].as_bool(), s["signOutVisible"].as_bool()), (Some(true), Some(false)), "{s}");
    assert_eq!((listed(s).len(), &s["storedToken"]), (0, &Value::Null), "{s}");
    assert_eq!(obs["tokenInputType"], "password");

    // A's ADMIN through the form: A's leases only, drift marked, no global counter, no payload value.
    let s = &obs["adminA"];
    assert_eq!(s["state"], "ready", "{s}");
    assert_eq!(listed(s), sorted(&[&a_inline, &a_named]), "{s}");
    let mut cells: Vec<String> =
        s["tokenCells"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_owned()).collect();
    cells.sort_unstable();
    assert_eq!(cells, listed(s), "each row shows its token");
    assert_eq!(s["revokeButtons"], 2);
    assert!(s["tenant"].as_str().is_some_and(|t| t.ends_with(" ta")), "{}", s["tenant"]);
    let text = s["text"].as_str().unwrap();
    for leaked in [b_inline.as_str(), b_named.as_str(), "browser|global|*", "s3cret-value", callback.as_str()] {
        assert!(!text.contains(leaked), "{leaked} shows on A's page:\n{text}");
    }
    let counters = s["counters"].as_array().unwrap();
    let ids: Vec<&str> = counters.iter().map(|c| c["cells"][0].as_str().unwrap()).collect();
    assert_eq!(ids, ["browser|tenant|ta", "browser|user|ta/ua", "mcp-inline:ta/pa/remote|project|ta/pa"]);
    let drifting = counters.iter().find(|c| c["cells"][0] == "browser|user|ta/ua").unwrap();
    assert_eq!(drifting["cells"], json!(["browser|user|ta/ua", "user", "2", "1", "DRIFT +1"]));
    assert_eq!(drifting["driftClass"], "drift");
    for c in counters.iter().filter(|c| c["cells"][0] != "browser|user|ta/ua") {
        assert_eq!(c["cells"][4], "", "no drift: {c}");
    }
    assert_eq!((s["signInVisible"].as_bool(), s["signOutVisible"].as_bool()), (Some(false), Some(true)), "{s}");
    assert_eq!((s["refresh"].as_str(), s["autoRefreshChecked"].as_bool()), (Some("on"), Some(true)), "{s}");
    // The token sits in the tab's sessionStorage only, not in the URL.
    assert_eq!(s["storedToken"].as_str(), Some(admin_a.as_str()));
    assert_eq!(s["localStorageKeys"], 0);
    assert_eq!(s["url"].as_str(), Some(format!("{}/insights", pod.base).as_str()));
    let updated = s["updated"].as_str().unwrap();
    assert!(updated.strip_prefix("updated ").is_some_and(is_clock), "{updated}");
    // Fits a 1366 px laptop screen.
    let (scroll, client) = (s["scrollWidth"].as_i64().unwrap(), s["clientWidth"].as_i64().unwrap());
    assert!(scroll <= client, "horizontal scroll at 1366 px: {scroll} > {client}");

    // Auto-refresh: a later load, without a page reload, same rows.
    let r = &obs["refreshed"];
    assert_eq!(r["state"], "ready");
    assert_ne!(r["updated"], s["updated"], "the page did not refresh");
    assert!(r["loads"].as_i64() > s["loads"].as_i64(), "{} loads then {}", s["loads"], r["loads"]);
    assert_eq!(obs["refreshedWithoutReload"], true);
    assert_eq!(listed(r), listed(s));

    // The screenshot: a PNG, taken with A's leases on screen.
    let png = std::fs::read(&screenshot).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", screenshot.display()));
    assert!(png.len() > 8 && png.starts_with(b"\x89PNG\r\n\x1a\n"), "{} is not a PNG", screenshot.display());
    eprintln!("screenshot: {} ({} bytes)", screenshot.display(), png.len());

    // Revoke through the row's button: one confirm naming the lease; the row goes, the other stays.
    let dialogs = obs["dialogs"].as_array().unwrap();
    assert_eq!(dialogs.len(), 1, "{dialogs:?}");
    assert_eq!(dialogs[0]["type"], "confirm");
    assert!(dialogs[0]["message"].as_str().unwrap().contains(a_inline.as_str()), "{}", dialogs[0]);
    let s = &obs["afterRevoke"];
    assert_eq!(s["state"], "ready", "{s}");
    assert_eq!(listed(s), [a_named.as_str()]);
    assert!(s["notice"].as_str().unwrap().starts_with(&format!("Revoked {a_inline}")), "{}", s["notice"]);

    // Sign-out leaves nothing of the session.
    for key in ["signedOutA", "signedOutUser"] {
        let s = &obs[key];
        assert_eq!((s["state"].as_str(), s["refresh"].as_str()), (Some("signed-out"), Some("off")), "{key}: {s}");
        assert_eq!((listed(s).len(), &s["storedToken"], s["signInVisible"].as_bool()), (0, &Value::Null, Some(true)));
        assert!(!s["text"].as_str().unwrap().contains(a_named.as_str()), "{key}: {s}");
    }

    // A non-admin token of A: refused with the server's code, and no refresh keeps hammering.
    let s = &obs["userA"];
    assert_eq!((s["state"].as_str(), s["refresh"].as_str()), (Some("error"), Some("off")), "{s}");
    assert!(s["error"].as_str().unwrap().contains("403 FORBIDDEN"), "{}", s["error"]);
    assert_eq!(listed(s).len(), 0);

    // B's ADMIN sees only B, and a revoke of A's lease forged from the page with B's bearer is NOT_FOUND.
    let s = &obs["adminB"];
    assert_eq!(s["state"], "ready", "{s}");
    assert_eq!(listed(s), sorted(&[&b_inline, &b_named]));
    assert!(s["tenant"].as_str().is_some_and(|t| t.ends_with(" tb")), "{}", s["tenant"]);
    let text = s["text"].as_str().unwrap();
    assert!(!text.contains(a_named.as_str()) && !text.contains("|ta"), "A shows on B's page:\n{text}");
    assert_eq!(obs["forged"]["status"], 404, "{}", obs["forged"]);
    assert!(obs["forged"]["body"].as_str().unwrap().contains("NOT_FOUND"), "{}", obs["forged"]);
    // The page never ran two loads at once.
    assert_eq!(s["maxInflight"], 1, "overlapping loads");

    // `#token=` in a new tab: signed in, the fragment gone from the URL, the token in sessionStorage, which a
    // reload keeps.
    for key in ["fragment", "fragmentReloaded"] {
        let s = &obs[key];
        assert_eq!(s["state"], "ready", "{key}: {s}");
        assert_eq!(s["url"].as_str(), Some(format!("{}/insights", pod.base).as_str()), "{key}");
        assert_eq!(s["storedToken"].as_str(), Some(admin_a.as_str()), "{key}");
        assert_eq!(listed(s), [a_named.as_str()], "{key}");
    }

    // No script error and no CSP violation; refused requests (the 403, the forged 404) are the only console errors.
    let console: Vec<&str> = obs["console"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .filter(|m| !m.contains("Failed to load resource"))
        .collect();
    assert!(console.is_empty(), "{console:#?}");

    // Server side: the revoked holder is gone and its handler ran with reason revoke; the forged revoke changed
    // nothing.
    let mut left: Vec<String> = holders(&db).await.iter().map(|h| h.get_str("_id").unwrap().to_owned()).collect();
    left.sort_unstable();
    assert_eq!(left, sorted(&[&a_named, &b_inline, &b_named]));
    let calls = wait_for_callbacks(&seen, 1).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!((calls[0]["token"].as_str(), calls[0]["reason"].as_str()), (Some(a_inline.as_str()), Some("revoke")));
    pod.stop().await;
    let _ = db.drop().await;
}
