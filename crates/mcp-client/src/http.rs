//! The Streamable HTTP transport (MCP 2025-03-26 and later): every message is a POST of JSON-RPC to the
//! endpoint; a response is either JSON or an SSE stream that carries it. The session id the server returns on
//! `initialize` goes on every later request, and closing sends the session-termination `DELETE` with the same
//! auth headers as every other request.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{StatusCode, Url};
use serde_json::Value;

use crate::McpError;
use crate::jsonrpc::{self, Incoming};

/// The session header (case-insensitive on the wire).
pub const SESSION_ID_HEADER: &str = "mcp-session-id";
/// The protocol version header sent after `initialize`.
pub const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";

/// Headers the transport sets itself; configuring them is an error.
const RESERVED_HEADERS: &[&str] = &[SESSION_ID_HEADER, PROTOCOL_VERSION_HEADER, "accept", "content-type", "host"];
/// How long the session-termination `DELETE` may take.
const DELETE_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach a Streamable HTTP MCP server, with the auth headers sent on every request of a session,
/// including the closing `DELETE`.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// The MCP endpoint URL, e.g. `https://browser.example/mcp`.
    pub endpoint: String,
    /// Headers sent on every request (auth: `Authorization: Bearer …`, `X-Api-Key: …`, …). Their values are
    /// treated as secrets: never logged, redacted in `Debug`.
    pub headers: Vec<(String, String)>,
    /// How long establishing a TCP/TLS connection may take.
    pub connect_timeout: Duration,
}

impl HttpConfig {
    /// An endpoint without auth headers, with a 10 s connect timeout.
    pub fn new(endpoint: impl Into<String>) -> Self {
        HttpConfig { endpoint: endpoint.into(), headers: Vec::new(), connect_timeout: Duration::from_secs(10) }
    }

    /// Adds `Authorization: Bearer <token>`.
    pub fn bearer(self, token: impl AsRef<str>) -> Self {
        self.header("Authorization", format!("Bearer {}", token.as_ref()))
    }

    /// Adds a header sent on every request.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

impl fmt::Debug for HttpConfig {
    /// Header values are secrets: only their names are shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpConfig")
            .field("endpoint", &self.endpoint)
            .field("headers", &self.headers.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// The validated form of an [`HttpConfig`].
struct Target {
    client: reqwest::Client,
    url: Url,
    headers: HeaderMap,
}

impl HttpConfig {
    /// Checks what a session would check before sending anything: an http(s) endpoint URL, valid header names
    /// and values, no header the transport sets itself. Header values are not quoted in errors (secrets).
    pub fn validate(&self) -> Result<(), McpError> {
        Target::parse(self).map(drop)
    }
}

impl Target {
    fn new(config: &HttpConfig) -> Result<Self, McpError> {
        let (url, headers) = Self::parse(config)?;
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| McpError::InvalidConfig(format!("HTTP client: {e}")))?;
        Ok(Target { client, url, headers })
    }

    fn parse(config: &HttpConfig) -> Result<(Url, HeaderMap), McpError> {
        let url = Url::parse(&config.endpoint)
            .map_err(|e| McpError::InvalidConfig(format!("endpoint {:?}: {e}", config.endpoint)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(McpError::InvalidConfig(format!("endpoint {:?}: not an http(s) URL", config.endpoint)));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| McpError::InvalidConfig(format!("invalid header name {name:?}")))?;
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(McpError::InvalidConfig(format!("header {name:?} is set by the transport itself")));
            }
            // The value is not quoted: it may be a secret.
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| McpError::InvalidConfig(format!("invalid value for header {name:?}")))?;
            value.set_sensitive(true);
            headers.append(header, value);
        }
        Ok((url, headers))
    }

    fn endpoint(&self) -> String {
        self.url.to_string()
    }

