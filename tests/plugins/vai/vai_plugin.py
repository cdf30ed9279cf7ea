#!/usr/bin/env python3
"""A configurable vai.rpc.v1 test plugin (Python stdlib only).

Usage: vai_plugin.py MODE [PACKAGE_ID VERSION]

Modes:
  good           hello at once, then serve
  hello_late     send its hello only after the host's
  impostor       hello as another package
  old_version    hello with another version
  no_hello       never say hello
  junk           write junk and lying frames before every response
  ignore_cancel  never answer a cancelled request

Tool exports (input decides the behaviour): echo, fail, proto_error, sleep,
serial, pid, crash, scratch, attack, bad_body. Hook "notify", compactor
"window", harness "triage".
"""

import json
import os
import sys
import threading
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "good"
PACKAGE = sys.argv[2] if len(sys.argv) > 2 else "test/vai"
VERSION = sys.argv[3] if len(sys.argv) > 3 else "0.1.0"
PROTO = "vai.rpc.v1"

out = sys.stdout.buffer
inp = sys.stdin.buffer
lock = threading.Lock()
cancelled = {}  # request id -> reason
cancel_seen = []
state = {"running": 0, "max_running": 0, "host_hello": None}
state_lock = threading.Lock()


def raw(data):
    with lock:
        out.write(data)
        out.flush()


def send(obj):
    body = json.dumps(obj).encode()
    raw(b"Content-Length: %d\r\n\r\n" % len(body) + body)


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
    data = inp.read(length or 0)
    return json.loads(data)


def hello():
    send(frame("hello", role="plugin", plugin={"package_id": PACKAGE, "version": VERSION}))


def respond(rid, body=None, ok=True, error=None):
    if MODE == "junk":
        raw(b"Content-Length: 9\r\n\r\nnot json!")
        send({"type": "response", "id": rid, "ok": True, "body": {"status": "succeeded"}})
        send({"protocol": "vai.rpc.v0", "type": "response", "id": rid, "ok": True, "body": {}})
        send(frame("response", id="req_999999", ok=True, body={"status": "succeeded"}))
        send(frame("response", id="bogus", ok=True, body={}))
        send(frame("event", request_id="req_888888", event={"type": "progress"}))
        send(frame("telemetry", data=1))
    if ok:
        send(frame("response", id=rid, ok=True, body=body))
    else:
        send(frame("response", id=rid, ok=False, error=error))


def succeeded(rid, text, structured=None):
    respond(rid, {"status": "succeeded", "result": {
        "content": [{"type": "text", "text": text}],
        "structured_output": structured or {},
        "is_error": False,
        "retryable": False,
    }})


