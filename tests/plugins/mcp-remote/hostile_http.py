"""A lying Streamable HTTP MCP server for plugd's hostile tests (raw HTTP,
no SDK: each mode breaks one rule on purpose).

    hostile_http.py MODE

initialize, notifications and tools/list behave; `tools/call` of tool `t`
misbehaves per MODE:

  huge-json    a JSON reply of 200 KB (tests set a 64 KiB frame limit)
  huge-event   one SSE event of 200 KB
  endless      an SSE event that never ends (bytes without a blank line)
  wrong-type   200 with text/html
  http-500     500 with a body
  no-answer    an SSE stream without event ids that closes unanswered
  resume       an SSE event (id e1, retry 100 ms) then close; the answer
               comes on GET with Last-Event-ID: e1 (as SEP-1699 polls)
  bad-session  initialize gives a session id outside visible ASCII (a space, é)
  expire       the first tools/call is answered 404 (its session expired);
               later calls (on a new session) work
  redirect     tools/call answers 307 to another origin (must not be followed)

GET /stats returns what the server saw. Prints `url: http://127.0.0.1:PORT/mcp`.
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = sys.argv[1]
STATS = {"last_event_ids": [], "sessions": [], "deletes": 0, "gets": 0, "calls": 0, "redirect_followed": 0}
LOCK = threading.Lock()
SESSION_N = [0]


def answer(req_id, result):
    return {"jsonrpc": "2.0", "id": req_id, "result": result}


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send_json(self, obj, status=200, headers=None):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def send_sse(self, chunks, close=True):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for c in chunks:
            self.wfile.write(c.encode() if isinstance(c, str) else c)
            self.wfile.flush()
        self.close_connection = True

    def do_GET(self):
        if self.path == "/stats":
            with LOCK:
                return self.send_json(STATS)
        if self.path == "/elsewhere":
            with LOCK:
                STATS["redirect_followed"] += 1
            return self.send_json({"jsonrpc": "2.0", "id": 9, "result": {}})
        with LOCK:
            STATS["gets"] += 1
        last = self.headers.get("Last-Event-ID")
        if MODE == "resume" and last:
            with LOCK:
                STATS["last_event_ids"].append(last)
            msg = answer(STATE["call_id"], {"content": [{"type": "text", "text": "resumed answer"}]})
            return self.send_sse([f"id: e2\ndata: {json.dumps(msg)}\n\n"])
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self):
        with LOCK:
            STATS["deletes"] += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        msg = json.loads(self.rfile.read(n))
        method = msg.get("method")
        sid = self.headers.get("Mcp-Session-Id")
        if method == "initialize":
            SESSION_N[0] += 1
            session = f"s{SESSION_N[0]}"
            with LOCK:
                STATS["sessions"].append(session)
            if MODE == "bad-session":
                session = "s\xe9 x"
            result = {
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "0"},
            }
            body = json.dumps(answer(msg["id"], result)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Mcp-Session-Id", session)
            self.end_headers()
            self.wfile.write(body)
            return
        if MODE == "expire" and method == "tools/call" and not STATE.get("expired"):
            STATE["expired"] = sid
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if "id" not in msg:
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if method == "tools/list":
            tool = {"name": "t", "inputSchema": {"type": "object"}}
            return self.send_json(answer(msg["id"], {"tools": [tool]}))
        if method != "tools/call":
            return self.send_json({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no"}})
        with LOCK:
            STATS["calls"] += 1
        rid = msg["id"]
        ok = answer(rid, {"content": [{"type": "text", "text": "fine"}]})
        if MODE == "huge-json":
            return self.send_json(answer(rid, {"content": [{"type": "text", "text": "x" * 200_000}]}))
        if MODE == "huge-event":
            big = answer(rid, {"content": [{"type": "text", "text": "x" * 200_000}]})
            return self.send_sse([f"data: {json.dumps(big)}\n\n"])
        if MODE == "endless":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                self.wfile.write(b"data: ")
                for _ in range(2000):
                    self.wfile.write(b"y" * 1024)
                    self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True
            return
        if MODE == "wrong-type":
            body = b"<html>hello</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if MODE == "http-500":
            body = b"boom: the backend fell over"
            self.send_response(500)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if MODE == "no-answer":
            note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "working"}}
            return self.send_sse([f"data: {json.dumps(note)}\n\n"])
        if MODE == "resume":
            STATE["call_id"] = rid
            return self.send_sse(["id: e1\nretry: 100\ndata: \n\n"])
        if MODE == "redirect":
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{PORT[0]}/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        return self.send_json(ok)


STATE = {}
PORT = [0]


def main():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    PORT[0] = srv.server_address[1]
    print(f"url: http://127.0.0.1:{PORT[0]}/mcp", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
