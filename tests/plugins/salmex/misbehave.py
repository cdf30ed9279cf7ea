"""A configurable Salmex I/O plugin for plugd's tests: it behaves, or it lies,
hangs, crashes and breaks the Content-Length framing on purpose.

Salmex starts `interpreter main` with no arguments, so the behaviour comes
from a file `mode` next to this script (absent = "good"):

  good             serve the tools below
  wrong_version    answer initialize with protocolVersion "2.0"
  impostor         advertise "other-plugin/say_hello"
  undeclared       advertise a tool plugin.json does not declare
  ignore_shutdown  stay alive after the shutdown notification
  init_frame:KIND  answer initialize with the malformed frame KIND

Tools (all advertised from plugin.json): echo, sleep {ms}, crash, fail
(isError), rpc_error (a JSON-RPC error), progress {steps}, pid, log, greet
(uses config.greeting; config/changed updates it), spawn_child (a
grandchild that sleeps), frame {kind} (answers with a malformed frame).

Frame kinds: non_numeric, negative, huge_number, no_blank_line,
header_flood (1 MiB of header lines), oversized (a 17 MiB body, streamed),
oversized_stall (a 17 MiB Content-Length, 300 body bytes, then silence).
"""

import json
import os
import subprocess
import sys
import threading
import time

OUT = sys.stdout.buffer
MODE = open("mode").read().strip() if os.path.exists("mode") else "good"
config = {}
LOCK = threading.Lock()


def write(raw):
    with LOCK:
        OUT.write(raw)
        OUT.flush()


def send(msg):
    body = json.dumps(msg).encode()
    write(b"Content-Length: %d\r\n\r\n" % len(body) + body)


def reply(msg, result):
    send({"jsonrpc": "2.0", "id": msg["id"], "result": result})


def text(s, is_error=False):
    r = {"content": [{"type": "text", "text": s}]}
    if is_error:
        r["isError"] = True
    return r


def bad_frame(kind, msg_id):
    """Writes one malformed frame of `kind` in answer to request `msg_id`."""
    body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "result": text("bad")}).encode()
    if kind == "non_numeric":
        write(b"Content-Length: twelve\r\n\r\n" + body)
    elif kind == "negative":
        write(b"Content-Length: -5\r\n\r\n" + body)
    elif kind == "huge_number":
        write(b"Content-Length: 99999999999999999999999999\r\n\r\n" + body)
    elif kind == "no_blank_line":
        # LSP-naive framing: "\n" after the header, never "\r\n\r\n". It keeps
        # talking (logs), all of it without a blank line.
        write(b"Content-Length: %d\n" % len(body) + body)
        while True:
            log = json.dumps({"jsonrpc": "2.0", "method": "log.info", "params": "still here"}).encode()
            write(b"Content-Length: %d\n" % len(log) + log)
            time.sleep(0.005)
    elif kind == "header_flood":
        line = b"X-Padding: " + b"a" * 1000 + b"\r\n"
        write(line * 1024)  # 1 MiB of headers, no blank line
    elif kind == "oversized":
        size = 17 * 1024 * 1024
        head = b'{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":"' % msg_id
        tail = b'"}]}}'
        pad = size - len(head) - len(tail)
        write(b"Content-Length: %d\r\n\r\n" % size + head)
        chunk = b"x" * 65536
        while pad > 0:
            n = min(pad, len(chunk))
            write(chunk[:n])
            pad -= n
        write(tail)
    elif kind == "oversized_stall":
        head = b'{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":"' % msg_id
        write(b"Content-Length: %d\r\n\r\n" % (17 * 1024 * 1024) + head + b"x" * 300)
    else:
        raise SystemExit("unknown frame kind %r" % kind)
    time.sleep(3600)


def read_frame(inp):
    length = None
    while True:
        line = inp.readline()
        if not line:
            return None
        line = line.rstrip(b"\r\n")
        if not line:
            if length is None:
                continue
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return inp.read(length)


def manifest_tools():
    with open("plugin.json") as f:
        return [{"name": t["name"], "description": "advertised: " + t["name"]}
                for t in json.load(f)["capabilities"]["tools"]]


def initialize(msg):
    global config
    config = msg.get("params", {}).get("config") or {}
    tools = manifest_tools()
    version = "1.0"
    if MODE == "wrong_version":
        version = "2.0"
    elif MODE == "impostor":
        tools.append({"name": "other-plugin/say_hello"})
    elif MODE == "undeclared":
        tools.append({"name": "sneaky"})
    elif MODE.startswith("init_frame:"):
        bad_frame(MODE.split(":", 1)[1], msg["id"])
    reply(msg, {"protocolVersion": version, "capabilities": {"tools": tools}})


def call(msg):
    params = msg.get("params") or {}
    name = params.get("name")
    args = params.get("arguments") or {}
    if name == "echo":
        reply(msg, text(json.dumps(args, sort_keys=True)))
    elif name == "sleep":
        time.sleep(args.get("ms", 0) / 1000)
        reply(msg, text("slept"))
    elif name == "crash":
        sys.stderr.write("[ERROR] crashing on purpose\n")
        sys.stderr.flush()
        os._exit(3)
    elif name == "fail":
        reply(msg, text("disk full: cannot write /tmp/out", is_error=True))
    elif name == "rpc_error":
        send({"jsonrpc": "2.0", "id": msg["id"],
              "error": {"code": -32000, "message": "backend unreachable", "data": {"retry": True}}})
    elif name == "progress":
        steps = int(args.get("steps", 3))
        for i in range(1, steps + 1):
            send({"jsonrpc": "2.0", "method": "event.progress",
                  "params": {"id": msg["id"], "message": "step %d" % i, "progress": i, "total": steps}})
        send({"jsonrpc": "2.0", "method": "event.progress", "params": "almost done"})
        reply(msg, text("done"))
    elif name == "pid":
        reply(msg, {"content": [], "pid": os.getpid(), "pgid": os.getpgid(0)})
    elif name == "log":
        send({"jsonrpc": "2.0", "method": "log.warn", "params": "careful: low on widgets"})
        send({"jsonrpc": "2.0", "method": "log.error",
              "params": {"message": "widget 7 failed", "widget": 7}})
        reply(msg, text("logged"))
    elif name == "greet":
        reply(msg, text("%s, %s!" % (config.get("greeting", "Hello"), args.get("name", "world"))))
    elif name == "spawn_child":
        child = subprocess.Popen(["sleep", "3600"])
        reply(msg, {"content": [], "child": child.pid, "pgid": os.getpgid(0)})
    elif name == "frame":
        bad_frame(args.get("kind", ""), msg["id"])
    else:
        send({"jsonrpc": "2.0", "id": msg["id"],
              "error": {"code": -32601, "message": "unknown tool %r" % name}})


def main():
    global config
    inp = sys.stdin.buffer
    while True:
        body = read_frame(inp)
        if body is None:
            return
        msg = json.loads(body)
        method = msg.get("method")
        if method == "initialize":
            initialize(msg)
        elif method == "config/changed":
            config = (msg.get("params") or {}).get("config") or {}
        elif method == "tools/call":
            # Each call on its own thread, so a sleeping call does not block the next.
            threading.Thread(target=call, args=(msg,), daemon=True).start()
        elif method == "shutdown":
            if MODE == "ignore_shutdown":
                continue
            os._exit(0)


if __name__ == "__main__":
    main()
