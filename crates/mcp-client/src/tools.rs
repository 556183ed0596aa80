//! Tool configs (the `mcp_server` tool config of spec §7): how a configured MCP tool is reached, and which lease
//! guards its sessions.
//!
//! A tool `<tool>` is configured by the document `_vance/config/tools/<tool>.yaml`, read through the config
//! layers: the most specific layer that has the document wins **as a whole** (Project → Tenant → System →
//! classpath; see [`lease_shared::config::tools`]).
//!
//! ```yaml
//! name: browser                 # optional; if present, must be the file name
//! transport: streamable-http    # or `http` (the same), or `stdio`
//! endpoint: https://browser.example/mcp
//! headers:                      # sent on every request of a session, the closing DELETE included
//!   Authorization: Bearer abc123
//! lease: browser                # a lease name, `none` (the default), or an inline definition:
//! # lease: { name: my-browser, levels: { user: 1 }, ttlSeconds: 300 }
//! ```
//!
//! A stdio tool gives `command`, `args`, optionally `env` (a map) and `cwd` instead of `endpoint` and `headers`.
//!
//! Fail-closed: a document that is not valid (broken YAML, an unknown key, a missing or misplaced transport
//! field, a bad URL or header, a lease that is neither a name, `none` nor an inline definition) fails the lookup
//! with `LEASE_UNAVAILABLE` naming the layer; a more general layer is never used instead. Inline lease rules that
//! the lease service owns (only `levels.project`, `levels.user`, `ttlSeconds`, `waitMs`; a `name`) are checked
//! by the service when a session acquires (`INVALID_REQUEST`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use lease_shared::config::{ToolDocument, lease_ref_from_value};
use lease_shared::{DefinitionDocument, LayeredDefinitions, LeaseError, LeaseRef};
use serde::Deserialize;

use crate::McpError;
use crate::connection::ConnectionConfig;
use crate::http::HttpConfig;
use crate::session::TransportConfig;
use crate::stdio::StdioConfig;

/// A configured MCP tool: its transport and its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolConfig {
    /// The tool's name (the file name of its config document).
    pub name: String,
    /// How its server is reached (with the auth headers for HTTP).
    pub transport: TransportConfig,
    /// The lease every session acquires: a name reference, an inline definition, or none.
    pub lease: LeaseRef,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToolConfig {
    name: Option<String>,
    transport: Option<String>,
    endpoint: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    cwd: Option<String>,
    #[serde(default)]
    lease: serde_yaml::Value,
}

/// A problem with one tool config document: the field and what is wrong.
fn problem(field: &str, what: impl std::fmt::Display) -> String {
    format!("{field}: {what}")
}

impl ToolConfig {
    /// Parses and validates the config document of `tool`. The error names the offending field (header values
    /// are never quoted: they may be secrets).
    pub fn parse(tool: &str, yaml: &str) -> Result<Self, String> {
        let raw: RawToolConfig = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        if let Some(name) = &raw.name {
            if name != tool {
                return Err(problem("name", format!("{name:?} does not match the file name {tool:?}")));
            }
        }
        let transport = match raw.transport.as_deref() {
            Some("stdio") => {
                for (field, set) in [("endpoint", raw.endpoint.is_some()), ("headers", raw.headers.is_some())] {
                    if set {
                        return Err(problem(field, "is for the streamable-http transport, not stdio"));
                    }
                }
                let command = raw.command.filter(|c| !c.trim().is_empty());
                let Some(command) = command else { return Err(problem("command", "a stdio tool needs a command")) };
                let mut config = StdioConfig::new(command, raw.args.unwrap_or_default());
                config.env = raw.env.unwrap_or_default().into_iter().collect();
                config.cwd = raw.cwd.map(PathBuf::from);
                TransportConfig::Stdio(config)
            }
            Some("streamable-http" | "http") => {
                for (field, set) in [
                    ("command", raw.command.is_some()),
                    ("args", raw.args.is_some()),
                    ("env", raw.env.is_some()),
                    ("cwd", raw.cwd.is_some()),
                ] {
                    if set {
                        return Err(problem(field, "is for the stdio transport, not streamable-http"));
                    }
                }
                let Some(endpoint) = raw.endpoint else {
                    return Err(problem("endpoint", "a streamable-http tool needs an endpoint URL"));
                };
                let mut config = HttpConfig::new(endpoint);
                config.headers = raw.headers.unwrap_or_default().into_iter().collect();
                config.validate().map_err(|e| match e {
                    McpError::InvalidConfig(m) => m,
                    other => other.to_string(),
                })?;
                TransportConfig::Http(config)
            }
            Some(other) => return Err(problem("transport", format!("{other:?} is not stdio or streamable-http"))),
            None => return Err(problem("transport", "missing (stdio or streamable-http)")),
        };
        let lease = match raw.lease {
            serde_yaml::Value::Mapping(_) => {
                let text = serde_yaml::to_string(&raw.lease).map_err(|e| problem("lease", e))?;
                let doc =
                    DefinitionDocument::parse(&text).map_err(|e| problem(&format!("lease.{}", e.field), e.problem))?;
                LeaseRef::Inline(doc)
            }
            value => lease_ref_from_value("lease", &value).map_err(|e| match e {
                LeaseError::InvalidRequest { message, .. } => problem("lease", message),
                other => problem("lease", other),
            })?,
        };
        Ok(ToolConfig { name: tool.to_owned(), transport, lease })
    }

