#!/usr/bin/env bash
# The project's benchmark: `cargo bench -p lease-shared --bench lease-bench`
# (release profile) against a real MongoDB. See BENCHMARKS.md.
#
# LEASE_BENCH_MONGODB_URI, else LEASE_TEST_MONGODB_URI, if set, is used as is
# (e.g. a MongoDB you run yourself). Otherwise a private mongod is started for
# this run (scripts/mongod.sh) and stopped on exit, whether the bench passes,
# fails or is interrupted. The bench works in a fresh database of its own and
# drops it at the end.
# Extra arguments go to cargo bench.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# Build first (several minutes from cold on a small machine), so that no
# mongod sits idle during the compile.
cargo bench -p lease-shared --bench lease-bench --no-run "$@"

uri=${LEASE_BENCH_MONGODB_URI:-${LEASE_TEST_MONGODB_URI:-}}
if [[ -z $uri ]]; then
	# A state dir of our own: never reuse, nor stop, a mongod a developer has
	# running from scripts/mongod.sh start.
	LEASE_MONGOD_STATE=$(mktemp -d "${TMPDIR:-/tmp}/lease-bench-state.XXXXXX")
	export LEASE_MONGOD_STATE
	# Set before start, so a start that fails half-way is cleaned up as well.
	# stop kills by the PID recorded in the state dir.
	trap 'scripts/mongod.sh stop || true; rm -rf "$LEASE_MONGOD_STATE"' EXIT
	# Turn signals into a normal exit so the EXIT trap runs.
	trap 'exit 130' INT
	trap 'exit 143' TERM
	uri=$(scripts/mongod.sh start)
fi
export LEASE_BENCH_MONGODB_URI=$uri
echo "bench.sh: LEASE_BENCH_MONGODB_URI=$uri" >&2

status=0
cargo bench -p lease-shared --bench lease-bench "$@" || status=$?
exit "$status"
