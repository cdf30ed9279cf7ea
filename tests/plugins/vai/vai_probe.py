#!/usr/bin/env python3
"""A vai.rpc.v1 package for plugd's sandbox tests (Python stdlib only).

Usage: vai_probe.py PACKAGE_ID VERSION

Every tool export does the same thing: input {"op": "connect", "port": N}
tries a TCP connect to 127.0.0.1:N, {"op": "write", "path": P} writes a file
(P may be "SCRATCH/name": inside the invocation's scratch dir),
{"op": "fetch", "url": U} GETs U with urllib (which follows HTTP_PROXY /
HTTPS_PROXY) and returns its status and body, {"op": "raw", "data": D} sends
D as-is to the proxy named by HTTP_PROXY and returns what comes back, and
{"op": "unix", "path": P} connects to a Unix socket. The result's
structured_output is {"ok": true, ...} or {"ok": false, "error": "Class: text"}.
"""

import json
import os
import socket
import sys
import urllib.error
import urllib.request

PACKAGE, VERSION = sys.argv[1], sys.argv[2]
PROTO = "vai.rpc.v1"
out, inp = sys.stdout.buffer, sys.stdin.buffer


def send(obj):
    obj = dict(obj, protocol=PROTO)
    body = json.dumps(obj).encode()
    out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    out.flush()


def read_frame():
    length = None
    while True:
        line = inp.readline()
        if not line:
            return None
        line = line.rstrip(b"\r\n")
        if not line:
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return json.loads(inp.read(length or 0))


def attempt(inp_, ctx):
    try:
        if inp_.get("op") == "connect":
            socket.create_connection(("127.0.0.1", int(inp_["port"])), timeout=3).close()
            return {"ok": True}
        if inp_.get("op") == "write":
            path = inp_["path"].replace("SCRATCH", ctx.get("scratch_dir") or "")
            with open(path, "w") as f:
                f.write("x")
            return {"ok": True}
        if inp_.get("op") == "fetch":
            try:
                with urllib.request.urlopen(inp_["url"], timeout=10) as r:
                    return {"ok": True, "status": r.status, "body": r.read().decode()}
            except urllib.error.HTTPError as e:
                return {"ok": False, "status": e.code, "body": e.read().decode(), "error": f"HTTPError: {e}"}
        if inp_.get("op") == "raw":
            proxy = os.environ["HTTP_PROXY"].removeprefix("http://")
            host, _, port = proxy.rpartition(":")
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(inp_["data"].encode())
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
            return {"ok": True, "reply": got.decode(errors="replace")}
        if inp_.get("op") == "unix":
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(inp_["path"])
            return {"ok": True}
        if inp_.get("op") == "read":
            with open(inp_["path"]) as f:
                f.read(1)
            return {"ok": True}
        return {"ok": False, "error": "unknown op"}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def main():
    send({"type": "hello", "role": "plugin", "plugin": {"package_id": PACKAGE, "version": VERSION}})
    while True:
        msg = read_frame()
        if msg is None or msg.get("type") == "shutdown":
            return
        if msg.get("type") != "request":
            continue
        body = msg.get("body") or {}
        result = attempt(body.get("input") or {}, body.get("context") or {})
        send({"type": "response", "id": msg.get("id"), "ok": True, "body": {"status": "succeeded", "result": {
            "content": [{"type": "text", "text": json.dumps(result)}],
            "structured_output": result,
            "is_error": False,
            "retryable": False,
        }}})


if __name__ == "__main__":
    main()