    /// The connection config of a session to this tool (default session options).
    pub fn connection_config(&self) -> ConnectionConfig {
        ConnectionConfig::new(self.name.clone(), self.transport.clone())
    }
}

/// Reads tool configs through the config layers: cached for the tool calls (a write through the layers, or a
/// change event from another pod, drops the entry), read anew for a reaper's cleanup ([`Self::load_current`]).
#[derive(Debug, Clone)]
pub struct ToolConfigs {
    layers: Arc<LayeredDefinitions>,
}

impl ToolConfigs {
    /// Tool configs from `layers` (the brain's layered definitions: the same store, classpath and layers).
    pub fn new(layers: Arc<LayeredDefinitions>) -> Self {
        ToolConfigs { layers }
    }

    /// The config of `tool` for a caller in `(tenant, project)`; `None` if no layer configures it.
    ///
    /// Errors ([`McpError::ToolConfig`]): `LEASE_UNAVAILABLE` naming the layer if a layer cannot be read or the
    /// winning document is invalid; `INVALID_REQUEST` for a malformed tool name.
    pub async fn load(&self, tenant: &str, project: &str, tool: &str) -> Result<Option<ToolConfig>, McpError> {
        let Some(doc) = self.layers.tool_document(tenant, project, tool).await.map_err(McpError::ToolConfig)? else {
            return Ok(None);
        };
        parse_document(&doc, tenant, project).map(Some)
    }

    /// [`Self::load`] from every layer now, bypassing the cache: for a decision that must not rest on a missed
    /// change event (where a reaped session's `DELETE` may go).
    pub async fn load_current(&self, tenant: &str, project: &str, tool: &str) -> Result<Option<ToolConfig>, McpError> {
        let doc = self.layers.tool_document_uncached(tenant, project, tool).await.map_err(McpError::ToolConfig)?;
        doc.map(|doc| parse_document(&doc, tenant, project)).transpose()
    }

    /// [`Self::load`], with [`McpError::UnknownTool`] when no layer configures the tool.
    pub async fn get(&self, tenant: &str, project: &str, tool: &str) -> Result<ToolConfig, McpError> {
        self.load(tenant, project, tool).await?.ok_or_else(|| McpError::UnknownTool { tool: tool.to_owned() })
    }
}

fn parse_document(doc: &ToolDocument, tenant: &str, project: &str) -> Result<ToolConfig, McpError> {
    ToolConfig::parse(&doc.tool, &doc.content).map_err(|problem| {
        tracing::warn!(
            tool = %doc.tool,
            layer = doc.layer.as_str(),
            location = %doc.location,
            tenant,
            project,
            problem = %problem,
            "tool config is invalid; failing closed"
        );
        McpError::ToolConfig(LeaseError::Unavailable {
            reason: format!("tool config {:?}: {} is invalid: {problem}", doc.tool, doc.origin()),
        })
    })
}

#[cfg(test)]
mod tests {
    use lease_shared::Caps;

    use super::*;

