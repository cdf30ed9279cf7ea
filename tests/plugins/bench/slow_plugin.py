#!/usr/bin/env python3
"""A vai.rpc.v1 package for scripts/bench-cluster (Python stdlib only): work that waits, with bounded concurrency.

Usage: slow_plugin.py LEDGER [SLEEP_MS] [CONCURRENCY]

Tool export "work" and hook export "drain" each sleep SLEEP_MS (50) while
holding one of CONCURRENCY (8) slots of this process, then answer; "drain"
first appends its delivery id and its directory (the node's pin: one per
node) to LEDGER (one line each, O_APPEND), so the
benchmark counts what was applied and what was applied twice.
"""

import json
import os
import sys
import threading
import time

LEDGER = sys.argv[1]
SLEEP = (int(sys.argv[2]) if len(sys.argv) > 2 else 50) / 1000.0
SLOTS = threading.Semaphore(int(sys.argv[3]) if len(sys.argv) > 3 else 8)
PROTO = "vai.rpc.v1"

out = sys.stdout.buffer
inp = sys.stdin.buffer
lock = threading.Lock()


def send(obj):
    body = json.dumps(obj).encode()
    with lock:
        out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        out.flush()


def frame(kind, **fields):
    d = {"protocol": PROTO, "type": kind}
    d.update(fields)
    return d


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


def handle(msg):
    rid, op, body = msg.get("id"), msg.get("op"), msg.get("body") or {}
    with SLOTS:
        time.sleep(SLEEP)
        if op == "hook.handle":
            line = (json.dumps({"delivery_id": body.get("delivery_id"), "cwd": os.getcwd()}) + "\n").encode()
            fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            send(frame("response", id=rid, ok=True, body={"status": "ack"}))
        elif op == "tool.invoke":
            send(frame("response", id=rid, ok=True, body={"status": "succeeded", "result": {
                "content": [{"type": "text", "text": "done"}], "is_error": False, "retryable": False}}))
        else:
            send(frame("response", id=rid, ok=False,
                       error={"code": "protocol.unsupported_op", "message": "op %s" % op}))


def main():
    send(frame("hello", role="plugin", plugin={"package_id": "bench/slow", "version": "0.1.0"}))
    while True:
        msg = read_frame()
        if msg is None:
            return
        if msg.get("type") == "request":
            threading.Thread(target=handle, args=(msg,), daemon=True).start()
        elif msg.get("type") == "shutdown":
            return


if __name__ == "__main__":
    main()
