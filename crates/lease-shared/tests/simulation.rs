//! A randomized, seeded simulation of the lease system on the in-memory store with a manual clock.
//!
//! Several simulated pods — each its own service over its own fault-injecting store wrapper around one shared
//! [`MemoryStore`] — run random acquisitions, checks, releases, sweeps (idle reap, dead-pod reap, reconcile scans
//! and writes), revocations, clock advances, pod crashes (also in the middle of an operation), pods wrongly judged
//! dead, and store errors. Operations run one at a time to completion on a single-threaded runtime, except that a
//! hook may suspend one exactly before one of its store calls and run another operation there: that is how
//! in-flight funnels, releases and reaps are interleaved with everything else, deterministically.
//!
//! After every step: no counter books more holders than its cap, no counter is below its booked holders (an
//! under-count would overbook), and no revoked holder was handed to the listener twice. After quiescence plus
//! reconcile (the safety margin elapsed): every counter equals its booked holders, and after everyone released,
//! the store is empty.
//!
//! The model keeps the two timing assumptions reconcile relies on (see `Reconciler::scan`): the clock advances by
//! less than the safety margin within one operation, and the writes of a reconcile scanned inside another
//! operation's window happen only after that operation ends (the settle pause).
//!
//! `LEASE_SIM_SEED=<n>` replays one seed; `LEASE_SIM_SEEDS` and `LEASE_SIM_STEPS` change the budget (default 200
//! seeds × 300 steps). A failing run prints its seed and its last steps (an interleaved operation is listed, indented,
//! before the step it ran inside).

mod support;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_shared::reconcile::{ReconcileOptions, ReconcilePlan};
use lease_shared::store::{CounterKey, HolderRecord, HolderState, LeaseStore, ManualClock, MemoryStore};
use lease_shared::{
    Lease, LeaseDefinition, LeaseError, LeaseRevocationListener, LeaseSweeper, PodLiveness, Reconciler,
    ResourceLeaseService, RevocationReason, SweeperConfig,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::faulty::{Fault, FaultyStore};
use support::{def, request, service_on};

const DEFAULT_SEEDS: u64 = 200;
const DEFAULT_STEPS: usize = 300;
const SAFETY: Duration = lease_shared::reconcile::DEFAULT_RECONCILE_SAFETY;
const SAFETY_MS: i64 = SAFETY.as_millis() as i64;
const MAX_PODS: usize = 3;
const DEFS: [&str; 3] = [
    "name: a\nlevels: {global: 3, tenant: 2, project: 1, user: 1}\nttlSeconds: 10\n",
    "name: b\nlevels: {global: 4, user: 2}\nttlSeconds: 30\n",
    "name: c\nlevels: {tenant: 2}\nttlSeconds: 15\n",
];
/// Each step's recent history, for the failure report.
const LOG_LEN: usize = 40;

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

#[test]
fn random_pods_keep_caps_and_reconcile_to_the_booked_holders() {
    let steps = env("LEASE_SIM_STEPS").unwrap_or(DEFAULT_STEPS);
    let seeds: Vec<u64> = match env::<u64>("LEASE_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env("LEASE_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS)).collect(),
    };
    let stats: Stats = Arc::default();
    let full_budget = seeds.len() as u64 >= DEFAULT_SEEDS && steps >= DEFAULT_STEPS;
    for seed in seeds {
        let log: Log = Arc::default();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
            runtime.block_on(simulate(seed, steps, log.clone(), stats.clone()))
        }));
        if let Err(panic) = run {
            eprintln!("simulation failed with seed {seed}; replay: LEASE_SIM_SEED={seed} cargo test --test simulation");
            eprintln!("its last steps:");
            for line in log.lock().unwrap().iter() {
                eprintln!("  {line}");
            }
            std::panic::resume_unwind(panic);
        }
    }
    let stats = stats.lock().unwrap();
    eprintln!("simulation: {stats:?}");
    if full_budget {
        // The budget must actually reach the interesting cases, or it proves little.
        for what in [
            "acquire granted",
            "acquire busy",
            "acquire unavailable",
            "acquire lost",
            "crash mid-operation",
            "check lost",
            "reaped idle",
            "reaped pod",
            "revoked",
            "interleaved",
            "reconcile corrected",
            "reconcile conflicts",
            "reconcile removed",
        ] {
            assert!(stats.get(what).copied().unwrap_or(0) > 0, "the simulation never reached {what:?}: {stats:?}");
        }
    }
}

