//! The brain: the server every pod runs.
//!
//! # Layout
//! - [`config`]: environment → validated [`BrainConfig`].
//! - [`cluster`]: the pod registry (`cluster_pods`), [`cluster::ClusterService`] and
//!   [`cluster::LeasePodLiveness`], the one definition of "pod alive".
//! - [`dispatch`]: the handler registry, the revocation dispatcher (the brain's `LeaseRevocationListener`) and
//!   the built-in `webhook` handler.
//! - [`auth`]: HS256 bearer tokens and the internal shared secret.
//! - [`api`]: the lease API and internal routes, and the one place errors become HTTP statuses.
//! - [`admin`]: the operator's endpoints (internal secret) over [`ops`], the operator's view across tenants.
//! - [`insights`]: Tenant Insights (spec §9), the tenant ADMIN's holders, counters (with drift) and revoke.
//! - [`addons`]: the add-on seam (handlers and routes of the tex add-on and the MCP client).
//! - [`mcp`]: the MCP client add-on (tool-call endpoint, `mcp` handler, the pod's MCP pool).
//! - [`server`]: wiring, [`server::router`], [`server::run`] with graceful shutdown.
//! - [`tex`]: the tex add-on (compile endpoint, `tex` handler); [`tex2pdf_double`]: the tex2pdf test double.

pub mod addons;
pub mod admin;
pub mod api;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod dispatch;
pub mod insights;
pub mod mcp;
pub mod ops;
pub mod server;
pub mod tex;
pub mod tex2pdf_double;

pub use config::{BrainConfig, ConfigError};
