//! The operator CLI (`anus`, spec §9) as a real process against brain processes: reading MongoDB directly, acting
//! through the brains' admin endpoints (handlers run), `--force` with no brain left, drift from a crash window and
//! its repair, exit codes; and against a brain on the embedded store, where every read goes through the brain.

use std::collections::BTreeSet;
use std::time::Duration;

use mongodb::bson::{Document, doc};
use serde_json::{Value, json};
use tests::{
    AnusRun, BrainProcess, INTERNAL_SECRET, anus, callback_server, free_port, holders, test_database, token,
    wait_for_callbacks,
};

/// Exit codes of `anus` (its `--help` lists them).
const BAD_INPUT: i32 = 2;
const NOT_FOUND: i32 = 3;
const UNREACHABLE: i32 = 4;
const REFUSED: i32 = 5;

async fn lease(http: &reqwest::Client, base: &str, bearer: &str, body: Value) -> String {
    let r = http.post(format!("{base}/api/v1/leases")).bearer_auth(bearer).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 201);
    r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_owned()
}

/// A webhook lease of an inline definition capped at the project level.
fn inline(project: &str, callback: &str) -> Value {
    json!({
        "type": "webhook", "projectId": project, "payload": { "callbackUrl": callback },
        "inline": { "name": "job", "levels": { "project": 1 } },
    })
}

/// A webhook lease of the bundled `browser` definition (global, tenant and user levels).
fn browser(project: &str, callback: &str) -> Value {
    json!({ "type": "webhook", "lease": "browser", "projectId": project, "payload": { "callbackUrl": callback } })
}

fn tokens_of(list: &Value) -> BTreeSet<String> {
    list["holders"].as_array().unwrap().iter().map(|r| r["holder"]["token"].as_str().unwrap().to_owned()).collect()
}

fn set(tokens: &[&String]) -> BTreeSet<String> {
    tokens.iter().map(|t| (*t).clone()).collect()
}

/// The counter row `id` of a `counters --json` run.
fn counter<'a>(counters: &'a Value, id: &str) -> &'a Value {
    counters["counters"].as_array().unwrap().iter().find(|c| c["id"] == id).unwrap_or_else(|| panic!("no {id}"))
}

