//! Resource leases: limited, fair sharing of scarce resources across tenants (spec §1–§6).
//!
//! # Layout
//! - [`definition`]: the YAML lease definition, its validation, the resolved [`LeaseDefinition`].
//! - [`store`]: the store seam — storage primitives only — with [`MongoStore`] and [`MemoryStore`].
//! - [`service`]: [`ResourceLeaseService`], the funnel of spec §4 written once above the store, and the
//!   [`Lease`] handle.
//! - [`reap`]: idle reap and revocation, the [`LeaseRevocationListener`] seam and the [`LeaseHandler`] trait.
//! - [`error`]: [`LeaseError`] with its stable codes; [`metrics`]: metric names.
//!
//! This crate knows nothing about HTTP: the brain serves the API and dispatches handlers across pods.

pub mod definition;
pub mod error;
pub mod metrics;
pub mod reap;
pub mod service;
pub mod store;

pub use definition::{Caps, DefinitionDocument, DefinitionError, LeaseDefinition};
pub use error::{BusyDetails, LeaseError, Level, StoreError};
pub use reap::{LeaseHandler, LeaseRevocationListener, Reaper, RevocationReason};
pub use service::{
    DefinitionSource, Lease, LeaseRef, LeaseRequest, LeaseTypes, ReleaseOutcome, ResourceLeaseService,
    StaticDefinitions,
};
pub use store::{LeaseStore, MemoryStore, MongoStore, Payload};
