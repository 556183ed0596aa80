//! Reaping, revocation and reconcile (spec §4 "Reconcile", §5, §9): the idle and dead-pod reaps, operator
//! revocation, the crash windows of the funnel and their repair, and the scheduled sweeper. Every test runs
//! against the in-memory store (manual clock) and the real MongoDB (server time, short TTLs).

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease_shared::reconcile::ReconcileOptions;
use lease_shared::store::{CounterKey, CounterRecord, HolderRecord};
use lease_shared::{
    Lease, LeaseError, LeaseRevocationListener, LeaseSweeper, PodLiveness, Reconciler, ReleaseOutcome,
    ResourceLeaseService, RevocationReason, SweeperConfig,
};
use support::faulty::{Fault, FaultyStore};
use support::{Backend, Fixture, def, request, service_on};

on_both_stores!(
    idle_holder_is_reaped_after_its_ttl_never_before,
    check_keeps_a_lease_alive_across_many_ttls,
    racing_sweepers_reap_each_idle_holder_once_and_notify_once,
    lazy_sweep_hands_holders_to_the_listener_without_waiting_for_it,
    dead_pod_reap_frees_every_slot_of_the_dead_pod_and_none_of_a_live_pod,
    revocation_of_a_holder_and_of_a_pod_returns_slots_and_notifies_revoke,
    each_crash_window_leaves_drift_that_reconcile_repairs_only_after_the_safety_margin,
    reconcile_never_writes_a_counter_that_changed_between_read_and_write,
    racing_reconcilers_correct_each_counter_once,
    counters_nobody_books_are_deleted_by_reconcile,
    release_racing_reaps_decrements_once_in_total,
    release_and_reap_interleaved_at_every_step_decrement_once,
    release_in_flight_during_reconcile_is_not_mistaken_for_drift,
    drift_on_a_full_counter_is_repaired_while_acquirers_keep_polling,
    sweeper_runs_repeatedly_and_stops_cleanly_on_shutdown,
    store_time_and_counter_primitives,
);

/// A one-second TTL: MongoDB tests wait in real time.
const BRIEF: &str = "name: brief\nlevels: {user: 1, global: 50}\nttlSeconds: 1\n";

/// The reconcile safety margin of the tests: the default on the manual clock, 2 s of real server time on MongoDB.
fn safety(backend: Backend) -> Duration {
    match backend {
        Backend::Memory => lease_shared::reconcile::DEFAULT_RECONCILE_SAFETY,
        Backend::Mongo(_) => Duration::from_secs(2),
    }
}

fn safety_ms(backend: Backend) -> u64 {
    safety(backend).as_millis() as u64
}

fn options(backend: Backend) -> ReconcileOptions {
    ReconcileOptions { safety: safety(backend), settle: Duration::from_millis(20) }
}

fn sweeper(
    svc: &ResourceLeaseService,
    pod: &str,
    liveness: Option<Arc<dyn PodLiveness>>,
    backend: Backend,
) -> LeaseSweeper {
    let config =
        SweeperConfig { pod: pod.to_owned(), reap_interval: Duration::from_secs(30), reconcile: options(backend) };
    LeaseSweeper::new(svc, config, liveness)
}

/// A revocation listener that records what it is handed.
#[derive(Debug, Default)]
struct Revocations(Mutex<Vec<(String, RevocationReason)>>);

impl Revocations {
    fn seen(&self) -> Vec<(String, RevocationReason)> {
        self.0.lock().unwrap().clone()
    }

    /// Asserts that exactly `tokens` were handed over, each once, all for `reason`.
    fn assert_exactly(&self, tokens: &HashSet<String>, reason: RevocationReason) {
        let seen = self.seen();
        let mut per_token: HashMap<&str, usize> = HashMap::new();
        for (t, r) in &seen {
            assert_eq!(*r, reason, "{t} revoked for {r}, expected {reason}");
            *per_token.entry(t).or_default() += 1;
        }
        for (t, n) in &per_token {
            assert_eq!(*n, 1, "{t} handed to the listener {n} times");
        }
        let seen_tokens: HashSet<String> = per_token.keys().map(|t| t.to_string()).collect();
        assert_eq!(&seen_tokens, tokens, "the listener got other holders than those revoked");
    }
}

#[async_trait]
impl LeaseRevocationListener for Revocations {
    async fn on_revoked(&self, holder: HolderRecord, reason: RevocationReason) {
        self.0.lock().unwrap().push((holder.token, reason));
    }
}

fn listener(rev: &Arc<Revocations>) -> Option<Arc<dyn LeaseRevocationListener>> {
    Some(rev.clone())
}

/// A pod registry for tests: the listed pods are dead; remembers whom it was asked about.
#[derive(Debug, Default)]
struct Pods {
    dead: HashSet<String>,
    asked: Mutex<Vec<String>>,
}

impl Pods {
    fn dead(pods: &[&str]) -> Arc<Self> {
        Arc::new(Pods { dead: pods.iter().map(|p| p.to_string()).collect(), asked: Mutex::default() })
    }
}

#[async_trait]
impl PodLiveness for Pods {
    async fn is_alive(&self, pod: &str) -> bool {
        self.asked.lock().unwrap().push(pod.to_owned());
        !self.dead.contains(pod)
    }
}

fn token(lease: &Lease) -> String {
    lease.token().expect("a held lease").to_owned()
}

fn is_lost<T: std::fmt::Debug>(r: Result<T, LeaseError>) -> bool {
    matches!(r, Err(LeaseError::Lost { .. }))
}

