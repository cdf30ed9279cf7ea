#!/usr/bin/env bash
# hello-bash: a nexo/plugd native plugin in pure bash — fields are pulled out with bash regex, no jq.
#
# Limits of the regex approach (fine for a demo, not for production): the
# first `"id"` key in the line is taken as the request id, so the host must
# put `id` before `params` (plugd does), and `name` is the first `"name"` key.
set -uo pipefail

# JSON copy of nexo-plugin.toml, echoed in the initialize reply.
MANIFEST='{"plugin":{"id":"hello_bash","version":"0.1.0","name":"Hello (bash)","description":"Greets; a pure-bash plugin","entrypoint":{"command":"bash","args":["plugin.sh"]},"extends":{"tools":["hello_bash_greet"]}}}'
TOOLS='[{"name":"hello_bash_greet","description":"Greet someone by name","input_schema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}]'

re_id='"id"[[:space:]]*:[[:space:]]*(-?[0-9]+|"([^"\\]|\\.)*")'
re_method='"method"[[:space:]]*:[[:space:]]*"([^"\\]*)"'
re_tool='"tool_name"[[:space:]]*:[[:space:]]*"([^"\\]*)"'
# Captures the raw (still JSON-escaped) string, so it can go straight back into JSON.
re_name='"name"[[:space:]]*:[[:space:]]*"(([^"\\]|\\.)*)"'

log() { printf '[%s] %s\n' "$1" "$2" >&2; }
reply() { printf '{"jsonrpc":"2.0","id":%s,"result":%s}\n' "$1" "$2"; }
reply_error() { printf '{"jsonrpc":"2.0","id":%s,"error":{"code":%s,"message":"%s"}}\n' "$1" "$2" "$3"; }

log INFO "hello_bash-0.1.0 starting, pid $$"
while IFS= read -r line || [[ -n $line ]]; do
  [[ -z ${line//[[:space:]]/} ]] && continue
  if ! [[ $line =~ $re_method ]]; then
    log WARN "ignored a line that is not a request: ${line:0:80}"
    continue
  fi
  method=${BASH_REMATCH[1]}
  # No id: a notification, never answered.
  [[ $line =~ $re_id ]] || continue
  id=${BASH_REMATCH[1]}
  case $method in
    initialize)
      log INFO "initialize"
      reply "$id" "{\"manifest\":$MANIFEST,\"server_version\":\"hello_bash-0.1.0\",\"tools\":$TOOLS}"
      ;;
    tool.invoke)
      tool=""
      [[ $line =~ $re_tool ]] && tool=${BASH_REMATCH[1]}
      if [[ $tool != hello_bash_greet ]]; then
        reply_error "$id" -33401 "tool not found: $tool"
      elif [[ $line =~ $re_name ]]; then
        reply "$id" "{\"content\":[{\"type\":\"text\",\"text\":\"Hello, ${BASH_REMATCH[1]}!\"}],\"is_error\":false}"
      else
        reply_error "$id" -33402 'invalid argument: missing string `name`'
      fi
      ;;
    shutdown)
      log INFO "shutdown requested"
      reply "$id" '{"ok":true}'
      exit 0
      ;;
    *)
      reply_error "$id" -32601 "method not found: $method"
      ;;
  esac
done
log INFO "stdin closed"
