//! The document store seam: config documents addressed by `(tenant, project, path)`, and the change events that
//! keep caches of them honest.
//!
//! A document is text (YAML for everything here). The store knows nothing about layers or what a document means;
//! [`super::layers`] does. Errors are [`StoreError`]s, which every reader turns into `LEASE_UNAVAILABLE`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use mongodb::bson::{Document, doc};
use mongodb::{Collection, Database, IndexModel};
use serde::{Deserialize, Serialize};

use super::{SYSTEM_TENANT, TENANT_PROJECT};
use crate::error::StoreError;
use crate::store::StoreResult;

/// The MongoDB collection of config documents.
pub const DOCUMENTS: &str = "documents";

/// Config documents by `(tenant, project, path)`. Each method is one atomic operation on the backend.
#[async_trait]
pub trait DocumentStore: Send + Sync + fmt::Debug + 'static {
    /// The content of the document, `None` if it does not exist.
    async fn get(&self, tenant: &str, project: &str, path: &str) -> StoreResult<Option<String>>;

    /// Creates or replaces the document (an upsert), stamping `updatedAt` with store time.
    async fn put(&self, tenant: &str, project: &str, path: &str, content: &str) -> StoreResult<()>;

    /// Deletes the document; returns whether it existed.
    async fn delete(&self, tenant: &str, project: &str, path: &str) -> StoreResult<bool>;
}

/// A config document was written or deleted. Sent to the local caches and, through a [`DocumentChangeListener`],
/// to the other pods (whose brain hands it to [`LayeredDefinitions::invalidate`](super::LayeredDefinitions)).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DocumentChanged {
    /// The document's tenant (`_vance` for the System layer).
    pub tenant: String,
    /// The document's project (`_tenant` for the System and Tenant layers).
    pub project: String,
    /// The document's path, e.g. `_vance/config/lease/tex.yaml`.
    pub path: String,
}

impl DocumentChanged {
    /// The change of the document at `(tenant, project, path)`.
    pub fn new(tenant: impl Into<String>, project: impl Into<String>, path: impl Into<String>) -> Self {
        DocumentChanged { tenant: tenant.into(), project: project.into(), path: path.into() }
    }

    /// Whether the document is in the System layer (`_vance` / `_tenant`): its change concerns every tenant.
    pub fn is_system(&self) -> bool {
        self.tenant == SYSTEM_TENANT && self.project == TENANT_PROJECT
    }

    /// Whether the document is a tenant's own (project `_tenant`, System included): its change concerns every
    /// project of the tenant.
    pub fn is_tenant_wide(&self) -> bool {
        self.project == TENANT_PROJECT
    }
}

impl fmt::Display for DocumentChanged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.tenant, self.project, self.path)
    }
}

/// Tells the other pods that a config document changed. The brain implements it over HTTP
/// (`POST /internal/documents/changed`); the receiving pod calls
/// [`LayeredDefinitions::invalidate`](super::LayeredDefinitions::invalidate).
///
/// It is called after every write through the layer API, on the writer's path: an implementation should hand the
/// fan-out off rather than wait for slow pods, and it cannot fail the write (it logs its own failures).
#[async_trait]
pub trait DocumentChangeListener: Send + Sync + fmt::Debug + 'static {
    /// `change` was written (or deleted) on this pod; its local caches are already invalidated.
    async fn on_changed(&self, change: &DocumentChanged);
}

type Key = (String, String, String);

fn key(tenant: &str, project: &str, path: &str) -> Key {
    (tenant.to_owned(), project.to_owned(), path.to_owned())
}

/// The in-memory [`DocumentStore`]: the embedded brain without MongoDB, and tests.
#[derive(Debug, Default)]
pub struct MemoryDocumentStore {
    // A std mutex: no method awaits while holding it.
    documents: Mutex<HashMap<Key, String>>,
}