/// Sweeps (and lets 100 ms of store time pass) until `token` is gone; asserts that no sweep ending before
/// `expires_ms` (store time) took it.
async fn sweep_until_reaped(fx: &Fixture, sweeper: &LeaseSweeper, token: &str, expires_ms: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let report = sweeper.sweep_once().await.unwrap();
        let swept_by = fx.raw.store_now_ms().await.unwrap();
        match fx.raw.holder(token).await.unwrap() {
            Some(_) => assert_eq!(report.idle, 0, "another holder was reaped"),
            None => {
                assert!(swept_by > expires_ms, "reaped by store time {swept_by}, but idle only after {expires_ms}");
                assert_eq!(report.idle, 1);
                return;
            }
        }
        assert!(Instant::now() < deadline, "an idle holder was never reaped");
        fx.pass_time(100).await;
    }
}

async fn idle_holder_is_reaped_after_its_ttl_never_before(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let rev = Arc::new(Revocations::default());
    let svc = service_on(fx.store.clone(), &[def(BRIEF)], listener(&rev));
    let sweeper = sweeper(&svc, "pod-s", None, backend);
    let lease = svc.acquire(request("brief", "t1", "p1", "u1")).await.unwrap();
    let t = token(&lease);
    let h = fx.raw.holder(&t).await.unwrap().unwrap();
    sweep_until_reaped(&fx, &sweeper, &t, h.last_seen_at_ms + 1000).await;

    assert!(is_lost(lease.check().await), "a reaped holder's check must be LEASE_LOST");
    svc.reaper().flush().await;
    rev.assert_exactly(&HashSet::from([t]), RevocationReason::Idle);
    assert_eq!(fx.counts().await.get("brief|user|t1/u1").copied().unwrap_or(0), 0);
    fx.assert_counters_match_holders().await;
    fx.drop_database().await;
}

async fn check_keeps_a_lease_alive_across_many_ttls(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def(BRIEF)]);
    let sweeper = sweeper(&svc, "pod-s", None, backend);
    let lease = svc.acquire(request("brief", "t1", "p1", "u1")).await.unwrap();
    let t = token(&lease);
    // 12 × 400 ms: almost five TTLs, each gap between two checks well inside one.
    for round in 0..12 {
        fx.pass_time(400).await;
        lease.check().await.unwrap_or_else(|e| panic!("round {round}: a checked lease was lost: {e}"));
        assert_eq!(sweeper.sweep_once().await.unwrap().idle, 0, "round {round}: a checked lease was reaped");
        assert!(fx.raw.holder(&t).await.unwrap().is_some());
    }
    // Without checks, the TTL runs out.
    let last_seen = fx.raw.holder(&t).await.unwrap().unwrap().last_seen_at_ms;
    sweep_until_reaped(&fx, &sweeper, &t, last_seen + 1000).await;
    assert!(is_lost(lease.check().await));
    fx.drop_database().await;
}

async fn racing_sweepers_reap_each_idle_holder_once_and_notify_once(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let defs = [def("name: many\nlevels: {tenant: 100}\nttlSeconds: 1\n")];
    let rev = Arc::new(Revocations::default());
    let services = [
        service_on(fx.store.clone(), &defs, listener(&rev)),
        service_on(fx.second_store().await, &defs, listener(&rev)),
        service_on(fx.second_store().await, &defs, listener(&rev)),
    ];
    let mut leases = Vec::new();
    for u in 0..30 {
        leases.push(services[0].acquire(request("many", "t1", "p1", &format!("u{u}"))).await.unwrap());
    }
    fx.pass_time(1_500).await;

    let barrier = Arc::new(tokio::sync::Barrier::new(services.len()));
    let tasks: Vec<_> = services
        .iter()
        .enumerate()
        .map(|(i, svc)| {
            let (sweeper, barrier) = (sweeper(svc, &format!("pod-{i}"), None, backend), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let mut reaped = 0;
                for _ in 0..3 {
                    reaped += sweeper.sweep_once().await.unwrap().idle;
                }
                reaped
            })
        })
        .collect();
    let mut per_sweeper = Vec::new();
    for t in tasks {
        per_sweeper.push(t.await.unwrap());
    }
    eprintln!("reaped per sweeper: {per_sweeper:?}");
    assert_eq!(per_sweeper.iter().sum::<usize>(), 30, "each idle holder is reaped by exactly one sweeper");
    for svc in &services {
        svc.reaper().flush().await;
    }
    rev.assert_exactly(&leases.iter().map(token).collect(), RevocationReason::Idle);
    for lease in &leases {
        assert!(is_lost(lease.check().await));
    }
    assert_eq!(fx.counts().await.get("many|tenant|t1").copied().unwrap_or(0), 0, "decremented more than once");
    fx.assert_counters_match_holders().await;
    fx.drop_database().await;
}

/// A listener that blocks until released: proves that reaping does not wait for it.
#[derive(Debug)]
struct Gated {
    gate: tokio::sync::Semaphore,
    seen: Revocations,
}

#[async_trait]
impl LeaseRevocationListener for Gated {
    async fn on_revoked(&self, holder: HolderRecord, reason: RevocationReason) {
        self.gate.acquire().await.unwrap().forget();
        self.seen.on_revoked(holder, reason).await;
    }
}

