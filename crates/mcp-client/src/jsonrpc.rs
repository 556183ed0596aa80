//! JSON-RPC 2.0 framing shared by both transports (crate-internal).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::McpError;

/// The largest message (one stdio line, one SSE event, one JSON body) the client accepts from a server: 64 MiB.
pub(crate) const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The JSON-RPC "method not found" error code.
const METHOD_NOT_FOUND: i64 = -32601;

/// A request object. Our ids are numbers.
pub(crate) fn request(id: u64, method: &str, params: Option<Value>) -> Value {
    let mut msg = json!({ "jsonrpc": "2.0", "id": id, "method": method });
    if let Some(params) = params {
        msg["params"] = params;
    }
    msg
}

/// A notification object (no id, no response).
pub(crate) fn notification(method: &str, params: Option<Value>) -> Value {
    let mut msg = json!({ "jsonrpc": "2.0", "method": method });
    if let Some(params) = params {
        msg["params"] = params;
    }
    msg
}

#[derive(Debug, Deserialize)]
struct RawMessage {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<RawError>,
}

#[derive(Debug, Deserialize)]
struct RawError {
    code: i64,
    #[serde(default)]
    message: String,
    #[serde(default)]
    data: Option<Value>,
}

/// A message from the server, classified.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// The answer to one of our requests.
    Response { id: Value, outcome: Result<Value, RpcErrorBody> },
    /// A request from the server; it must be answered.
    Request { id: Value, method: String },
    /// A notification from the server.
    Notification { method: String },
}

/// A JSON-RPC error object.
#[derive(Debug)]
pub(crate) struct RpcErrorBody {
    pub(crate) code: i64,
    pub(crate) message: String,
    pub(crate) data: Option<Value>,
}

impl RpcErrorBody {
    pub(crate) fn into_error(self, method: &str) -> McpError {
        McpError::Rpc {
            method: method.to_owned(),
            code: self.code,
            message: self.message,
            data: self.data.map(Box::new),
        }
    }
}

/// Parses one JSON text into messages (a single message or a batch).
pub(crate) fn parse(text: &str) -> Result<Vec<Incoming>, McpError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| McpError::Protocol(format!("invalid JSON from the server: {e}: {}", excerpt(text))))?;
    match value {
        Value::Array(items) => items.into_iter().map(classify).collect(),
        single => Ok(vec![classify(single)?]),
    }
}

fn classify(value: Value) -> Result<Incoming, McpError> {
    let raw: RawMessage =
        serde_json::from_value(value).map_err(|e| McpError::Protocol(format!("not a JSON-RPC message: {e}")))?;
    match (raw.id, raw.method) {
        (Some(id), Some(method)) => Ok(Incoming::Request { id, method }),
        (None, Some(method)) => Ok(Incoming::Notification { method }),
        (Some(id), None) => {
            let outcome = match raw.error {
                Some(e) => Err(RpcErrorBody { code: e.code, message: e.message, data: e.data }),
                None => Ok(raw.result.unwrap_or(Value::Null)),
            };
            Ok(Incoming::Response { id, outcome })
        }
        (None, None) => {
            // An error response to a request the server could not parse has `"id": null`.
            let what = raw.error.map(|e| format!("{}: {}", e.code, e.message)).unwrap_or_default();
            Err(McpError::Protocol(format!("server message without id or method {what}")))
        }
    }
}

/// Our response to a server request: `ping` is answered, anything else is "method not found" (we declare no
/// client capabilities, so a conforming server sends nothing else).
pub(crate) fn answer_server_request(id: Value, method: &str) -> Value {
    if method == "ping" {
        json!({ "jsonrpc": "2.0", "id": id, "result": {} })
    } else {
        json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": { "code": METHOD_NOT_FOUND, "message": format!("method not supported by this client: {method}") },
        })
    }
}

/// Whether a response id is our numeric request id.
pub(crate) fn id_matches(id: &Value, ours: u64) -> bool {
    id.as_u64() == Some(ours)
}

/// The start of a text, for error messages.
pub(crate) fn excerpt(text: &str) -> String {
    const MAX: usize = 512;
    if text.len() <= MAX {
        return text.to_owned();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_messages() {
        let msgs = parse(r#"{"jsonrpc":"2.0","id":3,"result":{"x":1}}"#).unwrap();
        assert!(matches!(&msgs[0], Incoming::Response { id, outcome: Ok(v) } if id_matches(id, 3) && v["x"] == 1));

        let msgs = parse(r#"{"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"bad"}}"#).unwrap();
        assert!(matches!(&msgs[0], Incoming::Response { outcome: Err(e), .. } if e.code == -32602));

        let msgs = parse(r#"[{"jsonrpc":"2.0","id":"s1","method":"ping"},{"jsonrpc":"2.0","method":"n"}]"#).unwrap();
        assert!(matches!(&msgs[0], Incoming::Request { method, .. } if method == "ping"));
        assert!(matches!(&msgs[1], Incoming::Notification { method } if method == "n"));

        assert!(parse("not json").is_err());
        assert!(parse("42").is_err());
        assert!(parse(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}"#).is_err());
    }

    #[test]
    fn answers_ping_and_refuses_the_rest() {
        let ping = answer_server_request(json!(7), "ping");
        assert_eq!(ping["result"], json!({}));
        let other = answer_server_request(json!("a"), "sampling/createMessage");
        assert_eq!(other["error"]["code"], METHOD_NOT_FOUND);
        assert_eq!(other["id"], "a");
    }

    #[test]
    fn excerpt_cuts_on_char_boundaries() {
        let long = "é".repeat(600);
        let cut = excerpt(&long);
        assert!(cut.ends_with('…'));
        assert!(cut.len() < long.len());
    }
}
