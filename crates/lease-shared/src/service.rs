//! `ResourceLeaseService`: the funnel of spec §4, written once above the store primitives, and the `Lease`
//! handle of spec §3.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rand::Rng;

use crate::definition::{Caps, DefinitionDocument, LeaseDefinition, validate_name};
use crate::error::{BusyDetails, LeaseError, StoreError};
use crate::metrics;
use crate::reap::{LeaseRevocationListener, Reaper};
use crate::store::{CounterKey, DeleteCondition, HolderRecord, LeaseStore, NewHolder, Payload};

/// How a consumer names its lease (spec §2, "Consumer referencing").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseRef {
    /// No lease: the NOOP lease, no store traffic.
    None,
    /// A name reference, resolved through the config layers: the same name is one shared funnel.
    Name(String),
    /// An inline definition (MCP tool configs): no layers, only project-owned fields, a project-private counter.
    Inline(DefinitionDocument),
}

/// What an acquisition asks for.
#[derive(Debug, Clone)]
pub struct LeaseRequest {
    /// The handler type, set by consumer code (`tex`, `mcp`, `webhook`); must be registered.
    pub lease_type: String,
    /// Which definition to funnel through.
    pub lease: LeaseRef,
    /// The holder's tenant.
    pub tenant_id: String,
    /// The holder's project.
    pub project_id: String,
    /// The holder's user; required when the definition caps the user level.
    pub user_id: Option<String>,
    /// Consumer-specific reference (a process id, a session id).
    pub holder_ref: String,
    /// The acquiring pod.
    pub pod: String,
    /// Whether the resource dies with the pod (decides the dispatch of a reap).
    pub pod_bound: bool,
    /// The initial payload.
    pub payload: Payload,
}

impl LeaseRequest {
    /// A request of `lease_type` for `lease` in `tenant_id` / `project_id`; everything else empty.
    pub fn new(
        lease_type: impl Into<String>,
        lease: LeaseRef,
        tenant_id: impl Into<String>,
        project_id: impl Into<String>,
    ) -> Self {
        LeaseRequest {
            lease_type: lease_type.into(),
            lease,
            tenant_id: tenant_id.into(),
            project_id: project_id.into(),
            user_id: None,
            holder_ref: String::new(),
            pod: String::new(),
            pod_bound: false,
            payload: Payload::new(),
        }
    }

    /// Sets the user.
    pub fn user(mut self, user_id: impl Into<String>) -> Self {
        self.user_id = Some(user_id.into());
        self
    }

    /// Sets the holder reference.
    pub fn holder_ref(mut self, holder_ref: impl Into<String>) -> Self {
        self.holder_ref = holder_ref.into();
        self
    }

    /// Sets the acquiring pod and whether the resource dies with it.
    pub fn pod(mut self, pod: impl Into<String>, pod_bound: bool) -> Self {
        self.pod = pod.into();
        self.pod_bound = pod_bound;
        self
    }

    /// Sets the initial payload.
    pub fn payload(mut self, payload: Payload) -> Self {
        self.payload = payload;
        self
    }
}

/// Resolves a name reference to the merged definition a holder in `(tenant, project)` sees.
#[async_trait]
pub trait DefinitionSource: Send + Sync + fmt::Debug + 'static {
    /// The definition named `name`, `Ok(None)` if no layer defines it, `LEASE_UNAVAILABLE` if a layer cannot
    /// be read or parsed (fail-closed).
    async fn definition(&self, tenant: &str, project: &str, name: &str) -> Result<Option<LeaseDefinition>, LeaseError>;
}

/// A fixed set of definitions, the same for every tenant.
#[derive(Debug, Clone, Default)]
pub struct StaticDefinitions(Vec<LeaseDefinition>);

impl StaticDefinitions {
    /// These definitions.
    pub fn new(definitions: impl IntoIterator<Item = LeaseDefinition>) -> Self {
        StaticDefinitions(definitions.into_iter().collect())
    }
}

#[async_trait]
impl DefinitionSource for StaticDefinitions {
    async fn definition(&self, _: &str, _: &str, name: &str) -> Result<Option<LeaseDefinition>, LeaseError> {
        Ok(self.0.iter().find(|d| d.name == name).cloned())
    }
}

/// Which lease types have a handler: an acquisition of any other type is refused, because a reaper must be able
/// to dispatch its revocation later.
pub trait LeaseTypes: Send + Sync + fmt::Debug + 'static {
    /// Whether `lease_type` has a registered handler.
    fn is_registered(&self, lease_type: &str) -> bool;
}

