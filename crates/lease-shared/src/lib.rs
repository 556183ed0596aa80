//! Resource leases: limited, fair sharing of scarce resources across tenants (spec §1–§6).
//!
//! # Layout
//! - [`definition`]: the YAML lease definition, its validation, the resolved [`LeaseDefinition`].
//! - [`store`]: the store seam — storage primitives only — with [`MongoStore`] and [`MemoryStore`].
//! - [`service`]: [`ResourceLeaseService`], the funnel of spec §4 written once above the store, and the
//!   [`Lease`] handle.
//! - [`reap`]: idle reap, dead-pod reap and revocation, the [`LeaseRevocationListener`] and [`PodLiveness`] seams
//!   and the [`LeaseHandler`] trait.
//! - [`reconcile`]: repairing counter drift from the holders' booked levels; [`sweeper`]: the scheduled sweep.
//! - [`error`]: [`LeaseError`] with its stable codes; [`metrics`]: metric names.
//!
//! This crate knows nothing about HTTP: the brain serves the API and dispatches handlers across pods.

pub mod config;
pub mod definition;
pub mod error;
pub mod metrics;
pub mod reap;
pub mod reconcile;
pub mod service;
pub mod store;
pub mod sweeper;

pub use config::{
    Classpath, DocumentChangeListener, DocumentChanged, DocumentStore, Layer, LayeredDefinitions, MemoryDocumentStore,
    MongoDocumentStore,
};
pub use definition::{Caps, DefinitionDocument, DefinitionError, LeaseDefinition};
pub use error::{BusyDetails, LeaseError, Level, StoreError};
pub use reap::{LeaseHandler, LeaseRevocationListener, PodLiveness, Reaper, RevocationReason};
pub use reconcile::{ReconcileOptions, ReconcileReport, Reconciler};
pub use service::{
    DefinitionSource, Lease, LeaseRef, LeaseRequest, LeaseTypes, ReleaseOutcome, ResourceLeaseService,
    StaticDefinitions,
};
pub use store::{LeaseStore, MemoryStore, MongoStore, Payload};
pub use sweeper::{LeaseSweeper, SweepReport, SweeperConfig, SweeperHandle};
