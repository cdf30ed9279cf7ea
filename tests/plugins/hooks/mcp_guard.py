# mcp_guard.py: a small MCP server (stdio) whose tools are bound as hooks in plugd's hook tests (Python 3.11 stdlib only).
"""

Usage: python3 mcp_guard.py [LOG]

Tools, each called with {point, payload, context} and answering a Dexto
PluginResult as the JSON text of its first text content:

  guard   payload.text (or .content/.body) containing "forbidden" ->
          {"ok": true, "cancel": true, "message": "forbidden word", "notices": [block FORBIDDEN]};
          otherwise {"ok": true, "modify": {FIELD: text + " [mcp]"}, "notices": [info MCP_SEEN]}
          where FIELD is the text field present
  structured  the same verdict as structuredContent (content text "done")
  broken  isError: true with text "guard broke"
  chatty  text content "Echo: not json"

With LOG, every tools/call's arguments are appended to LOG as JSON lines.
"""

import json
import sys

LOG = sys.argv[1] if len(sys.argv) > 1 else None
SCHEMA = {"type": "object", "properties": {"point": {"type": "string"}, "payload": {"type": "object"},
                                           "context": {"type": "object"}}, "required": ["point", "payload"]}
TOOLS = [{"name": n, "description": d, "inputSchema": SCHEMA} for n, d in [
    ("guard", "hook verdict as text"), ("structured", "hook verdict as structuredContent"),
    ("broken", "isError"), ("chatty", "not JSON")]]


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def verdict(payload):
    for field in ("text", "content", "body"):
        if isinstance(payload.get(field), str):
            text = payload[field]
            if "forbidden" in text:
                return {"ok": True, "cancel": True, "message": "forbidden word",
                        "notices": [{"kind": "block", "code": "FORBIDDEN", "message": "forbidden word"}]}
            return {"ok": True, "modify": {field: text + " [mcp]"},
                    "notices": [{"kind": "info", "code": "MCP_SEEN", "message": "seen by mcp_guard"}]}
    return {"ok": True}


def call(name, args):
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"tool": name, "arguments": args}) + "\n")
    if name == "guard":
        return {"content": [{"type": "text", "text": json.dumps(verdict(args.get("payload") or {}))}]}
    if name == "structured":
        return {"content": [{"type": "text", "text": "done"}], "structuredContent": verdict(args.get("payload") or {})}
    if name == "broken":
        return {"isError": True, "content": [{"type": "text", "text": "guard broke"}]}
    return {"content": [{"type": "text", "text": "Echo: not json"}]}


for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if "id" not in msg or "method" not in msg:
        continue
    rid, method, params = msg["id"], msg["method"], msg.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "mcp-guard", "version": "1.0.0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": rid, "result": call(params.get("name"), params.get("arguments") or {})})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found: " + method}})
