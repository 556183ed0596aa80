//! `McpPool`: one lease-guarded [`McpConnection`] per (tenant, project, user, tool).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use lease_shared::store::HolderRecord;
use lease_shared::{LayeredDefinitions, ResourceLeaseService};
use serde_json::{Map, Value};

use crate::McpError;
use crate::connection::McpConnection;
use crate::lease::{Caller, LeaseGuard, PAYLOAD_TOOL_NAME};
use crate::protocol::{CallToolResult, Tool};
use crate::tools::{ToolConfig, ToolConfigs};

/// What a pooled connection serves: a caller's use of one tool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// The tenant.
    pub tenant_id: String,
    /// The project.
    pub project_id: String,
    /// The user.
    pub user_id: String,
    /// The configured tool's name.
    pub tool: String,
}

impl PoolKey {
    /// The key of `caller`'s connection to `tool`.
    pub fn new(caller: &Caller, tool: &str) -> Self {
        PoolKey {
            tenant_id: caller.tenant_id.clone(),
            project_id: caller.project_id.clone(),
            user_id: caller.user_id.clone(),
            tool: tool.to_owned(),
        }
    }

    /// The key of the connection that acquired `holder` (an `mcp` lease), if its payload names the tool.
    pub fn of_holder(holder: &HolderRecord) -> Option<Self> {
        Some(PoolKey {
            tenant_id: holder.tenant_id.clone(),
            project_id: holder.project_id.clone(),
            user_id: holder.user_id.clone()?,
            tool: holder.payload.get(PAYLOAD_TOOL_NAME)?.as_str()?.to_owned(),
        })
    }
}

struct Entry {
    config: ToolConfig,
    connection: Arc<McpConnection>,
    /// When a caller last took the connection (under the map lock).
    last_used: Mutex<Instant>,
}

struct Inner {
    leases: ResourceLeaseService,
    tools: ToolConfigs,
    pod: String,
    entries: Mutex<HashMap<PoolKey, Arc<Entry>>>,
    shut_down: AtomicBool,
}

