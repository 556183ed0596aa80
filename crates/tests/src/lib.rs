//! End-to-end tests across processes: several `brain` processes on one MongoDB, real HTTP on loopback.
//!
//! The tests live in `tests/`; this library holds their helpers: the test database, spawning and killing brain
//! processes, minting tokens, a webhook callback receiver, and direct reads of the lease collections.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::TryStreamExt;
use lease_brain::auth::JwtKeys;
use mongodb::bson::{Document, doc};
use serde_json::Value;
use tokio::process::{Child, Command};

/// The JWT secret every test brain is configured with.
pub const JWT_SECRET: &str = "e2e-jwt-secret-0123456789";
/// The internal secret every test brain is configured with.
pub const INTERNAL_SECRET: &str = "e2e-internal-secret-0123456789";
/// The header carrying the internal secret.
pub const INTERNAL_HEADER: &str = "x-vance-internal-secret";

/// A fresh database on the test MongoDB (`LEASE_TEST_MONGODB_URI`); fails loudly without one.
pub async fn test_database(test: &str) -> (String, mongodb::Database) {
    let uri = std::env::var("LEASE_TEST_MONGODB_URI").unwrap_or_else(|_| {
        panic!("LEASE_TEST_MONGODB_URI is not set: run the tests with scripts/test.sh (it starts a real mongod)")
    });
    let client = mongodb::Client::with_uri_str(&uri).await.expect("test MongoDB URI");
    let name = format!("e2e_{test}_{}_{:08x}", std::process::id(), rand::random::<u32>());
    let db = client.database(&name);
    db.run_command(doc! { "ping": 1 }).await.unwrap_or_else(|e| panic!("test MongoDB at {uri} unreachable: {e}"));
    (uri, db)
}

/// A binary of this workspace's lease-brain package (`brain`, `anus`, `tex2pdf-double`), built by `scripts/test.sh`
/// (`cargo build -p lease-brain --bins`) before the tests run.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let path = exe.parent().and_then(|deps| deps.parent()).map(|dir| dir.join(name)).expect("target dir");
    assert!(path.exists(), "{} is missing: run `cargo build -p lease-brain --bins` first", path.display());
    path
}

/// The tex2pdf test double as a process of its own, shared by several brains.
#[derive(Debug)]
pub struct DoubleProcess {
    /// Its base URL.
    pub url: String,
    _child: Child,
}

