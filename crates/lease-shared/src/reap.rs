//! Reaping (spec §5): deleting holders on behalf of someone else, returning their slots, and handing them to the
//! revocation listener so that the resource behind them is cleaned up.
//!
//! Every path here is "find-and-delete, then decrement what the deleted document booked": whoever deletes a
//! holder owns its decrement, so any number of reapers, releases and revocations may race.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use tokio::task::{JoinError, JoinSet};

use crate::error::{LeaseError, StoreError};
use crate::metrics;
use crate::store::{DeleteCondition, HolderRecord, LeaseStore};

/// Why a holder was taken away from its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RevocationReason {
    /// `lastSeenAt + ttlSeconds` passed without a check.
    Idle,
    /// The holder's pod is dead.
    Pod,
    /// An operator revoked it.
    Revoke,
}

impl RevocationReason {
    /// `idle`, `pod` or `revoke`, as in metrics and the revocation POST.
    pub fn as_str(self) -> &'static str {
        match self {
            RevocationReason::Idle => "idle",
            RevocationReason::Pod => "pod",
            RevocationReason::Revoke => "revoke",
        }
    }
}

impl fmt::Display for RevocationReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The seam between reaping (here) and handler dispatch (the brain). Implementations must not block: the lazy
/// sweep runs on an acquiring caller's path and hands holders over without waiting for handlers or pod POSTs.
#[async_trait]
pub trait LeaseRevocationListener: Send + Sync + fmt::Debug + 'static {
    /// `holder` was deleted and its slots returned; clean up the resource behind it.
    async fn on_revoked(&self, holder: HolderRecord, reason: RevocationReason);
}

/// Whether a pod is alive: the single definition of spec §6 (`LeasePodLiveness`), shared by the sweeper's
/// dead-pod reap, the dispatcher and the operator view. The brain implements it on its pod registry (not stopped,
/// not stale, endpoint known); `lease-shared` only asks.
///
/// The sweeper never asks about its own pod (it is obviously alive: it is sweeping), nor about holders without a
/// pod.
#[async_trait]
pub trait PodLiveness: Send + Sync + fmt::Debug + 'static {
    /// Whether `pod` is alive. Answer `true` when unsure (the registry cannot be read): a pod wrongly judged dead
    /// loses every lease it holds, a pod wrongly judged alive only keeps its leases until their idle TTL.
    async fn is_alive(&self, pod: &str) -> bool;
}

/// The cleanup of one lease type (`tex`, `mcp`, `webhook`): runs when a holder of that type is revoked, never on
/// a regular release.
#[async_trait]
pub trait LeaseHandler: Send + Sync + fmt::Debug + 'static {
    /// The type this handler serves.
    fn lease_type(&self) -> &str;

    /// Cleans up the resource of a revoked holder, using its payload.
    async fn on_revoked(&self, holder: &HolderRecord, reason: RevocationReason) -> Result<(), String>;
}

/// Deletes holders for others: idle reap, dead-pod reap and revocation.
///
/// A reaped holder is handed to the [`LeaseRevocationListener`] on a task of its own, so that no reaping path —
/// least of all the lazy sweep on an acquiring caller's path — waits for handlers or pod POSTs. Those tasks are
/// owned by the reaper (shared by its clones): [`Reaper::flush`] waits for them, and they are aborted when the
/// last clone is dropped. Without a listener a reap is only logged.
#[derive(Debug, Clone)]
pub struct Reaper {
    store: Arc<dyn LeaseStore>,
    listener: Option<Arc<dyn LeaseRevocationListener>>,
    notifications: Arc<Mutex<JoinSet<()>>>,
}

impl Reaper {
    pub(crate) fn new(store: Arc<dyn LeaseStore>, listener: Option<Arc<dyn LeaseRevocationListener>>) -> Self {
        Reaper { store, listener, notifications: Arc::default() }
    }

