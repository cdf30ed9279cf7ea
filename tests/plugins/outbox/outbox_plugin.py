#!/usr/bin/env python3
"""A vai.rpc.v1 test plugin with hook exports for the durable outbox (Python stdlib only).

Usage: outbox_plugin.py MODE RECORD_FILE [PACKAGE_ID VERSION]

Every hook.handle request is first appended to RECORD_FILE as one JSON line
(export, delivery_id, attempt, event, pid, ppid, pgid, time), then answered by MODE:

  ack             status "ack"
  ack_after_20ms  waits 20 ms, then "ack" (work that waits: the nodes of a
                  cluster share it by their slots, not by who gets the CPU)
  sleep_first     attempt 1 sleeps 120 s (the test kills the host meanwhile),
                  later attempts "ack"
  retryable_once  attempt 1 "retryable_failure", later attempts "ack"
  always_fail     always "retryable_failure"
  error           always an ok=false protocol failure
  fatal           always "failed" with retryable false

Only the "recorder" export follows MODE; "audit" always acks.
"""

import json
import os
import sys
import threading
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "ack"
RECORD = sys.argv[2] if len(sys.argv) > 2 else "records.jsonl"
PACKAGE = sys.argv[3] if len(sys.argv) > 3 else "test/outbox"
VERSION = sys.argv[4] if len(sys.argv) > 4 else "0.1.0"
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


def record(export, body):
    line = json.dumps({
        "export": export,
        "delivery_id": body.get("delivery_id"),
        "attempt": body.get("attempt"),
        "event": body.get("event"),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "t": time.time(),
    })
    with lock:
        with open(RECORD, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def respond(rid, body=None, ok=True, error=None):
    if ok:
        send(frame("response", id=rid, ok=True, body=body))
    else:
        send(frame("response", id=rid, ok=False, error=error))


def handle(msg):
    rid = msg.get("id")
    body = msg.get("body") or {}
    export = body.get("export_id")
    if msg.get("op") != "hook.handle":
        respond(rid, ok=False, error={"code": "protocol.unsupported_op", "message": "op %s" % msg.get("op")})
        return
    record(export, body)
    attempt = body.get("attempt")
    if export != "recorder" or MODE == "ack":
        respond(rid, {"status": "ack"})
    elif MODE == "ack_after_20ms":
        time.sleep(0.02)
        respond(rid, {"status": "ack"})
    elif MODE == "sleep_first":
        if attempt == 1:
            time.sleep(120)
        respond(rid, {"status": "ack"})
    elif MODE == "retryable_once":
        if attempt == 1:
            respond(rid, {"status": "retryable_failure", "error": {"message": "downstream busy"}})
        else:
            respond(rid, {"status": "ack"})
    elif MODE == "always_fail":
        respond(rid, {"status": "retryable_failure", "error": {"message": "webhook is down"}})
    elif MODE == "error":
        respond(rid, ok=False, error={"code": "hook.broken", "message": "cannot parse the event"})
    elif MODE == "fatal":
        respond(rid, {"status": "failed", "result": {"content": [{"type": "text", "text": "event rejected"}],
                                                     "is_error": True, "retryable": False}})
    else:
        respond(rid, ok=False, error={"code": "test.mode", "message": "unknown mode %s" % MODE})


def main():
    send(frame("hello", role="plugin", plugin={"package_id": PACKAGE, "version": VERSION}))
    while True:
        msg = read_frame()
        if msg is None:
            return
        kind = msg.get("type")
        if kind == "request":
            threading.Thread(target=handle, args=(msg,), daemon=True).start()
        elif kind == "shutdown":
            return


if __name__ == "__main__":
    main()