/// How often each interesting thing happened, over all seeds.
type Stats = Arc<Mutex<BTreeMap<&'static str, u64>>>;

fn bump(stats: &Stats, what: &'static str, n: u64) {
    *stats.lock().unwrap().entry(what).or_default() += n;
}

type Log = Arc<Mutex<VecDeque<String>>>;

fn note(log: &Log, line: String) {
    let mut log = log.lock().unwrap();
    if log.len() == LOG_LEN {
        log.pop_front();
    }
    log.push_back(line);
}

/// Records every holder handed over; a second hand-over of the same token is a failure.
#[derive(Debug, Default)]
struct Listener(Mutex<HashMap<String, usize>>);

#[async_trait]
impl LeaseRevocationListener for Listener {
    async fn on_revoked(&self, holder: HolderRecord, _: RevocationReason) {
        *self.0.lock().unwrap().entry(holder.token).or_default() += 1;
    }
}

/// The pod registry: crashed pods, and live pods wrongly judged dead (a stale heartbeat).
#[derive(Debug, Default)]
struct Registry(Mutex<HashSet<String>>);

#[async_trait]
impl PodLiveness for Registry {
    async fn is_alive(&self, pod: &str) -> bool {
        !self.0.lock().unwrap().contains(pod)
    }
}

/// A reconcile plan waiting for its writes. A plan scanned inside another operation must not be written before
/// that operation ends (the settle pause); at the end of every step all plans become writable anywhere.
struct Pending {
    plan: ReconcilePlan,
    writable_anywhere: bool,
}

/// What the hooks need: everything `Send + 'static`. The operator is a pod that never crashes and has no faults:
/// interleaved operations run there.
#[derive(Clone)]
struct Shared {
    clock: ManualClock,
    operator: ResourceLeaseService,
    operator_sweeper: LeaseSweeper,
    operator_reconciler: Reconciler,
    operator_leases: Arc<Mutex<Vec<Lease>>>,
    plans: Arc<Mutex<Vec<Pending>>>,
    defs: Arc<Vec<LeaseDefinition>>,
    log: Log,
    stats: Stats,
}

/// An operation run inside another one, at a store call.
#[derive(Debug, Clone, Copy)]
enum Interleave {
    Advance(i64),
    ReapIdle,
    ReapDeadPods,
    Revoke(usize),
    Acquire(usize, usize, usize, usize),
    ReleaseOperatorLease(usize),
    Scan,
    ApplyWritablePlan(usize),
}

fn random_request(rng: &mut StdRng) -> (usize, usize, usize, usize) {
    (rng.random_range(0..DEFS.len()), rng.random_range(0..2), rng.random_range(0..2), rng.random_range(0..3))
}

fn random_interleave(rng: &mut StdRng) -> Interleave {
    match rng.random_range(0..8) {
        0 => Interleave::Advance(rng.random_range(1..=5_000)),
        1 => Interleave::ReapIdle,
        2 => Interleave::ReapDeadPods,
        3 => Interleave::Revoke(rng.random_range(0..1_000)),
        4 => {
            let (d, t, p, u) = random_request(rng);
            Interleave::Acquire(d, t, p, u)
        }
        5 => Interleave::ReleaseOperatorLease(rng.random_range(0..1_000)),
        6 => Interleave::Scan,
        _ => Interleave::ApplyWritablePlan(rng.random_range(0..1_000)),
    }
}

impl Shared {
    async fn acquire(&self, (d, t, p, u): (usize, usize, usize, usize), pod: &str) -> Result<Lease, LeaseError> {
        let req = request(&self.defs[d].name, &format!("t{t}"), &format!("p{p}"), &format!("u{u}"));
        self.operator.acquire(req.pod(pod, d == 0)).await
    }