impl DoubleProcess {
    /// Starts the double with `max_concurrent` jobs (0 = unlimited) of `job_ms` each.
    pub async fn start(max_concurrent: usize, job_ms: u64) -> DoubleProcess {
        let port = free_port();
        let child = Command::new(binary("tex2pdf-double"))
            .env("TEX2PDF_DOUBLE_LISTEN", format!("127.0.0.1:{port}"))
            .env("TEX2PDF_DOUBLE_MAX_CONCURRENT", max_concurrent.to_string())
            .env("TEX2PDF_DOUBLE_JOB_MS", job_ms.to_string())
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the tex2pdf double");
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..400 {
            if reqwest::get(format!("{url}/stats")).await.is_ok() {
                return DoubleProcess { url, _child: child };
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the tex2pdf double never answered");
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One brain process.
#[derive(Debug)]
pub struct BrainProcess {
    /// Its pod id.
    pub pod: String,
    /// Its base URL.
    pub base: String,
    child: Child,
}

impl BrainProcess {
    /// Starts a brain on `db` with pod id `pod`, short heartbeats and the test secrets; `extra` adds or overrides
    /// environment variables. Waits until it is ready.
    pub async fn start(uri: &str, db: &str, pod: &str, extra: &[(&str, &str)]) -> BrainProcess {
        Self::spawn(Some((uri, db)), pod, extra).await
    }

    /// Starts a brain on the embedded (in-process) store, otherwise as [`BrainProcess::start`].
    pub async fn start_embedded(pod: &str, extra: &[(&str, &str)]) -> BrainProcess {
        Self::spawn(None, pod, extra).await
    }

    async fn spawn(mongodb: Option<(&str, &str)>, pod: &str, extra: &[(&str, &str)]) -> BrainProcess {
        let port = free_port();
        let mut cmd = Command::new(binary("brain"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "error")
            .env("BRAIN_LISTEN", format!("127.0.0.1:{port}"));
        if let Some((uri, db)) = mongodb {
            cmd.env("BRAIN_MONGODB_URI", uri).env("BRAIN_MONGODB_DATABASE", db);
        }
        cmd.env("BRAIN_POD_ID", pod)
            .env("BRAIN_INTERNAL_SECRET", INTERNAL_SECRET)
            .env("BRAIN_JWT_SECRET", JWT_SECRET)
            .env("BRAIN_HEARTBEAT_INTERVAL_MS", "200")
            .env("BRAIN_HEARTBEAT_STALENESS_MS", "1500")
            .env("VANCE_LEASE_REAP_INTERVAL_MS", "300")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn the brain");
        let base = format!("http://127.0.0.1:{port}");
        let mut me = BrainProcess { pod: pod.to_owned(), base, child };
        for _ in 0..400 {
            if reqwest::get(format!("{}/readyz", me.base)).await.is_ok_and(|r| r.status() == 200) {
                return me;
            }
            if let Ok(Some(status)) = me.child.try_wait() {
                panic!("brain {pod} exited before it was ready: {status}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("brain {pod} never became ready");
    }

    /// `kill -9`: no shutdown step at all.
    pub async fn kill9(&mut self) {
        self.child.kill().await.expect("kill -9");
    }

    /// SIGTERM, then waits for the exit; returns whether it exited successfully.
    pub async fn terminate(&mut self) -> bool {
        let pid = self.child.id().expect("running").to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().await.expect("kill -TERM");
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.expect("exit").unwrap();
        status.success()
    }
}

/// What one run of the operator CLI (`anus`) left.
#[derive(Debug)]
pub struct AnusRun {
    /// The exit code (-1 when killed by a signal).
    pub code: i32,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl AnusRun {
    /// Stdout parsed as JSON (of a `--json` run); panics with the whole run otherwise.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("anus printed no JSON ({e}): {self:?}"))
    }

    /// Asserts exit code 0 and returns the run.
    pub fn ok(self) -> AnusRun {
        assert_eq!(self.code, 0, "anus failed: {self:?}");
        self
    }
}

/// Runs `anus` with exactly `env` (plus `PATH`) and `args`.
pub async fn anus(env: &[(&str, &str)], args: &[&str]) -> AnusRun {
    let out = Command::new(binary("anus"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out).await.expect("anus finished").expect("run anus");
    AnusRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A lease API token for `tenant` / `user`.
pub fn token(tenant: &str, user: &str) -> String {
    JwtKeys::new(JWT_SECRET).mint(tenant, user, &[], 3600)
}

/// A webhook callback receiver: records every POSTed body.
pub async fn callback_server() -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/revoked",
        axum::routing::post(move |axum::Json(v): axum::Json<Value>| {
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

/// Waits (bounded) until `seen` holds at least `n` callbacks, then returns them.
pub async fn wait_for_callbacks(seen: &Arc<Mutex<Vec<Value>>>, n: usize, within: Duration) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + within;
    while seen.lock().unwrap().len() < n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    seen.lock().unwrap().clone()
}

/// Every holder document, read directly.
pub async fn holders(db: &mongodb::Database) -> Vec<Document> {
    db.collection::<Document>("resource_lease_holders").find(doc! {}).await.unwrap().try_collect().await.unwrap()
}

/// Every counter document, read directly.
pub async fn counters(db: &mongodb::Database) -> Vec<Document> {
    db.collection::<Document>("resource_lease_counters").find(doc! {}).await.unwrap().try_collect().await.unwrap()
}
