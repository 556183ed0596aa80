#!/usr/bin/env bash
# Install Debian's Chromium for the Tenant Insights browser test (idempotent).
#
#   scripts/chromium.sh            install if missing; print the binary path (/usr/bin/chromium)
#   scripts/chromium.sh install    the same
#   scripts/chromium.sh path       print the binary path if installed, fail otherwise (never installs)
#
# Only the path goes to stdout, so `LEASE_CHROMIUM=$(scripts/chromium.sh)` works; progress and errors go to
# stderr. Installing needs root (or sudo) and apt-get.
set -euo pipefail

BINARY=/usr/bin/chromium

log() { printf 'chromium.sh: %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

install() {
	[[ -x $BINARY ]] && return 0
	command -v apt-get >/dev/null || die "apt-get not found: install Chromium yourself and set LEASE_CHROMIUM"
	local sudo=()
	if [[ $(id -u) -ne 0 ]]; then
		command -v sudo >/dev/null || die "not root and no sudo: cannot install chromium"
		sudo=(sudo)
	fi
	log "installing chromium with apt-get"
	"${sudo[@]}" apt-get update >&2
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y chromium >&2
	[[ -x $BINARY ]] || die "apt-get install chromium left no $BINARY"
}

case "${1:-install}" in
install)
	install
	printf '%s\n' "$BINARY"
	;;
path)
	[[ -x $BINARY ]] || die "chromium is not installed; run scripts/chromium.sh"
	printf '%s\n' "$BINARY"
	;;
*)
	die "unknown command '$1' (use: install | path)"
	;;
esac