async fn lazy_sweep_hands_holders_to_the_listener_without_waiting_for_it(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let gated = Arc::new(Gated { gate: tokio::sync::Semaphore::new(0), seen: Revocations::default() });
    let svc =
        service_on(fx.store.clone(), &[def("name: solo\nlevels: {project: 1}\nttlSeconds: 1\n")], Some(gated.clone()));
    let first = svc.acquire(request("solo", "t1", "p1", "u1")).await.unwrap();
    assert_eq!(svc.acquire(request("solo", "t1", "p1", "u2")).await.unwrap_err().code(), "LEASE_BUSY");
    fx.pass_time(1_500).await;

    // The full level is swept by the acquire itself; the listener is still blocked, and the acquire does not wait.
    let second = tokio::time::timeout(Duration::from_secs(60), svc.acquire(request("solo", "t1", "p1", "u2")))
        .await
        .expect("the acquire waited for the revocation listener")
        .expect("the idle holder is swept by the acquire");
    assert!(gated.seen.seen().is_empty(), "the listener ran although it was blocked");
    assert!(is_lost(first.check().await));

    gated.gate.add_permits(1);
    svc.reaper().flush().await;
    gated.seen.assert_exactly(&HashSet::from([token(&first)]), RevocationReason::Idle);
    second.release().await.unwrap();
    fx.drop_database().await;
}

async fn dead_pod_reap_frees_every_slot_of_the_dead_pod_and_none_of_a_live_pod(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let rev = Arc::new(Revocations::default());
    let svc = service_on(fx.store.clone(), &[def("name: wide\nlevels: {tenant: 100, global: 100}\n")], listener(&rev));
    // pod-a is the sweeping pod; "" is a holder acquired without a pod.
    let pods = ["pod-a", "pod-b", "pod-c", ""];
    let mut leases: Vec<(&str, Lease)> = Vec::new();
    for pod in pods {
        for u in 0..3 {
            let req = request("wide", "t1", "p1", &format!("{pod}u{u}")).pod(pod, u % 2 == 0);
            leases.push((pod, svc.acquire(req).await.unwrap()));
        }
    }
    assert_eq!(fx.raw.holder_pods().await.unwrap(), ["", "pod-a", "pod-b", "pod-c"]);
    // The registry even calls the sweeping pod dead (a missing heartbeat): it is never asked, never reaped.
    let registry = Pods::dead(&["pod-a", "pod-b"]);
    let sweeper = sweeper(&svc, "pod-a", Some(registry.clone()), backend);

    let report = sweeper.sweep_once().await.unwrap();
    assert_eq!((report.pod, report.dead_pods.as_slice()), (3, ["pod-b".to_owned()].as_slice()));
    let mut asked = registry.asked.lock().unwrap().clone();
    asked.sort();
    assert_eq!(asked, ["pod-b", "pod-c"], "the own pod and pod-less holders are never asked about");
    for (pod, lease) in &leases {
        if *pod == "pod-b" {
            assert!(is_lost(lease.check().await), "a holder of the dead pod survived");
        } else {
            lease.check().await.unwrap_or_else(|e| panic!("a holder of live pod {pod:?} was reaped: {e}"));
        }
    }
    let counts = fx.counts().await;
    assert_eq!((counts["wide|tenant|t1"], counts["wide|global|*"]), (9, 9), "the dead pod's slots were not freed");
    fx.assert_counters_match_holders().await;
    svc.reaper().flush().await;
    let dead: HashSet<String> = leases.iter().filter(|(p, _)| *p == "pod-b").map(|(_, l)| token(l)).collect();
    rev.assert_exactly(&dead, RevocationReason::Pod);

    let again = sweeper.sweep_once().await.unwrap();
    assert_eq!((again.pod, again.dead_pods.len()), (0, 0), "a dead pod without holders is not a reap target");
    fx.drop_database().await;
}

async fn revocation_of_a_holder_and_of_a_pod_returns_slots_and_notifies_revoke(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let rev = Arc::new(Revocations::default());
    let svc = service_on(fx.store.clone(), &[def("name: ops\nlevels: {global: 10}\n")], listener(&rev));
    let mut on_x = Vec::new();
    for u in 0..3 {
        on_x.push(svc.acquire(request("ops", "t1", "p1", &format!("u{u}")).pod("pod-x", true)).await.unwrap());
    }
    let t1_on_y = svc.acquire(request("ops", "t1", "p1", "u9").pod("pod-y", false)).await.unwrap();
    let t2_on_y = svc.acquire(request("ops", "t2", "p1", "u9").pod("pod-y", false)).await.unwrap();

    // Tenant binding is in the delete filter: another tenant's token is "not found" and stays.
    let err = svc.reaper().revoke(&token(&t1_on_y), Some("t2")).await.unwrap_err();
    assert_eq!(err.code(), "LEASE_LOST");
    t1_on_y.check().await.expect("a refused revocation must leave the holder alone");
    let revoked = svc.reaper().revoke(&token(&t1_on_y), Some("t1")).await.unwrap();
    assert_eq!(revoked.token, token(&t1_on_y));
    assert!(is_lost(t1_on_y.check().await));
    assert_eq!(svc.reaper().revoke(&token(&t1_on_y), None).await.unwrap_err().code(), "LEASE_LOST");

    let by_pod = svc.reaper().revoke_pod("pod-x").await.unwrap();
    assert_eq!(by_pod.iter().map(|h| h.token.clone()).collect::<HashSet<_>>(), on_x.iter().map(token).collect());
    for lease in &on_x {
        assert!(is_lost(lease.check().await));
    }
    assert!(svc.reaper().revoke_pod("pod-x").await.unwrap().is_empty(), "revoked twice");
    t2_on_y.check().await.unwrap();
    assert_eq!(fx.counts().await["ops|global|*"], 1);
    fx.assert_counters_match_holders().await;

    svc.reaper().flush().await;
    let expected: HashSet<String> = on_x.iter().map(token).chain([token(&t1_on_y)]).collect();
    rev.assert_exactly(&expected, RevocationReason::Revoke);
    fx.drop_database().await;
}