    /// Sends the session-termination `DELETE`. 2xx, 404 (already gone) and 405 (the server does not support
    /// termination) all end the session as far as the client can tell.
    async fn delete_session(&self, session_id: &str, protocol_version: Option<&str>) -> Result<(), McpError> {
        let mut req = self
            .client
            .delete(self.url.clone())
            .headers(self.headers.clone())
            .header(SESSION_ID_HEADER, session_id)
            .timeout(DELETE_TIMEOUT);
        if let Some(version) = protocol_version {
            req = req.header(PROTOCOL_VERSION_HEADER, version);
        }
        let resp = req.send().await.map_err(|source| McpError::Http {
            method: "DELETE",
            endpoint: self.endpoint(),
            source,
        })?;
        let status = resp.status();
        if status.is_success() || status == StatusCode::METHOD_NOT_ALLOWED || status == StatusCode::NOT_FOUND {
            tracing::debug!(%status, "MCP session terminated");
            return Ok(());
        }
        Err(McpError::HttpStatus {
            method: "DELETE",
            endpoint: self.endpoint(),
            status: status.as_u16(),
            body: body_excerpt(resp).await,
        })
    }
}

/// Sends the session-termination `DELETE` for a session this process does not hold (e.g. a revocation handler
/// cleaning up after a dead pod), with the configured auth headers. 2xx, 404 and 405 count as success.
pub async fn terminate_session(config: &HttpConfig, session_id: &str) -> Result<(), McpError> {
    Target::new(config)?.delete_session(session_id, None).await
}

#[derive(Default)]
struct SessionState {
    session_id: Option<String>,
    protocol_version: Option<String>,
    closed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One Streamable HTTP session. Requests may be sent concurrently.
pub(crate) struct HttpTransport {
    target: Target,
    state: Mutex<SessionState>,
    next_id: AtomicU64,
}

impl HttpTransport {
    /// Validates the configuration; sends nothing yet.
    pub(crate) fn new(config: &HttpConfig) -> Result<Self, McpError> {
        Ok(HttpTransport {
            target: Target::new(config)?,
            state: Mutex::new(SessionState::default()),
            next_id: AtomicU64::new(1),
        })
    }

    /// The session id the server assigned in `initialize`, if any.
    pub(crate) fn session_id(&self) -> Option<String> {
        lock(&self.state).session_id.clone()
    }

    /// Records the negotiated protocol version: sent as `MCP-Protocol-Version` from now on.
    pub(crate) fn set_protocol_version(&self, version: &str) {
        lock(&self.state).protocol_version = Some(version.to_owned());
    }

    /// The headers of a POST: auth, content negotiation, session, protocol version.
    fn post(&self, body: &Value) -> Result<(reqwest::RequestBuilder, Option<String>), McpError> {
        let state = lock(&self.state);
        if state.closed {
            return Err(McpError::Closed("the session was closed by the client".to_owned()));
        }
        let mut req = self
            .target
            .client
            .post(self.target.url.clone())
            .headers(self.target.headers.clone())
            .header(ACCEPT, "application/json, text/event-stream")
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if let Some(id) = &state.session_id {
            req = req.header(SESSION_ID_HEADER, id);
        }
        if let Some(version) = &state.protocol_version {
            req = req.header(PROTOCOL_VERSION_HEADER, version);
        }
        Ok((req, state.session_id.clone()))
    }

    /// POSTs a message; maps transport failures, 404 on a session and other non-2xx statuses to errors.
    async fn send(&self, body: &Value) -> Result<reqwest::Response, McpError> {
        let (req, session_id) = self.post(body)?;
        let resp = req.send().await.map_err(|source| McpError::Http {
            method: "POST",
            endpoint: self.target.endpoint(),
            source,
        })?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            if let Some(session_id) = session_id {
                return Err(McpError::SessionExpired { session_id });
            }
        }
        if !status.is_success() {
            return Err(McpError::HttpStatus {
                method: "POST",
                endpoint: self.target.endpoint(),
                status: status.as_u16(),
                body: body_excerpt(resp).await,
            });
        }
        Ok(resp)
    }

