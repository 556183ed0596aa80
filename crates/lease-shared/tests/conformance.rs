//! The conformance suite of the funnel (spec §3–§4): every test runs against the in-memory store and the real
//! MongoDB.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lease_shared::store::{CounterKey, DeleteCondition, HolderState};
use lease_shared::{LeaseError, LeaseRef, LeaseRequest, Level, ReleaseOutcome};
use rand::Rng;
use support::faulty::Fault;
use support::{Backend, Fixture, def, request, service_on};

on_both_stores!(
    acquire_check_payload_release_round_trip,
    noop_and_no_lease_make_no_store_call,
    first_use_race_admits_every_acquirer_below_the_cap,
    acquire_rolls_back_when_tenant_level_is_full,
    store_error_mid_funnel_is_unavailable_and_leaves_nothing_behind,
    caps_hold_under_concurrent_acquirers_on_two_services,
    busy_after_wait_names_level_and_occupancy,
    slot_freed_during_the_wait_is_taken,
    waiting_polls_the_full_counter_instead_of_running_the_funnel_again,
    check_after_holder_deleted_behind_its_back_is_lost,
    checks_in_the_same_millisecond_both_succeed,
    invalid_requests_are_rejected_without_writing,
    dropped_lease_is_released_in_the_background,
    full_level_of_idle_holders_is_swept_by_the_next_acquire,
    inline_definitions_count_on_a_project_private_resource,
    tenant_views_read_only_that_tenants_holders_and_counters,
);

const THREE_LEVELS: &str = "name: pdf\nresource: pdf-svc\nlevels: {global: 6, tenant: 3, user: 2}\nttlSeconds: 60\n";

async fn acquire_check_payload_release_round_trip(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def(THREE_LEVELS)]);
    let mut payload = lease_shared::Payload::new();
    payload.insert("jobId".into(), "j-1".into());

    let lease = svc.acquire(request("pdf", "t1", "p1", "u1").payload(payload)).await.unwrap();
    assert!(!lease.is_noop());
    let token = lease.token().unwrap().to_owned();
    assert_eq!(token.len(), 32);
    let h = fx.raw.holder(&token).await.unwrap().expect("holder stored");
    assert_eq!(h.state, HolderState::Held);
    assert_eq!(h.levels, vec!["pdf-svc|user|t1/u1", "pdf-svc|tenant|t1", "pdf-svc|global|*"], "narrow to wide");
    assert_eq!((h.lease_type.as_str(), h.lease.as_str(), h.resource.as_str()), ("test", "pdf", "pdf-svc"));
    assert_eq!((h.pod.as_str(), h.pod_bound, h.ttl_seconds), ("pod-a", true, 60));
    assert_eq!(h.payload["jobId"], "j-1");
    assert_eq!(fx.counts().await.values().sum::<i64>(), 3);

    lease.check().await.unwrap();
    let mut payload = lease_shared::Payload::new();
    payload.insert("jobId".into(), "j-2".into());
    lease.update_payload(payload).await.unwrap();
    assert_eq!(fx.raw.holder(&token).await.unwrap().unwrap().payload["jobId"], "j-2");

    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(fx.raw.holder(&token).await.unwrap().is_none());
    assert!(fx.counts().await.values().all(|c| *c == 0), "{:?}", fx.counts().await);
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::AlreadyReleased);
    assert!(fx.counts().await.values().all(|c| *c == 0), "second release decremented again");
    assert!(matches!(lease.check().await, Err(LeaseError::Lost { .. })));
    fx.drop_database().await;
}

async fn noop_and_no_lease_make_no_store_call(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def("name: free\nttlSeconds: 5\n")]);
    for lease_ref in [LeaseRef::None, LeaseRef::Name("free".into())] {
        let req = LeaseRequest::new("test", lease_ref, "t1", "p1").user("u1");
        let lease = svc.acquire(req).await.unwrap();
        assert!(lease.is_noop());
        lease.check().await.unwrap();
        lease.update_payload(Default::default()).await.unwrap();
        lease.release().await.unwrap();
    }
    assert_eq!(fx.store.total_calls(), 0, "a NOOP lease must not touch the store");
    fx.drop_database().await;
}

