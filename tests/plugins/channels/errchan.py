# errchan: a native channel adapter (nexo §5.x) for the tests, Python 3.11
# stdlib only. Serves every kind its manifest's [plugin.extends].channels
# lists. channel.send_outbound answers by msg.to:
#   conn -33001, auth -33002, bad -33003 {recipient, reason},
#   busy -33004 {retry_after_secs: 9}, media -33005 {feature: "media"},
#   nomethod -32601, hang: never answers, junk: {"nope": 1};
#   anything else {message_id: "m-<to>", sent_at_unix: 1741032000}.
# channel.start answers {ok: true}; channel.stop is not implemented (-32601).
# Every request is appended to the file $CALLS_LOG names, with this process's pid.

import json
import os
import sys
import threading
import tomllib

with open("nexo-plugin.toml", "rb") as f:
    MANIFEST = tomllib.load(f)
LOCK = threading.Lock()

ERRORS = {
    "conn": (-33001, "connection refused by the upstream", None),
    "auth": (-33002, "token rejected", None),
    "bad": (-33003, "no such user", {"recipient": "bad", "reason": "unknown user"}),
    "busy": (-33004, "slow down", {"retry_after_secs": 9}),
    "media": (-33005, "media not supported", {"feature": "media"}),
    "nomethod": (-32601, "method not found", None),
}


def send(frame):
    with LOCK:
        sys.stdout.write(json.dumps(frame) + "\n")
        sys.stdout.flush()


for raw in sys.stdin:
    try:
        msg = json.loads(raw)
    except ValueError:
        continue
    if "id" not in msg:
        continue
    rid, method, params = msg["id"], msg.get("method"), msg.get("params") or {}
    with LOCK, open(os.environ["CALLS_LOG"], "a") as f:
        f.write(json.dumps({"method": method, "params": params, "pid": os.getpid()}) + "\n")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"manifest": MANIFEST, "server_version": "errchan-1"}})
    elif method == "shutdown":
        send({"jsonrpc": "2.0", "id": rid, "result": {"ok": True}})
        break
    elif method == "channel.start":
        send({"jsonrpc": "2.0", "id": rid, "result": {"ok": True}})
    elif method == "channel.send_outbound":
        to = (params.get("msg") or {}).get("to")
        if to == "hang":
            continue
        if to == "junk":
            send({"jsonrpc": "2.0", "id": rid, "result": {"nope": 1}})
        elif to in ERRORS:
            code, message, data = ERRORS[to]
            err = {"code": code, "message": message}
            if data is not None:
                err["data"] = data
            send({"jsonrpc": "2.0", "id": rid, "error": err})
        else:
            send({"jsonrpc": "2.0", "id": rid, "result": {"message_id": f"m-{to}", "sent_at_unix": 1741032000}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}})
