//! The MCP client whose sessions are guarded by leases.
//!
//! - [`McpSession`]: one initialized session over stdio ([`StdioConfig`]: a child process speaking
//!   newline-delimited JSON-RPC 2.0) or Streamable HTTP ([`HttpConfig`]: POSTs answered with JSON or an SSE
//!   stream, `Mcp-Session-Id` and `MCP-Protocol-Version` on every request after `initialize`, configurable auth
//!   headers on every request). Operations: `initialize` (+ `notifications/initialized`), `tools/list`,
//!   `tools/call`. Closing an HTTP session sends the session-termination `DELETE` with the session id and the same
//!   auth headers; a 405 (or 404) answer is not an error.
//! - [`McpConnection`]: a configured tool's session, opened on demand and re-opened after close, tied to a
//!   [`lease_toolpack::SessionGuard`] (open → after-initialize → check before every call → close).
//! - [`terminate_session`]: the `DELETE` for a session this process does not hold (revocation cleanup).
//!
//! Still to come here: the connection pool, the lease-backed `SessionGuard` and the `mcp` lease handler. The crate
//! serves no HTTP itself.

mod connection;
mod error;
mod http;
mod jsonrpc;
mod protocol;
mod session;
mod stdio;

pub use connection::{ConnectionConfig, McpConnection};
pub use error::McpError;
pub use http::{HttpConfig, PROTOCOL_VERSION_HEADER, SESSION_ID_HEADER, terminate_session};
pub use protocol::{
    CallToolResult, Implementation, InitializeResult, PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS, ServerInfo, Tool,
};
pub use session::{McpSession, SessionOptions, TransportConfig};
pub use stdio::StdioConfig;