async fn first_use_race_admits_every_acquirer_below_the_cap(backend: Backend) {
    let fx = Fixture::new(backend).await;
    // A new resource each round, so every counter is used for the first time by all racers at once.
    let defs: Vec<_> = (0..5)
        .map(|r| def(&format!("name: race{r}\nlevels: {{global: 100, tenant: 100, project: 100, user: 100}}\n")))
        .collect();
    let services = [fx.service(&defs), service_on(fx.second_store().await, &defs, None)];
    for round in 0..5 {
        let (tenant, lease) = (format!("t{round}"), format!("race{round}"));
        let barrier = Arc::new(tokio::sync::Barrier::new(40));
        let tasks: Vec<_> = (0..40)
            .map(|i| {
                let (svc, tenant, lease, barrier) =
                    (services[i % 2].clone(), tenant.clone(), lease.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    svc.acquire(request(&lease, &tenant, "p1", "u1")).await
                })
            })
            .collect();
        let mut leases = Vec::new();
        for t in tasks {
            leases.push(t.await.unwrap().unwrap_or_else(|e| panic!("a first-use racer was refused: {e}")));
        }
        assert_eq!(fx.counts().await[&format!("race{round}|global|*")], 40);
        fx.assert_counters_match_holders().await;
        for l in leases {
            l.release().await.unwrap();
        }
    }
    fx.drop_database().await;
}

async fn acquire_rolls_back_when_tenant_level_is_full(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def("name: tight\nlevels: {tenant: 1, project: 5, user: 5}\n")]);
    let first = svc.acquire(request("tight", "t1", "p1", "u1")).await.unwrap();
    let err = svc.acquire(request("tight", "t1", "p2", "u2")).await.unwrap_err();
    let LeaseError::Busy(busy) = err else { panic!("expected LEASE_BUSY, got {err:?}") };
    assert_eq!((busy.level, busy.scope.as_str(), busy.count, busy.cap), (Level::Tenant, "t1", 1, 1));
    let holders = fx.raw.holders(None).await.unwrap();
    assert_eq!(holders.len(), 1, "the refused attempt left its holder behind");
    assert_eq!(holders[0].token, first.token().unwrap());
    let counts = fx.counts().await;
    assert_eq!(counts["tight|user|t1/u2"], 0, "user slot not returned");
    assert_eq!(counts["tight|project|t1/p2"], 0, "project slot not returned");
    assert_eq!(counts["tight|tenant|t1"], 1);
    fx.assert_counters_match_holders().await;
    first.release().await.unwrap();
    fx.drop_database().await;
}

async fn store_error_mid_funnel_is_unavailable_and_leaves_nothing_behind(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def(THREE_LEVELS)]);
    // Warm the counters so the funnel's calls are the plain ones.
    svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap().release().await.unwrap();
    for (primitive, nth, fault) in [
        ("push_level", 2, Fault::Before),
        ("push_level", 3, Fault::After),
        ("try_increment", 3, Fault::Before),
        ("insert_holder", 1, Fault::After),
    ] {
        fx.store.fail(primitive, nth, fault);
        let err = svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap_err();
        assert_eq!(err.code(), "LEASE_UNAVAILABLE", "{primitive}#{nth}: {err}");
        assert!(fx.raw.holders(None).await.unwrap().is_empty(), "{primitive}#{nth}: holder left behind");
        assert!(fx.counts().await.values().all(|c| *c == 0), "{primitive}#{nth}: {:?}", fx.counts().await);
    }
    fx.drop_database().await;
}

