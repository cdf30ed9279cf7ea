# flood.py: a native plugin that floods plugd on request (stderr lines and dropped broker.publish), for the resilience tests (Python 3.11 stdlib only).
"""
Usage: python3 flood.py   (from a plugin directory whose nexo-plugin.toml declares
the tools <id>_go, <id>_status, <id>_echo)

  initialize   -> {manifest, server_version, tools}
  <id>_go {stderr: N, publish: M, topic: T}
               -> starts two threads at once and answers {"started": true}: one
                  writes N lines to stderr, the other sends M broker.publish
                  notifications on topic T (default "agent.x"); the manifest
                  grants no broker capability, so plugd drops every one
  <id>_status  -> {"stderr_written": n, "published": m, "done": bool}
  <id>_echo    -> {"echo": args}
  shutdown     -> {ok: true}, then exit 0
"""

import json
import os
import sys
import threading
import tomllib

_out = sys.stdout.buffer
_out_lock = threading.Lock()
CHUNK = 1000


def send(obj):
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    with _out_lock:
        _out.write(data)
        _out.flush()


class Flood:
    def __init__(self):
        with open("nexo-plugin.toml", "rb") as f:
            self.manifest = tomllib.load(f)
        self.id = self.manifest["plugin"]["id"]
        self.tools = self.manifest["plugin"]["extends"]["tools"]
        self.stderr_written = 0
        self.published = 0
        self.threads = []

    def flood_stderr(self, n):
        err = sys.stderr.buffer
        i = 0
        while i < n:
            k = min(CHUNK, n - i)
            err.write("".join(f"[WARN] flood line {i + j}\n" for j in range(k)).encode())
            err.flush()
            i += k
            self.stderr_written = i

    def flood_publish(self, m, topic):
        line = json.dumps(
            {"jsonrpc": "2.0", "method": "broker.publish", "params": {"topic": topic, "event": {"n": 0}}},
            separators=(",", ":"),
        ) + "\n"
        chunk = (line * CHUNK).encode()
        i = 0
        while i < m:
            k = min(CHUNK, m - i)
            with _out_lock:
                _out.write(chunk if k == CHUNK else (line * k).encode())
                _out.flush()
            i += k
            self.published = i

    def invoke(self, req_id, params):
        tool = params.get("tool_name", "")
        args = params.get("args") if isinstance(params.get("args"), dict) else {}
        kind = tool[len(self.id) + 1:] if tool.startswith(self.id + "_") else ""
        if kind == "go":
            n, m = int(args.get("stderr", 0)), int(args.get("publish", 0))
            topic = args.get("topic", "agent.x")
            self.threads = [
                threading.Thread(target=self.flood_stderr, args=(n,), daemon=True),
                threading.Thread(target=self.flood_publish, args=(m, topic), daemon=True),
            ]
            for t in self.threads:
                t.start()
            send({"jsonrpc": "2.0", "id": req_id, "result": {"started": True}})
        elif kind == "status":
            done = all(not t.is_alive() for t in self.threads)
            send({"jsonrpc": "2.0", "id": req_id, "result": {
                "stderr_written": self.stderr_written, "published": self.published, "done": done}})
        elif kind == "echo":
            send({"jsonrpc": "2.0", "id": req_id, "result": {"echo": args}})
        else:
            send({"jsonrpc": "2.0", "id": req_id, "error": {"code": -33401, "message": f"tool not found: {tool}"}})

    def run(self):
        for raw in sys.stdin.buffer:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(msg, dict) or "id" not in msg:
                continue
            req_id, method = msg["id"], msg.get("method")
            params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
            if method == "initialize":
                tools = [{"name": t, "description": f"flood tool {t}", "input_schema": {"type": "object"}}
                         for t in self.tools]
                send({"jsonrpc": "2.0", "id": req_id, "result": {
                    "manifest": self.manifest, "server_version": f"{self.id}-0.1.0", "tools": tools}})
            elif method == "tool.invoke":
                self.invoke(req_id, params)
            elif method == "shutdown":
                send({"jsonrpc": "2.0", "id": req_id, "result": {"ok": True}})
                os._exit(0)
            else:
                send({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32601, "message": f"method not found: {method}"}})


if __name__ == "__main__":
    Flood().run()
