#!/usr/bin/env bash
# hello-salmex-bash: a Salmex I/O plugin in bash with standard unix tools only
# (head -c for the body, bash regex for the fields; no jq). It relies on flat
# "arguments" and on JSON strings without escaped quotes; a demonstration of
# the protocol, not a template for production.
export LC_ALL=C # ${#s} counts bytes, as Content-Length does

greeting="Hello"

send() {
  printf 'Content-Length: %d\r\n\r\n%s' "${#1}" "$1"
}

while true; do
  len=""
  # Headers up to the blank line.
  while IFS= read -r line; do
    line="${line%$'\r'}"
    if [[ -z "$line" ]]; then
      [[ -n "$len" ]] && break
      continue
    fi
    if [[ "$line" =~ ^[Cc]ontent-[Ll]ength:[[:space:]]*([0-9]+) ]]; then
      len="${BASH_REMATCH[1]}"
    fi
  done
  [[ -z "$len" ]] && exit 0 # end of input
  body="$(head -c "$len")"

  id=""
  [[ "$body" =~ \"id\":([0-9]+) ]] && id="${BASH_REMATCH[1]}"
  method=""
  [[ "$body" =~ \"method\":\"([^\"]*)\" ]] && method="${BASH_REMATCH[1]}"

  case "$method" in
    initialize)
      [[ "$body" =~ \"greeting\":\"([^\"]*)\" ]] && greeting="${BASH_REMATCH[1]}"
      send "{\"jsonrpc\":\"2.0\",\"id\":$id,\"result\":{\"protocolVersion\":\"1.0\",\"capabilities\":{\"tools\":[{\"name\":\"say_hello\",\"description\":\"Greet someone\"}]}}}"
      ;;
    config/changed)
      [[ "$body" =~ \"greeting\":\"([^\"]*)\" ]] && greeting="${BASH_REMATCH[1]}"
      ;;
    tools/call)
      args="{}"
      [[ "$body" =~ \"arguments\":(\{[^\}]*\}) ]] && args="${BASH_REMATCH[1]}"
      rest="${body/"$args"/}"
      tool=""
      [[ "$rest" =~ \"name\":\"([^\"]*)\" ]] && tool="${BASH_REMATCH[1]}"
      name="world"
      [[ "$args" =~ \"name\":\"([^\"]*)\" ]] && name="${BASH_REMATCH[1]}"
      if [[ "$tool" == "say_hello" ]]; then
        send "{\"jsonrpc\":\"2.0\",\"id\":$id,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"$greeting, $name!\"}]}}"
      else
        send "{\"jsonrpc\":\"2.0\",\"id\":$id,\"error\":{\"code\":-32601,\"message\":\"unknown tool: $tool\"}}"
      fi
      ;;
    shutdown)
      exit 0
      ;;
    *)
      if [[ -n "$id" ]]; then
        send "{\"jsonrpc\":\"2.0\",\"id\":$id,\"error\":{\"code\":-32601,\"message\":\"method not found: $method\"}}"
      fi
      ;;
  esac
done