async fn caps_hold_under_concurrent_acquirers_on_two_services(backend: Backend) {
    let fx = Fixture::new(backend).await;
    // Every level alone at caps 1 and 2, and all four together: each level gets to be the one that binds.
    let mut defs = Vec::new();
    for level in ["user", "project", "tenant", "global"] {
        for cap in [1, 2] {
            defs.push(def(&format!("name: {level}{cap}\nlevels: {{{level}: {cap}}}\nwaitMs: 20\nttlSeconds: 60\n")));
        }
    }
    defs.push(def("name: all\nlevels: {global: 2, tenant: 2, project: 1, user: 1}\nwaitMs: 20\nttlSeconds: 60\n"));
    let caps: HashMap<String, u32> = defs
        .iter()
        .flat_map(|d| d.levels.narrow_to_wide().map(move |(l, c)| (format!("{}|{}", d.resource, l), c)))
        .collect();
    let names: Vec<String> = defs.iter().map(|d| d.name.clone()).collect();
    let services = [fx.service(&defs), service_on(fx.second_store().await, &defs, None)];

    let stop = Arc::new(AtomicBool::new(false));
    let (granted, busy) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (svc, names, stop) = (services[i % 2].clone(), names.clone(), stop.clone());
        let (granted, busy) = (granted.clone(), busy.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (name, t, p, u) = {
                    let mut rng = rand::rng();
                    let name = names[rng.random_range(0..names.len())].clone();
                    (name, rng.random_range(0..2), rng.random_range(0..2), rng.random_range(0..3))
                };
                match svc.acquire(request(&name, &format!("t{t}"), &format!("p{p}"), &format!("u{u}"))).await {
                    Ok(lease) => {
                        granted.fetch_add(1, Ordering::Relaxed);
                        lease.check().await.unwrap();
                        let pause = Duration::from_micros(rand::rng().random_range(0..2000));
                        tokio::time::sleep(pause).await;
                        lease.release().await.unwrap();
                    }
                    Err(LeaseError::Busy(_)) => {
                        busy.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("unexpected error under load: {e}"),
                }
            }
        }));
    }
    // The sampler reads holders directly and counts, per counter, the holders booking it.
    let sampler = {
        let (raw, stop, caps) = (fx.raw.clone(), stop.clone(), caps.clone());
        tokio::spawn(async move {
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut booked: HashMap<String, u32> = HashMap::new();
                for h in raw.holders(None).await.unwrap() {
                    for l in h.levels {
                        *booked.entry(l).or_default() += 1;
                    }
                }
                for (id, n) in booked {
                    let key = CounterKey::parse(&id).unwrap();
                    let cap = caps[&format!("{}|{}", key.resource, key.level)];
                    assert!(n <= cap, "{n} holders book {id}, cap {cap}");
                }
                for c in raw.counters(None).await.unwrap() {
                    let key = CounterKey::parse(&c.id).unwrap();
                    let cap = caps[&format!("{}|{}", key.resource, key.level)];
                    assert!(c.count <= i64::from(cap), "counter {} at {} over cap {cap}", c.id, c.count);
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples
        })
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let samples = sampler.await.unwrap();
    let (granted, busy) = (granted.load(Ordering::Relaxed), busy.load(Ordering::Relaxed));
    eprintln!("granted {granted}, busy {busy}, samples {samples}");
    assert!(granted > 200, "too little work to prove anything: {granted} grants");
    assert!(busy > 0, "no acquirer was ever refused: the caps were never contended");
    assert!(samples > 20, "the sampler sampled {samples} times only");
    fx.assert_counters_match_holders().await;
    fx.drop_database().await;
}

async fn busy_after_wait_names_level_and_occupancy(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def("name: one\nlevels: {project: 1, global: 10}\nwaitMs: 300\nttlSeconds: 30\n")]);
    let held = svc.acquire(request("one", "t1", "p1", "u1")).await.unwrap();
    let started = Instant::now();
    let err = svc.acquire(request("one", "t1", "p1", "u2")).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300), "gave up before waitMs: {:?}", started.elapsed());
    let LeaseError::Busy(busy) = err else { panic!("expected LEASE_BUSY, got {err:?}") };
    assert_eq!(busy.resource, "one");
    assert_eq!((busy.level, busy.scope.as_str(), busy.count, busy.cap), (Level::Project, "t1/p1", 1, 1));
    let retry = busy.retry_after_ms.expect("the holder's idle expiry is known");
    assert!(retry <= 30_000 && retry > 0, "retry after {retry} ms");
    held.release().await.unwrap();
    fx.drop_database().await;
}