    fn reconciled(&self, r: &lease_shared::ReconcileReport) {
        bump(&self.stats, "reconcile corrected", r.corrected.len() as u64);
        bump(&self.stats, "reconcile conflicts", r.conflicts as u64);
        bump(&self.stats, "reconcile removed", r.removed as u64);
    }

    async fn interleave(self, what: Interleave) {
        bump(&self.stats, "interleaved", 1);
        let outcome = match what {
            Interleave::Advance(ms) => {
                self.clock.advance(ms);
                String::new()
            }
            Interleave::ReapIdle => {
                let n = self.operator.reaper().reap_idle(None).await.unwrap();
                bump(&self.stats, "reaped idle", n as u64);
                format!("{n}")
            }
            Interleave::ReapDeadPods => {
                let (n, dead) = self.operator_sweeper.reap_dead_pods().await.unwrap();
                bump(&self.stats, "reaped pod", n as u64);
                format!("{n} of {dead:?}")
            }
            Interleave::Revoke(i) => {
                let holders = self.operator.store().holders(None).await.unwrap();
                match holders.get(i % holders.len().max(1)) {
                    Some(h) => format!("{:?}", self.operator.reaper().revoke(&h.token, None).await.map(|h| h.token)),
                    None => "nothing to revoke".into(),
                }
            }
            Interleave::Acquire(d, t, p, u) => match self.acquire((d, t, p, u), "operator").await {
                Ok(lease) => {
                    self.operator_leases.lock().unwrap().push(lease);
                    "granted".into()
                }
                Err(e) => e.code().into(),
            },
            Interleave::ReleaseOperatorLease(i) => {
                let lease = {
                    let mut leases = self.operator_leases.lock().unwrap();
                    let n = leases.len();
                    (n > 0).then(|| leases.remove(i % n))
                };
                match lease {
                    Some(lease) => format!("{:?}", lease.release().await.unwrap()),
                    None => "no operator lease".into(),
                }
            }
            Interleave::Scan => {
                let plan = self.operator_reconciler.scan().await.unwrap();
                let n = plan.corrections.len();
                self.plans.lock().unwrap().push(Pending { plan, writable_anywhere: false });
                format!("{n} planned")
            }
            Interleave::ApplyWritablePlan(i) => {
                let plan = {
                    let mut plans = self.plans.lock().unwrap();
                    let writable: Vec<usize> = (0..plans.len()).filter(|&j| plans[j].writable_anywhere).collect();
                    (!writable.is_empty()).then(|| plans.remove(writable[i % writable.len()]).plan)
                };
                match plan {
                    Some(plan) => {
                        let r = self.operator_reconciler.apply(plan).await.unwrap();
                        self.reconciled(&r);
                        format!("corrected {}, removed {}, conflicts {}", r.corrected.len(), r.removed, r.conflicts)
                    }
                    None => "no writable plan".into(),
                }
            }
        };
        note(&self.log, format!("    interleaved {what:?}: {outcome}"));
    }
}

struct Pod {
    id: String,
    store: Arc<FaultyStore>,
    svc: ResourceLeaseService,
    sweeper: LeaseSweeper,
    reconciler: Reconciler,
    leases: Vec<Lease>,
    alive: bool,
}

struct Sim {
    rng: StdRng,
    step: usize,
    raw: Arc<MemoryStore>,
    shared: Shared,
    listener: Arc<Listener>,
    registry: Arc<Registry>,
    pods: Vec<Pod>,
    started: usize,
    /// Cap per `resource|level`.
    caps: HashMap<String, u32>,
}

const ACQUIRE_PRIMITIVES: &[&str] = &[
    "insert_holder",
    "try_increment",
    "ensure_counter",
    "push_level",
    "delete_holder",
    "decrement",
    "idle_holders",
    "occupancy",
];
const RELEASE_PRIMITIVES: &[&str] = &["delete_holder", "decrement"];
const SWEEP_PRIMITIVES: &[&str] = &[
    "idle_holders",
    "delete_holder",
    "decrement",
    "holder_pods",
    "pod_holders",
    "store_now_ms",
    "counters",
    "booked_counts",
    "set_counter_if_unchanged",
    "delete_counter_if_unchanged",
];

