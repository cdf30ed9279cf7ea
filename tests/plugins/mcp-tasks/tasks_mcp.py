# tasks_mcp.py: an MCP server (raw JSON-RPC over stdio, Python 3.11 stdlib only) serving 2025-11-25 tasks, honest and hostile, for plugd's tests.
"""

Usage: python3 tasks_mcp.py [nocancel]

Declares tasks {list, cancel, requests: {tools: {call}}} (without `cancel`
when started with `nocancel`). Every tool but `log` and `plain` requires
task augmentation (execution.taskSupport "required"); a tools/call without
`task` gets -32601, as the spec says.

  slow {ms, steps}  working for ms (pollInterval 100), one progress
                    notification per step with the call's progressToken
                    (all sent after the CreateTaskResult), then completed:
                    text "slow done after <steps> steps"
  notified {ms}     pollInterval 600000 (plugd clamps it), completes after ms
                    and sends notifications/tasks/status
  flood             sends 2000 notifications/tasks/status over 500 ms, then completes
  ask               input_required at once; on tasks/result it sends
                    elicitation/create (related-task in _meta), then
                    completes with text "answer: <the client's response>"
  fail              failed; tasks/result: isError "it broke in the task"
  forever           working forever (until tasks/cancel)
  stuck             completed, but tasks/result never answers
  liar              tasks/get answers status "done"
  other_id          tasks/get describes another task
  unknown           tasks/get answers -32602 "Failed to retrieve task: Task not found"
  get_error         tasks/get answers -32603 "task store on fire"
  huge              completed; tasks/result is a 17 MiB text
  bad_create        the CreateTaskResult has no taskId
  no_task           answers the task-augmented call with a plain result "plain anyway"
  plain             (taskSupport optional) text "plain: task=<whether params.task came>"
  log               structuredContent {"methods": [every request method received],
                    "task_params": [params.task of each task-augmented call],
                    "cancelled": [taskId of each tasks/cancel],
                    "gets": {taskId: number of tasks/get}}
"""

import json
import sys
import threading
import time

CANCEL = not (len(sys.argv) > 1 and sys.argv[1] == "nocancel")
OBJ = {"type": "object"}
REQUIRED = {"taskSupport": "required"}
TOOLS = [
    {"name": n, "inputSchema": OBJ, "execution": REQUIRED}
    for n in ["slow", "notified", "flood", "ask", "fail", "forever", "stuck", "liar", "other_id",
              "unknown", "get_error", "huge", "bad_create", "no_task"]
] + [
    {"name": "plain", "inputSchema": OBJ, "execution": {"taskSupport": "optional"}},
    {"name": "log", "inputSchema": OBJ},
]

out_lock = threading.Lock()
lock = threading.Lock()
tasks = {}  # taskId -> dict(tool, status, message, result, error, done: Event, poll)
methods = []
task_params = []
cancelled = []
gets = {}
pending = {}  # our request id -> [Event, response]
next_task = [0]
next_req = [0]


def send(msg):
    msg["jsonrpc"] = "2.0"
    line = json.dumps(msg) + "\n"
    with out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def task_json(t):
    j = {"taskId": t["id"], "status": t["status"], "createdAt": t["created"], "lastUpdatedAt": now(),
         "ttl": t["ttl"], "pollInterval": t["poll"]}
    if t.get("message"):
        j["statusMessage"] = t["message"]
    return j


def finish(t, status, result=None, error=None, message=None):
    with lock:
        if t["status"] in ("completed", "failed", "cancelled"):
            return
        t["status"] = status
        t["result"] = result
        t["error"] = error
        t["message"] = message
    t["done"].set()


def text(s, is_error=False):
    r = {"content": [{"type": "text", "text": s}]}
    if is_error:
        r["isError"] = True
    return r


def ask_client(method, params):
    with lock:
        next_req[0] += 1
        rid = f"srv-{next_req[0]}"
        slot = [threading.Event(), None]
        pending[rid] = slot
    send({"id": rid, "method": method, "params": params})
    slot[0].wait(30)
    return slot[1]


def run(t, args, token):
    tool = t["tool"]
    if tool == "slow":
        steps = int(args.get("steps", 0))
        ms = int(args.get("ms", 300))
        for i in range(steps):
            time.sleep(ms / 1000 / max(steps, 1))
            if token is not None:
                send({"method": "notifications/progress",
                      "params": {"progressToken": token, "progress": i + 1, "total": steps, "message": f"step {i + 1}"}})
        if steps == 0:
            time.sleep(ms / 1000)
        finish(t, "completed", text(f"slow done after {steps} steps"))
    elif tool == "notified":
        time.sleep(int(args.get("ms", 200)) / 1000)
        finish(t, "completed", text("notified done"))
        send({"method": "notifications/tasks/status", "params": task_json(t)})
    elif tool == "flood":
        for _ in range(2000):
            send({"method": "notifications/tasks/status", "params": task_json(t)})
            time.sleep(0.00025)
        finish(t, "completed", text("flood done"))
    elif tool == "fail":
        finish(t, "failed", text("it broke in the task", True), message="broken")
    elif tool in ("stuck", "huge"):
        finish(t, "completed", text("x" * (17 << 20) if tool == "huge" else "never sent"))
    elif tool in ("liar", "other_id", "unknown", "get_error", "forever"):
        pass  # tasks/get decides
    elif tool == "ask":
        with lock:
            t["status"] = "input_required"
            t["message"] = "waiting for the client"


