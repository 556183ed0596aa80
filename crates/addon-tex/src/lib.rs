//! The tex add-on: lease-guarded PDF compiles (spec §7, "tex2pdf").
//!
//! # Layout
//! - [`client`]: [`Tex2PdfClient`], the HTTP client of the remote compile service (contract below).
//! - [`compile`]: [`TexCompiler`], the compile flow of spec §7 — the `tex.lease` setting, acquire before submit,
//!   the job id into the lease payload, `check()` in every poll iteration, release on the result.
//! - [`tracker`]: [`TexCompileTracker`], the running poll loops of this pod by lease token, and the `tex` lease
//!   handler [`TexLeaseHandler`] that marks a revoked loop aborted.
//!
//! This crate serves no HTTP: the brain mounts the compile endpoint and registers the handler.
//!
//! # The tex2pdf HTTP contract
//!
//! A compile is a job: submit the LaTeX source, then poll until it is done or failed. The service has **no cancel
//! endpoint**: a job that nobody polls any more runs to its end and expires server-side.
//!
//! | request | answers |
//! |---|---|
//! | `POST /jobs` with JSON `{"source": "<LaTeX>"}` | `202 {"jobId": "<id>"}`; `429` when overloaded (optional `Retry-After` in seconds); `400` for a malformed body |
//! | `GET /jobs/{jobId}` | `200 {"state": "running"}` \| `200 {"state": "done", "pdfBase64": "<standard base64>"}` \| `200 {"state": "failed", "log": "<compiler log>"}`; `404` for an unknown or expired job |
//!
//! Paths are relative to the configured base URL (which may carry a path prefix). The client sends the optional,
//! purely informational header `X-Tex2pdf-Label: <tenant>/<project>` with a submit (a real service ignores it;
//! the brain's test double keeps its concurrency statistics by it). Unknown JSON fields are ignored, so the service
//! may add fields. Any other status, or a body that does not match, is a protocol error.
//!
//! The service answers 429 when it is overloaded; with the lease in front of it that never happens, because the
//! bundled `tex` definition (global 6, tenant 3, project 1) admits no more compiles than it can take. Overload then
//! shows up as `LEASE_BUSY` with its diagnosis before anything is submitted. A 429 despite the lease (the lease
//! switched off with `tex.lease: none`, or a service smaller than the caps) is its own error,
//! [`CompileError::RemoteOverloaded`].

pub mod client;
pub mod compile;
pub mod tracker;

pub use client::{ClientError, JobState, LABEL_HEADER, Tex2PdfClient};
pub use compile::{
    AbortCause, CompileConfig, CompileError, CompileRequest, CompiledPdf, DEFAULT_TEX_LEASE, TEX_COMPILE_TOTAL,
    TEX_LEASE_TYPE, TexCompiler,
};
pub use tracker::{CompileRegistration, RunningCompile, TexCompileTracker, TexLeaseHandler, TrackerStats};