fn drifted(counters: &Value) -> Vec<String> {
    let rows = counters["counters"].as_array().unwrap();
    rows.iter().filter(|c| c["drift"] != 0).map(|c| c["id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_command_against_brain_processes_and_mongodb() {
    let (uri, db) = test_database("operator_cli").await;
    let mut a = BrainProcess::start(&uri, db.name(), "pod-a", &[]).await;
    let mut b = BrainProcess::start(&uri, db.name(), "pod-b", &[]).await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let (t1, t2, t3) = (token("t1", "u1"), token("t2", "u2"), token("t3", "u3"));
    let t1_p1 = lease(&http, &a.base, &t1, inline("p1", &callback)).await;
    let t1_p2 = lease(&http, &a.base, &t1, inline("p2", &callback)).await;
    let t3_p1 = lease(&http, &a.base, &t3, inline("p1", &callback)).await;
    let t1_browser = lease(&http, &b.base, &t1, browser("p1", &callback)).await;
    let t2_browser = lease(&http, &b.base, &t2, browser("p9", &callback)).await;

    let (name, a_base) = (db.name().to_owned(), a.base.clone());
    let env = [
        ("BRAIN_MONGODB_URI", uri.as_str()),
        ("BRAIN_MONGODB_DATABASE", name.as_str()),
        ("ANUS_BRAIN_URL", a_base.as_str()),
        ("BRAIN_INTERNAL_SECRET", INTERNAL_SECRET),
        ("BRAIN_HEARTBEAT_STALENESS_MS", "1500"),
    ];
    let run = |args: &'static [&'static str]| anus(&env, args);

    // list: every filter, JSON and table.
    let all = run(&["lease", "list", "--json"]).await.ok().json();
    assert_eq!(tokens_of(&all), set(&[&t1_p1, &t1_p2, &t3_p1, &t1_browser, &t2_browser]));
    assert!(all["holders"].as_array().unwrap().iter().all(|r| r["podAlive"] == true), "{all}");
    // `env` is Copy: each future owns its copy.
    let filtered = |args: Vec<&'static str>| async move {
        let mut args = args;
        args.extend(["--json"]);
        tokens_of(&anus(&env, &args).await.ok().json())
    };
    assert_eq!(filtered(vec!["lease", "list", "--tenant", "t1"]).await, set(&[&t1_p1, &t1_p2, &t1_browser]));
    assert_eq!(filtered(vec!["lease", "list", "--pod", "pod-b"]).await, set(&[&t1_browser, &t2_browser]));
    assert_eq!(filtered(vec!["lease", "list", "--resource", "browser"]).await, set(&[&t1_browser, &t2_browser]));
    assert_eq!(filtered(vec!["lease", "list", "--tenant", "t2", "--resource", "browser"]).await, set(&[&t2_browser]));
    assert_eq!(filtered(vec!["lease", "list", "--type", "webhook"]).await.len(), 5);
    assert!(filtered(vec!["lease", "list", "--type", "tex"]).await.is_empty());
    let table = anus(&env, &["lease", "list", "--pod", "pod-a"]).await.ok().stdout;
    assert!(table.starts_with("TOKEN"), "{table}");
    assert_eq!(table.lines().count(), 4, "header and three holders: {table}");
    assert!(table.lines().skip(1).all(|l| l.contains("pod-a (alive)")), "{table}");

    // show: the whole holder; an unknown token is NOT_FOUND.
    let shown = anus(&env, &["lease", "show", &t2_browser, "--json"]).await.ok().json();
    let h = &shown["holder"];
    assert_eq!(
        (h["tenantId"].as_str(), h["userId"].as_str(), h["pod"].as_str()),
        (Some("t2"), Some("u2"), Some("pod-b"))
    );
    assert_eq!(h["levels"], json!(["browser|user|t2/u2", "browser|tenant|t2", "browser|global|*"]));
    assert_eq!(h["payload"]["callbackUrl"], callback.as_str());
    assert_eq!(shown["podAlive"], true);
    let text = anus(&env, &["lease", "show", &t2_browser]).await.ok().stdout;
    assert!(text.contains(&format!("token:      {t2_browser}")) && text.contains("pod-b (alive)"), "{text}");
    let missing = run(&["lease", "show", "no-such-token"]).await;
    assert_eq!(missing.code, NOT_FOUND, "{missing:?}");

    // counters: the global level included, BOOKED equal to COUNT while nothing crashed.
    let counters = run(&["lease", "counters", "--json"]).await.ok().json();
    assert!(drifted(&counters).is_empty(), "{counters}");
    let global = counter(&counters, "browser|global|*");
    assert_eq!((global["count"].as_i64(), global["booked"].as_i64()), (Some(2), Some(2)));
    assert_eq!((global["level"].as_str(), global["scope"].as_str()), (Some("global"), Some("*")));

    // A crash window: a release that died between deleting its holder and decrementing its levels.
    let deleted = db.collection::<Document>("resource_lease_holders").delete_one(doc! { "_id": &t2_browser }).await;
    assert_eq!(deleted.unwrap().deleted_count, 1);
    let counters = run(&["lease", "counters", "--json"]).await.ok().json();
    let mut drift = drifted(&counters);
    drift.sort();
    assert_eq!(drift, ["browser|global|*", "browser|tenant|t2", "browser|user|t2/u2"]);
    let global = counter(&counters, "browser|global|*");
    assert_eq!(
        (global["count"].as_i64(), global["booked"].as_i64(), global["drift"].as_i64()),
        (Some(2), Some(1), Some(1))
    );
    let table = run(&["lease", "counters", "--resource", "browser"]).await.ok().stdout;
    let line = table.lines().find(|l| l.starts_with("browser|global|*")).expect("the global counter is listed");
    assert!(line.ends_with("DRIFT +1"), "{table}");
    assert!(!table.contains("mcp-inline"), "the resource filter let another resource through: {table}");

    // definition: merged anew from every layer; a tenant-layer document written through the brain shows at once.
    let tex = run(&["lease", "definition", "tex", "--tenant", "t1", "--project", "p1", "--json"]).await.ok().json();
    assert_eq!(tex["resource"], "tex2pdf");
    assert_eq!(tex["levels"], json!({ "global": 6, "tenant": 3, "project": 1, "user": null }));
    let doc_file = std::env::temp_dir().join(format!("anus-tex-{}.yaml", std::process::id()));
    std::fs::write(&doc_file, "name: tex\nlevels:\n  tenant: 2\n").unwrap();
    let path = doc_file.to_str().unwrap();
    let key = ["--tenant", "t1", "--project", "_tenant"];
    let put = [&["config", "put", "_vance/config/lease/tex.yaml", path][..], &key[..]].concat();
    anus(&env, &put).await.ok();
    let get = [&["config", "get", "_vance/config/lease/tex.yaml"][..], &key[..]].concat();
    assert_eq!(anus(&env, &get).await.ok().stdout, "name: tex\nlevels:\n  tenant: 2\n");
    let tex = run(&["lease", "definition", "tex", "--tenant", "t1", "--project", "p1", "--json"]).await.ok().json();
    assert_eq!(tex["levels"]["tenant"], 2);
    let text = run(&["lease", "definition", "tex", "--tenant", "t2", "--project", "p1"]).await.ok().stdout;
    assert!(text.contains("global 6  tenant 3  project 1  user -"), "another tenant sees the default: {text}");
    let delete = [&["config", "delete", "_vance/config/lease/tex.yaml", "--json"][..], &key[..]].concat();
    assert_eq!(anus(&env, &delete).await.ok().json()["status"], "deleted");
    assert_eq!(anus(&env, &get).await.code, NOT_FOUND);
    let _ = std::fs::remove_file(&doc_file);
    let bad = run(&["lease", "definition", "bad name!", "--tenant", "t1", "--project", "p1"]).await;
    assert_eq!(bad.code, BAD_INPUT, "{bad:?}");
    assert!(bad.stderr.contains("bad name!"), "{bad:?}");
    assert_eq!(run(&["lease", "definition", "nosuch", "--tenant", "t1", "--project", "p1"]).await.code, NOT_FOUND);

    // revoke through the brain: refused without the secret; another tenant's filter finds nothing; then revoked
    // and its handler runs; a second revoke is NOT_FOUND.
    let mut wrong = env;
    wrong[3] = ("BRAIN_INTERNAL_SECRET", "wrong-secret-wrong-secret");
    let refused = anus(&wrong, &["lease", "revoke", &t1_p1]).await;
    assert_eq!(refused.code, REFUSED, "{refused:?}");
    let foreign = anus(&env, &["lease", "revoke", &t1_p1, "--tenant", "t2"]).await;
    assert_eq!(foreign.code, NOT_FOUND, "{foreign:?}");
    assert_eq!(holders(&db).await.len(), 4, "a refused revoke changed a holder");
    let revoked = anus(&env, &["lease", "revoke", &t1_p1, "--json"]).await.ok().json();
    assert_eq!((revoked["via"].as_str(), revoked["handlerRan"].as_bool()), (Some("brain"), Some(true)));
    let calls = wait_for_callbacks(&seen, 1, Duration::from_secs(10)).await;
    assert_eq!((calls[0]["token"].as_str(), calls[0]["reason"].as_str()), (Some(t1_p1.as_str()), Some("revoke")));
    assert_eq!(anus(&env, &["lease", "revoke", &t1_p1]).await.code, NOT_FOUND);

    // revoke-pod through pod-a for pod-b's holders: dispatched to pod-b, which runs the handler.
    let r = run(&["lease", "revoke-pod", "pod-b", "--json"]).await.ok().json();
    assert_eq!(r["tokens"], json!([t1_browser]));
    let calls = wait_for_callbacks(&seen, 2, Duration::from_secs(10)).await;
    assert_eq!(
        (calls[1]["token"].as_str(), calls[1]["handledBy"].as_str()),
        (Some(t1_browser.as_str()), Some("pod-b"))
    );

    // sweep: a reaper round on the brain (nothing idle, nobody dead); its reconcile keeps the 60 s margin.
    let sweep = run(&["lease", "sweep", "--json"]).await.ok().json();
    assert_eq!((sweep["idle"].as_u64(), sweep["pod"].as_u64()), (Some(0), Some(0)), "{sweep}");
    assert!(sweep["reconcile"]["examined"].as_u64().is_some_and(|n| n > 0), "{sweep}");
    assert!(!drifted(&run(&["lease", "counters", "--json"]).await.ok().json()).is_empty(), "the margin held");

    // reconcile (directly in MongoDB, no brain involved) repairs the crash window's drift.
    let report = run(&["lease", "reconcile", "--safety-ms", "0", "--json"]).await.ok().json();
    let mut corrected: Vec<&str> =
        report["corrected"].as_array().unwrap().iter().map(|c| c["counter"].as_str().unwrap()).collect();
    corrected.sort_unstable();
    assert_eq!(corrected, ["browser|global|*", "browser|tenant|t2", "browser|user|t2/u2"], "{report}");
    let counters = run(&["lease", "counters", "--json"]).await.ok().json();
    assert!(drifted(&counters).is_empty(), "{counters}");
    assert!(!run(&["lease", "counters"]).await.ok().stdout.contains("DRIFT"));

    // No brain left: acting through one is UNREACHABLE (and says --force); --force acts in MongoDB, no handler.
    a.kill9().await;
    b.kill9().await;
    let dead = anus(&env, &["lease", "revoke", &t1_p2]).await;
    assert_eq!(dead.code, UNREACHABLE, "{dead:?}");
    assert!(dead.stderr.contains("--force"), "{dead:?}");
    let dead_pods = async {
        for _ in 0..200 {
            let list = run(&["lease", "list", "--json"]).await.ok().json();
            if list["holders"].as_array().unwrap().iter().all(|r| r["podAlive"] == false) {
                return list;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the killed pods never showed as dead");
    };
    assert_eq!(tokens_of(&dead_pods.await), set(&[&t1_p2, &t3_p1]));
    let forced = anus(&env, &["lease", "revoke", &t1_p2, "--force"]).await.ok();
    assert!(forced.stdout.contains("directly in MongoDB") && forced.stdout.contains("no handler ran"), "{forced:?}");
    let forced = run(&["lease", "revoke-pod", "pod-a", "--force", "--json"]).await.ok().json();
    assert_eq!((forced["count"].as_u64(), forced["handlerRan"].as_bool()), (Some(1), Some(false)));
    assert_eq!(forced["tokens"], json!([t3_p1]));
    assert!(forced["note"].as_str().unwrap().contains("no handler ran"));
    assert!(holders(&db).await.is_empty());
    assert_eq!(seen.lock().unwrap().len(), 2, "a forced revocation ran a handler");
    let counters = run(&["lease", "counters", "--json"]).await.ok().json();
    assert!(counters["counters"].as_array().unwrap().iter().all(|c| c["count"] == 0), "slots freed: {counters}");

    // Bad input and an unreachable MongoDB have their own exit codes.
    assert_eq!(run(&["lease", "list", "--bogus"]).await.code, BAD_INPUT);
    let closed = format!("mongodb://127.0.0.1:{}/?serverSelectionTimeoutMS=300", free_port());
    let unreachable = anus(&[("BRAIN_MONGODB_URI", closed.as_str())], &["lease", "list"]).await;
    assert_eq!(unreachable.code, UNREACHABLE, "{unreachable:?}");
    let bad_uri = anus(&[("BRAIN_MONGODB_URI", "not-a-uri")], &["lease", "list"]).await;
    assert_eq!(bad_uri.code, BAD_INPUT, "{bad_uri:?}");
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_read_goes_through_a_brain_on_the_embedded_store() {
    let brain = BrainProcess::start_embedded("solo", &[]).await;
    let http = reqwest::Client::new();
    let (callback, seen) = callback_server().await;
    let t1 = token("t1", "u1");
    let job = lease(&http, &brain.base, &t1, inline("p1", &callback)).await;
    let web = lease(&http, &brain.base, &t1, browser("p1", &callback)).await;
    // No MongoDB URI: the brain answers every read.
    let env = [("ANUS_BRAIN_URL", brain.base.as_str()), ("BRAIN_INTERNAL_SECRET", INTERNAL_SECRET)];
    let run = |args: &'static [&'static str]| anus(&env, args);

    let list = run(&["lease", "list", "--json"]).await.ok().json();
    assert_eq!(tokens_of(&list), set(&[&job, &web]));
    assert!(list["holders"].as_array().unwrap().iter().all(|r| r["podAlive"] == true), "{list}");
    let list = run(&["lease", "list", "--resource", "browser", "--tenant", "t1", "--json"]).await.ok().json();
    assert_eq!(tokens_of(&list), set(&[&web]));
    let shown = anus(&env, &["lease", "show", &web, "--json"]).await.ok().json();
    assert_eq!(shown["holder"]["levels"], json!(["browser|user|t1/u1", "browser|tenant|t1", "browser|global|*"]));
    assert_eq!(run(&["lease", "show", "no-such-token"]).await.code, NOT_FOUND);
    let counters = run(&["lease", "counters", "--json"]).await.ok().json();
    assert_eq!(counter(&counters, "browser|global|*")["booked"], 1);
    assert!(drifted(&counters).is_empty(), "{counters}");
    let def = run(&["lease", "definition", "browser", "--tenant", "t1", "--project", "p1", "--json"]).await.ok().json();
    assert_eq!(def["levels"], json!({ "global": 20, "tenant": 5, "project": null, "user": 1 }));
    assert_eq!(run(&["lease", "definition", "bad name!", "--tenant", "t", "--project", "p"]).await.code, BAD_INPUT);

    let doc_file = std::env::temp_dir().join(format!("anus-browser-{}.yaml", std::process::id()));
    std::fs::write(&doc_file, "name: browser\nlevels:\n  user: 2\n").unwrap();
    anus(&env, &["config", "put", "_vance/config/lease/browser.yaml", doc_file.to_str().unwrap()]).await.ok();
    let _ = std::fs::remove_file(&doc_file);
    let def = run(&["lease", "definition", "browser", "--tenant", "t1", "--project", "p1", "--json"]).await.ok().json();
    assert_eq!(def["levels"]["user"], 2, "the System layer's document counts at once");

    anus(&env, &["lease", "revoke", &job]).await.ok();
    let calls = wait_for_callbacks(&seen, 1, Duration::from_secs(10)).await;
    assert_eq!(calls[0]["token"], job.as_str());
    let sweep = run(&["lease", "sweep", "--json"]).await.ok().json();
    assert_eq!(sweep["idle"], 0);
    let report = run(&["lease", "reconcile", "--safety-ms", "0", "--json"]).await.ok().json();
    assert_eq!(report["corrected"], json!([]), "{report}");
    let forced: AnusRun = anus(&env, &["lease", "revoke", &web, "--force"]).await;
    assert_eq!(forced.code, BAD_INPUT, "--force needs MongoDB: {forced:?}");
    assert_eq!(tokens_of(&run(&["lease", "list", "--json"]).await.ok().json()), set(&[&web]));
}
