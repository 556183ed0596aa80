//! Handler registry and the revocation dispatcher: the brain's `LeaseRevocationListener` (spec §6).
//!
//! | holder's pod            | what happens                                                          |
//! |-------------------------|-----------------------------------------------------------------------|
//! | this pod                | the type's handler runs here                                          |
//! | another live pod        | `POST /internal/lease/revoked` to it; a failed POST counts as dead    |
//! | dead, pod-bound         | nothing more: the resource died with the pod; the slot is already free |
//! | dead, not pod-bound     | the handler runs here, on the reaper pod, with the holder's payload   |

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_shared::store::HolderRecord;
use lease_shared::{LeaseHandler, LeaseRevocationListener, LeaseTypes, RevocationReason};
use serde::{Deserialize, Serialize};

use crate::cluster::LeasePodLiveness;

/// The header carrying the internal shared secret on pod-to-pod and operator calls.
pub const INTERNAL_SECRET_HEADER: &str = "x-vance-internal-secret";

/// The handlers by lease type. Also the set of types an acquisition may name.
#[derive(Debug, Default, Clone)]
pub struct HandlerRegistry {
    handlers: HashMap<String, Arc<dyn LeaseHandler>>,
}

impl HandlerRegistry {
    /// Registers `handler` for its type (a later registration of the same type replaces it).
    pub fn register(&mut self, handler: Arc<dyn LeaseHandler>) {
        self.handlers.insert(handler.lease_type().to_owned(), handler);
    }

    /// The handler of `lease_type`.
    pub fn get(&self, lease_type: &str) -> Option<&Arc<dyn LeaseHandler>> {
        self.handlers.get(lease_type)
    }
}

impl LeaseTypes for HandlerRegistry {
    fn is_registered(&self, lease_type: &str) -> bool {
        self.handlers.contains_key(lease_type)
    }
}

/// A revoked holder as sent between pods (`POST /internal/lease/revoked`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RevokedHolder {
    /// The deleted holder document.
    pub holder: HolderRecord,
    /// Why it was revoked.
    pub reason: RevocationReason,
}

/// Where a revocation was handled: the dispatcher's decision, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatched {
    /// The handler ran on this pod (own holder, or a dead pod's non-pod-bound holder).
    Local,
    /// Forwarded to the live pod at this endpoint.
    Forwarded(String),
    /// The holder's pod is dead and the resource died with it: nothing to clean up.
    ReleasedOnly,
    /// No handler is registered for the type (logged).
    NoHandler,
}

impl Dispatched {
    /// The label of `vance_lease_dispatch_total{outcome}`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Dispatched::Local => "local",
            Dispatched::Forwarded(_) => "forwarded",
            Dispatched::ReleasedOnly => "released-only",
            Dispatched::NoHandler => "no-handler",
        }
    }
}

/// `vance_lease_dispatch_total{outcome=local|forwarded|released-only|no-handler}`: where this pod's revocations
/// (reaps and operator revokes it performed) were handled.
pub const DISPATCH_TOTAL: &str = "vance_lease_dispatch_total";

/// The `LeaseRevocationListener` of the brain.
#[derive(Debug, Clone)]
pub struct LeaseRevocationDispatcher {
    registry: Arc<HandlerRegistry>,
    liveness: LeasePodLiveness,
    http: reqwest::Client,
    internal_secret: String,
}

impl LeaseRevocationDispatcher {
    /// A dispatcher over `registry`, deciding by `liveness`, forwarding with `internal_secret`.
    pub fn new(registry: Arc<HandlerRegistry>, liveness: LeasePodLiveness, internal_secret: String) -> Self {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap_or_default();
        LeaseRevocationDispatcher { registry, liveness, http, internal_secret }
    }

    /// Runs the handler of `holder`'s type on this pod.
    pub async fn run_local(&self, holder: &HolderRecord, reason: RevocationReason) -> Dispatched {
        let Some(handler) = self.registry.get(&holder.lease_type) else {
            tracing::warn!(token = %holder.token, lease_type = %holder.lease_type, "no handler for revoked lease");
            return Dispatched::NoHandler;
        };
        if let Err(e) = handler.on_revoked(holder, reason).await {
            tracing::warn!(token = %holder.token, lease_type = %holder.lease_type, error = %e, "revocation handler failed");
        }
        Dispatched::Local
    }

