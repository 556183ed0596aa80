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
//! it. [`LayeredDefinitions::tool_document`] is cached like definitions — every tool call looks its config up, and
//! a write through the layers (or a change event from another pod) drops the entry —, while
//! [`LayeredDefinitions::tool_document_uncached`] reads the layers now, for a decision that must not rest on a
//! missed change event (the `mcp` handler deciding where a reaped session's `DELETE` goes).

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
    /// (whole document, no merge), `None` if no layer has it. Cached per `(tenant, project, tool)` like
    /// definitions; failures are not cached.
    ///
    /// Errors: `INVALID_REQUEST` for a tool name that is not a valid name (names are path segments);
    /// `LEASE_UNAVAILABLE` naming the layer if any layer cannot be read.
    pub async fn tool_document(
        &self,
        tenant: &str,
        project: &str,
        tool: &str,
    ) -> Result<Option<ToolDocument>, LeaseError> {
        // An invalid name fails in the load, and failures are never cached.
        let path = tool_config_path(tool);
        self.cached(&self.tools, tenant, project, &path, || self.load_tool_document(tenant, project, tool)).await
    }

    /// [`Self::tool_document`] read from every layer now, bypassing the cache (and leaving it alone).
    pub async fn tool_document_uncached(
        &self,
        tenant: &str,
        project: &str,
        tool: &str,
    ) -> Result<Option<ToolDocument>, LeaseError> {
        self.load_tool_document(tenant, project, tool).await
    }

    async fn load_tool_document(
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
        let path = tool_config_path("browser");
        let layers = LayeredDefinitions::new(Arc::new(MemoryDocumentStore::default()))
            .with_classpath(Classpath::from_documents([(path.clone(), "from: classpath\n")]));

        let found = layers.tool_document("t1", "p1", "browser").await.unwrap().unwrap();
        assert_eq!((found.layer, found.content.as_str()), (Layer::Classpath, "from: classpath\n"));
        layers.put_document("_vance", "_tenant", &path, "from: system\n").await.unwrap();
        layers.put_document("t1", "_tenant", &path, "from: tenant\n").await.unwrap();
        let found = layers.tool_document("t1", "p1", "browser").await.unwrap().unwrap();
        assert_eq!((found.layer, found.content.as_str()), (Layer::Tenant, "from: tenant\n"));
        assert_eq!(found.origin(), "the tenant layer (t1/_tenant:_vance/config/tools/browser.yaml)");
        layers.put_document("t1", "p1", &path, "from: project\n").await.unwrap();
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

    #[tokio::test]
    async fn cached_until_a_write_through_the_layers_uncached_reads_now() {
        let store = Arc::new(MemoryDocumentStore::default());
        let path = tool_config_path("browser");
        let layers =
            LayeredDefinitions::new(store.clone()).with_classpath(Classpath::from_documents::<String, &str>([]));
        store.put("t1", "_tenant", &path, "v: 1\n").await.unwrap();
        let content = |d: Option<ToolDocument>| d.map(|d| d.content);
        assert_eq!(content(layers.tool_document("t1", "p1", "browser").await.unwrap()).as_deref(), Some("v: 1\n"));
        // A write behind the layers' back: the cached entry stands, the uncached read sees it.
        store.put("t1", "_tenant", &path, "v: 2\n").await.unwrap();
        assert_eq!(content(layers.tool_document("t1", "p1", "browser").await.unwrap()).as_deref(), Some("v: 1\n"));
        let now = layers.tool_document_uncached("t1", "p1", "browser").await.unwrap();
        assert_eq!(content(now).as_deref(), Some("v: 2\n"));
        // A write through the layers drops the tenant's entries.
        layers.put_document("t1", "_tenant", &path, "v: 3\n").await.unwrap();
        assert_eq!(content(layers.tool_document("t1", "p1", "browser").await.unwrap()).as_deref(), Some("v: 3\n"));
        assert!(layers.tool_document("t1", "p1", "bad name").await.is_err());
    }
}
