//! The brain server: store selection, wiring, the router, the pod's background tasks and graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use lease_shared::{
    Classpath, DocumentStore, LayeredDefinitions, LeaseDefinition, LeaseStore, MemoryDocumentStore, MemoryStore,
    MongoDocumentStore, MongoStore, PodLiveness, ReconcileOptions, ResourceLeaseService,
    sweeper::{LeaseSweeper, SweeperConfig},
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::JwtKeys;
use crate::cluster::{ClusterService, ClusterStore, LeasePodLiveness, MemoryClusterStore, MongoClusterStore};
use crate::config::BrainConfig;
use crate::dispatch::{DocumentChangeFanout, HandlerRegistry, LeaseRevocationDispatcher, WebhookHandler};

/// Why the brain could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The store could not be opened.
    #[error("store: {0}")]
    Store(#[from] lease_shared::StoreError),
    /// A bundled definition is broken (a build defect).
    #[error("bundled definition {path}: {error}")]
    Bundled {
        /// The document's path.
        path: &'static str,
        /// What is wrong.
        error: lease_shared::DefinitionError,
    },
    /// The listen address could not be bound.
    #[error("listen: {0}")]
    Io(#[from] std::io::Error),
    /// The metrics recorder could not be installed.
    #[error("metrics: {0}")]
    Metrics(String),
}

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The lease service.
    pub leases: ResourceLeaseService,
    /// The layered definitions and their cache (document writes and change events).
    pub definitions: Arc<LayeredDefinitions>,
    /// The sweeper (for an operator's sweep round).
    pub sweeper: LeaseSweeper,
    /// The revocation dispatcher (for `/internal/lease/revoked`).
    pub dispatcher: LeaseRevocationDispatcher,
    /// The one definition of "pod alive" (for the operator's listings).
    pub liveness: LeasePodLiveness,
    /// Verifies lease API tokens; `None` disables the lease API.
    pub jwt: Option<JwtKeys>,
    /// The internal shared secret.
    pub internal_secret: String,
    /// This pod's id.
    pub pod_id: String,
    /// Renders the Prometheus text; `None` when another recorder is installed (tests in one process).
    pub metrics: Option<PrometheusHandle>,
    /// False once shutdown has begun: load balancers stop sending.
    pub ready: Arc<AtomicBool>,
}

/// The routes of the brain.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(|State(s): State<AppState>| async move { s.metrics.map(|m| m.render()).unwrap_or_default() }),
        )
        .merge(crate::api::routes())
        .with_state(state)
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
    }
}

/// The bundled lease definitions of the `defaults` crate (the classpath layer).
pub fn bundled_definitions() -> Result<Vec<LeaseDefinition>, StartError> {
    defaults::DOCUMENTS
        .iter()
        .filter_map(|d| {
            let name = d.path.strip_prefix("_vance/config/lease/")?.strip_suffix(".yaml")?;
            Some(
                LeaseDefinition::from_yaml(name, d.content)
                    .map_err(|error| StartError::Bundled { path: d.path, error }),
            )
        })
        .collect()
}

/// The stores of one brain.
#[derive(Debug, Clone)]
pub struct Stores {
    /// Holders and counters.
    pub leases: Arc<dyn LeaseStore>,
    /// The pod registry.
    pub cluster: Arc<dyn ClusterStore>,
    /// Config documents.
    pub documents: Arc<dyn DocumentStore>,
}

/// The stores of one brain: MongoDB if a URI is configured, the embedded in-memory stores otherwise.
pub async fn open_stores(config: &BrainConfig) -> Result<Stores, StartError> {
    match &config.mongodb_uri {
        Some(uri) => {
            let (client, store) = MongoStore::connect(uri, &config.database).await?;
            store.ensure_indexes().await?;
            let db = client.database(&config.database);
            let documents = MongoDocumentStore::new(&db);
            documents.ensure_indexes().await?;
            tracing::info!(database = %config.database, "lease state in MongoDB");
            Ok(Stores {
                leases: Arc::new(store),
                cluster: Arc::new(MongoClusterStore::new(&db)),
                documents: Arc::new(documents),
            })
        }
        None => {
            tracing::warn!(
                "no MongoDB configured (BRAIN_MONGODB_URI): lease state is held in this process only; \
                 run a single brain, or configure MongoDB for several pods"
            );
            Ok(Stores {
                leases: Arc::new(MemoryStore::default()),
                cluster: Arc::new(MemoryClusterStore::default()),
                documents: Arc::new(MemoryDocumentStore::default()),
            })
        }
    }
}

