//! The compile flow of spec §7: a lease-guarded submit-and-poll against the tex2pdf service.
//!
//! 1. Resolve the setting `tex.lease` for the compile's tenant and project (Project → Tenant → System →
//!    classpath → [`DEFAULT_TEX_LEASE`]); `none` means no lease (NOOP, no store traffic).
//! 2. Acquire a lease of type [`TEX_LEASE_TYPE`], pod-bound (the poll state lives in this pod), for the compile's
//!    user (so `levels.user` applies) — **before** submitting: overload is `LEASE_BUSY` with its diagnosis, not a
//!    remote 429. The loop registers with the [`TexCompileTracker`] under the lease token.
//! 3. Submit; write `{"jobId": …}` into the lease payload.
//! 4. Poll. Every iteration first looks at the tracker's abort flag (a revocation stops the loop at once, without
//!    waiting for `check()`), then calls `check()` (check-at-use and touch), then polls the job. Between polls
//!    the loop sleeps, starting at [`CompileConfig::first_poll_delay`] and doubling up to
//!    [`CompileConfig::poll_interval`]; a revocation wakes it.
//! 5. Release on the result, success or failure.
//!
//! Outcomes: `LEASE_LOST` (from `check()` or the payload update) and a revocation end the compile as
//! [`CompileError::Aborted`]; a store error (`LEASE_UNAVAILABLE`) during the loop ends it as an error result like
//! any other compile error ([`CompileError::Lease`]) — never as a hang and never by going on unprotected. The TTL
//! invariant (TTL > the longest time between two checks) is kept by the loop itself: the sleep is capped at a
//! third of the lease's TTL, and a poll request times out (10 s by default) long before the bundled 120 s.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_shared::config::TEX_LEASE_SETTING;
use lease_shared::{
    LayeredDefinitions, Lease, LeaseError, LeaseRequest, Payload, ReleaseOutcome, ResourceLeaseService,
    RevocationReason,
};

use crate::client::{ClientError, JobState, Tex2PdfClient};
use crate::tracker::{CompileRegistration, TexCompileTracker};

/// The lease type of a compile, and the type of its handler.
pub const TEX_LEASE_TYPE: &str = "tex";

/// The lease a compile takes when no layer sets `tex.lease`.
pub const DEFAULT_TEX_LEASE: &str = "tex";

/// `vance_tex_compile_total{outcome=done|failed|aborted|busy|unavailable|invalid|overloaded|remote-error|timeout}`.
pub const TEX_COMPILE_TOTAL: &str = "vance_tex_compile_total";

/// How the poll loop paces itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileConfig {
    /// The first sleep after the submit (short compiles come back quickly).
    pub first_poll_delay: Duration,
    /// The longest sleep between two polls; the sleep doubles from `first_poll_delay` up to this.
    pub poll_interval: Duration,
    /// How long a compile may run before it ends as [`CompileError::TimedOut`] (the job is left to expire).
    pub max_duration: Duration,
}

impl Default for CompileConfig {
    /// 100 ms first, then up to 1 s between polls; at most 10 minutes per compile.
    fn default() -> Self {
        CompileConfig {
            first_poll_delay: Duration::from_millis(100),
            poll_interval: Duration::from_secs(1),
            max_duration: Duration::from_secs(600),
        }
    }
}

/// One compile.
#[derive(Debug, Clone)]
pub struct CompileRequest {
    /// The tenant the compile runs for.
    pub tenant_id: String,
    /// The project the compile runs for.
    pub project_id: String,
    /// The user of the run (so a `levels.user` cap applies).
    pub user_id: String,
    /// The run this compile belongs to: the lease's holder reference.
    pub run_id: String,
    /// The LaTeX source.
    pub source: String,
}

/// A finished compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledPdf {
    /// The PDF bytes.
    pub pdf: Vec<u8>,
    /// The remote job that produced them.
    pub job_id: String,
}

