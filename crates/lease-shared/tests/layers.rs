//! Lease definitions from the four config layers (spec §2), consumer settings, the cache and its invalidation.
//! Every test declared with `on_both_document_stores!` runs on the in-memory document store and on the real
//! MongoDB `documents` collection (with the lease store of the same kind).

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_shared::config::{
    Classpath, DefinitionField, DocumentChangeListener, DocumentChanged, DocumentStore, Layer, LayeredDefinitions,
    MemoryDocumentStore, MongoDocumentStore, SETTINGS_PATH, TEX_LEASE_SETTING, definition_path,
};
use lease_shared::store::StoreResult;
use lease_shared::{
    DefinitionSource, LeaseDefinition, LeaseError, LeaseRef, LeaseRequest, Level, MemoryStore, ResourceLeaseService,
    StoreError,
};
use mongodb::bson::{Document, doc};
use support::{Backend, Fixture, request};
use tokio::sync::oneshot;
use tracing::instrument::WithSubscriber;

const SYSTEM: (&str, &str) = ("_vance", "_tenant");

fn tenant_scope(tenant: &str) -> (&str, &str) {
    (tenant, "_tenant")
}

/// Which document store a test runs on.
#[derive(Debug, Clone, Copy)]
enum Docs {
    Memory,
    Mongo(&'static str),
}

/// Declares each listed async test fn (taking a [`Docs`]) once per document store.
macro_rules! on_both_document_stores {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Docs::Memory).await
                }
            )*
        }
        mod mongo {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Docs::Mongo(stringify!($name))).await
                }
            )*
        }
    };
}

on_both_document_stores!(
    ownership_table_every_row,
    layers_merge_field_by_field_and_take_effect_together,
    broken_layer_fails_closed_naming_the_layer_and_nothing_is_cached,
    store_error_on_one_layer_fails_closed_and_acquires_nothing,
    inline_definitions_read_no_layer_and_stay_project_private,
    config_write_is_seen_by_the_next_acquire_and_told_to_the_listener,
    writes_drop_exactly_the_entries_of_their_layer,
    another_pods_write_takes_effect_through_invalidate,
    load_racing_a_write_does_not_cache_what_it_read_before,
    definition_uncached_reads_past_the_cache,
    bundled_tex_definition_is_the_classpath_layer,
    holder_in_a_layer_scope_reads_that_document_once,
    settings_none_takes_no_lease_and_touches_no_lease_store,
    settings_project_beats_tenant_beats_system_beats_default,
    settings_fail_closed,
);

// ---------------------------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------------------------

/// A get of one `(tenant, project)` that pauses after reading, until released.
struct Gate {
    scope: (String, String),
    reached: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
}

/// The document store under test, wrapped: counts gets, fails the gets of chosen scopes, pauses a get.
#[derive(Debug)]
struct ProbeDocs {
    inner: Arc<dyn DocumentStore>,
    gets: Mutex<usize>,
    failing: Mutex<HashSet<(String, String)>>,
    gate: Mutex<Option<Gate>>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gate({:?})", self.scope)
    }
}

impl ProbeDocs {
    fn new(inner: Arc<dyn DocumentStore>) -> Self {
        ProbeDocs { inner, gets: Mutex::default(), failing: Mutex::default(), gate: Mutex::default() }
    }

    fn gets(&self) -> usize {
        *self.gets.lock().unwrap()
    }

    /// Gets since the last call.
    fn take_gets(&self) -> usize {
        std::mem::take(&mut *self.gets.lock().unwrap())
    }

    fn fail(&self, (t, p): (&str, &str), on: bool) {
        let mut failing = self.failing.lock().unwrap();
        if on {
            failing.insert((t.to_owned(), p.to_owned()));
        } else {
            failing.remove(&(t.to_owned(), p.to_owned()));
        }
    }

    /// The next get of `scope` pauses after reading; returns (reached, release).
    fn gate(&self, (t, p): (&str, &str)) -> (oneshot::Receiver<()>, oneshot::Sender<()>) {
        let (reached_tx, reached_rx) = oneshot::channel();
        let (release_tx, release_rx) = oneshot::channel();
        *self.gate.lock().unwrap() =
            Some(Gate { scope: (t.to_owned(), p.to_owned()), reached: reached_tx, release: release_rx });
        (reached_rx, release_tx)
    }
}

#[async_trait]
impl DocumentStore for ProbeDocs {
    async fn get(&self, tenant: &str, project: &str, path: &str) -> StoreResult<Option<String>> {
        *self.gets.lock().unwrap() += 1;
        let scope = (tenant.to_owned(), project.to_owned());
        if self.failing.lock().unwrap().contains(&scope) {
            return Err(StoreError::new("get_document", "injected: connection reset"));
        }
        let read = self.inner.get(tenant, project, path).await;
        let gate = {
            let mut gate = self.gate.lock().unwrap();
            if gate.as_ref().is_some_and(|g| g.scope == scope) { gate.take() } else { None }
        };
        if let Some(g) = gate {
            let _ = g.reached.send(());
            let _ = g.release.await;
        }
        read
    }

    async fn put(&self, tenant: &str, project: &str, path: &str, content: &str) -> StoreResult<()> {
        self.inner.put(tenant, project, path, content).await
    }

    async fn delete(&self, tenant: &str, project: &str, path: &str) -> StoreResult<bool> {
        self.inner.delete(tenant, project, path).await
    }
}

/// Records every change it is told about.
#[derive(Debug, Default)]
struct RecordingListener(Mutex<Vec<DocumentChanged>>);