async fn slot_freed_during_the_wait_is_taken(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def("name: one\nlevels: {project: 1}\nwaitMs: 10000\nttlSeconds: 30\n")]);
    let held = svc.acquire(request("one", "t1", "p1", "u1")).await.unwrap();
    let waiter = {
        let svc = svc.clone();
        tokio::spawn(async move { svc.acquire(request("one", "t1", "p1", "u2")).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter got a slot that was held");
    held.release().await.unwrap();
    let lease = waiter.await.unwrap().expect("the freed slot goes to the waiter");
    assert_eq!(fx.raw.holder(lease.token().unwrap()).await.unwrap().unwrap().user_id.as_deref(), Some("u2"));
    lease.release().await.unwrap();
    fx.drop_database().await;
}

async fn waiting_polls_the_full_counter_instead_of_running_the_funnel_again(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def("name: one\nlevels: {project: 1}\nwaitMs: 600\nttlSeconds: 30\n")]);
    let held = svc.acquire(request("one", "t1", "p1", "u1")).await.unwrap();
    let (funnels, polls) = (fx.store.calls("insert_holder"), fx.store.calls("counter_count"));
    assert_eq!(svc.acquire(request("one", "t1", "p1", "u2")).await.unwrap_err().code(), "LEASE_BUSY");
    assert_eq!(fx.store.calls("insert_holder") - funnels, 1, "the wait ran the funnel again while the level was full");
    assert!(fx.store.calls("counter_count") - polls >= 2, "the wait did not poll the counter");
    held.release().await.unwrap();
    fx.drop_database().await;
}

async fn check_after_holder_deleted_behind_its_back_is_lost(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def(THREE_LEVELS)]);
    let lease = svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap();
    lease.check().await.unwrap();
    fx.raw.delete_holder(lease.token().unwrap(), DeleteCondition::Any).await.unwrap().expect("deleted");
    let err = lease.check().await.unwrap_err();
    assert_eq!(err.code(), "LEASE_LOST");
    assert_eq!(lease.update_payload(Default::default()).await.unwrap_err().code(), "LEASE_LOST");
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::AlreadyReleased);
    fx.drop_database().await;
}