    /// Reaps every idle holder (optionally of one resource) one by one; returns how many this call deleted.
    /// A holder touched between the scan and its delete survives: idleness is part of the delete filter.
    pub async fn reap_idle(&self, resource: Option<&str>) -> Result<usize, StoreError> {
        let mut reaped = 0;
        for token in self.store.idle_holders(resource).await? {
            if self.take(&token, DeleteCondition::Idle, RevocationReason::Idle).await?.is_some() {
                reaped += 1;
            }
        }
        Ok(reaped)
    }

    /// Reaps every holder of `pod`, which the caller found dead (reason `pod`); returns how many this call
    /// deleted. The pod is part of each delete filter.
    pub async fn reap_pod(&self, pod: &str) -> Result<usize, StoreError> {
        Ok(self.take_pod(pod, RevocationReason::Pod).await?.len())
    }

    /// An operator's revocation of one holder, optionally bound to `tenant` (part of the delete filter).
    /// `LEASE_LOST` if there is no such holder (in that tenant).
    pub async fn revoke(&self, token: &str, tenant: Option<&str>) -> Result<HolderRecord, LeaseError> {
        let condition = tenant.map_or(DeleteCondition::Any, DeleteCondition::Tenant);
        self.take(token, condition, RevocationReason::Revoke)
            .await?
            .ok_or_else(|| LeaseError::Lost { token: token.to_owned() })
    }

    /// An operator's revocation of every holder of `pod` (reason `revoke`), whether the pod is alive or not: the
    /// same path as a reap. Returns the holders this call deleted.
    pub async fn revoke_pod(&self, pod: &str) -> Result<Vec<HolderRecord>, StoreError> {
        self.take_pod(pod, RevocationReason::Revoke).await
    }

    /// Waits until every listener notification started so far (by any clone) has finished. A notification
    /// that panicked is logged. Dropping this future before it ends aborts the notifications it was waiting for.
    pub async fn flush(&self) {
        loop {
            let mut running = std::mem::take(&mut *self.notifications());
            if running.is_empty() {
                return;
            }
            while let Some(done) = running.join_next().await {
                log_notification(done);
            }
        }
    }

    async fn take_pod(&self, pod: &str, reason: RevocationReason) -> Result<Vec<HolderRecord>, StoreError> {
        let mut taken = Vec::new();
        for token in self.store.pod_holders(pod).await? {
            if let Some(holder) = self.take(&token, DeleteCondition::Pod(pod), reason).await? {
                taken.push(holder);
            }
        }
        Ok(taken)
    }

    /// Deletes one holder under `condition`; if this call deleted it, decrements its levels and hands it to the
    /// listener without waiting.
    pub(crate) async fn take(
        &self,
        token: &str,
        condition: DeleteCondition<'_>,
        reason: RevocationReason,
    ) -> Result<Option<HolderRecord>, StoreError> {
        let Some(holder) = self.store.delete_holder(token, condition).await? else {
            return Ok(None);
        };
        metrics::reaped(reason.as_str());
        if let Err(e) = self.store.decrement(&holder.levels).await {
            // The holder is gone, so nobody else will decrement: reconcile repairs the counters.
            tracing::warn!(token, error = %e, "reaped holder's counters not decremented; reconcile will repair them");
        }
        tracing::info!(token, resource = %holder.resource, pod = %holder.pod, %reason, "lease reaped");
        if let Some(listener) = &self.listener {
            let (listener, h) = (listener.clone(), holder.clone());
            let mut running = self.notifications();
            while let Some(done) = running.try_join_next() {
                log_notification(done);
            }
            running.spawn(async move { listener.on_revoked(h, reason).await });
        }
        Ok(Some(holder))
    }

    fn notifications(&self) -> MutexGuard<'_, JoinSet<()>> {
        // Only spawns and joins happen under this lock; a panic there leaves the set usable.
        self.notifications.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn log_notification(done: Result<(), JoinError>) {
    if let Err(e) = done {
        tracing::warn!(error = %e, "a revocation listener failed");
    }
}