impl RecordingListener {
    fn events(&self) -> Vec<DocumentChanged> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait]
impl DocumentChangeListener for RecordingListener {
    async fn on_changed(&self, change: &DocumentChanged) {
        self.0.lock().unwrap().push(change.clone());
    }
}

/// One pod's view: the probed document store, the layered definitions over it, and a lease service over the
/// counting lease store of the same backend.
struct Env {
    fx: Fixture,
    raw: Arc<dyn DocumentStore>,
    docs: Arc<ProbeDocs>,
    listener: Arc<RecordingListener>,
    defs: Arc<LayeredDefinitions>,
    svc: ResourceLeaseService,
}

fn types() -> Arc<HashSet<String>> {
    Arc::new(["test", "tex", "mcp"].map(String::from).into())
}

impl Env {
    async fn new(backend: Docs, classpath: Classpath) -> Self {
        let fx = Fixture::new(match backend {
            Docs::Memory => Backend::Memory,
            Docs::Mongo(name) => Backend::Mongo(name),
        })
        .await;
        let raw: Arc<dyn DocumentStore> = match &fx.db {
            None => Arc::new(MemoryDocumentStore::new()),
            Some(db) => {
                let store = MongoDocumentStore::new(db);
                store.ensure_indexes().await.expect("document indexes");
                Arc::new(store)
            }
        };
        let docs = Arc::new(ProbeDocs::new(raw.clone()));
        let listener = Arc::new(RecordingListener::default());
        let defs =
            Arc::new(LayeredDefinitions::new(docs.clone()).with_classpath(classpath).with_listener(listener.clone()));
        let svc = ResourceLeaseService::new(fx.store.clone(), defs.clone(), types(), None);
        Env { fx, raw, docs, listener, defs, svc }
    }

    /// A second pod on the same documents (a second client for MongoDB), without a listener.
    async fn second_pod(&self, classpath: Classpath) -> Arc<LayeredDefinitions> {
        let store: Arc<dyn DocumentStore> = match &self.fx.db {
            None => self.raw.clone(),
            Some(db) => {
                let uri = std::env::var(support::MONGODB_URI_VAR).expect("uri");
                let client = mongodb::Client::with_uri_str(&uri).await.expect("second client");
                Arc::new(MongoDocumentStore::new(&client.database(db.name())))
            }
        };
        Arc::new(LayeredDefinitions::new(store).with_classpath(classpath))
    }

    async fn put(&self, (t, p): (&str, &str), name: &str, yaml: &str) {
        self.defs.put_document(t, p, &definition_path(name), yaml).await.expect("put document");
    }

    async fn def(&self, tenant: &str, project: &str, name: &str) -> LeaseDefinition {
        self.defs
            .definition(tenant, project, name)
            .await
            .unwrap_or_else(|e| panic!("definition {name} for {tenant}/{project}: {e}"))
            .unwrap_or_else(|| panic!("no definition {name} for {tenant}/{project}"))
    }

    async fn unavailable(&self, tenant: &str, project: &str, name: &str) -> String {
        match self.defs.definition(tenant, project, name).await {
            Err(LeaseError::Unavailable { reason }) => reason,
            other => panic!("expected LEASE_UNAVAILABLE for {name} in {tenant}/{project}, got {other:?}"),
        }
    }

    async fn done(self) {
        self.fx.drop_database().await;
    }
}

fn classpath(docs: &[(&str, &str)]) -> Classpath {
    Classpath::from_documents(docs.iter().map(|(name, yaml)| (definition_path(name), yaml.to_string())))
}

/// Captures WARN and ERROR events with their fields.
#[derive(Debug, Clone, Default)]
struct Captured(Arc<Mutex<Vec<HashMap<String, String>>>>);

