//! The four config layers of spec §2 and the cached, field-by-field merge of lease definitions.
//!
//! | layer | documents of | may set |
//! |---|---|---|
//! | classpath | the bundled `defaults` crate | every field |
//! | System | tenant `_vance`, project `_tenant` | every field |
//! | Tenant | the holder's tenant, project `_tenant` | all but `levels.global` |
//! | Project | the holder's tenant and project | `levels.project`, `levels.user`, `ttlSeconds`, `waitMs` |
//!
//! The most specific layer allowed to set a field wins; a field set by a layer that may not own it is ignored and
//! logged. A layer that cannot be read or parsed fails the whole load (`LEASE_UNAVAILABLE`, naming the layer) and
//! nothing is cached: a silently skipped layer might carry the very cap that protects the resource.
//!
//! [`LayeredDefinitions`] caches merged definitions (and merged settings, see [`super::settings`]) per
//! `(tenant, project, document path)`. A write through [`LayeredDefinitions::put_document`] or
//! [`LayeredDefinitions::delete_document`] drops the entries it affects and tells the other pods through the
//! [`DocumentChangeListener`]; they call [`LayeredDefinitions::invalidate`]. A generation counter keeps a load
//! that raced an invalidation from caching what it read before the write.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::documents::{DocumentChangeListener, DocumentChanged, DocumentStore};
use super::settings::MergedSettings;
use super::{SYSTEM_TENANT, TENANT_PROJECT};
use crate::definition::{DefinitionDocument, LeaseDefinition, validate_name};
use crate::error::LeaseError;
use crate::service::DefinitionSource;

/// The folder of lease definition documents: a definition named `tex` lives at `_vance/config/lease/tex.yaml`.
pub const LEASE_DEFINITION_DIR: &str = "_vance/config/lease/";

/// How long a cached entry is trusted without a change event: the safety net for a change event that never
/// arrived (a pod that was unreachable when another pod wrote). Change events remain the way writes take effect.
pub const DEFAULT_CACHE_MAX_AGE: Duration = Duration::from_secs(300);

/// The document path of the lease definition `name`.
pub fn definition_path(name: &str) -> String {
    format!("{LEASE_DEFINITION_DIR}{name}.yaml")
}

/// The lease definition name of a document path, if the path is a lease definition's.
pub fn definition_name(path: &str) -> Option<&str> {
    path.strip_prefix(LEASE_DEFINITION_DIR)?.strip_suffix(".yaml")
}

/// A config layer, from the most general to the most specific.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    /// The bundled documents of the `defaults` crate (add-on defaults).
    Classpath,
    /// Tenant `_vance`, project `_tenant`: the operator's overrule.
    System,
    /// The holder's tenant, project `_tenant`.
    Tenant,
    /// The holder's tenant and project.
    Project,
}

impl Layer {
    /// Every layer, most general first: the order of the merge.
    pub const GENERAL_TO_SPECIFIC: [Layer; 4] = [Layer::Classpath, Layer::System, Layer::Tenant, Layer::Project];