fn options() -> ReconcileOptions {
    // No settle pause: the model orders the writes itself (see `Pending`).
    ReconcileOptions { safety: SAFETY, settle: Duration::ZERO }
}

impl Sim {
    fn new(seed: u64, log: Log, stats: Stats) -> Self {
        let clock = ManualClock::new(1_700_000_000_000);
        let raw = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
        let defs: Vec<LeaseDefinition> = DEFS.iter().map(|y| def(y)).collect();
        let caps = defs
            .iter()
            .flat_map(|d| d.levels.narrow_to_wide().map(move |(l, c)| (format!("{}|{}", d.resource, l), c)))
            .collect();
        let listener = Arc::new(Listener::default());
        let registry = Arc::new(Registry::default());
        let operator = service_on(raw.clone(), &defs, Some(listener.clone()));
        let config =
            SweeperConfig { pod: "operator".into(), reap_interval: Duration::from_secs(30), reconcile: options() };
        let shared = Shared {
            clock,
            operator_sweeper: LeaseSweeper::new(&operator, config, Some(registry.clone())),
            operator_reconciler: Reconciler::new(raw.clone(), options()),
            operator,
            operator_leases: Arc::default(),
            plans: Arc::default(),
            defs: Arc::new(defs),
            log,
            stats,
        };
        let mut sim = Sim {
            rng: StdRng::seed_from_u64(seed),
            step: 0,
            raw,
            shared,
            listener,
            registry,
            pods: Vec::new(),
            started: 0,
            caps,
        };
        for _ in 0..MAX_PODS {
            sim.start_pod();
        }
        sim
    }

    fn note(&self, line: String) {
        note(&self.shared.log, format!("step {}: {line}", self.step));
    }

    fn start_pod(&mut self) {
        let id = format!("pod-{}", self.started);
        self.started += 1;
        let store = Arc::new(FaultyStore::new(self.raw.clone()));
        let svc = service_on(store.clone(), &self.shared.defs, Some(self.listener.clone()));
        let config = SweeperConfig { pod: id.clone(), reap_interval: Duration::from_secs(30), reconcile: options() };
        let sweeper = LeaseSweeper::new(&svc, config, Some(self.registry.clone()));
        let reconciler = Reconciler::new(store.clone(), options());
        self.pods.push(Pod { id, store, svc, sweeper, reconciler, leases: Vec::new(), alive: true });
    }

    fn alive(&self) -> Vec<usize> {
        (0..self.pods.len()).filter(|&i| self.pods[i].alive).collect()
    }