struct FieldVisitor<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for FieldVisitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl tracing::Subscriber for Captured {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = HashMap::new();
        event.record(&mut FieldVisitor(&mut fields));
        self.0.lock().unwrap().push(fields);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Captured {
    /// `(layer, field, lease)` of every "ignored field" warning.
    fn ignored(&self) -> HashSet<(String, String, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|f| f.get("message").is_some_and(|m| m.contains("does not own")))
            .map(|f| (f["layer"].clone(), f["field"].clone(), f["lease"].clone()))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Definitions from layers
// ---------------------------------------------------------------------------------------------------------------

/// The ownership table of spec §2, written out independently of the implementation.
const OWNERS: [(DefinitionField, &[Layer]); 7] = [
    (DefinitionField::LevelsGlobal, &[Layer::Classpath, Layer::System]),
    (DefinitionField::Resource, &[Layer::Classpath, Layer::System, Layer::Tenant]),
    (DefinitionField::LevelsTenant, &[Layer::Classpath, Layer::System, Layer::Tenant]),
    (DefinitionField::LevelsProject, &[Layer::Classpath, Layer::System, Layer::Tenant, Layer::Project]),
    (DefinitionField::LevelsUser, &[Layer::Classpath, Layer::System, Layer::Tenant, Layer::Project]),
    (DefinitionField::TtlSeconds, &[Layer::Classpath, Layer::System, Layer::Tenant, Layer::Project]),
    (DefinitionField::WaitMs, &[Layer::Classpath, Layer::System, Layer::Tenant, Layer::Project]),
];

/// The YAML that sets `field` to the base value (`base`) or to the layer's value.
fn field_yaml(field: DefinitionField, base: bool) -> String {
    let (cap, ttl, wait, resource) = if base { (5, 50, 500, "base-res") } else { (7, 70, 700, "layer-res") };
    match field {
        DefinitionField::Resource => format!("resource: {resource}\n"),
        DefinitionField::LevelsGlobal => format!("levels:\n  global: {cap}\n"),
        DefinitionField::LevelsTenant => format!("levels:\n  tenant: {cap}\n"),
        DefinitionField::LevelsProject => format!("levels:\n  project: {cap}\n"),
        DefinitionField::LevelsUser => format!("levels:\n  user: {cap}\n"),
        DefinitionField::TtlSeconds => format!("ttlSeconds: {ttl}\n"),
        DefinitionField::WaitMs => format!("waitMs: {wait}\n"),
    }
}

/// The merged value of `field`, as text.
fn field_value(field: DefinitionField, d: &LeaseDefinition) -> String {
    let cap = |c: Option<u32>| c.map_or("-".to_owned(), |c| c.to_string());
    match field {
        DefinitionField::Resource => d.resource.clone(),
        DefinitionField::LevelsGlobal => cap(d.levels.global),
        DefinitionField::LevelsTenant => cap(d.levels.tenant),
        DefinitionField::LevelsProject => cap(d.levels.project),
        DefinitionField::LevelsUser => cap(d.levels.user),
        DefinitionField::TtlSeconds => d.ttl_seconds.to_string(),
        DefinitionField::WaitMs => d.wait_ms.to_string(),
    }
}

fn lease_name(field: DefinitionField, layer: Layer) -> String {
    format!("{}-{}", field.as_str().replace('.', "-"), layer.as_str())
}

async fn ownership_table_every_row(backend: Docs) {
    // For every (field, layer): the classpath sets the field to a base value (or, for the classpath row itself,
    // to the layer value), the layer sets it to another value. An owning layer's value wins; anything else leaves
    // the base value and is logged.
    let mut cp = Vec::new();
    for (field, _) in OWNERS {
        for layer in Layer::GENERAL_TO_SPECIFIC {
            let name = lease_name(field, layer);
            cp.push((name.clone(), format!("name: {name}\n{}", field_yaml(field, layer != Layer::Classpath))));
        }
    }
    let env =
        Env::new(backend, Classpath::from_documents(cp.iter().map(|(n, y)| (definition_path(n), y.clone())))).await;
    for (field, _) in OWNERS {
        for (layer, scope) in
            [(Layer::System, SYSTEM), (Layer::Tenant, tenant_scope("t1")), (Layer::Project, ("t1", "p1"))]
        {
            let name = lease_name(field, layer);
            env.put(scope, &name, &format!("name: {name}\n{}", field_yaml(field, false))).await;
        }
    }

    let captured = Captured::default();
    let dispatch = tracing::Dispatch::new(captured.clone());
    let mut expected_ignored = HashSet::new();
    for (field, owners) in OWNERS {
        for layer in Layer::GENERAL_TO_SPECIFIC {
            let name = lease_name(field, layer);
            let d = env.def("t1", "p1", &name).with_subscriber(dispatch.clone()).await;
            let owned = owners.contains(&layer);
            let expected = field_value(
                field,
                &LeaseDefinition::from_yaml(&name, &format!("name: {name}\n{}", field_yaml(field, !owned))).unwrap(),
            );
            assert_eq!(field_value(field, &d), expected, "{field} set in the {layer} layer (owned: {owned})");
            if !owned {
                expected_ignored.insert((layer.as_str().to_owned(), field.as_str().to_owned(), name.clone()));
            }
            // Another project of the tenant sees the Tenant and System layers but not t1/p1's Project layer.
            if layer == Layer::Project {
                let base =
                    LeaseDefinition::from_yaml(&name, &format!("name: {name}\n{}", field_yaml(field, true))).unwrap();
                assert_eq!(field_value(field, &env.def("t1", "p2", &name).await), field_value(field, &base), "{field}");
            }
        }
    }
    assert_eq!(expected_ignored.len(), 4, "the table has four forbidden (field, layer) cells");
    assert_eq!(captured.ignored(), expected_ignored, "every ignored field is logged with layer, field and lease");
    env.done().await;
}

async fn layers_merge_field_by_field_and_take_effect_together(backend: Docs) {
    let env = Env::new(
        backend,
        classpath(&[(
            "pdf",
            "name: pdf\nresource: pdf-cp\nlevels: {global: 6, tenant: 3, project: 1}\nttlSeconds: 120\n",
        )]),
    )
    .await;
    env.put(SYSTEM, "pdf", "name: pdf\nlevels: {global: 2}\nttlSeconds: 200\n").await;
    env.put(tenant_scope("t1"), "pdf", "name: pdf\nresource: pdf-t1\nlevels: {tenant: 4}\n").await;
    env.put(("t1", "p1"), "pdf", "name: pdf\nlevels: {project: 3}\nttlSeconds: 30\n").await;

    let d = env.def("t1", "p1", "pdf").await;
    assert_eq!(d.resource, "pdf-t1");
    assert_eq!((d.levels.global, d.levels.tenant, d.levels.project, d.levels.user), (Some(2), Some(4), Some(3), None));
    assert_eq!((d.ttl_seconds, d.wait_ms), (30, 0));
    let d = env.def("t1", "p2", "pdf").await;
    assert_eq!(
        (d.resource.as_str(), d.levels.tenant, d.levels.project, d.ttl_seconds),
        ("pdf-t1", Some(4), Some(1), 200)
    );
    let d = env.def("t2", "p1", "pdf").await;
    assert_eq!(
        (d.resource.as_str(), d.levels.global, d.levels.tenant, d.ttl_seconds),
        ("pdf-cp", Some(2), Some(3), 200)
    );

    // Through the service: the Project ttl, the Tenant resource and caps, the System global ceiling, together.
    let a = env.svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap();
    let h = env.fx.raw.holder(a.token().unwrap()).await.unwrap().unwrap();
    assert_eq!(h.ttl_seconds, 30);
    assert_eq!(h.levels, vec!["pdf-t1|project|t1/p1", "pdf-t1|tenant|t1", "pdf-t1|global|*"]);
    let b = env.svc.acquire(request("pdf", "t1", "p1", "u2")).await.expect("project cap 3 admits a second");
    match env.svc.acquire(request("pdf", "t1", "p1", "u3")).await {
        Err(LeaseError::Busy(busy)) => assert_eq!((busy.level, busy.cap), (Level::Global, 2), "{busy:?}"),
        other => panic!("the System ceiling of 2 did not hold: {other:?}"),
    }
    a.release().await.unwrap();
    b.release().await.unwrap();
    env.done().await;
}

async fn broken_layer_fails_closed_naming_the_layer_and_nothing_is_cached(backend: Docs) {
    let env = Env::new(backend, classpath(&[("pdf", "name: pdf\nlevels: {project: 1}\nttlSeconds: 60\n")])).await;
    let path = definition_path("pdf");
    let classes = [
        ("broken YAML", "name: pdf\nlevels: {project: 1\n", "line"),
        ("non-numeric", "name: pdf\nlevels:\n  project: one\n", "one"),
        ("cap below one", "name: pdf\nlevels:\n  project: 0\n", "got 0"),
        ("unknown key", "name: pdf\nlevels:\n  project: 1\nregion: eu\n", "region"),
        ("name mismatch", "name: other\nlevels:\n  project: 1\n", "\"other\""),
        ("name missing", "levels:\n  project: 1\n", "missing"),
    ];
    for (layer, (t, p)) in [("system", SYSTEM), ("tenant", tenant_scope("t1")), ("project", ("t1", "p1"))] {
        for (class, yaml, detail) in classes {
            assert_eq!(env.def("t1", "p1", "pdf").await.levels.project, Some(1), "{layer}/{class}: warm-up");
            env.defs.put_document(t, p, &path, yaml).await.unwrap();
            let reason = env.unavailable("t1", "p1", "pdf").await;
            assert!(reason.contains(&format!("the {layer} layer")), "{layer}/{class}: {reason}");
            assert!(reason.contains(detail), "{layer}/{class}: {reason}");
            let calls = env.fx.store.total_calls();
            let err = env.svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap_err();
            assert_eq!(err.code(), "LEASE_UNAVAILABLE", "{layer}/{class}: {err}");
            assert_eq!(env.fx.store.total_calls(), calls, "{layer}/{class}: a lease store call behind a broken layer");
            // Fixed behind the cache's back (no change event): had anything been cached, this would not be seen.
            env.raw.put(t, p, &path, "name: pdf\nlevels: {project: 2}\n").await.unwrap();
            assert_eq!(env.def("t1", "p1", "pdf").await.levels.project, Some(2), "{layer}/{class}: after the fix");
            assert!(env.defs.delete_document(t, p, &path).await.unwrap());
        }
    }
    assert!(env.fx.raw.holders(None).await.unwrap().is_empty());

    // The classpath layer fails closed the same way.
    let cp = Env::new(Docs::Memory, classpath(&[("pdf", "name: pdf\nlevels: {project: zero}\n")])).await;
    let reason = cp.unavailable("t1", "p1", "pdf").await;
    assert!(reason.contains("the classpath layer") && reason.contains("zero"), "{reason}");
    env.done().await;
}

async fn store_error_on_one_layer_fails_closed_and_acquires_nothing(backend: Docs) {
    let env = Env::new(backend, classpath(&[("pdf", "name: pdf\nlevels: {project: 1}\n")])).await;
    for (layer, scope) in [("system", SYSTEM), ("tenant", tenant_scope("t1")), ("project", ("t1", "p1"))] {
        env.docs.fail(scope, true);
        let reason = env.unavailable("t1", "p1", "pdf").await;
        assert!(reason.contains(&format!("the {layer} layer")), "{reason}");
        assert!(reason.contains("injected: connection reset"), "{reason}");
        let err = env.svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap_err();
        assert_eq!(err.code(), "LEASE_UNAVAILABLE", "{err}");
        assert_eq!(env.fx.store.total_calls(), 0, "no lease store call while a layer is unreadable");
        if layer != "system" {
            // Another tenant does not read the failing layer.
            assert_eq!(env.def("t2", "p1", "pdf").await.levels.project, Some(1));
        }
        env.docs.fail(scope, false);
        assert_eq!(env.def("t1", "p1", "pdf").await.levels.project, Some(1), "the error was cached");
        env.defs.invalidate_all();
    }
    env.done().await;
}

#[tokio::test]
async fn closed_port_document_store_fails_closed() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let uri = format!("mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=300&connectTimeoutMS=300");
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let defs = Arc::new(LayeredDefinitions::new(Arc::new(MongoDocumentStore::new(&client.database("unreachable")))));
    let leases = Arc::new(support::FaultyStore::new(Arc::new(MemoryStore::default())));
    let svc = ResourceLeaseService::new(leases.clone(), defs.clone(), types(), None);
    // Even a name the classpath defines (tex) is not served while the other layers cannot be read.
    let err = defs.definition("t1", "p1", "tex").await.unwrap_err();
    let LeaseError::Unavailable { reason } = &err else { panic!("expected LEASE_UNAVAILABLE, got {err:?}") };
    assert!(reason.contains("the system layer"), "{reason}");
    let err = svc.acquire(LeaseRequest::new("tex", LeaseRef::Name("tex".into()), "t1", "p1")).await.unwrap_err();
    assert_eq!(err.code(), "LEASE_UNAVAILABLE");
    assert_eq!(leases.total_calls(), 0);
    // The settings lookup fails closed as well.
    let err = defs.lease_setting("t1", "p1", TEX_LEASE_SETTING, "tex").await.unwrap_err();
    assert_eq!(err.code(), "LEASE_UNAVAILABLE");
}

async fn inline_definitions_read_no_layer_and_stay_project_private(backend: Docs) {
    // conformance.rs covers the forbidden fields and two projects of one tenant; here: inline means no layers
    // (a layered definition of the same name changes nothing), and tenants do not share an inline funnel.
    let env = Env::new(backend, classpath(&[("browser", "name: browser\nlevels: {global: 9, project: 5}\n")])).await;
    env.put(("t1", "p1"), "browser", "name: browser\nlevels: {project: 5}\nttlSeconds: 999\n").await;
    let gets = env.docs.gets();
    let inline = LeaseRef::Inline(
        lease_shared::DefinitionDocument::parse("name: browser\nlevels: {project: 1, user: 1}\nttlSeconds: 45\n")
            .unwrap(),
    );
    let req = |t: &str, u: &str| LeaseRequest::new("mcp", inline.clone(), t, "p1").user(u);
    let a = env.svc.acquire(req("t1", "u1")).await.unwrap();
    assert_eq!((a.resource(), a.ttl_seconds()), (Some("mcp-inline:t1/p1/browser"), Some(45)));
    assert_eq!(env.svc.acquire(req("t1", "u2")).await.unwrap_err().code(), "LEASE_BUSY", "inline cap, not layer's");
    let b = env.svc.acquire(req("t2", "u1")).await.expect("another tenant's project is another funnel");
    assert_eq!(b.resource(), Some("mcp-inline:t2/p1/browser"));
    assert_eq!(env.docs.gets(), gets, "an inline definition read a config layer");
    let counters: HashSet<String> = env.fx.counts().await.into_keys().collect();
    assert!(counters.iter().all(|c| c.starts_with("mcp-inline:")), "{counters:?}");
    assert!(!counters.iter().any(|c| c.contains("|global|") || c.contains("|tenant|")), "{counters:?}");
    a.release().await.unwrap();
    b.release().await.unwrap();
    env.done().await;
}

async fn config_write_is_seen_by_the_next_acquire_and_told_to_the_listener(backend: Docs) {
    let env = Env::new(backend, classpath(&[("pdf", "name: pdf\nlevels: {project: 1}\n")])).await;
    let a = env.svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap();
    assert_eq!(env.svc.acquire(request("pdf", "t1", "p1", "u2")).await.unwrap_err().code(), "LEASE_BUSY");
    env.put(("t1", "p1"), "pdf", "name: pdf\nlevels: {project: 2}\n").await;
    let b = env.svc.acquire(request("pdf", "t1", "p1", "u2")).await.expect("the raised cap applies at once");
    assert!(env.defs.delete_document("t1", "p1", &definition_path("pdf")).await.unwrap());
    assert_eq!(
        env.svc.acquire(request("pdf", "t1", "p1", "u3")).await.unwrap_err().code(),
        "LEASE_BUSY",
        "the deletion restores the classpath cap at once"
    );
    let change = DocumentChanged::new("t1", "p1", definition_path("pdf"));
    assert_eq!(env.listener.events(), vec![change.clone(), change]);
    a.release().await.unwrap();
    b.release().await.unwrap();
    env.done().await;
}

async fn writes_drop_exactly_the_entries_of_their_layer(backend: Docs) {
    let env = Env::new(
        backend,
        classpath(&[("pdf", "name: pdf\nttlSeconds: 60\n"), ("other", "name: other\nttlSeconds: 5\n")]),
    )
    .await;
    let scopes = [("t1", "p1"), ("t1", "p2"), ("t2", "p1")];
    for (t, p) in scopes {
        env.def(t, p, "pdf").await;
        env.def(t, p, "other").await;
    }
    // What a read of pdf for each scope returns, and how many layer reads it took (0: served from the cache).
    let read = async |expected: [(u64, usize); 3]| {
        for ((t, p), (ttl, gets)) in scopes.into_iter().zip(expected) {
            env.docs.take_gets();
            assert_eq!(env.def(t, p, "pdf").await.ttl_seconds, ttl, "{t}/{p}");
            assert_eq!(env.docs.take_gets(), gets, "{t}/{p}: layer reads");
        }
    };
    read([(60, 0), (60, 0), (60, 0)]).await;

    env.put(("t1", "p1"), "pdf", "name: pdf\nttlSeconds: 10\n").await;
    read([(10, 3), (60, 0), (60, 0)]).await;

    env.put(tenant_scope("t1"), "pdf", "name: pdf\nttlSeconds: 20\n").await;
    read([(10, 3), (20, 3), (60, 0)]).await;

    env.put(SYSTEM, "pdf", "name: pdf\nttlSeconds: 30\n").await;
    read([(10, 3), (20, 3), (30, 3)]).await;

    // Other names were never dropped.
    for (t, p) in scopes {
        assert_eq!(env.def(t, p, "other").await.ttl_seconds, 5);
    }
    assert_eq!(env.docs.take_gets(), 0, "a write to pdf dropped another definition");
    let path = definition_path("pdf");
    assert_eq!(
        env.listener.events(),
        vec![
            DocumentChanged::new("t1", "p1", &path),
            DocumentChanged::new("t1", "_tenant", &path),
            DocumentChanged::new("_vance", "_tenant", &path)
        ]
    );
    env.done().await;
}

async fn another_pods_write_takes_effect_through_invalidate(backend: Docs) {
    let cp = || classpath(&[("pdf", "name: pdf\nttlSeconds: 60\n")]);
    let env = Env::new(backend, cp()).await;
    let pod_b = env.second_pod(cp()).await;
    let ttl =
        async |pod: &LayeredDefinitions, t: &str| pod.definition(t, "p1", "pdf").await.unwrap().unwrap().ttl_seconds;
    let pod_b = &*pod_b;
    assert_eq!((ttl(pod_b, "t1").await, ttl(pod_b, "t2").await), (60, 60));

    env.put(SYSTEM, "pdf", "name: pdf\nttlSeconds: 15\n").await;
    assert_eq!(ttl(&*env.defs, "t1").await, 15, "the writing pod sees its write");
    // Pod B has not been told yet: it still serves its cached entries.
    assert_eq!((ttl(pod_b, "t1").await, ttl(pod_b, "t2").await), (60, 60));
    // What the brain does when the writer's listener reaches pod B: a System write drops the name for everyone.
    let events = env.listener.events();
    assert_eq!(events.len(), 1);
    pod_b.invalidate(&events[0]);
    assert_eq!((ttl(pod_b, "t1").await, ttl(pod_b, "t2").await), (15, 15));
    env.done().await;
}

async fn load_racing_a_write_does_not_cache_what_it_read_before(backend: Docs) {
    let env = Env::new(backend, classpath(&[("pdf", "name: pdf\nttlSeconds: 60\n")])).await;
    env.put(("t1", "p1"), "pdf", "name: pdf\nttlSeconds: 10\n").await;
    // A load reads the Project layer (ttl 10), then stalls before it can cache; meanwhile a write lands.
    let (reached, release) = env.docs.gate(("t1", "p1"));
    let defs = env.defs.clone();
    let load = tokio::spawn(async move { defs.definition("t1", "p1", "pdf").await });
    reached.await.expect("the load reached the project layer");
    env.put(("t1", "p1"), "pdf", "name: pdf\nttlSeconds: 20\n").await;
    release.send(()).unwrap();
    let raced = load.await.unwrap().unwrap().unwrap();
    assert_eq!(raced.ttl_seconds, 10, "the racing load answers with what it read before the write");
    assert_eq!(env.def("t1", "p1", "pdf").await.ttl_seconds, 20, "the racing load cached a stale definition");
    env.done().await;
}

async fn definition_uncached_reads_past_the_cache(backend: Docs) {
    let env = Env::new(backend, classpath(&[("pdf", "name: pdf\nttlSeconds: 60\n")])).await;
    assert_eq!(env.def("t1", "p1", "pdf").await.ttl_seconds, 60);
    // Written behind the change-event chain (another tool writing the collection).
    env.raw.put("t1", "_tenant", &definition_path("pdf"), "name: pdf\nttlSeconds: 25\n").await.unwrap();
    assert_eq!(env.def("t1", "p1", "pdf").await.ttl_seconds, 60, "served from the cache");
    let fresh = env.defs.definition_uncached("t1", "p1", "pdf").await.unwrap().unwrap();
    assert_eq!(fresh.ttl_seconds, 25);
    assert_eq!(env.defs.definition_uncached("t1", "p1", "nothing").await.unwrap(), None);
    assert_eq!(env.defs.definition_uncached("t1", "p1", "../x").await.unwrap_err().code(), "INVALID_REQUEST");
    env.done().await;
}

async fn bundled_tex_definition_is_the_classpath_layer(backend: Docs) {
    let env = Env::new(backend, Classpath::bundled()).await;
    let tex = env.def("t1", "p1", "tex").await;
    assert_eq!(tex.resource, "tex2pdf");
    assert_eq!((tex.levels.global, tex.levels.tenant, tex.levels.project), (Some(6), Some(3), Some(1)));
    assert_eq!((tex.ttl_seconds, tex.wait_ms), (120, 10_000));
    // A tenant sets its own share but cannot raise the global ceiling; a project cannot move the counter.
    env.put(tenant_scope("t1"), "tex", "name: tex\nlevels: {global: 100, tenant: 2}\n").await;
    env.put(("t1", "p1"), "tex", "name: tex\nresource: mine\nlevels: {project: 2}\n").await;
    let tex = env.def("t1", "p1", "tex").await;
    assert_eq!(tex.resource, "tex2pdf");
    assert_eq!((tex.levels.global, tex.levels.tenant, tex.levels.project), (Some(6), Some(2), Some(2)));
    // No layer defines it: no definition, and the service refuses the name.
    assert_eq!(env.defs.definition("t1", "p1", "texx").await.unwrap(), None);
    let err = env.svc.acquire(request("texx", "t1", "p1", "u1")).await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::InvalidRequest { message, .. } if message.contains("no lease definition named")),
        "{err:?}"
    );
    env.done().await;
}

