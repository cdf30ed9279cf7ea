"""hello-salmex-python: a Salmex I/O plugin in Python, standard library only.

Reads Content-Length framed JSON-RPC 2.0 from stdin, answers `initialize`
and `tools/call` (say_hello), hot-reloads `config/changed`, exits on the
`shutdown` notification. Logs go to the host as `log.info` notifications.
"""

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
                continue  # blank line between frames
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return inp.read(length)


def handle(msg):
    global config
    method = msg.get("method")
    params = msg.get("params") or {}
    if method == "initialize":
        config = params.get("config") or {}
        send({
            "jsonrpc": "2.0", "id": msg["id"],
            "result": {
                "protocolVersion": "1.0",
                "capabilities": {"tools": [{"name": "say_hello", "description": "Greet someone"}]},
            },
        })
    elif method == "initialized":
        send({"jsonrpc": "2.0", "method": "log.info", "params": {"message": "hello-salmex-python ready"}})
    elif method == "config/changed":
        config = params.get("config") or {}
    elif method == "tools/call":
        if params.get("name") != "say_hello":
            send({"jsonrpc": "2.0", "id": msg["id"],
                  "error": {"code": -32601, "message": "unknown tool: %s" % params.get("name")}})
            return
        name = (params.get("arguments") or {}).get("name") or "world"
        greeting = config.get("greeting") or "Hello"
        send({"jsonrpc": "2.0", "id": msg["id"],
              "result": {"content": [{"type": "text", "text": "%s, %s!" % (greeting, name)}]}})
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
