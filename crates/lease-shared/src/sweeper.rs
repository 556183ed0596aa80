//! The scheduled sweep (spec §5): every `vance.lease.reap-interval`, idle reap, dead-pod reap and reconcile, on a
//! background task each service owns — and the same round on demand ([`LeaseSweeper::sweep_once`]), for the
//! operator's `lease sweep` and for tests.
//!
//! Any number of pods may sweep at once: every reap is a conditional find-and-delete whose winner alone
//! decrements and notifies, and every reconcile write is a compare-and-set.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::{JoinError, JoinHandle};

use crate::error::StoreError;
use crate::reap::{PodLiveness, Reaper, RevocationReason};
use crate::reconcile::{ReconcileOptions, ReconcileReport, Reconciler};
use crate::service::ResourceLeaseService;
use crate::store::LeaseStore;

/// Default of `vance.lease.reap-interval`.
pub const DEFAULT_REAP_INTERVAL: Duration = Duration::from_secs(30);

/// How a pod sweeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweeperConfig {
    /// The sweeping pod's own id: always alive, never asked about, its holders never pod-reaped.
    pub pod: String,
    /// Pause between the end of one round and the start of the next (`vance.lease.reap-interval`, default 30 s).
    pub reap_interval: Duration,
    /// Reconcile's safety margin (`vance.lease.reconcile-safety-ms`, default 60 s) and settle pause.
    pub reconcile: ReconcileOptions,
}

impl SweeperConfig {
    /// The defaults, for `pod`.
    pub fn new(pod: impl Into<String>) -> Self {
        SweeperConfig { pod: pod.into(), reap_interval: DEFAULT_REAP_INTERVAL, reconcile: ReconcileOptions::default() }
    }
}

/// What one sweep round did (camelCase JSON: the operator CLI reads it from a brain).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepReport {
    /// Idle holders this round deleted (reason `idle`).
    pub idle: usize,
    /// Holders of dead pods this round deleted (reason `pod`).
    pub pod: usize,
    /// The pods found dead, in store order.
    pub dead_pods: Vec<String>,
    /// The reconcile pass.
    pub reconcile: ReconcileReport,
}

impl SweepReport {
    /// Holders this round deleted for `reason` (`revoke` is never part of a sweep: always 0).
    pub fn reaped(&self, reason: RevocationReason) -> usize {
        match reason {
            RevocationReason::Idle => self.idle,
            RevocationReason::Pod => self.pod,
            RevocationReason::Revoke => 0,
        }
    }
}

/// One pod's sweeper: idle reap, dead-pod reap and reconcile.
#[derive(Debug, Clone)]
pub struct LeaseSweeper {
    store: Arc<dyn LeaseStore>,
    reaper: Reaper,
    reconciler: Reconciler,
    liveness: Option<Arc<dyn PodLiveness>>,
    pod: String,
    interval: Duration,
}

impl LeaseSweeper {
    /// A sweeper over `service`'s store, reaping through its reaper (and so its revocation listener). Without
    /// `liveness` no pod is ever judged dead: idle reap and reconcile only.
    pub fn new(service: &ResourceLeaseService, config: SweeperConfig, liveness: Option<Arc<dyn PodLiveness>>) -> Self {
        LeaseSweeper {
            store: service.store().clone(),
            reaper: service.reaper().clone(),
            reconciler: Reconciler::new(service.store().clone(), config.reconcile),
            liveness,
            pod: config.pod,
            interval: config.reap_interval,
        }
    }

    /// One round now: idle reap, dead-pod reap, reconcile — in this order, so that reconcile sees the reaps'
    /// decrements. Stops at the first store error (the next round starts over). Revocation listeners run in
    /// the background; [`Reaper::flush`] waits for them.
    pub async fn sweep_once(&self) -> Result<SweepReport, StoreError> {
        let idle = self.reaper.reap_idle(None).await?;
        let (pod, dead_pods) = self.reap_dead_pods().await?;
        let reconcile = self.reconciler.run().await?;
        Ok(SweepReport { idle, pod, dead_pods, reconcile })
    }

    /// Asks the liveness about every pod that holds a lease — except this pod and holders without a pod — and
    /// reaps every holder of each dead one. Returns the holders deleted and the dead pods.
    pub async fn reap_dead_pods(&self) -> Result<(usize, Vec<String>), StoreError> {
        let Some(liveness) = &self.liveness else { return Ok((0, Vec::new())) };
        let (mut reaped, mut dead) = (0, Vec::new());
        for pod in self.store.holder_pods().await? {
            if pod.is_empty() || pod == self.pod || liveness.is_alive(&pod).await {
                continue;
            }
            reaped += self.reaper.reap_pod(&pod).await?;
            dead.push(pod);
        }
        Ok((reaped, dead))
    }

    /// Starts the scheduled sweep on a task of its own: a round every `reap_interval` (the first one interval
    /// after the start), until [`SweeperHandle::shutdown`].
    ///
    /// A round in progress is never cut short — cancelling it between a holder delete and its decrement would
    /// itself leave drift — so shutdown waits for the current round to end.
    pub fn spawn(self) -> SweeperHandle {
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let (rounds_tx, rounds_rx) = watch::channel(0_u64);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    // A shutdown, or the handle dropped (which ends the loop the same way, just unjoined).
                    _ = &mut stop_rx => break,
                    () = tokio::time::sleep(self.interval) => {}
                }
                match self.sweep_once().await {
                    Ok(r) => tracing::debug!(
                        pod = %self.pod,
                        idle = r.idle,
                        dead_pod = r.pod,
                        corrected = r.reconcile.corrected.len(),
                        removed = r.reconcile.removed,
                        "lease sweep round"
                    ),
                    Err(e) => {
                        tracing::warn!(pod = %self.pod, error = %e, "lease sweep round failed; retrying next round")
                    }
                }
                rounds_tx.send_modify(|n| *n += 1);
            }
            self.reaper.flush().await;
        });
        SweeperHandle { stop: stop_tx, task, rounds: rounds_rx }
    }
}

/// The running scheduled sweep of [`LeaseSweeper::spawn`]. Call [`SweeperHandle::shutdown`]. Dropping the handle
/// instead also stops the sweep after the round in progress — never in the middle of one — but nobody waits for
/// it.
#[derive(Debug)]
pub struct SweeperHandle {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    rounds: watch::Receiver<u64>,
}

impl SweeperHandle {
    /// The number of rounds finished so far (successful or not), to watch.
    pub fn rounds(&self) -> watch::Receiver<u64> {
        self.rounds.clone()
    }

    /// Stops the sweep and waits for its task to end: the current round finishes, no new one starts, and the
    /// revocation notifications still running are awaited. An error means the task panicked.
    pub async fn shutdown(self) -> Result<(), JoinError> {
        // The task may be gone already (it panicked); the join reports that.
        let _ = self.stop.send(());
        self.task.await
    }
}
