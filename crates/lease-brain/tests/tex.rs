//! The tex add-on: the tex2pdf client against the test double, the compile flow on the in-memory store (where a
//! revocation can be delivered without touching the lease), and real brain pods in-process over loopback HTTP
//! with lease state in the real MongoDB (one database per test) and one shared test double as "the service".

mod support;

/// A TCP forwarder in front of the test mongod that can be cut: the store goes away for one pod only.
#[path = "../../lease-shared/tests/support/proxy.rs"]
mod proxy;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use addon_tex::{
    AbortCause, ClientError, CompileConfig, CompileError, CompileRequest, JobState, Tex2PdfClient, TexCompileTracker,
    TexCompiler, TexLeaseHandler,
};
use futures_util::future::join_all;
use lease_brain::dispatch::RevokedHolder;
use lease_brain::tex2pdf_double::{self, DoubleConfig, DoubleHandle, source_hash};
use lease_shared::config::SETTINGS_PATH;
use lease_shared::store::{HolderRecord, HolderState};
use lease_shared::{
    Classpath, LayeredDefinitions, LeaseHandler, LeaseStore, MemoryDocumentStore, MemoryStore, ResourceLeaseService,
    RevocationReason,
};
use mongodb::bson::{Document, doc};
use proxy::CutProxy;
use serde_json::{Value, json};
use support::{INTERNAL_SECRET, Pod, free_port, test_database, token};

const SECRET_HEADER: &str = "x-vance-internal-secret";

// ---------------------------------------------------------------------------------------------------------------
// Harness

async fn double(max_concurrent: Option<usize>, job_duration: Duration) -> DoubleHandle {
    let config = DoubleConfig { max_concurrent, job_duration, ..DoubleConfig::default() };
    tex2pdf_double::start(SocketAddr::from(([127, 0, 0, 1], 0)), config).await.unwrap()
}

/// A pod whose tex add-on compiles against `tex2pdf_url`.
async fn tex_pod(uri: &str, db: &str, pod_id: &str, tex2pdf_url: &str) -> Pod {
    Pod::start_with(uri, db, pod_id, &[("BRAIN_TEX2PDF_URL", tex2pdf_url)]).await
}

/// A compile's HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    job_id: Option<String>,
    retry_after: Option<String>,
    bytes: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
    }

    fn code(&self) -> Option<String> {
        self.json()["code"].as_str().map(str::to_owned)
    }

    fn is_pdf_of(&self, source: &str) -> bool {
        self.status == 200
            && self.content_type == "application/pdf"
            && self.bytes.starts_with(b"%PDF-")
            && String::from_utf8_lossy(&self.bytes).contains(&source_hash(source))
    }
}

async fn compile(http: &reqwest::Client, base: &str, bearer: &str, project: &str, body: Value) -> Answer {
    let r = http
        .post(format!("{base}/api/v1/projects/{project}/tex/compile"))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap();
    let header = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (status, content_type) = (r.status().as_u16(), header("content-type").unwrap_or_default());
    let (job_id, retry_after) = (header("x-tex-job-id"), header("retry-after"));
    Answer { status, content_type, job_id, retry_after, bytes: r.bytes().await.unwrap().to_vec() }
}

async fn holders(db: &mongodb::Database) -> Vec<Document> {
    use futures_util::TryStreamExt;
    db.collection::<Document>("resource_lease_holders").find(doc! {}).await.unwrap().try_collect().await.unwrap()
}

async fn counter(db: &mongodb::Database, id: &str) -> i64 {
    let c = db.collection::<Document>("resource_lease_counters").find_one(doc! { "_id": id }).await.unwrap();
    c.map_or(0, |c| c.get_i64("count").or_else(|_| c.get_i32("count").map(i64::from)).unwrap())
}

fn job_of(holder: &Document) -> Option<String> {
    holder.get_document("payload").ok()?.get_str("jobId").ok().map(str::to_owned)
}

