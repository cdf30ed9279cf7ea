# socket_probe.py: a native plugin for plugd's socket peer-check tests (Python 3 stdlib only).
"""

Usage: python3 socket_probe.py ID

Serves one tool, ID_probe, that asks plugd serve's Unix socket for
`GET /v1/plugins` and reports what came back:

  {"socket": P, "via": "self"}        -> from the plugin process itself
  {"socket": P, "via": "grandchild"}  -> from a grandchild that left the
                                         plugin's session (fork, setsid,
                                         fork; the middle process exits
                                         after 1 s, so the grandchild is an
                                         orphan when it connects at 2 s)

Result: {"pid": PID that connected, "ppid": its parent then, "status": N,
"body": "..."}, or {"pid", "error": "..."} when no HTTP answer came.
stdout is the protocol; nothing else is printed there.
"""

import json
import os
import socket
import sys
import time


def reply(req_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req_id, "result": result}) + "\n")
    sys.stdout.flush()


def ask(path):
    out = {"pid": os.getpid(), "ppid": os.getppid()}
    data = b""
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(path)
        try:
            s.sendall(b"GET /v1/plugins HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        except OSError:
            pass  # refused before reading: the answer is still there to read
        while True:
            c = s.recv(65536)
            if not c:
                break
            data += c
    except OSError as e:
        if not data:
            out["error"] = f"{type(e).__name__}: {e}"
            return out
    head, _, body = data.partition(b"\r\n\r\n")
    parts = head.split()
    out["status"] = int(parts[1]) if len(parts) > 1 else 0
    out["body"] = body.decode(errors="replace")
    return out


def from_grandchild(path):
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(r)
        os.setsid()
        if os.fork() == 0:
            time.sleep(2.0)
            os.write(w, json.dumps(ask(path)).encode())
            os._exit(0)
        time.sleep(1.0)
        os._exit(0)
    os.close(w)
    os.waitpid(middle, 0)
    chunks = []
    while True:
        c = os.read(r, 65536)
        if not c:
            break
        chunks.append(c)
    os.close(r)
    return json.loads(b"".join(chunks) or b'{"error": "the grandchild wrote nothing"}')


def probe(args):
    path = args.get("socket", "")
    if args.get("via") == "grandchild":
        return from_grandchild(path)
    return ask(path)


def main():
    pid = sys.argv[1]
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "id" not in msg:
            continue
        method, req_id = msg.get("method"), msg["id"]
        params = msg.get("params") or {}
        if method == "initialize":
            tools = [{"name": f"{pid}_probe", "description": "ask plugd's socket", "input_schema": {"type": "object"}}]
            manifest = {"plugin": {"id": pid, "version": "0.1.0"}}
            reply(req_id, {"manifest": manifest, "server_version": f"{pid}-0.1.0", "tools": tools})
        elif method == "tool.invoke":
            reply(req_id, probe(params.get("args") or {}))
        elif method == "shutdown":
            reply(req_id, {"ok": True})
            return
        else:
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32601, "message": "method not found"}}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
