# hello-python: a nexo/plugd native plugin in plain Python 3.11 (stdlib only), one thread per tool call.

import json
import os
import sys
import threading
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "nexo-plugin.toml"), "rb") as f:
    MANIFEST = tomllib.load(f)
PLUGIN_ID = MANIFEST["plugin"]["id"]
SERVER_VERSION = f"{PLUGIN_ID}-{MANIFEST['plugin']['version']}"

TOOLS = [
    {
        "name": "hello_python_greet",
        "description": "Greet someone by name (optional delay_ms to simulate a slow tool)",
        "input_schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "delay_ms": {"type": "integer", "minimum": 0},
            },
            "required": ["name"],
        },
    },
    {
        "name": "hello_python_add",
        "description": "Add two numbers",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
]

_out_lock = threading.Lock()


def log(level, msg):
    print(f"[{level}] {msg}", file=sys.stderr, flush=True)


def send(frame):
    line = json.dumps(frame, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def reply(req_id, result):
    send({"jsonrpc": "2.0", "id": req_id, "result": result})


def reply_error(req_id, code, message, data=None):
    err = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    send({"jsonrpc": "2.0", "id": req_id, "error": err})


class ToolError(Exception):
    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def invalid(message, field):
    return ToolError(-33402, f"invalid argument: {message}", {"details": {"field": field}})


def text(t):
    return {"content": [{"type": "text", "text": t}], "is_error": False}


def greet(args):
    name = args.get("name")
    if not isinstance(name, str):
        raise invalid("missing string `name`", "name")
    delay = args.get("delay_ms", 0)
    if isinstance(delay, (int, float)) and delay > 0:
        time.sleep(delay / 1000)
    return text(f"Hello, {name}!")


def add(args):
    a, b = args.get("a"), args.get("b")
    for key, v in (("a", a), ("b", b)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise invalid(f"`{key}` must be a number", key)
    total = a + b
    return {**text(f"{a} + {b} = {total}"), "sum": total}


HANDLERS = {"hello_python_greet": greet, "hello_python_add": add}


def run_tool(req_id, params):
    tool = params.get("tool_name")
    handler = HANDLERS.get(tool)
    try:
        if handler is None:
            raise ToolError(-33401, f"tool not found: {tool}")
        args = params.get("args")
        reply(req_id, handler(args if isinstance(args, dict) else {}))
    except ToolError as e:
        reply_error(req_id, e.code, e.message, e.data)
    except Exception as e:  # a bug in a handler must not kill the plugin
        log("ERROR", f"tool {tool} failed: {e!r}")
        reply_error(req_id, -33403, f"execution failed: {e}")


_inflight = set()
_inflight_lock = threading.Lock()


def spawn_tool(req_id, params):
    def body():
        try:
            run_tool(req_id, params)
        finally:
            with _inflight_lock:
                _inflight.discard(threading.current_thread())

    t = threading.Thread(target=body, daemon=True)
    with _inflight_lock:
        _inflight.add(t)
    t.start()


def drain(timeout_s):
    """Wait (bounded) for in-flight tool calls so their replies are not lost."""
    deadline = time.monotonic() + timeout_s
    with _inflight_lock:
        pending = list(_inflight)
    for t in pending:
        t.join(max(0.0, deadline - time.monotonic()))


def main():
    log("INFO", f"{SERVER_VERSION} starting, pid {os.getpid()}")
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            log("WARN", f"ignored a line that is not JSON: {line[:80]!r}")
            continue
        if not isinstance(msg, dict) or not isinstance(msg.get("method"), str):
            log("WARN", f"ignored a frame that is not a request: {line[:80]!r}")
            continue
        if "id" not in msg:
            continue  # notification: never answered
        req_id, method = msg["id"], msg["method"]
        params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
        if method == "initialize":
            log("INFO", f"initialize from nexo {params.get('nexo_version')}")
            reply(req_id, {"manifest": MANIFEST, "server_version": SERVER_VERSION, "tools": TOOLS})
        elif method == "tool.invoke":
            spawn_tool(req_id, params)
        elif method == "shutdown":
            log("INFO", "shutdown requested")
            drain(0.5)  # the host allows 1 s between the reply and SIGKILL
            reply(req_id, {"ok": True})
            return
        else:
            reply_error(req_id, -32601, f"method not found: {method}")
    log("INFO", "stdin closed")
    drain(5.0)


if __name__ == "__main__":
    main()
