//! Fail-closed against an unreachable MongoDB: `LEASE_UNAVAILABLE`, and no lease handed out.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_shared::{LeaseError, MongoStore};
use support::proxy::CutProxy;
use support::{def, request, service_on};

const DEF: &str = "name: pdf\nlevels: {global: 6, project: 1}\nwaitMs: 2000\n";

fn test_mongod_addr() -> SocketAddr {
    let uri = std::env::var(support::MONGODB_URI_VAR)
        .unwrap_or_else(|_| panic!("{} is not set: run the tests with scripts/test.sh", support::MONGODB_URI_VAR));
    let hostport = uri.trim_start_matches("mongodb://").split(['/', '?']).next().unwrap();
    hostport.parse().unwrap_or_else(|e| panic!("{uri}: these tests need a mongodb://ip:port URI ({e})"))
}

#[tokio::test]
async fn closed_port_fails_with_lease_unavailable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let uri = format!("mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=500&connectTimeoutMS=500");
    let (_client, store) = MongoStore::connect(&uri, "unreachable").await.unwrap();
    let svc = service_on(Arc::new(store), &[def(DEF)], None);
    match svc.acquire(request("pdf", "t1", "p1", "u1")).await {
        Err(LeaseError::Unavailable { reason }) => assert!(reason.contains("insert_holder"), "{reason}"),
        other => panic!("expected LEASE_UNAVAILABLE, got {other:?}"),
    }
}

#[tokio::test]
async fn server_that_goes_away_fails_acquire_and_check_with_lease_unavailable() {
    let db = support::mongo_database("goes_away").await;
    let proxy = CutProxy::start(test_mongod_addr()).await;
    let uri = format!("mongodb://{}/?serverSelectionTimeoutMS=800&connectTimeoutMS=500", proxy.addr);
    let (_client, store) = MongoStore::connect(&uri, db.name()).await.unwrap();
    let svc = service_on(Arc::new(store), &[def(DEF)], None);

    let held = svc.acquire(request("pdf", "t1", "p1", "u1")).await.expect("acquire while the server answers");
    held.check().await.unwrap();
    proxy.cut();

    let started = std::time::Instant::now();
    let err = svc.acquire(request("pdf", "t1", "p2", "u2")).await.unwrap_err();
    assert_eq!(err.code(), "LEASE_UNAVAILABLE", "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "an outage must not hang the caller");
    // A check during the outage is not LEASE_LOST: the lease may well still be held.
    assert_eq!(held.check().await.unwrap_err().code(), "LEASE_UNAVAILABLE");
    // Nothing was handed out behind the outage: only the first holder exists.
    let direct = MongoStore::new(&db);
    use lease_shared::LeaseStore;
    assert_eq!(direct.holders(None).await.unwrap().len(), 1);
    std::mem::forget(held); // its release would only fail against the cut proxy
    let _ = db.drop().await;
}
