//! Add-ons compiled into the brain (the tex add-on, the MCP client): each brings lease handlers and routes.
//!
//! The brain builds every add-on in [`compiled_in`] before the lease service exists (the service must know every
//! handler type), then asks each for its routes once the pod's services are up, and shuts them down last.

use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use lease_shared::{LayeredDefinitions, LeaseHandler, ResourceLeaseService};

use crate::auth::JwtKeys;
use crate::config::BrainConfig;

/// What an add-on's routes may use.
#[derive(Debug, Clone)]
pub struct AddonContext {
    /// The lease service of this pod.
    pub leases: ResourceLeaseService,
    /// The layered definitions and settings (`tex.lease`, tool configs).
    pub definitions: Arc<LayeredDefinitions>,
    /// Verifies bearer tokens (`None`: the API is disabled; see [`crate::api::bearer_claims`]).
    pub jwt: Option<JwtKeys>,
    /// This pod's id (the `pod` of every lease acquired here).
    pub pod_id: String,
}

/// One add-on.
#[async_trait]
pub trait Addon: Send + Sync + std::fmt::Debug {
    /// The add-on's lease handlers, registered before the lease service is built.
    fn handlers(&self) -> Vec<Arc<dyn LeaseHandler>>;

    /// The add-on's routes, with their state applied.
    fn router(&self, ctx: &AddonContext) -> Router;

    /// Stops the add-on's background work (called on shutdown, after the HTTP server drained).
    async fn shutdown(&self) {}
}

/// Every add-on compiled into this brain, configured from `config`.
pub fn compiled_in(config: &BrainConfig, definitions: &Arc<LayeredDefinitions>) -> Vec<Box<dyn Addon>> {
    vec![Box::new(crate::tex::TexAddon::from_config(config)), Box::new(crate::mcp::McpAddon::new(config, definitions))]
}
