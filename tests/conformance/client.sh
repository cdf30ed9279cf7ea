#!/usr/bin/env bash
# tests/conformance/client.sh: the client program the official MCP conformance
# client suite runs (`conformance client --command "tests/conformance/client.sh"`),
# one run per scenario, as `client.sh SERVER_URL` with MCP_CONFORMANCE_SCENARIO
# (and, for some scenarios, MCP_CONFORMANCE_CONTEXT) set by the runner.
#
# Everything goes through plugd, the way an operator would use it: a
# temporary workspace whose .mcp.json declares the scenario's server as a
# remote MCP server ("type": "http"); for auth/* scenarios `plugd mcp login`,
# with curl as the browser (it opens the authorization URL and follows the
# redirect back to plugd's loopback listener); then `plugd plugin approve`,
# `plugd tool list` and the `plugd tool call` the scenario expects. Nothing
# here answers for plugd: the runner's server judges what plugd sent.
#
# CONFORMANCE_ERA=2026-07-28 (scripts/conformance sets it for the 0.2.0
# suite): plugd.yaml tells plugd to try the stateless revision first with
# the scenario's server (`stateless: true`, what the official SDKs'
# clients do), and a scenario this script has no call for gets every tool
# it lists called: the context's `toolCalls` with their arguments, the
# others with `{}`.
#
# Needs PLUGD (the plugd binary; scripts/conformance sets it). Every step is
# bounded by $CLIENT_STEP_TIMEOUT seconds (default 30); no stdin is read.
# Exits non-zero when a step fails (some scenarios expect that: the runner
# judges by its checks, not by this exit status).
set -euo pipefail

url=${1:?usage: client.sh SERVER_URL (run by the conformance runner)}
scenario=${MCP_CONFORMANCE_SCENARIO:?MCP_CONFORMANCE_SCENARIO is not set (run by the conformance runner)}
plugd=${PLUGD:?PLUGD (the plugd binary) is not set}
step=${CLIENT_STEP_TIMEOUT:-30}

tmp="$(mktemp -d)"
login_pid=
cleanup() {
  if [[ -n $login_pid ]]; then
    kill -TERM "$login_pid" 2>/dev/null || true
    wait "$login_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '[client.sh %s] %s\n' "$scenario" "$*" >&2; }
fail() {
  log "error: $*"
  exit 1
}
# run WHAT CMD...: a plugd step, bounded, its output on stderr for the runner's log.
run() {
  local what=$1 status=0
  shift
  log "$what: $*"
  timeout --kill-after=5 "$step" "$@" </dev/null >"$tmp/out" 2>"$tmp/err" || status=$?
  cat "$tmp/out" "$tmp/err" >&2
  [[ $status -eq 0 ]] || fail "$what failed (exit status $status)"
}

ws="$tmp/workspace"
mkdir -p "$ws"
export PLUGD_MASTER_KEY
PLUGD_MASTER_KEY=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export NO_COLOR=1

# The .mcp.json entry: the server URL; for auth/* the client metadata
# document URL plugd is known by where the authorization server accepts one
# (the suite's fixed CIMD URL), and the pre-registered client of the
# context when the scenario gives one (its secret in plugd's secret store).
context=${MCP_CONFORMANCE_CONTEXT:-}
client_id=
if [[ -n $context ]]; then
  client_id=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1]).get("client_id", ""))' "$context")
  client_secret=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1]).get("client_secret", ""))' "$context")
fi
if [[ -n $client_id && -n ${client_secret:-} ]]; then
  printf '%s' "$client_secret" | timeout "$step" "$plugd" --workspace "$ws" secrets set CONFORMANCE_CLIENT_SECRET >/dev/null ||
    fail "plugd secrets set failed"