    /// `classpath`, `system`, `tenant` or `project`, as in logs and error messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Classpath => "classpath",
            Layer::System => "system",
            Layer::Tenant => "tenant",
            Layer::Project => "project",
        }
    }

    /// The ownership table of spec §2: whether this layer may set `field`.
    pub fn may_set(self, field: DefinitionField) -> bool {
        match field {
            DefinitionField::LevelsGlobal => matches!(self, Layer::Classpath | Layer::System),
            DefinitionField::Resource | DefinitionField::LevelsTenant => self != Layer::Project,
            DefinitionField::LevelsProject
            | DefinitionField::LevelsUser
            | DefinitionField::TtlSeconds
            | DefinitionField::WaitMs => true,
        }
    }

    /// The store layer a document at `(tenant, project)` belongs to.
    pub fn of_document(tenant: &str, project: &str) -> Layer {
        match (tenant, project) {
            (SYSTEM_TENANT, TENANT_PROJECT) => Layer::System,
            (_, TENANT_PROJECT) => Layer::Tenant,
            _ => Layer::Project,
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mergeable field of a lease definition (`name` is not merged: it must equal the file name everywhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DefinitionField {
    /// `resource`.
    Resource,
    /// `levels.global`.
    LevelsGlobal,
    /// `levels.tenant`.
    LevelsTenant,
    /// `levels.project`.
    LevelsProject,
    /// `levels.user`.
    LevelsUser,
    /// `ttlSeconds`.
    TtlSeconds,
    /// `waitMs`.
    WaitMs,
}

impl DefinitionField {
    /// Every mergeable field.
    pub const ALL: [DefinitionField; 7] = [
        DefinitionField::Resource,
        DefinitionField::LevelsGlobal,
        DefinitionField::LevelsTenant,
        DefinitionField::LevelsProject,
        DefinitionField::LevelsUser,
        DefinitionField::TtlSeconds,
        DefinitionField::WaitMs,
    ];

    /// The field's name in the YAML document (`levels.global`, `ttlSeconds`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            DefinitionField::Resource => "resource",
            DefinitionField::LevelsGlobal => "levels.global",
            DefinitionField::LevelsTenant => "levels.tenant",
            DefinitionField::LevelsProject => "levels.project",
            DefinitionField::LevelsUser => "levels.user",
            DefinitionField::TtlSeconds => "ttlSeconds",
            DefinitionField::WaitMs => "waitMs",
        }
    }
}

impl fmt::Display for DefinitionField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The classpath layer: documents bundled with the binary. Never changes at runtime.
#[derive(Clone, Default)]
pub struct Classpath(Arc<HashMap<String, Cow<'static, str>>>);

impl fmt::Debug for Classpath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut paths: Vec<&str> = self.0.keys().map(String::as_str).collect();
        paths.sort_unstable();
        f.debug_tuple("Classpath").field(&paths).finish()
    }
}

impl Classpath {
    /// The documents of the `defaults` crate.
    pub fn bundled() -> Self {
        Classpath(Arc::new(defaults::DOCUMENTS.iter().map(|d| (d.path.to_owned(), Cow::Borrowed(d.content))).collect()))
    }

    /// A classpath of exactly these `(path, content)` documents (add-ons that bundle their own, and tests).
    pub fn from_documents<P: Into<String>, C: Into<Cow<'static, str>>>(
        documents: impl IntoIterator<Item = (P, C)>,
    ) -> Self {
        Classpath(Arc::new(documents.into_iter().map(|(p, c)| (p.into(), c.into())).collect()))
    }

    /// The content of the bundled document at `path`.
    pub fn document(&self, path: &str) -> Option<&str> {
        self.0.get(path).map(|c| c.as_ref())
    }
}

/// One layer's document as read for a load.
#[derive(Debug)]
pub(super) struct LayerDocument {
    pub(super) layer: Layer,
    /// `classpath` or `<tenant>/<project>`, for messages.
    pub(super) location: String,
    pub(super) content: String,
}

impl LayerDocument {
    /// Fails the load closed because this layer's document at `path` is unusable: logs it with the layer, the
    /// scope and the problem, and answers `LEASE_UNAVAILABLE` naming `what`, the layer and the problem.
    pub(super) fn invalid(&self, what: &str, path: &str, tenant: &str, project: &str, problem: &str) -> LeaseError {
        tracing::warn!(
            layer = self.layer.as_str(),
            what,
            tenant,
            project,
            location = %self.location,
            problem,
            "config layer is invalid; failing closed"
        );
        LeaseError::unavailable(format!(
            "{what}: the {} layer document ({}:{path}) is invalid: {problem}",
            self.layer, self.location
        ))
    }
}

/// Whom a merge is for, for the log of ignored fields.
struct MergeContext<'a> {
    name: &'a str,
    tenant: &'a str,
    project: &'a str,
}

fn take<T>(slot: &mut Option<T>, value: Option<T>, layer: Layer, field: DefinitionField, cx: &MergeContext<'_>) {
    let Some(value) = value else { return };
    if layer.may_set(field) {
        *slot = Some(value);
    } else {
        tracing::warn!(
            layer = layer.as_str(),
            field = field.as_str(),
            lease = cx.name,
            tenant = cx.tenant,
            project = cx.project,
            "a config layer sets a lease definition field it does not own; ignored"
        );
    }
}