const WIN: &str = "name: win\nlevels: {user: 1, project: 2, tenant: 3}\nttlSeconds: 600\n";
const TIGHT: &str = "name: tight\nlevels: {user: 1, project: 1}\nttlSeconds: 600\n";

/// `(from, to)` per drifted counter, as reconcile should correct it.
type Drift = BTreeMap<String, (i64, i64)>;

async fn each_crash_window_leaves_drift_that_reconcile_repairs_only_after_the_safety_margin(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let defs = [def(WIN), def(TIGHT)];
    // The crashing pod's service: every crash below stops it dead at one call, so nothing it would do next — a
    // rollback, a decrement — happens. It is revived for the next scenario (as a restarted pod).
    let svc = fx.service(&defs);
    let warm = |tenant: &'static str| {
        let svc = svc.clone();
        async move { svc.acquire(request("win", tenant, "p1", "u1")).await.unwrap().release().await.unwrap() }
    };
    let mut expected = Drift::new();
    let mut keep = Vec::new();

    // A: increment, then the pod dies before the push (counters warm: one increment and one push per level).
    warm("ta").await;
    fx.store.crash_on("push_level", 1, Fault::Before);
    assert_eq!(svc.acquire(request("win", "ta", "p1", "u1")).await.unwrap_err().code(), "LEASE_UNAVAILABLE");
    fx.store.revive();
    expected.insert("win|user|ta/u1".into(), (1, 0));

    // B: the same at the second level, on a counter another holder books too.
    keep.push(svc.acquire(request("win", "tb", "p1", "u0")).await.unwrap());
    warm("tb").await;
    fx.store.crash_on("push_level", 2, Fault::Before);
    assert!(svc.acquire(request("win", "tb", "p1", "u1")).await.is_err());
    fx.store.revive();
    expected.insert("win|project|tb/p1".into(), (2, 1));

    // C: the third increment applies, the pod dies before hearing back.
    warm("tc").await;
    fx.store.crash_on("try_increment", 3, Fault::After);
    assert!(svc.acquire(request("win", "tc", "p1", "u1")).await.is_err());
    fx.store.revive();
    expected.insert("win|tenant|tc".into(), (1, 0));

    // D: a release deletes the holder, the pod dies before the decrement.
    let lease = svc.acquire(request("win", "td", "p1", "u1")).await.unwrap();
    fx.store.crash_on("decrement", 1, Fault::Before);
    assert!(lease.release().await.is_err());
    fx.store.revive();
    for id in ["win|user|td/u1", "win|project|td/p1", "win|tenant|td"] {
        expected.insert(id.into(), (1, 0));
    }

    // E: the release's delete applies, the pod dies before hearing back.
    let lease = svc.acquire(request("win", "te", "p1", "u1")).await.unwrap();
    fx.store.crash_on("delete_holder", 1, Fault::After);
    assert!(lease.release().await.is_err());
    fx.store.revive();
    for id in ["win|user|te/u1", "win|project|te/p1", "win|tenant|te"] {
        expected.insert(id.into(), (1, 0));
    }

    // F: a full level rolls back; the rollback's delete applies and the pod dies before the decrement.
    keep.push(svc.acquire(request("tight", "tf", "p1", "u0")).await.unwrap());
    fx.store.crash_on("delete_holder", 1, Fault::After);
    assert!(svc.acquire(request("tight", "tf", "p1", "u1")).await.is_err());
    fx.store.revive();
    expected.insert("tight|user|tf/u1".into(), (1, 0));

    // G: a reaper (an operator's revocation) deletes the holder and dies before the decrement.
    let lease = svc.acquire(request("win", "tg", "p1", "u1")).await.unwrap();
    fx.store.crash_on("delete_holder", 1, Fault::After);
    assert!(svc.reaper().revoke(&token(&lease), None).await.is_err());
    fx.store.revive();
    for id in ["win|user|tg/u1", "win|project|tg/p1", "win|tenant|tg"] {
        expected.insert(id.into(), (1, 0));
    }

    // Every window left an over-count, never an under-count.
    let (counts, booked) = (fx.counts().await, fx.booked().await);
    for (id, (from, to)) in &expected {
        assert_eq!((counts[id], booked.get(id).copied().unwrap_or(0)), (*from, *to), "{id}: (count, booked)");
    }
    for (id, n) in &booked {
        assert!(counts[id] >= *n, "{id} under-counted: {} < {n}", counts[id]);
    }

    let sweeper = sweeper(&svc, "pod-s", None, backend);
    let r = sweeper.sweep_once().await.unwrap().reconcile;
    assert!(r.corrected.is_empty() && r.removed == 0, "reconciled within the safety margin: {r:?}");
    assert_eq!(r.recent, r.examined);
    fx.pass_time(safety_ms(backend) / 2).await;
    let r = sweeper.sweep_once().await.unwrap().reconcile;
    assert!(r.corrected.is_empty(), "reconciled within the safety margin: {r:?}");
    assert_eq!(fx.counts().await, counts, "a counter changed within the safety margin");

    fx.pass_time(safety_ms(backend)).await;
    let r = sweeper.sweep_once().await.unwrap().reconcile;
    let corrected: Drift = r.corrected.iter().map(|c| (c.counter.clone(), (c.from, c.to))).collect();
    assert_eq!(corrected, expected, "reconcile corrected other counters than the drifted ones");
    assert!(r.corrected.iter().all(|c| c.deleted == (c.to == 0)));
    assert_eq!(r.conflicts, 0);
    fx.assert_counters_match_holders().await;
    let (counts, booked) = (fx.counts().await, fx.booked().await);
    assert!(counts.keys().all(|id| booked.contains_key(id)), "a counter nobody books survived: {counts:?}");
    drop(keep);
    fx.drop_database().await;
}