    /// Sends a request and reads its response from a JSON body or an SSE stream. On `initialize`, records the
    /// session id the server returns.
    pub(crate) async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut resp = self.send(&jsonrpc::request(id, method, params)).await?;
        let assigned = if method == "initialize" { resp.headers().get(SESSION_ID_HEADER) } else { None };
        if let Some(session_id) = assigned {
            let session_id = session_id
                .to_str()
                .map_err(|_| McpError::Protocol("the Mcp-Session-Id header is not visible ASCII".to_owned()))?;
            let mut state = lock(&self.state);
            state.session_id = Some(session_id.to_owned());
        }
        if resp.status() == StatusCode::ACCEPTED {
            return Err(McpError::Protocol(format!("the server answered {method} with 202 Accepted and no response")));
        }
        let content_type =
            resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_ascii_lowercase();
        if content_type.starts_with("text/event-stream") {
            let mut parser = SseParser::default();
            loop {
                let chunk = resp.chunk().await.map_err(|source| McpError::Http {
                    method: "POST",
                    endpoint: self.target.endpoint(),
                    source,
                })?;
                let Some(chunk) = chunk else { break };
                for data in parser.push(&chunk)? {
                    if let Some(result) = self.handle(&data, id, method).await? {
                        return result;
                    }
                }
            }
            for data in parser.finish()? {
                if let Some(result) = self.handle(&data, id, method).await? {
                    return result;
                }
            }
            Err(McpError::Protocol(format!("the server's event stream ended without the response to {method}")))
        } else if content_type.starts_with("application/json") {
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|source| McpError::Http {
                method: "POST",
                endpoint: self.target.endpoint(),
                source,
            })? {
                if body.len() + chunk.len() > jsonrpc::MAX_MESSAGE_BYTES {
                    return Err(too_large(method));
                }
                body.extend_from_slice(&chunk);
            }
            let text = std::str::from_utf8(&body)
                .map_err(|_| McpError::Protocol(format!("the response to {method} is not UTF-8")))?;
            self.handle(text, id, method).await?.unwrap_or_else(|| {
                Err(McpError::Protocol(format!("the server's JSON body holds no response to {method}")))
            })
        } else {
            Err(McpError::Protocol(format!("unexpected content type {content_type:?} in the response to {method}")))
        }
    }

    /// Handles the messages of one JSON text: the response to `id` ends the request, server requests are
    /// answered, notifications are ignored.
    async fn handle(&self, text: &str, id: u64, method: &str) -> Result<Option<Result<Value, McpError>>, McpError> {
        let mut outcome = None;
        for message in jsonrpc::parse(text)? {
            match message {
                Incoming::Response { id: rid, outcome: o } if jsonrpc::id_matches(&rid, id) => {
                    outcome = Some(o.map_err(|e| e.into_error(method)));
                }
                Incoming::Response { id: rid, .. } => tracing::debug!(%rid, "response to another request; ignored"),
                Incoming::Request { id: rid, method: server_method } => {
                    let answer = jsonrpc::answer_server_request(rid, &server_method);
                    if let Err(e) = self.send(&answer).await {
                        tracing::debug!(error = %e, %server_method, "could not answer a server request");
                    }
                }
                Incoming::Notification { method } => tracing::trace!(%method, "server notification"),
            }
        }
        Ok(outcome)
    }

    /// Sends a notification (the server answers 202 Accepted).
    pub(crate) async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), McpError> {
        self.send(&jsonrpc::notification(method, params)).await.map(drop)
    }

    /// Ends the session: sends the `DELETE` with the session id and the auth headers, once. Idempotent: later
    /// calls (and concurrent ones) send nothing. Later requests fail with [`McpError::Closed`].
    pub(crate) async fn close(&self) -> Result<(), McpError> {
        let (session_id, version) = {
            let mut state = lock(&self.state);
            state.closed = true;
            (state.session_id.take(), state.protocol_version.clone())
        };
        match session_id {
            Some(session_id) => self.target.delete_session(&session_id, version.as_deref()).await,
            None => Ok(()),
        }
    }
}

