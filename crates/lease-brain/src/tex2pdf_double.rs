//! A **test double** of the tex2pdf compile service — not a compiler. It implements the HTTP contract of the
//! `addon-tex` crate docs (`POST /jobs`, `GET /jobs/{id}`) with a fake PDF, and counts what a real service would
//! suffer: the brain uses it when no `BRAIN_TEX2PDF_URL` is configured, tests use it to see what the lease lets
//! through, and the `tex2pdf-double` binary serves it to several brain processes.
//!
//! - **Jobs** run for [`DoubleConfig::job_duration`] from their submit, then are done (or failed), whether anybody
//!   polls or not: there is no cancel. A finished job is kept for [`DoubleConfig::retention`], then polls answer 404.
//! - **Overload**: with more than [`DoubleConfig::max_concurrent`] jobs running, a submit answers 429
//!   (`Retry-After: 1`) and counts as `rejected429`.
//! - **Statistics** (`GET /stats`, [`DoubleHandle::stats`]): the highest number of jobs running at once overall,
//!   per label (the submit's `X-Tex2pdf-Label`, `<tenant>/<project>`) and per tenant (the label's part before
//!   `/`). Concurrency only rises at a submit, so the maxima taken there are exact.
//! - **Source directives**, one per line: `%double:duration-ms=<n>` overrides the job's duration,
//!   `%double:fail=<log line>` makes the job fail with that log.
//! - **The PDF** is a tiny fixed PDF-looking byte string that carries [`source_hash`] of the source.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use addon_tex::LABEL_HEADER;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The statistics key of a submit without a label.
pub const UNLABELLED: &str = "(unlabelled)";

/// How the double behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoubleConfig {
    /// Jobs running at once above which a submit answers 429; `None` = never.
    pub max_concurrent: Option<usize>,
    /// How long a job runs (unless its source says otherwise).
    pub job_duration: Duration,
    /// How long a finished job can still be polled.
    pub retention: Duration,
}

impl Default for DoubleConfig {
    /// 6 jobs at once (the bundled `tex` lease's global cap), 1 s per job, kept 10 minutes.
    fn default() -> Self {
        DoubleConfig {
            max_concurrent: Some(6),
            job_duration: Duration::from_secs(1),
            retention: Duration::from_secs(600),
        }
    }
}

/// What the double has seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DoubleStats {
    /// Submits accepted.
    pub submitted: u64,
    /// Submits refused with 429.
    #[serde(rename = "rejected429")]
    pub rejected_429: u64,
    /// The most jobs that ran at once.
    pub max_concurrent: usize,
    /// The most jobs that ran at once per label (`<tenant>/<project>`).
    pub max_concurrent_per_project: BTreeMap<String, usize>,
    /// The most jobs that ran at once per tenant (the label's part before `/`).
    pub max_concurrent_per_tenant: BTreeMap<String, usize>,
    /// Jobs running now.
    pub running: usize,
}

#[derive(Debug)]
enum Outcome {
    Pdf(Vec<u8>),
    Failed(String),
}

#[derive(Debug)]
struct Job {
    label: String,
    ends: Instant,
    outcome: Outcome,
}

#[derive(Debug)]
struct DoubleState {
    config: DoubleConfig,
    jobs: HashMap<String, Job>,
    next_id: u64,
    stats: DoubleStats,
}

type Shared = Arc<Mutex<DoubleState>>;

fn lock(state: &Shared) -> MutexGuard<'_, DoubleState> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DoubleState {
    fn running(&self, now: Instant) -> impl Iterator<Item = &Job> {
        self.jobs.values().filter(move |j| j.ends > now)
    }

    fn prune(&mut self, now: Instant) {
        let retention = self.config.retention;
        self.jobs.retain(|_, j| j.ends + retention > now);
    }
}

/// A running double. Dropping it stops the server.
#[derive(Debug)]
pub struct DoubleHandle {
    base_url: String,
    state: Shared,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl DoubleHandle {
    /// The base URL of the contract (`http://127.0.0.1:<port>`).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The statistics so far.
    pub fn stats(&self) -> DoubleStats {
        stats(&self.state)
    }

    /// Stops the server and waits for it.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for DoubleHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Starts a double listening on `addr` (port 0 = any free port).
pub async fn start(addr: SocketAddr, config: DoubleConfig) -> std::io::Result<DoubleHandle> {
    serve(TcpListener::bind(addr).await?, config)
}

/// Serves a double on `listener` (on the current tokio runtime).
pub fn serve(listener: TcpListener, config: DoubleConfig) -> std::io::Result<DoubleHandle> {
    let base_url = format!("http://{}", listener.local_addr()?);
    let state: Shared =
        Arc::new(Mutex::new(DoubleState { config, jobs: HashMap::new(), next_id: 0, stats: DoubleStats::default() }));
    let app = router(state.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "tex2pdf test double stopped");
        }
    });
    Ok(DoubleHandle { base_url, state, stop: Some(stop), task: Some(task) })
}

/// The double's routes over `state`.
fn router(state: Shared) -> Router {
    Router::new()
        .route("/jobs", post(submit))
        .route("/jobs/{id}", get(poll))
        .route("/stats", get(|State(s): State<Shared>| async move { axum::Json(stats(&s)) }))
        .with_state(state)
}

