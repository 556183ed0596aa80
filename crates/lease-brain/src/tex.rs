//! The tex add-on in the brain: the `tex` lease handler and the compile endpoint over `addon-tex`'s
//! [`TexCompiler`].
//!
//! - `POST /api/v1/projects/{project}/tex/compile` with JSON `{"source": "<LaTeX>", "runId": "<optional>"}` and a
//!   bearer token (tenant and user from its claims): `200 application/pdf` (header `X-Tex-Job-Id`), or an error
//!   body — `LEASE_BUSY` 429 (the funnel is full: the caps of the `tex` lease), `LEASE_UNAVAILABLE` 503 (store
//!   or config down, also when it fails during polling), `TEX_COMPILE_FAILED` 422 (with the compiler's `log`),
//!   `TEX_COMPILE_ABORTED` 409 (the lease was revoked or lost while polling), `TEX_REMOTE_OVERLOADED` 503 (the
//!   service answered 429 — only possible without a lease, `tex.lease: none`), `TEX_REMOTE_ERROR` 502.
//! - `GET /internal/tex/compiles` (internal secret): this pod's running poll loops and the tracker's counts.
//!
//! The service is `BRAIN_TEX2PDF_URL`; without it the brain starts the [tex2pdf test double](crate::tex2pdf_double)
//! in-process on a loopback port and says so in its log: fake PDFs, for demos and tests only.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, PoisonError};

use addon_tex::{
    ClientError, CompileConfig, CompileError, CompileRequest, Tex2PdfClient, TexCompileTracker, TexCompiler,
    TexLeaseHandler,
};
use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lease_shared::LeaseHandler;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::addons::{Addon, AddonContext};
use crate::api::{ApiError, bearer_claims, body};
use crate::auth::{JwtKeys, internal_secret_matches};
use crate::config::BrainConfig;
use crate::dispatch::INTERNAL_SECRET_HEADER;
use crate::tex2pdf_double::{self, DoubleConfig, DoubleHandle};

/// The compile endpoint.
pub const COMPILE_PATH: &str = "/api/v1/projects/{project}/tex/compile";

/// The operator view of this pod's running compiles.
pub const COMPILES_PATH: &str = "/internal/tex/compiles";

/// The response header naming the remote job of a compiled PDF.
pub const JOB_ID_HEADER: &str = "x-tex-job-id";

/// How much of a compiler log an error body carries: its end, where TeX says what went wrong.
const LOG_TAIL_BYTES: usize = 16 * 1024;

/// The tex add-on.
#[derive(Debug)]
pub struct TexAddon {
    tracker: TexCompileTracker,
    /// The service's client, or why there is none.
    remote: Result<Tex2PdfClient, String>,
    double: Mutex<Option<DoubleHandle>>,
    internal_secret: String,
    compile: CompileConfig,
}

impl TexAddon {
    /// The add-on for `config`: the service at `tex2pdf_url`, or else the in-process test double. Must run on a
    /// tokio runtime to start the double; without one (or when the double cannot bind) compiles answer
    /// `TEX_REMOTE_ERROR` and the log says why.
    pub fn from_config(config: &BrainConfig) -> Self {
        let (remote, double) = match &config.tex2pdf_url {
            Some(url) => {
                let client = Tex2PdfClient::new(url).map_err(|e| format!("BRAIN_TEX2PDF_URL {url:?} is unusable: {e}"));
                match &client {
                    Ok(_) => tracing::info!(url = %url, "tex add-on compiles with the tex2pdf service"),
                    Err(e) => tracing::error!(url = %url, error = %e, "tex add-on has no tex2pdf service"),
                }
                (client, None)
            }
            None => match start_double() {
                Ok(double) => {
                    tracing::warn!(
                        url = double.base_url(),
                        pod = %config.pod_id,
                        "no BRAIN_TEX2PDF_URL: the tex add-on compiles against the built-in tex2pdf TEST DOUBLE \
                         (fake PDFs, no LaTeX); set BRAIN_TEX2PDF_URL to use a real compile service"
                    );
                    let client = Tex2PdfClient::new(double.base_url()).map_err(|e| e.to_string());
                    (client, Some(double))
                }
                Err(e) => {
                    tracing::error!(error = %e, "no BRAIN_TEX2PDF_URL and the tex2pdf test double could not start");
                    (
                        Err(format!(
                            "no tex2pdf service: BRAIN_TEX2PDF_URL is not set and the test double failed: {e}"
                        )),
                        None,
                    )
                }
            },
        };
        TexAddon {
            tracker: TexCompileTracker::new(),
            remote,
            double: Mutex::new(double),
            internal_secret: config.internal_secret.clone(),
            compile: CompileConfig { poll_interval: config.tex2pdf_poll_interval, ..CompileConfig::default() },
        }
    }

    /// Replaces the poll pacing (default: [`CompileConfig::default`]).
    pub fn with_compile_config(mut self, compile: CompileConfig) -> Self {
        self.compile = compile;
        self
    }

    /// The tracker of this pod's poll loops.
    pub fn tracker(&self) -> &TexCompileTracker {
        &self.tracker
    }
}

fn start_double() -> std::io::Result<DoubleHandle> {
    // `from_std` and the server task need the runtime; `compiled_in` runs inside `server::run`.
    tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    listener.set_nonblocking(true)?;
    tex2pdf_double::serve(tokio::net::TcpListener::from_std(listener)?, DoubleConfig::default())
}

