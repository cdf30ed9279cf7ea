#!/usr/bin/env python3
"""A configurable nexo microapp for plugd's tests (Python standard library only).

It behaves well except for what `config.mode` (from extensions.yaml) asks:

  good          the default
  impostor      initialize answers with another extension_id
  outside       advertises a tool without the extension's prefix
  list_outside  tools/list (not initialize) adds an unprefixed tool
  malformed     initialize answers with a string instead of {tools, version}
  junk          writes junk lines (not JSON, not JSON-RPC, unknown ids) before every reply
  stubborn      ignores SIGTERM and never answers shutdown

Tools (each prefixed with the extension id, `-` read as `_`):

  echo      {"echo": args}
  sleep     sleeps args.ms milliseconds, then {"slept": ms}
  crash     exits with status 3
  fail      tool-level failure: {"error": "..."}
  rpc_error JSON-RPC error -32099
  code      JSON-RPC error with args.code
  bad_reply a result that is neither {output} nor {error}
  pid       {"pid", "pgid", "child"}
  context   the binding_context and inbound it was given
  state     what initialize gave it
  spawn     starts a grandchild (`sleep 1000`) in its process group
  outbound  sends the requests in args.requests (each {method, params} or
            {id, method, params}) and returns the replies, also written to
            stderr as `[INFO] reply ...` and to STATE_DIR/replies.jsonl

Hooks registered in the initialize reply: `config.hooks` (a list, sent as
is); each votes deny (reason "<hook>: <word> is not allowed") when its params
contain `config.deny_word`, else abstain. Other hooks: before_send → deny, allow_all → allow, garbage → "yes", weird →
vote "maybe"; others → -32601. Every notification is appended to
STATE_DIR/notifications.jsonl, the params of every tools/call to
STATE_DIR/calls.jsonl and the method of every other host request to
STATE_DIR/requests.jsonl, each as it arrives. Requests run on their own
threads, so a sleeping tool does not block the next call.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading

out_lock = threading.Lock()
pending = {}  # outbound id -> Queue
pending_lock = threading.Lock()
state = {"mode": "good", "prefix": "", "state_dir": None, "init": None, "child": None}
counter = [0]


def write(obj):
    with out_lock:
        if state["mode"] == "junk":
            sys.stdout.write("this is not json\n")
            sys.stdout.write('{"foo": 1}\n')
            sys.stdout.write("[1, 2, 3]\n")
            sys.stdout.write('{"jsonrpc":"2.0","id":987654,"result":"nobody asked"}\n')
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def respond(rid, result):
    write({"jsonrpc": "2.0", "id": rid, "result": result})


def error(rid, code, message):
    write({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})


def record(name, obj):
    if state["state_dir"]:
        with out_lock:
            with open(os.path.join(state["state_dir"], name), "a") as f:
                f.write(json.dumps(obj) + "\n")


def log(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def tools():
    p = state["prefix"]
    names = ["echo", "sleep", "crash", "fail", "rpc_error", "code", "bad_reply", "pid",
             "context", "state", "spawn", "outbound"]
    out = [{"name": p + n, "description": "test tool " + n,
            "input_schema": {"type": "object"}} for n in names]
    if state["mode"] == "outside":
        out.append({"name": "create", "description": "unprefixed",
                    "input_schema": {"type": "object"}})
    return out


def outbound(requests):
    replies = []
    for req in requests:
        counter[0] += 1
        rid = req.get("id", "app:%d" % counter[0])
        q = queue.Queue()
        with pending_lock:
            pending[json.dumps(rid)] = q
        frame = {"jsonrpc": "2.0", "id": rid, "method": req["method"]}
        if "params" in req:
            frame["params"] = req["params"]
        write(frame)
        try:
            reply = q.get(timeout=10)
        except queue.Empty:
            reply = {"timeout": True}
        replies.append(reply)
        log("[INFO] reply " + json.dumps(reply))
        if state["state_dir"]:
            with open(os.path.join(state["state_dir"], "replies.jsonl"), "a") as f:
                f.write(json.dumps(reply) + "\n")
    return replies


def call_tool(rid, params):
    p = state["prefix"]
    tool = params.get("tool", "")
    args = params.get("args") or {}
    name = tool[len(p):] if tool.startswith(p) else tool
    if name == "echo":
        respond(rid, {"output": {"echo": args}})
    elif name == "sleep":
        ms = int(args.get("ms", 0))
        threading.Event().wait(ms / 1000.0)
        respond(rid, {"output": {"slept": ms}})
    elif name == "crash":
        log("[ERROR] crashing on purpose")
        os._exit(3)
    elif name == "fail":
        respond(rid, {"error": "the tool failed on purpose"})
    elif name == "rpc_error":
        error(rid, -32099, "microapp internal error")
    elif name == "code":
        write({"jsonrpc": "2.0", "id": rid, "error": {
            "code": int(args.get("code", -32099)), "message": "code on purpose",
            "data": args.get("data")}})
    elif name == "bad_reply":
        respond(rid, {"neither": True})
    elif name == "pid":
        respond(rid, {"output": {"pid": os.getpid(), "pgid": os.getpgid(0),
                                 "child": state["child"]}})
    elif name == "context":
        respond(rid, {"output": {"binding_context": params.get("binding_context"),
                                 "inbound": params.get("inbound", "absent"),
                                 "keys": sorted(params.keys())}})
    elif name == "state":
        respond(rid, {"output": state["init"]})
    elif name == "spawn":
        child = subprocess.Popen(["sleep", "1000"])
        state["child"] = child.pid
        respond(rid, {"output": {"child": child.pid}})
    elif name == "outbound":
        respond(rid, {"output": outbound(args.get("requests", []))})
    else:
        error(rid, -32601, "unknown tool: " + tool)


def hook(rid, name, params):
    cfg = (state["init"] or {}).get("config") or {}
    if name in (cfg.get("hooks") or []):
        word = cfg.get("deny_word")
        if word and word in json.dumps(params):
            respond(rid, {"vote": "deny", "reason": "%s: %s is not allowed" % (name, word)})
        else:
            respond(rid, {"vote": "abstain"})
    elif name == "before_send":
        respond(rid, {"vote": "deny", "reason": "blocked by test", "metadata": {"event": params}})
    elif name == "allow_all":
        respond(rid, {"vote": "allow"})
    elif name == "garbage":
        respond(rid, "yes")
    elif name == "weird":
        respond(rid, {"vote": "maybe"})
    else:
        error(rid, -32601, "unknown hook: " + name)


def handle(req):
    rid = req.get("id")
    method = req.get("method")
    params = req.get("params") or {}
    mode = state["mode"]
    if method == "tools/call":
        record("calls.jsonl", params)
    elif method != "initialize":
        record("requests.jsonl", {"method": method})
    if method == "initialize":
        state["mode"] = mode = (params.get("config") or {}).get("mode", "good")
        ext = params.get("extension_id", "")
        state["prefix"] = ext.replace("-", "_") + "_"
        state["state_dir"] = params.get("state_dir")
        state["init"] = params
        if mode == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if mode == "malformed":
            respond(rid, "hello")
            return
        result = {"tools": tools(), "version": "1.2.3"}
        if "hooks" in (params.get("config") or {}):
            result["hooks"] = params["config"]["hooks"]
        if mode == "impostor":
            result["extension_id"] = "someone-else"
        respond(rid, result)
    elif method == "tools/list":
        t = tools()
        if mode == "list_outside":
            t.append({"name": "stray", "input_schema": {"type": "object"}})
        respond(rid, {"tools": t})
    elif method == "tools/call":
        threading.Thread(target=call_tool, args=(rid, params), daemon=True).start()
    elif method and method.startswith("hooks/"):
        hook(rid, method[len("hooks/"):], params)
    elif method == "shutdown":
        if mode == "stubborn":
            log("[WARN] ignoring shutdown")
            return
        respond(rid, {"ok": True})
        sys.exit(0)
    else:
        error(rid, -32601, "unknown method: %s" % method)


def main():
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            log("[WARN] unparsable line from host")
            continue
        if "method" not in msg:
            # A reply to one of our outbound requests.
            with pending_lock:
                q = pending.pop(json.dumps(msg.get("id")), None)
            if q is not None:
                q.put(msg)
            continue
        if "id" not in msg:
            record("notifications.jsonl", msg)
            continue
        handle(msg)
    if state["mode"] == "stubborn":
        # stdin closed: keep living until killed.
        threading.Event().wait(1000)


if __name__ == "__main__":
    main()
