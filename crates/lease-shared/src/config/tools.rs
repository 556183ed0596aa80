//! Tool config documents through the config layers (spec §7, "Browser Session": the `mcp_server` tool config
//! with its `lease` parameter).
//!
//! A tool's config lives at [`tool_config_path`] (`_vance/config/tools/<tool>.yaml`) in any layer. Unlike lease
//! definitions, tool configs are **not merged field by field**: the most specific layer that has the document
//! wins as a whole (Project → Tenant → System → classpath). A transport is one unit — a project that sets its own
//! `endpoint` must not inherit the System layer's auth headers and send them to that endpoint.
//!
//! This module only reads the winning document (fail-closed: a layer that cannot be read fails the lookup with
//! `LEASE_UNAVAILABLE` naming the layer, and a more general layer is never used instead); the MCP client parses
//! it. Nothing is cached: a tool config is read when a session opens (and by the `mcp` handler on a reaper pod),
//! so a write takes effect at the next read on every pod without a change event.

use super::layers::{Layer, LayeredDefinitions};
use crate::definition::validate_name;
use crate::error::LeaseError;

/// The folder of tool config documents: the tool `browser` is configured at `_vance/config/tools/browser.yaml`.
pub const TOOL_CONFIG_DIR: &str = "_vance/config/tools/";

/// The document path of the tool config `tool`.
pub fn tool_config_path(tool: &str) -> String {
    format!("{TOOL_CONFIG_DIR}{tool}.yaml")
}

/// The winning document of a tool config: the most specific layer's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolDocument {
    /// The tool's name (the file name).
    pub tool: String,
    /// The layer the document came from.
    pub layer: Layer,
    /// `classpath` or `<tenant>/<project>` of the document, for messages.
    pub location: String,
    /// The document's YAML text.
    pub content: String,
}

impl ToolDocument {
    /// Where the document came from, for error messages: `the project layer (t1/p1:_vance/config/tools/x.yaml)`.
    pub fn origin(&self) -> String {
        format!("the {} layer ({}:{})", self.layer, self.location, tool_config_path(&self.tool))
    }
}

impl LayeredDefinitions {
    /// The config document of `tool` for a caller in `(tenant, project)`: the most specific layer that has it
    /// (whole document, no merge), `None` if no layer has it. Read from the store every time (not cached).
    ///
    /// Errors: `INVALID_REQUEST` for a tool name that is not a valid name (names are path segments);
    /// `LEASE_UNAVAILABLE` naming the layer if any layer cannot be read.
    pub async fn tool_document(
        &self,
        tenant: &str,
        project: &str,
        tool: &str,
    ) -> Result<Option<ToolDocument>, LeaseError> {
        validate_name("tool", tool).map_err(|e| LeaseError::invalid(e.field, e.problem))?;
        let path = tool_config_path(tool);
        let what = format!("tool config {tool:?}");
        let layers = self.read_layers(tenant, project, &path, &what).await?;
        Ok(layers.into_iter().next_back().map(|l| ToolDocument {
            tool: tool.to_owned(),
            layer: l.layer,
            location: l.location,
            content: l.content,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::{Classpath, DocumentStore, MemoryDocumentStore};

    #[tokio::test]
    async fn the_most_specific_layer_wins_as_a_whole() {
        let store = Arc::new(MemoryDocumentStore::default());
        let path = tool_config_path("browser");
        let layers = LayeredDefinitions::new(store.clone())
            .with_classpath(Classpath::from_documents([(path.clone(), "from: classpath\n")]));

        let found = layers.tool_document("t1", "p1", "browser").await.unwrap().unwrap();
        assert_eq!((found.layer, found.content.as_str()), (Layer::Classpath, "from: classpath\n"));
        store.put("_vance", "_tenant", &path, "from: system\n").await.unwrap();
        store.put("t1", "_tenant", &path, "from: tenant\n").await.unwrap();
        let found = layers.tool_document("t1", "p1", "browser").await.unwrap().unwrap();
        assert_eq!((found.layer, found.content.as_str()), (Layer::Tenant, "from: tenant\n"));
        assert_eq!(found.origin(), "the tenant layer (t1/_tenant:_vance/config/tools/browser.yaml)");
        store.put("t1", "p1", &path, "from: project\n").await.unwrap();
        assert_eq!(layers.tool_document("t1", "p1", "browser").await.unwrap().unwrap().layer, Layer::Project);
        assert_eq!(layers.tool_document("t2", "p1", "browser").await.unwrap().unwrap().layer, Layer::System);
        assert_eq!(layers.tool_document("t1", "p1", "other").await.unwrap(), None);
    }

    #[tokio::test]
    async fn bad_names_are_invalid_requests() {
        let layers = LayeredDefinitions::new(Arc::new(MemoryDocumentStore::default()));
        for bad in ["", "../x", "a/b", "a b"] {
            let e = layers.tool_document("t1", "p1", bad).await.unwrap_err();
            assert_eq!(e.code(), "INVALID_REQUEST", "{bad:?}");
        }
    }
}
