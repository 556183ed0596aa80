//! The narrow bridge between tool clients and leases (spec §7, "Browser Session").
//!
//! A tool client (the MCP client's `McpConnection`) ties a lease to the lifecycle of one session through two
//! small traits:
//!
//! 1. [`SessionGuard::open`] when a session opens, *before* the transport is opened (the lease is acquired).
//!    It returns a [`GuardedSession`] for this one session, or refuses with [`GuardError::Refused`]
//!    (`LEASE_BUSY`, `LEASE_UNAVAILABLE`, …): the client then opens no transport.
//! 2. [`GuardedSession::after_initialize`] once the handshake is done, with the [`SessionInfo`] the lease
//!    handler needs for cleanup (tool name, endpoint, session id, transport kind: the lease payload).
//! 3. [`GuardedSession::check`] before every tool call (check-at-use and touch). [`GuardError::Revoked`] means
//!    the lease was lost: the client closes the session and fails the call with the error; its next call opens a
//!    new session with a new [`SessionGuard::open`].
//! 4. [`GuardedSession::close`] when the session closes (the lease is released). A failure anywhere after
//!    `open` (transport open, handshake, `after_initialize`) closes the guarded session at once.
//!
//! The traits are async (`async-trait`) and object safe; a client holds its guard as `Arc<dyn SessionGuard>`.
//! [`NoopGuard`] is the guard of clients without leases. This crate knows nothing of MongoDB, of `lease-shared`
//! or of HTTP servers: a tool client depends on this crate alone, and the lease-backed implementation lives with
//! the client that needs it.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

/// The transport a session runs over. The lease's `podBound` follows it: a stdio server is a child process and
/// dies with the pod, an HTTP session lives on in the foreign server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// A child process spoken to over stdin/stdout.
    Stdio,
    /// A remote MCP server spoken to over Streamable HTTP.
    StreamableHttp,
}

impl TransportKind {
    /// Whether the session's resource lives in a child process of this process, and so dies with it (stdio).
    pub fn is_local_process(self) -> bool {
        matches!(self, TransportKind::Stdio)
    }

    /// A stable lower-case name: `stdio` or `streamable-http`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Stdio => "stdio",
            TransportKind::StreamableHttp => "streamable-http",
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a guard learns when a session is about to open (before any transport exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionContext {
    /// The configured tool's name (the `mcp_server` tool config), e.g. `browser`.
    pub tool_name: String,
    /// Where the session goes: the URL for Streamable HTTP, the command line for stdio.
    pub endpoint: String,
    /// The transport the session will use.
    pub transport: TransportKind,
}

/// What a guard learns once the session is initialized: what a lease handler needs to clean the session up
/// (spec §6: "mcp: Endpoint + Mcp-Session-Id").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The configured tool's name.
    pub tool_name: String,
    /// The URL for Streamable HTTP, the command line for stdio.
    pub endpoint: String,
    /// The `Mcp-Session-Id` the server assigned; `None` for stdio and for servers without sessions.
    pub session_id: Option<String>,
    /// The transport the session uses.
    pub transport: TransportKind,
}

/// A call found the session's lease lost (reaped or revoked, `LEASE_LOST`): the session must be closed and must
/// not be used any more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("session revoked: {message}")]
pub struct SessionRevoked {
    /// Why, for logs and the caller (e.g. the lease error's text).
    pub message: String,
}

impl SessionRevoked {
    /// A revoked-session error with the given reason.
    pub fn new(message: impl Into<String>) -> Self {
        SessionRevoked { message: message.into() }
    }
}

/// The guard refused a session or a call without the lease being lost: the resource is busy, the lease store is
/// unavailable, or the lease reference is invalid. The session (if any) stays usable; only this step failed.
///
/// `cause` carries the guard's own typed error (e.g. the lease error with its busy diagnosis: resource, level,
/// occupancy, retry hint) for callers that know the guard's error type ([`SessionRefused::cause_as`]); this crate
/// does not know those types. Equality compares code and message only.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct SessionRefused {
    /// The stable machine code, e.g. `LEASE_BUSY`, `LEASE_UNAVAILABLE` or `INVALID_REQUEST`.
    pub code: String,
    /// A human-readable diagnosis (for `LEASE_BUSY`: resource, level and occupancy).
    pub message: String,
    /// The guard's own error behind the refusal, if it has one.
    #[source]
    pub cause: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl SessionRefused {
    /// A refusal with the given code and message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        SessionRefused { code: code.into(), message: message.into(), cause: None }
    }

    /// Attaches the guard's own error (see [`SessionRefused::cause_as`]).
    pub fn with_cause(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.cause = Some(Arc::new(cause));
        self
    }

    /// The attached cause, if there is one and it is an `E`.
    pub fn cause_as<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.cause.as_deref()?.downcast_ref::<E>()
    }
}

impl PartialEq for SessionRefused {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code && self.message == other.message
    }
}

impl Eq for SessionRefused {}

