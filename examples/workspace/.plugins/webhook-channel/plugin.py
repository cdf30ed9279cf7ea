"""webhook-channel: a nexo channel adapter (contract §5.x) over loopback HTTP.

Host -> plugin: initialize (params.config: {port, outbound_url}),
channel.start {kind, instance}, channel.stop {kind},
channel.send_outbound {kind, msg}, shutdown.
Plugin -> host: broker.publish {topic: "plugin.inbound.webhook", event}.

Inbound: POST http://127.0.0.1:<port>/ with {"from": "...", "text": "..."}
answers 202 and publishes the event. Outbound text messages are POSTed to
outbound_url as {"to": "...", "body": "..."}. Typed errors: outbound URL
unreachable -33001, bad recipient -33003, HTTP 429 -33004 (retry_after_secs
from Retry-After), media -33005.
"""

import json
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST = tomllib.loads((Path(__file__).resolve().parent / "nexo-plugin.toml").read_text())
KIND = "webhook"
CONFIG = {"port": 8788, "outbound_url": "http://127.0.0.1:8789/outbound"}
OUT = threading.Lock()
SERVER = None


def send(frame):
    with OUT:
        sys.stdout.write(json.dumps(frame) + "\n")
        sys.stdout.flush()


def log(msg):
    sys.stderr.write(f"webhook-channel: {msg}\n")
    sys.stderr.flush()


class Err(Exception):
    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class Inbound(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        try:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(min(n, 1 << 20)) or b"null")
        except (ValueError, json.JSONDecodeError):
            return self.reply(400, {"error": "body must be JSON {from, text}"})
        if not isinstance(body, dict) or not isinstance(body.get("from"), str) \
                or not body["from"].strip() or not isinstance(body.get("text"), str):
            return self.reply(400, {"error": "body must be {from: non-empty string, text: string}"})
        # No session_id: whoever can POST here must not pick someone else's
        # session; plugd keys the session by channel and sender.
        payload = {"from": body["from"], "text": body["text"]}
        send({"jsonrpc": "2.0", "method": "broker.publish", "params": {
            "topic": f"plugin.inbound.{KIND}",
            "event": {"topic": f"plugin.inbound.{KIND}", "source": KIND, "payload": payload},
        }})
        self.reply(202, {"accepted": True})


def start():
    global SERVER
    if SERVER is not None:
        return
    try:
        SERVER = ThreadingHTTPServer(("127.0.0.1", int(CONFIG["port"])), Inbound)
    except OSError as e:
        raise Err(-33001, f"cannot listen on 127.0.0.1:{CONFIG['port']}: {e.strerror or e}")
    threading.Thread(target=SERVER.serve_forever, daemon=True).start()
    log(f"listening on 127.0.0.1:{CONFIG['port']}")


def stop():
    global SERVER
    if SERVER is not None:
        SERVER.shutdown()
        SERVER.server_close()
        SERVER = None


def send_outbound(msg):
    kind = msg.get("kind")
    to = msg.get("to")
    if kind != "text":
        raise Err(-33005, f"webhook channel sends text only, not {kind!r}", {"feature": str(kind)})
    if not isinstance(to, str) or to == "" or any(c.isspace() for c in to):
        raise Err(-33003, "recipient must be a non-empty id without spaces",
                  {"recipient": to if isinstance(to, str) else "", "reason": "empty or contains spaces"})
    data = json.dumps({"to": to, "body": msg.get("body", "")}).encode()
    req = urllib.request.Request(CONFIG["outbound_url"], data=data,
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            r.read()
    except urllib.error.HTTPError as e:
        if e.code == 429:
            retry = e.headers.get("Retry-After")
            data = {"retry_after_secs": int(retry)} if retry and retry.isdigit() else {}
            raise Err(-33004, "the outbound URL answered 429", data)
        raise Err(-32603, f"the outbound URL answered HTTP {e.code}")
    except (urllib.error.URLError, OSError) as e:
        raise Err(-33001, f"cannot reach {CONFIG['outbound_url']}: {getattr(e, 'reason', e)}")
    return {"message_id": uuid.uuid4().hex, "sent_at_unix": int(time.time())}


def handle(method, p):
    if method in ("channel.start", "channel.stop", "channel.send_outbound") and p.get("kind") != KIND:
        raise Err(-32602, f"unknown channel kind {p.get('kind')!r}; this plugin serves {KIND!r}")
    if method == "channel.start":
        start()
        return {"ok": True}
    if method == "channel.stop":
        stop()
        return {"ok": True}
    if method == "channel.send_outbound":
        return send_outbound(p.get("msg") or {})
    raise Err(-32601, f"method not found: {method}")


def serve(rid, method, params):
    try:
        send({"jsonrpc": "2.0", "id": rid, "result": handle(method, params)})
    except Err as e:
        err = {"code": e.code, "message": e.message}
        if e.data is not None:
            err["data"] = e.data
        send({"jsonrpc": "2.0", "id": rid, "error": err})


for raw in sys.stdin:
    try:
        msg = json.loads(raw)
    except json.JSONDecodeError:
        continue
    if "id" not in msg or "method" not in msg:
        continue
    rid, method, params = msg["id"], msg["method"], msg.get("params") or {}
    if method == "initialize":
        CONFIG.update((params.get("config") or {}))
        send({"jsonrpc": "2.0", "id": rid, "result": {"manifest": MANIFEST, "server_version": "webhook-channel-0.1.0"}})
    elif method == "shutdown":
        stop()
        send({"jsonrpc": "2.0", "id": rid, "result": {"ok": True}})
        break
    else:
        # Each request on its own thread: a slow outbound POST never delays
        # channel.stop or another send.
        threading.Thread(target=serve, args=(rid, method, params), daemon=True).start()