/// The MCP connections of one pod, keyed by (tenant, project, user, tool). Cheap to clone (shared).
///
/// - A connection is created on a caller's first use of a tool, with a [`LeaseGuard`] for that caller and the
///   tool config's lease: the lease follows the *session* (acquired on open, released on close, re-acquired when
///   a revoked session re-opens), not the pool entry.
/// - Every use reads the tool config through the layers; when it changed (endpoint, auth, lease), the entry is
///   replaced and the old connection closed (for HTTP with the session `DELETE`).
/// - [`McpPool::invalidate`] closes one entry; [`McpPool::close_revoked`] closes the connection that still holds a
///   revoked lease (the `mcp` handler); [`McpPool::close_idle`] closes the connections nobody used for a while
///   (a `lease: none` stdio session would otherwise keep its process forever); [`McpPool::shutdown`] closes every
///   connection and refuses new use.
#[derive(Clone)]
pub struct McpPool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for McpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpPool")
            .field("pod", &self.inner.pod)
            .field("connections", &self.len())
            .field("shut_down", &self.inner.shut_down.load(Ordering::SeqCst))
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only map operations happen under the lock; a poisoned map is still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl McpPool {
    /// A pool of the pod `pod`, acquiring leases from `leases` and reading tool configs from `layers`.
    pub fn new(leases: ResourceLeaseService, layers: Arc<LayeredDefinitions>, pod: impl Into<String>) -> Self {
        McpPool {
            inner: Arc::new(Inner {
                leases,
                tools: ToolConfigs::new(layers),
                pod: pod.into(),
                entries: Mutex::new(HashMap::new()),
                shut_down: AtomicBool::new(false),
            }),
        }
    }

    /// The tool configs this pool reads.
    pub fn tools(&self) -> &ToolConfigs {
        &self.inner.tools
    }

    /// How many connections the pool holds (open or not).
    pub fn len(&self) -> usize {
        lock(&self.inner.entries).len()
    }

    /// Whether the pool holds no connection.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The connection of `caller` to `tool` under the tool's current config, creating (or, after a config
    /// change, replacing) it. Opens no session: that happens on the first call.
    pub async fn connection(&self, caller: &Caller, tool: &str) -> Result<Arc<McpConnection>, McpError> {
        self.ensure_running()?;
        let config = self.inner.tools.get(&caller.tenant_id, &caller.project_id, tool).await?;
        let key = PoolKey::new(caller, tool);
        let (connection, replaced) = {
            let mut entries = lock(&self.inner.entries);
            // Checked again under the lock: shutdown drains the map under it.
            self.ensure_running()?;
            match entries.get(&key) {
                Some(e) if e.config == config => {
                    *lock(&e.last_used) = Instant::now();
                    (e.connection.clone(), None)
                }
                existing => {
                    let replaced = existing.cloned();
                    let guard = LeaseGuard::new(
                        self.inner.leases.clone(),
                        config.lease.clone(),
                        caller.clone(),
                        self.inner.pod.clone(),
                    );
                    let connection = Arc::new(McpConnection::new(config.connection_config(), Arc::new(guard)));
                    let entry = Entry { config, connection: connection.clone(), last_used: Mutex::new(Instant::now()) };
                    entries.insert(key.clone(), Arc::new(entry));
                    (connection, replaced)
                }
            }
        };
        if let Some(old) = replaced {
            tracing::info!(tool, tenant = %key.tenant_id, project = %key.project_id, "tool config changed; closing the old connection");
            close_logged(&old.connection).await;
        }
        Ok(connection)
    }

    /// `tools/call` of `name` on `caller`'s connection to `tool` (the lease is checked first; see
    /// [`McpConnection::call_tool`]).
    pub async fn call_tool(
        &self,
        caller: &Caller,
        tool: &str,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, McpError> {
        self.connection(caller, tool).await?.call_tool(name, arguments).await
    }

    /// `tools/list` on `caller`'s connection to `tool`.
    pub async fn list_tools(&self, caller: &Caller, tool: &str) -> Result<Vec<Tool>, McpError> {
        self.connection(caller, tool).await?.list_tools().await
    }

    /// Removes `caller`'s connection to `tool` and closes it (HTTP: the session `DELETE`; the lease is released).
    /// Returns whether there was one.
    pub async fn invalidate(&self, caller: &Caller, tool: &str) -> Result<bool, McpError> {
        let removed = lock(&self.inner.entries).remove(&PoolKey::new(caller, tool));
        match removed {
            Some(e) => e.connection.close().await.map(|()| true),
            None => Ok(false),
        }
    }

    /// Closes the connection whose session still holds the revoked lease `holder` (token comparison): the `mcp`
    /// handler on the holder's pod. A session re-opened since holds another lease and is left alone. Returns
    /// whether a session was closed. The entry stays: the next call opens a new session with a new lease.
    pub async fn close_revoked(&self, holder: &HolderRecord) -> Result<bool, McpError> {
        let candidates: Vec<Arc<Entry>> = {
            let entries = lock(&self.inner.entries);
            match PoolKey::of_holder(holder) {
                Some(key) => entries.get(&key).cloned().into_iter().collect(),
                // A payload without the tool name (not written by this client): look at every connection.
                None => entries.values().cloned().collect(),
            }
        };
        for entry in candidates {
            if entry.connection.close_if_token(&holder.token).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Removes and closes every connection that no caller took for `max_idle` and that no call is using now (HTTP:
    /// the session `DELETE`; the lease is released). Returns how many it closed. The next use of the tool opens a
    /// new session.
    pub async fn close_idle(&self, max_idle: Duration) -> usize {
        let now = Instant::now();
        let idle: Vec<Arc<Entry>> = {
            let mut entries = lock(&self.inner.entries);
            // Callers take their clone of the connection under this lock, so a count of one (the entry's own)
            // means no call is under way and none can start before the entry is gone.
            let keys: Vec<PoolKey> = entries
                .iter()
                .filter(|(_, e)| {
                    now.duration_since(*lock(&e.last_used)) >= max_idle && Arc::strong_count(&e.connection) == 1
                })
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| entries.remove(k)).collect()
        };
        if !idle.is_empty() {
            tracing::info!(connections = idle.len(), "closing idle MCP connections");
        }
        futures_util::future::join_all(idle.iter().map(|e| close_logged(&e.connection))).await;
        idle.len()
    }

    /// Closes every connection (HTTP sessions get their `DELETE`, leases are released) and refuses new use.
    /// Idempotent.
    pub async fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::SeqCst);
        let entries: Vec<Arc<Entry>> = lock(&self.inner.entries).drain().map(|(_, e)| e).collect();
        if !entries.is_empty() {
            tracing::info!(connections = entries.len(), "closing the MCP pool");
        }
        futures_util::future::join_all(entries.iter().map(|e| close_logged(&e.connection))).await;
    }

    fn ensure_running(&self) -> Result<(), McpError> {
        if self.inner.shut_down.load(Ordering::SeqCst) {
            return Err(McpError::Closed("the MCP pool is shut down".to_owned()));
        }
        Ok(())
    }
}

async fn close_logged(connection: &McpConnection) {
    if let Err(e) = connection.close().await {
        tracing::warn!(tool = %connection.config().tool_name, error = %e, "closing an MCP connection failed");
    }
}
