//! The MCP client whose sessions are guarded by leases (spec §7, "Browser Session").
//!
//! - [`McpSession`]: one initialized session over stdio ([`StdioConfig`]: a child process speaking
//!   newline-delimited JSON-RPC 2.0) or Streamable HTTP ([`HttpConfig`]: POSTs answered with JSON or an SSE
//!   stream, `Mcp-Session-Id` and `MCP-Protocol-Version` on every request after `initialize`, configurable auth
//!   headers on every request). Operations: `initialize` (+ `notifications/initialized`), `tools/list`,
//!   `tools/call`. Closing an HTTP session sends the session-termination `DELETE` with the session id and the same
//!   auth headers; a 405 (or 404) answer is not an error.
//! - [`McpConnection`]: a configured tool's session, opened on demand and re-opened after close, tied to a
//!   [`lease_toolpack::SessionGuard`] (open → after-initialize → check before every call → close).
//! - [`LeaseGuard`]: the lease-backed guard — every session holds a lease of type `mcp` ([`MCP_LEASE_TYPE`]).
//! - [`ToolConfig`] / [`ToolConfigs`]: tool configs (`_vance/config/tools/<tool>.yaml`: transport, auth headers,
//!   `lease`) read through the config layers.
//! - [`McpPool`]: one connection per (tenant, project, user, tool), following config changes; shutdown closes
//!   every session.
//! - [`McpLeaseHandler`]: the `mcp` lease handler — closes this pod's revoked session, or sends a dead pod's
//!   session `DELETE` from the reaper pod with the configured auth.
//! - [`terminate_session`]: the `DELETE` for a session this process does not hold (revocation cleanup).
//!
//! The crate serves no HTTP itself.

mod connection;
mod error;
mod handler;
mod http;
mod jsonrpc;
mod lease;
mod pool;
mod protocol;
mod session;
mod stdio;
mod tools;

pub use connection::{ConnectionConfig, McpConnection};
pub use error::McpError;
pub use handler::{McpLeaseHandler, McpRevocation};
pub use http::{HttpConfig, PROTOCOL_VERSION_HEADER, SESSION_ID_HEADER, terminate_session};
pub use lease::{
    Caller, LeaseGuard, MCP_LEASE_TYPE, PAYLOAD_ENDPOINT, PAYLOAD_SESSION_ID, PAYLOAD_TOOL_NAME, PAYLOAD_TRANSPORT,
};
/// The guard seam of `lease-toolpack`, for users of this crate.
pub use lease_toolpack::{
    GuardError, GuardedSession, NoopGuard, SessionContext, SessionGuard, SessionInfo, SessionRefused, SessionRevoked,
    TransportKind,
};
pub use pool::{McpPool, PoolKey};
pub use protocol::{
    CallToolResult, Implementation, InitializeResult, PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS, ServerInfo, Tool,
};
pub use session::{McpSession, SessionOptions, TransportConfig};
pub use stdio::StdioConfig;
pub use tools::{ToolConfig, ToolConfigs};