/// Why a guard operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    /// The lease was lost; the session must be closed.
    #[error(transparent)]
    Revoked(#[from] SessionRevoked),
    /// The step was refused (busy, unavailable, invalid); the lease, if any, is not known to be lost.
    #[error(transparent)]
    Refused(#[from] SessionRefused),
}

impl GuardError {
    /// The machine code: `LEASE_LOST` for [`GuardError::Revoked`], the refusal's code otherwise.
    pub fn code(&self) -> &str {
        match self {
            GuardError::Revoked(_) => "LEASE_LOST",
            GuardError::Refused(r) => &r.code,
        }
    }

    /// Whether the session's lease was lost.
    pub fn is_revoked(&self) -> bool {
        matches!(self, GuardError::Revoked(_))
    }
}

/// Guards sessions of one tool client: asked once per session that is about to open.
///
/// Implementations must be cheap to share (`Arc<dyn SessionGuard>`) and safe to call concurrently.
#[async_trait]
pub trait SessionGuard: Send + Sync + 'static {
    /// Called when a session is about to open, before its transport is opened (acquire). On success the client
    /// owns the returned guarded session and calls [`GuardedSession::close`] exactly when the session ends,
    /// including when opening it fails afterwards. On error the client opens no transport.
    async fn open(&self, ctx: &SessionContext) -> Result<Box<dyn GuardedSession>, GuardError>;
}

/// The guard's side of one open session (a held lease).
///
/// All methods take `&self`: an implementation uses interior mutability where it needs state, so a client may
/// check concurrently from several calls on one session.
#[async_trait]
pub trait GuardedSession: Send + Sync + 'static {
    /// The token identifying what this session holds (the lease token), if any. A revocation handler compares it
    /// to decide whether a pooled session still holds the revoked lease; a session that has since been re-opened
    /// holds another token and is left alone.
    fn token(&self) -> Option<&str>;

    /// Called once after the session's handshake, with what a handler needs to clean the session up (the lease
    /// payload). An error makes the client close the session and this guarded session at once.
    async fn after_initialize(&self, info: &SessionInfo) -> Result<(), GuardError>;

    /// Called before every tool call (check-at-use; also a touch). [`GuardError::Revoked`] makes the client close
    /// the session; [`GuardError::Refused`] fails only this call.
    async fn check(&self) -> Result<(), GuardError>;

    /// Called when the session closes (release). The client calls it once per session; implementations must
    /// still be idempotent. An error is reported to the caller for logging; the session is closed regardless.
    async fn close(&self) -> Result<(), GuardError>;
}

/// The guard of clients without leases: every session opens, every check passes, nothing is held.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopGuard;

/// The guarded session of [`NoopGuard`]: holds nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopSession;

#[async_trait]
impl SessionGuard for NoopGuard {
    async fn open(&self, _ctx: &SessionContext) -> Result<Box<dyn GuardedSession>, GuardError> {
        Ok(Box::new(NoopSession))
    }
}

#[async_trait]
impl GuardedSession for NoopSession {
    fn token(&self) -> Option<&str> {
        None
    }

    async fn after_initialize(&self, _info: &SessionInfo) -> Result<(), GuardError> {
        Ok(())
    }

    async fn check(&self) -> Result<(), GuardError> {
        Ok(())
    }

    async fn close(&self) -> Result<(), GuardError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn ctx() -> SessionContext {
        SessionContext {
            tool_name: "browser".into(),
            endpoint: "http://127.0.0.1:1/mcp".into(),
            transport: TransportKind::StreamableHttp,
        }
    }

    #[tokio::test]
    async fn noop_guard_opens_checks_and_closes() {
        let guard: Arc<dyn SessionGuard> = Arc::new(NoopGuard);
        let session = guard.open(&ctx()).await.unwrap();
        assert_eq!(session.token(), None);
        let info = SessionInfo {
            tool_name: "browser".into(),
            endpoint: "http://127.0.0.1:1/mcp".into(),
            session_id: Some("abc".into()),
            transport: TransportKind::StreamableHttp,
        };
        session.after_initialize(&info).await.unwrap();
        session.check().await.unwrap();
        session.close().await.unwrap();
        session.close().await.unwrap();
    }

    #[test]
    fn error_codes_and_display() {
        let revoked = GuardError::from(SessionRevoked::new("lease abc was lost"));
        assert!(revoked.is_revoked());
        assert_eq!(revoked.code(), "LEASE_LOST");
        assert_eq!(revoked.to_string(), "session revoked: lease abc was lost");

        let busy = GuardError::from(SessionRefused::new("LEASE_BUSY", "browser: user level full"));
        assert!(!busy.is_revoked());
        assert_eq!(busy.code(), "LEASE_BUSY");
        assert_eq!(busy.to_string(), "LEASE_BUSY: browser: user level full");
    }

    #[test]
    fn a_refusal_carries_its_typed_cause() {
        #[derive(Debug, thiserror::Error, PartialEq)]
        #[error("busy at level {0}")]
        struct Busy(&'static str);

        let refused = SessionRefused::new("LEASE_BUSY", "busy at level user").with_cause(Busy("user"));
        assert_eq!(refused.cause_as::<Busy>(), Some(&Busy("user")));
        assert!(refused.cause_as::<std::fmt::Error>().is_none());
        assert_eq!(std::error::Error::source(&refused).map(ToString::to_string).as_deref(), Some("busy at level user"));
        assert_eq!(refused, SessionRefused::new("LEASE_BUSY", "busy at level user"), "equality ignores the cause");
        assert!(SessionRefused::new("X", "y").cause.is_none());
    }

    #[test]
    fn transport_kind_names() {
        assert!(TransportKind::Stdio.is_local_process());
        assert!(!TransportKind::StreamableHttp.is_local_process());
        assert_eq!(TransportKind::StreamableHttp.to_string(), "streamable-http");
    }
}