/// The first holder whose payload carries a job id (the compile submitted), waiting up to 20 s.
async fn submitted_holder(db: &mongodb::Database) -> Document {
    for _ in 0..800 {
        if let Some(h) = holders(db).await.into_iter().find(|h| job_of(h).is_some()) {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no compile ever held a lease with a submitted job");
}

async fn tracker_view(http: &reqwest::Client, base: &str) -> Value {
    let r = http.get(format!("{base}/internal/tex/compiles")).header(SECRET_HEADER, INTERNAL_SECRET).send().await;
    let r = r.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// PDFs, `LEASE_BUSY` answers, anything else.
fn tally<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> (usize, Vec<&'a Answer>, Vec<&'a Answer>) {
    let (mut ok, mut busy, mut other) = (0, Vec::new(), Vec::new());
    for a in answers {
        match (a.status, a.code().as_deref()) {
            (200, _) => ok += 1,
            (_, Some("LEASE_BUSY")) => busy.push(a),
            _ => other.push(a),
        }
    }
    (ok, busy, other)
}

// ---------------------------------------------------------------------------------------------------------------
// The client against the double

#[tokio::test]
async fn client_submits_polls_and_is_refused_with_429_by_the_double() {
    let double = double(Some(1), Duration::from_millis(300)).await;
    let client = Tex2PdfClient::new(double.base_url()).unwrap();
    let source = "\\documentclass{article}\\begin{document}hi\\end{document}";
    let job = client.submit(source, Some("t1/p1")).await.unwrap();
    assert_eq!(client.poll(&job).await.unwrap(), JobState::Running);
    match client.submit("another", Some("t1/p2")).await {
        Err(ClientError::Overloaded { retry_after }) => assert_eq!(retry_after, Some(Duration::from_secs(1))),
        other => panic!("expected 429 while the one slot is taken, got {other:?}"),
    }
    let mut pdf = None;
    for _ in 0..400 {
        match client.poll(&job).await.unwrap() {
            JobState::Running => tokio::time::sleep(Duration::from_millis(25)).await,
            JobState::Done(bytes) => {
                pdf = Some(bytes);
                break;
            }
            JobState::Failed(log) => panic!("job failed: {log}"),
        }
    }
    let pdf = String::from_utf8(pdf.expect("the job finished")).unwrap();
    assert!(pdf.starts_with("%PDF-") && pdf.contains(&source_hash(source)), "{pdf}");

    // The slot is free again once the job's duration elapsed; a failing source fails with its log.
    let failing = client.submit("%double:fail=Undefined control sequence\n%double:duration-ms=0", None).await.unwrap();
    match client.poll(&failing).await.unwrap() {
        JobState::Failed(log) => assert!(log.contains("Undefined control sequence"), "{log}"),
        other => panic!("expected a failed job, got {other:?}"),
    }
    assert!(matches!(client.poll("job-unknown").await, Err(ClientError::UnknownJob { .. })));

    let stats = double.stats();
    assert_eq!((stats.submitted, stats.rejected_429, stats.max_concurrent), (2, 1, 1));
    assert_eq!(stats.max_concurrent_per_project.get("t1/p1"), Some(&1));
    assert_eq!(stats.max_concurrent_per_tenant.get("t1"), Some(&1));
    let http = reqwest::Client::new();
    let over_http: Value = http.get(format!("{}/stats", double.base_url())).send().await.unwrap().json().await.unwrap();
    assert_eq!((over_http["rejected429"].as_u64(), over_http["maxConcurrent"].as_u64()), (Some(1), Some(1)));
    let bad = http.post(format!("{}/jobs", double.base_url())).json(&json!({ "src": "x" })).send().await.unwrap();
    assert_eq!(bad.status(), 400);
}

// ---------------------------------------------------------------------------------------------------------------
// The compile flow on the in-memory store

struct Flow {
    compiler: TexCompiler,
    tracker: TexCompileTracker,
    service: ResourceLeaseService,
    store: Arc<MemoryStore>,
    definitions: Arc<LayeredDefinitions>,
}

fn flow(double: &DoubleHandle) -> Flow {
    let store = Arc::new(MemoryStore::default());
    let definitions = Arc::new(
        LayeredDefinitions::new(Arc::new(MemoryDocumentStore::default())).with_classpath(Classpath::bundled()),
    );
    let types: HashSet<String> = ["tex".to_owned()].into();
    let service = ResourceLeaseService::new(store.clone(), definitions.clone(), Arc::new(types), None);
    let tracker = TexCompileTracker::new();
    let client = Tex2PdfClient::new(double.base_url()).unwrap();
    let compiler = TexCompiler::new(
        service.clone(),
        definitions.clone(),
        client,
        tracker.clone(),
        "pod-m",
        CompileConfig::default(),
    );
    Flow { compiler, tracker, service, store, definitions }
}

fn request(project: &str, source: &str) -> CompileRequest {
    CompileRequest {
        tenant_id: "t1".into(),
        project_id: project.into(),
        user_id: "u1".into(),
        run_id: "run-1".into(),
        source: source.into(),
    }
}

async fn memory_submitted_holder(store: &MemoryStore) -> HolderRecord {
    for _ in 0..800 {
        if let Some(h) = store.holders(None).await.unwrap().into_iter().find(|h| h.payload.contains_key("jobId")) {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no compile ever held a lease with a submitted job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compile_holds_a_pod_bound_tex_lease_while_polling_and_releases_it_on_the_result() {
    let double = double(Some(6), Duration::from_millis(600)).await;
    let f = flow(&double);
    let compiler = f.compiler.clone();
    let running = tokio::spawn(async move { compiler.compile(request("p1", "hello")).await });

    let holder = memory_submitted_holder(&f.store).await;
    assert_eq!(
        (holder.lease_type.as_str(), holder.lease.as_str(), holder.resource.as_str()),
        ("tex", "tex", "tex2pdf")
    );
    assert_eq!((holder.pod.as_str(), holder.pod_bound), ("pod-m", true));
    assert_eq!((holder.user_id.as_deref(), holder.holder_ref.as_str()), (Some("u1"), "run-1"));
    assert_eq!(holder.levels.len(), 3, "project, tenant and global are capped: {:?}", holder.levels);
    let tracked = f.tracker.running();
    assert_eq!(tracked.len(), 1);
    assert_eq!(
        (tracked[0].token.as_str(), tracked[0].job_id.as_ref()),
        (holder.token.as_str(), holder.payload["jobId"].as_str().map(str::to_owned).as_ref())
    );

    let pdf = running.await.unwrap().expect("the compile succeeds");
    assert!(String::from_utf8_lossy(&pdf.pdf).contains(&source_hash("hello")));
    assert_eq!(Some(pdf.job_id.as_str()), holder.payload["jobId"].as_str());
    assert!(f.store.holders(None).await.unwrap().is_empty(), "the lease is released on the result");
    assert!(f.tracker.is_empty(), "the loop unregistered");

    // A revocation that arrives after the loop ended finds nothing and leaves nothing.
    TexLeaseHandler::new(f.tracker.clone()).on_revoked(&holder, RevocationReason::Revoke).await.unwrap();
    let stats = f.tracker.stats();
    assert_eq!((stats.running, stats.aborted_total, stats.late_revocations), (0, 0, 1));
    assert!(f.compiler.compile(request("p1", "again")).await.is_ok(), "a later compile is not aborted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_stops_the_poll_loop_without_waiting_for_check() {
    let double = double(Some(6), Duration::from_secs(120)).await;
    let f = flow(&double);
    let compiler = f.compiler.clone();
    let running = tokio::spawn(async move { compiler.compile(request("p1", "long")).await });
    let holder = memory_submitted_holder(&f.store).await;
    // The handler runs while the holder is still in the store: `check()` would succeed, only the flag stops it.
    TexLeaseHandler::new(f.tracker.clone()).on_revoked(&holder, RevocationReason::Revoke).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(60), running).await.expect("the loop stopped").unwrap();
    match result {
        Err(CompileError::Aborted { cause: AbortCause::Revoked(RevocationReason::Revoke), job_id }) => {
            assert_eq!(job_id.as_deref(), holder.payload["jobId"].as_str())
        }
        other => panic!("expected an aborted compile, got {other:?}"),
    }
    assert!(f.store.holders(None).await.unwrap().is_empty(), "the aborted compile released its lease");
    let stats = f.tracker.stats();
    assert_eq!((stats.running, stats.aborted_total, stats.late_revocations), (0, 1, 0));
    assert_eq!(double.stats().running, 1, "the remote job cannot be cancelled: it runs on and expires");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_to_a_revocation_without_handler_aborts_at_the_next_check() {
    let double = double(Some(6), Duration::from_secs(120)).await;
    let f = flow(&double);
    let compiler = f.compiler.clone();
    let running = tokio::spawn(async move { compiler.compile(request("p1", "long")).await });
    let holder = memory_submitted_holder(&f.store).await;
    // This service has no revocation listener: only the loop's own check() can notice.
    f.service.reaper().revoke(&holder.token, None).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(60), running).await.expect("the loop stopped").unwrap();
    assert!(matches!(result, Err(CompileError::Aborted { cause: AbortCause::Lost, .. })), "{result:?}");
    assert!(f.tracker.is_empty());
}

#[tokio::test]
async fn a_failed_job_ends_with_its_log_and_tex_lease_none_takes_no_lease() {
    let double = double(Some(6), Duration::from_millis(200)).await;
    let f = flow(&double);
    match f.compiler.compile(request("p1", "%double:fail=Missing $ inserted")).await {
        Err(CompileError::Failed { log, .. }) => assert!(log.contains("Missing $ inserted"), "{log}"),
        other => panic!("expected a failed compile, got {other:?}"),
    }
    assert!(f.store.holders(None).await.unwrap().is_empty(), "a failed compile releases its lease");

    f.definitions.put_document("t1", "p2", SETTINGS_PATH, "tex.lease: none\n").await.unwrap();
    let compiler = f.compiler.clone();
    let running = tokio::spawn(async move { compiler.compile(request("p2", "%double:duration-ms=1500")).await });
    for _ in 0..400 {
        if double.stats().running == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(double.stats().running, 1, "the unguarded compile was submitted");
    assert!(f.store.holders(None).await.unwrap().is_empty(), "tex.lease: none takes no lease");
    assert!(f.tracker.is_empty(), "a NOOP lease has no token to revoke");
    assert!(running.await.unwrap().is_ok());
}

// ---------------------------------------------------------------------------------------------------------------
// Brain pods on MongoDB

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compile_endpoint_checks_its_caller_and_returns_the_pdf_under_a_lease() {
    let (uri, db) = test_database("tex_endpoint").await;
    let double = double(Some(6), Duration::from_millis(800)).await;
    let mut pod = tex_pod(&uri, db.name(), "pod-a", double.base_url()).await;
    let http = reqwest::Client::new();
    let bearer = token("t1", "u1");
    let url = format!("{}/api/v1/projects/p1/tex/compile", pod.base);

    let anonymous = http.post(&url).json(&json!({ "source": "x" })).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    for (body, field) in [
        (json!({ "source": "  " }), "source"),
        (json!({ "source": "x", "extra": 1 }), "body"),
        (json!({ "source": "x", "runId": "" }), "runId"),
    ] {
        let a = compile(&http, &pod.base, &bearer, "p1", body.clone()).await;
        assert_eq!((a.status, a.code().as_deref()), (400, Some("INVALID_REQUEST")), "{body}");
        assert_eq!(a.json()["field"], field, "{body}");
    }
    let bad_project = compile(&http, &pod.base, &bearer, "a%7Cb", json!({ "source": "x" })).await;
    assert_eq!((bad_project.status, bad_project.json()["field"].as_str()), (400, Some("projectId")));
    assert_eq!(double.stats().submitted, 0, "refused requests submitted nothing");

    let source = "\\documentclass{article}\\begin{document}Hello\\end{document}";
    let (h, b) = (http.clone(), pod.base.clone());
    let running = tokio::spawn(async move {
        compile(&h, &b, &token("t1", "u1"), "p1", json!({ "source": source, "runId": "run-42" })).await
    });
    let holder = submitted_holder(&db).await;
    assert_eq!(holder.get_str("type").unwrap(), "tex");
    assert_eq!((holder.get_str("pod").unwrap(), holder.get_bool("podBound").unwrap()), ("pod-a", true));
    assert_eq!((holder.get_str("userId").unwrap(), holder.get_str("holderRef").unwrap()), ("u1", "run-42"));
    let view = tracker_view(&http, &pod.base).await;
    assert_eq!(view["running"][0]["token"].as_str(), holder.get_str("_id").ok());
    let answer = running.await.unwrap();
    assert!(answer.is_pdf_of(source), "{answer:?}");
    assert_eq!(answer.job_id, job_of(&holder));
    assert!(holders(&db).await.is_empty(), "released on the result");
    assert_eq!(counter(&db, "tex2pdf|project|t1/p1").await, 0);

    let failed = compile(&http, &pod.base, &bearer, "p1", json!({ "source": "%double:fail=Undefined control" })).await;
    assert_eq!((failed.status, failed.code().as_deref()), (422, Some("TEX_COMPILE_FAILED")));
    assert!(failed.json()["log"].as_str().unwrap().contains("Undefined control"));
    assert!(holders(&db).await.is_empty(), "released on a failure too");

    // Overload is LEASE_BUSY with its diagnosis, before anything is submitted (project p2 waits 0 ms).
    let written = http
        .put(format!("{}/internal/documents", pod.base))
        .header(SECRET_HEADER, INTERNAL_SECRET)
        .json(&json!({ "tenantId": "t1", "projectId": "p2", "path": "_vance/config/lease/tex.yaml",
                       "content": "name: tex\nwaitMs: 0\n" }))
        .send()
        .await
        .unwrap();
    assert_eq!(written.status(), 200);
    let (h, b) = (http.clone(), pod.base.clone());
    let first = tokio::spawn(async move {
        compile(&h, &b, &token("t1", "u1"), "p2", json!({ "source": "%double:duration-ms=2000" })).await
    });
    submitted_holder(&db).await;
    let submitted = double.stats().submitted;
    let busy = compile(&http, &pod.base, &token("t1", "u2"), "p2", json!({ "source": "second" })).await;
    assert_eq!((busy.status, busy.code().as_deref()), (429, Some("LEASE_BUSY")), "{busy:?}");
    let v = busy.json();
    assert_eq!(
        (v["resource"].as_str(), v["level"].as_str(), v["scope"].as_str()),
        (Some("tex2pdf"), Some("project"), Some("t1/p2"))
    );
    assert_eq!((v["count"].as_i64(), v["cap"].as_u64()), (Some(1), Some(1)));
    assert!(v["retryAfterMs"].as_u64().is_some() && busy.retry_after.is_some(), "{v}");
    assert_eq!(double.stats().submitted, submitted, "a busy compile submits nothing");
    assert_eq!(first.await.unwrap().status, 200);
    pod.stop().await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_compiles_of_one_project_from_two_pods_are_serialized_by_the_lease() {
    let (uri, db) = test_database("tex_one_project").await;
    let job = Duration::from_millis(300);
    // The double takes as many jobs as the global cap: anything the lease let through beyond that would be a 429.
    let double = double(Some(6), job).await;
    let mut a = tex_pod(&uri, db.name(), "pod-a", double.base_url()).await;
    let mut b = tex_pod(&uri, db.name(), "pod-b", double.base_url()).await;
    let http = reqwest::Client::new();

    let started = Instant::now();
    let calls = (0..20).map(|i| {
        let (http, base) = (http.clone(), if i % 2 == 0 { a.base.clone() } else { b.base.clone() });
        async move {
            let source = format!("\\documentclass{{article}} % compile {i}");
            let answer = compile(&http, &base, &token("t1", &format!("u{i}")), "p1", json!({ "source": source })).await;
            (source, answer, started.elapsed())
        }
    });
    let results = join_all(calls).await;
    let (ok, busy, other) = tally(results.iter().map(|(_, a, _)| a));
    assert!(other.is_empty(), "only PDFs and LEASE_BUSY expected: {other:?}");
    for (source, answer, _) in results.iter().filter(|(_, a, _)| a.status == 200) {
        assert!(answer.is_pdf_of(source), "{answer:?}");
    }
    for answer in &busy {
        let v = answer.json();
        assert_eq!(
            (answer.status, v["resource"].as_str(), v["level"].as_str()),
            (429, Some("tex2pdf"), Some("project"))
        );
        assert_eq!((v["scope"].as_str(), v["cap"].as_u64()), (Some("t1/p1"), Some(1)));
        assert!(answer.retry_after.is_some(), "LEASE_BUSY carries Retry-After");
    }

    let stats = double.stats();
    eprintln!("one project: {ok} PDFs, {} LEASE_BUSY; double {stats:?}", busy.len());
    assert_eq!(stats.rejected_429, 0, "the service never saw more than it can take: {stats:?}");
    assert_eq!(stats.max_concurrent_per_project.get("t1/p1"), Some(&1), "{stats:?}");
    assert!(stats.max_concurrent <= 6, "{stats:?}");
    assert_eq!(stats.submitted, ok as u64, "every PDF is one job; a busy caller submitted nothing");
    // Contention: twenty callers at once, one slot. Either some were turned away, or they queued: then the last
    // PDF cannot have come before `ok` jobs ran one after another.
    assert!(!busy.is_empty() || ok >= 2, "no contention: ok {ok}, busy {}", busy.len());
    let last_pdf = results.iter().filter(|(_, a, _)| a.status == 200).map(|(_, _, t)| *t).max().unwrap();
    assert!(last_pdf >= job * u32::try_from(ok).unwrap(), "{ok} serialized jobs of {job:?} ended after {last_pdf:?}");
    assert!(holders(&db).await.is_empty());
    assert_eq!(counter(&db, "tex2pdf|project|t1/p1").await, 0);
    a.stop().await;
    b.stop().await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compiles_across_tenants_and_projects_stay_within_the_global_and_tenant_caps() {
    let (uri, db) = test_database("tex_funnel").await;
    let double = double(Some(6), Duration::from_millis(500)).await;
    let mut a = tex_pod(&uri, db.name(), "pod-a", double.base_url()).await;
    let mut b = tex_pod(&uri, db.name(), "pod-b", double.base_url()).await;
    let http = reqwest::Client::new();

    // 3 tenants × 4 projects × 2 compiles: tenant caps (3 × 3) exceed the global cap (6).
    let calls = (0..24).map(|i| {
        let (tenant, project) = (format!("t{}", i % 3), format!("p{}", (i / 3) % 4));
        let (http, base) = (http.clone(), if i % 2 == 0 { a.base.clone() } else { b.base.clone() });
        async move {
            let bearer = token(&tenant, &format!("u{i}"));
            compile(&http, &base, &bearer, &project, json!({ "source": format!("compile {i}") })).await
        }
    });
    let answers = join_all(calls).await;
    let (ok, busy, other) = tally(&answers);
    assert!(other.is_empty(), "only PDFs and LEASE_BUSY expected: {other:?}");
    let stats = double.stats();
    eprintln!("funnel: {ok} PDFs, {} LEASE_BUSY; double {stats:?}", busy.len());
    assert_eq!(stats.rejected_429, 0, "{stats:?}");
    assert!(stats.max_concurrent <= 6, "global cap: {stats:?}");
    assert!(stats.max_concurrent >= 2, "the compiles overlapped: {stats:?}");
    assert!(stats.max_concurrent_per_tenant.values().all(|&n| n <= 3), "tenant cap: {stats:?}");
    assert!(stats.max_concurrent_per_project.values().all(|&n| n == 1), "project cap: {stats:?}");
    assert_eq!(stats.submitted, ok as u64);
    assert!(ok > 0, "busy {}", busy.len());
    assert!(holders(&db).await.is_empty());
    a.stop().await;
    b.stop().await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_tex_lease_none_the_same_load_reaches_the_service_unguarded() {
    let (uri, db) = test_database("tex_none").await;
    let double = double(Some(2), Duration::from_millis(400)).await;
    let mut a = tex_pod(&uri, db.name(), "pod-a", double.base_url()).await;
    let mut b = tex_pod(&uri, db.name(), "pod-b", double.base_url()).await;
    let http = reqwest::Client::new();
    let written = http
        .put(format!("{}/internal/documents", a.base))
        .header(SECRET_HEADER, INTERNAL_SECRET)
        .json(&json!({ "tenantId": "t1", "projectId": "p1", "path": SETTINGS_PATH, "content": "tex.lease: none\n" }))
        .send()
        .await
        .unwrap();
    assert_eq!(written.status(), 200);

    let calls = (0..20).map(|i| {
        let (http, base) = (http.clone(), if i % 2 == 0 { a.base.clone() } else { b.base.clone() });
        async move {
            compile(&http, &base, &token("t1", &format!("u{i}")), "p1", json!({ "source": format!("c{i}") })).await
        }
    });
    let answers = join_all(calls).await;
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let overloaded: Vec<&Answer> =
        answers.iter().filter(|a| a.code().as_deref() == Some("TEX_REMOTE_OVERLOADED")).collect();
    assert_eq!(ok + overloaded.len(), 20, "{answers:?}");
    assert!(overloaded.iter().all(|a| a.status == 503 && a.retry_after.as_deref() == Some("1")));
    let stats = double.stats();
    eprintln!("tex.lease none: {ok} PDFs, {} TEX_REMOTE_OVERLOADED; double {stats:?}", overloaded.len());
    assert!(stats.rejected_429 > 0, "without the lease the service is overrun: {stats:?}");
    assert_eq!(stats.rejected_429, overloaded.len() as u64);
    assert!(stats.max_concurrent_per_project["t1/p1"] > 1, "nothing serialized the project: {stats:?}");
    assert!(holders(&db).await.is_empty(), "no lease was taken");
    let counters = db.collection::<Document>("resource_lease_counters").count_documents(doc! {}).await.unwrap();
    assert_eq!(counters, 0, "the NOOP lease never touched the store");
    a.stop().await;
    b.stop().await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revocation_during_polling_aborts_the_compile_and_frees_the_slot_and_a_late_one_changes_nothing() {
    let (uri, db) = test_database("tex_revoke").await;
    let double = double(Some(6), Duration::from_secs(120)).await;
    let mut a = tex_pod(&uri, db.name(), "pod-a", double.base_url()).await;
    let mut b = tex_pod(&uri, db.name(), "pod-b", double.base_url()).await;
    let http = reqwest::Client::new();
    let revoke = |base: &str, token: &str| {
        http.post(format!("{base}/internal/lease/admin/revoke"))
            .header(SECRET_HEADER, INTERNAL_SECRET)
            .json(&json!({ "token": token }))
            .send()
    };

    let (h, base) = (http.clone(), a.base.clone());
    let running =
        tokio::spawn(async move { compile(&h, &base, &token("t1", "u1"), "p1", json!({ "source": "long" })).await });
    let holder = submitted_holder(&db).await;
    let lease = holder.get_str("_id").unwrap().to_owned();
    assert_eq!(tracker_view(&http, &a.base).await["running"][0]["jobId"].as_str(), job_of(&holder).as_deref());

    // The operator revokes through the other pod: it takes the holder and forwards the revocation to pod-a.
    let r = revoke(&b.base, &lease).await.unwrap();
    assert_eq!(r.status(), 200);
    let r: Value = r.json().await.unwrap();
    assert_eq!((r["pod"].as_str(), r["type"].as_str()), (Some("pod-a"), Some("tex")));
    let aborted = tokio::time::timeout(Duration::from_secs(60), running).await.expect("the compile ended").unwrap();
    assert_eq!((aborted.status, aborted.code().as_deref()), (409, Some("TEX_COMPILE_ABORTED")), "{aborted:?}");
    // Usually the handler gets there first (`revoke`); a loop that checked in between sees `lost`.
    assert!(matches!(aborted.json()["cause"].as_str(), Some("revoke" | "lost")), "{:?}", aborted.json());
    assert!(holders(&db).await.is_empty());
    assert_eq!(counter(&db, "tex2pdf|project|t1/p1").await, 0, "the slot is free");
    // The revocation reached pod-a's handler exactly once, and nothing stays registered there.
    let mut view = Value::Null;
    for _ in 0..400 {
        view = tracker_view(&http, &a.base).await;
        if view["abortedTotal"].as_u64().unwrap() + view["lateRevocations"].as_u64().unwrap() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(view["abortedTotal"].as_u64().unwrap() + view["lateRevocations"].as_u64().unwrap(), 1, "{view}");
    assert_eq!(view["running"], json!([]), "{view}");

    // The freed slot serves the next compile at once, while the aborted job still runs out on the service.
    let (h, base) = (http.clone(), b.base.clone());
    let source = "%double:duration-ms=1500\nnext";
    let next =
        tokio::spawn(async move { compile(&h, &base, &token("t1", "u2"), "p1", json!({ "source": source })).await });
    let second = submitted_holder(&db).await;
    let second_lease = second.get_str("_id").unwrap().to_owned();
    let answer = next.await.unwrap();
    assert!(answer.is_pdf_of(source), "{answer:?}");
    assert_eq!(double.stats().max_concurrent_per_project["t1/p1"], 2, "no cancel: the aborted job ran on");

    // A revocation after the compile finished: nothing to revoke, and a delayed notification aborts nothing.
    let late = revoke(&b.base, &second_lease).await.unwrap();
    assert_eq!(late.status(), 404);
    assert_eq!(late.json::<Value>().await.unwrap()["code"], "NOT_FOUND");
    let before = tracker_view(&http, &b.base).await;
    let delayed = RevokedHolder {
        holder: HolderRecord {
            token: second_lease.clone(),
            lease_type: "tex".into(),
            lease: "tex".into(),
            resource: "tex2pdf".into(),
            tenant_id: "t1".into(),
            project_id: "p1".into(),
            user_id: Some("u2".into()),
            holder_ref: second.get_str("holderRef").unwrap().to_owned(),
            pod: "pod-b".into(),
            pod_bound: true,
            state: HolderState::Held,
            levels: vec![],
            payload: json!({ "jobId": job_of(&second) }).as_object().cloned().unwrap(),
            ttl_seconds: 120,
            acquired_at_ms: 0,
            last_seen_at_ms: 0,
        },
        reason: RevocationReason::Revoke,
    };
    let delayed = http
        .post(format!("{}/internal/lease/revoked", b.base))
        .header(SECRET_HEADER, INTERNAL_SECRET)
        .json(&delayed)
        .send()
        .await
        .unwrap();
    assert_eq!(delayed.status(), 200, "{:?}", delayed.text().await);
    let after = tracker_view(&http, &b.base).await;
    assert_eq!(after["running"], json!([]));
    assert_eq!(after["abortedTotal"], before["abortedTotal"], "nothing was aborted");
    assert_eq!(after["lateRevocations"].as_u64(), before["lateRevocations"].as_u64().map(|n| n + 1));
    a.stop().await;
    b.stop().await;
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mongodb_outage_during_polling_ends_the_compile_with_an_error_not_a_hang() {
    let (uri, db) = test_database("tex_outage").await;
    let hostport = uri.trim_start_matches("mongodb://").split(['/', '?']).next().unwrap();
    let target: SocketAddr = hostport.parse().unwrap_or_else(|e| panic!("{uri}: need a mongodb://ip:port URI ({e})"));
    let proxy = CutProxy::start(target).await;
    let proxied =
        format!("mongodb://{}/?serverSelectionTimeoutMS=1500&connectTimeoutMS=1000&directConnection=true", proxy.addr);
    let double = double(Some(6), Duration::from_secs(120)).await;
    let mut pod = tex_pod(&proxied, db.name(), "pod-a", double.base_url()).await;
    let http = reqwest::Client::new();

    let (h, base) = (http.clone(), pod.base.clone());
    let running =
        tokio::spawn(async move { compile(&h, &base, &token("t1", "u1"), "p1", json!({ "source": "long" })).await });
    let holder = submitted_holder(&db).await;
    proxy.cut();

    let answer = tokio::time::timeout(Duration::from_secs(120), running).await.expect("the compile hung").unwrap();
    assert_eq!((answer.status, answer.code().as_deref()), (503, Some("LEASE_UNAVAILABLE")), "{answer:?}");
    let view = tracker_view(&http, &pod.base).await;
    assert_eq!(view["running"], json!([]), "the loop ended: {view}");
    assert_eq!(view["abortedTotal"], 0, "an outage is an error, not an abort");
    // Fail-closed: the holder could not be released through the outage; its TTL (or the operator) frees the slot.
    let left = holders(&db).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].get_str("_id").ok(), holder.get_str("_id").ok());
    pod.kill();
    let _ = db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_service_is_a_remote_error_that_names_no_address_and_releases_the_lease() {
    let (uri, db) = test_database("tex_unreachable").await;
    let closed = format!("http://127.0.0.1:{}", free_port());
    let mut pod = tex_pod(&uri, db.name(), "pod-a", &closed).await;
    let http = reqwest::Client::new();
    let answer = compile(&http, &pod.base, &token("t1", "u1"), "p1", json!({ "source": "x" })).await;
    assert_eq!((answer.status, answer.code().as_deref()), (502, Some("TEX_REMOTE_ERROR")), "{answer:?}");
    let message = answer.json()["message"].as_str().unwrap().to_owned();
    assert!(message.contains("could not be reached") && !message.contains("127.0.0.1"), "{message}");
    assert!(holders(&db).await.is_empty(), "the lease taken before the submit is released");
    assert_eq!(counter(&db, "tex2pdf|project|t1/p1").await, 0);
    pod.stop().await;
    let _ = db.drop().await;
}