const CAS: &str = "name: cas\nlevels: {user: 2, project: 10}\nttlSeconds: 600\n";

async fn reconcile_never_writes_a_counter_that_changed_between_read_and_write(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let defs = [def(CAS)];
    let svc = fx.service(&defs);
    let _keeper = svc.acquire(request("cas", "t1", "p1", "u0")).await.unwrap();
    // Project over-counted (2, booked 1): a crash between its increment and its push.
    fx.store.crash_on("push_level", 2, Fault::Before);
    assert!(svc.acquire(request("cas", "t1", "p1", "u1")).await.is_err());
    fx.store.revive();
    // User u2 over-counted and booked by nobody (1, booked 0): a crash before its first push.
    fx.store.crash_on("push_level", 1, Fault::Before);
    assert!(svc.acquire(request("cas", "t1", "p1", "u2")).await.is_err());
    fx.store.revive();
    let (project, user) = ("cas|project|t1/p1", "cas|user|t1/u2");
    assert_eq!((fx.counts().await[project], fx.counts().await[user]), (2, 1));
    fx.pass_time(safety_ms(backend) + 100).await;

    // Between the reconcile's read and each of its writes, another pod acquires on exactly that counter.
    let other = service_on(fx.second_store().await, &defs, None);
    let grabbed: Arc<Mutex<Vec<Lease>>> = Arc::default();
    for (primitive, user) in [("set_counter_if_unchanged", "u5"), ("delete_counter_if_unchanged", "u2")] {
        let (other, grabbed) = (other.clone(), grabbed.clone());
        fx.store.before(primitive, 1, move || async move {
            let lease = other.acquire(request("cas", "t1", "p1", user)).await.unwrap();
            grabbed.lock().unwrap().push(lease);
        });
    }
    let reconciler = Reconciler::new(fx.store.clone(), options(backend));
    let r = reconciler.run().await.unwrap();
    assert_eq!(grabbed.lock().unwrap().len(), 2, "the hooks did not run between read and write");
    assert_eq!(r.conflicts, 2, "{r:?}");
    assert!(r.corrected.is_empty(), "a counter that changed since the read was overwritten: {r:?}");
    // The acquisitions' increments stand on top of the drift.
    assert_eq!((fx.counts().await[project], fx.counts().await[user]), (4, 2));

    // The changed counters are fresh again: left alone until the margin has passed once more.
    assert!(reconciler.run().await.unwrap().corrected.is_empty());
    fx.pass_time(safety_ms(backend) + 100).await;
    let r = reconciler.run().await.unwrap();
    let corrected: Drift = r.corrected.iter().map(|c| (c.counter.clone(), (c.from, c.to))).collect();
    assert_eq!(corrected, Drift::from([(project.into(), (4, 3)), (user.into(), (2, 1))]));
    fx.assert_counters_match_holders().await;
    fx.drop_database().await;
}

async fn racing_reconcilers_correct_each_counter_once(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def(CAS)]);
    for u in 0..6 {
        fx.store.crash_on("push_level", 1, Fault::Before);
        assert!(svc.acquire(request("cas", "t1", "p1", &format!("u{u}"))).await.is_err());
        fx.store.revive();
    }
    fx.pass_time(safety_ms(backend) + 100).await;
    let reconcilers =
        [Reconciler::new(fx.raw.clone(), options(backend)), Reconciler::new(fx.second_store().await, options(backend))];
    // Both read before either writes: every planned write races another pod's.
    let plans = [reconcilers[0].scan().await.unwrap(), reconcilers[1].scan().await.unwrap()];
    assert!(plans.iter().all(|p| p.corrections.len() == 6), "one per crashed user: {plans:?}");
    let tasks: Vec<_> = reconcilers
        .into_iter()
        .zip(plans)
        .map(|(r, plan)| tokio::spawn(async move { r.apply(plan).await.unwrap() }))
        .collect();
    let mut reports = Vec::new();
    for t in tasks {
        reports.push(t.await.unwrap());
    }
    let corrected: Vec<String> = reports.iter().flat_map(|r| r.corrected.iter().map(|c| c.counter.clone())).collect();
    assert_eq!(corrected.len(), 6, "{reports:?}");
    assert_eq!(corrected.iter().collect::<HashSet<_>>().len(), 6, "a counter was corrected twice: {reports:?}");
    assert_eq!(reports.iter().map(|r| r.conflicts).sum::<usize>(), 6);
    fx.assert_counters_match_holders().await;
    fx.drop_database().await;
}

