"""The console API's test plugin (Salmex I/O, Python stdlib): it reports
the settings it received (secrets only as set/unset), compares its secret
with a value it is given without printing it, and writes to stderr on
demand (a line per call, a flood of n lines, its key at start so the host's
masking is visible)."""

import json
import os
import sys
import threading

OUT = sys.stdout.buffer
LOCK = threading.Lock()
SECRETS = ("api_key",)
config = {}


def send(msg):
    body = json.dumps(msg).encode()
    with LOCK:
        OUT.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        OUT.flush()


def reply(msg, result):
    send({"jsonrpc": "2.0", "id": msg["id"], "result": result})


def text(s):
    return {"content": [{"type": "text", "text": s}]}


def err(line):
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


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


def visible():
    return {k: ("set" if k in SECRETS else v) for k, v in config.items()}


def call(msg):
    params = msg.get("params") or {}
    name = params.get("name")
    args = params.get("arguments") or {}
    if name == "show_config":
        reply(msg, text(json.dumps(visible(), sort_keys=True)))
    elif name == "check_secret":
        same = config.get("api_key") == args.get("expect")
        reply(msg, text("match" if same else "mismatch"))
    elif name == "say":
        err("[INFO] say: %s" % args.get("text", ""))
        err("[INFO] key in use: %s" % config.get("api_key", "none"))
        reply(msg, text("said"))
    elif name == "flood":
        n = int(args.get("n", 0))
        line = "flood line %d " + "x" * 100 + "\n"
        chunk = []
        for i in range(n):
            chunk.append(line % i)
            if len(chunk) == 1000:
                sys.stderr.write("".join(chunk))
                chunk = []
        sys.stderr.write("".join(chunk))
        sys.stderr.flush()
        reply(msg, text("flooded %d" % n))
    elif name == "crash":
        err("[ERROR] crashing on purpose")
        os._exit(3)
    elif name == "danger":
        reply(msg, text("done"))
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
            config = (msg.get("params") or {}).get("config") or {}
            err("[INFO] started with key %s" % config.get("api_key", "none"))
            with open("plugin.json") as f:
                tools = [{"name": t["name"]} for t in json.load(f)["capabilities"]["tools"]]
            reply(msg, {"protocolVersion": "1.0", "capabilities": {"tools": tools}})
        elif method == "config/changed":
            config = (msg.get("params") or {}).get("config") or {}
            err("[INFO] config changed, key %s" % config.get("api_key", "none"))
        elif method == "tools/call":
            threading.Thread(target=call, args=(msg,), daemon=True).start()
        elif method == "shutdown":
            return


main()