/// Why a compile was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortCause {
    /// The `tex` handler marked the loop aborted: the lease was revoked or reaped for this reason.
    Revoked(RevocationReason),
    /// `check()` or the payload update found the lease gone (`LEASE_LOST`).
    Lost,
}

impl fmt::Display for AbortCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbortCause::Revoked(reason) => write!(f, "the lease was revoked ({reason})"),
            AbortCause::Lost => f.write_str("the lease was lost (LEASE_LOST)"),
        }
    }
}

/// Every way a compile can end without a PDF.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// The lease refused the compile (`LEASE_BUSY`, `LEASE_UNAVAILABLE`, `INVALID_REQUEST` — before anything was
    /// submitted), or the store failed during the loop (`LEASE_UNAVAILABLE`).
    #[error(transparent)]
    Lease(LeaseError),
    /// The lease was revoked or lost while the compile ran; the remote job is left to expire.
    #[error("compile aborted: {cause}")]
    Aborted {
        /// Revocation (handler) or `LEASE_LOST` (check).
        cause: AbortCause,
        /// The remote job, if it was submitted.
        job_id: Option<String>,
    },
    /// The compiler failed; its log says why.
    #[error("compile of job {job_id} failed")]
    Failed {
        /// The remote job.
        job_id: String,
        /// The compiler's log.
        log: String,
    },
    /// The service answered 429 despite the lease (no lease configured, or a service smaller than the caps).
    #[error("the tex2pdf service is overloaded (429)")]
    RemoteOverloaded {
        /// The service's `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// The service could not be used: transport error, unexpected status or answer, unknown job.
    #[error(transparent)]
    Remote(ClientError),
    /// The job did not finish within [`CompileConfig::max_duration`].
    #[error("job {job_id} did not finish within {after:?}")]
    TimedOut {
        /// The remote job.
        job_id: String,
        /// The configured maximum.
        after: Duration,
    },
}

impl CompileError {
    /// The outcome label of [`TEX_COMPILE_TOTAL`] and of the log line.
    pub fn outcome(&self) -> &'static str {
        match self {
            CompileError::Lease(LeaseError::Busy(_)) => "busy",
            CompileError::Lease(LeaseError::InvalidRequest { .. }) => "invalid",
            CompileError::Lease(LeaseError::Lost { .. }) | CompileError::Aborted { .. } => "aborted",
            CompileError::Lease(_) => "unavailable",
            CompileError::Failed { .. } => "failed",
            CompileError::RemoteOverloaded { .. } => "overloaded",
            CompileError::Remote(_) => "remote-error",
            CompileError::TimedOut { .. } => "timeout",
        }
    }
}

/// Compiles LaTeX through the tex2pdf service under the `tex` lease. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TexCompiler {
    leases: ResourceLeaseService,
    settings: Arc<LayeredDefinitions>,
    client: Tex2PdfClient,
    tracker: TexCompileTracker,
    pod_id: String,
    config: CompileConfig,
}

impl TexCompiler {
    /// A compiler acquiring from `leases`, reading `tex.lease` from `settings`, compiling with `client`,
    /// registering its loops with `tracker` (share it with the [`TexLeaseHandler`](crate::TexLeaseHandler)), on
    /// pod `pod_id`.
    pub fn new(
        leases: ResourceLeaseService,
        settings: Arc<LayeredDefinitions>,
        client: Tex2PdfClient,
        tracker: TexCompileTracker,
        pod_id: impl Into<String>,
        config: CompileConfig,
    ) -> Self {
        TexCompiler { leases, settings, client, tracker, pod_id: pod_id.into(), config }
    }

    /// The tracker of this compiler's poll loops.
    pub fn tracker(&self) -> &TexCompileTracker {
        &self.tracker
    }

