# hostile_mcp.py: one configurable hostile MCP server (stdio) for plugd's integration tests (Python 3.11 stdlib only).
"""

Usage: python3 hostile_mcp.py MODE [ARG]

Speaks MCP over stdio (one JSON-RPC message per line) and behaves well
except for MODE, which alters exactly one thing. Good behaviour:

  initialize      -> protocolVersion 2025-11-25, capabilities {tools: {listChanged: true}},
                     serverInfo {name: "hostile", version: "9.9.9"}
  tools/list      -> every tool on one page (see MODES for paging)
  tools/call, by name:
    echo {message}  -> text "Echo: <message>", structuredContent {"echo": arguments}
    fail            -> isError: true with text "it broke on purpose"
    proto_error     -> JSON-RPC error -32602 "no such thing: proto_error"
    sleep {ms}      -> in a thread: progress every 100 ms (when a progressToken
                       was given), then {"slept_ms": ms}; a cancelled sleep goes quiet
    progress {steps}-> one progress notification per step ("step i"), then the result
    pid             -> structuredContent {"pid": ..., "pgid": ...}
    crash           -> exits with code 3, saying so on stderr
    add_tool        -> adds the tool "added" to the catalog, answers, then sends
                       notifications/tools/list_changed
    ask             -> sends the client ping, roots/list, sampling/createMessage,
                       elicitation/create and bogus/method; answers with
                       structuredContent {method: the client's response}
    cancels         -> structuredContent {"cancelled": [params of every
                       notifications/cancelled received]}
    client          -> structuredContent {"initialize": the client's initialize
                       params, "initialized": whether notifications/initialized came}
    notes           -> structuredContent {"notes": [method of every notification received]}
  ping            -> {}
  other requests  -> -32601; EOF -> exit 0

Everything received is also logged to stderr as "recv: <line>". With
HOSTILE_PID_FILE set, the server writes its pid there first.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

MODES = {
    "good": "behave",
    "version": "answer initialize with protocolVersion ARG",
    "junk": "before every message, print non-JSON lines and a JSON value that is not JSON-RPC",
    "paged": "serve tools/list in pages of ARG tools (default 2), with opaque cursors",
    "endless_pages": "every tools/list page has a new nextCursor",
    "ignore_cancel": "a cancelled sleep keeps sending progress and answers at the end",
    "ignore_term": "ignore SIGTERM and start a grandchild (sleep 300) in the same group",
    "slow_start": "wait ARG ms (default 1500) before answering initialize",
    "meta": "also list tools with title, annotations, outputSchema and icons (some lying or malformed): "
            "reader (readOnlyHint), wiper (destructiveHint), gentle (destructiveHint false), "
            "typed {n} (structuredContent matches its outputSchema unless n is negative), "
            "untyped (declares an outputSchema, returns no structuredContent), "
            "liar (readOnlyHint \"yes\", a title that is a number, icons that are an object), "
            "task_only (execution.taskSupport required), task_ok (optional)",
}

MODE = sys.argv[1] if len(sys.argv) > 1 else "good"
ARG = sys.argv[2] if len(sys.argv) > 2 else None
if MODE not in MODES:
    sys.stderr.write(f"unknown mode {MODE!r}; one of {', '.join(MODES)}\n")
    sys.exit(2)

out_lock = threading.Lock()
state_lock = threading.Lock()
cancelled = {}  # request id -> params of notifications/cancelled
cancel_log = []
notes = []  # method of every notification received, in order
client_init = {}
initialized = False
extra_tools = []
server_requests = {}  # our id -> [threading.Event, response]

OBJ = {"type": "object"}
TOOLS = [
    {"name": "echo", "description": "echo back", "inputSchema": {
        "type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}},
    {"name": "fail", "description": "isError", "inputSchema": OBJ},
    {"name": "proto_error", "description": "JSON-RPC error", "inputSchema": OBJ},
    {"name": "sleep", "description": "sleep ms", "inputSchema": {
        "type": "object", "properties": {"ms": {"type": "integer"}}}},
    {"name": "progress", "description": "progress steps", "inputSchema": OBJ},
    {"name": "pid", "description": "pid and pgid", "inputSchema": OBJ},
    {"name": "crash", "description": "exit 3", "inputSchema": OBJ},
    {"name": "add_tool", "description": "adds a tool", "inputSchema": OBJ},
    {"name": "ask", "description": "asks the client", "inputSchema": OBJ},
    {"name": "cancels", "description": "cancellations seen", "inputSchema": OBJ},
    {"name": "client", "description": "what the client sent", "inputSchema": OBJ},
    {"name": "notes", "description": "notifications received", "inputSchema": OBJ},
]


COUNT_SCHEMA = {"type": "object", "properties": {"count": {"type": "integer", "minimum": 0}},
                "required": ["count"]}
META_TOOLS = [
    {"name": "reader", "title": "Read things", "description": "reads", "inputSchema": OBJ,
     "annotations": {"readOnlyHint": True, "openWorldHint": False},
     "icons": [{"src": "data:image/png;base64,AAAA", "mimeType": "image/png"}]},
    {"name": "wiper", "description": "deletes", "inputSchema": OBJ,
     "annotations": {"readOnlyHint": False, "destructiveHint": True}},
    {"name": "gentle", "description": "appends", "inputSchema": OBJ,
     "annotations": {"destructiveHint": False, "idempotentHint": True}},
    {"name": "typed", "description": "typed result", "inputSchema": OBJ, "outputSchema": COUNT_SCHEMA},
    {"name": "untyped", "description": "forgets structuredContent", "inputSchema": OBJ,
     "outputSchema": COUNT_SCHEMA},
    {"name": "task_only", "description": "needs tasks", "inputSchema": OBJ,
     "execution": {"taskSupport": "required"}},
    {"name": "task_ok", "description": "tasks optional", "inputSchema": OBJ,
     "execution": {"taskSupport": "optional"}},
    {"name": "liar", "title": 42, "description": "lies", "inputSchema": OBJ,
     "annotations": {"readOnlyHint": "yes", "destructiveHint": True}, "icons": {"src": "x"},
     "outputSchema": "not a schema"},
]
if MODE == "meta":
    TOOLS = TOOLS + META_TOOLS


def log(*parts):
    sys.stderr.write(" ".join(str(p) for p in parts) + "\n")
    sys.stderr.flush()


def send(msg):
    with out_lock:
        if MODE == "junk":
            sys.stdout.write("this is not json\n{\"half\": \n[1, 2, 3]\n")
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def reply(rid, result):
    send({"jsonrpc": "2.0", "id": rid, "result": result})


def error(rid, code, message):
    send({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})


def text(t, structured=None):
    r = {"content": [{"type": "text", "text": t}]}
    if structured is not None:
        r["structuredContent"] = structured
    return r


def progress(token, n, total=None, message=None):
    if token is None:
        return
    p = {"progressToken": token, "progress": n}
    if total is not None:
        p["total"] = total
    if message is not None:
        p["message"] = message
    send({"jsonrpc": "2.0", "method": "notifications/progress", "params": p})


def is_cancelled(rid):
    with state_lock:
        return rid in cancelled


def all_tools():
    with state_lock:
        return TOOLS + list(extra_tools)


def tools_list(rid, params):
    tools = all_tools()
    cursor = (params or {}).get("cursor")
    if MODE == "endless_pages":
        n = int(cursor[1:]) + 1 if cursor else 1
        reply(rid, {"tools": tools if n == 1 else [], "nextCursor": f"c{n}"})
        return
    if MODE == "paged":
        size = int(ARG or 2)
        start = int(cursor.split(":")[1]) if cursor else 0
        page = tools[start:start + size]
        result = {"tools": page}
        if start + size < len(tools):
            result["nextCursor"] = f"opaque:{start + size}"
        reply(rid, result)
        return
    reply(rid, {"tools": tools})


def sleeper(rid, ms, token):
    end = time.monotonic() + ms / 1000
    n = 0
    while time.monotonic() < end:
        time.sleep(0.1)
        if is_cancelled(rid) and MODE != "ignore_cancel":
            log(f"sleep {rid}: cancelled, going quiet")
            return
        n += 1
        progress(token, n, message="sleeping")
    reply(rid, text(f"slept {ms} ms", {"slept_ms": ms}))


def ask(rid):
    asks = [
        ("ping", None),
        ("roots/list", None),
        ("sampling/createMessage", {"messages": [], "maxTokens": 1}),
        ("elicitation/create", {"message": "name?", "requestedSchema": OBJ}),
        ("bogus/method", {}),
    ]
    got = {}
    for i, (method, params) in enumerate(asks):
        sid = f"srv-{rid}-{i}"
        ev = threading.Event()
        with state_lock:
            server_requests[sid] = [ev, None]
        msg = {"jsonrpc": "2.0", "id": sid, "method": method}
        if params is not None:
            msg["params"] = params
        send(msg)
        if not ev.wait(5):
            got[method] = "no response within 5 s"
            continue
        with state_lock:
            response = server_requests.pop(sid)[1]
        response.pop("jsonrpc", None)
        response.pop("id", None)
        got[method] = response
        log(f"client answered {method}: {json.dumps(response)}")
    reply(rid, text(json.dumps(got), got))


def call(rid, params):
    name = params.get("name")
    args = params.get("arguments") or {}
    token = (params.get("_meta") or {}).get("progressToken")
    if name == "echo":
        reply(rid, text(f"Echo: {args.get('message')}", {"echo": args}))
    elif name == "fail":
        reply(rid, {"content": [{"type": "text", "text": "it broke on purpose"}], "isError": True})
    elif name == "proto_error":
        error(rid, -32602, "no such thing: proto_error")
    elif name == "sleep":
        threading.Thread(target=sleeper, args=(rid, int(args.get("ms", 1000)), token), daemon=True).start()
    elif name == "progress":
        steps = int(args.get("steps", 3))
        for i in range(1, steps + 1):
            progress(token, i, steps, f"step {i}")
        reply(rid, text(f"{steps} steps done"))
    elif name == "pid":
        reply(rid, text("pid", {"pid": os.getpid(), "pgid": os.getpgid(0)}))
    elif name == "crash":
        log("crashing on purpose")
        os._exit(3)
    elif name == "add_tool":
        with state_lock:
            if not extra_tools:
                extra_tools.append({"name": "added", "description": "added later", "inputSchema": OBJ})
        reply(rid, text("added"))
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    elif name == "added":
        reply(rid, text("the added tool works", {"added": True}))
    elif name == "ask":
        threading.Thread(target=ask, args=(rid,), daemon=True).start()
    elif name == "cancels":
        with state_lock:
            seen = list(cancel_log)
        reply(rid, text(json.dumps(seen), {"cancelled": seen}))
    elif name in ("reader", "wiper", "gentle", "liar", "task_ok"):
        reply(rid, text(name, {"count": 1}))
    elif name == "typed":
        n = int(args.get("n", 1))
        reply(rid, text(f"count {n}", {"count": n}))
    elif name == "untyped":
        reply(rid, text("no structured content"))
    elif name == "notes":
        with state_lock:
            seen = list(notes)
        reply(rid, text(json.dumps(seen), {"notes": seen}))
    elif name == "client":
        reply(rid, text("client", {"initialize": client_init, "initialized": initialized}))
    else:
        error(rid, -32602, f"unknown tool: {name}")


def main():
    global initialized
    pid_file = os.environ.get("HOSTILE_PID_FILE")
    if pid_file:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
    if MODE == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen(["sleep", "300"])
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        log("recv:", line[:500])
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method = msg.get("method")
        rid = msg.get("id")
        params = msg.get("params") or {}
        if method is None:
            # A response to one of our requests.
            with state_lock:
                slot = server_requests.get(rid)
                if slot is not None:
                    slot[1] = msg
                    slot[0].set()
            continue
        if rid is None:
            with state_lock:
                notes.append(method)
            if method == "notifications/initialized":
                initialized = True
            elif method == "notifications/cancelled":
                with state_lock:
                    cancelled[params.get("requestId")] = params
                    cancel_log.append(params)
            continue
        if method == "initialize":
            if MODE == "slow_start":
                time.sleep(int(ARG or 1500) / 1000)
            client_init.update(params)
            version = ARG if MODE == "version" else "2025-11-25"
            reply(rid, {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "hostile", "version": "9.9.9"},
            })
        elif method == "ping":
            reply(rid, {})
        elif method == "tools/list":
            tools_list(rid, params)
        elif method == "tools/call":
            call(rid, params)
        else:
            error(rid, -32601, f"method not found: {method}")
    if MODE == "ignore_term":
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main()
