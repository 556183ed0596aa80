//! The store seam: storage primitives, and nothing else.
//!
//! The funnel algorithm of spec §4 lives once, in [`crate::service`], above this trait. An implementation maps
//! each primitive to one atomic operation of its backend (one MongoDB round trip for [`MongoStore`]); it never
//! combines primitives into policy. Time is always the store's own ("server time"): holders and reapers live on
//! different pods and must agree on what idle means.

mod memory;
mod mongo;

use std::collections::HashMap;

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::error::{Level, StoreError};

pub use memory::{Clock, ManualClock, MemoryStore, SystemClock};
pub use mongo::{COUNTERS, HOLDERS, MongoStore};

/// A holder's payload: what its type's handler needs for cleanup (an endpoint, a session id, a job id).
pub type Payload = Map<String, Value>;

/// Result of a store primitive.
pub type StoreResult<T> = Result<T, StoreError>;

/// The identity of one counter: `(resource, level, scope)`, stored under `_id = <resource>|<level>|<scope>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterKey {
    /// The counted resource.
    pub resource: String,
    /// The quota level.
    pub level: Level,
    /// `*` (global), `<tenant>`, `<tenant>/<project>` or `<tenant>/<user>`.
    pub scope: String,
}

impl CounterKey {
    /// The counter of `level` for a holder in `tenant` / `project` / `user`; `None` for the user level without a
    /// user.
    pub fn for_level(resource: &str, level: Level, tenant: &str, project: &str, user: Option<&str>) -> Option<Self> {
        let scope = match level {
            Level::Global => "*".to_owned(),
            Level::Tenant => tenant.to_owned(),
            Level::Project => format!("{tenant}/{project}"),
            Level::User => format!("{tenant}/{}", user?),
        };
        Some(CounterKey { resource: resource.to_owned(), level, scope })
    }

    /// The counter document's `_id`.
    pub fn id(&self) -> String {
        format!("{}|{}|{}", self.resource, self.level, self.scope)
    }

    /// Whether this counter belongs to `tenant` (tenant, project or user level of that tenant).
    pub fn belongs_to_tenant(&self, tenant: &str) -> bool {
        self.level != Level::Global
            && (self.scope == tenant || self.scope.strip_prefix(tenant).is_some_and(|rest| rest.starts_with('/')))
    }

    /// Parses an `_id` back into a key.
    pub fn parse(id: &str) -> Option<Self> {
        let mut parts = id.splitn(3, '|');
        let resource = parts.next()?.to_owned();
        let level = match parts.next()? {
            "user" => Level::User,
            "project" => Level::Project,
            "tenant" => Level::Tenant,
            "global" => Level::Global,
            _ => return None,
        };
        Some(CounterKey { resource, level, scope: parts.next()?.to_owned() })
    }
}

/// A holder's lifecycle state. A holder is `Pending` while its funnel runs and `Held` once every level is booked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HolderState {
    /// The funnel is still booking levels.
    Pending,
    /// Every capped level is booked.
    Held,
}

impl HolderState {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            HolderState::Pending => "PENDING",
            HolderState::Held => "HELD",
        }
    }

    pub(crate) fn parse(s: &str) -> Self {
        if s == "HELD" { HolderState::Held } else { HolderState::Pending }
    }
}

/// What an acquisition writes when it creates its holder document.
#[derive(Debug, Clone)]
pub struct NewHolder {
    /// The lease token: 128 random bits, URL-safe text; the holder's `_id`.
    pub token: String,
    /// The handler type.
    pub lease_type: String,
    /// The definition's name.
    pub lease: String,
    /// The counted resource.
    pub resource: String,
    /// The holder's tenant.
    pub tenant_id: String,
    /// The holder's project.
    pub project_id: String,
    /// The holder's user, if any.
    pub user_id: Option<String>,
    /// Consumer-specific reference (a process id, a session id).
    pub holder_ref: String,
    /// The pod that acquired the lease.
    pub pod: String,
    /// Whether the resource dies with the pod.
    pub pod_bound: bool,
    /// The initial payload.
    pub payload: Payload,
    /// Idle time after which the holder may be reaped.
    pub ttl_seconds: u64,
}