async fn holder_in_a_layer_scope_reads_that_document_once(backend: Docs) {
    // A holder in tenant `_vance` (or in project `_tenant`) shares a scope with a more general layer: that
    // document is read once, as the more general layer, and keeps that layer's rights.
    let env = Env::new(backend, classpath(&[("pdf", "name: pdf\nlevels: {project: 1}\n")])).await;
    env.put(SYSTEM, "pdf", "name: pdf\nlevels: {global: 4}\n").await;
    env.put(tenant_scope("t1"), "pdf", "name: pdf\nlevels: {tenant: 2, project: 3}\n").await;
    let cases = [(("_vance", "p1"), (Some(4), None, Some(1)), 2), (("t1", "_tenant"), (Some(4), Some(2), Some(3)), 2)];
    for ((t, p), caps, reads) in cases {
        env.docs.take_gets();
        let d = env.def(t, p, "pdf").await;
        assert_eq!((d.levels.global, d.levels.tenant, d.levels.project), caps, "{t}/{p}");
        assert_eq!(env.docs.take_gets(), reads, "{t}/{p}: layer reads");
    }
    env.done().await;
}

// ---------------------------------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------------------------------

async fn put_settings(env: &Env, (t, p): (&str, &str), yaml: &str) {
    env.defs.put_document(t, p, SETTINGS_PATH, yaml).await.expect("put settings");
}

