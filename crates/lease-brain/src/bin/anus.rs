//! `anus`: the operator's view of and hand on leases across all tenants (spec §9).
//!
//! Reads go straight to MongoDB when a URI is given (`--mongodb-uri` / `BRAIN_MONGODB_URI`), otherwise through a
//! brain's admin endpoints (so `anus` also works against a brain on the embedded store). Revocations, sweeps and
//! config writes always go through a brain (`/internal/…` with the internal secret): only a brain has the handler
//! registry, pod routing and the cache fan-out. `--force` revokes directly in MongoDB when no brain answers: the
//! slot is freed, but no handler runs. `reconcile` needs no brain.
//!
//! Exit codes: 0 done, 2 bad input, 3 not found, 4 unreachable (MongoDB or the brain, or the brain's store),
//! 5 refused (wrong internal secret), 1 anything else.

use std::collections::HashSet;
use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lease_brain::cluster::{ClusterService, LeasePodLiveness, MongoClusterStore};
use lease_brain::dispatch::INTERNAL_SECRET_HEADER;
use lease_brain::ops::{self, CounterRow, DefinitionView, HolderFilter, HolderRow};
use lease_shared::{
    Classpath, DocumentStore, LayeredDefinitions, LeaseError, LeaseStore, MongoDocumentStore, MongoStore,
    ReconcileOptions, ReconcileReport, Reconciler, ResourceLeaseService, StaticDefinitions, StoreError, SweepReport,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

#[derive(Parser)]
#[command(
    name = "anus",
    about = "Operator tool: leases across all tenants",
    after_help = "Exit codes: 0 done, 2 bad input, 3 not found, 4 unreachable (MongoDB or the brain), 5 refused \
                  (wrong internal secret), 1 anything else."
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Top,
}

#[derive(Args)]
struct Global {
    /// MongoDB URI of the lease state. Without it, reads go through the brain.
    #[arg(long, env = "BRAIN_MONGODB_URI", global = true)]
    mongodb_uri: Option<String>,
    /// MongoDB database.
    #[arg(long, env = "BRAIN_MONGODB_DATABASE", global = true, default_value = "vance")]
    database: String,
    /// A brain to act through (and to read from without --mongodb-uri).
    #[arg(long, env = "ANUS_BRAIN_URL", global = true, default_value = "http://127.0.0.1:8080")]
    brain: String,
    /// The brains' internal secret.
    #[arg(long, env = "BRAIN_INTERNAL_SECRET", global = true, hide_env_values = true, default_value = "")]
    internal_secret: String,
    /// Age after which a pod's heartbeat is stale (as configured on the brains).
    #[arg(long, env = "BRAIN_HEARTBEAT_STALENESS_MS", global = true, default_value_t = 20_000)]
    heartbeat_staleness_ms: u64,
    /// JSON on stdout instead of tables, for scripts.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Top {
    /// Lease commands.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Config documents (definitions, settings, tool configs), written through a brain so every pod's cache
    /// drops them.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Subcommand)]
enum LeaseCommand {
    /// Holders, optionally filtered.
    List {
        /// Only this tenant's holders.
        #[arg(long)]
        tenant: Option<String>,
        /// Only holders of this resource.
        #[arg(long)]
        resource: Option<String>,
        /// Only holders acquired by this pod.
        #[arg(long)]
        pod: Option<String>,
        /// Only holders of this handler type (webhook, tex, mcp, …).
        #[arg(long = "type")]
        lease_type: Option<String>,
    },
    /// One holder, whole (payload included).
    Show { token: String },
    /// Counters (global level included) with BOOKED, the number of holders booking them, and a drift marker.
    Counters {
        /// Only counters of this resource.
        #[arg(long)]
        resource: Option<String>,
    },
    /// The merged definition as an acquisition in (tenant, project) would see it now (no cache).
    Definition {
        /// The definition's name.
        name: String,
        /// The acquiring tenant.
        #[arg(long)]
        tenant: String,
        /// The acquiring project.
        #[arg(long)]
        project: String,
    },
    /// Revokes one holder (its handler runs through the brain).
    Revoke {
        token: String,
        /// Only if the holder belongs to this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Directly in MongoDB, without a brain: no handler runs.
        #[arg(long)]
        force: bool,
    },
    /// Revokes every holder of a pod.
    RevokePod {
        pod: String,
        /// Directly in MongoDB, without a brain: no handler runs.
        #[arg(long)]
        force: bool,
    },
    /// A reaper round now (idle, dead pods, reconcile), with handlers, on the brain.
    Sweep,
    /// Repairs counter drift from the holders' booked levels (needs no brain with --mongodb-uri).
    Reconcile {
        /// Only counters unchanged for this long are touched.
        #[arg(long, default_value_t = 60_000)]
        safety_ms: u64,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Prints a document as stored (one layer, not merged).
    Get(DocumentKey),
    /// Writes a document from FILE (or stdin with `-`).
    Put {
        #[command(flatten)]
        key: DocumentKey,
        file: String,
    },
    /// Deletes a document.
    Delete(DocumentKey),
}

#[derive(Args)]
struct DocumentKey {
    /// The document's path, e.g. `_vance/config/lease/tex.yaml`.
    path: String,
    /// `_vance` for the System layer.
    #[arg(long, default_value = "_vance")]
    tenant: String,
    /// `_tenant` for the System and Tenant layers.
    #[arg(long, default_value = "_tenant")]
    project: String,
}

/// Why a command failed; each kind has its exit code.
#[derive(Debug)]
enum Failure {
    BadInput(String),
    NotFound(String),
    Unreachable(String),
    Refused(String),
    Other(String),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Other(_) => 1,
            Failure::BadInput(_) => 2,
            Failure::NotFound(_) => 3,
            Failure::Unreachable(_) => 4,
            Failure::Refused(_) => 5,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::BadInput(m) | Failure::NotFound(m) | Failure::Unreachable(m) | Failure::Refused(m) => m,
            Failure::Other(m) => m,
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Unreachable(format!("MongoDB: {e}"))
    }
}

impl From<LeaseError> for Failure {
    fn from(e: LeaseError) -> Self {
        match e {
            LeaseError::InvalidRequest { .. } => Failure::BadInput(e.to_string()),
            LeaseError::Unavailable { .. } => Failure::Unreachable(e.to_string()),
            LeaseError::Lost { token } => Failure::NotFound(format!("no holder {token}")),
            other => Failure::Other(other.to_string()),
        }
    }
}

type Outcome<T = ()> = Result<T, Failure>;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("anus: {}", f.message());
            ExitCode::from(f.exit_code())
        }
    }
}