/// Merges the present layers' documents (most general first) field by field, with the ownership table.
fn merge(docs: Vec<(Layer, DefinitionDocument)>, cx: &MergeContext<'_>) -> LeaseDefinition {
    let mut merged = DefinitionDocument { name: Some(cx.name.to_owned()), ..DefinitionDocument::default() };
    for (layer, doc) in docs {
        let m = &mut merged;
        take(&mut m.resource, doc.resource, layer, DefinitionField::Resource, cx);
        take(&mut m.levels.global, doc.levels.global, layer, DefinitionField::LevelsGlobal, cx);
        take(&mut m.levels.tenant, doc.levels.tenant, layer, DefinitionField::LevelsTenant, cx);
        take(&mut m.levels.project, doc.levels.project, layer, DefinitionField::LevelsProject, cx);
        take(&mut m.levels.user, doc.levels.user, layer, DefinitionField::LevelsUser, cx);
        take(&mut m.ttl_seconds, doc.ttl_seconds, layer, DefinitionField::TtlSeconds, cx);
        take(&mut m.wait_ms, doc.wait_ms, layer, DefinitionField::WaitMs, cx);
    }
    LeaseDefinition::from_document(merged)
}

type CacheKey = (String, String, String);

fn cache_key(tenant: &str, project: &str, path: &str) -> CacheKey {
    (tenant.to_owned(), project.to_owned(), path.to_owned())
}

/// What a cache lookup found.
enum Lookup<V> {
    Hit(V),
    /// Not cached: load, then offer the result with this ticket.
    Miss(Ticket),
}

/// The generation and time a load started at: its result is cached only if no invalidation happened since.
#[derive(Debug, Clone, Copy)]
struct Ticket {
    generation: u64,
    started: Instant,
}

struct CacheState<V> {
    /// Bumped by every invalidation, under the same lock as the removal.
    generation: u64,
    entries: HashMap<CacheKey, (V, Instant)>,
}

/// Merged results per `(tenant, project, path)`.
pub(super) struct LayerCache<V> {
    // A std mutex: held only for map operations, never across an await.
    state: Mutex<CacheState<V>>,
}

impl<V> fmt::Debug for LayerCache<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("LayerCache")
            .field("generation", &state.generation)
            .field("entries", &state.entries.len())
            .finish()
    }
}

impl<V: Clone> LayerCache<V> {
    fn new() -> Self {
        LayerCache { state: Mutex::new(CacheState { generation: 0, entries: HashMap::new() }) }
    }

    fn state(&self) -> MutexGuard<'_, CacheState<V>> {
        // Every critical section leaves the map consistent, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lookup(&self, key: &CacheKey, max_age: Option<Duration>) -> Lookup<V> {
        let now = Instant::now();
        let state = self.state();
        match state.entries.get(key) {
            Some((value, loaded)) if max_age.is_none_or(|max| now.duration_since(*loaded) < max) => {
                Lookup::Hit(value.clone())
            }
            _ => Lookup::Miss(Ticket { generation: state.generation, started: now }),
        }
    }

    /// Caches `value` unless an invalidation happened since the ticket was issued (the load may have read a
    /// document that has changed since). Returns whether it was cached.
    fn offer(&self, key: CacheKey, value: V, ticket: Ticket) -> bool {
        let mut state = self.state();
        if state.generation != ticket.generation {
            return false;
        }
        state.entries.insert(key, (value, ticket.started));
        true
    }

    /// Drops what `change` affects: a Project document its `(tenant, project)` entry, a Tenant document every
    /// entry of its tenant, a System document every entry; always only entries of the same path. Returns how many
    /// entries were dropped.
    fn invalidate(&self, change: &DocumentChanged) -> usize {
        let mut state = self.state();
        state.generation += 1;
        let before = state.entries.len();
        let (system, tenant_wide) = (change.is_system(), change.is_tenant_wide());
        state.entries.retain(|(t, p, path), _| {
            let affected =
                *path == change.path && (system || (*t == change.tenant && (tenant_wide || *p == change.project)));
            !affected
        });
        before - state.entries.len()
    }

    fn clear(&self) {
        let mut state = self.state();
        state.generation += 1;
        state.entries.clear();
    }
}

/// Lease definitions from the four config layers, merged field by field and cached; also the consumer settings
/// of [`super::settings`]. The [`DefinitionSource`] of a [`ResourceLeaseService`](crate::ResourceLeaseService).
///
/// Share it behind an `Arc`: the service resolves through it, the config write path and the brain's
/// change-event endpoint use the same instance.
#[derive(Debug)]
pub struct LayeredDefinitions {
    pub(super) documents: Arc<dyn DocumentStore>,
    classpath: Classpath,
    listener: Option<Arc<dyn DocumentChangeListener>>,
    max_age: Option<Duration>,
    definitions: LayerCache<Option<LeaseDefinition>>,
    pub(super) settings: LayerCache<Arc<MergedSettings>>,
    pub(super) tools: LayerCache<Option<super::tools::ToolDocument>>,
}