fi
python3 - "$ws/.mcp.json" "$url" "$scenario" "$client_id" <<'EOF'
import json, sys
path, url, scenario, client_id = sys.argv[1:5]
entry = {"type": "http", "url": url}
if scenario.startswith("auth/"):
    oauth = {"clientMetadataUrl": "https://conformance-test.local/client-metadata.json"}
    if client_id:
        oauth["clientId"] = client_id
        oauth["clientSecret"] = "${CONFORMANCE_CLIENT_SECRET}"
    entry["oauth"] = oauth
with open(path, "w") as f:
    json.dump({"mcpServers": {"srv": entry}}, f, indent=2)
EOF

if [[ ${CONFORMANCE_ERA:-} == 2026-07-28 ]]; then
  printf 'mcp:\n  servers:\n    srv:\n      stateless: true\n' >"$ws/plugd.yaml"
fi

# login: `plugd mcp login srv`, its authorization URL opened by curl (which
# follows nothing itself: the authorization server's redirect goes to
# plugd's loopback listener, fetched as a browser would).
login() {
  local authorize="" location status=0 i
  log "login: plugd mcp login srv"
  : >"$tmp/login.out"
  : >"$tmp/login.err"
  timeout --kill-after=5 "$step" "$plugd" --workspace "$ws" mcp login srv --timeout "$step" \
    </dev/null >"$tmp/login.out" 2>"$tmp/login.err" &
  login_pid=$!
  for ((i = 0; i < step * 10; i++)); do
    authorize=$(sed -n 's/^authorize: //p' "$tmp/login.err" | head -n1 || true)
    [[ -n $authorize ]] && break
    kill -0 "$login_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $authorize ]]; then
    wait "$login_pid" || status=$?
    login_pid=
    cat "$tmp/login.out" "$tmp/login.err" >&2
    fail "plugd mcp login printed no authorization URL (exit status $status)"
  fi
  log "browser: GET $authorize"
  location=$(curl -sS --max-time "$step" -o /dev/null -w '%{redirect_url}' "$authorize") ||
    fail "the authorization endpoint did not answer"
  [[ -n $location ]] || fail "the authorization endpoint did not redirect"
  log "browser: GET $location"
  curl -sS --max-time "$step" -o /dev/null "$location" || fail "plugd's redirect listener did not answer"
  wait "$login_pid" || status=$?
  login_pid=
  cat "$tmp/login.out" "$tmp/login.err" >&2
  [[ $status -eq 0 ]] || fail "plugd mcp login failed (exit status $status)"
}

case $scenario in
  auth/*) login ;;
esac
run "approve" "$plugd" --workspace "$ws" plugin approve srv
run "list" "$plugd" --workspace "$ws" tool list

case $scenario in
  tools_call) run "call" "$plugd" --workspace "$ws" tool call srv/add_numbers --args '{"a": 5, "b": 3}' ;;
  elicitation-sep1034-client-defaults) run "call" "$plugd" --workspace "$ws" tool call srv/test_client_elicitation_defaults --args '{}' ;;
  sse-retry) run "call" "$plugd" --workspace "$ws" tool call srv/test_reconnection --args '{}' ;;
  auth/*) run "call" "$plugd" --workspace "$ws" tool call srv/test-tool --args '{}' ;;
  *)
    if [[ ${CONFORMANCE_ERA:-} == 2026-07-28 ]]; then
      # Every listed tool, the context's arguments where it gives some; a
      # failing call does not stop the others (the runner judges).
      python3 - "$tmp/out" "$context" >"$tmp/calls" <<'EOF'
import json, re, sys
listed = re.findall(r"\bsrv/([A-Za-z0-9_.-]+)", open(sys.argv[1]).read())
context = json.loads(sys.argv[2]) if sys.argv[2] else {}
given = {c["name"]: c.get("arguments", {}) for c in context.get("toolCalls", [])}
for name in dict.fromkeys(list(given) + listed):
    print(name + "\t" + json.dumps(given.get(name, {})))
EOF
      while IFS=$'\t' read -r name args; do
        (run "call $name" "$plugd" --workspace "$ws" tool call "srv/$name" --args "$args") || true
      done <"$tmp/calls"
    fi
    ;;
esac
log "done"
