//! `TexCompileTracker` (spec §7): the poll loops running on this pod, by lease token, and the `tex` lease handler.
//!
//! A poll loop registers when it holds its lease and unregisters (by dropping its [`CompileRegistration`]) when it
//! ends, however it ends — even when its future is dropped. A revocation of a running loop's lease marks it
//! aborted and wakes it: the loop stops at once, without waiting for its next `check()`. The remote job itself
//! cannot be cancelled (the service has no cancel endpoint) and expires server-side. A revocation that arrives
//! after the loop ended finds no entry and creates none.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use lease_shared::store::HolderRecord;
use lease_shared::{LeaseHandler, RevocationReason};
use serde::Serialize;
use tokio::sync::watch;

use crate::compile::TEX_LEASE_TYPE;

/// The poll loops of this pod, by lease token. Cheap to clone; clones share the loops.
#[derive(Debug, Clone, Default)]
pub struct TexCompileTracker {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    running: HashMap<String, Entry>,
    next_serial: u64,
    aborted_total: u64,
    late_revocations: u64,
}

#[derive(Debug)]
struct Entry {
    serial: u64,
    tenant_id: String,
    project_id: String,
    job_id: Option<String>,
    abort: watch::Sender<Option<RevocationReason>>,
}

/// A running poll loop, as the operator view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningCompile {
    /// The loop's lease token.
    pub token: String,
    /// The compile's tenant.
    pub tenant_id: String,
    /// The compile's project.
    pub project_id: String,
    /// The remote job, once submitted.
    pub job_id: Option<String>,
    /// Why the loop was marked aborted, if it was (it unregisters as soon as it notices).
    pub aborted: Option<String>,
}

/// What the tracker has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrackerStats {
    /// Loops registered now.
    pub running: usize,
    /// Running loops a revocation marked aborted, since start.
    pub aborted_total: u64,
    /// Revocations that found no running loop (it had ended already), since start.
    pub late_revocations: u64,
}

impl TexCompileTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent under every panic point (single map operations), so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers the poll loop holding lease `token`; it stays registered until the returned registration drops.
    pub fn register(&self, token: &str, tenant_id: &str, project_id: &str) -> CompileRegistration {
        let (abort, signal) = watch::channel(None);
        let mut state = self.state();
        state.next_serial += 1;
        let serial = state.next_serial;
        let entry =
            Entry { serial, tenant_id: tenant_id.to_owned(), project_id: project_id.to_owned(), job_id: None, abort };
        if state.running.insert(token.to_owned(), entry).is_some() {
            tracing::warn!(token, "a tex compile registered a lease token that was already registered");
        }
        CompileRegistration { tracker: self.clone(), token: token.to_owned(), serial, signal }
    }

    /// Marks the loop holding `token` aborted and wakes it. Returns whether a running loop was found; a token
    /// without one (the loop ended, or never ran here) leaves nothing behind.
    pub fn revoke(&self, token: &str, reason: RevocationReason) -> bool {
        let mut state = self.state();
        let State { running, aborted_total, late_revocations, .. } = &mut *state;
        match running.get(token) {
            Some(entry) => {
                let first = entry.abort.send_if_modified(|current| {
                    let unmarked = current.is_none();
                    if unmarked {
                        *current = Some(reason);
                    }
                    unmarked
                });
                if first {
                    *aborted_total += 1;
                }
                true
            }
            None => {
                *late_revocations += 1;
                false
            }
        }
    }

    /// The loops registered now.
    pub fn running(&self) -> Vec<RunningCompile> {
        let state = self.state();
        let mut running: Vec<RunningCompile> = state
            .running
            .iter()
            .map(|(token, e)| RunningCompile {
                token: token.clone(),
                tenant_id: e.tenant_id.clone(),
                project_id: e.project_id.clone(),
                job_id: e.job_id.clone(),
                aborted: e.abort.borrow().map(|r| r.as_str().to_owned()),
            })
            .collect();
        running.sort_by(|a, b| a.token.cmp(&b.token));
        running
    }

    /// Counts of running, aborted and late.
    pub fn stats(&self) -> TrackerStats {
        let state = self.state();
        TrackerStats {
            running: state.running.len(),
            aborted_total: state.aborted_total,
            late_revocations: state.late_revocations,
        }
    }

    /// Whether no loop is registered.
    pub fn is_empty(&self) -> bool {
        self.state().running.is_empty()
    }

    fn unregister(&self, token: &str, serial: u64) {
        let mut state = self.state();
        // Only our own entry: a (theoretical) re-registration of the token is not ours to remove.
        if state.running.get(token).is_some_and(|e| e.serial == serial) {
            state.running.remove(token);
        }
    }

    fn set_job_id(&self, token: &str, serial: u64, job_id: &str) {
        if let Some(e) = self.state().running.get_mut(token).filter(|e| e.serial == serial) {
            e.job_id = Some(job_id.to_owned());
        }
    }
}

/// A poll loop's registration: the abort flag it checks every iteration. Dropping it unregisters the loop.
#[derive(Debug)]
pub struct CompileRegistration {
    tracker: TexCompileTracker,
    token: String,
    serial: u64,
    signal: watch::Receiver<Option<RevocationReason>>,
}

impl CompileRegistration {
    /// The lease token the loop is registered under.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Records the remote job id (for the operator view).
    pub fn set_job_id(&self, job_id: &str) {
        self.tracker.set_job_id(&self.token, self.serial, job_id);
    }

    /// Why the loop was aborted, if a revocation marked it.
    pub fn aborted(&self) -> Option<RevocationReason> {
        *self.signal.borrow()
    }