impl MemoryDocumentStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn documents(&self) -> MutexGuard<'_, HashMap<Key, String>> {
        // Every method mutates with a single map operation, so a poisoned lock is still consistent.
        self.documents.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl DocumentStore for MemoryDocumentStore {
    async fn get(&self, tenant: &str, project: &str, path: &str) -> StoreResult<Option<String>> {
        Ok(self.documents().get(&key(tenant, project, path)).cloned())
    }

    async fn put(&self, tenant: &str, project: &str, path: &str, content: &str) -> StoreResult<()> {
        self.documents().insert(key(tenant, project, path), content.to_owned());
        Ok(())
    }

    async fn delete(&self, tenant: &str, project: &str, path: &str) -> StoreResult<bool> {
        Ok(self.documents().remove(&key(tenant, project, path)).is_some())
    }
}

/// The MongoDB [`DocumentStore`]: the `documents` collection, fields `tenantId`, `projectId`, `path`, `content`
/// (text) and `updatedAt` (server time), unique on `(tenantId, projectId, path)`.
#[derive(Debug, Clone)]
pub struct MongoDocumentStore {
    documents: Collection<Document>,
}

/// E11000: a concurrent upsert inserted the same key first.
const DUPLICATE_KEY: i32 = 11000;

fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == DUPLICATE_KEY,
        ErrorKind::Command(c) => c.code == DUPLICATE_KEY,
        _ => false,
    }
}

fn filter(tenant: &str, project: &str, path: &str) -> Document {
    doc! { "tenantId": tenant, "projectId": project, "path": path }
}

impl MongoDocumentStore {
    /// A store on `database`'s `documents` collection. Touches no network.
    pub fn new(database: &Database) -> Self {
        MongoDocumentStore { documents: database.collection(DOCUMENTS) }
    }

    /// Creates the unique index on `(tenantId, projectId, path)`. Idempotent.
    pub async fn ensure_indexes(&self) -> StoreResult<()> {
        let unique = mongodb::options::IndexOptions::builder().unique(true).build();
        let index =
            IndexModel::builder().keys(doc! { "tenantId": 1, "projectId": 1, "path": 1 }).options(unique).build();
        self.documents.create_index(index).await.map_err(|e| StoreError::new("ensure_document_indexes", e))?;
        Ok(())
    }

    async fn upsert(&self, tenant: &str, project: &str, path: &str, content: &str) -> mongodb::error::Result<()> {
        self.documents
            .update_one(
                filter(tenant, project, path),
                doc! { "$set": { "content": content }, "$currentDate": { "updatedAt": true } },
            )
            .upsert(true)
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl DocumentStore for MongoDocumentStore {
    async fn get(&self, tenant: &str, project: &str, path: &str) -> StoreResult<Option<String>> {
        let found = self
            .documents
            .find_one(filter(tenant, project, path))
            .projection(doc! { "content": 1 })
            .await
            .map_err(|e| StoreError::new("get_document", e))?;
        match found {
            None => Ok(None),
            Some(d) => match d.get_str("content") {
                Ok(content) => Ok(Some(content.to_owned())),
                // A document we cannot read as text is an unreadable layer, not an absent one.
                Err(_) => {
                    Err(StoreError::new("get_document", format!("{tenant}/{project}:{path} has no text content")))
                }
            },
        }
    }

    async fn put(&self, tenant: &str, project: &str, path: &str, content: &str) -> StoreResult<()> {
        match self.upsert(tenant, project, path, content).await {
            Ok(()) => Ok(()),
            // Two first writers raced on the unique index; the loser's retry updates the winner's document.
            Err(e) if is_duplicate_key(&e) => {
                self.upsert(tenant, project, path, content).await.map_err(|e| StoreError::new("put_document", e))
            }
            Err(e) => Err(StoreError::new("put_document", e)),
        }
    }

    async fn delete(&self, tenant: &str, project: &str, path: &str) -> StoreResult<bool> {
        let r = self
            .documents
            .delete_one(filter(tenant, project, path))
            .await
            .map_err(|e| StoreError::new("delete_document", e))?;
        Ok(r.deleted_count == 1)
    }
}