impl LayeredDefinitions {
    /// Layers over `documents` with the bundled classpath, no cross-pod listener, and entries trusted for
    /// [`DEFAULT_CACHE_MAX_AGE`].
    pub fn new(documents: Arc<dyn DocumentStore>) -> Self {
        LayeredDefinitions {
            documents,
            classpath: Classpath::bundled(),
            listener: None,
            max_age: Some(DEFAULT_CACHE_MAX_AGE),
            definitions: LayerCache::new(),
            settings: LayerCache::new(),
            tools: LayerCache::new(),
        }
    }

    /// Replaces the classpath layer.
    pub fn with_classpath(mut self, classpath: Classpath) -> Self {
        self.classpath = classpath;
        self
    }

    /// Tells `listener` (the other pods) about every write through [`Self::put_document`] and
    /// [`Self::delete_document`].
    pub fn with_listener(mut self, listener: Arc<dyn DocumentChangeListener>) -> Self {
        self.listener = Some(listener);
        self
    }

    /// How long a cached entry is trusted without a change event; `None` trusts it until invalidated.
    pub fn with_max_age(mut self, max_age: Option<Duration>) -> Self {
        self.max_age = max_age;
        self
    }

    /// The document store under the layers (to read a single layer's document, e.g. for an operator view).
    pub fn documents(&self) -> &Arc<dyn DocumentStore> {
        &self.documents
    }

    /// The merged definition `name` for a holder in `(tenant, project)` as an acquisition would see it now: read
    /// from every layer, bypassing the cache (and leaving it alone). For the operator CLI, which is not tied to the
    /// change event chain.
    pub async fn definition_uncached(
        &self,
        tenant: &str,
        project: &str,
        name: &str,
    ) -> Result<Option<LeaseDefinition>, LeaseError> {
        validate_name("lease", name).map_err(|e| LeaseError::invalid(e.field, e.problem))?;
        self.load_definition(tenant, project, name).await
    }

    /// Writes (creates or replaces) a config document, drops the cache entries it affects on this pod and tells
    /// the listener. The document is not validated here: a broken one fails the loads that read it (fail-closed).
    pub async fn put_document(&self, tenant: &str, project: &str, path: &str, content: &str) -> Result<(), LeaseError> {
        validate_document_key(tenant, project, path)?;
        let written = self.documents.put(tenant, project, path, content).await;
        // Also after an error: a write whose reply was lost may have applied.
        self.changed(DocumentChanged::new(tenant, project, path)).await;
        written.map_err(LeaseError::from)
    }

    /// Deletes a config document (returning whether it existed), drops the cache entries it affects on this pod
    /// and tells the listener.
    pub async fn delete_document(&self, tenant: &str, project: &str, path: &str) -> Result<bool, LeaseError> {
        validate_document_key(tenant, project, path)?;
        let deleted = self.documents.delete(tenant, project, path).await;
        self.changed(DocumentChanged::new(tenant, project, path)).await;
        deleted.map_err(LeaseError::from)
    }

    async fn changed(&self, change: DocumentChanged) {
        self.invalidate(&change);
        if let Some(listener) = &self.listener {
            listener.on_changed(&change).await;
        }
    }

    /// Drops the cached entries `change` affects on this pod (a Project document: that project's entry; a Tenant
    /// document: that tenant's entries; a System document: every entry of that path), and makes every load
    /// already in flight discard its result. The brain calls this when another pod reports a write; it does not
    /// tell the listener again.
    pub fn invalidate(&self, change: &DocumentChanged) {
        let definitions = self.definitions.invalidate(change);
        let settings = self.settings.invalidate(change);
        let tools = self.tools.invalidate(change);
        tracing::debug!(
            tenant = %change.tenant,
            project = %change.project,
            path = %change.path,
            definitions,
            settings,
            tools,
            "config document changed; cache entries dropped"
        );
    }

    /// Drops every cached entry (an operator's "reload everything").
    pub fn invalidate_all(&self) {
        self.definitions.clear();
        self.settings.clear();
        self.tools.clear();
    }