fn too_large(what: &str) -> McpError {
    McpError::Protocol(format!("the server's answer to {what} exceeds {} bytes", jsonrpc::MAX_MESSAGE_BYTES))
}

/// The start of an error response's body.
async fn body_excerpt(resp: reqwest::Response) -> String {
    match resp.text().await {
        Ok(text) => jsonrpc::excerpt(text.trim()),
        Err(e) => format!("<unreadable body: {e}>"),
    }
}

/// An incremental `text/event-stream` parser yielding the data of `message` events. Lines end with `\n` or
/// `\r\n`; events without data (e.g. a priming event that only sets an id) are skipped.
#[derive(Default)]
struct SseParser {
    buf: Vec<u8>,
    data: Option<String>,
    event: Option<String>,
}

impl SseParser {
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, McpError> {
        let pending = self.buf.len() + self.data.as_ref().map_or(0, String::len);
        if pending + chunk.len() > jsonrpc::MAX_MESSAGE_BYTES {
            return Err(too_large("an event stream"));
        }
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8(line)
                .map_err(|_| McpError::Protocol("the server's event stream is not UTF-8".to_owned()))?;
            self.line(&line, &mut out);
        }
        Ok(out)
    }

    /// The stream ended: a last event without its terminating blank line still counts.
    fn finish(&mut self) -> Result<Vec<String>, McpError> {
        let mut out = self.push(b"\n")?;
        self.line("", &mut out);
        Ok(out)
    }

    fn line(&mut self, line: &str, out: &mut Vec<String>) {
        if line.is_empty() {
            let event = self.event.take();
            let data = self.data.take().unwrap_or_default();
            if matches!(event.as_deref(), None | Some("message")) && !data.trim().is_empty() {
                out.push(data);
            }
            return;
        }
        if line.starts_with(':') {
            return; // a comment (keep-alive)
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                let data = self.data.get_or_insert_with(String::new);
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value);
            }
            "event" => self.event = Some(value.to_owned()),
            _ => {} // id, retry: no resumption in this client
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_parser_handles_split_chunks_crlf_priming_and_multiline_data() {
        let mut p = SseParser::default();
        assert!(p.push(b"id: 1\ndata: \n\n: keep-alive\n").unwrap().is_empty());
        assert!(p.push(b"event: message\r\nid: 2\r\ndata: {\"a\":").unwrap().is_empty());
        assert_eq!(p.push(b"1}\r\n\r\n").unwrap(), vec![r#"{"a":1}"#.to_owned()]);
        assert_eq!(p.push(b"data: [1,\ndata: 2]\n\n").unwrap(), vec!["[1,\n2]".to_owned()]);
        assert!(p.push(b"event: other\ndata: x\n\n").unwrap().is_empty());
        assert!(p.push(b"data: tail").unwrap().is_empty());
        assert_eq!(p.finish().unwrap(), vec!["tail".to_owned()]);
        assert!(SseParser::default().push(b"data: \xff\n").is_err());
    }

    #[test]
    fn config_validation() {
        assert!(Target::new(&HttpConfig::new("not a url")).is_err());
        assert!(Target::new(&HttpConfig::new("ftp://x/mcp")).is_err());
        assert!(Target::new(&HttpConfig::new("http://x/mcp").header("bad name", "v")).is_err());
        assert!(Target::new(&HttpConfig::new("http://x/mcp").header("X-Key", "line\nbreak")).is_err());
        assert!(Target::new(&HttpConfig::new("http://x/mcp").header("Mcp-Session-Id", "forged")).is_err());
        let t = Target::new(&HttpConfig::new("http://x/mcp").bearer("s3cret").header("X-Key", "k")).unwrap();
        assert_eq!(t.headers.len(), 2);
        assert!(t.headers.get("authorization").unwrap().is_sensitive());
    }

    #[test]
    fn debug_redacts_header_values() {
        let c = HttpConfig::new("http://x/mcp").bearer("s3cret");
        let shown = format!("{c:?}");
        assert!(shown.contains("Authorization"));
        assert!(!shown.contains("s3cret"));
    }
}
