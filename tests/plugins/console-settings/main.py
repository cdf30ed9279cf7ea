"""console-settings: the Salmex I/O plugin of the console's browser tests.

Standard library only. Holds the configuration of `initialize` and of each
`config/changed`; tools: show_config (that configuration, the secret
`api_key` replaced by its SHA-256 so no result ever carries it), shout
{word, times}, launch {target} (declared critical in plugin.json).
"""

import hashlib
import json
import sys

config = {}
out = sys.stdout.buffer


def send(msg):
    body = json.dumps(msg).encode("utf-8")
    out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    out.flush()


def read_frame(inp):
    """One frame's body, or None at end of input."""
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


def text(msg_id, s):
    send({"jsonrpc": "2.0", "id": msg_id, "result": {"content": [{"type": "text", "text": s}]}})


def shown_config():
    shown = dict(config)
    if isinstance(shown.get("api_key"), str):
        shown["api_key"] = "sha256:" + hashlib.sha256(shown["api_key"].encode()).hexdigest()
    return shown


def handle(msg):
    global config
    method = msg.get("method")
    params = msg.get("params") or {}
    if method == "initialize":
        config = params.get("config") or {}
        tools = [{"name": n} for n in ("show_config", "shout", "launch")]
        send({"jsonrpc": "2.0", "id": msg["id"],
              "result": {"protocolVersion": "1.0", "capabilities": {"tools": tools}}})
    elif method == "config/changed":
        config = params.get("config") or {}
        print("config changed: %s" % sorted(config), file=sys.stderr, flush=True)
    elif method == "tools/call":
        name = params.get("name")
        args = params.get("arguments") or {}
        if name == "show_config":
            text(msg["id"], json.dumps(shown_config(), sort_keys=True))
        elif name == "shout":
            text(msg["id"], " ".join([str(args.get("word", "")).upper()] * int(args.get("times") or 1)))
        elif name == "launch":
            text(msg["id"], "launched %s" % args.get("target"))
        else:
            send({"jsonrpc": "2.0", "id": msg["id"],
                  "error": {"code": -32601, "message": "unknown tool: %s" % name}})
    elif method == "shutdown":
        sys.exit(0)
    elif "id" in msg:
        send({"jsonrpc": "2.0", "id": msg["id"],
              "error": {"code": -32601, "message": "method not found: %s" % method}})


def main():
    inp = sys.stdin.buffer
    while True:
        body = read_frame(inp)
        if body is None:
            return
        handle(json.loads(body))


if __name__ == "__main__":
    main()