impl LeaseTypes for HashSet<String> {
    fn is_registered(&self, lease_type: &str) -> bool {
        self.contains(lease_type)
    }
}

/// Ids are parts of counter keys (`<resource>|<level>|<tenant>/<project>`), so they may not contain the
/// separators.
fn validate_id(field: &str, id: &str) -> Result<(), LeaseError> {
    if id.is_empty() || id.len() > 128 || id.contains(['|', '/']) || id.chars().any(char::is_control) {
        return Err(LeaseError::invalid(
            field,
            format!("{id:?} must be 1 to 128 characters without '|', '/' or control characters"),
        ));
    }
    Ok(())
}

/// The longest pause between two polls of a full level while an acquisition waits.
const MAX_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How often a waiting acquisition sweeps the resource for idle holders again.
const SWEEP_WHILE_WAITING_EVERY: Duration = Duration::from_secs(1);

/// The prefix of the project-private resource of an inline definition.
pub const INLINE_RESOURCE_PREFIX: &str = "mcp-inline:";

/// Turns an inline definition into the definition it funnels through: only project-owned fields, and a counter
/// on the project-private resource `mcp-inline:<tenant>/<project>/<name>`.
pub fn inline_definition(tenant: &str, project: &str, doc: &DefinitionDocument) -> Result<LeaseDefinition, LeaseError> {
    let forbidden = [
        ("resource", doc.resource.is_some()),
        ("levels.global", doc.levels.global.is_some()),
        ("levels.tenant", doc.levels.tenant.is_some()),
    ];
    if let Some((field, _)) = forbidden.iter().find(|(_, set)| *set) {
        return Err(LeaseError::invalid(
            *field,
            "an inline definition may only set levels.project, levels.user, ttlSeconds and waitMs; shared ceilings \
             belong in a name reference",
        ));
    }
    let name = doc.name.as_deref().ok_or_else(|| LeaseError::invalid("name", "an inline definition needs a name"))?;
    // A document built in code has not been through `DefinitionDocument::parse`.
    validate_name("name", name).map_err(|e| LeaseError::invalid(e.field, e.problem))?;
    let mut def = LeaseDefinition::from_document(doc.clone());
    def.resource = format!("{INLINE_RESOURCE_PREFIX}{tenant}/{project}/{name}");
    Ok(def)
}

/// The lease service: acquire, check, update the payload, release. Cheap to clone; every clone shares the store.
#[derive(Clone, Debug)]
pub struct ResourceLeaseService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn LeaseStore>,
    definitions: Arc<dyn DefinitionSource>,
    types: Arc<dyn LeaseTypes>,
    reaper: Reaper,
}

/// Why one pass through the funnel did not end with a lease.
enum Refused {
    Full(CounterKey, u32),
    Store(StoreError),
    /// The pending holder was deleted under us (revoked or reaped): its deleter owns the decrements.
    Lost(String),
}

impl ResourceLeaseService {
    /// A service over `store`, resolving names through `definitions`, accepting the types of `types`.
    pub fn new(
        store: Arc<dyn LeaseStore>,
        definitions: Arc<dyn DefinitionSource>,
        types: Arc<dyn LeaseTypes>,
        listener: Option<Arc<dyn LeaseRevocationListener>>,
    ) -> Self {
        let reaper = Reaper::new(store.clone(), listener);
        ResourceLeaseService { inner: Arc::new(Inner { store, definitions, types, reaper }) }
    }

