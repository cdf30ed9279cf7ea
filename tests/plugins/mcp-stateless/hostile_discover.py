"""A raw line-JSON-RPC MCP server (no SDK) that lies in answer to
`server/discover`, for plugd's tests of the stateless revision. Past the
probe it is a plain 2025-11-25 server whose tool `seen` returns the methods
it received, so a test checks what plugd fell back to.

Modes (argv[1]):
  garbage       discover answers a result that is a string
  huge          discover answers a result larger than plugd's frame limit
  many          discover answers 100000 revisions, none plugd speaks
  stateful      discover lists only 2025-11-25 (a legacy advertisement)
  modern-only   discover answers -32022 naming only 2099-01-01
  silent        discover is never answered
  input         a 2026-07-28 server whose tool answers resultType
                "input_required"
  stateless-only  initialize answers -32022 naming only 2026-07-28;
                discover answers it (a server without the handshake)
"""

import json
import sys

MODE = sys.argv[1]
SEEN = []


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def answer(rid, result):
    send({"jsonrpc": "2.0", "id": rid, "result": result})


TOOLS = [{"name": "seen", "description": "methods received", "inputSchema": {"type": "object"}}]

for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    method = msg.get("method")
    rid = msg.get("id")
    if method:
        SEEN.append(method)
    if rid is None:
        continue
    if method == "server/discover":
        if MODE == "garbage":
            answer(rid, "I am a teapot")
        elif MODE == "huge":
            answer(rid, {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "pad": "x" * (20 << 20)})
        elif MODE == "many":
            answer(rid, {"supportedVersions": ["1999-%05d" % i for i in range(100000)], "capabilities": {}})
        elif MODE == "stateful":
            answer(rid, {"supportedVersions": ["2025-11-25"], "capabilities": {"tools": {}}})
        elif MODE == "modern-only":
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32022, "message": "Unsupported protocol version",
                  "data": {"supported": ["2099-01-01"], "requested": "2026-07-28"}}})
        elif MODE in ("input", "stateless-only"):
            answer(rid, {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "resultType": "complete"})
        # silent: no answer
    elif method == "initialize" and MODE == "stateless-only":
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32022, "message": "Unsupported protocol version",
              "data": {"supported": ["2026-07-28"], "requested": msg["params"]["protocolVersion"]}}})
    elif method == "initialize":
        answer(rid, {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                     "serverInfo": {"name": "hostile-discover", "version": "1"}})
    elif method == "tools/list":
        answer(rid, {"tools": TOOLS})
    elif method == "tools/call":
        if MODE == "input":
            answer(rid, {"resultType": "input_required",
                         "inputRequests": {"k": {"method": "elicitation/create", "params": {"message": "sure?"}}}})
        else:
            answer(rid, {"content": [{"type": "text", "text": json.dumps(SEEN)}], "structuredContent": {"methods": SEEN}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})
