# scripts/lib.sh: shared helpers for scripts/test and scripts/run (sourced, not executed).
# Sets $repo, cds there, and provides section, die, need_apt, ensure_venv, ensure_npm_tools, ensure_deno,
# ensure_conformance and ensure_mdbook.

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

NEXOAI_VERSION=0.4.0
# The official MCP Python SDK: the real client the gateway tests drive.
MCP_SDK_VERSION=2.3.0
# Decodes OTLP trace exports in the trace tests' receiver (tests/plugins/traces).
OTEL_PROTO_VERSION=1.45.2
# The SQLite MCP server the containment-view tests give a workspace (PyPI),
# in a venv of its own: it needs the 1.x MCP SDK, the main venv pins 2.x.
MCP_SERVER_SQLITE_VERSION=2025.4.25
MCP_SERVER_SQLITE_SDK_VERSION=1.30.0

section() { printf '\n==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

_apt_updated=0
# apt_install PKG...: install Debian packages non-interactively (apt-get update once).
apt_install() {
  command -v apt-get >/dev/null || die "need package(s) $*, but apt-get is missing; install them by hand"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need package(s) $*; run as root or install sudo"
    sudo=(sudo -n)
  fi
  if [[ $_apt_updated -eq 0 ]]; then
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null
    _apt_updated=1
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" </dev/null
}

# need_apt PKG CMD: install Debian package PKG only when command CMD is missing.
need_apt() {
  local pkg=$1 cmd=$2
  command -v "$cmd" >/dev/null 2>&1 || apt_install "$pkg"
}

# ensure_venv: .venv with nexoai==$NEXOAI_VERSION, mcp==$MCP_SDK_VERSION and
# opentelemetry-proto==$OTEL_PROTO_VERSION, and .venv/bin first on PATH; and
# .venv-mcp-sqlite with mcp-server-sqlite==$MCP_SERVER_SQLITE_VERSION.
ensure_venv() {
  command -v python3 >/dev/null || die "python3 not found; install Python 3.11 or newer"
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "python3 is $(python3 -V 2>&1); plugd's Python plugins need 3.11 or newer (tomllib)"
  if [[ ! -x .venv/bin/python3 ]]; then
    # Debian splits ensurepip into python3-venv.
    python3 -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
    python3 -m venv .venv
  fi
  if ! .venv/bin/python3 -c "import nexo_plugin_sdk as m, importlib.metadata as md; assert m.__version__ == '$NEXOAI_VERSION' and md.version('mcp') == '$MCP_SDK_VERSION' and md.version('opentelemetry-proto') == '$OTEL_PROTO_VERSION'" 2>/dev/null; then
    .venv/bin/python3 -m pip install --quiet --disable-pip-version-check "nexoai==$NEXOAI_VERSION" "mcp==$MCP_SDK_VERSION" "opentelemetry-proto==$OTEL_PROTO_VERSION" </dev/null
  fi
  if ! .venv-mcp-sqlite/bin/python3 -c "import importlib.metadata as md; assert md.version('mcp-server-sqlite') == '$MCP_SERVER_SQLITE_VERSION' and md.version('mcp') == '$MCP_SERVER_SQLITE_SDK_VERSION'" 2>/dev/null; then
    python3 -m venv .venv-mcp-sqlite
    .venv-mcp-sqlite/bin/python3 -m pip install --quiet --disable-pip-version-check "mcp-server-sqlite==$MCP_SERVER_SQLITE_VERSION" "mcp==$MCP_SERVER_SQLITE_SDK_VERSION" </dev/null
  fi
  export PATH="$repo/.venv/bin:$PATH"
}

# The npm tools the tests and examples run, pinned; installed into $NPM_TOOLS.
# tsx is the TypeScript loader seed 002 names for Dexto `.ts` modules on Node
# below 22.6 (plugd finds it in .npm-tools/node_modules/.bin or on PATH); the
# official TypeScript MCP SDK is the second real client the gateway tests drive;
# server-filesystem and server-memory are third-party servers the
# containment-view tests give a workspace; oidc-provider is the real OpenID
# Connect provider the OAuth tests sign in with (tests/fixtures/oidc).
NPM_TOOLS_PACKAGES=("@modelcontextprotocol/server-everything@2026.8.31" "tsx@4.23.15" "@modelcontextprotocol/sdk@1.32.2" "@modelcontextprotocol/server-filesystem@2026.8.31" "@modelcontextprotocol/server-memory@2026.8.31" "oidc-provider@9.13.3")
NPM_TOOLS="$repo/.npm-tools"

# ensure_npm_tools: install $NPM_TOOLS_PACKAGES into .npm-tools/ (git-ignored),
# non-interactively; skipped when every package is already there at its version.
ensure_npm_tools() {
  command -v npm >/dev/null || die "npm not found; install Node.js 20 with npm (the MCP tests run @modelcontextprotocol/server-everything)"
  local spec name version missing=()
  for spec in "${NPM_TOOLS_PACKAGES[@]}"; do
    name=${spec%@*}
    version=${spec##*@}
    if ! node -e 'const p = require(process.argv[1]); process.exit(p.version === process.argv[2] ? 0 : 1)' \
      "$NPM_TOOLS/node_modules/$name/package.json" "$version" 2>/dev/null; then
      missing+=("$spec")
    fi
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    mkdir -p "$NPM_TOOLS"
    npm install --prefix "$NPM_TOOLS" --save-exact --no-audit --no-fund --no-progress \
      --loglevel=error "${missing[@]}" </dev/null
  fi
  for spec in "${NPM_TOOLS_PACKAGES[@]}"; do
    printf 'npm %s in %s\n' "$spec" "$NPM_TOOLS"
  done
}

DENO_VERSION=2.9.6

# ensure_deno: Deno $DENO_VERSION at /usr/local/bin/deno, taken from npm's
# deno package (its native binary). /usr/local is under /usr, which plugd's
# sandbox binds read-only, so sandboxed Salmex `interpreter: "deno"` plugins
# can run it too. Skipped when that version is already first on PATH.
ensure_deno() {
  if deno --version 2>/dev/null | head -n 1 | grep -q "^deno $DENO_VERSION "; then
    return
  fi
  command -v npm >/dev/null || die "npm not found; install Node.js 20 with npm (Deno $DENO_VERSION is installed from npm)"
  mkdir -p "$NPM_TOOLS"
  npm install --prefix "$NPM_TOOLS" --save-exact --no-audit --no-fund --no-progress \
    --loglevel=error "deno@$DENO_VERSION" </dev/null
  local bin="$NPM_TOOLS/node_modules/deno/deno"
  [[ -x $bin ]] || die "npm's deno@$DENO_VERSION left no binary at $bin"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need to install $bin as /usr/local/bin/deno; run as root or install sudo"
    sudo=(sudo -n)
  fi
  "${sudo[@]}" install -m 0755 "$bin" /usr/local/bin/deno
  deno --version | head -n 1 | grep -q "^deno $DENO_VERSION " ||
    die "/usr/local/bin/deno is installed but \`deno\` on PATH is $(command -v deno); put /usr/local/bin first"
}

# The official MCP conformance suite scripts/conformance runs, pinned, with a
# pinned Node 22 of its own: the runner uses fs.globSync (Node 22 and newer),
# and plugd's other tools stay on the system's Node 20. npm's `node` package
# provides the Node binary (node_modules/.bin/node).
CONFORMANCE_VERSION=0.1.16
CONFORMANCE_NODE_VERSION=22.23.3
CONFORMANCE_DIR="$NPM_TOOLS/conformance"
CONFORMANCE_NODE="$CONFORMANCE_DIR/node_modules/.bin/node"
CONFORMANCE_CLI="$CONFORMANCE_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"
# The 0.2.0 line, the only one that tests the 2026-07-28 revision (stateless,
# `server/discover`, input_required round trips): pinned exactly beside
# 0.1.16 (which keeps testing 2025-11-25), in a directory of its own, run by
# the same Node 22.
CONFORMANCE_2026_VERSION=0.2.0-alpha.12
CONFORMANCE_2026_DIR="$NPM_TOOLS/conformance-2026-07-28"
CONFORMANCE_2026_CLI="$CONFORMANCE_2026_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"

# ensure_conformance: node@$CONFORMANCE_NODE_VERSION and
# @modelcontextprotocol/conformance@$CONFORMANCE_VERSION in .npm-tools/conformance/,
# and @modelcontextprotocol/conformance@$CONFORMANCE_2026_VERSION in
# .npm-tools/conformance-2026-07-28/ (git-ignored), non-interactively; each
# skipped when it is there at that version.
ensure_conformance() {
  local want=("node@$CONFORMANCE_NODE_VERSION" "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION")
  local missing=() have
  have=$("$CONFORMANCE_NODE" --version 2>/dev/null || true)
  [[ $have == "v$CONFORMANCE_NODE_VERSION" ]] || missing+=("node $CONFORMANCE_NODE_VERSION (have: ${have:-none})")
  have=$("$CONFORMANCE_NODE" -p 'require(process.argv[1]).version' \
    "$CONFORMANCE_DIR/node_modules/@modelcontextprotocol/conformance/package.json" 2>/dev/null || true)
  [[ $have == "$CONFORMANCE_VERSION" ]] || missing+=("conformance $CONFORMANCE_VERSION (have: ${have:-none})")
  if [[ ${#missing[@]} -gt 0 ]]; then
    command -v npm >/dev/null ||
      die "npm not found; install Node.js 20 with npm (it installs the MCP conformance suite and its Node 22 into $CONFORMANCE_DIR)"
    local m list=""
    for m in "${missing[@]}"; do list+="${list:+; }$m"; done
    printf 'installing into %s: missing %s (the conformance runner needs Node 22 or newer)\n' "$CONFORMANCE_DIR" "$list"
    mkdir -p "$CONFORMANCE_DIR"
    npm install --prefix "$CONFORMANCE_DIR" --save-exact --no-audit --no-fund --no-progress \
      --loglevel=error "${want[@]}" </dev/null
    [[ $("$CONFORMANCE_NODE" --version 2>/dev/null) == "v$CONFORMANCE_NODE_VERSION" ]] ||
      die "npm's node@$CONFORMANCE_NODE_VERSION left no working $CONFORMANCE_NODE"
    [[ -f $CONFORMANCE_CLI ]] || die "npm left no $CONFORMANCE_CLI"
  fi
  printf 'npm %s and %s in %s\n' "${want[@]}" "$CONFORMANCE_DIR"
  have=$("$CONFORMANCE_NODE" -p 'require(process.argv[1]).version' \
    "$CONFORMANCE_2026_DIR/node_modules/@modelcontextprotocol/conformance/package.json" 2>/dev/null || true)
  if [[ $have != "$CONFORMANCE_2026_VERSION" ]]; then
    printf 'installing into %s: conformance %s (have: %s)\n' "$CONFORMANCE_2026_DIR" "$CONFORMANCE_2026_VERSION" "${have:-none}"
    mkdir -p "$CONFORMANCE_2026_DIR"
    npm install --prefix "$CONFORMANCE_2026_DIR" --save-exact --no-audit --no-fund --no-progress \
      --loglevel=error "@modelcontextprotocol/conformance@$CONFORMANCE_2026_VERSION" </dev/null
    [[ -f $CONFORMANCE_2026_CLI ]] || die "npm left no $CONFORMANCE_2026_CLI"
  fi
  printf 'npm @modelcontextprotocol/conformance@%s in %s (the 2026-07-28 revision, run by the same node)\n' \
    "$CONFORMANCE_2026_VERSION" "$CONFORMANCE_2026_DIR"
}

# mdBook builds the manual (docs/book) in scripts/test: the newest 0.4.x,
# built from crates.io without its default features (watch, serve, search:
# scripts/test only runs `mdbook build`).
MDBOOK_VERSION=0.4.52

# ensure_mdbook: mdbook $MDBOOK_VERSION on PATH (cargo's bin directory),
# installed with `cargo install --locked` in a temporary target directory
# that is removed afterwards; skipped when that version is already on PATH.
ensure_mdbook() {
  local cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
  case ":$PATH:" in *":$cargo_bin:"*) ;; *) export PATH="$cargo_bin:$PATH" ;; esac
  if [[ $(mdbook --version 2>/dev/null) == "mdbook v$MDBOOK_VERSION" ]]; then
    return
  fi
  local tmp
  tmp=$(mktemp -d /tmp/mdbook-build.XXXXXX)
  printf 'installing mdbook %s (have: %s)\n' "$MDBOOK_VERSION" "$(mdbook --version 2>/dev/null || echo none)"
  if ! CARGO_TARGET_DIR="$tmp" cargo install mdbook --version "$MDBOOK_VERSION" --locked \
    --no-default-features --force --quiet </dev/null; then
    rm -rf "$tmp"
    die "cargo install mdbook --version $MDBOOK_VERSION failed"
  fi
  rm -rf "$tmp"
  [[ $(mdbook --version 2>/dev/null) == "mdbook v$MDBOOK_VERSION" ]] ||
    die "mdbook $MDBOOK_VERSION is installed in $cargo_bin but \`mdbook\` on PATH is $(command -v mdbook)"
}
