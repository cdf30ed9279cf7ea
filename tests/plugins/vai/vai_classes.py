#!/usr/bin/env python3
"""A vai.rpc.v1 package for plugd's execution-class tests (Python stdlib only).

Usage: vai_classes.py PACKAGE_ID VERSION

Every request (tool, hook, compactor, harness) runs the same probe and
reports it: its process (a random token drawn at start: in a sandbox the pid is the
namespace's), its scratch directory, whether a TCP
connect to 127.0.0.1:PORT works (input "port"), whether it can write a file
in its scratch directory and at "target" (a path), and what the parent of
its scratch directory lists. Tool inputs may also say "hold": true (send a
progress event carrying the scratch directory, then wait up to 30 s for a
file named "release" in it), "sleep": SECONDS, or "exit": CODE (exit in
the middle of the call). Hooks answer {"status": "ack", "probe": ...},
compactors put the probe in "diagnostics", harnesses in "summary".
"""

import json
import os
import socket
import sys
import time

PACKAGE, VERSION = sys.argv[1], sys.argv[2]
# This process, whatever its pid in its sandbox's pid namespace.
INSTANCE = os.urandom(8).hex()
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


def outcome(f):
    try:
        f()
        return "ok"
    except Exception as e:  # noqa: BLE001 - the class is the answer
        return f"{type(e).__name__}: {e}"


def write(path):
    def go():
        with open(path, "w") as fh:
            fh.write("x")
    return go


def probe(rid, body):
    ctx = body.get("context") or {}
    args = body.get("input") or {}
    scratch = ctx.get("scratch_dir") or ""
    if args.get("exit") is not None:
        sys.stderr.write("exiting mid-call as asked\n")
        sys.stderr.flush()
        os._exit(int(args["exit"]))
    if args.get("hold"):
        send({"type": "event", "request_id": rid, "event": {"type": "progress", "message": scratch}})
        deadline = time.time() + 30
        while time.time() < deadline and not os.path.exists(os.path.join(scratch, "release")):
            time.sleep(0.02)
    if args.get("sleep"):
        time.sleep(float(args["sleep"]))
    report = {
        "instance": INSTANCE,
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "export": body.get("export_id"),
        "invocation_id": ctx.get("invocation_id"),
        "scratch_dir": scratch,
        "write_scratch": outcome(write(os.path.join(scratch, "mine"))),
    }
    try:
        report["siblings"] = sorted(os.listdir(os.path.dirname(scratch)))
    except Exception as e:  # noqa: BLE001
        report["siblings"] = f"{type(e).__name__}: {e}"
    if args.get("port"):
        report["connect"] = outcome(
            lambda: socket.create_connection(("127.0.0.1", int(args["port"])), timeout=3).close()
        )
    if args.get("target"):
        report["write_target"] = outcome(write(args["target"]))
    return report


def main():
    send({"type": "hello", "role": "plugin", "plugin": {"package_id": PACKAGE, "version": VERSION}})
    while True:
        msg = read_frame()
        if msg is None or msg.get("type") == "shutdown":
            return
        if msg.get("type") != "request":
            continue
        rid, op, body = msg.get("id"), msg.get("op"), msg.get("body") or {}
        report = probe(rid, body)
        if op == "hook.handle":
            reply = {"status": "ack", "probe": report}
        elif op == "compactor.compact":
            reply = {"status": "succeeded", "result": {"seed_blocks": [], "summary": {"text": "-"}, "diagnostics": report}}
        elif op == "harness.run":
            reply = {"status": "succeeded", "result": {"checkpoint": None, "summary": report, "artifacts": []}}
        else:
            reply = {"status": "succeeded", "result": {
                "content": [{"type": "text", "text": json.dumps(report)}],
                "structured_output": report,
                "is_error": False,
                "retryable": False,
            }}
        send({"type": "response", "id": rid, "ok": True, "body": reply})


if __name__ == "__main__":
    main()