    /// Decides where `holder`'s revocation is handled and handles it (the matrix of the module docs).
    pub async fn dispatch(&self, holder: &HolderRecord, reason: RevocationReason) -> Dispatched {
        if holder.pod == self.liveness.self_pod_id() {
            return self.run_local(holder, reason).await;
        }
        let endpoint = match self.liveness.alive_endpoint(&holder.pod).await {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(pod = %holder.pod, error = %e, "pod liveness unreadable; treating the pod as unreachable");
                None
            }
        };
        if let Some(endpoint) = endpoint {
            let url = format!("{}/internal/lease/revoked", endpoint.trim_end_matches('/'));
            let sent = self
                .http
                .post(&url)
                .header(INTERNAL_SECRET_HEADER, &self.internal_secret)
                .json(&RevokedHolder { holder: holder.clone(), reason })
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => return Dispatched::Forwarded(endpoint),
                Ok(r) => {
                    tracing::warn!(pod = %holder.pod, status = %r.status(), "revocation POST refused; pod unreachable")
                }
                Err(e) => tracing::warn!(pod = %holder.pod, error = %e, "revocation POST failed; pod unreachable"),
            }
        }
        if holder.pod_bound {
            tracing::info!(token = %holder.token, pod = %holder.pod, "holder pod dead; pod-bound resource died with it");
            Dispatched::ReleasedOnly
        } else {
            self.run_local(holder, reason).await
        }
    }
}

#[async_trait]
impl LeaseRevocationListener for LeaseRevocationDispatcher {
    async fn on_revoked(&self, holder: HolderRecord, reason: RevocationReason) {
        let outcome = self.dispatch(&holder, reason).await;
        metrics::counter!(DISPATCH_TOTAL, "outcome" => outcome.as_str()).increment(1);
        tracing::info!(token = %holder.token, pod = %holder.pod, %reason, ?outcome, "revocation dispatched");
    }
}

/// The built-in `webhook` type for remote consumers: not pod-bound; its handler POSTs the revocation to the
/// `callbackUrl` of the lease payload.
#[derive(Debug, Clone)]
pub struct WebhookHandler {
    http: reqwest::Client,
    pod: String,
}

impl WebhookHandler {
    /// The type name.
    pub const TYPE: &'static str = "webhook";

    /// The handler of the pod `pod` (named as `handledBy` in the callback, for diagnosis).
    pub fn new(pod: impl Into<String>) -> Self {
        WebhookHandler { http: reqwest::Client::new(), pod: pod.into() }
    }
}

#[async_trait]
impl LeaseHandler for WebhookHandler {
    fn lease_type(&self) -> &str {
        Self::TYPE
    }

    async fn on_revoked(&self, holder: &HolderRecord, reason: RevocationReason) -> Result<(), String> {
        let Some(url) = holder.payload.get("callbackUrl").and_then(|v| v.as_str()) else {
            return Err("webhook lease without callbackUrl in its payload".to_owned());
        };
        let body = serde_json::json!({
            "token": holder.token,
            "reason": reason.as_str(),
            "resource": holder.resource,
            "holderRef": holder.holder_ref,
            "handledBy": self.pod,
        });
        let r = self
            .http
            .post(url)
            .timeout(Duration::from_secs(5))
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("callback POST failed: {e}"))?;
        if r.status().is_success() { Ok(()) } else { Err(format!("callback answered {}", r.status())) }
    }
}

/// Tells every other live pod about a config document change (`POST /internal/documents/changed`), so that
/// their caches drop the affected definitions. Awaited on the writer's path, each POST bounded by a timeout: when
/// a write through the brain returns, every reachable pod has dropped its stale entries.
#[derive(Debug, Clone)]
pub struct DocumentChangeFanout {
    cluster: crate::cluster::ClusterService,
    http: reqwest::Client,
    internal_secret: String,
}

impl DocumentChangeFanout {
    /// A fan-out to the live peers of `cluster`.
    pub fn new(cluster: crate::cluster::ClusterService, internal_secret: String) -> Self {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap_or_default();
        DocumentChangeFanout { cluster, http, internal_secret }
    }
}

#[async_trait]
impl lease_shared::DocumentChangeListener for DocumentChangeFanout {
    async fn on_changed(&self, change: &lease_shared::DocumentChanged) {
        let peers = match self.cluster.live_peers().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "pod registry unreadable; other pods learn of the change at their cache max age");
                return;
            }
        };
        let posts = peers.iter().map(|(pod, endpoint)| async move {
            let url = format!("{}/internal/documents/changed", endpoint.trim_end_matches('/'));
            let sent =
                self.http.post(&url).header(INTERNAL_SECRET_HEADER, &self.internal_secret).json(change).send().await;
            match sent {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => tracing::warn!(%pod, status = %r.status(), "document change refused by pod"),
                Err(e) => tracing::warn!(%pod, error = %e, "document change not delivered to pod"),
            }
        });
        futures_util::future::join_all(posts).await;
    }
}