    /// The store under this service (for operator views and tests).
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.inner.store
    }

    /// The reaper of this service: idle reap, revocation.
    pub fn reaper(&self) -> &Reaper {
        &self.inner.reaper
    }

    /// The definition `lease` resolves to for this request, or `None` for no lease.
    pub async fn resolve(&self, req: &LeaseRequest) -> Result<Option<LeaseDefinition>, LeaseError> {
        match &req.lease {
            LeaseRef::None => Ok(None),
            LeaseRef::Name(name) => {
                validate_name("lease", name).map_err(|e| LeaseError::invalid(e.field, e.problem))?;
                match self.inner.definitions.definition(&req.tenant_id, &req.project_id, name).await? {
                    Some(def) => Ok(Some(def)),
                    None => Err(LeaseError::invalid("lease", format!("no lease definition named {name:?}"))),
                }
            }
            LeaseRef::Inline(doc) => inline_definition(&req.tenant_id, &req.project_id, doc).map(Some),
        }
    }

    /// Acquires a slot at every capped level, waiting up to the definition's `waitMs` (polling with jitter).
    ///
    /// Errors: `INVALID_REQUEST` (unknown type, bad ids or names), `LEASE_BUSY` with its diagnosis,
    /// `LEASE_UNAVAILABLE` when the store or a config layer fails — never an unprotected lease.
    pub async fn acquire(&self, req: LeaseRequest) -> Result<Lease, LeaseError> {
        let started = Instant::now();
        if !self.inner.types.is_registered(&req.lease_type) {
            return Err(LeaseError::invalid("type", format!("no handler is registered for type {:?}", req.lease_type)));
        }
        validate_id("tenantId", &req.tenant_id)?;
        validate_id("projectId", &req.project_id)?;
        if let Some(user) = &req.user_id {
            validate_id("userId", user)?;
        }
        let def = match self.resolve(&req).await {
            Ok(Some(def)) if !def.is_noop() => def,
            Ok(def) => {
                // The NOOP's resource label: the definition's resource, or `none` without a definition.
                let name = def.as_ref().map_or("none", |d| d.resource.as_str());
                metrics::acquired(name, "noop", started.elapsed().as_secs_f64());
                return Ok(Lease::noop());
            }
            Err(e) => {
                if matches!(e, LeaseError::Unavailable { .. }) {
                    metrics::acquired("unresolved", "unavailable", started.elapsed().as_secs_f64());
                }
                return Err(e);
            }
        };
        if def.levels.user.is_some() && req.user_id.is_none() {
            return Err(LeaseError::invalid("userId", format!("lease {:?} caps the user level", def.name)));
        }
        let result = self.acquire_definition(&req, &def, started).await;
        let outcome = match &result {
            Ok(_) => "success",
            Err(LeaseError::Busy(_)) => "busy",
            Err(_) => "unavailable",
        };
        metrics::acquired(&def.resource, outcome, started.elapsed().as_secs_f64());
        result
    }

    async fn acquire_definition(
        &self,
        req: &LeaseRequest,
        def: &LeaseDefinition,
        started: Instant,
    ) -> Result<Lease, LeaseError> {
        let deadline = started + Duration::from_millis(def.wait_ms);
        let mut backoff = Duration::from_millis(10);
        loop {
            let (key, cap) = match self.attempt(req, def).await {
                Ok(token) => return Ok(Lease::held(self.clone(), token, def)),
                Err(Refused::Store(e)) => return Err(e.into()),
                Err(Refused::Lost(token)) => return Err(LeaseError::Lost { token }),
                Err(Refused::Full(key, cap)) => (key, cap),
            };
            // The lazy sweep: a full level may be full of idle holders. Only this resource, only idle.
            if self.inner.reaper.reap_idle(Some(&def.resource)).await? > 0 {
                continue;
            }
            // Wait for room by polling the full counter with a cheap read (one round trip instead of a refused
            // pass through the funnel), with full jitter so that waiting pods do not race it in lockstep; sweep
            // again now and then, since holders go idle while we wait.
            let mut last_sweep = Instant::now();
            loop {
                let now = Instant::now();
                if now >= deadline {
                    let occupancy = self.inner.store.occupancy(&key).await?;
                    return Err(LeaseError::Busy(Box::new(BusyDetails {
                        resource: key.resource,
                        level: key.level,
                        scope: key.scope,
                        count: occupancy.count,
                        cap,
                        retry_after_ms: occupancy.retry_after_ms,
                    })));
                }
                let sleep = rand::rng().random_range(backoff / 2..=backoff).min(deadline - now);
                tokio::time::sleep(sleep).await;
                backoff = (backoff * 2).min(MAX_POLL_INTERVAL);
                match self.inner.store.counter_count(&key).await? {
                    Some(count) if count >= i64::from(cap) => {
                        if last_sweep.elapsed() >= SWEEP_WHILE_WAITING_EVERY {
                            last_sweep = Instant::now();
                            if self.inner.reaper.reap_idle(Some(&def.resource)).await? > 0 {
                                break;
                            }
                        }
                    }
                    _ => break,
                }
            }
        }
    }

    /// One pass through the funnel: holder first (PENDING), then per capped level narrow → wide the conditional
    /// increment (creating a missing counter with a pure-`_id` upsert and trying once more) and the push of the
    /// counter key — overlapping the next level's increment — the last push also setting HELD. A refusal rolls
    /// back.
    async fn attempt(&self, req: &LeaseRequest, def: &LeaseDefinition) -> Result<String, Refused> {
        let store = &self.inner.store;
        let token = new_token();
        let holder = NewHolder {
            token: token.clone(),
            lease_type: req.lease_type.clone(),
            lease: def.name.clone(),
            resource: def.resource.clone(),
            tenant_id: req.tenant_id.clone(),
            project_id: req.project_id.clone(),
            user_id: req.user_id.clone(),
            holder_ref: req.holder_ref.clone(),
            pod: req.pod.clone(),
            pod_bound: req.pod_bound,
            payload: req.payload.clone(),
            ttl_seconds: def.ttl_seconds,
        };
        if let Err(e) = store.insert_holder(&holder).await {
            // The insert may have happened anyway; a PENDING holder without levels costs no slot.
            self.roll_back(&token, &[]).await;
            return Err(Refused::Store(e));
        }
        let levels: Vec<(CounterKey, u32)> = def
            .levels
            .narrow_to_wide()
            .filter_map(|(level, cap)| {
                CounterKey::for_level(&def.resource, level, &req.tenant_id, &req.project_id, req.user_id.as_deref())
                    .map(|k| (k, cap))
            })
            .collect();
        // Increments run one after the other, narrow → wide, each only once the one before succeeded; the push of
        // a level's key runs beside the increment of the next level (both depend only on the previous increment),
        // so k levels cost 2k + 1 round trips but only k + 2 round-trip latencies. The last push, alone, sets HELD.
        let mut taken: Vec<String> = Vec::with_capacity(levels.len());
        let mut unpushed: Option<String> = None;
        for (key, cap) in &levels {
            let (pushed, incremented) = match &unpushed {
                Some(id) => {
                    let (p, i) = tokio::join!(store.push_level(&token, id, false), self.increment(key, *cap));
                    (Some(p), i)
                }
                None => (None, self.increment(key, *cap).await),
            };
            match pushed {
                None | Some(Ok(true)) => {}
                // Deleted under us: its deleter decremented the registered levels; the unpushed one is left to
                // reconcile, as in a funnel without overlap. The increment that ran beside the push is ours alone
                // (nobody can have registered it), so it is returned here and adds no drift.
                Some(Ok(false)) => {
                    if matches!(incremented, Ok(true)) {
                        self.decrement_unregistered(&token, &key.id()).await;
                    }
                    return Err(Refused::Lost(token));
                }
                Some(Err(e)) => {
                    if matches!(incremented, Ok(true)) {
                        taken.push(key.id());
                    }
                    self.roll_back(&token, &taken).await;
                    return Err(Refused::Store(e));
                }
            }
            match incremented {
                Ok(true) => {}
                Ok(false) => {
                    self.roll_back(&token, &taken).await;
                    return Err(Refused::Full(key.clone(), *cap));
                }
                Err(e) => {
                    // Whether the failed increment applied is unknown: it is left to reconcile (an over-count
                    // blocks, an under-count would overbook).
                    self.roll_back(&token, &taken).await;
                    return Err(Refused::Store(e));
                }
            }
            let id = key.id();
            taken.push(id.clone());
            unpushed = Some(id);
        }
        if let Some(id) = unpushed {
            match store.push_level(&token, &id, true).await {
                Ok(true) => {}
                // Deleted under us: its deleter decremented the registered levels; this one is left to reconcile.
                Ok(false) => return Err(Refused::Lost(token)),
                Err(e) => {
                    self.roll_back(&token, &taken).await;
                    return Err(Refused::Store(e));
                }
            }
        }
        Ok(token)
    }

    /// The conditional increment of one level: `Ok(false)` when the level is full. A counter that does not exist
    /// yet is created by a pure-`_id` upsert and tried once more: an upsert inside the conditional update would
    /// make the loser of a first-use race report busy.
    async fn increment(&self, key: &CounterKey, cap: u32) -> Result<bool, StoreError> {
        let store = &self.inner.store;
        if store.try_increment(key, cap).await? {
            return Ok(true);
        }
        store.ensure_counter(key).await?;
        store.try_increment(key, cap).await
    }

    /// Returns an increment that no holder registered (its holder was deleted before the push).
    async fn decrement_unregistered(&self, token: &str, id: &str) {
        if let Err(e) = self.inner.store.decrement(&[id.to_owned()]).await {
            tracing::warn!(token, counter = id, error = %e, "could not return an unregistered increment; reconcile will");
        }
    }

    /// Deletes the holder and, only if this call deleted it, decrements the levels this attempt took.
    async fn roll_back(&self, token: &str, taken: &[String]) {
        let store = &self.inner.store;
        match store.delete_holder(token, DeleteCondition::Any).await {
            Ok(Some(_)) => {
                if let Err(e) = store.decrement(taken).await {
                    tracing::warn!(token, error = %e, "rollback could not decrement; reconcile will repair the counters");
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(token, error = %e, "rollback could not delete the holder; the idle reap will");
            }
        }
    }

    /// Check-at-use and touch: `LEASE_LOST` if the holder is gone.
    pub async fn check(&self, token: &str, resource: &str) -> Result<(), LeaseError> {
        if self.inner.store.touch(token, None).await? {
            metrics::checked(resource, "ok");
            Ok(())
        } else {
            metrics::checked(resource, "lost");
            Err(LeaseError::Lost { token: token.to_owned() })
        }
    }

    /// Replaces the payload of a held lease; `LEASE_LOST` if the holder is gone.
    pub async fn update_payload(&self, token: &str, payload: &Payload) -> Result<(), LeaseError> {
        if self.inner.store.set_payload(token, None, payload).await? {
            Ok(())
        } else {
            Err(LeaseError::Lost { token: token.to_owned() })
        }
    }

    /// Releases a lease: deletes the holder and, only if this call deleted it, decrements its registered levels.
    /// Idempotent. Never calls a handler: the holder cleans up its own resource.
    pub async fn release(&self, token: &str, resource: &str) -> Result<ReleaseOutcome, LeaseError> {
        let result = self.release_inner(token).await;
        let outcome = match &result {
            Ok(ReleaseOutcome::Released) => "ok",
            Ok(ReleaseOutcome::AlreadyReleased) => "already-released",
            Err(_) => "error",
        };
        metrics::released(resource, outcome);
        result
    }

    /// The holder of `token` if it belongs to `tenant`: `LEASE_LOST` if there is none, `NOT_FOUND` semantics
    /// (`Ok(None)`) if it belongs to another tenant — a tenant cannot learn about, or act on, another's lease.
    async fn holder_in_tenant(&self, token: &str, tenant: &str) -> Result<Option<HolderRecord>, LeaseError> {
        match self.inner.store.holder(token).await? {
            None => Err(LeaseError::Lost { token: token.to_owned() }),
            Some(h) if h.tenant_id == tenant => Ok(Some(h)),
            Some(_) => Ok(None),
        }
    }

    /// [`Self::check`] for a remote consumer bound to `tenant`: `Ok(false)` (nothing touched) if the lease
    /// belongs to another tenant.
    pub async fn check_for_tenant(&self, token: &str, tenant: &str) -> Result<bool, LeaseError> {
        // One round trip when the lease is there; only a miss reads on, to tell a lost lease from another tenant's.
        if let Some(resource) = self.inner.store.touch_in_tenant(token, tenant).await? {
            metrics::checked(&resource, "ok");
            return Ok(true);
        }
        self.holder_in_tenant(token, tenant).await.map(|_| false)
    }

    /// [`Self::update_payload`] bound to `tenant` (the tenant is part of the write's filter: one round trip):
    /// `Ok(false)` (nothing written) for another tenant's lease.
    pub async fn update_payload_for_tenant(
        &self,
        token: &str,
        tenant: &str,
        payload: &Payload,
    ) -> Result<bool, LeaseError> {
        if self.inner.store.set_payload(token, Some(tenant), payload).await? {
            return Ok(true);
        }
        // Nothing matched: lost, or another tenant's.
        self.holder_in_tenant(token, tenant).await.map(|_| false)
    }

    /// [`Self::release`] bound to `tenant` (the tenant is part of the delete filter): `Ok(None)` (nothing
    /// changed) if the lease belongs to another tenant.
    pub async fn release_for_tenant(&self, token: &str, tenant: &str) -> Result<Option<ReleaseOutcome>, LeaseError> {
        let store = &self.inner.store;
        if let Some(holder) = store.delete_holder(token, DeleteCondition::Tenant(tenant)).await? {
            store.decrement(&holder.levels).await?;
            metrics::released(&holder.resource, "ok");
            return Ok(Some(ReleaseOutcome::Released));
        }
        match store.holder(token).await? {
            Some(_) => Ok(None),
            None => Ok(Some(ReleaseOutcome::AlreadyReleased)),
        }
    }

    async fn release_inner(&self, token: &str) -> Result<ReleaseOutcome, LeaseError> {
        let store = &self.inner.store;
        match store.delete_holder(token, DeleteCondition::Any).await? {
            Some(holder) => {
                store.decrement(&holder.levels).await?;
                Ok(ReleaseOutcome::Released)
            }
            None => Ok(ReleaseOutcome::AlreadyReleased),
        }
    }
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// This call deleted the holder and returned its slots.
    Released,
    /// The holder was already gone (released, reaped or revoked); nothing was decremented.
    AlreadyReleased,
}

