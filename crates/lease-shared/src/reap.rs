//! Reaping (spec §5): deleting holders on behalf of someone else, returning their slots, and handing them to the
//! revocation listener so that the resource behind them is cleaned up.
//!
//! Every path here is "find-and-delete, then decrement what the deleted document booked": whoever deletes a
//! holder owns its decrement, so any number of reapers, releases and revocations may race.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{LeaseError, StoreError};
use crate::metrics;
use crate::store::{DeleteCondition, HolderRecord, LeaseStore};

/// Why a holder was taken away from its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// The cleanup of one lease type (`tex`, `mcp`, `webhook`): runs when a holder of that type is revoked, never on
/// a regular release.
#[async_trait]
pub trait LeaseHandler: Send + Sync + fmt::Debug + 'static {
    /// The type this handler serves.
    fn lease_type(&self) -> &str;

    /// Cleans up the resource of a revoked holder, using its payload.
    async fn on_revoked(&self, holder: &HolderRecord, reason: RevocationReason) -> Result<(), String>;
}

/// Deletes holders for others: idle reap and revocation.
#[derive(Debug, Clone)]
pub struct Reaper {
    store: Arc<dyn LeaseStore>,
    listener: Option<Arc<dyn LeaseRevocationListener>>,
}

impl Reaper {
    pub(crate) fn new(store: Arc<dyn LeaseStore>, listener: Option<Arc<dyn LeaseRevocationListener>>) -> Self {
        Reaper { store, listener }
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

    /// An operator's revocation of one holder, optionally bound to `tenant` (part of the delete filter).
    /// `LEASE_LOST` if there is no such holder (in that tenant).
    pub async fn revoke(&self, token: &str, tenant: Option<&str>) -> Result<HolderRecord, LeaseError> {
        let condition = tenant.map_or(DeleteCondition::Any, DeleteCondition::Tenant);
        self.take(token, condition, RevocationReason::Revoke)
            .await?
            .ok_or_else(|| LeaseError::Lost { token: token.to_owned() })
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
            tokio::spawn(async move { listener.on_revoked(h, reason).await });
        }
        Ok(Some(holder))
    }
}
