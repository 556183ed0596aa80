//! One initialized MCP session over either transport.

use std::time::Duration;

use lease_toolpack::TransportKind;
use serde_json::{Map, Value, json};

use crate::McpError;
use crate::http::{HttpConfig, HttpTransport};
use crate::protocol::{
    CallToolResult, Implementation, InitializeResult, ListToolsResult, PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS,
    Tool,
};
use crate::stdio::{StdioConfig, StdioTransport};

/// More `tools/list` pages than this is taken for a server that loops.
const MAX_TOOL_PAGES: usize = 1000;

/// Which server to talk to, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportConfig {
    /// A child process over stdio.
    Stdio(StdioConfig),
    /// A remote server over Streamable HTTP.
    Http(HttpConfig),
}

impl TransportConfig {
    /// The transport kind.
    pub fn kind(&self) -> TransportKind {
        match self {
            TransportConfig::Stdio(_) => TransportKind::Stdio,
            TransportConfig::Http(_) => TransportKind::StreamableHttp,
        }
    }

    /// The endpoint: the URL for HTTP, the command line for stdio.
    pub fn endpoint(&self) -> String {
        match self {
            TransportConfig::Stdio(c) => c.command_line(),
            TransportConfig::Http(c) => c.endpoint.clone(),
        }
    }
}

impl From<StdioConfig> for TransportConfig {
    fn from(c: StdioConfig) -> Self {
        TransportConfig::Stdio(c)
    }
}

impl From<HttpConfig> for TransportConfig {
    fn from(c: HttpConfig) -> Self {
        TransportConfig::Http(c)
    }
}

/// Options of every session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    /// Sent as `clientInfo` in `initialize`.
    pub client_info: Implementation,
    /// How long one request (including `initialize`) may wait for its response. Default 120 s.
    pub request_timeout: Duration,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { client_info: Implementation::default(), request_timeout: Duration::from_secs(120) }
    }
}

enum Transport {
    Stdio(StdioTransport),
    Http(HttpTransport),
}

impl Transport {
    async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, McpError> {
        match self {
            Transport::Stdio(t) => t.request(method, params).await,
            Transport::Http(t) => t.request(method, params).await,
        }
    }

    async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), McpError> {
        match self {
            Transport::Stdio(t) => t.notify(method, params).await,
            Transport::Http(t) => t.notify(method, params).await,
        }
    }

    async fn close(&self) -> Result<(), McpError> {
        match self {
            Transport::Stdio(t) => {
                t.close().await;
                Ok(())
            }
            Transport::Http(t) => t.close().await,
        }
    }
}

/// An initialized MCP session: `initialize` answered and `notifications/initialized` sent.
///
/// Call [`McpSession::close`] when done: for HTTP it sends the session-termination `DELETE`. Dropping an open
/// session kills a stdio server but leaves an HTTP session on the server until it expires.
pub struct McpSession {
    transport: Transport,
    init: InitializeResult,
    timeout: Duration,
}

impl std::fmt::Debug for McpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpSession")
            .field("server", &self.init.server_info)
            .field("protocol_version", &self.init.protocol_version)
            .field("session_id", &self.session_id())
            .finish()
    }
}

impl McpSession {
    /// Opens the transport and runs the handshake. Anything that fails after the transport is open closes it
    /// again (for HTTP, with the `DELETE` if the server already assigned a session).
    pub async fn open(config: &TransportConfig, options: &SessionOptions) -> Result<Self, McpError> {
        let transport = match config {
            TransportConfig::Stdio(c) => Transport::Stdio(StdioTransport::spawn(c)?),
            TransportConfig::Http(c) => Transport::Http(HttpTransport::new(c)?),
        };
        match Self::handshake(&transport, options).await {
            Ok(init) => Ok(McpSession { transport, init, timeout: options.request_timeout }),
            Err(e) => {
                if let Err(close_err) = transport.close().await {
                    tracing::warn!(error = %close_err, "closing a session whose handshake failed");
                }
                Err(e)
            }
        }
    }

    async fn handshake(transport: &Transport, options: &SessionOptions) -> Result<InitializeResult, McpError> {
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": options.client_info,
        });
        let result =
            timed(options.request_timeout, "initialize", transport.request("initialize", Some(params))).await?;
        let init: InitializeResult = serde_json::from_value(result)
            .map_err(|e| McpError::Protocol(format!("malformed initialize result: {e}")))?;
        if !SUPPORTED_PROTOCOL_VERSIONS.contains(&init.protocol_version.as_str()) {
            return Err(McpError::Protocol(format!(
                "the server chose protocol version {:?}; this client supports {SUPPORTED_PROTOCOL_VERSIONS:?}",
                init.protocol_version
            )));
        }
        if let Transport::Http(t) = transport {
            t.set_protocol_version(&init.protocol_version);
        }
        timed(
            options.request_timeout,
            "notifications/initialized",
            transport.notify("notifications/initialized", None),
        )
        .await?;
        Ok(init)
    }

    /// The server's answer to `initialize`.
    pub fn server(&self) -> &InitializeResult {
        &self.init
    }

    /// The transport kind.
    pub fn transport_kind(&self) -> TransportKind {
        match self.transport {
            Transport::Stdio(_) => TransportKind::Stdio,
            Transport::Http(_) => TransportKind::StreamableHttp,
        }
    }

    /// The `Mcp-Session-Id` the server assigned; `None` for stdio, for servers without sessions and after close.
    pub fn session_id(&self) -> Option<String> {
        match &self.transport {
            Transport::Stdio(_) => None,
            Transport::Http(t) => t.session_id(),
        }
    }

    /// `tools/list`, all pages.
    pub async fn list_tools(&self) -> Result<Vec<Tool>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_TOOL_PAGES {
            let params = cursor.as_ref().map(|c| json!({ "cursor": c }));
            let result = timed(self.timeout, "tools/list", self.transport.request("tools/list", params)).await?;
            let page: ListToolsResult = serde_json::from_value(result)
                .map_err(|e| McpError::Protocol(format!("malformed tools/list result: {e}")))?;
            tools.extend(page.tools);
            match page.next_cursor {
                Some(next) if !next.is_empty() => cursor = Some(next),
                _ => return Ok(tools),
            }
        }
        Err(McpError::Protocol(format!("tools/list did not end after {MAX_TOOL_PAGES} pages")))
    }

    /// `tools/call`. A tool's own failure is a result with [`CallToolResult::is_error`]; an error here is a
    /// protocol or transport failure.
    pub async fn call_tool(&self, name: &str, arguments: Map<String, Value>) -> Result<CallToolResult, McpError> {
        let params = json!({ "name": name, "arguments": arguments });
        let result = timed(self.timeout, "tools/call", self.transport.request("tools/call", Some(params))).await?;
        serde_json::from_value(result).map_err(|e| McpError::Protocol(format!("malformed tools/call result: {e}")))
    }

    /// Closes the session: for HTTP, the `DELETE` with the session id and the auth headers (a 405 or 404 is not
    /// an error); for stdio, closes the server's stdin and waits briefly for it to exit, then kills it.
    /// Idempotent; later requests fail with [`McpError::Closed`].
    pub async fn close(&self) -> Result<(), McpError> {
        self.transport.close().await
    }
}

async fn timed<T>(
    timeout: Duration,
    method: &str,
    fut: impl std::future::Future<Output = Result<T, McpError>>,
) -> Result<T, McpError> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| Err(McpError::Timeout { method: method.to_owned(), timeout }))
}