impl ReleaseOutcome {
    /// `ok` or `already-released`, as in metrics and the HTTP API.
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseOutcome::Released => "ok",
            ReleaseOutcome::AlreadyReleased => "already-released",
        }
    }
}

/// 128 random bits as 32 lowercase hex digits: URL-safe, unguessable.
fn new_token() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// A granted lease (spec §3). Call [`Lease::check`] at every use and [`Lease::release`] when done; a lease dropped
/// without release is released in the background (and logged), so a panicking caller leaks no slot.
#[derive(Debug)]
pub struct Lease(Option<HeldLease>);

#[derive(Debug)]
struct HeldLease {
    service: ResourceLeaseService,
    token: String,
    resource: String,
    levels: Caps,
    ttl_seconds: u64,
    released: AtomicBool,
}

impl Lease {
    /// The NOOP lease: no definition or no caps. Every operation succeeds without store traffic.
    pub fn noop() -> Self {
        Lease(None)
    }

    fn held(service: ResourceLeaseService, token: String, def: &LeaseDefinition) -> Self {
        Lease(Some(HeldLease {
            service,
            token,
            resource: def.resource.clone(),
            levels: def.levels,
            ttl_seconds: def.ttl_seconds,
            released: AtomicBool::new(false),
        }))
    }

    /// Whether this is the NOOP lease.
    pub fn is_noop(&self) -> bool {
        self.0.is_none()
    }

