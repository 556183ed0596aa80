//! Test support: the real `@modelcontextprotocol/server-everything` (stdio and Streamable HTTP), a recording HTTP
//! proxy in front of it, and a counting session guard.
//!
//! The brain's MCP tests include this module too (`#[path]`), so it names only `mcp_client` and crates the brain
//! depends on.
//!
//! The server is found through `LEASE_MCP_EVERYTHING` (the path of its `dist/index.js`) or
//! `scripts/mcp-servers.sh path`; without it the tests fail with instructions (they never skip).
//! `LEASE_NODE` overrides the `node` binary.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use lease_shared::store::{HolderRecord, LeaseStore, MongoStore};
use lease_shared::{LayeredDefinitions, MongoDocumentStore, ResourceLeaseService};
use mcp_client::{
    GuardError, GuardedSession, SessionContext, SessionGuard, SessionInfo, SessionRefused, SessionRevoked, StdioConfig,
};
use mongodb::bson::doc;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A hang guard for start-up, not a timing assertion.
const START_LIMIT: Duration = Duration::from_secs(120);

/// The entry point (`dist/index.js`) of server-everything.
pub fn everything_entry() -> PathBuf {
    if let Ok(path) = std::env::var("LEASE_MCP_EVERYTHING") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "LEASE_MCP_EVERYTHING={} is not a file: install the server with scripts/mcp-servers.sh and set \
             LEASE_MCP_EVERYTHING to the path it prints (or unset it)",
            path.display()
        );
        return path;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp-servers.sh");
    let out = std::process::Command::new(&script).arg("path").output();
    match out {
        Ok(out) if out.status.success() => PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        Ok(out) => panic!(
            "\n\nThe MCP test server @modelcontextprotocol/server-everything is not installed.\n\
             Install it (needs node + npm) with:\n\n    scripts/mcp-servers.sh\n\n\
             or point LEASE_MCP_EVERYTHING at its dist/index.js. ({} path said: {})\n",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => {
            panic!("could not run {}: {e}; install the MCP test server with scripts/mcp-servers.sh", script.display())
        }
    }
}

/// The node binary.
pub fn node() -> String {
    std::env::var("LEASE_NODE").unwrap_or_else(|_| "node".to_owned())
}

/// server-everything over stdio.
pub fn everything_stdio() -> StdioConfig {
    StdioConfig::new(node(), [everything_entry().display().to_string(), "stdio".to_owned()])
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// A running server-everything over Streamable HTTP; killed on drop.
pub struct EverythingHttp {
    _child: Child,
    /// `http://127.0.0.1:<port>` (the MCP endpoint is `<base>/mcp`).
    pub base: String,
}

impl EverythingHttp {
    /// Starts one on a free loopback port and waits until it listens.
    pub async fn start() -> Self {
        let entry = everything_entry();
        let mut last_err = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut child = Command::new(node())
                .arg(&entry)
                .arg("streamableHttp")
                .env("PORT", port.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap_or_else(|e| panic!("could not start `{} {}`: {e}", node(), entry.display()));
            let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
            let ready = tokio::time::timeout(START_LIMIT, async {
                let mut seen = Vec::new();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.contains("listening on port") {
                        return Ok(());
                    }
                    seen.push(line);
                }
                Err(seen.join("\n"))
            })
            .await;
            match ready {
                Ok(Ok(())) => {
                    // Keep draining stderr so the server never blocks on a full pipe.
                    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                    return EverythingHttp { _child: child, base: format!("http://127.0.0.1:{port}") };
                }
                Ok(Err(stderr)) => last_err = stderr, // e.g. the port was taken meanwhile: try another
                Err(_) => panic!("server-everything did not report listening within {START_LIMIT:?}"),
            }
        }
        panic!("server-everything (streamableHttp) did not start: {last_err}");
    }

    /// The MCP endpoint.
    pub fn endpoint(&self) -> String {
        format!("{}/mcp", self.base)
    }
}

/// One request the proxy forwarded.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The HTTP method.
    pub method: Method,
    /// The path.
    pub path: String,
    /// The request headers.
    pub headers: HeaderMap,
}

impl Recorded {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Clone)]
struct ProxyState {
    upstream: String,
    client: reqwest::Client,
    log: Arc<Mutex<Vec<Recorded>>>,
}

