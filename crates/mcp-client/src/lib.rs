//! The MCP client whose sessions are guarded by leases.
//!
//! This crate will hold the stdio and Streamable-HTTP transports, `McpConnection`, the connection pool, the
//! lease-backed `SessionGuard` and the `mcp` lease handler. It serves no HTTP itself.