#[derive(Debug)]
struct TexState {
    compiler: Result<TexCompiler, String>,
    tracker: TexCompileTracker,
    jwt: Option<JwtKeys>,
    internal_secret: String,
    pod_id: String,
}

#[async_trait]
impl Addon for TexAddon {
    fn handlers(&self) -> Vec<Arc<dyn LeaseHandler>> {
        vec![Arc::new(TexLeaseHandler::new(self.tracker.clone()))]
    }

    fn router(&self, ctx: &AddonContext) -> Router {
        let compiler = self.remote.clone().map(|client| {
            TexCompiler::new(
                ctx.leases.clone(),
                ctx.definitions.clone(),
                client,
                self.tracker.clone(),
                ctx.pod_id.clone(),
                self.compile,
            )
        });
        let state = Arc::new(TexState {
            compiler,
            tracker: self.tracker.clone(),
            jwt: ctx.jwt.clone(),
            internal_secret: self.internal_secret.clone(),
            pod_id: ctx.pod_id.clone(),
        });
        Router::new().route(COMPILE_PATH, post(compile)).route(COMPILES_PATH, get(compiles)).with_state(state)
    }

    async fn shutdown(&self) {
        let double = self.double.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(double) = double {
            double.shutdown().await;
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CompileBody {
    source: String,
    #[serde(default)]
    run_id: Option<String>,
}

async fn compile(
    State(state): State<Arc<TexState>>,
    Path(project): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    let claims = bearer_claims(state.jwt.as_ref(), &headers)?;
    let b: CompileBody = body(&bytes)?;
    if b.source.trim().is_empty() {
        return Err(ApiError::invalid("source", "the LaTeX source is empty"));
    }
    let run_id = match b.run_id {
        None => format!("tex-{:016x}", rand::random::<u64>()),
        Some(r) if !r.is_empty() && r.len() <= 128 && !r.chars().any(char::is_control) => r,
        Some(_) => return Err(ApiError::invalid("runId", "1 to 128 characters without control characters")),
    };
    let compiler = state.compiler.as_ref().map_err(|e| ApiError::TexRemote(e.clone()))?;
    let request =
        CompileRequest { tenant_id: claims.tenant, project_id: project, user_id: claims.sub, run_id, source: b.source };
    let pdf = compiler.compile(request).await.map_err(api_error)?;
    let mut response = (StatusCode::OK, pdf.pdf).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/pdf"));
    if let Ok(job) = HeaderValue::from_str(&pdf.job_id) {
        response.headers_mut().insert(JOB_ID_HEADER, job);
    }
    Ok(response)
}

fn api_error(e: CompileError) -> ApiError {
    match e {
        CompileError::Lease(e) => ApiError::Lease(e),
        CompileError::Aborted { cause, .. } => ApiError::TexCompileAborted {
            cause: match cause {
                addon_tex::AbortCause::Revoked(reason) => reason.as_str().to_owned(),
                addon_tex::AbortCause::Lost => "lost".to_owned(),
            },
        },
        CompileError::Failed { log, .. } => ApiError::TexCompileFailed { log: tail(&log, LOG_TAIL_BYTES).to_owned() },
        CompileError::RemoteOverloaded { retry_after } => {
            ApiError::TexRemoteOverloaded { retry_after_secs: retry_after.map(|d| d.as_secs().max(1)) }
        }
        other => {
            // The details (the service's URL, its body) are for the operator's log, not for the tenant.
            tracing::warn!(error = %other, outcome = other.outcome(), "tex compile failed at the tex2pdf service");
            ApiError::TexRemote(remote_summary(&other))
        }
    }
}

/// What a tenant learns about a service failure.
fn remote_summary(e: &CompileError) -> String {
    match e {
        CompileError::Remote(ClientError::Transport { operation, .. }) => {
            format!("the tex2pdf service could not be reached ({operation})")
        }
        CompileError::Remote(ClientError::Status { operation, status, .. }) => {
            format!("the tex2pdf service answered {status} to {operation}")
        }
        CompileError::Remote(ClientError::UnknownJob { job_id }) => {
            format!("the tex2pdf service no longer knows job {job_id}")
        }
        CompileError::TimedOut { job_id, after } => {
            format!("job {job_id} did not finish within {} s", after.as_secs())
        }
        _ => "the tex2pdf service answered outside its contract".to_owned(),
    }
}

/// The last `max` bytes of `text`, cut at a character boundary.
fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

async fn compiles(State(state): State<Arc<TexState>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let presented = headers.get(INTERNAL_SECRET_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if !internal_secret_matches(presented, &state.internal_secret) {
        return Err(ApiError::Unauthorized("internal secret missing or wrong".to_owned()));
    }
    let stats = state.tracker.stats();
    Ok(Json(json!({
        "pod": state.pod_id,
        "running": state.tracker.running(),
        "abortedTotal": stats.aborted_total,
        "lateRevocations": stats.late_revocations,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_cut_at_char_boundaries() {
        assert_eq!(tail("abc", 10), "abc");
        assert_eq!(tail("abcdef", 2), "ef");
        assert_eq!(tail("aé", 1), "");
        assert_eq!(tail("aéb", 2), "b");
    }
}
