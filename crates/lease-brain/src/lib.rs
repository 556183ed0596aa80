//! The brain: the server every pod runs.
//!
//! For now it serves health, readiness and metrics over the lease service on the embedded or the MongoDB store;
//! the brain issue adds the pod registry, revocation dispatch and the HTTP lease API.
//!
//! # Layout
//! - [`config`]: environment → validated [`BrainConfig`].
//! - [`server`]: store selection, [`server::router`] and [`server::run`] with graceful shutdown.

pub mod config;
pub mod server;

pub use config::{BrainConfig, ConfigError};
