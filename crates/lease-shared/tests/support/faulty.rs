//! A wrapping store for tests: counts every primitive call and injects faults after chosen primitives, to
//! reproduce the crash windows of spec §4 and store errors mid-funnel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lease_shared::StoreError;
use lease_shared::store::{
    CounterKey, CounterRecord, DeleteCondition, HolderRecord, LeaseStore, NewHolder, Occupancy, Payload, StoreResult,
};

/// When an injected fault strikes relative to the real primitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The primitive fails without reaching the store (e.g. the connection dropped before sending).
    Before,
    /// The primitive reaches the store and applies, then the caller sees an error (lost reply, or the pod crashing
    /// right after: the caller's next steps never happen).
    After,
}

#[derive(Debug, Default)]
struct Plan {
    calls: HashMap<&'static str, usize>,
    /// (primitive, the 1-based call number that fails, how).
    faults: Vec<(&'static str, usize, Fault)>,
    /// Once set, every primitive fails before reaching the store: the pod "crashed".
    dead: bool,
}

/// The counting, fault-injecting store.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn LeaseStore>,
    plan: Mutex<Plan>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        FaultyStore { inner, plan: Mutex::default() }
    }

    /// Makes the `nth` (1-based, counted from now on) call of `primitive` fail as `fault`.
    pub fn fail(&self, primitive: &'static str, nth: usize, fault: Fault) {
        let mut plan = self.plan.lock().unwrap();
        let base = plan.calls.get(primitive).copied().unwrap_or(0);
        plan.faults.push((primitive, base + nth, fault));
    }

    /// From now on every primitive fails before reaching the store (a crashed pod), until [`Self::revive`].
    pub fn crash(&self) {
        self.plan.lock().unwrap().dead = true;
    }

    pub fn revive(&self) {
        self.plan.lock().unwrap().dead = false;
    }

    /// Total primitive calls so far.
    pub fn total_calls(&self) -> usize {
        self.plan.lock().unwrap().calls.values().sum()
    }

    /// Calls of one primitive so far.
    pub fn calls(&self, primitive: &str) -> usize {
        self.plan.lock().unwrap().calls.get(primitive).copied().unwrap_or(0)
    }

    fn enter(&self, primitive: &'static str) -> Option<Fault> {
        let mut plan = self.plan.lock().unwrap();
        let n = {
            let c = plan.calls.entry(primitive).or_insert(0);
            *c += 1;
            *c
        };
        if plan.dead {
            return Some(Fault::Before);
        }
        plan.faults.iter().find(|(p, at, _)| *p == primitive && *at == n).map(|(_, _, f)| *f)
    }

    async fn run<T: Send>(
        &self,
        primitive: &'static str,
        op: impl std::future::Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        match self.enter(primitive) {
            None => op.await,
            Some(Fault::Before) => Err(StoreError::new(primitive, "injected fault before the store")),
            Some(Fault::After) => {
                let _ = op.await;
                Err(StoreError::new(primitive, "injected fault after the store applied"))
            }
        }
    }
}

#[async_trait]
impl LeaseStore for FaultyStore {
    async fn insert_holder(&self, holder: &NewHolder) -> StoreResult<()> {
        self.run("insert_holder", self.inner.insert_holder(holder)).await
    }
    async fn try_increment(&self, key: &CounterKey, cap: u32) -> StoreResult<bool> {
        self.run("try_increment", self.inner.try_increment(key, cap)).await
    }
    async fn ensure_counter(&self, key: &CounterKey) -> StoreResult<()> {
        self.run("ensure_counter", self.inner.ensure_counter(key)).await
    }
    async fn push_level(&self, token: &str, counter_id: &str, held: bool) -> StoreResult<bool> {
        self.run("push_level", self.inner.push_level(token, counter_id, held)).await
    }
    async fn touch(&self, token: &str) -> StoreResult<bool> {
        self.run("touch", self.inner.touch(token)).await
    }
    async fn set_payload(&self, token: &str, payload: &Payload) -> StoreResult<bool> {
        self.run("set_payload", self.inner.set_payload(token, payload)).await
    }
    async fn delete_holder(&self, token: &str, condition: DeleteCondition<'_>) -> StoreResult<Option<HolderRecord>> {
        self.run("delete_holder", self.inner.delete_holder(token, condition)).await
    }
    async fn decrement(&self, counter_ids: &[String]) -> StoreResult<()> {
        self.run("decrement", self.inner.decrement(counter_ids)).await
    }
    async fn idle_holders(&self, resource: Option<&str>) -> StoreResult<Vec<String>> {
        self.run("idle_holders", self.inner.idle_holders(resource)).await
    }
    async fn occupancy(&self, key: &CounterKey) -> StoreResult<Occupancy> {
        self.run("occupancy", self.inner.occupancy(key)).await
    }
    async fn holder(&self, token: &str) -> StoreResult<Option<HolderRecord>> {
        self.run("holder", self.inner.holder(token)).await
    }
    async fn holders(&self, resource: Option<&str>) -> StoreResult<Vec<HolderRecord>> {
        self.run("holders", self.inner.holders(resource)).await
    }
    async fn counters(&self, resource: Option<&str>) -> StoreResult<Vec<CounterRecord>> {
        self.run("counters", self.inner.counters(resource)).await
    }
}
