# pyvec: a native vector memory backend (nexo §5.w) in plain Python, for the
# tests. Keeps records in memory; dimension 3. Collections named for an
# error answer with it: "missing" -33301, "busy" -33303, "readonly" -33304;
# memory.vector_delete on "nodelete" is not implemented (-32601).

import json
import math
import sys
import tomllib
from pathlib import Path

MANIFEST = tomllib.loads((Path(__file__).resolve().parent / "nexo-plugin.toml").read_text())
DIM = 3
DATA = {}


def send(frame):
    sys.stdout.write(json.dumps(frame) + "\n")
    sys.stdout.flush()


class Err(Exception):
    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def check_collection(c):
    if c == "missing":
        raise Err(-33301, "collection not found", {"collection": c})
    if c == "busy":
        raise Err(-33303, "rate limited", {"retry_after_secs": 7})


def check_dim(e):
    if len(e) != DIM:
        raise Err(-33302, "dimension mismatch", {"expected": DIM, "got": len(e)})


def cos(a, b):
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    return 0.0 if na == 0 or nb == 0 else sum(x * y for x, y in zip(a, b)) / (na * nb)


def handle(method, p):
    c = p.get("collection")
    if method == "memory.vector_upsert":
        check_collection(c)
        if c == "readonly":
            raise Err(-33304, "write failed: disk is read-only")
        for r in p["records"]:
            check_dim(r["embedding"])
        for r in p["records"]:
            DATA.setdefault(c, {})[r["id"]] = r
        return {"count": len(p["records"])}
    if method == "memory.vector_search":
        check_collection(c)
        q = p["query"]
        check_dim(q["embedding"])
        rows = [
            {"id": r["id"], "content": r.get("content", ""),
             "score": cos(q["embedding"], r["embedding"]), "metadata": r.get("metadata") or {}}
            for r in DATA.get(c, {}).values()
        ]
        rows.sort(key=lambda m: -m["score"])
        return {"matches": rows[: q.get("limit", 10)]}
    if method == "memory.vector_delete":
        if c == "nodelete":
            raise Err(-32601, "method not found: memory.vector_delete")
        check_collection(c)
        n = sum(1 for i in p["ids"] if DATA.get(c, {}).pop(i, None) is not None)
        return {"count": n}
    raise Err(-32601, f"method not found: {method}")


for raw in sys.stdin:
    msg = json.loads(raw)
    if "id" not in msg:
        continue
    rid, method, params = msg["id"], msg["method"], msg.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"manifest": MANIFEST, "server_version": "pyvec-1"}})
    elif method == "shutdown":
        send({"jsonrpc": "2.0", "id": rid, "result": {"ok": True}})
        break
    else:
        try:
            send({"jsonrpc": "2.0", "id": rid, "result": handle(method, params)})
        except Err as e:
            err = {"code": e.code, "message": e.message}
            if e.data is not None:
                err["data"] = e.data
            send({"jsonrpc": "2.0", "id": rid, "error": err})
