//! The narrow bridge between tool clients and leases.
//!
//! This crate will hold the `SessionGuard` trait (open → guard, after-initialize → payload, every call → check,
//! close → release), its revoked-session error and a no-op guard for clients without leases. It knows nothing of
//! MongoDB, of `lease-shared` or of HTTP servers: a tool client depends on this crate alone.