    /// The token (the holder's `_id`); `None` for NOOP.
    pub fn token(&self) -> Option<&str> {
        self.0.as_ref().map(|h| h.token.as_str())
    }

    /// The counted resource; `None` for NOOP.
    pub fn resource(&self) -> Option<&str> {
        self.0.as_ref().map(|h| h.resource.as_str())
    }

    /// The definition's TTL; `None` for NOOP.
    pub fn ttl_seconds(&self) -> Option<u64> {
        self.0.as_ref().map(|h| h.ttl_seconds)
    }

    /// The definition's caps; `None` for NOOP.
    pub fn levels(&self) -> Option<Caps> {
        self.0.as_ref().map(|h| h.levels)
    }

    /// Hands the lease over to a remote holder that keeps it by token (the HTTP API): dropping the handle no
    /// longer releases it. Returns the token; `None` for NOOP.
    pub fn detach(self) -> Option<String> {
        let h = self.0.as_ref()?;
        h.released.store(true, Ordering::SeqCst);
        Some(h.token.clone())
    }

    /// Check-at-use: touches the holder; `LEASE_LOST` if it was reaped or revoked.
    pub async fn check(&self) -> Result<(), LeaseError> {
        match &self.0 {
            None => Ok(()),
            Some(h) => h.service.check(&h.token, &h.resource).await,
        }
    }

    /// Replaces the payload (what the handler needs for cleanup).
    pub async fn update_payload(&self, payload: Payload) -> Result<(), LeaseError> {
        match &self.0 {
            None => Ok(()),
            Some(h) => h.service.update_payload(&h.token, &payload).await,
        }
    }

    /// Releases the lease. Idempotent: a second call reports `AlreadyReleased` and decrements nothing.
    pub async fn release(&self) -> Result<ReleaseOutcome, LeaseError> {
        match &self.0 {
            None => Ok(ReleaseOutcome::Released),
            Some(h) => {
                let outcome = h.service.release(&h.token, &h.resource).await?;
                h.released.store(true, Ordering::SeqCst);
                Ok(outcome)
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(h) = self.0.take() else { return };
        if h.released.load(Ordering::SeqCst) {
            return;
        }
        tracing::warn!(token = %h.token, resource = %h.resource, "lease dropped without release; releasing it in the background");
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Err(e) = h.service.release(&h.token, &h.resource).await {
                        tracing::warn!(token = %h.token, error = %e, "background release failed; the idle reap will free the slot");
                    }
                });
            }
            Err(_) => {
                tracing::error!(token = %h.token, "no runtime to release a dropped lease; the idle reap will free the slot");
            }
        }
    }
}