async fn counters_nobody_books_are_deleted_by_reconcile(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def("name: dorm\nlevels: {user: 1, tenant: 5}\nttlSeconds: 600\n")]);
    for u in 1..=3 {
        svc.acquire(request("dorm", "t1", "p1", &format!("u{u}"))).await.unwrap().release().await.unwrap();
    }
    let held = svc.acquire(request("dorm", "t2", "p1", "u9")).await.unwrap();
    assert_eq!(fx.counts().await.len(), 6);
    let reconciler = Reconciler::new(fx.store.clone(), options(backend));
    assert_eq!(reconciler.run().await.unwrap().removed, 0, "dormant counters removed within the safety margin");

    fx.pass_time(safety_ms(backend) + 100).await;
    let r = reconciler.run().await.unwrap();
    assert_eq!((r.removed, r.in_sync, r.corrected.len()), (4, 2, 0), "{r:?}");
    let left: HashSet<String> = fx.counts().await.into_keys().collect();
    assert_eq!(left, HashSet::from(["dorm|user|t2/u9".to_owned(), "dorm|tenant|t2".to_owned()]));
    // The next acquisition creates its counter anew.
    let again = svc.acquire(request("dorm", "t1", "p1", "u1")).await.unwrap();
    assert_eq!(fx.counts().await["dorm|user|t1/u1"], 1);
    again.release().await.unwrap();
    held.release().await.unwrap();
    fx.drop_database().await;
}

async fn release_racing_reaps_decrements_once_in_total(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let defs = [def("name: race\nlevels: {tenant: 200, global: 200}\nttlSeconds: 1\n")];
    let rev = Arc::new(Revocations::default());
    let holder_side = fx.service(&defs);
    let reapers = [
        service_on(fx.second_store().await, &defs, listener(&rev)),
        service_on(fx.second_store().await, &defs, listener(&rev)),
    ];
    let n = 40;
    let mut leases = Vec::new();
    for u in 0..n {
        leases.push(holder_side.acquire(request("race", "t1", "p1", &format!("u{u}"))).await.unwrap());
    }
    fx.pass_time(1_500).await;

    let barrier = Arc::new(tokio::sync::Barrier::new(n + reapers.len()));
    let releases: Vec<_> = leases
        .into_iter()
        .map(|lease| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                (token(&lease), lease.release().await.unwrap())
            })
        })
        .collect();
    let sweeps: Vec<_> = reapers
        .iter()
        .map(|svc| {
            let (reaper, barrier) = (svc.reaper().clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let mut reaped = 0;
                for _ in 0..3 {
                    reaped += reaper.reap_idle(None).await.unwrap();
                }
                reaped
            })
        })
        .collect();
    let mut released = HashSet::new();
    for t in releases {
        let (token, outcome) = t.await.unwrap();
        if outcome == ReleaseOutcome::Released {
            released.insert(token);
        }
    }
    let mut reaped = 0;
    for t in sweeps {
        reaped += t.await.unwrap();
    }
    eprintln!("released {}, reaped {reaped}", released.len());
    assert_eq!(released.len() + reaped, n, "every holder is taken exactly once, by a release or a reap");
    let counts = fx.counts().await;
    assert_eq!((counts["race|tenant|t1"], counts["race|global|*"]), (0, 0), "decremented other than once");
    for svc in &reapers {
        svc.reaper().flush().await;
    }
    let notified: HashSet<String> = rev.seen().into_iter().map(|(t, _)| t).collect();
    assert_eq!(notified.len(), reaped);
    assert!(notified.is_disjoint(&released), "a released holder was also handed to the listener");
    fx.drop_database().await;
}

async fn release_and_reap_interleaved_at_every_step_decrement_once(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let defs = [def("name: step\nlevels: {global: 10}\nttlSeconds: 1\n")];
    let holder_side = fx.service(&defs);
    let reaper_side = service_on(fx.second_store().await, &defs, None);
    let count = |fx: &Fixture| {
        let raw = fx.raw.clone();
        async move { raw.counters(None).await.unwrap()[0].count }
    };
    let (hs, fxr) = (&holder_side, &fx);
    let idle_lease = || async move {
        let lease = hs.acquire(request("step", "t1", "p1", "u1")).await.unwrap();
        fxr.pass_time(1_500).await;
        lease
    };

    // The reap takes the holder right before the release's delete: the release finds nothing.
    let lease = idle_lease().await;
    let reaper = reaper_side.reaper().clone();
    fx.store.before("delete_holder", 1, move || async move { assert_eq!(reaper.reap_idle(None).await.unwrap(), 1) });
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::AlreadyReleased);
    assert_eq!(count(&fx).await, 0);

    // A reap runs between the release's delete and its decrement: it finds nothing.
    let lease = idle_lease().await;
    let reaper = reaper_side.reaper().clone();
    fx.store.before("decrement", 1, move || async move { assert_eq!(reaper.reap_idle(None).await.unwrap(), 0) });
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(count(&fx).await, 0);

    // The holder releases between the reap's delete and its decrement: the release finds nothing.
    let lease = Arc::new(idle_lease().await);
    let (releaser, l) = (reaper_side.clone(), lease.clone());
    fx.store.before("decrement", 1, move || async move {
        let outcome = releaser.release(l.token().unwrap(), "step").await.unwrap();
        assert_eq!(outcome, ReleaseOutcome::AlreadyReleased);
    });
    assert_eq!(holder_side.reaper().reap_idle(None).await.unwrap(), 1);
    assert_eq!(count(&fx).await, 0);
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::AlreadyReleased);
    assert_eq!(count(&fx).await, 0);
    fx.drop_database().await;
}

