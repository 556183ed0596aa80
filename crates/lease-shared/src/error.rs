//! The typed errors of the lease system, each with a stable machine code (DESIGN.md, "Error codes").

use std::fmt;

/// Why an acquisition found a level full: everything an operator needs to diagnose the wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyDetails {
    /// The counted resource, e.g. `tex2pdf`.
    pub resource: String,
    /// The level that stayed full.
    pub level: Level,
    /// The scope of that level's counter (`*`, `<tenant>`, `<tenant>/<project>`, `<tenant>/<user>`).
    pub scope: String,
    /// Occupancy of the counter when the wait ended.
    pub count: i64,
    /// The level's cap.
    pub cap: u32,
    /// Milliseconds until the earliest holder of that level becomes idle-reapable, when known.
    pub retry_after_ms: Option<u64>,
}

/// The four quota levels, narrow to wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// Per user, across the user's projects.
    User,
    /// Per project.
    Project,
    /// Per tenant.
    Tenant,
    /// Across all tenants: the resource ceiling.
    Global,
}

impl Level {
    /// The check order of an acquisition: narrow to wide.
    pub const NARROW_TO_WIDE: [Level; 4] = [Level::User, Level::Project, Level::Tenant, Level::Global];

    /// The name used in counter keys, configs and error bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::User => "user",
            Level::Project => "project",
            Level::Tenant => "tenant",
            Level::Global => "global",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every way a lease operation can fail.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A level stayed full for the definition's `waitMs`.
    #[error(
        "resource {} is busy: level {} ({}) holds {} of {} slots",
        .0.resource, .0.level, .0.scope, .0.count, .0.cap
    )]
    Busy(Box<BusyDetails>),
    /// The store or a config layer could not be used; the resource must not be used unprotected.
    #[error("lease store unavailable: {reason}")]
    Unavailable {
        /// What failed, for the operator.
        reason: String,
    },
    /// The lease was reaped or revoked; the holder must stop using the resource.
    #[error("lease {token} was lost: reaped or revoked")]
    Lost {
        /// The lost lease's token.
        token: String,
    },
    /// The request itself is wrong: bad name, forbidden inline field, unknown type, malformed body.
    #[error("invalid request: {field}: {message}")]
    InvalidRequest {
        /// The offending field, e.g. `type` or `levels.global`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl LeaseError {
    /// The stable machine code of DESIGN.md.
    pub fn code(&self) -> &'static str {
        match self {
            LeaseError::Busy(_) => "LEASE_BUSY",
            LeaseError::Unavailable { .. } => "LEASE_UNAVAILABLE",
            LeaseError::Lost { .. } => "LEASE_LOST",
            LeaseError::InvalidRequest { .. } => "INVALID_REQUEST",
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        LeaseError::InvalidRequest { field: field.into(), message: message.into() }
    }

    pub(crate) fn unavailable(reason: impl fmt::Display) -> Self {
        LeaseError::Unavailable { reason: reason.to_string() }
    }
}

/// A failure of the storage layer. Every store error is fail-closed: an acquisition that meets one hands out no
/// lease.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{operation}: {message}")]
pub struct StoreError {
    /// The primitive that failed, e.g. `increment`.
    pub operation: &'static str,
    /// The underlying error, as text.
    pub message: String,
}

impl StoreError {
    /// A store error of `operation`.
    pub fn new(operation: &'static str, message: impl fmt::Display) -> Self {
        StoreError { operation, message: message.to_string() }
    }
}

impl From<StoreError> for LeaseError {
    fn from(e: StoreError) -> Self {
        LeaseError::unavailable(e)
    }
}
