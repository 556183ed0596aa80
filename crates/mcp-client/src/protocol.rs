//! The MCP messages this client uses: `initialize`, `tools/list`, `tools/call`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol version this client asks for in `initialize`.
pub const PROTOCOL_VERSION: &str = "2025-11-25";

/// The protocol versions this client accepts from a server. They differ in nothing this client uses
/// (`initialize`, `tools/list`, `tools/call`, the Streamable HTTP headers).
pub const SUPPORTED_PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// Who we are, sent as `clientInfo` in `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Implementation {
    /// The program's name.
    pub name: String,
    /// The program's version.
    pub version: String,
}

impl Default for Implementation {
    /// This crate's name and version.
    fn default() -> Self {
        Implementation { name: env!("CARGO_PKG_NAME").to_owned(), version: env!("CARGO_PKG_VERSION").to_owned() }
    }
}

/// The server's answer to `initialize`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// The protocol version the server chose.
    pub protocol_version: String,
    /// The server's capabilities, as sent.
    #[serde(default)]
    pub capabilities: Value,
    /// The server's name and version.
    pub server_info: ServerInfo,
    /// Usage instructions for the model, if the server sends any.
    #[serde(default)]
    pub instructions: Option<String>,
}

/// A server's name and version.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ServerInfo {
    /// The server's name.
    pub name: String,
    /// The server's version.
    #[serde(default)]
    pub version: String,
}

/// A tool the server offers (`tools/list`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tool {
    /// The tool's name, used in `tools/call`.
    pub name: String,
    /// A display title.
    #[serde(default)]
    pub title: Option<String>,
    /// What the tool does.
    #[serde(default)]
    pub description: Option<String>,
    /// The JSON schema of the tool's arguments.
    #[serde(default)]
    pub input_schema: Value,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListToolsResult {
    pub(crate) tools: Vec<Tool>,
    #[serde(default)]
    pub(crate) next_cursor: Option<String>,
}

/// The result of `tools/call`. Serializes back to the protocol's JSON shape (`content`, `structuredContent` when
/// present, `isError`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallToolResult {
    /// The content blocks (`{"type": "text", "text": …}`, images, resources …), as sent.
    #[serde(default)]
    pub content: Vec<Value>,
    /// Structured output, if the tool declares an output schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
    /// Whether the tool reports a failure (a tool error, not a protocol error).
    #[serde(default)]
    pub is_error: bool,
}

impl CallToolResult {
    /// The text of all `text` content blocks, joined by newlines.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter(|c| c.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|c| c.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn call_tool_result_text_joins_text_blocks() {
        let r: CallToolResult = serde_json::from_value(json!({
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image", "data": "…", "mimeType": "image/png"},
                {"type": "text", "text": "b"}
            ]
        }))
        .unwrap();
        assert_eq!(r.text(), "a\nb");
        assert!(!r.is_error);
    }
}
