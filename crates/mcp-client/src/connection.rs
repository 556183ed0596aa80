//! `McpConnection`: a configured tool's MCP session, opened on demand and guarded by a [`SessionGuard`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use lease_toolpack::{GuardedSession, SessionContext, SessionGuard, SessionInfo};
use serde_json::{Map, Value};

use crate::McpError;
use crate::protocol::{CallToolResult, Tool};
use crate::session::{McpSession, SessionOptions, TransportConfig};

/// What an [`McpConnection`] connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// The configured tool's name (what the guard and the lease payload call it).
    pub tool_name: String,
    /// The server and its transport.
    pub transport: TransportConfig,
    /// Session options.
    pub options: SessionOptions,
}

impl ConnectionConfig {
    /// A connection to `transport` for the tool `tool_name`, with default options.
    pub fn new(tool_name: impl Into<String>, transport: impl Into<TransportConfig>) -> Self {
        ConnectionConfig {
            tool_name: tool_name.into(),
            transport: transport.into(),
            options: SessionOptions::default(),
        }
    }
}

/// An open session with its guard.
struct Active {
    session: McpSession,
    guarded: Box<dyn GuardedSession>,
    closed: AtomicBool,
}

impl Active {
    /// Closes the session (HTTP: the `DELETE`), then the guarded session (release) — once, whatever happens.
    /// Reports the session's close error first, else the guard's.
    async fn close(&self) -> Result<(), McpError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let closed = self.session.close().await;
        if let Err(e) = &closed {
            tracing::warn!(error = %e, "closing the MCP session failed");
        }
        let released = release(self.guarded.as_ref()).await;
        closed?;
        released
    }
}

/// Closes a guarded session, logging a failure.
async fn release(guarded: &dyn GuardedSession) -> Result<(), McpError> {
    guarded.close().await.map_err(|e| {
        tracing::warn!(error = %e, "closing the session guard failed");
        McpError::Guard(e)
    })
}

/// A configured tool's MCP connection: opens a session on first use and re-opens one after the session was
/// closed (by [`McpConnection::close`], a revoked guard, or a session the server or process lost).
///
/// The session's lifecycle is tied to a [`SessionGuard`] (spec §7, "Browser Session"):
/// - `guard.open` before the transport is opened; a refusal opens nothing;
/// - `after_initialize` with tool name, endpoint, session id and transport once the handshake is done;
/// - `check` before every `tools/call`: a [`lease_toolpack::SessionRevoked`] closes the session and fails the
///   call, the next call opens a new session (a new `guard.open`); a refusal fails only the call;
/// - `close` of the guarded session when the session closes; a failure after `guard.open` (transport, handshake,
///   `after_initialize`) closes it at once.
///
/// Calls may run concurrently on one connection; opening is serialized. Call [`McpConnection::close`] when done;
/// a connection dropped with an open session closes it in the background (if a tokio runtime is running).
pub struct McpConnection {
    config: ConnectionConfig,
    guard: Arc<dyn SessionGuard>,
    active: tokio::sync::Mutex<Option<Arc<Active>>>,
}

impl std::fmt::Debug for McpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpConnection").field("config", &self.config).finish_non_exhaustive()
    }
}

impl McpConnection {
    /// A connection that opens nothing until its first call.
    pub fn new(config: ConnectionConfig, guard: Arc<dyn SessionGuard>) -> Self {
        McpConnection { config, guard, active: tokio::sync::Mutex::new(None) }
    }

    /// The configuration.
    pub fn config(&self) -> &ConnectionConfig {
        &self.config
    }

    /// Whether a session is open.
    pub async fn is_open(&self) -> bool {
        self.active.lock().await.is_some()
    }

    /// The open session's `Mcp-Session-Id`, if a session is open and has one.
    pub async fn session_id(&self) -> Option<String> {
        self.active.lock().await.as_ref().and_then(|a| a.session.session_id())
    }

    /// The open session, opening one if there is none.
    async fn session(&self) -> Result<Arc<Active>, McpError> {
        let mut slot = self.active.lock().await;
        if let Some(active) = slot.as_ref() {
            return Ok(active.clone());
        }
        let active = Arc::new(self.open().await?);
        *slot = Some(active.clone());
        Ok(active)
    }