/// An HTTP proxy in front of a server that records method, path and headers of every request and forwards it.
pub struct RecordingProxy {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    log: Arc<Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RecordingProxy {
    /// Starts a proxy to `upstream` (a base URL) on a free loopback port.
    pub async fn start(upstream: &str) -> Self {
        let log = Arc::new(Mutex::new(Vec::new()));
        let state = ProxyState { upstream: upstream.to_owned(), client: reqwest::Client::new(), log: log.clone() };
        let app = axum::Router::new().fallback(forward).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let base = format!("http://{}", listener.local_addr().expect("proxy addr"));
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("proxy serve");
        });
        RecordingProxy { base, log, task }
    }

    /// The MCP endpoint through the proxy.
    pub fn endpoint(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// Everything recorded so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().unwrap().clone()
    }

    /// The recorded requests with this method.
    pub fn with_method(&self, method: Method) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.method == method).collect()
    }
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(State(st): State<ProxyState>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    st.log.lock().unwrap().push(Recorded {
        method: method.clone(),
        path: uri.path().to_owned(),
        headers: headers.clone(),
    });
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut req = st.client.request(method, format!("{}{path}", st.upstream)).body(body);
    for (name, value) in &headers {
        if !matches!(name.as_str(), "host" | "content-length" | "connection" | "transfer-encoding") {
            req = req.header(name, value);
        }
    }
    let resp = match req.send().await {
        Ok(resp) => resp,
        Err(e) => return Response::builder().status(StatusCode::BAD_GATEWAY).body(Body::from(e.to_string())).unwrap(),
    };
    let mut out = Response::builder().status(resp.status());
    for (name, value) in resp.headers() {
        if !matches!(name.as_str(), "content-length" | "connection" | "transfer-encoding" | "keep-alive") {
            out = out.header(name, value);
        }
    }
    // Buffered: the server ends a request's event stream once it has sent the response.
    let body = resp.bytes().await.unwrap_or_default();
    out.body(Body::from(body)).unwrap()
}

/// What a [`CountingGuard`] saw and what it is told to do next.
#[derive(Default)]
pub struct GuardState {
    /// `open` calls (including refused ones).
    pub open: AtomicUsize,
    /// `after_initialize` calls.
    pub after_initialize: AtomicUsize,
    /// `check` calls.
    pub check: AtomicUsize,
    /// `close` calls.
    pub close: AtomicUsize,
    /// Refuse the next `open` with `LEASE_BUSY`.
    pub refuse_open: AtomicBool,
    /// Refuse the next `after_initialize` with `LEASE_UNAVAILABLE`.
    pub fail_after_initialize: AtomicBool,
    /// Answer the next `check` with `SessionRevoked`.
    pub revoke_next_check: AtomicBool,
    /// Refuse the next `check` with `LEASE_UNAVAILABLE`.
    pub refuse_next_check: AtomicBool,
    /// The contexts `open` was called with.
    pub contexts: Mutex<Vec<SessionContext>>,
    /// The infos `after_initialize` was called with.
    pub infos: Mutex<Vec<SessionInfo>>,
}

/// A test double of the session guard that counts calls and fails on demand. Tokens are `tok-1`, `tok-2`, …
#[derive(Clone, Default)]
pub struct CountingGuard(pub Arc<GuardState>);

impl CountingGuard {
    /// `(open, after_initialize, check, close)`.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let s = &self.0;
        (
            s.open.load(Ordering::SeqCst),
            s.after_initialize.load(Ordering::SeqCst),
            s.check.load(Ordering::SeqCst),
            s.close.load(Ordering::SeqCst),
        )
    }

    /// The infos `after_initialize` received.
    pub fn infos(&self) -> Vec<SessionInfo> {
        self.0.infos.lock().unwrap().clone()
    }
}

struct CountingSession {
    state: Arc<GuardState>,
    token: String,
}

#[async_trait]
impl SessionGuard for CountingGuard {
    async fn open(&self, ctx: &SessionContext) -> Result<Box<dyn GuardedSession>, GuardError> {
        let n = self.0.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.0.contexts.lock().unwrap().push(ctx.clone());
        if self.0.refuse_open.swap(false, Ordering::SeqCst) {
            return Err(SessionRefused::new("LEASE_BUSY", "test: busy").into());
        }
        Ok(Box::new(CountingSession { state: self.0.clone(), token: format!("tok-{n}") }))
    }
}

#[async_trait]
impl GuardedSession for CountingSession {
    fn token(&self) -> Option<&str> {
        Some(&self.token)
    }