/// MongoDB, read directly.
struct Direct {
    store: Arc<dyn LeaseStore>,
    db: mongodb::Database,
    staleness: Duration,
}

impl Direct {
    async fn connect(g: &Global) -> Outcome<Option<Direct>> {
        let Some(uri) = &g.mongodb_uri else { return Ok(None) };
        // Connecting only parses the URI; the server is first contacted by the command's read.
        let (client, store) = MongoStore::connect(uri, &g.database)
            .await
            .map_err(|e| Failure::BadInput(format!("--mongodb-uri: {e}")))?;
        let db = client.database(&g.database);
        Ok(Some(Direct { store: Arc::new(store), db, staleness: Duration::from_millis(g.heartbeat_staleness_ms) }))
    }

    fn liveness(&self) -> LeasePodLiveness {
        let registry = Arc::new(MongoClusterStore::new(&self.db));
        LeasePodLiveness::new(ClusterService::new(registry, "anus".into(), String::new(), self.staleness))
    }

    /// A service without listener: a revocation here only frees slots; nothing is dispatched.
    fn service(&self) -> ResourceLeaseService {
        let definitions = Arc::new(StaticDefinitions::default());
        ResourceLeaseService::new(self.store.clone(), definitions, Arc::new(HashSet::<String>::new()), None)
    }
}

/// A brain's internal endpoints.
struct Brain {
    base: String,
    secret: String,
    http: reqwest::Client,
}

impl Brain {
    fn new(g: &Global) -> Brain {
        Brain {
            base: g.brain.trim_end_matches('/').to_owned(),
            secret: g.internal_secret.clone(),
            http: reqwest::Client::new(),
        }
    }