    async fn open(&self) -> Result<Active, McpError> {
        let transport = self.config.transport.kind();
        let endpoint = self.config.transport.endpoint();
        let ctx = SessionContext { tool_name: self.config.tool_name.clone(), endpoint: endpoint.clone(), transport };
        let guarded = self.guard.open(&ctx).await?;
        let session = match McpSession::open(&self.config.transport, &self.config.options).await {
            Ok(session) => session,
            Err(e) => {
                let _ = release(guarded.as_ref()).await;
                return Err(e);
            }
        };
        let info = SessionInfo {
            tool_name: self.config.tool_name.clone(),
            endpoint,
            session_id: session.session_id(),
            transport,
        };
        if let Err(e) = guarded.after_initialize(&info).await {
            if let Err(close_err) = session.close().await {
                tracing::warn!(error = %close_err, "closing a session after the guard refused it");
            }
            let _ = release(guarded.as_ref()).await;
            return Err(e.into());
        }
        tracing::debug!(tool = %self.config.tool_name, session_id = ?info.session_id, "MCP session opened");
        Ok(Active { session, guarded, closed: AtomicBool::new(false) })
    }

    /// Forgets `active` if it is still the open session, and closes it. Whoever removes it closes it, once.
    async fn discard(&self, active: &Arc<Active>) {
        let current = {
            let mut slot = self.active.lock().await;
            let current = slot.as_ref().is_some_and(|a| Arc::ptr_eq(a, active));
            if current {
                slot.take();
            }
            current
        };
        if current {
            // Errors are logged inside; the caller reports the error that made it discard the session.
            let _ = active.close().await;
        }
    }

    /// `tools/list` on the open session (opening one if needed). Not guarded by a check: it uses no resource.
    pub async fn list_tools(&self) -> Result<Vec<Tool>, McpError> {
        let active = self.session().await?;
        let result = active.session.list_tools().await;
        self.after_call(&active, result).await
    }

    /// `tools/call` on the open session (opening one if needed), after the guard's check.
    pub async fn call_tool(&self, name: &str, arguments: Map<String, Value>) -> Result<CallToolResult, McpError> {
        let active = self.session().await?;
        if let Err(e) = active.guarded.check().await {
            if e.is_revoked() {
                tracing::info!(tool = %self.config.tool_name, error = %e, "session revoked; closing it");
                self.discard(&active).await;
            }
            return Err(e.into());
        }
        let result = active.session.call_tool(name, arguments).await;
        self.after_call(&active, result).await
    }

    /// A session the server or process lost is closed, so that the next call opens a new one.
    async fn after_call<T>(&self, active: &Arc<Active>, result: Result<T, McpError>) -> Result<T, McpError> {
        if let Err(e) = &result {
            if e.is_session_dead() {
                tracing::info!(tool = %self.config.tool_name, error = %e, "MCP session lost; closing it");
                self.discard(active).await;
            }
        }
        result
    }

    /// Closes the open session, if any: the HTTP `DELETE` (with the session's auth headers), then the guard's
    /// close. Idempotent. The next call opens a new session.
    pub async fn close(&self) -> Result<(), McpError> {
        let active = self.active.lock().await.take();
        match active {
            Some(active) => active.close().await,
            None => Ok(()),
        }
    }

    /// Closes the open session only if its guarded session holds `token` (a revocation handler's check that this
    /// connection still holds the revoked lease; a session re-opened since holds another token). Returns whether
    /// it closed one.
    pub async fn close_if_token(&self, token: &str) -> Result<bool, McpError> {
        let active = {
            let mut slot = self.active.lock().await;
            let holds = slot.as_ref().is_some_and(|a| a.guarded.token() == Some(token));
            if holds { slot.take() } else { None }
        };
        match active {
            Some(active) => active.close().await.map(|()| true),
            None => Ok(false),
        }
    }
}

impl Drop for McpConnection {
    fn drop(&mut self) {
        let Some(active) = self.active.get_mut().take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                tracing::debug!(tool = %self.config.tool_name, "connection dropped with an open session; closing it");
                rt.spawn(async move {
                    let _ = active.close().await;
                });
            }
            Err(_) => tracing::warn!(
                tool = %self.config.tool_name,
                "connection dropped outside a tokio runtime; its session and guard are not closed"
            ),
        }
    }
}