    async fn load_definition(
        &self,
        tenant: &str,
        project: &str,
        name: &str,
    ) -> Result<Option<LeaseDefinition>, LeaseError> {
        let path = definition_path(name);
        let what = format!("lease definition {name:?}");
        let layers = self.read_layers(tenant, project, &path, &what).await?;
        if layers.is_empty() {
            return Ok(None);
        }
        let mut docs = Vec::with_capacity(layers.len());
        for l in layers {
            let doc = DefinitionDocument::parse(&l.content)
                .map_err(|e| e.to_string())
                .and_then(|doc| match doc.name.as_deref() {
                    Some(n) if n == name => Ok(doc),
                    Some(n) => Err(format!("name: {n:?} does not match the file name {name:?}")),
                    None => Err(format!("name: is missing (must be {name:?}, the file name)")),
                })
                .map_err(|problem| l.invalid(&what, &path, tenant, project, &problem))?;
            docs.push((l.layer, doc));
        }
        Ok(Some(merge(docs, &MergeContext { name, tenant, project })))
    }

    /// Reads `path` from every layer for a holder in `(tenant, project)`, most general first, leaving out layers
    /// without the document. The store layers are read concurrently; a store error fails the load, naming the
    /// (most general) layer that failed. A layer whose `(tenant, project)` is that of a more general layer (a
    /// holder in tenant `_vance`, or in project `_tenant`) is read once, as the more general layer.
    pub(super) async fn read_layers(
        &self,
        tenant: &str,
        project: &str,
        path: &str,
        what: &str,
    ) -> Result<Vec<LayerDocument>, LeaseError> {
        let mut scopes: Vec<(Layer, &str, &str)> = Vec::with_capacity(3);
        for (layer, t, p) in [
            (Layer::System, SYSTEM_TENANT, TENANT_PROJECT),
            (Layer::Tenant, tenant, TENANT_PROJECT),
            (Layer::Project, tenant, project),
        ] {
            if !scopes.iter().any(|(_, st, sp)| *st == t && *sp == p) {
                scopes.push((layer, t, p));
            }
        }
        let reads = futures_util::future::join_all(scopes.iter().map(|(_, t, p)| self.documents.get(t, p, path))).await;
        let mut docs = Vec::with_capacity(4);
        if let Some(content) = self.classpath.document(path) {
            docs.push(LayerDocument { layer: Layer::Classpath, location: "classpath".into(), content: content.into() });
        }
        for ((layer, t, p), read) in scopes.into_iter().zip(reads) {
            match read {
                Ok(Some(content)) => docs.push(LayerDocument { layer, location: format!("{t}/{p}"), content }),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(
                        layer = layer.as_str(),
                        path,
                        tenant,
                        project,
                        error = %e,
                        "config layer could not be read; failing closed"
                    );
                    return Err(LeaseError::unavailable(format!(
                        "{what}: the {layer} layer ({t}/{p}:{path}) could not be read: {e}"
                    )));
                }
            }
        }
        Ok(docs)
    }

    /// Looks `(tenant, project, path)` up in `cache`, or loads it with `load` and caches the result unless an
    /// invalidation raced the load. Errors are never cached.
    pub(super) async fn cached<V: Clone, F: Future<Output = Result<V, LeaseError>>>(
        &self,
        cache: &LayerCache<V>,
        tenant: &str,
        project: &str,
        path: &str,
        load: impl FnOnce() -> F,
    ) -> Result<V, LeaseError> {
        let key = cache_key(tenant, project, path);
        let ticket = match cache.lookup(&key, self.max_age) {
            Lookup::Hit(value) => return Ok(value),
            Lookup::Miss(ticket) => ticket,
        };
        let value = load().await?;
        if !cache.offer(key, value.clone(), ticket) {
            tracing::debug!(tenant, project, path, "config changed during the load; result not cached");
        }
        Ok(value)
    }
}

fn validate_document_key(tenant: &str, project: &str, path: &str) -> Result<(), LeaseError> {
    for (field, value) in [("tenantId", tenant), ("projectId", project), ("path", path)] {
        if value.is_empty() || value.chars().any(char::is_control) {
            return Err(LeaseError::invalid(
                field,
                format!("{value:?} must be non-empty text without control characters"),
            ));
        }
    }
    Ok(())
}

