//! Config documents and the four config layers (spec §2): where lease definitions and consumer settings come
//! from.
//!
//! - [`documents`]: the document store seam ([`DocumentStore`]) addressed by `(tenant, project, path)`, with the
//!   MongoDB `documents` collection ([`MongoDocumentStore`]) and an in-memory twin ([`MemoryDocumentStore`]); the
//!   change event ([`DocumentChanged`]) and the cross-pod seam ([`DocumentChangeListener`]).
//! - [`layers`]: the layers ([`Layer`]: classpath, System, Tenant, Project), the field ownership table, the
//!   field-by-field merge and the cached [`LayeredDefinitions`], which is the service's
//!   [`DefinitionSource`](crate::DefinitionSource).
//! - [`settings`]: consumer settings (`tex.lease`) through the same layers, answered as a
//!   [`LeaseRef`](crate::LeaseRef).
//! - [`tools`]: tool config documents (`_vance/config/tools/<tool>.yaml`), the most specific layer's document as a
//!   whole, for the MCP client.
//!
//! Everything here fails closed: a layer that cannot be read or parsed fails the load with `LEASE_UNAVAILABLE`
//! naming the layer, and nothing is cached.

pub mod documents;
pub mod layers;
pub mod settings;
pub mod tools;

pub use documents::{
    DOCUMENTS, DocumentChangeListener, DocumentChanged, DocumentStore, MemoryDocumentStore, MongoDocumentStore,
};
pub use layers::{
    Classpath, DEFAULT_CACHE_MAX_AGE, DefinitionField, LEASE_DEFINITION_DIR, Layer, LayeredDefinitions,
    definition_name, definition_path,
};
pub use settings::{SETTINGS_PATH, Setting, TEX_LEASE_SETTING, lease_ref_from_value};
pub use tools::{TOOL_CONFIG_DIR, ToolDocument, tool_config_path};

/// The tenant of the System layer.
pub const SYSTEM_TENANT: &str = "_vance";
/// The project of the System and Tenant layers (a tenant's own documents).
pub const TENANT_PROJECT: &str = "_tenant";
