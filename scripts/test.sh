#!/usr/bin/env bash
# The project's test command: `cargo test --workspace` against a real MongoDB.
#
# LEASE_TEST_MONGODB_URI, if set, is used as is (e.g. a MongoDB you run yourself).
# Otherwise a private mongod is started for this run (scripts/mongod.sh) and
# stopped on exit, whether the tests pass, fail or are interrupted.
# LEASE_MCP_EVERYTHING (server-everything's entry point for the mcp-client tests)
# and LEASE_MCP_PLAYWRIGHT (@playwright/mcp's, for the browser test), if unset,
# come from scripts/mcp-servers.sh, which installs them when missing; so does
# LEASE_PLAYWRIGHT_CORE (playwright-core's package directory: the browser driver
# of the Tenant Insights page test).
# LEASE_CHROMIUM (the browser of the Tenant Insights page test), if unset, comes
# from scripts/chromium.sh, which installs Debian's chromium when missing.
# Extra arguments go to cargo test, e.g. scripts/test.sh -p lease-brain -- --nocapture
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# The real MCP server the mcp-client tests run against (npm, into .cache/npm/; idempotent).
if [[ -z ${LEASE_MCP_EVERYTHING:-} ]]; then
	LEASE_MCP_EVERYTHING=$(scripts/mcp-servers.sh)
	export LEASE_MCP_EVERYTHING
fi
echo "test.sh: LEASE_MCP_EVERYTHING=$LEASE_MCP_EVERYTHING" >&2
if [[ -z ${LEASE_MCP_PLAYWRIGHT:-} ]]; then
	LEASE_MCP_PLAYWRIGHT=$(scripts/mcp-servers.sh install >/dev/null && scripts/mcp-servers.sh playwright-path)
	export LEASE_MCP_PLAYWRIGHT
fi
echo "test.sh: LEASE_MCP_PLAYWRIGHT=$LEASE_MCP_PLAYWRIGHT" >&2
if [[ -z ${LEASE_PLAYWRIGHT_CORE:-} ]]; then
	LEASE_PLAYWRIGHT_CORE=$(scripts/mcp-servers.sh install >/dev/null && scripts/mcp-servers.sh playwright-core-path)
	export LEASE_PLAYWRIGHT_CORE
fi
echo "test.sh: LEASE_PLAYWRIGHT_CORE=$LEASE_PLAYWRIGHT_CORE" >&2

# The real browser the Tenant Insights page test runs (apt-get; idempotent).
if [[ -z ${LEASE_CHROMIUM:-} ]]; then
	LEASE_CHROMIUM=$(scripts/chromium.sh)
	export LEASE_CHROMIUM
fi
echo "test.sh: LEASE_CHROMIUM=$LEASE_CHROMIUM" >&2

if [[ -z ${LEASE_TEST_MONGODB_URI:-} ]]; then
	# A state dir of our own: never reuse, nor stop, a mongod a developer has
	# running from scripts/mongod.sh start.
	LEASE_MONGOD_STATE=$(mktemp -d "${TMPDIR:-/tmp}/lease-test-state.XXXXXX")
	export LEASE_MONGOD_STATE
	# Set before start, so a start that fails half-way is cleaned up as well.
	# stop kills by the PID recorded in the state dir.
	trap 'scripts/mongod.sh stop || true; rm -rf "$LEASE_MONGOD_STATE"' EXIT
	# Turn signals into a normal exit so the EXIT trap runs.
	trap 'exit 130' INT
	trap 'exit 143' TERM
	LEASE_TEST_MONGODB_URI=$(scripts/mongod.sh start)
	export LEASE_TEST_MONGODB_URI
fi
echo "test.sh: LEASE_TEST_MONGODB_URI=$LEASE_TEST_MONGODB_URI" >&2

status=0
# The end-to-end tests (crates/tests) spawn the brain's binaries: build them first, whatever subset is tested.
cargo build -p lease-brain --bins || status=$?
[[ $status -eq 0 ]] && { cargo test --workspace "$@" || status=$?; }
exit "$status"