    async fn after_initialize(&self, info: &SessionInfo) -> Result<(), GuardError> {
        self.state.after_initialize.fetch_add(1, Ordering::SeqCst);
        self.state.infos.lock().unwrap().push(info.clone());
        if self.state.fail_after_initialize.swap(false, Ordering::SeqCst) {
            return Err(SessionRefused::new("LEASE_UNAVAILABLE", "test: payload update failed").into());
        }
        Ok(())
    }

    async fn check(&self) -> Result<(), GuardError> {
        self.state.check.fetch_add(1, Ordering::SeqCst);
        if self.state.revoke_next_check.swap(false, Ordering::SeqCst) {
            return Err(SessionRevoked::new(format!("test: lease {} lost", self.token)).into());
        }
        if self.state.refuse_next_check.swap(false, Ordering::SeqCst) {
            return Err(SessionRefused::new("LEASE_UNAVAILABLE", "test: store down").into());
        }
        Ok(())
    }

    async fn close(&self) -> Result<(), GuardError> {
        self.state.close.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// `{"message": text}`, the echo tool's arguments.
pub fn echo_args(text: &str) -> serde_json::Map<String, serde_json::Value> {
    let mut args = serde_json::Map::new();
    args.insert("message".to_owned(), serde_json::Value::String(text.to_owned()));
    args
}

/// The tenant layer's project.
pub const TENANT_LAYER: &str = "_tenant";

/// One test's lease world on its own MongoDB database: the store, the layers (bundled classpath) and a lease
/// service that knows the `mcp` type and has no revocation listener (a revocation runs no handler unless the test
/// calls it).
pub struct World {
    pub db: mongodb::Database,
    pub store: Arc<dyn LeaseStore>,
    pub layers: Arc<LayeredDefinitions>,
    pub leases: ResourceLeaseService,
}

impl World {
    pub async fn new(test: &str) -> World {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let uri = std::env::var("LEASE_TEST_MONGODB_URI").unwrap_or_else(|_| {
            panic!(
                "LEASE_TEST_MONGODB_URI is not set: run the tests with scripts/test.sh (it starts a real mongod), or \
                 point it at a MongoDB you run"
            )
        });
        let mut options = mongodb::options::ClientOptions::parse(&uri).await.expect("test MongoDB URI");
        options.server_selection_timeout = Some(Duration::from_secs(10));
        let client = mongodb::Client::with_options(options).expect("client");
        let name = format!("mc_{test}_{}_{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst));
        let db = client.database(&name);
        db.run_command(doc! { "ping": 1 }).await.unwrap_or_else(|e| panic!("test MongoDB at {uri} unreachable: {e}"));
        let store = MongoStore::new(&db);
        store.ensure_indexes().await.expect("lease indexes");
        let documents = MongoDocumentStore::new(&db);
        documents.ensure_indexes().await.expect("document indexes");
        let store: Arc<dyn LeaseStore> = Arc::new(store);
        let layers = Arc::new(LayeredDefinitions::new(Arc::new(documents)));
        let types: HashSet<String> = ["mcp".to_owned()].into();
        let leases = ResourceLeaseService::new(store.clone(), layers.clone(), Arc::new(types), None);
        World { db, store, layers, leases }
    }

    /// Writes a config document of tenant `t1` (`project` = `_tenant` for the tenant layer).
    pub async fn put(&self, project: &str, path: &str, content: &str) {
        self.layers.put_document("t1", project, path, content).await.expect("write config document");
    }

    /// Configures the tool `tool` in the tenant layer.
    pub async fn tool(&self, tool: &str, content: &str) {
        self.put(TENANT_LAYER, &format!("_vance/config/tools/{tool}.yaml"), content).await;
    }

    /// The bundled `browser` definition (user 1), waiting 0 ms instead of 5 s (a tenant may set waitMs).
    pub async fn browser_without_wait(&self) {
        self.put(TENANT_LAYER, "_vance/config/lease/browser.yaml", "name: browser\nwaitMs: 0\n").await;
    }

    pub async fn holders(&self) -> Vec<HolderRecord> {
        self.store.holders(None).await.expect("holders")
    }

    pub async fn drop_db(self) {
        let _ = self.db.drop().await;
    }
}

/// The status a raw `tools/list` with `session_id` gets from `server`: success while it still serves the session.
pub async fn session_status(server: &EverythingHttp, session_id: &str) -> reqwest::StatusCode {
    reqwest::Client::new()
        .post(server.endpoint())
        .header("mcp-session-id", session_id)
        .header("mcp-protocol-version", "2025-06-18")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .expect("raw POST")
        .status()
}