/// A stored holder, as read back (from a delete, a listing or a reap). Its JSON form (camelCase, `type` for the
/// lease type) is what pods send each other with a revocation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HolderRecord {
    /// The lease token.
    pub token: String,
    /// The handler type.
    #[serde(rename = "type")]
    pub lease_type: String,
    /// The definition's name.
    pub lease: String,
    /// The counted resource.
    pub resource: String,
    /// The holder's tenant.
    pub tenant_id: String,
    /// The holder's project.
    pub project_id: String,
    /// The holder's user, if any.
    pub user_id: Option<String>,
    /// Consumer-specific reference.
    pub holder_ref: String,
    /// The pod that acquired the lease.
    pub pod: String,
    /// Whether the resource dies with the pod.
    pub pod_bound: bool,
    /// `PENDING` or `HELD`.
    pub state: HolderState,
    /// The counter `_id`s this holder has booked: what its deleter decrements.
    pub levels: Vec<String>,
    /// What the handler needs for cleanup.
    pub payload: Payload,
    /// Idle time after which the holder may be reaped.
    pub ttl_seconds: u64,
    /// Store time of the acquisition, in epoch milliseconds.
    pub acquired_at_ms: i64,
    /// Store time of the last touch, in epoch milliseconds.
    pub last_seen_at_ms: i64,
}

/// A stored counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterRecord {
    /// The counter's `_id`.
    pub id: String,
    /// Slots taken according to the counter (may drift from the booked holders in crash windows).
    pub count: i64,
    /// Store time of the last change, in epoch milliseconds.
    pub updated_at_ms: i64,
}

/// The extra condition of a holder delete. The condition is part of the delete filter, so that it is decided
/// atomically with the delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteCondition<'a> {
    /// Delete whatever holder has the token (release, rollback).
    Any,
    /// Only if the holder belongs to this tenant (a tenant-bound revocation or release).
    Tenant(&'a str),
    /// Only if the holder is idle by store time (`lastSeenAt + ttlSeconds < now`): a concurrent touch saves it.
    Idle,
    /// Only if the holder was acquired by this pod (dead-pod reap, revocation of a pod's holders).
    Pod(&'a str),
}

/// The occupancy of one counter, for the diagnosis of `LEASE_BUSY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupancy {
    /// The counter's count (0 when the counter does not exist).
    pub count: i64,
    /// Milliseconds until the earliest holder booking it becomes idle, if any holder books it.
    pub retry_after_ms: Option<u64>,
}