    async fn call<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Outcome<T> {
        let r =
            req.header(INTERNAL_SECRET_HEADER, &self.secret).timeout(Duration::from_secs(60)).send().await.map_err(
                |e| {
                    Failure::Unreachable(format!(
                        "no brain answers at {} ({e}); `--force` revokes directly in MongoDB, without handlers",
                        self.base
                    ))
                },
            )?;
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        if status.is_success() {
            return serde_json::from_str(&text)
                .map_err(|e| Failure::Other(format!("the brain's answer is not what anus expects ({e}): {text}")));
        }
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        let message = body["message"].as_str().map_or_else(|| body.to_string(), str::to_owned);
        let said = format!("the brain answered {status}: {message}");
        Err(match status.as_u16() {
            400 => Failure::BadInput(said),
            401 | 403 => Failure::Refused(format!("{said} (check BRAIN_INTERNAL_SECRET)")),
            404 => Failure::NotFound(said),
            503 => Failure::Unreachable(said),
            _ => Failure::Other(said),
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str, query: &impl serde::Serialize) -> Outcome<T> {
        self.call(self.http.get(format!("{}{path}", self.base)).query(query)).await
    }

    async fn post<T: DeserializeOwned>(&self, path: &str, body: Value) -> Outcome<T> {
        self.call(self.http.post(format!("{}{path}", self.base)).json(&body)).await
    }
}

const ADMIN: &str = "/internal/lease/admin";
const NO_QUERY: [(&str, &str); 0] = [];

async fn run(cli: Cli) -> Outcome {
    let g = &cli.global;
    let direct = Direct::connect(g).await?;
    let brain = Brain::new(g);
    match cli.command {
        Top::Lease(command) => lease(command, g, direct.as_ref(), &brain).await,
        Top::Config(command) => config(command, g, direct.as_ref(), &brain).await,
    }
}

async fn lease(command: LeaseCommand, g: &Global, direct: Option<&Direct>, brain: &Brain) -> Outcome {
    match command {
        LeaseCommand::List { tenant, resource, pod, lease_type } => {
            let filter = HolderFilter { tenant, resource, pod, lease_type };
            let rows: Vec<HolderRow> = match direct {
                Some(d) => ops::holders(d.store.as_ref(), &d.liveness(), &filter).await?,
                // The endpoint takes the filter as its query (unset fields left out).
                None => field(brain.get::<Value>(&format!("{ADMIN}/holders"), &filter).await?, "holders")?,
            };
            if g.json {
                return print_json(&json!({ "holders": rows }));
            }
            let table = rows.iter().map(|r| {
                let h = &r.holder;
                let alive = match r.pod_alive {
                    Some(true) => "alive",
                    Some(false) => "DEAD",
                    None => "?",
                };
                vec![
                    h.token.clone(),
                    h.lease_type.clone(),
                    h.resource.clone(),
                    format!("{}/{}", h.tenant_id, h.project_id),
                    h.user_id.clone().unwrap_or_else(|| "-".into()),
                    format!("{} ({alive})", h.pod),
                    h.pod_bound.to_string(),
                    h.state.as_str().to_owned(),
                    format!("{}s/{}s", r.idle_seconds, h.ttl_seconds),
                ]
            });
            print_table(
                &["TOKEN", "TYPE", "RESOURCE", "TENANT/PROJECT", "USER", "POD", "POD-BOUND", "STATE", "IDLE/TTL"],
                table,
            );
        }
        LeaseCommand::Show { token } => {
            let row: HolderRow = match direct {
                Some(d) => ops::holder(d.store.as_ref(), &d.liveness(), &token)
                    .await?
                    .ok_or_else(|| Failure::NotFound(format!("no holder {token}")))?,
                None => brain.get(&format!("{ADMIN}/holders/{}", path_segment(&token)), &NO_QUERY).await?,
            };
            if g.json {
                return print_json(&row);
            }
            let h = &row.holder;
            let alive = row.pod_alive.map_or("unknown", |a| if a { "alive" } else { "DEAD" });
            println!("token:      {}", h.token);
            println!("type:       {}\nlease:      {}\nresource:   {}", h.lease_type, h.lease, h.resource);
            println!("tenant:     {}\nproject:    {}", h.tenant_id, h.project_id);
            println!("user:       {}", h.user_id.as_deref().unwrap_or("-"));
            println!("holderRef:  {}", h.holder_ref);
            println!("pod:        {} ({alive}), pod-bound: {}", h.pod, h.pod_bound);
            println!("state:      {}", h.state.as_str());
            println!("levels:     {}", h.levels.join(", "));
            println!("idle:       {} s of ttl {} s", row.idle_seconds, h.ttl_seconds);
            println!("payload:    {}", Value::Object(h.payload.clone()));
        }
        LeaseCommand::Counters { resource } => {
            let rows: Vec<CounterRow> = match direct {
                Some(d) => ops::counters(d.store.as_ref(), resource.as_deref()).await?,
                None => {
                    let q: Vec<(&str, &str)> = resource.iter().map(|r| ("resource", r.as_str())).collect();
                    field(brain.get::<Value>(&format!("{ADMIN}/counters"), &q).await?, "counters")?
                }
            };
            if g.json {
                return print_json(&json!({ "counters": rows }));
            }
            let table = rows.iter().map(|c| {
                let drift = match (c.exists, c.drift) {
                    (false, _) => "MISSING".to_owned(),
                    (true, 0) => String::new(),
                    (true, d) => format!("DRIFT {d:+}"),
                };
                vec![c.id.clone(), c.level.clone(), c.count.to_string(), c.booked.to_string(), drift]
            });
            print_table(&["COUNTER", "LEVEL", "COUNT", "BOOKED", ""], table);
        }
        LeaseCommand::Definition { name, tenant, project } => {
            let view: DefinitionView = match direct {
                Some(d) => {
                    let layers = LayeredDefinitions::new(Arc::new(MongoDocumentStore::new(&d.db)))
                        .with_classpath(Classpath::bundled());
                    ops::definition(&layers, &tenant, &project, &name)
                        .await?
                        .ok_or_else(|| Failure::NotFound(format!("no layer defines lease {name:?}")))?
                }
                None => {
                    let q = [("name", name.as_str()), ("tenant", &tenant), ("project", &project)];
                    brain.get(&format!("{ADMIN}/definition"), &q).await?
                }
            };
            if g.json {
                return print_json(&view);
            }
            let cap = |c: Option<u32>| c.map_or_else(|| "-".to_owned(), |c| c.to_string());
            let l = view.levels;
            println!("name:       {}\nresource:   {}", view.name, view.resource);
            println!(
                "levels:     global {}  tenant {}  project {}  user {}{}",
                cap(l.global),
                cap(l.tenant),
                cap(l.project),
                cap(l.user),
                if view.noop { "  (NOOP: no level capped)" } else { "" }
            );
            println!("ttlSeconds: {}\nwaitMs:     {}", view.ttl_seconds, view.wait_ms);
        }
        LeaseCommand::Revoke { token, tenant, force: true } => {
            let d = force_needs_mongodb(direct)?;
            let h = d.service().reaper().revoke(&token, tenant.as_deref()).await?;
            if g.json {
                return print_json(&json!({
                    "status": "revoked", "via": "mongodb", "handlerRan": false, "token": h.token, "pod": h.pod,
                    "type": h.lease_type, "note": FORCE_NOTE,
                }));
            }
            println!("revoked {} directly in MongoDB (pod {}, type {})", h.token, h.pod, h.lease_type);
            println!("{FORCE_NOTE}");
        }
        LeaseCommand::Revoke { token, tenant, force: false } => {
            let v: Value =
                brain.post(&format!("{ADMIN}/revoke"), json!({ "token": token, "tenantId": tenant })).await?;
            if g.json {
                return print_json(&json!({
                    "status": "revoked", "via": "brain", "handlerRan": true, "token": v["token"], "pod": v["pod"],
                    "type": v["type"],
                }));
            }
            println!("revoked {token} through the brain (pod {}, type {}); its handler runs", v["pod"], v["type"]);
        }
        LeaseCommand::RevokePod { pod, force: true } => {
            let d = force_needs_mongodb(direct)?;
            let revoked = d.service().reaper().revoke_pod(&pod).await?;
            let tokens: Vec<&str> = revoked.iter().map(|h| h.token.as_str()).collect();
            if g.json {
                return print_json(&json!({
                    "status": "revoked", "via": "mongodb", "handlerRan": false, "pod": pod, "count": tokens.len(),
                    "tokens": tokens, "note": FORCE_NOTE,
                }));
            }
            println!("revoked {} holders of pod {pod} directly in MongoDB", tokens.len());
            println!("{FORCE_NOTE}");
        }
        LeaseCommand::RevokePod { pod, force: false } => {
            let v: Value = brain.post(&format!("{ADMIN}/revoke-pod"), json!({ "pod": pod })).await?;
            if g.json {
                return print_json(&json!({
                    "status": "revoked", "via": "brain", "handlerRan": true, "pod": pod, "count": v["count"],
                    "tokens": v["tokens"],
                }));
            }
            println!("revoked {} holders of pod {pod} through the brain; their handlers run", v["count"]);
        }
        LeaseCommand::Sweep => {
            let report: SweepReport = brain.post(&format!("{ADMIN}/sweep"), json!({})).await?;
            if g.json {
                return print_json(&report);
            }
            println!(
                "reaped {} idle and {} of dead pods [{}]; handlers run",
                report.idle,
                report.pod,
                report.dead_pods.join(", ")
            );
            print_reconcile(&report.reconcile);
        }
        LeaseCommand::Reconcile { safety_ms } => {
            let report: ReconcileReport = match direct {
                Some(d) => {
                    let options =
                        ReconcileOptions { safety: Duration::from_millis(safety_ms), ..ReconcileOptions::default() };
                    Reconciler::new(d.store.clone(), options).run().await?
                }
                None => brain.post(&format!("{ADMIN}/reconcile"), json!({ "safetyMs": safety_ms })).await?,
            };
            if g.json {
                return print_json(&report);
            }
            print_reconcile(&report);
        }
    }
    Ok(())
}

async fn config(command: ConfigCommand, g: &Global, direct: Option<&Direct>, brain: &Brain) -> Outcome {
    let key = |k: &DocumentKey| json!({ "tenantId": k.tenant, "projectId": k.project, "path": k.path });
    match command {
        ConfigCommand::Get(k) => {
            let content = match direct {
                Some(d) => {
                    MongoDocumentStore::new(&d.db).get(&k.tenant, &k.project, &k.path).await?.ok_or_else(|| {
                        Failure::NotFound(format!("no document {} in {}/{}", k.path, k.tenant, k.project))
                    })?
                }
                None => {
                    let q = [("tenantId", k.tenant.as_str()), ("projectId", &k.project), ("path", &k.path)];
                    let v: Value = brain.get("/internal/documents", &q).await?;
                    v["content"].as_str().unwrap_or_default().to_owned()
                }
            };
            if g.json {
                let mut v = key(&k);
                v["content"] = Value::String(content);
                return print_json(&v);
            }
            print!("{content}");
        }
        ConfigCommand::Put { key: k, file } => {
            let content = read_input(&file)?;
            let mut body = key(&k);
            body["content"] = Value::String(content);
            let v: Value = brain.call(brain.http.put(format!("{}/internal/documents", brain.base)).json(&body)).await?;
            if g.json {
                return print_json(&v);
            }
            println!("wrote {} in {}/{}; every live brain drops it from its cache", k.path, k.tenant, k.project);
        }
        ConfigCommand::Delete(k) => {
            let q = [("tenantId", k.tenant.as_str()), ("projectId", &k.project), ("path", &k.path)];
            let req = brain.http.delete(format!("{}/internal/documents", brain.base)).query(&q);
            let v: Value = brain.call(req).await?;
            if g.json {
                return print_json(&v);
            }
            println!("{} {} in {}/{}", v["status"].as_str().unwrap_or("?"), k.path, k.tenant, k.project);
        }
    }
    Ok(())
}

const FORCE_NOTE: &str = "no handler ran: the slot is free, the holder fails at its next check, and a resource in a \
                          foreign system (e.g. a remote MCP session of a dead pod) is left to its own expiry";

fn force_needs_mongodb(direct: Option<&Direct>) -> Outcome<&Direct> {
    direct.ok_or_else(|| {
        Failure::BadInput("--force acts directly in MongoDB: give --mongodb-uri (or BRAIN_MONGODB_URI)".into())
    })
}

/// `v[name]` as `T`.
fn field<T: DeserializeOwned>(mut v: Value, name: &str) -> Outcome<T> {
    serde_json::from_value(v[name].take())
        .map_err(|e| Failure::Other(format!("the brain's answer has no valid {name:?} ({e})")))
}

/// A token as one URL path segment (tokens are URL-safe; anything else is escaped so it cannot change the path).
fn path_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn read_input(file: &str) -> Outcome<String> {
    if file == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| Failure::BadInput(format!("stdin: {e}")))?;
        return Ok(s);
    }
    std::fs::read_to_string(file).map_err(|e| Failure::BadInput(format!("{file}: {e}")))
}

fn print_json(v: &impl serde::Serialize) -> Outcome {
    let text = serde_json::to_string_pretty(v).map_err(|e| Failure::Other(e.to_string()))?;
    println!("{text}");
    Ok(())
}

fn print_reconcile(r: &ReconcileReport) {
    println!(
        "reconcile: examined {}, in sync {}, recent {}, corrected {}, dormant removed {}, conflicts {}, missing {}",
        r.examined,
        r.in_sync,
        r.recent,
        r.corrected.len(),
        r.removed,
        r.conflicts,
        r.missing.len()
    );
    for c in &r.corrected {
        println!("  {}: {} -> {}{}", c.counter, c.from, c.to, if c.deleted { " (deleted)" } else { "" });
    }
    for m in &r.missing {
        println!("  {m}: MISSING (booked by holders, no counter document)");
    }
}

fn print_table(header: &[&str], rows: impl Iterator<Item = Vec<String>>) {
    let rows: Vec<Vec<String>> = rows.collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}
