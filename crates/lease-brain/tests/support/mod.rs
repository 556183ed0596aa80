//! Support for the brain's tests: in-process pods on the real MongoDB (one database per test), tokens, a webhook
//! callback receiver, direct reads of the holders.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use lease_brain::BrainConfig;
use lease_brain::auth::JwtKeys;
use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

pub const JWT_SECRET: &str = "test-jwt-secret-0123456789";
pub const INTERNAL_SECRET: &str = "test-internal-secret-0123456789";

pub async fn test_database(test: &str) -> (String, mongodb::Database) {
    let uri = std::env::var("LEASE_TEST_MONGODB_URI").unwrap_or_else(|_| {
        panic!("LEASE_TEST_MONGODB_URI is not set: run the tests with scripts/test.sh (it starts a real mongod)")
    });
    let client = mongodb::Client::with_uri_str(&uri).await.expect("test MongoDB URI");
    let name = format!("lb_{test}_{}_{:x}", std::process::id(), rand_u32());
    let db = client.database(&name);
    db.run_command(doc! { "ping": 1 }).await.unwrap_or_else(|e| panic!("test MongoDB at {uri} unreachable: {e}"));
    (uri, db)
}

pub fn rand_u32() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One brain pod in this process.
pub struct Pod {
    pub base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), lease_brain::server::StartError>>>,
}

/// The configuration of a test pod: loopback, the test secrets, short heartbeats; `extra` adds or overrides
/// variables.
pub fn pod_config(uri: &str, db: &str, pod_id: &str, port: u16, extra: &[(&str, &str)]) -> BrainConfig {
    let mut vars = vec![
        ("BRAIN_LISTEN", format!("127.0.0.1:{port}")),
        ("BRAIN_MONGODB_URI", uri.to_owned()),
        ("BRAIN_MONGODB_DATABASE", db.to_owned()),
        ("BRAIN_POD_ID", pod_id.to_owned()),
        ("BRAIN_INTERNAL_SECRET", INTERNAL_SECRET.to_owned()),
        ("BRAIN_JWT_SECRET", JWT_SECRET.to_owned()),
        ("BRAIN_HEARTBEAT_INTERVAL_MS", "200".to_owned()),
        ("BRAIN_HEARTBEAT_STALENESS_MS", "2000".to_owned()),
    ];
    for (k, v) in extra {
        vars.retain(|(n, _)| n != k);
        vars.push((k, (*v).to_owned()));
    }
    BrainConfig::from_env(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())).unwrap()
}

/// Waits (bounded) until a pod answers ready at `base`.
pub async fn await_ready(base: &str, pod_id: &str) {
    for _ in 0..400 {
        if reqwest::get(format!("{base}/readyz")).await.is_ok_and(|r| r.status() == 200) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("pod {pod_id} never became ready");
}

impl Pod {
    pub async fn start(uri: &str, db: &str, pod_id: &str) -> Pod {
        Self::start_with(uri, db, pod_id, &[]).await
    }

    /// A pod with extra configuration variables.
    pub async fn start_with(uri: &str, db: &str, pod_id: &str, extra: &[(&str, &str)]) -> Pod {
        let port = free_port();
        let config = pod_config(uri, db, pod_id, port, extra);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(lease_brain::server::run(config, async {
            let _ = rx.await;
        }));
        let base = format!("http://127.0.0.1:{port}");
        await_ready(&base, pod_id).await;
        Pod { base, stop: Some(tx), task: Some(task) }
    }

    /// Ends the pod without any shutdown step (no stopped mark): its registry entry still looks alive until
    /// it goes stale, but nothing answers at its endpoint.
    pub fn kill(&mut self) {
        self.stop.take();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

pub fn token(tenant: &str, user: &str) -> String {
    JwtKeys::new(JWT_SECRET).mint(tenant, user, &[], 600)
}

/// A token of a tenant ADMIN (the role Tenant Insights needs).
pub fn admin_token(tenant: &str, user: &str) -> String {
    JwtKeys::new(JWT_SECRET).mint(tenant, user, &["ADMIN".to_owned()], 600)
}

/// A callback receiver for webhook leases: records every POSTed body.
pub async fn callback_server() -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/revoked",
        post(move |axum::Json(v): axum::Json<Value>| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(v);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/revoked", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

pub async fn wait_for_callbacks(seen: &Arc<Mutex<Vec<Value>>>, n: usize) -> Vec<Value> {
    for _ in 0..400 {
        if seen.lock().unwrap().len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    seen.lock().unwrap().clone()
}

pub async fn acquire(http: &reqwest::Client, base: &str, bearer: &str, body: Value) -> reqwest::Response {
    http.post(format!("{base}/api/v1/leases")).bearer_auth(bearer).json(&body).send().await.unwrap()
}

pub fn webhook_body(callback: &str, project: &str) -> Value {
    json!({
        "type": "webhook",
        "inline": { "name": "remote", "levels": { "project": 1 }, "waitMs": 0, "ttlSeconds": 60 },
        "projectId": project,
        "holderRef": "job-7",
        "payload": { "callbackUrl": callback },
    })
}

pub async fn holders(db: &mongodb::Database) -> Vec<Document> {
    use futures_util::TryStreamExt;
    db.collection::<Document>("resource_lease_holders").find(doc! {}).await.unwrap().try_collect().await.unwrap()
}