def wait_or_cancel(rid, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if rid in cancelled:
            return True
        time.sleep(0.01)
    return False


def attack(rid, kind):
    if kind == "negative_length":
        raw(b"Content-Length: -5\r\n\r\n{}")
    elif kind == "huge_length":
        raw(b"Content-Length: 99999999999999999999999999\r\n\r\n{}")
    elif kind == "bad_header":
        raw(b"Content-Length: twelve\r\n\r\n{}")
    elif kind == "no_separator":
        # A header line, then JSON with no blank line, as a line-protocol plugin would.
        raw(b"Content-Length: 20\r\n" + (b'{"protocol":"vai.rpc.v1"}\n' * 400))
    elif kind == "big_header":
        raw(b"X-Pad: " + b"a" * (1 << 20) + b"\r\nContent-Length: 2\r\n\r\n{}")
    elif kind == "oversized":
        # 17 MiB body, over the 16 MiB limit: skipped as it streams (the host fails the
        # call from the id in its first bytes), then an answer the host must drop.
        pad = b" " * (17 * 1024 * 1024)
        body = b'{"protocol":"vai.rpc.v1","type":"response","id":"' + rid.encode() + b'","ok":true,"body":' + pad + b'{}}'
        raw(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        succeeded(rid, "after the oversized frame")
        return
    # Keep running (stdout is now garbage to the host); the host kills us.
    time.sleep(30)


def handle(msg):
    rid = msg.get("id")
    op = msg.get("op")
    body = msg.get("body") or {}
    export = body.get("export_id")
    ctx = body.get("context") or {}
    inp_ = body.get("input") or {}
    if op == "tool.invoke":
        if export == "echo":
            for i in range(int(inp_.get("progress", 0))):
                send(frame("event", request_id=rid, event={"type": "progress", "message": "step %d" % (i + 1)}))
            succeeded(rid, "echoed", {"input": inp_, "context": ctx,
                                      "tool_execution_id": body.get("tool_execution_id")})
        elif export == "fail":
            status = inp_.get("status", "failed")
            respond(rid, {"status": status, "result": {
                "content": [{"type": "text", "text": inp_.get("why", "it broke")}],
                "is_error": True, "retryable": status == "retryable_failure"}})
        elif export == "proto_error":
            respond(rid, ok=False, error={"code": "protocol.invalid_frame", "message": "missing body"})
        elif export == "bad_body":
            respond(rid, {"result": {}})
        elif export == "sleep":
            if wait_or_cancel(rid, inp_.get("ms", 0) / 1000.0):
                if MODE == "ignore_cancel":
                    time.sleep(60)
                respond(rid, {"status": "cancelled", "result": {"content": [], "is_error": True}})
            else:
                succeeded(rid, "slept")
        elif export == "serial":
            with state_lock:
                state["running"] += 1
                state["max_running"] = max(state["max_running"], state["running"])
            time.sleep(inp_.get("ms", 0) / 1000.0)
            with state_lock:
                state["running"] -= 1
                seen = state["max_running"]
            succeeded(rid, "done", {"max_running": seen})
        elif export == "pid":
            succeeded(rid, "pid", {"pid": os.getpid(), "pgid": os.getpgid(0),
                                   "cancels": list(cancel_seen),
                                   "host_hello": state["host_hello"]})
        elif export == "crash":
            os._exit(3)
        elif export == "scratch":
            d = ctx.get("scratch_dir")
            existed = bool(d) and os.path.isdir(d)
            with open(os.path.join(d, "work.txt"), "w") as f:
                f.write("x")
            succeeded(rid, "scratch", {"scratch_dir": d, "existed": existed})
        elif export == "attack":
            attack(rid, inp_.get("kind", ""))
        else:
            respond(rid, ok=False, error={"code": "export.unknown", "message": "no export %s" % export})
    elif op == "hook.handle":
        ev = body.get("event") or {}
        if ev.get("type") == "fail":
            respond(rid, {"status": "retryable_failure", "error": {"message": "slack is down"}})
        else:
            respond(rid, {"status": "ack", "delivery_id": body.get("delivery_id"),
                          "attempt": body.get("attempt"), "event_type": ev.get("type"),
                          "has_context": "invocation_id" in ctx})
    elif op == "compactor.compact":
        blocks = ((body.get("source") or {}).get("projection") or {}).get("blocks") or []
        respond(rid, {"status": "succeeded", "result": {
            "seed_blocks": [{"kind": "input", "content": [{"type": "text", "text": "kept %d" % len(blocks[-2:])}]}],
            "summary": {"text": "compaction %s" % body.get("compaction_id")},
            "diagnostics": {"input_tokens_estimate": 10, "output_tokens_estimate": 2}}})
    elif op == "harness.run":
        respond(rid, {"status": "succeeded", "result": {
            "checkpoint": {"kind": "checkpoint", "data": {"cursor": 12}},
            "summary": {"text": "mode %s for %s" % (body.get("mode"), (body.get("target") or {}).get("chain_id"))},
            "artifacts": []}})
    else:
        respond(rid, ok=False, error={"code": "protocol.unsupported_op", "message": "op %s" % op})


def main():
    if MODE in ("good", "junk", "ignore_cancel"):
        hello()
    elif MODE == "impostor":
        send(frame("hello", role="plugin", plugin={"package_id": "evil/impostor", "version": VERSION}))
    elif MODE == "old_version":
        send(frame("hello", role="plugin", plugin={"package_id": PACKAGE, "version": "9.9.9"}))
    while True:
        msg = read_frame()
        if msg is None:
            return
        kind = msg.get("type")
        if kind == "hello":
            state["host_hello"] = msg
            if MODE == "hello_late":
                hello()
        elif kind == "request":
            threading.Thread(target=handle, args=(msg,), daemon=True).start()
        elif kind == "cancel":
            cancelled[msg.get("request_id")] = msg.get("reason")
            cancel_seen.append({"request_id": msg.get("request_id"), "reason": msg.get("reason")})
        elif kind == "shutdown":
            sys.stderr.write("[INFO] shutdown received\n")
            sys.stderr.flush()
            if len(sys.argv) > 4 and sys.argv[4] == "linger":
                time.sleep(60)
            return


if __name__ == "__main__":
    main()
