//! The in-memory store: the embedded default of a single brain without MongoDB, and the ground of deterministic
//! fault-injection and simulation tests. Each primitive runs under one lock, so it is as atomic as its MongoDB
//! twin.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::{
    CounterKey, CounterRecord, DeleteCondition, HolderRecord, HolderState, LeaseStore, NewHolder, Occupancy, Payload,
    StoreResult,
};

/// The store's notion of "now" in epoch milliseconds: the "server time" of the in-memory store.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Now, in epoch milliseconds.
    fn now_ms(&self) -> i64;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
    }
}

/// A clock that only moves when told to: simulations and TTL tests without sleeping.
#[derive(Debug, Default, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `start_ms`.
    pub fn new(start_ms: i64) -> Self {
        ManualClock(Arc::new(AtomicI64::new(start_ms)))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Default)]
struct State {
    holders: HashMap<String, HolderRecord>,
    counters: HashMap<String, CounterRecord>,
    /// Insertion sequence of each holder: listings come out in insertion order, so that a simulation replays
    /// the same way from the same seed although tokens are random.
    seq: HashMap<String, u64>,
    next_seq: u64,
}

impl State {
    /// Holders matching `keep`, in insertion order.
    fn holders_where(&self, keep: impl Fn(&HolderRecord) -> bool) -> Vec<&HolderRecord> {
        let mut found: Vec<&HolderRecord> = self.holders.values().filter(|h| keep(h)).collect();
        found.sort_by_key(|h| self.seq.get(&h.token).copied().unwrap_or(u64::MAX));
        found
    }
}

