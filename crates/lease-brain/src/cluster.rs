//! The pod registry (`cluster_pods`) and the ONE definition of "pod alive" (spec §6, `LeasePodLiveness`).
//!
//! A pod registers with its advertised endpoint, heartbeats on store time and marks itself stopped on graceful
//! shutdown. A pod is alive when it is not stopped, its heartbeat is not stale and its endpoint is known — or
//! when it is this pod: the pod asking is obviously running, even before its first heartbeat is visible.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_shared::StoreError;
use lease_shared::store::{Clock, SystemClock};
use mongodb::bson::{Document, doc};
use mongodb::{Collection, Database};

/// The pods collection.
pub const CLUSTER_PODS: &str = "cluster_pods";

/// The pod registry's storage.
#[async_trait]
pub trait ClusterStore: Send + Sync + std::fmt::Debug + 'static {
    /// Registers (or re-registers) `pod` with its endpoint, not stopped, heartbeat now.
    async fn register(&self, pod: &str, endpoint: &str) -> Result<(), StoreError>;
    /// Sets the pod's heartbeat to store time.
    async fn heartbeat(&self, pod: &str) -> Result<(), StoreError>;
    /// Marks the pod stopped (graceful shutdown).
    async fn mark_stopped(&self, pod: &str) -> Result<(), StoreError>;
    /// The endpoint of `pod` if it is not stopped, has an endpoint and heartbeat within `staleness` of store
    /// time.
    async fn live_endpoint(&self, pod: &str, staleness: Duration) -> Result<Option<String>, StoreError>;
    /// Every live pod (same criterion as [`Self::live_endpoint`]) with its endpoint.
    async fn live_pods(&self, staleness: Duration) -> Result<Vec<(String, String)>, StoreError>;
}

/// The MongoDB pod registry.
#[derive(Debug, Clone)]
pub struct MongoClusterStore {
    pods: Collection<Document>,
}

impl MongoClusterStore {
    /// The registry in `database`.
    pub fn new(database: &Database) -> Self {
        MongoClusterStore { pods: database.collection(CLUSTER_PODS) }
    }
}

fn err(op: &'static str) -> impl Fn(mongodb::error::Error) -> StoreError {
    move |e| StoreError::new(op, e)
}

#[async_trait]
impl ClusterStore for MongoClusterStore {
    async fn register(&self, pod: &str, endpoint: &str) -> Result<(), StoreError> {
        self.pods
            .update_one(
                doc! { "_id": pod },
                doc! {
                    "$set": { "endpoint": endpoint, "stopped": false },
                    "$currentDate": { "startedAt": true, "heartbeatAt": true },
                },
            )
            .upsert(true)
            .await
            .map_err(err("register"))?;
        Ok(())
    }

    async fn heartbeat(&self, pod: &str) -> Result<(), StoreError> {
        self.pods
            .update_one(doc! { "_id": pod }, doc! { "$currentDate": { "heartbeatAt": true } })
            .await
            .map_err(err("heartbeat"))?;
        Ok(())
    }

    async fn mark_stopped(&self, pod: &str) -> Result<(), StoreError> {
        self.pods
            .update_one(doc! { "_id": pod }, doc! { "$set": { "stopped": true } })
            .await
            .map_err(err("mark_stopped"))?;
        Ok(())
    }

    async fn live_endpoint(&self, pod: &str, staleness: Duration) -> Result<Option<String>, StoreError> {
        let filter = doc! {
            "_id": pod,
            "stopped": false,
            "endpoint": { "$type": "string" },
            "$expr": { "$gt": ["$heartbeatAt", { "$subtract": ["$$NOW", staleness.as_millis() as i64] }] },
        };
        let found = self.pods.find_one(filter).await.map_err(err("live_endpoint"))?;
        Ok(found.and_then(|d| d.get_str("endpoint").ok().map(str::to_owned)))
    }

    async fn live_pods(&self, staleness: Duration) -> Result<Vec<(String, String)>, StoreError> {
        use futures_util::TryStreamExt;
        let filter = doc! {
            "stopped": false,
            "endpoint": { "$type": "string" },
            "$expr": { "$gt": ["$heartbeatAt", { "$subtract": ["$$NOW", staleness.as_millis() as i64] }] },
        };
        let docs: Vec<Document> =
            self.pods.find(filter).await.map_err(err("live_pods"))?.try_collect().await.map_err(err("live_pods"))?;
        Ok(docs
            .iter()
            .filter_map(|d| Some((d.get_str("_id").ok()?.to_owned(), d.get_str("endpoint").ok()?.to_owned())))
            .collect())
    }
}

#[derive(Debug, Clone)]
struct MemoryPod {
    endpoint: String,
    heartbeat_ms: i64,
    stopped: bool,
}