    #[test]
    fn http_with_headers_and_a_lease_name() {
        let c = ToolConfig::parse(
            "browser",
            "name: browser\ntransport: streamable-http\nendpoint: https://b.example/mcp\nheaders:\n  \
             Authorization: Bearer s3cret\n  X-Api-Key: k\nlease: browser\n",
        )
        .unwrap();
        assert_eq!(c.lease, LeaseRef::Name("browser".into()));
        let TransportConfig::Http(http) = &c.transport else { panic!("not http: {c:?}") };
        assert_eq!(http.endpoint, "https://b.example/mcp");
        assert_eq!(
            http.headers,
            vec![("Authorization".to_owned(), "Bearer s3cret".to_owned()), ("X-Api-Key".into(), "k".into())]
        );
        assert!(!format!("{c:?}").contains("s3cret"), "header values are redacted in Debug");
        let conn = c.connection_config();
        assert_eq!(conn.tool_name, "browser");
    }

    #[test]
    fn stdio_and_the_lease_forms() {
        let c = ToolConfig::parse(
            "fs",
            "transport: stdio\ncommand: node\nargs: [server.js, stdio]\nenv: {A: b}\ncwd: /tmp\nlease: none\n",
        )
        .unwrap();
        assert_eq!(c.lease, LeaseRef::None);
        let TransportConfig::Stdio(s) = &c.transport else { panic!("not stdio") };
        assert_eq!(s.command_line(), "node server.js stdio");
        assert_eq!(s.env, vec![("A".to_owned(), "b".to_owned())]);
        assert_eq!(s.cwd, Some(PathBuf::from("/tmp")));

        let no_lease = ToolConfig::parse("fs", "transport: stdio\ncommand: x\n").unwrap();
        assert_eq!(no_lease.lease, LeaseRef::None, "no lease parameter = no lease");

        let inline = ToolConfig::parse(
            "fs",
            "transport: stdio\ncommand: x\nlease: {name: mine, levels: {user: 1}, ttlSeconds: 60, waitMs: 0}\n",
        )
        .unwrap();
        let LeaseRef::Inline(doc) = inline.lease else { panic!("not inline") };
        assert_eq!(doc.name.as_deref(), Some("mine"));
        assert_eq!(doc.levels, Caps { user: Some(1), ..Caps::default() });
        assert_eq!((doc.ttl_seconds, doc.wait_ms), (Some(60), Some(0)));
    }

    #[test]
    fn invalid_documents_name_the_field() {
        let http = "transport: http\nendpoint: http://h/mcp\n";
        for (yaml, field) in [
            ("transport: stdio\n", "command"),
            ("transport: smoke-signals\n", "transport"),
            ("command: x\n", "transport"),
            ("transport: http\n", "endpoint"),
            ("transport: http\nendpoint: ftp://h/x\n", "not an http(s) URL"),
            ("transport: http\nendpoint: http://h/mcp\nheaders: {Mcp-Session-Id: x}\n", "set by the transport"),
            ("transport: http\nendpoint: http://h/mcp\nheaders: {'bad name': x}\n", "invalid header name"),
            ("transport: http\nendpoint: http://h/mcp\ncommand: x\n", "command"),
            ("transport: stdio\ncommand: x\nendpoint: http://h/mcp\n", "endpoint"),
            ("transport: stdio\ncommand: x\nsurprise: 1\n", "unknown field `surprise`"),
            ("transport: stdio\ncommand: x\nlease: '../etc'\n", "lease"),
            ("transport: stdio\ncommand: x\nlease: [a]\n", "lease"),
            ("transport: stdio\ncommand: x\nlease: {name: x, levels: {user: 0}}\n", "lease.levels.user"),
            ("transport: stdio\ncommand: x\nlease: {name: x, colour: red}\n", "lease"),
            ("name: other\ntransport: stdio\ncommand: x\n", "name"),
            ("transport: [", "transport"),
            ("endpoint: 'unclosed\n", "line"),
        ] {
            let e = ToolConfig::parse("t", yaml).unwrap_err();
            assert!(e.contains(field), "{yaml:?}: {e}");
        }
        assert!(ToolConfig::parse("t", http).is_ok());
        let secret =
            ToolConfig::parse("t", "transport: http\nendpoint: http://h/mcp\nheaders: {A: \"x\\ny-secret\"}\n");
        assert!(!secret.unwrap_err().contains("y-secret"), "a header value is never quoted");
    }
}
