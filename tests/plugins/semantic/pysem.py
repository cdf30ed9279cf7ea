# pysem: a native plugin in plain Python for the semantic-recall tests. It
# serves the plugd extension `embed.texts` ({texts} -> {embeddings}) and a
# vector memory backend (nexo §5.w, filters by metadata equality), records in
# memory. Embeddings count words of four concepts (pets, money, travel, food)
# so "feline" is near "kitten" while sharing no word with it; the same
# vocabulary as the HTTP double in crates/plugd/tests/it/semantic.rs.
# Hostile texts: "[short]" answers no embeddings, "[words]" answers strings.

import json
import math
import re
import sys
import tomllib
from pathlib import Path

MANIFEST = tomllib.loads((Path(__file__).resolve().parent / "nexo-plugin.toml").read_text())
CONCEPTS = [
    {"cat", "cats", "kitten", "kittens", "feline", "dog", "dogs", "puppy"},
    {"invoice", "invoices", "payment", "billing", "tax", "bill", "overdue"},
    {"flight", "trip", "airport", "plane", "travel"},
    {"pizza", "dinner", "lunch", "food"},
]
DATA = {}


def embed(text):
    words = re.findall(r"[a-z]+", text.lower())
    return [float(sum(1 for w in words if w in c)) for c in CONCEPTS]


def send(frame):
    sys.stdout.write(json.dumps(frame) + "\n")
    sys.stdout.flush()


class Err(Exception):
    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def cos(a, b):
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    return 0.0 if na == 0 or nb == 0 else sum(x * y for x, y in zip(a, b)) / (na * nb)


def handle(method, p):
    if method == "embed.texts":
        texts = p["texts"]
        if any("[short]" in t for t in texts):
            return {"embeddings": []}
        if any("[words]" in t for t in texts):
            return {"embeddings": [["a", "b"] for _ in texts]}
        return {"embeddings": [embed(t) for t in texts]}
    c = p.get("collection")
    if method == "memory.vector_upsert":
        for r in p["records"]:
            DATA.setdefault(c, {})[r["id"]] = r
        return {"count": len(p["records"])}
    if method == "memory.vector_search":
        if c not in DATA:
            raise Err(-33301, "collection not found", {"collection": c})
        q = p["query"]
        flt = q.get("filter") or {}
        rows = [
            {"id": r["id"], "content": r.get("content", ""),
             "score": cos(q["embedding"], r["embedding"]), "metadata": r.get("metadata") or {}}
            for r in DATA[c].values()
            if all((r.get("metadata") or {}).get(k) == v for k, v in flt.items())
        ]
        rows.sort(key=lambda m: -m["score"])
        return {"matches": rows[: q.get("limit", 10)]}
    if method == "memory.vector_delete":
        n = sum(1 for i in p["ids"] if DATA.get(c, {}).pop(i, None) is not None)
        return {"count": n}
    raise Err(-32601, f"method not found: {method}")


for raw in sys.stdin:
    msg = json.loads(raw)
    if "id" not in msg:
        continue
    rid, method, params = msg["id"], msg["method"], msg.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"manifest": MANIFEST, "server_version": "pysem-1"}})
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