#[async_trait]
impl DefinitionSource for LayeredDefinitions {
    async fn definition(&self, tenant: &str, project: &str, name: &str) -> Result<Option<LeaseDefinition>, LeaseError> {
        validate_name("lease", name).map_err(|e| LeaseError::invalid(e.field, e.problem))?;
        let path = definition_path(name);
        self.cached(&self.definitions, tenant, project, &path, || self.load_definition(tenant, project, name)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::Caps;

    fn doc(yaml: &str) -> DefinitionDocument {
        DefinitionDocument::parse(yaml).unwrap()
    }

    fn cx() -> MergeContext<'static> {
        MergeContext { name: "tex", tenant: "t1", project: "p1" }
    }

    #[test]
    fn ownership_table_matches_the_spec() {
        use DefinitionField::*;
        use Layer::*;
        let owners =
            |f: DefinitionField| Layer::GENERAL_TO_SPECIFIC.into_iter().filter(|l| l.may_set(f)).collect::<Vec<_>>();
        assert_eq!(owners(LevelsGlobal), [Classpath, System]);
        assert_eq!(owners(Resource), [Classpath, System, Tenant]);
        assert_eq!(owners(LevelsTenant), [Classpath, System, Tenant]);
        for f in [LevelsProject, LevelsUser, TtlSeconds, WaitMs] {
            assert_eq!(owners(f), [Classpath, System, Tenant, Project], "{f}");
        }
    }

    #[test]
    fn merge_takes_the_most_specific_allowed_layer_per_field() {
        let merged = merge(
            vec![
                (Layer::Classpath, doc("resource: cp\nlevels: {global: 6, tenant: 3, project: 1}\nttlSeconds: 120\n")),
                (Layer::System, doc("levels: {global: 8}\nwaitMs: 50\n")),
                (Layer::Tenant, doc("resource: tr\nlevels: {global: 99, tenant: 4}\n")),
                (Layer::Project, doc("resource: pr\nlevels: {tenant: 99, user: 2}\nttlSeconds: 30\n")),
            ],
            &cx(),
        );
        assert_eq!(merged.name, "tex");
        assert_eq!(merged.resource, "tr");
        assert_eq!(merged.levels, Caps { global: Some(8), tenant: Some(4), project: Some(1), user: Some(2) });
        assert_eq!((merged.ttl_seconds, merged.wait_ms), (30, 50));
    }

    #[test]
    fn layer_of_a_document() {
        assert_eq!(Layer::of_document("_vance", "_tenant"), Layer::System);
        assert_eq!(Layer::of_document("t1", "_tenant"), Layer::Tenant);
        assert_eq!(Layer::of_document("t1", "p1"), Layer::Project);
        assert_eq!(Layer::of_document("_vance", "p1"), Layer::Project);
        assert_eq!(definition_name(&definition_path("tex")), Some("tex"));
        assert_eq!(definition_name("_vance/config/settings.yaml"), None);
    }

    #[test]
    fn invalidation_is_scoped_by_layer_and_path() {
        let cache = LayerCache::<u32>::new();
        let keys = [("t1", "p1"), ("t1", "p2"), ("t2", "p1")];
        let fill = |cache: &LayerCache<u32>| {
            for (t, p) in keys {
                for path in ["a", "b"] {
                    let Lookup::Miss(ticket) = cache.lookup(&cache_key(t, p, path), None) else { continue };
                    assert!(cache.offer(cache_key(t, p, path), 1, ticket));
                }
            }
        };
        fill(&cache);
        assert_eq!(cache.invalidate(&DocumentChanged::new("t1", "p1", "a")), 1);
        fill(&cache);
        assert_eq!(cache.invalidate(&DocumentChanged::new("t1", "_tenant", "a")), 2);
        fill(&cache);
        assert_eq!(cache.invalidate(&DocumentChanged::new("_vance", "_tenant", "a")), 3);
        assert_eq!(cache.state().entries.len(), 3, "only path a was dropped");
    }

    #[test]
    fn a_load_that_raced_an_invalidation_is_not_cached() {
        let cache = LayerCache::<u32>::new();
        let key = cache_key("t1", "p1", "a");
        let Lookup::Miss(ticket) = cache.lookup(&key, None) else { panic!("empty cache hit") };
        cache.invalidate(&DocumentChanged::new("t9", "p9", "other"));
        assert!(!cache.offer(key.clone(), 1, ticket), "a stale load was cached");
        assert!(matches!(cache.lookup(&key, None), Lookup::Miss(_)));
    }
}
