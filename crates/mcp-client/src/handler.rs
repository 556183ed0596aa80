//! The `mcp` lease handler (spec §7, "Handler mcp"): what happens to an MCP session whose lease was revoked.
//!
//! The brain's dispatcher runs it on the holder's pod while that pod lives, and on the reaper pod when the
//! holder's pod is dead and the lease is not pod-bound (an HTTP session; a stdio server died with its pod):
//!
//! - **Holder's pod** (the holder's `pod` is this pod): the pool connection that still holds the revoked lease
//!   (token comparison) is closed — its session gets the `DELETE`. A late revocation of a session that has been
//!   re-opened since finds another token and closes nothing.
//! - **Reaper pod** (the holder's pod is another, dead pod): the tool config is loaded through the layers for the
//!   holder's tenant and project, and the session `DELETE` is sent with the configured auth headers — only if the
//!   tool is still an HTTP tool at the endpoint the session was opened at. A tool that now points elsewhere (or
//!   is gone) gets nothing: the session id means nothing to another server, and the configured auth must not be
//!   sent to an endpoint it was not configured for.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use lease_shared::store::HolderRecord;
use lease_shared::{LayeredDefinitions, LeaseHandler, RevocationReason};
use lease_toolpack::TransportKind;
use reqwest::Url;

use crate::http::terminate_session;
use crate::lease::{MCP_LEASE_TYPE, PAYLOAD_ENDPOINT, PAYLOAD_SESSION_ID, PAYLOAD_TOOL_NAME, PAYLOAD_TRANSPORT};
use crate::pool::McpPool;
use crate::session::TransportConfig;
use crate::tools::ToolConfigs;

/// What the handler did with a revoked `mcp` lease (for logs and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpRevocation {
    /// This pod's pool connection still held the lease: its session was closed.
    ClosedLocal,
    /// No connection of this pod holds the lease any more (closed, re-opened with another lease, or never
    /// pooled): nothing to do.
    NotHeld,
    /// The session `DELETE` was sent for a dead pod's HTTP session, to this endpoint.
    Terminated {
        /// The endpoint the `DELETE` went to.
        endpoint: String,
    },
    /// Nothing was sent for a dead pod's session, for this reason (pod-bound, no session id, the tool moved or
    /// is gone …).
    Skipped(String),
}

/// The lease handler of type `mcp`. Construct it before the lease service (the service must know the type),
/// then [`McpLeaseHandler::attach_pool`] the pod's pool once it exists.
#[derive(Debug)]
pub struct McpLeaseHandler {
    pod: String,
    tools: ToolConfigs,
    pool: OnceLock<McpPool>,
}

impl McpLeaseHandler {
    /// The handler of the pod `pod`, reading tool configs from `layers`.
    pub fn new(pod: impl Into<String>, layers: Arc<LayeredDefinitions>) -> Self {
        McpLeaseHandler { pod: pod.into(), tools: ToolConfigs::new(layers), pool: OnceLock::new() }
    }

    /// Attaches this pod's pool (once; a second pool is refused and returned `false`). Until then a revocation
    /// on this pod finds no connection (none can exist without the pool).
    pub fn attach_pool(&self, pool: McpPool) -> bool {
        self.pool.set(pool).is_ok()
    }

    /// Handles the revocation of `holder` and reports what it did.
    pub async fn revoke(&self, holder: &HolderRecord, reason: RevocationReason) -> Result<McpRevocation, String> {
        if holder.pod == self.pod {
            let Some(pool) = self.pool.get() else { return Ok(McpRevocation::NotHeld) };
            let closed = pool.close_revoked(holder).await.map_err(|e| format!("closing the revoked session: {e}"))?;
            let outcome = if closed { McpRevocation::ClosedLocal } else { McpRevocation::NotHeld };
            tracing::info!(token = %holder.token, %reason, ?outcome, "mcp lease revoked on its own pod");
            return Ok(outcome);
        }
        let outcome = self.terminate_remote(holder).await?;
        tracing::info!(token = %holder.token, pod = %holder.pod, %reason, ?outcome, "mcp lease of another pod revoked");
        Ok(outcome)
    }

    /// The reaper pod's cleanup of a dead pod's session.
    async fn terminate_remote(&self, holder: &HolderRecord) -> Result<McpRevocation, String> {
        let skip = |why: &str| Ok(McpRevocation::Skipped(why.to_owned()));
        if holder.pod_bound {
            return skip("pod-bound: the session's server died with its pod");
        }
        let text = |key: &str| holder.payload.get(key).and_then(|v| v.as_str());
        if text(PAYLOAD_TRANSPORT) != Some(TransportKind::StreamableHttp.as_str()) {
            return skip("not a streamable-http session");
        }
        let (Some(tool), Some(endpoint)) = (text(PAYLOAD_TOOL_NAME), text(PAYLOAD_ENDPOINT)) else {
            return skip("the payload names no tool or endpoint");
        };
        let Some(session_id) = text(PAYLOAD_SESSION_ID) else {
            return skip("no session id: the session never finished its handshake");
        };
        let config = self
            .tools
            .load_current(&holder.tenant_id, &holder.project_id, tool)
            .await
            .map_err(|e| format!("loading the tool config of {tool:?}: {e}"))?;
        let http = match config.map(|c| c.transport) {
            Some(TransportConfig::Http(http)) if same_endpoint(&http.endpoint, endpoint) => http,
            Some(TransportConfig::Http(http)) => {
                tracing::info!(tool, session_endpoint = endpoint, configured = %http.endpoint, "tool now points to another endpoint; no DELETE");
                return skip("the tool now points to another endpoint");
            }
            Some(TransportConfig::Stdio(_)) => return skip("the tool is now a stdio tool"),
            None => return skip("the tool is no longer configured"),
        };
        terminate_session(&http, session_id).await.map_err(|e| format!("session DELETE failed: {e}"))?;
        Ok(McpRevocation::Terminated { endpoint: http.endpoint })
    }
}

/// Whether two endpoint URLs are the same (parsed, so `HTTP://Host:80/mcp` equals `http://host/mcp`).
fn same_endpoint(a: &str, b: &str) -> bool {
    match (Url::parse(a), Url::parse(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[async_trait]
impl LeaseHandler for McpLeaseHandler {
    fn lease_type(&self) -> &str {
        MCP_LEASE_TYPE
    }

    async fn on_revoked(&self, holder: &HolderRecord, reason: RevocationReason) -> Result<(), String> {
        self.revoke(holder, reason).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_compare_parsed() {
        assert!(same_endpoint("HTTP://Host:80/mcp", "http://host/mcp"));
        assert!(!same_endpoint("http://host/mcp", "http://host:8080/mcp"));
        assert!(!same_endpoint("http://host/mcp", "http://other/mcp"));
        assert!(same_endpoint("not a url", "not a url"));
    }
}