    /// Plans a store error (or a crash of the pod) at one of `primitives`, with probability `p`.
    fn maybe_fault(&mut self, pod: usize, primitives: &[&'static str], p: f64) -> Option<String> {
        if !self.rng.random_bool(p) {
            return None;
        }
        let primitive = primitives[self.rng.random_range(0..primitives.len())];
        let nth = self.rng.random_range(1..=3);
        let fault = if self.rng.random_bool(0.5) { Fault::Before } else { Fault::After };
        let store = &self.pods[pod].store;
        if self.rng.random_bool(0.3) {
            store.crash_on(primitive, nth, fault);
            Some(format!("crash at {primitive}#{nth} {fault:?}"))
        } else {
            store.fail(primitive, nth, fault);
            Some(format!("error at {primitive}#{nth} {fault:?}"))
        }
    }

    /// Plans an interleaved operation before one of `primitives`, with probability `p`.
    fn maybe_interleave(&mut self, pod: usize, primitives: &[&'static str], p: f64) -> Option<String> {
        if !self.rng.random_bool(p) {
            return None;
        }
        let primitive = primitives[self.rng.random_range(0..primitives.len())];
        let nth = self.rng.random_range(1..=2);
        let what = random_interleave(&mut self.rng);
        let shared = self.shared.clone();
        self.pods[pod].store.before(primitive, nth, move || shared.interleave(what));
        Some(format!("{what:?} before {primitive}#{nth}"))
    }

    /// Ends the acting pod's operation: unfired faults and hooks are dropped; a crashed pod is dead for good
    /// (a crashed process runs no destructors: its leases are forgotten, not released).
    fn settle_pod(&mut self, pod: usize) {
        let p = &mut self.pods[pod];
        p.store.clear_plan();
        if p.store.is_crashed() && p.alive {
            bump(&self.shared.stats, "crash mid-operation", 1);
            p.alive = false;
            self.registry.0.lock().unwrap().insert(p.id.clone());
            for lease in p.leases.drain(..) {
                std::mem::forget(lease);
            }
            let id = p.id.clone();
            self.note(format!("{id} crashed"));
        }
    }

    async fn random_step(&mut self) {
        let alive = self.alive();
        if alive.is_empty() || (alive.len() < MAX_PODS && self.rng.random_bool(0.05)) {
            self.start_pod();
            return self.note(format!("started {}", self.pods.last().unwrap().id));
        }
        let pod = alive[self.rng.random_range(0..alive.len())];
        match self.rng.random_range(0..100) {
            0..30 => self.acquire(pod).await,
            30..45 => self.check(pod).await,
            45..60 => self.release(pod).await,
            60..75 => {
                let ms = if self.rng.random_bool(0.8) {
                    self.rng.random_range(1..3_000)
                } else {
                    self.rng.random_range(10_000..90_000)
                };
                self.shared.clock.advance(ms);
                self.note(format!("clock +{ms} ms"));
            }
            75..88 => self.sweep(pod).await,
            88..91 => {
                let holders = self.raw.holders(None).await.unwrap();
                if holders.is_empty() {
                    return;
                }
                let h = &holders[self.rng.random_range(0..holders.len())];
                let r = self.shared.operator.reaper().revoke(&h.token, Some(&h.tenant_id)).await;
                bump(&self.shared.stats, "revoked", u64::from(r.is_ok()));
                self.note(format!("operator revokes {} of {}: {:?}", &h.token[..6], h.pod, r.map(|_| ())));
            }
            91..93 => {
                let target = self.pods[self.rng.random_range(0..self.pods.len())].id.clone();
                let r = self.shared.operator.reaper().revoke_pod(&target).await.unwrap();
                bump(&self.shared.stats, "revoked", r.len() as u64);
                self.note(format!("operator revokes pod {target}: {} holders", r.len()));
            }
            93..95 => {
                // Everything the pod does from now on fails: it crashed between two operations.
                bump(&self.shared.stats, "crash between operations", 1);
                self.pods[pod].store.crash();
                self.settle_pod(pod);
            }
            _ => {
                // A live pod judged dead (stale heartbeat), or judged alive again.
                let id = self.pods[pod].id.clone();
                let mut dead = self.registry.0.lock().unwrap();
                let stale = !dead.remove(&id);
                if stale {
                    dead.insert(id.clone());
                }
                drop(dead);
                self.note(format!("{id} judged {}", if stale { "dead (stale)" } else { "alive again" }));
            }
        }
    }

    async fn acquire(&mut self, pod: usize) {
        let (d, t, p, u) = random_request(&mut self.rng);
        let fault = self.maybe_fault(pod, ACQUIRE_PRIMITIVES, 0.2);
        let hook = self.maybe_interleave(pod, ACQUIRE_PRIMITIVES, 0.2);
        let req = request(&self.shared.defs[d].name, &format!("t{t}"), &format!("p{p}"), &format!("u{u}"));
        let id = self.pods[pod].id.clone();
        let result = self.pods[pod].svc.acquire(req.pod(&id, d == 0)).await;
        let outcome = match &result {
            Ok(lease) => format!("granted {}", &lease.token().unwrap()[..6]),
            Err(e) => e.code().to_owned(),
        };
        let name = &self.shared.defs[d].name;
        self.note(format!("{id} acquires {name} t{t} p{p} u{u} [{fault:?}] [{hook:?}]: {outcome}"));
        let what = match &result {
            Ok(_) => "acquire granted",
            Err(LeaseError::Busy(_)) => "acquire busy",
            Err(LeaseError::Lost { .. }) => "acquire lost",
            Err(_) => "acquire unavailable",
        };
        bump(&self.shared.stats, what, 1);
        match result {
            Ok(lease) => self.pods[pod].leases.push(lease),
            Err(LeaseError::Busy(_)) => {}
            Err(LeaseError::Unavailable { .. }) => assert!(fault.is_some(), "LEASE_UNAVAILABLE without a store fault"),
            // The pending holder was revoked or reaped under the funnel.
            Err(LeaseError::Lost { .. }) => {
                assert!(hook.is_some(), "LEASE_LOST from an acquisition nobody interfered with")
            }
            Err(e) => panic!("unexpected acquisition error: {e}"),
        }
        self.settle_pod(pod);
    }

    async fn check(&mut self, pod: usize) {
        if self.pods[pod].leases.is_empty() {
            return;
        }
        let i = self.rng.random_range(0..self.pods[pod].leases.len());
        let fault = self.maybe_fault(pod, &["touch"], 0.1);
        let lease = &self.pods[pod].leases[i];
        let token = lease.token().unwrap().to_owned();
        let result = lease.check().await;
        let exists = self.raw.holder(&token).await.unwrap().is_some();
        self.note(format!(
            "{} checks {} [{fault:?}]: {:?}",
            self.pods[pod].id,
            &token[..6],
            result.as_ref().map_err(|e| e.code())
        ));
        match result {
            Ok(()) => assert!(exists, "check succeeded on a holder that does not exist"),
            Err(LeaseError::Lost { .. }) => {
                assert!(!exists, "LEASE_LOST for a holder that exists");
                bump(&self.shared.stats, "check lost", 1);
                let lease = self.pods[pod].leases.remove(i);
                // Gone already: nothing to return.
                if !self.pods[pod].store.is_crashed() {
                    assert_eq!(lease.release().await.unwrap(), lease_shared::ReleaseOutcome::AlreadyReleased);
                } else {
                    std::mem::forget(lease);
                }
            }
            Err(e) => assert!(fault.is_some(), "check failed without a store fault: {e}"),
        }
        self.settle_pod(pod);
    }

    async fn release(&mut self, pod: usize) {
        if self.pods[pod].leases.is_empty() {
            return;
        }
        let i = self.rng.random_range(0..self.pods[pod].leases.len());
        let fault = self.maybe_fault(pod, RELEASE_PRIMITIVES, 0.25);
        let hook = self.maybe_interleave(pod, RELEASE_PRIMITIVES, 0.25);
        let lease = self.pods[pod].leases.remove(i);
        let token = lease.token().unwrap().to_owned();
        let result = lease.release().await;
        self.note(format!(
            "{} releases {} [{fault:?}] [{hook:?}]: {:?}",
            self.pods[pod].id,
            &token[..6],
            result.as_ref().map_err(|e| e.code())
        ));
        match result {
            Ok(_) => {}
            Err(e) => {
                assert!(fault.is_some(), "release failed without a store fault: {e}");
                // The pod keeps the lease and may release it later (or the idle reap takes it).
                if !self.pods[pod].store.is_crashed() {
                    self.pods[pod].leases.push(lease);
                } else {
                    std::mem::forget(lease);
                }
            }
        }
        self.settle_pod(pod);
    }

    async fn sweep(&mut self, pod: usize) {
        let fault = self.maybe_fault(pod, SWEEP_PRIMITIVES, 0.15);
        let hook = self.maybe_interleave(pod, SWEEP_PRIMITIVES, 0.2);
        let id = self.pods[pod].id.clone();
        let kind = self.rng.random_range(0..5);
        let stats = self.shared.stats.clone();
        let outcome = match kind {
            0 => {
                let r = self.pods[pod].sweeper.sweep_once().await;
                if let Ok(r) = &r {
                    bump(&stats, "reaped idle", r.idle as u64);
                    bump(&stats, "reaped pod", r.pod as u64);
                    self.shared.reconciled(&r.reconcile);
                }
                format!("full sweep: {r:?}")
            }
            1 => {
                let r = self.pods[pod].svc.reaper().reap_idle(None).await;
                bump(&stats, "reaped idle", *r.as_ref().unwrap_or(&0) as u64);
                format!("idle reap: {r:?}")
            }
            2 => {
                let r = self.pods[pod].sweeper.reap_dead_pods().await;
                bump(&stats, "reaped pod", r.as_ref().map_or(0, |(n, _)| *n) as u64);
                format!("dead-pod reap: {r:?}")
            }
            3 => match self.pods[pod].reconciler.scan().await {
                // Scanned between two operations: no window is open, the writes may come anywhere.
                Ok(plan) => {
                    let n = plan.corrections.len();
                    self.shared.plans.lock().unwrap().push(Pending { plan, writable_anywhere: true });
                    format!("scan: {n} planned")
                }
                Err(e) => format!("scan: {e}"),
            },
            _ => {
                let plan = {
                    let mut plans = self.shared.plans.lock().unwrap();
                    let n = plans.len();
                    (n > 0).then(|| plans.remove(self.rng.random_range(0..n)).plan)
                };
                match plan {
                    Some(plan) => {
                        let r = self.pods[pod].reconciler.apply(plan).await;
                        if let Ok(r) = &r {
                            self.shared.reconciled(r);
                        }
                        format!("reconcile writes: {r:?}")
                    }
                    None => "no plan to write".into(),
                }
            }
        };
        self.note(format!("{id} sweeps [{fault:?}] [{hook:?}]: {outcome}"));
        if fault.is_none() {
            assert!(!outcome.contains("Err("), "a sweep failed without a store fault: {outcome}");
        }
        self.settle_pod(pod);
    }

    /// The end of a step: every operation has ended, so every plan may be written anywhere; listeners ran.
    async fn end_step(&mut self) {
        for p in self.shared.plans.lock().unwrap().iter_mut() {
            p.writable_anywhere = true;
        }
        for pod in &self.pods {
            pod.svc.reaper().flush().await;
        }
        self.shared.operator.reaper().flush().await;
        self.check_invariants().await;
    }

    async fn booked_and_counts(&self) -> (HashMap<String, i64>, HashMap<String, i64>) {
        let booked = self.raw.booked_counts().await.unwrap();
        let counts = self.raw.counters(None).await.unwrap().into_iter().map(|c| (c.id, c.count)).collect();
        (booked, counts)
    }

    fn cap(&self, id: &str) -> u32 {
        let key = CounterKey::parse(id).unwrap_or_else(|| panic!("bad counter id {id}"));
        self.caps[&format!("{}|{}", key.resource, key.level)]
    }

    async fn check_invariants(&self) {
        let (booked, counts) = self.booked_and_counts().await;
        for (id, n) in &booked {
            let cap = i64::from(self.cap(id));
            assert!(*n <= cap, "{n} holders book {id}, cap {cap}");
            let count = counts.get(id).copied().unwrap_or(0);
            assert!(count >= *n, "counter {id} at {count} is below its {n} booked holders: the level can overbook");
        }
        for (id, count) in &counts {
            assert!(*count <= i64::from(self.cap(id)), "counter {id} at {count} over its cap");
            assert!(*count >= 0, "counter {id} negative: {count}");
        }
        // Every holder books a prefix of its funnel, narrow to wide; HELD holders all of it.
        for h in self.raw.holders(None).await.unwrap() {
            let d = self.shared.defs.iter().find(|d| d.name == h.lease).unwrap();
            let funnel: Vec<String> = d
                .levels
                .narrow_to_wide()
                .filter_map(|(l, _)| {
                    CounterKey::for_level(&d.resource, l, &h.tenant_id, &h.project_id, h.user_id.as_deref())
                })
                .map(|k| k.id())
                .collect();
            assert!(funnel.starts_with(&h.levels), "holder {} books {:?}, funnel {funnel:?}", h.token, h.levels);
            if h.state == HolderState::Held {
                assert_eq!(h.levels, funnel, "a HELD holder has not booked its whole funnel");
            }
        }
        let notified = self.listener.0.lock().unwrap();
        if let Some((token, n)) = notified.iter().find(|(_, n)| **n > 1) {
            panic!("holder {token} was handed to the listener {n} times");
        }
    }

    /// Live pods check all their leases (a heartbeat of use), dropping the lost ones.
    async fn keep_alive(&mut self) {
        for pod in self.pods.iter_mut().filter(|p| p.alive) {
            let mut kept = Vec::new();
            for lease in pod.leases.drain(..) {
                match lease.check().await {
                    Ok(()) => kept.push(lease),
                    Err(LeaseError::Lost { .. }) => {
                        lease.release().await.unwrap();
                    }
                    Err(e) => panic!("check on a healthy pod failed: {e}"),
                }
            }
            pod.leases = kept;
        }
        let operator_leases = std::mem::take(&mut *self.shared.operator_leases.lock().unwrap());
        let mut kept = Vec::new();
        for lease in operator_leases {
            match lease.check().await {
                Ok(()) => kept.push(lease),
                Err(_) => {
                    lease.release().await.unwrap();
                }
            }
        }
        *self.shared.operator_leases.lock().unwrap() = kept;
    }

    /// Lets `SAFETY` + 1 ms pass in steps shorter than any TTL, the live pods using their leases throughout,
    /// then runs a full sweep.
    async fn pass_safety_and_sweep(&mut self) {
        for _ in 0..10 {
            self.shared.clock.advance(SAFETY_MS / 10 + 1);
            self.keep_alive().await;
        }
        let r = self.shared.operator_sweeper.sweep_once().await.unwrap();
        self.shared.operator.reaper().flush().await;
        note(&self.shared.log, format!("quiescence sweep: {r:?}"));
    }

    /// Quiescence: nobody crashes or fails any more, judged-dead live pods are alive again, pending plans are
    /// dropped. Two rounds of "safety margin, sweep" (the first round's reaps make counters recent) repair
    /// every drift; then everyone releases and the store must end up empty.
    async fn quiesce(&mut self) {
        self.shared.plans.lock().unwrap().clear();
        for pod in self.pods.iter().filter(|p| p.alive) {
            pod.store.clear_plan();
            self.registry.0.lock().unwrap().remove(&pod.id);
        }
        self.pass_safety_and_sweep().await;
        self.pass_safety_and_sweep().await;
        self.check_invariants().await;
        let (booked, counts) = self.booked_and_counts().await;
        assert_eq!(counts, booked, "after quiescence and reconcile, counters differ from their booked holders");

        for pod in self.pods.iter_mut().filter(|p| p.alive) {
            for lease in pod.leases.drain(..) {
                lease.release().await.unwrap();
            }
        }
        let operator_leases = std::mem::take(&mut *self.shared.operator_leases.lock().unwrap());
        for lease in operator_leases {
            lease.release().await.unwrap();
        }
        self.pass_safety_and_sweep().await;
        self.pass_safety_and_sweep().await;
        let holders = self.raw.holders(None).await.unwrap();
        assert!(holders.is_empty(), "holders left after everyone released: {holders:?}");
        let counters = self.raw.counters(None).await.unwrap();
        assert!(counters.is_empty(), "counters left after everyone released: {counters:?}");
        for pod in &self.pods {
            pod.svc.reaper().flush().await;
        }
        self.check_invariants().await;
    }
}

async fn simulate(seed: u64, steps: usize, log: Log, stats: Stats) {
    let mut sim = Sim::new(seed, log, stats);
    for step in 0..steps {
        sim.step = step;
        sim.random_step().await;
        sim.end_step().await;
    }
    sim.step = steps;
    sim.quiesce().await;
}