async fn tex_lease(env: &Env, tenant: &str, project: &str) -> LeaseRef {
    env.defs.lease_setting(tenant, project, TEX_LEASE_SETTING, "tex").await.expect("tex.lease")
}

async fn settings_none_takes_no_lease_and_touches_no_lease_store(backend: Docs) {
    let env = Env::new(backend, Classpath::bundled()).await;
    put_settings(&env, tenant_scope("t1"), "tex.lease: none\n").await;
    put_settings(&env, ("t3", "p1"), "tex.lease: ''\n").await;
    put_settings(&env, ("t4", "p1"), "# switched off\ntex.lease:\n").await;
    for t in ["t1", "t3", "t4"] {
        let lease = tex_lease(&env, t, "p1").await;
        assert_eq!(lease, LeaseRef::None, "{t}");
        let held = env.svc.acquire(LeaseRequest::new("tex", lease, t, "p1").user("u1")).await.unwrap();
        assert!(held.is_noop());
        held.check().await.unwrap();
        held.release().await.unwrap();
    }
    assert_eq!(env.fx.store.total_calls(), 0, "tex.lease: none touched the lease store");

    // Without a setting, tex takes its default lease: the bundled definition, with store traffic.
    let lease = tex_lease(&env, "t2", "p1").await;
    assert_eq!(lease, LeaseRef::Name("tex".into()));
    let held = env.svc.acquire(LeaseRequest::new("tex", lease, "t2", "p1").user("u1")).await.unwrap();
    assert_eq!(held.resource(), Some("tex2pdf"));
    assert!(env.fx.store.total_calls() > 0);
    held.release().await.unwrap();
    env.done().await;
}

