//! The tex add-on: lease-guarded PDF compiles.
//!
//! This crate will hold the tex2pdf client (submit and poll), the compile flow of spec §7 (acquire before submit,
//! payload with the job id, `check()` in every poll iteration, release on the result), the `TexCompileTracker`
//! and the `tex` lease handler. It serves no HTTP itself: `lease-brain` mounts its endpoint.