/// The in-memory [`LeaseStore`].
#[derive(Debug)]
pub struct MemoryStore {
    // A std mutex: no primitive awaits while holding it, and every primitive is a few map operations.
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl MemoryStore {
    /// An empty store on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryStore { state: Mutex::default(), clock }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied primitive behind (each one mutates last), so
        // a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_idle(h: &HolderRecord, now: i64) -> bool {
        h.last_seen_at_ms + (h.ttl_seconds as i64) * 1000 < now
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn insert_holder(&self, h: &NewHolder) -> StoreResult<()> {
        let now = self.clock.now_ms();
        let mut state = self.state();
        let state = &mut *state;
        let Entry::Vacant(slot) = state.holders.entry(h.token.clone()) else { return Ok(()) };
        state.seq.insert(h.token.clone(), state.next_seq);
        state.next_seq += 1;
        slot.insert(HolderRecord {
            token: h.token.clone(),
            lease_type: h.lease_type.clone(),
            lease: h.lease.clone(),
            resource: h.resource.clone(),
            tenant_id: h.tenant_id.clone(),
            project_id: h.project_id.clone(),
            user_id: h.user_id.clone(),
            holder_ref: h.holder_ref.clone(),
            pod: h.pod.clone(),
            pod_bound: h.pod_bound,
            state: HolderState::Pending,
            levels: Vec::new(),
            payload: h.payload.clone(),
            ttl_seconds: h.ttl_seconds,
            acquired_at_ms: now,
            last_seen_at_ms: now,
        });
        Ok(())
    }

    async fn try_increment(&self, key: &CounterKey, cap: u32) -> StoreResult<bool> {
        let now = self.clock.now_ms();
        let mut state = self.state();
        match state.counters.get_mut(&key.id()) {
            Some(c) if c.count < i64::from(cap) => {
                c.count += 1;
                c.updated_at_ms = now;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn ensure_counter(&self, key: &CounterKey) -> StoreResult<()> {
        let now = self.clock.now_ms();
        let id = key.id();
        // An existing counter keeps its `updatedAt`: see the trait.
        self.state().counters.entry(id.clone()).or_insert(CounterRecord { id, count: 0, updated_at_ms: now });
        Ok(())
    }

    async fn push_level(&self, token: &str, counter_id: &str, held: bool) -> StoreResult<bool> {
        Ok(self
            .state()
            .holders
            .get_mut(token)
            .map(|h| {
                h.levels.push(counter_id.to_owned());
                if held {
                    h.state = HolderState::Held;
                }
            })
            .is_some())
    }

    async fn touch(&self, token: &str, tenant: Option<&str>) -> StoreResult<bool> {
        let now = self.clock.now_ms();
        Ok(self
            .state()
            .holders
            .get_mut(token)
            .filter(|h| tenant.is_none_or(|t| h.tenant_id == t))
            .map(|h| h.last_seen_at_ms = now)
            .is_some())
    }

    async fn touch_in_tenant(&self, token: &str, tenant: &str) -> StoreResult<Option<String>> {
        let now = self.clock.now_ms();
        Ok(self.state().holders.get_mut(token).filter(|h| h.tenant_id == tenant).map(|h| {
            h.last_seen_at_ms = now;
            h.resource.clone()
        }))
    }

    async fn set_payload(&self, token: &str, tenant: Option<&str>, payload: &Payload) -> StoreResult<bool> {
        let now = self.clock.now_ms();
        Ok(self
            .state()
            .holders
            .get_mut(token)
            .filter(|h| tenant.is_none_or(|t| h.tenant_id == t))
            .map(|h| {
                h.payload = payload.clone();
                h.last_seen_at_ms = now;
            })
            .is_some())
    }

    async fn delete_holder(&self, token: &str, condition: DeleteCondition<'_>) -> StoreResult<Option<HolderRecord>> {
        let now = self.clock.now_ms();
        let mut state = self.state();
        let matches = state.holders.get(token).is_some_and(|h| match condition {
            DeleteCondition::Any => true,
            DeleteCondition::Tenant(t) => h.tenant_id == t,
            DeleteCondition::Idle => Self::is_idle(h, now),
            DeleteCondition::Pod(p) => h.pod == p,
        });
        if !matches {
            return Ok(None);
        }
        state.seq.remove(token);
        Ok(state.holders.remove(token))
    }

    async fn decrement(&self, counter_ids: &[String]) -> StoreResult<()> {
        let now = self.clock.now_ms();
        let mut state = self.state();
        for id in counter_ids {
            if let Some(c) = state.counters.get_mut(id) {
                c.count -= 1;
                c.updated_at_ms = now;
            }
        }
        Ok(())
    }

    async fn idle_holders(&self, resource: Option<&str>) -> StoreResult<Vec<String>> {
        let now = self.clock.now_ms();
        let state = self.state();
        let idle = state.holders_where(|h| resource.is_none_or(|r| h.resource == r) && Self::is_idle(h, now));
        Ok(idle.into_iter().map(|h| h.token.clone()).collect())
    }

    async fn tenant_holders(&self, tenant: &str) -> StoreResult<Vec<HolderRecord>> {
        Ok(self.state().holders.values().filter(|h| h.tenant_id == tenant).cloned().collect())
    }

    async fn tenant_counters(&self, tenant: &str) -> StoreResult<Vec<CounterRecord>> {
        Ok(self
            .state()
            .counters
            .values()
            .filter(|c| CounterKey::parse(&c.id).is_some_and(|k| k.belongs_to_tenant(tenant)))
            .cloned()
            .collect())
    }

    async fn counter_count(&self, key: &CounterKey) -> StoreResult<Option<i64>> {
        Ok(self.state().counters.get(&key.id()).map(|c| c.count))
    }

    async fn occupancy(&self, key: &CounterKey) -> StoreResult<Occupancy> {
        let now = self.clock.now_ms();
        let id = key.id();
        let state = self.state();
        let count = state.counters.get(&id).map_or(0, |c| c.count);
        let retry_after_ms = state
            .holders
            .values()
            .filter(|h| h.levels.contains(&id))
            .map(|h| h.last_seen_at_ms + (h.ttl_seconds as i64) * 1000 - now)
            .min()
            .map(|ms| ms.max(0) as u64);
        Ok(Occupancy { count, retry_after_ms })
    }

    async fn holder(&self, token: &str) -> StoreResult<Option<HolderRecord>> {
        Ok(self.state().holders.get(token).cloned())
    }

    async fn holders(&self, resource: Option<&str>) -> StoreResult<Vec<HolderRecord>> {
        let state = self.state();
        Ok(state.holders_where(|h| resource.is_none_or(|r| h.resource == r)).into_iter().cloned().collect())
    }

    async fn counters(&self, resource: Option<&str>) -> StoreResult<Vec<CounterRecord>> {
        let mut counters: Vec<CounterRecord> = self
            .state()
            .counters
            .values()
            .filter(|c| resource.is_none_or(|r| CounterKey::parse(&c.id).is_some_and(|k| k.resource == r)))
            .cloned()
            .collect();
        counters.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(counters)
    }

    async fn store_now_ms(&self) -> StoreResult<i64> {
        Ok(self.clock.now_ms())
    }

    async fn holder_pods(&self) -> StoreResult<Vec<String>> {
        let mut pods: Vec<String> = self.state().holders.values().map(|h| h.pod.clone()).collect();
        pods.sort();
        pods.dedup();
        Ok(pods)
    }

    async fn pod_holders(&self, pod: &str) -> StoreResult<Vec<String>> {
        let state = self.state();
        Ok(state.holders_where(|h| h.pod == pod).into_iter().map(|h| h.token.clone()).collect())
    }

    async fn booked_counts(&self) -> StoreResult<HashMap<String, i64>> {
        let mut booked = HashMap::new();
        for h in self.state().holders.values() {
            for id in &h.levels {
                *booked.entry(id.clone()).or_insert(0) += 1;
            }
        }
        Ok(booked)
    }

    async fn set_counter_if_unchanged(&self, expected: &CounterRecord, count: i64) -> StoreResult<bool> {
        let now = self.clock.now_ms();
        let mut state = self.state();
        match state.counters.get_mut(&expected.id) {
            Some(c) if c.count == expected.count && c.updated_at_ms == expected.updated_at_ms => {
                c.count = count;
                c.updated_at_ms = now;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn delete_counter_if_unchanged(&self, expected: &CounterRecord) -> StoreResult<bool> {
        let mut state = self.state();
        match state.counters.get(&expected.id) {
            Some(c) if c.count == expected.count && c.updated_at_ms == expected.updated_at_ms => {
                state.counters.remove(&expected.id);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}
