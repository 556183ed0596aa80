//! Reconcile (spec §4): recomputing each counter from the holders that book it, to repair the drift that the crash
//! windows of the funnel leave behind.
//!
//! Two windows leave a counter above its booked holders: a pod that dies between a counter increment and the push
//! of the key into its holder, and a deleter (release, rollback, reap, revocation) that dies between deleting a
//! holder and decrementing its levels. Nothing else repairs them — the holder is gone or never learned of the slot
//! — and on a cap-1 level one such slot blocks the resource for good.
//!
//! A pass is split in two, [`Reconciler::scan`] (read, compute the plan) and [`Reconciler::apply`] (the
//! compare-and-set writes), with [`ReconcileOptions::settle`] between them in [`Reconciler::run`]; the reasons are
//! on [`Reconciler::scan`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::error::StoreError;
use crate::metrics;
use crate::store::{CounterRecord, LeaseStore};

/// Default of `vance.lease.reconcile-safety-ms`: counters changed more recently are left alone.
pub const DEFAULT_RECONCILE_SAFETY: Duration = Duration::from_secs(60);

/// Default pause between a reconcile's scan and its writes (see [`Reconciler::scan`]).
pub const DEFAULT_RECONCILE_SETTLE: Duration = Duration::from_secs(1);

/// How cautious a reconcile is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileOptions {
    /// Only counters whose `updatedAt` is at least this old by store time are examined
    /// (`vance.lease.reconcile-safety-ms`, default 60 s). It must exceed the longest time an acquisition can take
    /// between a counter increment and the push of its key into the holder.
    pub safety: Duration,
    /// Pause between the scan and the writes, when something drifted (default 1 s). It must exceed the longest
    /// time a deleter can take between deleting a holder and decrementing its levels.
    pub settle: Duration,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions { safety: DEFAULT_RECONCILE_SAFETY, settle: DEFAULT_RECONCILE_SETTLE }
    }
}

/// One counter a scan found wrong, and the value its booked holders call for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedCorrection {
    /// The counter as the scan read it: the compare-and-set expects exactly this count and `updatedAt`.
    pub counter: CounterRecord,
    /// Holders booking it, read after the counter. `0` means: delete the counter.
    pub booked: i64,
}

/// What a scan read and what it would write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcilePlan {
    /// Store time at the start of the scan.
    pub store_now_ms: i64,
    /// Counters read.
    pub examined: usize,
    /// Counters left alone because they changed within the safety margin.
    pub recent: usize,
    /// Old enough counters that equal their booked holders.
    pub in_sync: usize,
    /// Counter `_id`s that holders book but that do not exist (an under-count no crash window can produce; only
    /// reported, not created).
    pub missing: Vec<String>,
    /// The writes: drifted counters and dormant ones (count 0, nobody books them) to delete.
    pub corrections: Vec<PlannedCorrection>,
}

impl ReconcilePlan {
    /// Whether any planned write repairs a wrong count (as opposed to removing a dormant zero counter).
    pub fn has_drift(&self) -> bool {
        self.corrections.iter().any(|c| c.counter.count != c.booked)
    }
}

/// A repaired counter.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Correction {
    /// The counter's `_id`.
    pub counter: String,
    /// The count it had.
    pub from: i64,
    /// The count it has now: its booked holders.
    pub to: i64,
    /// Whether the counter was deleted because nobody books it (`to` is then 0).
    pub deleted: bool,
}

/// The outcome of a reconcile pass (camelCase JSON: the operator CLI reads it from a brain).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileReport {
    /// Counters read.
    pub examined: usize,
    /// Counters left alone because they changed within the safety margin.
    pub recent: usize,
    /// Old enough counters that equal their booked holders.
    pub in_sync: usize,
    /// Counters that holders book but that do not exist; reported only.
    pub missing: Vec<String>,
    /// Drifted counters repaired: set to their booked holders, or deleted when nobody books them.
    pub corrected: Vec<Correction>,
    /// Dormant counters (count 0, nobody books them) deleted.
    pub removed: usize,
    /// Planned writes not made because the counter changed between the scan and the write.
    pub conflicts: usize,
}

/// Runs reconcile passes on a store. Any number of pods may reconcile at once: every write is a compare-and-set.
#[derive(Debug, Clone)]
pub struct Reconciler {
    store: Arc<dyn LeaseStore>,
    options: ReconcileOptions,
}

impl Reconciler {
    /// A reconciler on `store`.
    pub fn new(store: Arc<dyn LeaseStore>, options: ReconcileOptions) -> Self {
        Reconciler { store, options }
    }

    /// Its options.
    pub fn options(&self) -> ReconcileOptions {
        self.options
    }

