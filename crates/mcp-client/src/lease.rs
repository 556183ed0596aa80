//! The lease-backed [`SessionGuard`]: every MCP session holds a lease of type `mcp` (spec §7, "Browser Session").
//!
//! | guard step | lease operation |
//! |---|---|
//! | `open` (before the transport) | `acquire`: type `mcp`, the tool's lease reference, the caller's tenant / project / user, `podBound` = stdio |
//! | `after_initialize` | `update_payload` with `toolName`, `endpoint`, `sessionId`, `transport` |
//! | `check` (before every `tools/call`) | `check`: `LEASE_LOST` → [`SessionRevoked`] |
//! | `close` | `release` |
//!
//! Refusals (`LEASE_BUSY`, `LEASE_UNAVAILABLE`, `INVALID_REQUEST`) become [`SessionRefused`] with the lease
//! error's code and text (for `LEASE_BUSY`: resource, level, scope and occupancy); the [`LeaseError`] itself is
//! the refusal's cause ([`SessionRefused::cause_as`]), so a caller can answer with its details.

use async_trait::async_trait;
use lease_shared::{Lease, LeaseError, LeaseRef, LeaseRequest, Payload, ResourceLeaseService};
use lease_toolpack::{
    GuardError, GuardedSession, SessionContext, SessionGuard, SessionInfo, SessionRefused, SessionRevoked,
};
use serde_json::Value;

/// The lease type of MCP sessions; its handler is [`crate::McpLeaseHandler`].
pub const MCP_LEASE_TYPE: &str = "mcp";

/// Payload key: the configured tool's name.
pub const PAYLOAD_TOOL_NAME: &str = "toolName";
/// Payload key: the endpoint (URL for HTTP, command line for stdio).
pub const PAYLOAD_ENDPOINT: &str = "endpoint";
/// Payload key: the `Mcp-Session-Id` (HTTP sessions that have one).
pub const PAYLOAD_SESSION_ID: &str = "sessionId";
/// Payload key: the transport, `stdio` or `streamable-http`.
pub const PAYLOAD_TRANSPORT: &str = "transport";

/// Who uses a tool: the lease's tenant, project and user (and a pool key part).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The tenant.
    pub tenant_id: String,
    /// The project.
    pub project_id: String,
    /// The user (the `user` level of the lease counts per tenant and user, across projects).
    pub user_id: String,
}

impl Caller {
    /// A caller in `tenant` / `project` acting as `user`.
    pub fn new(tenant: impl Into<String>, project: impl Into<String>, user: impl Into<String>) -> Self {
        Caller { tenant_id: tenant.into(), project_id: project.into(), user_id: user.into() }
    }
}

/// A [`SessionGuard`] that holds a lease of type `mcp` per session.
#[derive(Debug, Clone)]
pub struct LeaseGuard {
    leases: ResourceLeaseService,
    lease: LeaseRef,
    caller: Caller,
    pod: String,
}

impl LeaseGuard {
    /// Sessions of `caller` acquire `lease` (the tool config's reference) from `leases`, as holders on `pod`
    /// (this pod's id).
    pub fn new(leases: ResourceLeaseService, lease: LeaseRef, caller: Caller, pod: impl Into<String>) -> Self {
        LeaseGuard { leases, lease, caller, pod: pod.into() }
    }
}

/// The lease error as a guard error: `LEASE_LOST` is a revoked session, everything else a refusal carrying the
/// lease error as its cause.
pub(crate) fn guard_error(e: LeaseError) -> GuardError {
    match e {
        LeaseError::Lost { .. } => SessionRevoked::new(e.to_string()).into(),
        other => SessionRefused::new(other.code(), other.to_string()).with_cause(other).into(),
    }
}

fn payload(tool: &str, endpoint: &str, session_id: Option<&str>, transport: &str) -> Payload {
    let mut p = Payload::new();
    p.insert(PAYLOAD_TOOL_NAME.to_owned(), Value::from(tool));
    p.insert(PAYLOAD_ENDPOINT.to_owned(), Value::from(endpoint));
    if let Some(id) = session_id {
        p.insert(PAYLOAD_SESSION_ID.to_owned(), Value::from(id));
    }
    p.insert(PAYLOAD_TRANSPORT.to_owned(), Value::from(transport));
    p
}

#[async_trait]
impl SessionGuard for LeaseGuard {
    async fn open(&self, ctx: &SessionContext) -> Result<Box<dyn GuardedSession>, GuardError> {
        // What is known before the handshake goes in at once: a revocation before `after_initialize` then finds
        // the tool and transport, and no session id (nothing to terminate remotely).
        let request =
            LeaseRequest::new(MCP_LEASE_TYPE, self.lease.clone(), &self.caller.tenant_id, &self.caller.project_id)
                .user(&self.caller.user_id)
                .holder_ref(format!("mcp:{}", ctx.tool_name))
                .pod(&self.pod, ctx.transport.is_local_process())
                .payload(payload(&ctx.tool_name, &ctx.endpoint, None, ctx.transport.as_str()));
        let lease = self.leases.acquire(request).await.map_err(|e| {
            tracing::info!(tool = %ctx.tool_name, code = e.code(), error = %e, "MCP session refused by its lease");
            guard_error(e)
        })?;
        tracing::debug!(tool = %ctx.tool_name, token = ?lease.token(), "MCP session lease acquired");
        Ok(Box::new(LeaseSession { lease }))
    }
}

/// One session's lease.
#[derive(Debug)]
struct LeaseSession {
    lease: Lease,
}

#[async_trait]
impl GuardedSession for LeaseSession {
    fn token(&self) -> Option<&str> {
        self.lease.token()
    }

    async fn after_initialize(&self, info: &SessionInfo) -> Result<(), GuardError> {
        let p = payload(&info.tool_name, &info.endpoint, info.session_id.as_deref(), info.transport.as_str());
        self.lease.update_payload(p).await.map_err(guard_error)
    }

    async fn check(&self) -> Result<(), GuardError> {
        self.lease.check().await.map_err(guard_error)
    }

    async fn close(&self) -> Result<(), GuardError> {
        // Idempotent: a lease that was revoked (or released) before reports already-released.
        self.lease.release().await.map(drop).map_err(guard_error)
    }
}