    /// Compiles `req.source` (the flow of the [module docs](self)).
    ///
    /// Dropping the future (the caller went away) unregisters the loop and releases the lease in the background.
    pub async fn compile(&self, req: CompileRequest) -> Result<CompiledPdf, CompileError> {
        let started = Instant::now();
        let result = self.run(&req, started).await;
        let outcome = match &result {
            Ok(_) => "done",
            Err(e) => e.outcome(),
        };
        metrics::counter!(TEX_COMPILE_TOTAL, "outcome" => outcome).increment(1);
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match &result {
            Ok(pdf) => tracing::info!(
                tenant = %req.tenant_id, project = %req.project_id, user = %req.user_id, run = %req.run_id,
                job_id = %pdf.job_id, bytes = pdf.pdf.len(), elapsed_ms, outcome, "tex compile done"
            ),
            Err(e) => tracing::info!(
                tenant = %req.tenant_id, project = %req.project_id, user = %req.user_id, run = %req.run_id,
                elapsed_ms, outcome, error = %e, "tex compile ended without a PDF"
            ),
        }
        result
    }

    async fn run(&self, req: &CompileRequest, started: Instant) -> Result<CompiledPdf, CompileError> {
        let lease_ref = self
            .settings
            .lease_setting(&req.tenant_id, &req.project_id, TEX_LEASE_SETTING, DEFAULT_TEX_LEASE)
            .await
            .map_err(CompileError::Lease)?;
        let request = LeaseRequest::new(TEX_LEASE_TYPE, lease_ref, &req.tenant_id, &req.project_id)
            .user(&req.user_id)
            .holder_ref(&req.run_id)
            .pod(&self.pod_id, true);
        let lease = self.leases.acquire(request).await.map_err(CompileError::Lease)?;
        let mut registration = lease.token().map(|t| self.tracker.register(t, &req.tenant_id, &req.project_id));
        let result = self.guarded(req, &lease, registration.as_mut(), started).await;
        // Unregister first: a revocation from here on finds no loop, as after any ended loop.
        drop(registration);
        self.release(lease, &result).await;
        result
    }

    /// Releases on the result. After a store error the release would most likely wait out the same outage, so it
    /// runs in the background and the error result is not delayed.
    async fn release(&self, lease: Lease, result: &Result<CompiledPdf, CompileError>) {
        let token = lease.token().unwrap_or("noop").to_owned();
        if matches!(result, Err(CompileError::Lease(LeaseError::Unavailable { .. }))) {
            tokio::spawn(async move {
                if let Err(e) = lease.release().await {
                    tracing::warn!(token, error = %e, "tex lease release failed after a store error; the idle reap will free the slot");
                }
            });
            return;
        }
        match lease.release().await {
            Ok(ReleaseOutcome::Released) => {}
            Ok(ReleaseOutcome::AlreadyReleased) => {
                tracing::debug!(token, "tex lease was already gone at release (revoked or reaped)")
            }
            Err(e) => tracing::warn!(token, error = %e, "tex lease release failed; retried in the background"),
        }
    }

