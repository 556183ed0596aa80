//! The HTTP server of the brain.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use lease_shared::{LeaseDefinition, LeaseStore, MemoryStore, MongoStore, ResourceLeaseService, StaticDefinitions};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use crate::config::BrainConfig;

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
    /// Renders the Prometheus text.
    pub metrics: PrometheusHandle,
    /// False once shutdown has begun: load balancers stop sending.
    pub ready: Arc<AtomicBool>,
}

/// The routes of the brain.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(|State(s): State<AppState>| async move { s.metrics.render() }))
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

/// Opens the configured store: MongoDB if a URI is configured, the embedded store otherwise.
pub async fn open_store(config: &BrainConfig) -> Result<Arc<dyn LeaseStore>, StartError> {
    match &config.mongodb_uri {
        Some(uri) => {
            let (_client, store) = MongoStore::connect(uri, &config.database).await?;
            store.ensure_indexes().await?;
            tracing::info!(database = %config.database, "lease state in MongoDB");
            Ok(Arc::new(store))
        }
        None => {
            tracing::warn!(
                "no MongoDB configured (BRAIN_MONGODB_URI): lease state is held in this process only; \
                 run a single brain, or configure MongoDB for several pods"
            );
            Ok(Arc::new(MemoryStore::default()))
        }
    }
}

/// Runs the brain until `shutdown` resolves, then marks it not ready and drains in-flight requests.
pub async fn run(config: BrainConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), StartError> {
    let metrics = PrometheusBuilder::new().install_recorder().map_err(|e| StartError::Metrics(e.to_string()))?;
    let store = open_store(&config).await?;
    let definitions = Arc::new(StaticDefinitions::new(bundled_definitions()?));
    let leases = ResourceLeaseService::new(store, definitions, Arc::new(HashSet::<String>::new()), None);
    let ready = Arc::new(AtomicBool::new(true));
    let state = AppState { leases, metrics, ready: ready.clone() };
    let listener = TcpListener::bind(config.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "brain listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            ready.store(false, Ordering::SeqCst);
            tracing::info!("shutting down: not ready, draining requests");
        })
        .await?;
    Ok(())
}
