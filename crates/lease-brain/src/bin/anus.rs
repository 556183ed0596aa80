//! `anus lease …`: the operator's view of and hand on leases across all tenants (spec §9).
//!
//! Reads go straight to MongoDB; revocations and sweeps go through a brain (`/internal/lease/admin/…` with the
//! internal secret), because only a brain has the handler registry and pod routing. `--force` revokes directly in
//! MongoDB when no brain answers: the slot is freed, but no handler runs. `reconcile` needs no brain.

use std::collections::{BTreeMap, HashSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lease_brain::cluster::{ClusterService, LeasePodLiveness, MongoClusterStore};
use lease_brain::dispatch::INTERNAL_SECRET_HEADER;
use lease_shared::store::HolderRecord;
use lease_shared::{
    Classpath, LayeredDefinitions, LeaseStore, MongoDocumentStore, MongoStore, ReconcileOptions, Reconciler,
    ResourceLeaseService, StaticDefinitions,
};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(name = "anus", about = "Operator tool: leases across all tenants")]
struct Cli {
    /// MongoDB URI of the lease state.
    #[arg(long, env = "BRAIN_MONGODB_URI", global = true, default_value = "mongodb://127.0.0.1:27017")]
    mongodb_uri: String,
    /// MongoDB database.
    #[arg(long, env = "BRAIN_MONGODB_DATABASE", global = true, default_value = "vance")]
    database: String,
    /// A brain to send revocations and sweeps to.
    #[arg(long, env = "ANUS_BRAIN_URL", global = true, default_value = "http://127.0.0.1:8080")]
    brain: String,
    /// The brains' internal secret.
    #[arg(long, env = "BRAIN_INTERNAL_SECRET", global = true, hide_env_values = true, default_value = "")]
    internal_secret: String,
    /// Age after which a pod's heartbeat is stale (as configured on the brains).
    #[arg(long, env = "BRAIN_HEARTBEAT_STALENESS_MS", global = true, default_value_t = 20_000)]
    heartbeat_staleness_ms: u64,
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand)]
enum Top {
    /// Lease commands.
    #[command(subcommand)]
    Lease(LeaseCommand),
}