async fn settings_project_beats_tenant_beats_system_beats_default(backend: Docs) {
    let env = Env::new(backend, Classpath::bundled()).await;
    let name = |n: &str| LeaseRef::Name(n.to_owned());
    assert_eq!(tex_lease(&env, "t1", "p1").await, name("tex"), "built-in default");

    put_settings(&env, SYSTEM, "tex.lease: tex-sys\nother.setting: 3\n").await;
    assert_eq!(tex_lease(&env, "t1", "p1").await, name("tex-sys"));
    assert_eq!(tex_lease(&env, "t2", "p1").await, name("tex-sys"));

    put_settings(&env, tenant_scope("t1"), "tex.lease: none\n").await;
    assert_eq!(tex_lease(&env, "t1", "p1").await, LeaseRef::None);
    assert_eq!(tex_lease(&env, "t1", "p2").await, LeaseRef::None);
    assert_eq!(tex_lease(&env, "t2", "p1").await, name("tex-sys"));

    put_settings(&env, ("t1", "p1"), "tex.lease: tex-proj\n").await;
    assert_eq!(tex_lease(&env, "t1", "p1").await, name("tex-proj"));
    assert_eq!(tex_lease(&env, "t1", "p2").await, LeaseRef::None);
    assert_eq!(tex_lease(&env, "t2", "p1").await, name("tex-sys"));

    let s = env.defs.setting("t1", "p1", TEX_LEASE_SETTING).await.unwrap().unwrap();
    assert_eq!(s.layer, Layer::Project);
    let s = env.defs.setting("t1", "p1", "other.setting").await.unwrap().unwrap();
    assert_eq!((s.layer, s.value.as_u64()), (Layer::System, Some(3)), "keys merge one by one");
    assert_eq!(env.defs.setting("t1", "p1", "missing").await.unwrap(), None);

    // Deleting the Project override falls back to the Tenant's at once.
    assert!(env.defs.delete_document("t1", "p1", SETTINGS_PATH).await.unwrap());
    assert_eq!(tex_lease(&env, "t1", "p1").await, LeaseRef::None);
    env.done().await;
}