async fn checks_in_the_same_millisecond_both_succeed(backend: Backend) {
    let fx = Fixture::new(backend).await;
    // Count touches that matched the holder but modified nothing: MongoDB's reply for a second touch within the
    // same millisecond (`n: 1, nModified: 0`). On the manual clock every touch is within the same millisecond.
    let unmodified_touches = Arc::new(AtomicUsize::new(0));
    let store: Arc<dyn lease_shared::LeaseStore> = match &fx.db {
        None => fx.store.clone(),
        Some(db) => {
            let uri = std::env::var(support::MONGODB_URI_VAR).unwrap();
            let mut options = mongodb::options::ClientOptions::parse(&uri).await.unwrap();
            let seen = unmodified_touches.clone();
            options.command_event_handler = Some(mongodb::event::EventHandler::callback(move |ev| {
                if let mongodb::event::command::CommandEvent::Succeeded(ok) = ev {
                    let r = &ok.reply;
                    if ok.command_name == "update" && r.get_i32("n") == Ok(1) && r.get_i32("nModified") == Ok(0) {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
            let client = mongodb::Client::with_options(options).unwrap();
            Arc::new(lease_shared::MongoStore::new(&client.database(db.name())))
        }
    };
    let svc = service_on(store, &[def(THREE_LEVELS)], None);
    let lease = svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap();
    let token = lease.token().unwrap().to_owned();
    for _ in 0..300 {
        let checks = (0..8).map(|_| lease.check());
        for r in futures_util::future::join_all(checks).await {
            r.expect("a touch in the same millisecond as another must count as held");
        }
        if fx.db.is_some() && unmodified_touches.load(Ordering::SeqCst) >= 3 {
            break;
        }
    }
    if fx.db.is_some() {
        assert!(unmodified_touches.load(Ordering::SeqCst) >= 3, "no two touches ever fell into one millisecond");
    } else {
        let h = fx.raw.holder(&token).await.unwrap().unwrap();
        assert_eq!(h.last_seen_at_ms, h.acquired_at_ms, "the manual clock moved");
    }
    lease.release().await.unwrap();
    fx.drop_database().await;
}

async fn invalid_requests_are_rejected_without_writing(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def(THREE_LEVELS)]);
    let name = |n: &str| LeaseRef::Name(n.to_owned());
    let cases = [
        ("type", LeaseRequest::new("nobody-handles-this", name("pdf"), "t1", "p1").user("u1")),
        ("lease", LeaseRequest::new("test", name("../pdf"), "t1", "p1").user("u1")),
        ("lease", LeaseRequest::new("test", name("missing"), "t1", "p1").user("u1")),
        ("tenantId", LeaseRequest::new("test", name("pdf"), "t|1", "p1").user("u1")),
        ("projectId", LeaseRequest::new("test", name("pdf"), "t1", "").user("u1")),
        ("userId", LeaseRequest::new("test", name("pdf"), "t1", "p1").user("a/b")),
        ("userId", LeaseRequest::new("test", name("pdf"), "t1", "p1")),
    ];
    for (field, req) in cases {
        match svc.acquire(req).await {
            Err(LeaseError::InvalidRequest { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected INVALID_REQUEST on {field}, got {other:?}"),
        }
    }
    assert_eq!(fx.store.total_calls(), 0, "an invalid request reached the store");
    fx.drop_database().await;
}

async fn dropped_lease_is_released_in_the_background(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def(THREE_LEVELS)]);
    let lease = svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap();
    let token = lease.token().unwrap().to_owned();
    let panicked = tokio::spawn(async move {
        let _lease = lease;
        panic!("the caller panics while holding its lease");
    });
    assert!(panicked.await.is_err());
    let deadline = Instant::now() + Duration::from_secs(10);
    while fx.raw.holder(&token).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the dropped lease was never released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The release decrements right after deleting the holder.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(fx.counts().await.values().all(|c| *c == 0), "{:?}", fx.counts().await);
    fx.drop_database().await;
}

async fn full_level_of_idle_holders_is_swept_by_the_next_acquire(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def("name: short\nlevels: {project: 1}\nttlSeconds: 1\nwaitMs: 0\n")]);
    let idle = svc.acquire(request("short", "t1", "p1", "u1")).await.unwrap();
    assert_eq!(svc.acquire(request("short", "t1", "p1", "u2")).await.unwrap_err().code(), "LEASE_BUSY");
    fx.pass_time(1_200).await;
    let next = svc.acquire(request("short", "t1", "p1", "u2")).await.expect("the idle holder is swept");
    assert_eq!(idle.check().await.unwrap_err().code(), "LEASE_LOST");
    assert_eq!(fx.counts().await["short|project|t1/p1"], 1);
    next.release().await.unwrap();
    idle.release().await.unwrap();
    fx.drop_database().await;
}

async fn inline_definitions_count_on_a_project_private_resource(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[]);
    let inline = |yaml: &str| LeaseRef::Inline(lease_shared::DefinitionDocument::parse(yaml).unwrap());
    let browser = "name: browser\nlevels: {project: 1}\n";
    let a = svc.acquire(LeaseRequest::new("mcp", inline(browser), "t1", "p1")).await.unwrap();
    assert_eq!(a.resource(), Some("mcp-inline:t1/p1/browser"));
    // The same inline name in another project is another funnel; in the same project it is the same one.
    let b = svc.acquire(LeaseRequest::new("mcp", inline(browser), "t1", "p2")).await.unwrap();
    assert_eq!(
        svc.acquire(LeaseRequest::new("mcp", inline(browser), "t1", "p1")).await.unwrap_err().code(),
        "LEASE_BUSY"
    );
    for (yaml, field) in [
        ("name: b\nresource: tex2pdf\nlevels: {project: 1}\n", "resource"),
        ("name: b\nlevels: {global: 100}\n", "levels.global"),
        ("name: b\nlevels: {tenant: 100}\n", "levels.tenant"),
        ("levels: {project: 1}\n", "name"),
    ] {
        match svc.acquire(LeaseRequest::new("mcp", inline(yaml), "t1", "p1")).await {
            Err(LeaseError::InvalidRequest { field: f, .. }) => assert_eq!(f, field),
            other => panic!("inline {field} accepted: {other:?}"),
        }
    }
    a.release().await.unwrap();
    b.release().await.unwrap();
    fx.drop_database().await;
}

