//! The client's typed errors.

use std::time::Duration;

use lease_shared::LeaseError;
use lease_toolpack::GuardError;

/// Why an MCP operation failed.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The configuration cannot be used (bad URL, bad header name or value, empty command).
    #[error("invalid MCP client configuration: {0}")]
    InvalidConfig(String),
    /// The stdio server could not be started.
    #[error("could not start the MCP server `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Reading from or writing to the stdio server failed.
    #[error("I/O with the MCP server failed: {0}")]
    Io(#[from] std::io::Error),
    /// An HTTP request could not be sent or its response not read (connection refused, TLS, reset, timeout).
    #[error("{method} {endpoint} failed: {source}")]
    Http {
        /// The HTTP method.
        method: &'static str,
        /// The endpoint URL.
        endpoint: String,
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an unexpected HTTP status.
    #[error("{method} {endpoint} answered HTTP {status}: {body}")]
    HttpStatus {
        /// The HTTP method.
        method: &'static str,
        /// The endpoint URL.
        endpoint: String,
        /// The status code.
        status: u16,
        /// The start of the response body, for diagnosis.
        body: String,
    },
    /// The server no longer knows the session (HTTP 404 to a request carrying `Mcp-Session-Id`): it expired or was
    /// terminated. A new session must be initialized.
    #[error("the server no longer knows MCP session {session_id} (expired or terminated)")]
    SessionExpired {
        /// The session id the server rejected.
        session_id: String,
    },
    /// The server broke the protocol (malformed JSON-RPC, a stream that ended without the response, an unsupported
    /// protocol version).
    #[error("MCP protocol error: {0}")]
    Protocol(String),
    /// The server answered the request with a JSON-RPC error.
    #[error("the server answered {method} with error {code}: {message}")]
    Rpc {
        /// The JSON-RPC method of the request.
        method: String,
        /// The JSON-RPC error code.
        code: i64,
        /// The error message.
        message: String,
        /// The error's `data`, if any.
        data: Option<Box<serde_json::Value>>,
    },
    /// No response arrived in time.
    #[error("no response to {method} within {timeout:?}")]
    Timeout {
        /// The JSON-RPC method of the request.
        method: String,
        /// The configured request timeout.
        timeout: Duration,
    },
    /// The session's transport is closed (closed by us, or the server process exited or closed its output).
    #[error("the MCP session is closed: {0}")]
    Closed(String),
    /// The session guard refused the session or the call, or found the lease lost
    /// ([`GuardError::Revoked`]: the session was closed; the next call opens a new one).
    #[error(transparent)]
    Guard(#[from] GuardError),
    /// No config layer has a tool config of this name.
    #[error("no tool named {tool:?} is configured")]
    UnknownTool {
        /// The tool's name.
        tool: String,
    },
    /// The tool config could not be used (fail-closed): a layer could not be read or the winning document is
    /// invalid (`LEASE_UNAVAILABLE`, naming the layer), or the tool name is malformed (`INVALID_REQUEST`).
    #[error("tool config: {0}")]
    ToolConfig(#[source] LeaseError),
}

impl McpError {
    /// Whether this is a lost lease ([`lease_toolpack::SessionRevoked`]): the session was closed.
    pub fn is_revoked(&self) -> bool {
        matches!(self, McpError::Guard(g) if g.is_revoked())
    }

    /// Whether the session is unusable after this error, so that a connection must open a new one: the server
    /// forgot it, or the transport is closed.
    pub fn is_session_dead(&self) -> bool {
        matches!(self, McpError::SessionExpired { .. } | McpError::Closed(_))
    }

    /// A stable machine code: the guard's (`LEASE_LOST`, `LEASE_BUSY`, `LEASE_UNAVAILABLE`, `INVALID_REQUEST`)
    /// or the tool config's lease code, `TOOL_NOT_FOUND` for an unknown tool, `TOOL_ERROR` for everything the
    /// MCP server or its transport did.
    pub fn code(&self) -> &str {
        match self {
            McpError::Guard(g) => g.code(),
            McpError::ToolConfig(e) => e.code(),
            McpError::UnknownTool { .. } => "TOOL_NOT_FOUND",
            _ => "TOOL_ERROR",
        }
    }
}