    /// Resolves once a revocation marks the loop aborted (at once if it already is).
    pub async fn abort_signal(&mut self) -> RevocationReason {
        // The guard `wait_for` returns must not live across an await.
        let marked = self.signal.wait_for(Option::is_some).await.map(|reason| *reason);
        match marked {
            Ok(reason) => reason.unwrap_or(RevocationReason::Revoke),
            // The sender lives in our own entry, which only our drop removes: unreachable, but never resolve.
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for CompileRegistration {
    fn drop(&mut self) {
        self.tracker.unregister(&self.token, self.serial);
    }
}

/// The `tex` lease handler: a revocation marks the running poll loop of the lease aborted. The handler is
/// pod-bound (the poll state lives in the pod), so it only ever runs on the holder's own pod.
#[derive(Debug, Clone)]
pub struct TexLeaseHandler {
    tracker: TexCompileTracker,
}

impl TexLeaseHandler {
    /// A handler aborting the loops of `tracker`.
    pub fn new(tracker: TexCompileTracker) -> Self {
        TexLeaseHandler { tracker }
    }
}

#[async_trait]
impl LeaseHandler for TexLeaseHandler {
    fn lease_type(&self) -> &str {
        TEX_LEASE_TYPE
    }

    async fn on_revoked(&self, holder: &HolderRecord, reason: RevocationReason) -> Result<(), String> {
        let job_id = holder.payload.get("jobId").and_then(|v| v.as_str()).unwrap_or_default();
        if self.tracker.revoke(&holder.token, reason) {
            tracing::info!(
                token = %holder.token,
                tenant = %holder.tenant_id,
                project = %holder.project_id,
                job_id,
                reason = reason.as_str(),
                "tex compile aborted by revocation; the remote job cannot be cancelled and expires server-side"
            );
        } else {
            tracing::debug!(
                token = %holder.token,
                job_id,
                reason = reason.as_str(),
                "revoked tex lease has no running compile here (it ended already); nothing to abort"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_shared::store::HolderState;

    fn holder(token: &str) -> HolderRecord {
        HolderRecord {
            token: token.into(),
            lease_type: "tex".into(),
            lease: "tex".into(),
            resource: "tex2pdf".into(),
            tenant_id: "t1".into(),
            project_id: "p1".into(),
            user_id: Some("u1".into()),
            holder_ref: "run-1".into(),
            pod: "pod-a".into(),
            pod_bound: true,
            state: HolderState::Held,
            levels: vec![],
            payload: serde_json::json!({ "jobId": "j-1" }).as_object().cloned().unwrap_or_default(),
            ttl_seconds: 120,
            acquired_at_ms: 0,
            last_seen_at_ms: 0,
        }
    }

    #[test]
    fn register_and_unregister_by_drop() {
        let tracker = TexCompileTracker::new();
        let a = tracker.register("tok-a", "t1", "p1");
        let b = tracker.register("tok-b", "t1", "p2");
        a.set_job_id("j-a");
        let running = tracker.running();
        assert_eq!(running.iter().map(|r| r.token.as_str()).collect::<Vec<_>>(), ["tok-a", "tok-b"]);
        assert_eq!(running[0].job_id.as_deref(), Some("j-a"));
        assert_eq!(running[1].job_id, None);
        drop(a);
        assert_eq!(tracker.stats().running, 1);
        drop(b);
        assert!(tracker.is_empty());
        assert_eq!(tracker.stats(), TrackerStats::default());
    }

    #[tokio::test]
    async fn revocation_marks_the_running_loop_and_wakes_it() {
        let tracker = TexCompileTracker::new();
        let mut reg = tracker.register("tok", "t1", "p1");
        assert_eq!(reg.aborted(), None);
        let waiter = tokio::spawn(async move {
            let reason = reg.abort_signal().await;
            (reason, reg)
        });
        let handler = TexLeaseHandler::new(tracker.clone());
        assert_eq!(handler.lease_type(), "tex");
        handler.on_revoked(&holder("tok"), RevocationReason::Revoke).await.unwrap();
        let (reason, reg) = waiter.await.unwrap();
        assert_eq!(reason, RevocationReason::Revoke);
        assert_eq!(reg.aborted(), Some(RevocationReason::Revoke));
        assert_eq!(tracker.running()[0].aborted.as_deref(), Some("revoke"));
        // A second notification of the same revocation counts once and keeps the first reason.
        assert!(tracker.revoke("tok", RevocationReason::Idle));
        assert_eq!(reg.aborted(), Some(RevocationReason::Revoke));
        assert_eq!(tracker.stats(), TrackerStats { running: 1, aborted_total: 1, late_revocations: 0 });
        drop(reg);
        assert!(tracker.is_empty());
    }

    #[tokio::test]
    async fn a_revocation_after_the_loop_ended_leaves_nothing_behind() {
        let tracker = TexCompileTracker::new();
        drop(tracker.register("tok", "t1", "p1"));
        TexLeaseHandler::new(tracker.clone()).on_revoked(&holder("tok"), RevocationReason::Idle).await.unwrap();
        assert!(!tracker.revoke("never-registered", RevocationReason::Revoke));
        assert!(tracker.is_empty(), "a late revocation created an entry");
        assert_eq!(tracker.stats(), TrackerStats { running: 0, aborted_total: 0, late_revocations: 2 });
        // A later loop under another token starts unaborted.
        let reg = tracker.register("tok-2", "t1", "p1");
        assert_eq!(reg.aborted(), None);
    }

    #[test]
    fn an_old_registration_does_not_remove_a_newer_one_of_the_same_token() {
        let tracker = TexCompileTracker::new();
        let old = tracker.register("tok", "t1", "p1");
        let new = tracker.register("tok", "t1", "p1");
        drop(old);
        assert_eq!(tracker.stats().running, 1);
        drop(new);
        assert!(tracker.is_empty());
    }
}
