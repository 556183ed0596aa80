//! A wrapping store for tests: counts every primitive call and injects faults after chosen primitives, to
//! reproduce the crash windows of spec §4 and store errors mid-funnel; crashes the "pod" at a chosen call; and runs
//! hooks before chosen calls, to interleave other work deterministically at an exact point of an operation.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lease_shared::StoreError;
use lease_shared::store::{
    CounterKey, CounterRecord, DeleteCondition, HolderRecord, LeaseStore, NewHolder, Occupancy, Payload, StoreResult,
};

/// Work run before a chosen primitive call.
type Hook = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// When an injected fault strikes relative to the real primitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The primitive fails without reaching the store (e.g. the connection dropped before sending).
    Before,
    /// The primitive reaches the store and applies, then the caller sees an error (lost reply, or the pod crashing
    /// right after: the caller's next steps never happen).
    After,
}

#[derive(Default)]
struct Plan {
    calls: HashMap<&'static str, usize>,
    /// (primitive, the 1-based call number that fails, how).
    faults: Vec<(&'static str, usize, Fault)>,
    /// (primitive, the 1-based call number at which the pod crashes, how that call ends).
    crashes: Vec<(&'static str, usize, Fault)>,
    /// (primitive, the 1-based call number before which the hook runs, the hook).
    hooks: Vec<(&'static str, usize, Hook)>,
    /// (primitive, the 1-based call number after which the hook runs, the hook).
    after_hooks: Vec<(&'static str, usize, Hook)>,
    /// Once set, every primitive fails before reaching the store: the pod "crashed".
    dead: bool,
    /// Added to every primitive before it reaches the store (a network round trip, in tokio time).
    latency: Option<std::time::Duration>,
    /// Primitives under way now, and the most ever under way at once.
    in_flight: usize,
    max_in_flight: usize,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("calls", &self.calls)
            .field("faults", &self.faults)
            .field("crashes", &self.crashes)
            .field("hooks", &self.hooks.len())
            .field("after_hooks", &self.after_hooks.len())
            .field("dead", &self.dead)
            .field("latency", &self.latency)
            .finish()
    }
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

    /// The pod crashes at the `nth` (1-based, counted from now on) call of `primitive`: that call ends as `fault`
    /// (`Before`: never reached the store; `After`: applied, then the pod died before hearing back), and every
    /// later call fails before reaching the store — so nothing the caller would do next (a rollback, a
    /// decrement) happens. Until [`Self::revive`].
    pub fn crash_on(&self, primitive: &'static str, nth: usize, fault: Fault) {
        let mut plan = self.plan.lock().unwrap();
        let base = plan.calls.get(primitive).copied().unwrap_or(0);
        plan.crashes.push((primitive, base + nth, fault));
    }

    /// Runs `hook` to completion right before the `nth` (1-based, counted from now on) call of `primitive` goes
    /// to the store (or fails): the operation making that call is suspended exactly there meanwhile.
    pub fn before<F, Fut>(&self, primitive: &'static str, nth: usize, hook: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut plan = self.plan.lock().unwrap();
        let base = plan.calls.get(primitive).copied().unwrap_or(0);
        plan.hooks.push((primitive, base + nth, Box::new(move || Box::pin(hook()))));
    }

    /// Runs `hook` to completion right after the `nth` (1-based, counted from now on) call of `primitive` returned
    /// (whatever it returned), before its caller sees the result.
    pub fn after<F, Fut>(&self, primitive: &'static str, nth: usize, hook: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut plan = self.plan.lock().unwrap();
        let base = plan.calls.get(primitive).copied().unwrap_or(0);
        plan.after_hooks.push((primitive, base + nth, Box::new(move || Box::pin(hook()))));
    }

    /// Every primitive from now on takes `latency` (tokio time) before it reaches the store.
    pub fn set_latency(&self, latency: std::time::Duration) {
        self.plan.lock().unwrap().latency = Some(latency);
    }

    /// The most primitives that were ever under way at once; resets the figure.
    pub fn take_max_in_flight(&self) -> usize {
        let mut plan = self.plan.lock().unwrap();
        let now = plan.in_flight;
        std::mem::replace(&mut plan.max_in_flight, now)
    }

    /// Whether the pod has crashed.
    pub fn is_crashed(&self) -> bool {
        self.plan.lock().unwrap().dead
    }

    /// Drops every planned fault, crash and hook not yet due.
    pub fn clear_plan(&self) {
        let mut plan = self.plan.lock().unwrap();
        plan.faults.clear();
        plan.crashes.clear();
        plan.hooks.clear();
        plan.after_hooks.clear();
    }

    /// The pod is back (e.g. restarted): primitives reach the store again.
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

    fn take_due(hooks: &mut Vec<(&'static str, usize, Hook)>, primitive: &str, n: usize) -> Vec<Hook> {
        let (due, rest): (Vec<_>, Vec<_>) =
            std::mem::take(hooks).into_iter().partition(|(p, at, _)| *p == primitive && *at == n);
        *hooks = rest;
        due.into_iter().map(|(_, _, h)| h).collect()
    }

    async fn enter(&self, primitive: &'static str) -> (usize, Option<Fault>) {
        let (n, hooks) = {
            let mut plan = self.plan.lock().unwrap();
            let n = {
                let c = plan.calls.entry(primitive).or_insert(0);
                *c += 1;
                *c
            };
            (n, Self::take_due(&mut plan.hooks, primitive, n))
        };
        for hook in hooks {
            hook().await;
        }
        let mut plan = self.plan.lock().unwrap();
        if plan.dead {
            return (n, Some(Fault::Before));
        }
        if let Some(&(_, _, fault)) = plan.crashes.iter().find(|(p, at, _)| *p == primitive && *at == n) {
            plan.dead = true;
            return (n, Some(fault));
        }
        (n, plan.faults.iter().find(|(p, at, _)| *p == primitive && *at == n).map(|(_, _, f)| *f))
    }

    async fn run<T: Send>(
        &self,
        primitive: &'static str,
        op: impl std::future::Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        let (n, fault) = self.enter(primitive).await;
        let latency = {
            let mut plan = self.plan.lock().unwrap();
            plan.in_flight += 1;
            plan.max_in_flight = plan.max_in_flight.max(plan.in_flight);
            plan.latency
        };
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        let result = match fault {
            None => op.await,
            Some(Fault::Before) => Err(StoreError::new(primitive, "injected fault before the store")),
            Some(Fault::After) => {
                let _ = op.await;
                Err(StoreError::new(primitive, "injected fault after the store applied"))
            }
        };
        let hooks = {
            let mut plan = self.plan.lock().unwrap();
            plan.in_flight -= 1;
            Self::take_due(&mut plan.after_hooks, primitive, n)
        };
        for hook in hooks {
            hook().await;
        }
        result
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
    async fn touch(&self, token: &str, tenant: Option<&str>) -> StoreResult<bool> {
        self.run("touch", self.inner.touch(token, tenant)).await
    }

    async fn touch_in_tenant(&self, token: &str, tenant: &str) -> StoreResult<Option<String>> {
        self.run("touch_in_tenant", self.inner.touch_in_tenant(token, tenant)).await
    }
    async fn set_payload(&self, token: &str, tenant: Option<&str>, payload: &Payload) -> StoreResult<bool> {
        self.run("set_payload", self.inner.set_payload(token, tenant, payload)).await
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
    async fn tenant_holders(&self, tenant: &str) -> StoreResult<Vec<HolderRecord>> {
        self.run("tenant_holders", self.inner.tenant_holders(tenant)).await
    }
    async fn tenant_counters(&self, tenant: &str) -> StoreResult<Vec<CounterRecord>> {
        self.run("tenant_counters", self.inner.tenant_counters(tenant)).await
    }
    async fn counter_count(&self, key: &CounterKey) -> StoreResult<Option<i64>> {
        self.run("counter_count", self.inner.counter_count(key)).await
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
    async fn store_now_ms(&self) -> StoreResult<i64> {
        self.run("store_now_ms", self.inner.store_now_ms()).await
    }
    async fn holder_pods(&self) -> StoreResult<Vec<String>> {
        self.run("holder_pods", self.inner.holder_pods()).await
    }
    async fn pod_holders(&self, pod: &str) -> StoreResult<Vec<String>> {
        self.run("pod_holders", self.inner.pod_holders(pod)).await
    }
    async fn booked_counts(&self) -> StoreResult<HashMap<String, i64>> {
        self.run("booked_counts", self.inner.booked_counts()).await
    }
    async fn set_counter_if_unchanged(&self, expected: &CounterRecord, count: i64) -> StoreResult<bool> {
        self.run("set_counter_if_unchanged", self.inner.set_counter_if_unchanged(expected, count)).await
    }
    async fn delete_counter_if_unchanged(&self, expected: &CounterRecord) -> StoreResult<bool> {
        self.run("delete_counter_if_unchanged", self.inner.delete_counter_if_unchanged(expected)).await
    }
}