async fn release_in_flight_during_reconcile_is_not_mistaken_for_drift(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def("name: flight\nlevels: {project: 5}\nttlSeconds: 600\n")]);
    let first = svc.acquire(request("flight", "t1", "p1", "u1")).await.unwrap();
    let _second = svc.acquire(request("flight", "t1", "p1", "u2")).await.unwrap();
    fx.pass_time(safety_ms(backend) + 100).await;

    // The release deletes `first`'s holder; before its decrement lands, a reconcile scans (count 2, booked 1 —
    // indistinguishable from a crashed deleter) and the release then takes another 100 ms to decrement. The
    // reconcile's settle pause outlasts that window, so its write finds the counter changed.
    let reconciler_store = Arc::new(FaultyStore::new(fx.raw.clone()));
    let reconciler = Reconciler::new(
        reconciler_store.clone(),
        ReconcileOptions { safety: safety(backend), settle: Duration::from_secs(2) },
    );
    let (scanned_tx, scanned_rx) = tokio::sync::oneshot::channel();
    reconciler_store.after("booked_counts", 1, move || async move { scanned_tx.send(()).unwrap() });
    let running: Arc<Mutex<Option<tokio::task::JoinHandle<_>>>> = Arc::default();
    let slot = running.clone();
    fx.store.before("decrement", 1, move || async move {
        *slot.lock().unwrap() = Some(tokio::spawn(async move { reconciler.run().await.unwrap() }));
        scanned_rx.await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let task = running.lock().unwrap().take().expect("the reconcile ran inside the release");
    let r = task.await.unwrap();
    assert_eq!((r.conflicts, r.corrected.len()), (1, 0), "{r:?}");
    assert_eq!(fx.counts().await["flight|project|t1/p1"], 1, "an in-flight release was corrected as drift");
    fx.assert_counters_match_holders().await;
    fx.drop_database().await;
}

async fn drift_on_a_full_counter_is_repaired_while_acquirers_keep_polling(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def("name: one\nlevels: {project: 1}\nttlSeconds: 600\n")]);
    // The only slot is taken by a crash between increment and push: nobody holds it, and every acquisition is
    // refused. Those refusals must not keep the counter looking "recently changed" to reconcile.
    fx.store.crash_on("push_level", 1, Fault::Before);
    assert!(svc.acquire(request("one", "t1", "p1", "u1")).await.is_err());
    fx.store.revive();
    let sweeper = sweeper(&svc, "pod-s", None, backend);
    let (step, deadline) = (safety_ms(backend) / 5, Instant::now() + Duration::from_secs(60));
    let mut polled = 0;
    let lease = loop {
        match svc.acquire(request("one", "t1", "p1", "u2")).await {
            Ok(lease) => break lease,
            Err(LeaseError::Busy(_)) => polled += 1,
            Err(e) => panic!("{e}"),
        }
        assert!(polled < 30 && Instant::now() < deadline, "the drifted slot was never repaired");
        fx.pass_time(step).await;
        sweeper.sweep_once().await.unwrap();
    };
    assert!(polled >= 5, "repaired within the safety margin after {polled} polls");
    assert_eq!(fx.counts().await["one|project|t1/p1"], 1);
    lease.release().await.unwrap();
    fx.drop_database().await;
}

async fn sweeper_runs_repeatedly_and_stops_cleanly_on_shutdown(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let rev = Arc::new(Revocations::default());
    let svc = service_on(fx.store.clone(), &[def(BRIEF)], listener(&rev));
    let config =
        SweeperConfig { pod: "pod-s".into(), reap_interval: Duration::from_millis(50), reconcile: options(backend) };
    let lease = svc.acquire(request("brief", "t1", "p1", "u1")).await.unwrap();
    let handle = LeaseSweeper::new(&svc, config, Some(Pods::dead(&[]))).spawn();
    let mut rounds = handle.rounds();

    // The scheduled sweep reaps the idle holder on its own.
    fx.pass_time(1_500).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while fx.raw.holder(&token(&lease)).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the scheduled sweep never reaped the idle holder");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = *rounds.borrow_and_update();
    tokio::time::timeout(Duration::from_secs(60), rounds.wait_for(|n| *n >= seen + 3))
        .await
        .expect("the sweeper stopped sweeping")
        .unwrap();

    // Shut down in the middle of a round (held inside its reconcile scan): the round is finished, not cut.
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel();
    let finished = Arc::new(AtomicBool::new(false));
    let done = finished.clone();
    fx.store.before("store_now_ms", 1, move || async move {
        inside_tx.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        done.store(true, Ordering::SeqCst);
    });
    inside_rx.await.unwrap();
    handle.shutdown().await.expect("the sweeper task ended cleanly");
    assert!(finished.load(Ordering::SeqCst), "shutdown returned before the round in progress ended");
    assert_eq!(fx.store.calls("booked_counts"), fx.store.calls("store_now_ms"), "a reconcile scan was cut short");

    // Joined: no more rounds, no more store traffic, the round counter's sender is gone.
    let calls = fx.store.total_calls();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fx.store.total_calls(), calls, "the sweeper still runs after shutdown");
    rounds.borrow_and_update();
    assert!(rounds.changed().await.is_err(), "the sweeper task is still alive");
    rev.assert_exactly(&HashSet::from([token(&lease)]), RevocationReason::Idle);
    fx.drop_database().await;
}