/// The storage primitives of the funnel. Every method is one atomic operation on the backend; none of them
/// decides policy.
#[async_trait]
pub trait LeaseStore: Send + Sync + std::fmt::Debug + 'static {
    /// Creates the holder document in state `PENDING` with `levels: []`, `acquiredAt` and `lastSeenAt` set to
    /// store time.
    async fn insert_holder(&self, holder: &NewHolder) -> StoreResult<()>;

    /// The conditional increment: `count += 1` only if the counter exists and `count < cap`. Never creates the
    /// counter. Returns whether a slot was taken.
    async fn try_increment(&self, key: &CounterKey, cap: u32) -> StoreResult<bool>;

    /// Creates the counter with `count: 0` and `updatedAt` = store time if it does not exist (a pure-`_id`
    /// upsert); leaves an existing counter alone, its count and its `updatedAt` both. The funnel calls this after
    /// every refused increment, so a waiter polling a full counter would otherwise keep it "recently changed"
    /// forever and reconcile could never repair a drifted, contended counter.
    async fn ensure_counter(&self, key: &CounterKey) -> StoreResult<()>;

    /// Appends `counter_id` to the holder's `levels`; with `held`, also sets state `HELD` in the same write.
    /// Returns `false` if the holder no longer exists.
    async fn push_level(&self, token: &str, counter_id: &str, held: bool) -> StoreResult<bool>;

    /// Sets `lastSeenAt` to store time. Returns whether the holder exists — in `tenant`, when given (the tenant is
    /// part of the filter) — counting a *matched* document, not a *modified* one: two touches in one millisecond
    /// both succeed.
    async fn touch(&self, token: &str, tenant: Option<&str>) -> StoreResult<bool>;

    /// [`Self::touch`] of a holder of `tenant` that also returns the holder's resource, for a caller that knows
    /// only the token (the check metric is labelled by resource): `None` if no holder of `tenant` has the token.
    /// One round trip.
    async fn touch_in_tenant(&self, token: &str, tenant: &str) -> StoreResult<Option<String>>;

    /// Replaces the payload (and touches). Returns whether the holder exists (in `tenant`, when given).
    async fn set_payload(&self, token: &str, tenant: Option<&str>, payload: &Payload) -> StoreResult<bool>;

    /// The count of one counter, `None` if it does not exist: the cheap read a waiting acquisition polls.
    async fn counter_count(&self, key: &CounterKey) -> StoreResult<Option<i64>>;

    /// Deletes the holder if it exists and meets `condition`, returning the deleted document. Whoever gets the
    /// document back owns the decrement of its `levels`.
    async fn delete_holder(&self, token: &str, condition: DeleteCondition<'_>) -> StoreResult<Option<HolderRecord>>;

    /// Decrements each of the given counters by one, in one write.
    async fn decrement(&self, counter_ids: &[String]) -> StoreResult<()>;

    /// Tokens of holders that are idle by store time, optionally of one resource only.
    async fn idle_holders(&self, resource: Option<&str>) -> StoreResult<Vec<String>>;

    /// The count of a counter and when its earliest holder becomes idle.
    async fn occupancy(&self, key: &CounterKey) -> StoreResult<Occupancy>;

    /// One holder, if it exists.
    async fn holder(&self, token: &str) -> StoreResult<Option<HolderRecord>>;

    /// Every holder, optionally of one resource.
    async fn holders(&self, resource: Option<&str>) -> StoreResult<Vec<HolderRecord>>;

    /// Every counter, optionally of one resource.
    async fn counters(&self, resource: Option<&str>) -> StoreResult<Vec<CounterRecord>>;

    /// Every holder of one tenant (the tenant's own view; nothing of another tenant is read out).
    async fn tenant_holders(&self, tenant: &str) -> StoreResult<Vec<HolderRecord>>;

    /// The counters that belong to one tenant: its tenant, project and user levels (scope `<tenant>` or
    /// `<tenant>/…`), never the global level, which belongs to no tenant.
    async fn tenant_counters(&self, tenant: &str) -> StoreResult<Vec<CounterRecord>>;

    /// The store's clock now, in epoch milliseconds: the clock of `lastSeenAt`, `updatedAt` and `$$NOW`.
    async fn store_now_ms(&self) -> StoreResult<i64>;

    /// The distinct pods that hold (or are acquiring) at least one lease, in a stable order.
    async fn holder_pods(&self) -> StoreResult<Vec<String>>;

    /// Tokens of the holders acquired by `pod`.
    async fn pod_holders(&self, pod: &str) -> StoreResult<Vec<String>>;

    /// For every counter `_id` that at least one holder books, the number of holders booking it (the value
    /// reconcile corrects a counter to). Counters nobody books are absent.
    async fn booked_counts(&self) -> StoreResult<HashMap<String, i64>>;

    /// Sets the counter's count to `count` (and `updatedAt` to store time) only if its count and `updatedAt` are
    /// still those of `expected`: reconcile's compare-and-set. Returns whether it wrote.
    async fn set_counter_if_unchanged(&self, expected: &CounterRecord, count: i64) -> StoreResult<bool>;

    /// Deletes the counter only if its count and `updatedAt` are still those of `expected`. Returns whether it
    /// deleted.
    async fn delete_counter_if_unchanged(&self, expected: &CounterRecord) -> StoreResult<bool>;
}
