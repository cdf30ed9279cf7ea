# sandboxed-python: a native plugin (Python 3 standard library only) that shows what its sandbox lets it see.
"""One tool, sandboxed_python_peek {path}: tries to read the file and says
what happened, e.g. {"path": "/etc/shadow", "readable": false, "error":
"[Errno 2] No such file or directory: '/etc/shadow'"}. stdout is the
protocol (newline-delimited JSON-RPC 2.0); diagnostics go to stderr."""

import json
import os
import sys

TOOL = {
    "name": "sandboxed_python_peek",
    "description": "Try to read a file from inside the sandbox",
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "absolute path to read"}},
        "required": ["path"],
        "additionalProperties": False,
    },
}


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def peek(path):
    try:
        with open(path, "rb") as f:
            return {"path": path, "readable": True, "bytes": len(f.read())}
    except OSError as e:
        return {"path": path, "readable": False, "error": str(e)}


def main():
    sys.stderr.write(f"[INFO] sandboxed_python up as uid {os.getuid()}\n")
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict) or "id" not in msg:
            continue
        rid, method, params = msg["id"], msg.get("method"), msg.get("params") or {}
        if method == "initialize":
            manifest = {"plugin": {"id": "sandboxed_python", "version": "0.1.0"}}
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "manifest": manifest, "server_version": "sandboxed_python-0.1.0", "tools": [TOOL]}})
        elif method == "tool.invoke" and params.get("tool_name") == TOOL["name"]:
            send({"jsonrpc": "2.0", "id": rid, "result": peek(str((params.get("args") or {}).get("path", "")))})
        elif method == "tool.invoke":
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -33401, "message": "tool not found"}})
        elif method == "shutdown":
            send({"jsonrpc": "2.0", "id": rid, "result": {"ok": True}})
            return
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}})


if __name__ == "__main__":
    main()