#[derive(Subcommand)]
enum LeaseCommand {
    /// Holders, optionally filtered.
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        resource: Option<String>,
        #[arg(long)]
        pod: Option<String>,
        #[arg(long = "type")]
        lease_type: Option<String>,
    },
    /// One holder, whole.
    Show { token: String },
    /// Counters with the number of holders booking them (BOOKED) and a drift marker.
    Counters {
        #[arg(long)]
        resource: Option<String>,
    },
    /// The merged definition as an acquisition in (tenant, project) would see it now (no cache).
    Definition {
        name: String,
        #[arg(long)]
        tenant: String,
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
    /// Repairs counter drift from the holders' booked levels (needs no brain).
    Reconcile {
        /// Only counters unchanged for this long are touched.
        #[arg(long, default_value_t = 60_000)]
        safety_ms: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("anus: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let (client, store) = MongoStore::connect(&cli.mongodb_uri, &cli.database).await.map_err(|e| e.to_string())?;
    let db = client.database(&cli.database);
    let store: Arc<dyn LeaseStore> = Arc::new(store);
    let Top::Lease(command) = cli.command;
    match command {
        LeaseCommand::List { tenant, resource, pod, lease_type } => {
            let cluster = ClusterService::new(
                Arc::new(MongoClusterStore::new(&db)),
                "anus".into(),
                String::new(),
                Duration::from_millis(cli.heartbeat_staleness_ms),
            );
            let liveness = LeasePodLiveness::new(cluster);
            let now = store.store_now_ms().await.map_err(|e| e.to_string())?;
            let mut rows = Vec::new();
            for h in store.holders(resource.as_deref()).await.map_err(|e| e.to_string())? {
                if tenant.as_ref().is_some_and(|t| *t != h.tenant_id)
                    || pod.as_ref().is_some_and(|p| *p != h.pod)
                    || lease_type.as_ref().is_some_and(|t| *t != h.lease_type)
                {
                    continue;
                }
                let alive = match liveness.is_alive(&h.pod).await {
                    Ok(true) => "alive",
                    Ok(false) => "DEAD",
                    Err(_) => "?",
                };
                rows.push(vec![
                    h.token.clone(),
                    h.lease_type.clone(),
                    h.resource.clone(),
                    format!("{}/{}", h.tenant_id, h.project_id),
                    h.user_id.clone().unwrap_or_else(|| "-".into()),
                    format!("{} ({alive})", h.pod),
                    h.pod_bound.to_string(),
                    h.state.as_str().to_owned(),
                    format!("{}s", (now - h.last_seen_at_ms) / 1000),
                ]);
            }
            print_table(
                &["TOKEN", "TYPE", "RESOURCE", "TENANT/PROJECT", "USER", "POD", "POD-BOUND", "STATE", "IDLE"],
                rows,
            );
        }
        LeaseCommand::Show { token } => match store.holder(&token).await.map_err(|e| e.to_string())? {
            Some(h) => println!("{}", serde_json::to_string_pretty(&holder_json(&h)).unwrap_or_default()),
            None => return Err(format!("no holder {token}")),
        },
        LeaseCommand::Counters { resource } => {
            let mut booked: BTreeMap<String, i64> = BTreeMap::new();
            for h in store.holders(resource.as_deref()).await.map_err(|e| e.to_string())? {
                for l in h.levels {
                    *booked.entry(l).or_default() += 1;
                }
            }
            let mut counters = store.counters(resource.as_deref()).await.map_err(|e| e.to_string())?;
            counters.sort_by(|a, b| a.id.cmp(&b.id));
            let rows = counters
                .iter()
                .map(|c| {
                    let b = booked.get(&c.id).copied().unwrap_or(0);
                    let drift = if b == c.count { String::new() } else { format!("DRIFT {:+}", c.count - b) };
                    vec![c.id.clone(), c.count.to_string(), b.to_string(), drift]
                })
                .collect();
            print_table(&["COUNTER", "COUNT", "BOOKED", ""], rows);
        }
        LeaseCommand::Definition { name, tenant, project } => {
            let layers =
                LayeredDefinitions::new(Arc::new(MongoDocumentStore::new(&db))).with_classpath(Classpath::bundled());
            match layers.definition_uncached(&tenant, &project, &name).await.map_err(|e| e.to_string())? {
                None => return Err(format!("no layer defines lease {name:?}")),
                Some(d) => {
                    let l = d.levels;
                    println!("name: {}\nresource: {}", d.name, d.resource);
                    println!(
                        "levels: global={:?} tenant={:?} project={:?} user={:?}",
                        l.global, l.tenant, l.project, l.user
                    );
                    println!("ttlSeconds: {}\nwaitMs: {}", d.ttl_seconds, d.wait_ms);
                }
            }
        }
        LeaseCommand::Revoke { token, tenant, force: true } => {
            let holder =
                direct_service(store).reaper().revoke(&token, tenant.as_deref()).await.map_err(|e| e.to_string())?;
            println!("revoked {} directly in MongoDB (pod {}, type {})", holder.token, holder.pod, holder.lease_type);
            println!("{FORCE_NOTE}");
        }
        LeaseCommand::Revoke { token, tenant, force: false } => {
            let v = brain(&cli.brain, &cli.internal_secret, "revoke", json!({ "token": token, "tenantId": tenant }))
                .await?;
            println!("revoked {token} through the brain: {v}");
        }
        LeaseCommand::RevokePod { pod, force: true } => {
            let n = direct_service(store).reaper().revoke_pod(&pod).await.map_err(|e| e.to_string())?.len();
            println!("revoked {n} holders of pod {pod} directly in MongoDB");
            println!("{FORCE_NOTE}");
        }
        LeaseCommand::RevokePod { pod, force: false } => {
            let v = brain(&cli.brain, &cli.internal_secret, "revoke-pod", json!({ "pod": pod })).await?;
            println!("revoked {} holders of pod {pod} through the brain", v["count"]);
        }
        LeaseCommand::Sweep => {
            let v = brain(&cli.brain, &cli.internal_secret, "sweep", json!({})).await?;
            println!("sweep: {v}");
        }
        LeaseCommand::Reconcile { safety_ms } => {
            let options = ReconcileOptions { safety: Duration::from_millis(safety_ms), ..ReconcileOptions::default() };
            let r = Reconciler::new(store, options).run().await.map_err(|e| e.to_string())?;
            println!(
                "examined {}, in sync {}, recent {}, corrected {}, dormant removed {}, conflicts {}, missing {}",
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
        }
    }
    Ok(())
}

const FORCE_NOTE: &str = "no handler ran: the slot is free, the holder fails at its next check, and a resource in a \
                          foreign system (e.g. a remote MCP session of a dead pod) is left to its own expiry";

/// A service without listener: reaps here only free slots; nothing is dispatched.
fn direct_service(store: Arc<dyn LeaseStore>) -> ResourceLeaseService {
    ResourceLeaseService::new(store, Arc::new(StaticDefinitions::default()), Arc::new(HashSet::<String>::new()), None)
}

async fn brain(base: &str, secret: &str, what: &str, body: Value) -> Result<Value, String> {
    let url = format!("{}/internal/lease/admin/{what}", base.trim_end_matches('/'));
    let r =
        reqwest::Client::new().post(&url).header(INTERNAL_SECRET_HEADER, secret).json(&body).send().await.map_err(
            |e| format!("no brain answers at {base} ({e}); --force acts directly in MongoDB without handlers"),
        )?;
    let status = r.status();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    if status.is_success() { Ok(v) } else { Err(format!("the brain answered {status}: {v}")) }
}

fn holder_json(h: &HolderRecord) -> Value {
    json!({
        "token": h.token, "type": h.lease_type, "lease": h.lease, "resource": h.resource,
        "tenantId": h.tenant_id, "projectId": h.project_id, "userId": h.user_id, "holderRef": h.holder_ref,
        "pod": h.pod, "podBound": h.pod_bound, "state": h.state.as_str(), "levels": h.levels,
        "payload": h.payload, "ttlSeconds": h.ttl_seconds, "acquiredAtMs": h.acquired_at_ms,
        "lastSeenAtMs": h.last_seen_at_ms,
    })
}

fn print_table(header: &[&str], rows: Vec<Vec<String>>) {
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
