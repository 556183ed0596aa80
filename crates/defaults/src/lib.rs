//! Bundled config documents: the classpath layer of the lease definitions (spec §2).
//!
//! The documents under `documents/` are embedded at compile time. The layer loader (config-layers issue) reads
//! them through [`document`]; nothing here touches a store.

/// One bundled document: its path (as in the `documents` collection) and its YAML text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundledDocument {
    /// Path of the document, e.g. `_vance/config/lease/tex.yaml`.
    pub path: &'static str,
    /// The document's text, as bundled.
    pub content: &'static str,
}

/// Every bundled document.
pub const DOCUMENTS: &[BundledDocument] = &[
    BundledDocument {
        path: "_vance/config/lease/tex.yaml",
        content: include_str!("../documents/_vance/config/lease/tex.yaml"),
    },
    BundledDocument {
        path: "_vance/config/lease/browser.yaml",
        content: include_str!("../documents/_vance/config/lease/browser.yaml"),
    },
];

/// The bundled document at `path`, if any.
pub fn document(path: &str) -> Option<&'static str> {
    DOCUMENTS.iter().find(|d| d.path == path).map(|d| d.content)
}