def on_result(rid, t):
    if t["tool"] == "ask" and t["status"] == "input_required":
        answer = ask_client("elicitation/create", {
            "message": "which colour?",
            "requestedSchema": {"type": "object", "properties": {"colour": {"type": "string"}}},
            "_meta": {"io.modelcontextprotocol/related-task": {"taskId": t["id"]}},
        })
        with lock:
            t["status"] = "working"
        finish(t, "completed", text("answer: " + json.dumps(answer, sort_keys=True)))
    if t["tool"] == "stuck":
        return  # never answers
    t["done"].wait()
    meta = {"io.modelcontextprotocol/related-task": {"taskId": t["id"]}}
    if t["error"]:
        send({"id": rid, "error": t["error"]})
    else:
        r = dict(t["result"])
        r["_meta"] = meta
        send({"id": rid, "result": r})


def handle(msg):
    method = msg.get("method")
    rid = msg.get("id")
    params = msg.get("params") or {}
    if method is None:  # a response to one of our requests
        with lock:
            slot = pending.pop(rid, None)
        if slot:
            slot[1] = msg.get("result", msg.get("error"))
            slot[0].set()
        return
    if rid is None:
        return  # notification
    with lock:
        methods.append(method)
    if method == "initialize":
        caps = {"tools": {}, "tasks": {"list": {}, "requests": {"tools": {"call": {}}}}}
        if CANCEL:
            caps["tasks"]["cancel"] = {}
        send({"id": rid, "result": {"protocolVersion": "2025-11-25", "capabilities": caps,
                                    "serverInfo": {"name": "tasks", "version": "1.0.0"}}})
    elif method == "tools/list":
        send({"id": rid, "result": {"tools": TOOLS}})
    elif method == "ping":
        send({"id": rid, "result": {}})
    elif method == "tools/call":
        name = params.get("name")
        args = params.get("arguments") or {}
        task = params.get("task")
        if name == "log":
            with lock:
                s = {"methods": list(methods), "task_params": list(task_params),
                     "cancelled": list(cancelled), "gets": dict(gets)}
            send({"id": rid, "result": {"content": [], "structuredContent": s}})
            return
        if name == "plain":
            send({"id": rid, "result": text(f"plain: task={task is not None}")})
            return
        if task is None:
            send({"id": rid, "error": {"code": -32601, "message": f"tool {name} requires task augmentation"}})
            return
        with lock:
            task_params.append(task)
        if name == "no_task":
            send({"id": rid, "result": text("plain anyway")})
            return
        if name == "bad_create":
            send({"id": rid, "result": {"task": {"status": "working"}}})
            return
        with lock:
            next_task[0] += 1
            tid = f"task-{next_task[0]}"
            t = {"id": tid, "tool": name, "status": "working", "created": now(), "ttl": task.get("ttl"),
                 "poll": 600000 if name == "notified" else 100, "done": threading.Event(),
                 "result": None, "error": None}
            tasks[tid] = t
        send({"id": rid, "result": {"task": task_json(t)}})
        token = (params.get("_meta") or {}).get("progressToken")
        threading.Thread(target=run, args=(t, args, token), daemon=True).start()
    elif method in ("tasks/get", "tasks/result", "tasks/cancel"):
        tid = params.get("taskId")
        with lock:
            t = tasks.get(tid)
            if method == "tasks/get":
                gets[tid] = gets.get(tid, 0) + 1
        if t is None or (t["tool"] == "unknown" and method == "tasks/get"):
            send({"id": rid, "error": {"code": -32602, "message": "Failed to retrieve task: Task not found"}})
            return
        if method == "tasks/get":
            if t["tool"] == "get_error":
                send({"id": rid, "error": {"code": -32603, "message": "task store on fire"}})
            elif t["tool"] == "liar":
                send({"id": rid, "result": dict(task_json(t), status="done")})
            elif t["tool"] == "other_id":
                send({"id": rid, "result": dict(task_json(t), taskId="someone-else")})
            else:
                send({"id": rid, "result": task_json(t)})
        elif method == "tasks/cancel":
            with lock:
                cancelled.append(tid)
            if t["status"] in ("completed", "failed", "cancelled"):
                send({"id": rid, "error": {"code": -32602, "message": "task already terminal"}})
                return
            finish(t, "cancelled", error={"code": -32800, "message": "cancelled"}, message="cancelled by request")
            send({"id": rid, "result": task_json(t)})
        else:
            threading.Thread(target=on_result, args=(rid, t), daemon=True).start()
    else:
        send({"id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}})


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        handle(msg)


main()