fn stats(state: &Shared) -> DoubleStats {
    let s = lock(state);
    let now = Instant::now();
    DoubleStats { running: s.running(now).count(), ..s.stats.clone() }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitBody {
    source: String,
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "code": code, "message": message.into() }))).into_response()
}

/// The directives of a source: duration override and failure log.
fn directives(source: &str) -> (Option<Duration>, Option<String>) {
    let mut duration = None;
    let mut fail = None;
    for line in source.lines() {
        let Some(directive) = line.trim().strip_prefix("%double:") else { continue };
        if let Some(ms) = directive.strip_prefix("duration-ms=") {
            duration = ms.trim().parse::<u64>().ok().map(Duration::from_millis);
        } else if let Some(log) = directive.strip_prefix("fail=") {
            fail = Some(log.trim().to_owned());
        }
    }
    (duration, fail)
}

async fn submit(State(state): State<Shared>, headers: HeaderMap, bytes: Bytes) -> Response {
    let body: SubmitBody = match serde_json::from_slice(&bytes) {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, "INVALID_REQUEST", e.to_string()),
    };
    let label = headers
        .get(LABEL_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .unwrap_or(UNLABELLED)
        .to_owned();
    let (duration, fail) = directives(&body.source);
    let mut s = lock(&state);
    let now = Instant::now();
    s.prune(now);
    let running = s.running(now).count();
    if s.config.max_concurrent.is_some_and(|max| running >= max) {
        s.stats.rejected_429 += 1;
        drop(s);
        tracing::debug!(label, running, "tex2pdf double overloaded: 429");
        let mut r = error(StatusCode::TOO_MANY_REQUESTS, "OVERLOADED", format!("{running} jobs are running"));
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    }
    let running_label = s.running(now).filter(|j| j.label == label).count() + 1;
    let tenant = label.split_once('/').map(|(t, _)| t.to_owned());
    let running_tenant = tenant
        .as_ref()
        .map(|t| s.running(now).filter(|j| j.label.split_once('/').is_some_and(|(jt, _)| jt == t)).count() + 1);
    s.next_id += 1;
    let job_id = format!("job-{}-{:08x}", s.next_id, rand::random::<u32>());
    let outcome = match fail {
        Some(log) => Outcome::Failed(format!("! LaTeX Error: {log}\nNo pages of output.")),
        None => Outcome::Pdf(fake_pdf(&body.source)),
    };
    let ends = now + duration.unwrap_or(s.config.job_duration);
    s.jobs.insert(job_id.clone(), Job { label: label.clone(), ends, outcome });
    let stats = &mut s.stats;
    stats.submitted += 1;
    stats.max_concurrent = stats.max_concurrent.max(running + 1);
    let max = stats.max_concurrent_per_project.entry(label.clone()).or_default();
    *max = (*max).max(running_label);
    if let (Some(t), Some(n)) = (tenant, running_tenant) {
        let max = stats.max_concurrent_per_tenant.entry(t).or_default();
        *max = (*max).max(n);
    }
    drop(s);
    tracing::debug!(label, job_id, "tex2pdf double accepted a job");
    (StatusCode::ACCEPTED, axum::Json(json!({ "jobId": job_id }))).into_response()
}

async fn poll(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let mut s = lock(&state);
    let now = Instant::now();
    s.prune(now);
    let Some(job) = s.jobs.get(&id) else {
        return error(StatusCode::NOT_FOUND, "NOT_FOUND", format!("no job {id:?}"));
    };
    let body = if job.ends > now {
        json!({ "state": "running" })
    } else {
        match &job.outcome {
            Outcome::Pdf(pdf) => {
                json!({ "state": "done", "pdfBase64": base64::engine::general_purpose::STANDARD.encode(pdf) })
            }
            Outcome::Failed(log) => json!({ "state": "failed", "log": log }),
        }
    };
    axum::Json(body).into_response()
}

/// The 64-bit FNV-1a hash of `source` as 16 hex digits: what the fake PDF carries.
pub fn source_hash(source: &str) -> String {
    let hash = source.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

/// The double's PDF for `source`: a minimal one-page PDF structure with the source hash in a comment.
pub fn fake_pdf(source: &str) -> Vec<u8> {
    format!(
        "%PDF-1.4\n\
         % tex2pdf test double; source-hash {}\n\
         1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n\
         2 0 obj << /Type /Pages /Kids [3 0 R] /Count 1 >> endobj\n\
         3 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 200 50] >> endobj\n\
         trailer << /Root 1 0 R >>\n\
         %%EOF\n",
        source_hash(source)
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_and_pdf() {
        assert_eq!(directives("x"), (None, None));
        let (d, f) = directives("\\documentclass{article}\n  %double:duration-ms=250\n%double:fail=Undefined control");
        assert_eq!(d, Some(Duration::from_millis(250)));
        assert_eq!(f.as_deref(), Some("Undefined control"));
        let pdf = String::from_utf8(fake_pdf("abc")).unwrap();
        assert!(pdf.starts_with("%PDF-1.4\n") && pdf.ends_with("%%EOF\n"));
        assert!(pdf.contains(&source_hash("abc")));
        assert_ne!(source_hash("abc"), source_hash("abd"));
        assert_eq!(source_hash(""), "cbf29ce484222325");
    }
}