    /// One full pass: [`Self::scan`], then — if anything drifted — [`ReconcileOptions::settle`], then
    /// [`Self::apply`].
    pub async fn run(&self) -> Result<ReconcileReport, StoreError> {
        let plan = self.scan().await?;
        if plan.has_drift() && !self.options.settle.is_zero() {
            tokio::time::sleep(self.options.settle).await;
        }
        self.apply(plan).await
    }

    /// Reads the store's clock, then every counter, then — after the counters — how many holders book each, and
    /// plans a write for every counter that is at least `safety` old by store time and differs from its booked
    /// holders, or that nobody books.
    ///
    /// # Why this order, the safety margin and the settle pause
    ///
    /// Between one funnel step and the next a counter legitimately differs from its booked holders; reconcile
    /// must not mistake that for drift, or it would write an under-count and let the level overbook. There are
    /// exactly two such in-flight states, and both show as `count > booked`:
    ///
    /// - **An acquisition between its increment and its push.** The increment moves the counter's `updatedAt`,
    ///   and the cut-off is the store time read at the *start* of the scan: a counter incremented while the scan
    ///   runs is recent, however long the scan takes. Because the booked holders are read *after* the counter, an
    ///   increment the counter read misses can only show up as `booked > count` (its push seen, it not), and the
    ///   compare-and-set then fails on the changed count — no clock involved. Read the other way round, an
    ///   acquisition that increments and pushes between the two reads would look exactly like drift and only the
    ///   clock would save it. What remains is an increment at least `safety` older than the scan whose push is
    ///   still pending: an acquisition stalled that long between two steps is treated like a crashed one — that
    ///   is what the margin bounds.
    /// - **A deleter between its holder delete and its decrement** (release, rollback, reap, revocation). The
    ///   delete does not touch the counter, so neither `updatedAt` nor the read order can tell an in-flight
    ///   decrement from a lost one. That is what the settle pause of [`Self::run`] is for: the writes happen
    ///   `settle` after the scan, and a decrement that lands in between makes the compare-and-set fail. A deleter
    ///   slower than that is treated like a crashed one. (A counter that nobody books is deleted rather than
    ///   zeroed, and a decrement of a missing counter does nothing, so a late decrement there is harmless.)
    ///
    /// Every write is conditional on the counter's count and `updatedAt` being what this scan read: anything that
    /// changes the counter in between — an acquisition, a release, another reconciler — wins, and the counter is
    /// looked at again in a later pass.
    pub async fn scan(&self) -> Result<ReconcilePlan, StoreError> {
        let store_now_ms = self.store.store_now_ms().await?;
        let counters = self.store.counters(None).await?;
        // After the counters, never before: see above.
        let booked = self.store.booked_counts().await?;
        let safety_ms = i64::try_from(self.options.safety.as_millis()).unwrap_or(i64::MAX);
        let mut plan = ReconcilePlan { store_now_ms, examined: counters.len(), ..ReconcilePlan::default() };
        for counter in &counters {
            if store_now_ms.saturating_sub(counter.updated_at_ms) < safety_ms {
                plan.recent += 1;
                continue;
            }
            let n = booked.get(&counter.id).copied().unwrap_or(0);
            if n == counter.count && n > 0 {
                plan.in_sync += 1;
            } else {
                plan.corrections.push(PlannedCorrection { counter: counter.clone(), booked: n });
            }
        }
        let existing: HashSet<&str> = counters.iter().map(|c| c.id.as_str()).collect();
        let mut missing: Vec<String> = booked.into_keys().filter(|id| !existing.contains(id.as_str())).collect();
        missing.sort();
        plan.missing = missing;
        Ok(plan)
    }

    /// Makes the planned writes, each a compare-and-set on the count and `updatedAt` the scan read: sets a
    /// drifted counter to its booked holders, deletes a counter nobody books.
    pub async fn apply(&self, plan: ReconcilePlan) -> Result<ReconcileReport, StoreError> {
        let mut report = ReconcileReport {
            examined: plan.examined,
            recent: plan.recent,
            in_sync: plan.in_sync,
            missing: plan.missing,
            ..ReconcileReport::default()
        };
        for missing in &report.missing {
            tracing::warn!(counter = %missing, "holders book a counter that does not exist");
        }
        for PlannedCorrection { counter, booked } in plan.corrections {
            let written = if booked == 0 {
                self.store.delete_counter_if_unchanged(&counter).await?
            } else {
                self.store.set_counter_if_unchanged(&counter, booked).await?
            };
            if !written {
                report.conflicts += 1;
            } else if counter.count == booked {
                report.removed += 1;
            } else {
                metrics::reconciled("corrected");
                tracing::info!(counter = %counter.id, from = counter.count, to = booked, "counter drift corrected");
                report.corrected.push(Correction {
                    counter: counter.id,
                    from: counter.count,
                    to: booked,
                    deleted: booked == 0,
                });
            }
        }
        Ok(report)
    }
}
