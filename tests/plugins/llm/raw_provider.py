# raw_provider.py: a native plugin serving the LLM providers of its
# [plugin.extends].llm_providers through llm.chat (nexo §5.y) that answers
# with what it received on the wire, for plugd's tests (Python 3.11 stdlib).
#
# The reply text is a JSON object: "temperature" is the temperature exactly as
# its digits appeared in the raw request line (so an f32 round trip that
# turned 0.7 into 0.699999988079071 shows), "keys" the sorted keys of
# params.request, "provider" / "model" the routing fields, "user" the last
# user message, "options" the values of stop_sequences, tool_choice,
# system_blocks and cache_tools. stdout is the protocol; diagnostics go to stderr.

import json
import re
import sys
import tomllib

with open("nexo-plugin.toml", "rb") as f:
    MANIFEST = tomllib.load(f)
PLUGIN_ID = MANIFEST["plugin"]["id"]
PROVIDERS = MANIFEST["plugin"].get("extends", {}).get("llm_providers", [])
RAW_TEMPERATURE = re.compile(r'"temperature"\s*:\s*([-0-9.eE+]+|null)')


def send(msg):
    msg["jsonrpc"] = "2.0"
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def chat(rid, params, raw):
    provider = params.get("provider")
    if provider not in PROVIDERS:
        return send({"id": rid, "error": {"code": -32602, "message": f"unknown provider {provider!r}"}})
    request = params.get("request") or {}
    user = ""
    for m in reversed(request.get("messages") or []):
        if m.get("role") == "user":
            user = m.get("content") or ""
            break
    found = RAW_TEMPERATURE.search(raw)
    text = json.dumps({
        "temperature": found.group(1) if found else None,
        "keys": sorted(request.keys()),
        "provider": provider,
        "model": params.get("model"),
        "user": user,
        # The optional fields of §5.y as they arrived.
        "options": {k: request.get(k) for k in ("stop_sequences", "tool_choice", "system_blocks", "cache_tools")},
    })
    send({"id": rid, "result": {
        "content": {"type": "text", "text": text},
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        "finish_reason": {"kind": "stop"},
    }})


def main():
    for line in sys.stdin:
        raw = line.strip()
        if not raw:
            continue
        try:
            msg = json.loads(raw)
        except ValueError:
            sys.stderr.write(f"[WARN] not JSON: {raw[:80]}\n")
            continue
        method, rid = msg.get("method"), msg.get("id")
        if rid is None:
            continue
        if method == "initialize":
            send({"id": rid, "result": {"manifest": {"plugin": {"id": PLUGIN_ID}},
                                        "server_version": "raw-provider-0.1"}})
        elif method == "llm.chat":
            chat(rid, msg.get("params") or {}, raw)
        elif method == "shutdown":
            send({"id": rid, "result": {"ok": True}})
            sys.exit(0)
        else:
            send({"id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}})


if __name__ == "__main__":
    main()