/// Runs the brain until `shutdown` resolves: not ready, drain requests, stop the heartbeat and the sweeper, mark
/// the pod stopped.
pub async fn run(config: BrainConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), StartError> {
    let metrics = match PrometheusBuilder::new().install_recorder() {
        Ok(handle) => Some(handle),
        Err(e) => {
            tracing::warn!(error = %e, "metrics recorder not installed");
            None
        }
    };
    let stores = open_stores(&config).await?;
    let listener = TcpListener::bind(config.listen).await?;
    let local = listener.local_addr()?;
    let endpoint = config.advertised_endpoint.clone().unwrap_or_else(|| format!("http://{local}"));
    let cluster = ClusterService::new(stores.cluster, config.pod_id.clone(), endpoint, config.heartbeat_staleness);
    cluster.register().await?;
    let liveness = LeasePodLiveness::new(cluster.clone());

    bundled_definitions()?;
    let fanout = DocumentChangeFanout::new(cluster.clone(), config.internal_secret.clone());
    let definitions = Arc::new(
        LayeredDefinitions::new(stores.documents).with_classpath(Classpath::bundled()).with_listener(Arc::new(fanout)),
    );
    let addons = crate::addons::compiled_in(&config, &definitions);
    let mut registry = HandlerRegistry::default();
    registry.register(Arc::new(WebhookHandler::new(config.pod_id.clone())));
    for handler in addons.iter().flat_map(|a| a.handlers()) {
        registry.register(handler);
    }
    let registry = Arc::new(registry);
    let dispatcher = LeaseRevocationDispatcher::new(registry.clone(), liveness.clone(), config.internal_secret.clone());
    let leases =
        ResourceLeaseService::new(stores.leases, definitions.clone(), registry, Some(Arc::new(dispatcher.clone())));

    let sweeper = LeaseSweeper::new(
        &leases,
        SweeperConfig {
            pod: config.pod_id.clone(),
            reap_interval: config.reap_interval,
            reconcile: ReconcileOptions { safety: config.reconcile_safety, settle: config.reconcile_settle },
        },
        Some(Arc::new(liveness.clone()) as Arc<dyn PodLiveness>),
    );
    let ready = Arc::new(AtomicBool::new(true));
    let state = AppState {
        sweeper: sweeper.clone(),
        leases,
        definitions,
        dispatcher,
        liveness,
        jwt: config.jwt_secret.as_deref().map(JwtKeys::new),
        internal_secret: config.internal_secret.clone(),
        pod_id: config.pod_id.clone(),
        metrics,
        ready: ready.clone(),
    };
    if config.internal_secret_generated {
        tracing::warn!(
            "no BRAIN_INTERNAL_SECRET: a random one guards this brain's internal and admin endpoints, so the operator \
             CLI (anus) cannot act on it; give both the same BRAIN_INTERNAL_SECRET (16+ characters)"
        );
    }
    if state.jwt.is_none() {
        tracing::warn!("no BRAIN_JWT_SECRET: the lease API answers 503");
    }

    let ctx = crate::addons::AddonContext {
        leases: state.leases.clone(),
        definitions: state.definitions.clone(),
        jwt: state.jwt.clone(),
        pod_id: config.pod_id.clone(),
    };
    let app = addons.iter().fold(router(state), |app, addon| app.merge(addon.router(&ctx)));

    let (stop_tx, stop_rx) = watch::channel(false);
    let heartbeat = tokio::spawn(heartbeat_loop(cluster.clone(), config.heartbeat_interval, stop_rx));
    let sweeping = sweeper.spawn();

    tracing::info!(addr = %local, pod = %config.pod_id, "brain listening");
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            ready.store(false, Ordering::SeqCst);
            tracing::info!("shutting down: not ready, draining requests");
        })
        .await;
    let _ = stop_tx.send(true);
    if tokio::time::timeout(Duration::from_secs(5), heartbeat).await.is_err() {
        tracing::warn!("heartbeat task did not stop within 5 s");
    }
    if tokio::time::timeout(Duration::from_secs(10), sweeping.shutdown()).await.is_err() {
        tracing::warn!("sweeper did not stop within 10 s");
    }
    for addon in &addons {
        addon.shutdown().await;
    }
    if let Err(e) = cluster.mark_stopped().await {
        tracing::warn!(error = %e, "could not mark the pod stopped; it will go stale");
    }
    served?;
    Ok(())
}

async fn heartbeat_loop(cluster: ClusterService, interval: Duration, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {
                if let Err(e) = cluster.heartbeat().await {
                    tracing::warn!(error = %e, "heartbeat failed");
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C: the shutdown trigger of the binaries.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
