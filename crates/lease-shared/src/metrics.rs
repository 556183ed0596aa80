//! Metric names (spec §8, Prometheus style) and the helpers that record them. Labels are low-cardinality:
//! resource, outcome, reason — never a tenant, user or token.

/// `vance_lease_acquire_total{resource,outcome=success|busy|noop|unavailable}`.
pub const ACQUIRE_TOTAL: &str = "vance_lease_acquire_total";
/// `vance_lease_acquire_duration_seconds{resource,outcome}`: time from call to grant or refusal, waits included.
pub const ACQUIRE_DURATION: &str = "vance_lease_acquire_duration_seconds";
/// `vance_lease_check_total{resource,outcome=ok|lost}`.
pub const CHECK_TOTAL: &str = "vance_lease_check_total";
/// `vance_lease_release_total{resource,outcome=ok|already-released|error}`.
pub const RELEASE_TOTAL: &str = "vance_lease_release_total";
/// `vance_lease_reap_total{reason=idle|pod|revoke}`.
pub const REAP_TOTAL: &str = "vance_lease_reap_total";
/// `vance_lease_reconcile_total{outcome=corrected}`.
pub const RECONCILE_TOTAL: &str = "vance_lease_reconcile_total";

pub(crate) fn acquired(resource: &str, outcome: &'static str, seconds: f64) {
    let labels = [("resource", resource.to_owned()), ("outcome", outcome.to_owned())];
    metrics::counter!(ACQUIRE_TOTAL, &labels).increment(1);
    metrics::histogram!(ACQUIRE_DURATION, &labels).record(seconds);
}

pub(crate) fn checked(resource: &str, outcome: &'static str) {
    metrics::counter!(CHECK_TOTAL, "resource" => resource.to_owned(), "outcome" => outcome).increment(1);
}

pub(crate) fn released(resource: &str, outcome: &'static str) {
    metrics::counter!(RELEASE_TOTAL, "resource" => resource.to_owned(), "outcome" => outcome).increment(1);
}

pub(crate) fn reaped(reason: &'static str) {
    metrics::counter!(REAP_TOTAL, "reason" => reason).increment(1);
}

pub(crate) fn reconciled(outcome: &'static str) {
    metrics::counter!(RECONCILE_TOTAL, "outcome" => outcome).increment(1);
}