/// The in-memory pod registry of the embedded brain.
#[derive(Debug)]
pub struct MemoryClusterStore {
    pods: Mutex<HashMap<String, MemoryPod>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryClusterStore {
    fn default() -> Self {
        MemoryClusterStore { pods: Mutex::default(), clock: Arc::new(SystemClock) }
    }
}

impl MemoryClusterStore {
    fn pods(&self) -> std::sync::MutexGuard<'_, HashMap<String, MemoryPod>> {
        self.pods.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl ClusterStore for MemoryClusterStore {
    async fn register(&self, pod: &str, endpoint: &str) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        self.pods()
            .insert(pod.to_owned(), MemoryPod { endpoint: endpoint.to_owned(), heartbeat_ms: now, stopped: false });
        Ok(())
    }

    async fn heartbeat(&self, pod: &str) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        if let Some(p) = self.pods().get_mut(pod) {
            p.heartbeat_ms = now;
        }
        Ok(())
    }

    async fn mark_stopped(&self, pod: &str) -> Result<(), StoreError> {
        if let Some(p) = self.pods().get_mut(pod) {
            p.stopped = true;
        }
        Ok(())
    }

    async fn live_endpoint(&self, pod: &str, staleness: Duration) -> Result<Option<String>, StoreError> {
        let now = self.clock.now_ms();
        Ok(self
            .pods()
            .get(pod)
            .filter(|p| !p.stopped && p.heartbeat_ms > now - staleness.as_millis() as i64)
            .map(|p| p.endpoint.clone()))
    }

    async fn live_pods(&self, staleness: Duration) -> Result<Vec<(String, String)>, StoreError> {
        let now = self.clock.now_ms();
        Ok(self
            .pods()
            .iter()
            .filter(|(_, p)| !p.stopped && p.heartbeat_ms > now - staleness.as_millis() as i64)
            .map(|(id, p)| (id.clone(), p.endpoint.clone()))
            .collect())
    }
}

/// This pod's membership: registration, heartbeat, stop, and endpoint resolution of other pods.
#[derive(Debug, Clone)]
pub struct ClusterService {
    store: Arc<dyn ClusterStore>,
    self_pod: String,
    endpoint: String,
    staleness: Duration,
}

impl ClusterService {
    /// Membership of `self_pod`, reachable at `endpoint`; heartbeats older than `staleness` mean dead.
    pub fn new(store: Arc<dyn ClusterStore>, self_pod: String, endpoint: String, staleness: Duration) -> Self {
        ClusterService { store, self_pod, endpoint, staleness }
    }

    /// This pod's id.
    pub fn self_pod_id(&self) -> &str {
        &self.self_pod
    }

    /// Registers this pod.
    pub async fn register(&self) -> Result<(), StoreError> {
        self.store.register(&self.self_pod, &self.endpoint).await
    }

    /// One heartbeat of this pod.
    pub async fn heartbeat(&self) -> Result<(), StoreError> {
        self.store.heartbeat(&self.self_pod).await
    }

    /// Marks this pod stopped.
    pub async fn mark_stopped(&self) -> Result<(), StoreError> {
        self.store.mark_stopped(&self.self_pod).await
    }

    /// Every other live pod with its endpoint (for fan-outs).
    pub async fn live_peers(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut pods = self.store.live_pods(self.staleness).await?;
        pods.retain(|(id, _)| *id != self.self_pod);
        Ok(pods)
    }

    /// The endpoint of `pod` if it is alive by the registry (not stopped, not stale, endpoint known). The own
    /// pod answers with its own endpoint regardless of its registry entry.
    pub async fn resolve_endpoint_by_pod_id(&self, pod: &str) -> Result<Option<String>, StoreError> {
        if pod == self.self_pod {
            return Ok(Some(self.endpoint.clone()));
        }
        self.store.live_endpoint(pod, self.staleness).await
    }
}

/// Whether a pod is alive: THE definition shared by the dead-pod reap, the dispatcher and the operator views.
#[derive(Debug, Clone)]
pub struct LeasePodLiveness {
    cluster: ClusterService,
}

impl LeasePodLiveness {
    /// Liveness by `cluster`'s registry.
    pub fn new(cluster: ClusterService) -> Self {
        LeasePodLiveness { cluster }
    }

    /// The pod's endpoint if it is alive, `None` if dead. The own pod is always alive. A registry that cannot be
    /// read is an error: nobody is declared dead on a store outage.
    pub async fn alive_endpoint(&self, pod: &str) -> Result<Option<String>, StoreError> {
        self.cluster.resolve_endpoint_by_pod_id(pod).await
    }

    /// Whether `pod` is alive.
    pub async fn is_alive(&self, pod: &str) -> Result<bool, StoreError> {
        Ok(self.alive_endpoint(pod).await?.is_some())
    }

    /// This pod's id.
    pub fn self_pod_id(&self) -> &str {
        self.cluster.self_pod_id()
    }
}

#[async_trait]
impl lease_shared::PodLiveness for LeasePodLiveness {
    async fn is_alive(&self, pod: &str) -> bool {
        // Unsure (registry unreadable) counts as alive: nobody loses their leases over a store outage.
        LeasePodLiveness::is_alive(self, pod).await.unwrap_or(true)
    }
}
