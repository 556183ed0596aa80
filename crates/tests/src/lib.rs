//! End-to-end tests across processes: several brain pods on one MongoDB, real HTTP on loopback.
//!
//! The tests themselves live in `tests/`; this library will hold their helpers (spawning brain processes,
//! minting tokens, sampling holders directly in MongoDB).