async fn tenant_views_read_only_that_tenants_holders_and_counters(backend: Backend) {
    let fx = Fixture::new(backend).await;
    let svc = fx.service(&[def(THREE_LEVELS), def("name: proj\nlevels: {project: 5}\n")]);
    let mut leases = Vec::new();
    for (tenant, lease) in [("t1", "pdf"), ("t1", "proj"), ("t10", "pdf"), ("t10", "proj"), ("u1", "proj")] {
        leases.push(svc.acquire(request(lease, tenant, "p1", "u1")).await.unwrap());
    }
    let holders = fx.raw.tenant_holders("t1").await.unwrap();
    assert_eq!(holders.len(), 2);
    assert!(holders.iter().all(|h| h.tenant_id == "t1"));
    let mut ids: Vec<String> = fx.raw.tenant_counters("t1").await.unwrap().into_iter().map(|c| c.id).collect();
    ids.sort();
    // Not t10's (a prefix of the id is not the tenant), not the global level (it belongs to no tenant).
    assert_eq!(ids, vec!["pdf-svc|tenant|t1", "pdf-svc|user|t1/u1", "proj|project|t1/p1"]);

    if let Some(db) = &fx.db {
        // The tenant's holders are found through an index, not by scanning every tenant's.
        let explain = db
            .run_command(mongodb::bson::doc! {
                "explain": { "find": lease_shared::store::HOLDERS, "filter": { "tenantId": "t1" } },
                "verbosity": "queryPlanner",
            })
            .await
            .unwrap();
        let plan = explain.get_document("queryPlanner").unwrap().get_document("winningPlan").unwrap().to_string();
        assert!(plan.contains("IXSCAN") && plan.contains("tenantId_1") && !plan.contains("COLLSCAN"), "{plan}");
    }

    // A tenant-bound check: one round trip that touches only the tenant's own holder and names its resource.
    let token = leases[0].token().unwrap().to_owned();
    let seen = |fx: &Fixture, token: String| {
        let raw = fx.raw.clone();
        async move { raw.holder(&token).await.unwrap().unwrap().last_seen_at_ms }
    };
    let before = seen(&fx, token.clone()).await;
    fx.pass_time(20).await;
    let calls = fx.store.total_calls();
    assert!(!svc.check_for_tenant(&token, "t10").await.unwrap(), "another tenant's lease");
    assert_eq!(seen(&fx, token.clone()).await, before, "another tenant's check touched the lease");
    assert!(svc.check_for_tenant(&token, "t1").await.unwrap());
    assert!(seen(&fx, token.clone()).await > before, "the check did not touch");
    assert_eq!(fx.store.calls("touch_in_tenant"), 2);
    assert_eq!(fx.store.total_calls() - calls, 3, "own: one round trip; foreign: a touch that missed and one read");
    assert_eq!(fx.raw.touch_in_tenant(&token, "t1").await.unwrap().as_deref(), Some("pdf-svc"));
    assert_eq!(fx.raw.touch_in_tenant("no-such-token", "t1").await.unwrap(), None);
    match svc.check_for_tenant("no-such-token", "t1").await {
        Err(LeaseError::Lost { .. }) => {}
        other => panic!("a missing lease must be LEASE_LOST, got {other:?}"),
    }
    for l in leases {
        l.release().await.unwrap();
    }
    fx.drop_database().await;
}

/// The funnel's schedule, in tokio's paused time over the in-memory store with a fixed latency per primitive: an
/// uncontended acquire over k = 3 levels makes 2k + 1 = 7 calls, but each push overlaps the next level's increment,
/// so it takes k + 2 = 5 latencies, never more than 2 calls at once; increments still run one after the other,
/// narrow → wide.
#[tokio::test(start_paused = true)]
async fn each_push_overlaps_the_next_increment_and_increments_stay_in_order() {
    let fx = Fixture::new(Backend::Memory).await;
    let svc = fx.service(&[def(THREE_LEVELS)]);
    // Counters created by a first acquisition, so the funnel's calls are the plain ones.
    svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap().release().await.unwrap();
    let latency = Duration::from_millis(10);
    fx.store.set_latency(latency);
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    for nth in 1..=3 {
        let order = order.clone();
        fx.store.before("try_increment", nth, move || async move { order.lock().unwrap().push(nth) });
    }
    fx.store.take_max_in_flight();
    let calls = fx.store.total_calls();

    let start = tokio::time::Instant::now();
    let lease = svc.acquire(request("pdf", "t1", "p1", "u1")).await.unwrap();
    let took = start.elapsed();

    assert_eq!(fx.store.total_calls() - calls, 7, "2k + 1 calls");
    assert_eq!(took, 5 * latency, "k + 2 latencies");
    assert_eq!(fx.store.take_max_in_flight(), 2);
    assert_eq!(*order.lock().unwrap(), [1, 2, 3]);
    let holder = fx.raw.holder(lease.token().unwrap()).await.unwrap().unwrap();
    assert_eq!(holder.state, HolderState::Held);
    assert_eq!(holder.levels, ["pdf-svc|user|t1/u1", "pdf-svc|tenant|t1", "pdf-svc|global|*"]);
    lease.release().await.unwrap();
    fx.assert_counters_match_holders().await;
}