async fn settings_fail_closed(backend: Docs) {
    let env = Env::new(backend, Classpath::bundled()).await;
    put_settings(&env, ("t1", "p1"), "tex.lease: 'none\n").await;
    let err = env.defs.lease_setting("t1", "p1", TEX_LEASE_SETTING, "tex").await.unwrap_err();
    let LeaseError::Unavailable { reason } = &err else { panic!("broken settings: {err:?}") };
    assert!(reason.contains("the project layer"), "{reason}");
    put_settings(&env, ("t1", "p1"), "- tex.lease\n").await;
    assert_eq!(tex_lease_err(&env).await.code(), "LEASE_UNAVAILABLE", "a list is not a settings map");

    // Fixed behind the cache's back: the failure was not cached.
    env.raw.put("t1", "p1", SETTINGS_PATH, "tex.lease: none\n").await.unwrap();
    assert_eq!(tex_lease(&env, "t1", "p1").await, LeaseRef::None);

    // A value that is not a lease name is a bad reference: INVALID_REQUEST, naming key and layer.
    put_settings(&env, tenant_scope("t1"), "tex.lease: 'tex pdf'\n").await;
    match env.defs.lease_setting("t1", "p2", TEX_LEASE_SETTING, "tex").await {
        Err(LeaseError::InvalidRequest { field, message }) => {
            assert_eq!(field, TEX_LEASE_SETTING);
            assert!(message.contains("tenant layer"), "{message}");
        }
        other => panic!("expected INVALID_REQUEST, got {other:?}"),
    }

    // A store error on a settings layer: LEASE_UNAVAILABLE naming it, not the default lease.
    env.docs.fail(SYSTEM, true);
    env.defs.invalidate_all();
    let err = env.defs.lease_setting("t2", "p1", TEX_LEASE_SETTING, "tex").await.unwrap_err();
    let LeaseError::Unavailable { reason } = &err else { panic!("store error: {err:?}") };
    assert!(reason.contains("the system layer"), "{reason}");
    env.docs.fail(SYSTEM, false);
    assert_eq!(tex_lease(&env, "t2", "p1").await, LeaseRef::Name("tex".into()));
    env.done().await;
}

