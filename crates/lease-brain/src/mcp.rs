//! The MCP client add-on (spec §7, "Browser Session"): the `mcp` lease handler, the pod's [`McpPool`] and the
//! tool-call endpoint.
//!
//! - `POST /api/v1/projects/{project}/tools/{tool}/call` with `{"name": …, "arguments": {…}}` calls a tool of
//!   the configured MCP server `tool` (`_vance/config/tools/<tool>.yaml` through the layers) for the bearer
//!   token's tenant and user, on their pooled session, and answers the `tools/call` result JSON (`content`,
//!   `structuredContent`, `isError`; a tool's own failure is a 200 with `isError: true`).
//! - Errors: the lease's own (`LEASE_BUSY` 429 with its diagnosis and `Retry-After`, `LEASE_UNAVAILABLE` 503 —
//!   also for an unreadable or invalid tool config —, `INVALID_REQUEST` 400), `MCP_SESSION_REVOKED` 409 (the
//!   session's lease was lost; it was closed and the next call opens a new one), `TOOL_NOT_FOUND` 404,
//!   `TOOL_ERROR` 502 (the MCP server or its transport failed).
//! - The handler closes this pod's session holding a revoked lease, or — on the reaper pod, for a dead pod's
//!   HTTP session — sends its `DELETE` with the configured auth ([`McpLeaseHandler`]).
//! - A pooled session nobody used for `mcp-idle-close-ms` (default 10 minutes) is closed, so a `lease: none`
//!   stdio server does not keep its process forever and an unused session does not keep its slot for a TTL.
//! - Shutdown closes every pooled session (HTTP: `DELETE`) and releases their leases.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use lease_shared::{LayeredDefinitions, LeaseError, LeaseHandler};
use mcp_client::{Caller, GuardError, McpError, McpLeaseHandler, McpPool};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::addons::{Addon, AddonContext};
use crate::api::{ApiError, ToolFailure, bearer_claims};
use crate::auth::JwtKeys;
use crate::config::BrainConfig;

/// The MCP client add-on of one pod.
#[derive(Debug)]
pub struct McpAddon {
    handler: Arc<McpLeaseHandler>,
    pool: OnceLock<McpPool>,
    idle_close: Duration,
    idle_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl McpAddon {
    /// The add-on of the pod configured by `config`, reading tool configs through `definitions`. Its pool is
    /// created with the routes, once the lease service exists.
    pub fn new(config: &BrainConfig, definitions: &Arc<LayeredDefinitions>) -> Self {
        McpAddon {
            handler: Arc::new(McpLeaseHandler::new(config.pod_id.clone(), definitions.clone())),
            pool: OnceLock::new(),
            idle_close: config.mcp_idle_close,
            idle_task: Mutex::new(None),
        }
    }

    /// The pod's pool, once the routes were built.
    pub fn pool(&self) -> Option<&McpPool> {
        self.pool.get()
    }
}

#[derive(Clone)]
struct McpState {
    pool: McpPool,
    jwt: Option<JwtKeys>,
}

#[async_trait]
impl Addon for McpAddon {
    fn handlers(&self) -> Vec<Arc<dyn LeaseHandler>> {
        vec![self.handler.clone()]
    }

    fn router(&self, ctx: &AddonContext) -> Router {
        let pool = self
            .pool
            .get_or_init(|| McpPool::new(ctx.leases.clone(), ctx.definitions.clone(), ctx.pod_id.clone()))
            .clone();
        self.handler.attach_pool(pool.clone());
        let mut task = self.idle_task.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if task.is_none() {
            *task = Some(tokio::spawn(close_idle_loop(pool.clone(), self.idle_close)));
        }
        Router::new()
            .route("/api/v1/projects/{project}/tools/{tool}/call", post(call_tool))
            .with_state(McpState { pool, jwt: ctx.jwt.clone() })
    }

    async fn shutdown(&self) {
        let task = self.idle_task.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(task) = task {
            task.abort();
        }
        if let Some(pool) = self.pool.get() {
            pool.shutdown().await;
        }
    }
}

/// Closes the pool's idle sessions, looking every half of `max_idle` (at most every minute, at least every 100 ms).
async fn close_idle_loop(pool: McpPool, max_idle: Duration) {
    let every = (max_idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(60));
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        pool.close_idle(max_idle).await;
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallBody {
    name: String,
    #[serde(default)]
    arguments: Map<String, Value>,
}

async fn call_tool(
    State(state): State<McpState>,
    Path((project, tool)): Path<(String, String)>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Json<Value>, ApiError> {
    let claims = bearer_claims(state.jwt.as_ref(), &headers)?;
    let body: CallBody = crate::api::body(&bytes)?;
    if body.name.is_empty() {
        return Err(ApiError::invalid("name", "the name of the tool to call"));
    }
    let caller = Caller::new(claims.tenant, project, claims.sub);
    // On a task of its own: a client that hangs up must not cancel a session open or close half-way (a lease
    // held by a session that was never stored, a session dropped without its DELETE).
    let pool = state.pool.clone();
    let called =
        tokio::spawn(async move { pool.call_tool(&caller, &tool, &body.name, body.arguments).await }).await.map_err(
            |e| ApiError::Tool { kind: ToolFailure::Failed, message: format!("the tool call task failed: {e}") },
        )?;
    let result = called.map_err(tool_error)?;
    let json = serde_json::to_value(result)
        .map_err(|e| ApiError::Tool { kind: ToolFailure::Failed, message: format!("tools/call result: {e}") })?;
    Ok(Json(json))
}

/// The HTTP error of a failed tool call: lease refusals keep their lease error (and its details).
fn tool_error(e: McpError) -> ApiError {
    let message = e.to_string();
    match e {
        McpError::Guard(GuardError::Revoked(_)) => ApiError::Tool { kind: ToolFailure::SessionRevoked, message },
        McpError::Guard(GuardError::Refused(refused)) => match refused.cause_as::<LeaseError>() {
            Some(lease) => ApiError::Lease(lease.clone()),
            // Not our guard's refusal (it always carries the lease error): refuse the resource, fail-closed.
            None => ApiError::Lease(LeaseError::Unavailable { reason: refused.to_string() }),
        },
        McpError::ToolConfig(lease) => ApiError::Lease(lease),
        McpError::UnknownTool { .. } => ApiError::Tool { kind: ToolFailure::NotFound, message },
        _ => {
            tracing::warn!(error = %message, "MCP tool call failed");
            ApiError::Tool { kind: ToolFailure::Failed, message }
        }
    }
}
