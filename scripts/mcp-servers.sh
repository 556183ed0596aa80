#!/usr/bin/env bash
# Install the real MCP servers the mcp-client tests run against.
#
#   scripts/mcp-servers.sh            install (idempotent); print the entry point of server-everything
#   scripts/mcp-servers.sh install    the same
#   scripts/mcp-servers.sh path       print the entry point if installed, fail otherwise (never installs)
#   scripts/mcp-servers.sh playwright-path
#                                     the same for @playwright/mcp (installed along; never downloads a browser:
#                                     run it with --executable-path, e.g. Debian's chromium, scripts/chromium.sh)
#   scripts/mcp-servers.sh playwright-core-path
#                                     the package directory of playwright-core (installed along; the browser driver
#                                     of the Tenant Insights page test: require() it and launch chromium with
#                                     executablePath; it never downloads a browser either)
#
# All three are pinned to exact versions and installed with npm, in one idempotent
# install, into the git-ignored .cache/npm/. Only the path goes to stdout, so
# `LEASE_MCP_EVERYTHING=$(scripts/mcp-servers.sh)` works; progress and errors
# go to stderr.
#
# How the entry point starts (node 18+):
#   node <entry> stdio                     MCP over stdio (the default without an argument)
#   PORT=<port> node <entry> streamableHttp Streamable HTTP at http://<host>:<port>/mcp (default port 3001,
#                                          listens on all interfaces); it prints
#                                          "MCP Streamable HTTP Server listening on port <port>" to stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX="$ROOT/.cache/npm" # git-ignored via /.cache
PACKAGE="@modelcontextprotocol/server-everything"
VERSION="2026.8.31"
PKGDIR="$PREFIX/node_modules/$PACKAGE"
ENTRY="$PKGDIR/dist/index.js"
PW_PACKAGE="@playwright/mcp"
PW_VERSION="0.0.83" # needs node 20+ (its playwright dependency)
PW_PKGDIR="$PREFIX/node_modules/$PW_PACKAGE"
PW_ENTRY="$PW_PKGDIR/cli.js"
PWC_PACKAGE="playwright-core"
PWC_VERSION="1.65.1" # needs node 20+; no dependencies
PWC_PKGDIR="$PREFIX/node_modules/$PWC_PACKAGE"
PWC_ENTRY="$PWC_PKGDIR/index.js"

log() { printf 'mcp-servers.sh: %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# The version of the installed package, empty if none.
installed_version() {
	local dir=${1:-$PKGDIR} entry=${2:-$ENTRY}
	[[ -f $dir/package.json && -f $entry ]] || return 0
	node -e 'process.stdout.write(require(process.argv[1]).version)' "$dir/package.json" 2>/dev/null || true
}

install() {
	command -v node >/dev/null || die "node is not installed (need Node.js 20 or newer, with npm)"
	command -v npm >/dev/null || die "npm is not installed (need Node.js 20 or newer, with npm)"
	if [[ $(installed_version) == "$VERSION" && $(installed_version "$PW_PKGDIR" "$PW_ENTRY") == "$PW_VERSION" &&
		$(installed_version "$PWC_PKGDIR" "$PWC_ENTRY") == "$PWC_VERSION" ]]; then
		return 0
	fi
	log "installing $PACKAGE@$VERSION, $PW_PACKAGE@$PW_VERSION and $PWC_PACKAGE@$PWC_VERSION into $PREFIX"
	mkdir -p "$PREFIX"
	# One install of all three: npm nests @playwright/mcp's own (differently pinned) playwright-core below it,
	# so the top-level playwright-core is ours.
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$PREFIX" --save-exact --no-audit --no-fund \
		--loglevel=error "$PACKAGE@$VERSION" "$PW_PACKAGE@$PW_VERSION" "$PWC_PACKAGE@$PWC_VERSION" >&2
	[[ $(installed_version) == "$VERSION" ]] || die "npm install left no $PACKAGE@$VERSION in $PKGDIR"
	[[ $(installed_version "$PW_PKGDIR" "$PW_ENTRY") == "$PW_VERSION" ]] ||
		die "npm install left no $PW_PACKAGE@$PW_VERSION in $PW_PKGDIR"
	[[ $(installed_version "$PWC_PKGDIR" "$PWC_ENTRY") == "$PWC_VERSION" ]] ||
		die "npm install left no $PWC_PACKAGE@$PWC_VERSION in $PWC_PKGDIR"
}

case "${1:-install}" in
install)
	install
	printf '%s\n' "$ENTRY"
	;;
path)
	[[ $(installed_version) == "$VERSION" ]] || die "$PACKAGE@$VERSION is not installed; run scripts/mcp-servers.sh"
	printf '%s\n' "$ENTRY"
	;;
playwright-path)
	[[ $(installed_version "$PW_PKGDIR" "$PW_ENTRY") == "$PW_VERSION" ]] ||
		die "$PW_PACKAGE@$PW_VERSION is not installed; run scripts/mcp-servers.sh"
	printf '%s\n' "$PW_ENTRY"
	;;
playwright-core-path)
	[[ $(installed_version "$PWC_PKGDIR" "$PWC_ENTRY") == "$PWC_VERSION" ]] ||
		die "$PWC_PACKAGE@$PWC_VERSION is not installed; run scripts/mcp-servers.sh"
	printf '%s\n' "$PWC_PKGDIR"
	;;
*)
	die "unknown command '$1' (use: install | path | playwright-path | playwright-core-path)"
	;;
esac