    async fn guarded(
        &self,
        req: &CompileRequest,
        lease: &Lease,
        mut registration: Option<&mut CompileRegistration>,
        started: Instant,
    ) -> Result<CompiledPdf, CompileError> {
        let aborted = |r: &Option<&mut CompileRegistration>, job_id: Option<&str>| {
            r.as_ref().and_then(|r| r.aborted()).map(|reason| CompileError::Aborted {
                cause: AbortCause::Revoked(reason),
                job_id: job_id.map(str::to_owned),
            })
        };
        if let Some(e) = aborted(&registration, None) {
            return Err(e);
        }
        let label = format!("{}/{}", req.tenant_id, req.project_id);
        let job_id = match self.client.submit(&req.source, Some(&label)).await {
            Ok(id) => id,
            Err(ClientError::Overloaded { retry_after }) => return Err(CompileError::RemoteOverloaded { retry_after }),
            Err(e) => return Err(CompileError::Remote(e)),
        };
        tracing::debug!(token = lease.token().unwrap_or("noop"), job_id = %job_id, "tex job submitted");
        if let Some(r) = registration.as_deref() {
            r.set_job_id(&job_id);
        }
        let mut payload = Payload::new();
        payload.insert("jobId".to_owned(), job_id.clone().into());
        lease.update_payload(payload).await.map_err(|e| lease_failure(e, &job_id))?;

        // TTL invariant: never sleep longer than a third of the TTL between two checks.
        let max_sleep = match lease.ttl_seconds() {
            Some(ttl) if Duration::from_secs(ttl) / 3 < self.config.poll_interval => {
                let capped = Duration::from_secs(ttl) / 3;
                tracing::warn!(
                    ttl_seconds = ttl,
                    poll_interval_ms = u64::try_from(self.config.poll_interval.as_millis()).unwrap_or(u64::MAX),
                    "the tex lease's TTL is short for the poll interval; polling more often to keep it alive"
                );
                capped
            }
            _ => self.config.poll_interval,
        };
        let deadline = started + self.config.max_duration;
        let mut sleep = self.config.first_poll_delay.min(max_sleep);
        loop {
            if let Some(e) = aborted(&registration, Some(&job_id)) {
                return Err(e);
            }
            lease.check().await.map_err(|e| lease_failure(e, &job_id))?;
            match self.client.poll(&job_id).await {
                Ok(JobState::Running) => {}
                Ok(JobState::Done(pdf)) => return Ok(CompiledPdf { pdf, job_id }),
                Ok(JobState::Failed(log)) => return Err(CompileError::Failed { job_id, log }),
                Err(e) => return Err(CompileError::Remote(e)),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CompileError::TimedOut { job_id, after: self.config.max_duration });
            }
            let nap = tokio::time::sleep(sleep.min(deadline - now));
            match registration.as_deref_mut() {
                Some(r) => {
                    tokio::select! {
                        () = nap => {}
                        _ = r.abort_signal() => {}
                    }
                }
                None => nap.await,
            }
            sleep = (sleep * 2).min(max_sleep);
        }
    }
}

/// A lease error inside the loop: a lost lease aborts the compile, anything else (a store error) ends it as an
/// error result.
fn lease_failure(e: LeaseError, job_id: &str) -> CompileError {
    match e {
        LeaseError::Lost { .. } => CompileError::Aborted { cause: AbortCause::Lost, job_id: Some(job_id.to_owned()) },
        other => CompileError::Lease(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_shared::{Classpath, LeaseDefinition};

    #[test]
    fn the_bundled_ttl_keeps_the_ttl_invariant_with_the_default_pacing() {
        let path = "_vance/config/lease/tex.yaml";
        let doc = Classpath::bundled().document(path).expect("the bundled tex definition").to_owned();
        let def = LeaseDefinition::from_yaml(DEFAULT_TEX_LEASE, &doc).unwrap();
        let ttl = Duration::from_secs(def.ttl_seconds);
        let longest_between_checks = CompileConfig::default().poll_interval + Tex2PdfClient::DEFAULT_REQUEST_TIMEOUT;
        assert!(ttl > longest_between_checks, "TTL {ttl:?} must exceed {longest_between_checks:?}");
        assert!(ttl / 3 >= CompileConfig::default().poll_interval, "the TTL cap would shorten the default interval");
        assert_eq!(def.resource, "tex2pdf");
    }

    /// Web handlers run the compile on a multi-threaded runtime: its future must be `Send`.
    #[allow(dead_code)]
    fn compile_future_is_send(c: &TexCompiler, r: CompileRequest) {
        fn is_send<T: Send>(_: T) {}
        is_send(c.compile(r));
    }

    #[test]
    fn outcomes_name_every_end() {
        let lost = CompileError::Lease(LeaseError::Lost { token: "t".into() });
        assert_eq!(lost.outcome(), "aborted");
        assert_eq!(lease_failure(LeaseError::Lost { token: "t".into() }, "j").outcome(), "aborted");
        let down = lease_failure(LeaseError::Unavailable { reason: "x".into() }, "j");
        assert!(matches!(down, CompileError::Lease(LeaseError::Unavailable { .. })));
        assert_eq!(down.outcome(), "unavailable");
        let cause = AbortCause::Revoked(RevocationReason::Revoke);
        assert_eq!(cause.to_string(), "the lease was revoked (revoke)");
    }
}
