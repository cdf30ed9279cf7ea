# hook_plugin.py: a native (nexo contract) plugin serving hook.on_hook for plugd's hook tests (Python 3.11 stdlib only).
"""

Usage: python3 hook_plugin.py  (run from the plugin directory)

Reads ./nexo-plugin.toml for its id and ./hooks.json for what each hook
does. hooks.json maps a hook name to one rule; the optional key "log" is an
absolute file that gets one JSON line per hook.on_hook params received.
Rules (first key wins):

  {"block_tools": [NAME, ...], "reason": R}
        event.toolName in the list -> {"abort": true, "decision": "block", "reason": R}
        otherwise                   -> {}
  {"block_contains": S, "field": F, "reason": R}
        S in event[F]               -> {"abort": true, "decision": "block", "reason": R}
        otherwise                   -> {}
  {"transform_suffix": S, "field": F}
        -> {"decision": "transform", "transformed_body": event[F] + S}
  {"append": S, "field": F}
        -> {"override": {F: event[F] + S}}
  {"sleep_ms": MS}        sleeps MS (in a thread), then {}
  {"crash": true}         exits with code 3 without answering
  {"reply": VALUE}        answers with VALUE as it is (junk tests)
  {"error": {code, message}}  answers with that JSON-RPC error
  {"no_reply_again": true}    -> {"do_not_reply_again": true}
  {"quiet_contains": S, "field": F}
        S in event[F]               -> {"do_not_reply_again": true}
        otherwise                   -> {}

A hook name not in hooks.json gets -32601. initialize answers with the
manifest and an empty tool catalog; shutdown answers and exits.
"""

import json
import os
import sys
import threading
import time
import tomllib

out_lock = threading.Lock()


def send(obj):
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    with out_lock:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def reply(rid, result):
    send({"jsonrpc": "2.0", "id": rid, "result": result})


def reply_error(rid, code, message):
    send({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})


with open("nexo-plugin.toml", "rb") as f:
    MANIFEST = tomllib.load(f)
with open("hooks.json") as f:
    RULES = json.load(f)
LOG = RULES.pop("log", None)


def on_hook(rid, params):
    name = params.get("hook_name")
    event = params.get("event") or {}
    if LOG:
        with out_lock, open(LOG, "a") as f:
            f.write(json.dumps(params) + "\n")
    rule = RULES.get(name)
    if rule is None:
        reply_error(rid, -32601, f"unknown hook: {name}")
    elif "block_tools" in rule:
        if event.get("toolName") in rule["block_tools"]:
            reply(rid, {"abort": True, "decision": "block", "reason": rule.get("reason", "no")})
        else:
            reply(rid, {})
    elif "block_contains" in rule:
        if rule["block_contains"] in str(event.get(rule["field"], "")):
            reply(rid, {"abort": True, "decision": "block", "reason": rule.get("reason", "no")})
        else:
            reply(rid, {})
    elif "transform_suffix" in rule:
        body = str(event.get(rule["field"], "")) + rule["transform_suffix"]
        reply(rid, {"abort": False, "decision": "transform", "transformed_body": body})
    elif "append" in rule:
        reply(rid, {"override": {rule["field"]: str(event.get(rule["field"], "")) + rule["append"]}})
    elif "sleep_ms" in rule:
        time.sleep(rule["sleep_ms"] / 1000)
        reply(rid, {})
    elif "crash" in rule:
        sys.stderr.write("[ERROR] crashing on purpose\n")
        sys.stderr.flush()
        os._exit(3)
    elif "reply" in rule:
        reply(rid, rule["reply"])
    elif "error" in rule:
        reply_error(rid, rule["error"]["code"], rule["error"]["message"])
    elif "quiet_contains" in rule:
        if rule["quiet_contains"] in str(event.get(rule["field"], "")):
            reply(rid, {"do_not_reply_again": True})
        else:
            reply(rid, {})
    elif "no_reply_again" in rule:
        reply(rid, {"do_not_reply_again": True})
    else:
        reply_error(rid, -32603, f"bad rule for {name}: {rule}")


def main():
    for raw in sys.stdin.buffer:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(msg, dict) or "id" not in msg:
            continue
        rid, method = msg["id"], msg.get("method")
        params = msg.get("params") or {}
        if method == "initialize":
            reply(rid, {"manifest": MANIFEST, "server_version": "hook-plugin-1", "tools": []})
        elif method == "hook.on_hook":
            threading.Thread(target=on_hook, args=(rid, params), daemon=True).start()
        elif method == "shutdown":
            reply(rid, {"ok": True})
            sys.exit(0)
        else:
            reply_error(rid, -32601, f"method not found: {method}")


if __name__ == "__main__":
    main()