async fn tex_lease_err(env: &Env) -> LeaseError {
    env.defs.lease_setting("t1", "p1", TEX_LEASE_SETTING, "tex").await.unwrap_err()
}

// ---------------------------------------------------------------------------------------------------------------
// Store-specific
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn cached_entry_is_reloaded_after_max_age() {
    let docs = Arc::new(MemoryDocumentStore::new());
    let defs = LayeredDefinitions::new(docs.clone())
        .with_classpath(classpath(&[("pdf", "name: pdf\nttlSeconds: 60\n")]))
        .with_max_age(Some(Duration::from_secs(60)));
    let ttl = async || defs.definition("t1", "p1", "pdf").await.unwrap().unwrap().ttl_seconds;
    assert_eq!(ttl().await, 60);
    docs.put("t1", "p1", &definition_path("pdf"), "name: pdf\nttlSeconds: 9\n").await.unwrap();
    tokio::time::advance(Duration::from_secs(59)).await;
    assert_eq!(ttl().await, 60, "younger than max age: cached");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(ttl().await, 9, "older than max age: reloaded");
}

#[tokio::test]
async fn mongo_documents_collection_schema() {
    let db = support::mongo_database("documents_schema").await;
    let store = MongoDocumentStore::new(&db);
    store.ensure_indexes().await.unwrap();
    store.ensure_indexes().await.expect("idempotent");
    let coll = db.collection::<Document>("documents");

    use futures_util::TryStreamExt;
    let indexes: Vec<mongodb::IndexModel> = coll.list_indexes().await.unwrap().try_collect().await.unwrap();
    let unique = indexes.iter().any(|i| {
        i.keys == doc! { "tenantId": 1, "projectId": 1, "path": 1 }
            && i.options.as_ref().is_some_and(|o| o.unique == Some(true))
    });
    assert!(unique, "a unique (tenantId, projectId, path) index: {indexes:?}");

    let path = definition_path("tex");
    store.put("t1", "p1", &path, "name: tex\n").await.unwrap();
    let first = coll.find_one(doc! { "tenantId": "t1" }).await.unwrap().unwrap();
    assert_eq!(first.get_str("projectId").unwrap(), "p1");
    assert_eq!(first.get_str("path").unwrap(), path);
    assert_eq!(first.get_str("content").unwrap(), "name: tex\n");
    let stamped = first.get_datetime("updatedAt").expect("updatedAt is a server date").timestamp_millis();

    store.put("t1", "p1", &path, "name: tex\nttlSeconds: 5\n").await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1, "a put replaces, it does not add");
    let second = coll.find_one(doc! { "tenantId": "t1" }).await.unwrap().unwrap();
    assert!(second.get_datetime("updatedAt").unwrap().timestamp_millis() >= stamped);
    assert_eq!(store.get("t1", "p1", &path).await.unwrap().as_deref(), Some("name: tex\nttlSeconds: 5\n"));
    assert_eq!(store.get("t1", "p2", &path).await.unwrap(), None);

    let dup = coll.insert_one(doc! { "tenantId": "t1", "projectId": "p1", "path": &path, "content": "x" }).await;
    assert!(dup.is_err(), "the unique index rejects a second document at the same address");

    // A document whose content is not text is an unreadable layer, not a missing one.
    coll.insert_one(doc! { "tenantId": "t1", "projectId": "_tenant", "path": &path, "content": 42 }).await.unwrap();
    assert!(store.get("t1", "_tenant", &path).await.is_err());
    let defs = LayeredDefinitions::new(Arc::new(store.clone()));
    let err = defs.definition("t1", "p1", "tex").await.unwrap_err();
    assert!(matches!(&err, LeaseError::Unavailable { reason } if reason.contains("the tenant layer")), "{err:?}");

    assert!(store.delete("t1", "p1", &path).await.unwrap());
    assert!(!store.delete("t1", "p1", &path).await.unwrap());
    let _ = db.drop().await;
}