async fn store_time_and_counter_primitives(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def(BRIEF)]);
    let raw = fx.raw.clone();
    let before = raw.store_now_ms().await.unwrap();
    let lease = svc.acquire(request("brief", "t1", "p1", "u1")).await.unwrap();
    let after = raw.store_now_ms().await.unwrap();
    let h = raw.holder(&token(&lease)).await.unwrap().unwrap();
    assert!(before <= h.acquired_at_ms && h.acquired_at_ms <= after, "{before} <= {} <= {after}", h.acquired_at_ms);
    let other = svc.acquire(request("brief", "t1", "p1", "u2").pod("pod-z", false)).await.unwrap();
    assert_eq!(raw.holder_pods().await.unwrap(), ["pod-a", "pod-z"]);
    assert_eq!(raw.pod_holders("pod-z").await.unwrap(), [token(&other)]);
    assert_eq!(raw.booked_counts().await.unwrap(), fx.booked().await);
    assert_eq!(raw.booked_counts().await.unwrap()["brief|global|*"], 2);

    let id = "brief|user|t1/u1";
    let read = |raw: Arc<dyn lease_shared::LeaseStore>| async move {
        raw.counters(None).await.unwrap().into_iter().find(|c| c.id == id)
    };
    let c = read(raw.clone()).await.unwrap();
    // ensure_counter leaves an existing counter alone, its updatedAt included.
    fx.pass_time(20).await;
    raw.ensure_counter(&CounterKey::parse(id).unwrap()).await.unwrap();
    assert_eq!(read(raw.clone()).await.unwrap(), c, "ensure_counter changed an existing counter");

    let stale_count = CounterRecord { count: c.count + 1, ..c.clone() };
    let stale_time = CounterRecord { updated_at_ms: c.updated_at_ms - 1, ..c.clone() };
    for stale in [&stale_count, &stale_time] {
        assert!(!raw.set_counter_if_unchanged(stale, 7).await.unwrap(), "CAS wrote over {stale:?}");
        assert!(!raw.delete_counter_if_unchanged(stale).await.unwrap(), "CAS deleted over {stale:?}");
    }
    assert_eq!(read(raw.clone()).await.unwrap(), c);
    assert!(raw.set_counter_if_unchanged(&c, 7).await.unwrap());
    let c2 = read(raw.clone()).await.unwrap();
    assert_eq!(c2.count, 7);
    assert!(c2.updated_at_ms > c.updated_at_ms, "the correction must move updatedAt");
    assert!(!raw.set_counter_if_unchanged(&c, 8).await.unwrap(), "CAS with the old record wrote");
    assert!(raw.delete_counter_if_unchanged(&c2).await.unwrap());
    assert!(read(raw.clone()).await.is_none());
    assert!(!raw.delete_counter_if_unchanged(&c2).await.unwrap());
    // A late decrement of a deleted counter does nothing (does not resurrect it below zero).
    raw.decrement(&[id.to_owned()]).await.unwrap();
    assert!(read(raw.clone()).await.is_none(), "a decrement created a counter");
    drop((lease, other));
    fx.drop_database().await;
}

/// A minimal metrics recorder: counter totals by `name{label=value,...}`.
#[derive(Debug, Default)]
struct Counters(Mutex<HashMap<String, Arc<AtomicU64>>>);

impl Counters {
    fn get(&self, key: &str) -> u64 {
        self.0.lock().unwrap().get(key).map_or(0, |c| c.load(Ordering::SeqCst))
    }
}

impl metrics::Recorder for Counters {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let mut labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        metrics::Counter::from_arc(self.0.lock().unwrap().entry(name).or_default().clone())
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// On one thread, so that a thread-local recorder sees every metric.
#[tokio::test(flavor = "current_thread")]
async fn reap_revoke_and_reconcile_record_their_metrics() {
    let recorder = Counters::default();
    let _local = metrics::set_default_local_recorder(&recorder);
    let fx = Fixture::new(Backend::Memory).await;
    let svc = fx.service(&[def(BRIEF), def(CAS)]);
    let idle = svc.acquire(request("brief", "t1", "p1", "u1")).await.unwrap();
    let on_dead = svc.acquire(request("cas", "t1", "p1", "u1").pod("pod-dead", true)).await.unwrap();
    let revoked = svc.acquire(request("cas", "t1", "p1", "u2")).await.unwrap();
    fx.store.crash_on("push_level", 1, Fault::Before);
    assert!(svc.acquire(request("cas", "t1", "p1", "u3")).await.is_err());
    fx.store.revive();
    svc.reaper().revoke(&token(&revoked), None).await.unwrap();
    fx.pass_time(2_000).await;
    let sweeper = sweeper(&svc, "pod-a", Some(Pods::dead(&["pod-dead"])), Backend::Memory);
    let r = sweeper.sweep_once().await.unwrap();
    assert_eq!((r.idle, r.pod), (1, 1));
    fx.pass_time(safety_ms(Backend::Memory)).await;
    let r = sweeper.sweep_once().await.unwrap();
    assert_eq!(r.reconcile.corrected.len(), 1, "{r:?}");
    for (reason, n) in [("idle", 1), ("pod", 1), ("revoke", 1)] {
        assert_eq!(recorder.get(&format!("vance_lease_reap_total{{reason={reason}}}")), n, "reason {reason}");
    }
    assert_eq!(recorder.get("vance_lease_reconcile_total{outcome=corrected}"), 1);
    drop((idle, on_dead));
}
