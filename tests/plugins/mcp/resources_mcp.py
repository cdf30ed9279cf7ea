# resources_mcp.py: an MCP server (stdio, Python 3.11 stdlib only) with resources, prompts and completion that lies on request, for plugd's integration tests.
"""
Usage: python3 resources_mcp.py MODE

Good behaviour (MODE "good"):

  initialize        -> capabilities {tools, resources {subscribe, listChanged},
                       prompts {listChanged}, completions}
  resources/list    -> 5 resources, 2 per page (opaque cursors); each keeps
                       title, description, mimeType, size, annotations, icons, _meta
  resources/templates/list -> mem://item/{id}
  resources/read    -> mem://text (text), mem://blob (base64 blob),
                       mem://item/<id> (text "item <id>"); anything else -32002
  resources/subscribe, unsubscribe -> {} (recorded)
  prompts/list      -> greet {name*}
  prompts/get       -> greet: one user message "Hello, <name>!"; no name -32602
  completion/complete -> the values of ["alpha", "alpine", "beta"] starting
                       with argument.value
  tools/call:
    seen            -> structuredContent {"methods": [every request method received]}
    touch {uri}     -> sends notifications/resources/updated {uri}, then answers
    grow            -> adds mem://new, sends notifications/resources/list_changed
    crash           -> exits 3

MODES alter exactly one thing:
"""

import json
import os
import sys

MODES = {
    "good": "behave",
    "no_caps": "declare only tools: no resources, prompts or completions",
    "huge_page": "resources/list answers one page of 20 000 resources",
    "heavy_pages": "resources/list pages of 40 resources with 1 KiB descriptions, 10 pages",
    "endless_pages": "every resources/list page has a new nextCursor",
    "bad_read": "resources/read answers {\"contents\": {\"uri\": ...}} (an object, not an array)",
    "bad_content": "resources/read answers a content with neither text nor blob",
    "bad_prompt": "prompts/get answers messages whose content is a string",
    "silent_read": "never answers resources/read",
    "many_values": "completion/complete answers 150 values",
    "bad_completion": "completion/complete answers {\"completion\": {\"values\": \"alpha\"}}",
    "old": "answers protocol 2024-11-05, which had completion/complete but no completions capability",
}

MODE = sys.argv[1] if len(sys.argv) > 1 else "good"
if MODE not in MODES:
    sys.stderr.write(f"unknown mode {MODE!r}; one of {', '.join(MODES)}\n")
    sys.exit(2)

OBJ = {"type": "object"}
TOOLS = [
    {"name": "seen", "description": "request methods received", "inputSchema": OBJ},
    {"name": "touch", "description": "announce an update", "inputSchema": {
        "type": "object", "properties": {"uri": {"type": "string"}}, "required": ["uri"]}},
    {"name": "grow", "description": "add a resource", "inputSchema": OBJ},
    {"name": "crash", "description": "exit 3", "inputSchema": OBJ},
]

RESOURCES = [
    {"uri": "mem://text", "name": "text", "title": "A text", "description": "plain text",
     "mimeType": "text/plain", "size": 11,
     "annotations": {"audience": ["user"], "priority": 0.5},
     "icons": [{"src": "data:image/png;base64,AAAA", "mimeType": "image/png"}],
     "_meta": {"example.com/origin": "memory"}},
    {"uri": "mem://blob", "name": "blob", "mimeType": "application/octet-stream"},
    {"uri": "mem://a", "name": "a"},
    {"uri": "mem://b", "name": "b"},
    {"uri": "mem://c", "name": "c"},
]

seen = []
subscriptions = set()


def log(*parts):
    sys.stderr.write(" ".join(str(p) for p in parts) + "\n")
    sys.stderr.flush()


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def reply(rid, result):
    send({"jsonrpc": "2.0", "id": rid, "result": result})


def error(rid, code, message):
    send({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})


def notify(method, params=None):
    msg = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    send(msg)


def capabilities():
    if MODE == "no_caps":
        return {"tools": {}}
    if MODE == "old":
        return {"tools": {}, "resources": {"subscribe": True}, "prompts": {}}
    return {
        "tools": {},
        "resources": {"subscribe": True, "listChanged": True},
        "prompts": {"listChanged": True},
        "completions": {},
    }


def resources_list(rid, params):
    cursor = params.get("cursor")
    if MODE == "huge_page":
        reply(rid, {"resources": [{"uri": f"mem://r{i}", "name": f"r{i}"} for i in range(20000)]})
        return
    if MODE == "endless_pages":
        n = int(cursor[1:]) + 1 if cursor else 1
        reply(rid, {"resources": [{"uri": f"mem://p{n}", "name": f"p{n}"}], "nextCursor": f"c{n}"})
        return
    if MODE == "heavy_pages":
        n = int(cursor) if cursor else 0
        page = [{"uri": f"mem://h{n}-{i}", "name": f"h{n}-{i}", "description": "x" * 1024}
                for i in range(40)]
        result = {"resources": page}
        if n < 9:
            result["nextCursor"] = str(n + 1)
        reply(rid, result)
        return
    start = int(cursor.split(":")[1]) if cursor else 0
    page = RESOURCES[start:start + 2]
    result = {"resources": page}
    if start + 2 < len(RESOURCES):
        result["nextCursor"] = f"opaque:{start + 2}"
    reply(rid, result)


def resources_read(rid, params):
    uri = params.get("uri", "")
    if MODE == "silent_read":
        log("not answering resources/read", uri)
        return
    if MODE == "bad_read":
        reply(rid, {"contents": {"uri": uri, "text": "not in an array"}})
        return
    if MODE == "bad_content":
        reply(rid, {"contents": [{"uri": uri, "mimeType": "text/plain"}]})
        return
    if uri == "mem://text":
        reply(rid, {"contents": [{"uri": uri, "mimeType": "text/plain", "text": "hello world",
                                  "_meta": {"example.com/read": 1}}]})
    elif uri == "mem://blob":
        reply(rid, {"contents": [{"uri": uri, "mimeType": "application/octet-stream",
                                  "blob": "AAECAw=="}]})
    elif uri.startswith("mem://item/"):
        reply(rid, {"contents": [{"uri": uri, "mimeType": "text/plain",
                                  "text": f"item {uri[len('mem://item/'):]}"}]})
    elif uri == "mem://new" and any(r["uri"] == "mem://new" for r in RESOURCES):
        reply(rid, {"contents": [{"uri": uri, "text": "new"}]})
    else:
        error(rid, -32002, f"Resource not found: {uri}")


def prompts_get(rid, params):
    name = params.get("name")
    args = params.get("arguments") or {}
    if name != "greet":
        error(rid, -32602, f"unknown prompt: {name}")
        return
    if "name" not in args:
        error(rid, -32602, "missing required argument: name")
        return
    if MODE == "bad_prompt":
        reply(rid, {"messages": [{"role": "user", "content": f"Hello, {args['name']}!"}]})
        return
    reply(rid, {"description": "a greeting",
                "messages": [{"role": "user",
                              "content": {"type": "text", "text": f"Hello, {args['name']}!"}}]})


def complete(rid, params):
    value = (params.get("argument") or {}).get("value", "")
    if MODE == "many_values":
        reply(rid, {"completion": {"values": [f"v{i}" for i in range(150)], "total": 150}})
        return
    if MODE == "bad_completion":
        reply(rid, {"completion": {"values": "alpha"}})
        return
    values = [v for v in ["alpha", "alpine", "beta"] if v.startswith(value)]
    reply(rid, {"completion": {"values": values, "total": len(values), "hasMore": False}})


def call(rid, params):
    name = params.get("name")
    args = params.get("arguments") or {}
    if name == "seen":
        reply(rid, {"content": [{"type": "text", "text": json.dumps(seen)}],
                    "structuredContent": {"methods": list(seen)}})
    elif name == "touch":
        notify("notifications/resources/updated", {"uri": args.get("uri")})
        reply(rid, {"content": [{"type": "text", "text": "touched"}]})
    elif name == "grow":
        if not any(r["uri"] == "mem://new" for r in RESOURCES):
            RESOURCES.append({"uri": "mem://new", "name": "new"})
        reply(rid, {"content": [{"type": "text", "text": "grown"}]})
        notify("notifications/resources/list_changed")
    elif name == "crash":
        log("crashing on purpose")
        os._exit(3)
    else:
        error(rid, -32602, f"unknown tool: {name}")


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method = msg.get("method")
        rid = msg.get("id")
        params = msg.get("params") or {}
        if method is None or rid is None:
            continue
        seen.append(method)
        if method == "initialize":
            reply(rid, {"protocolVersion": "2024-11-05" if MODE == "old" else "2025-11-25", "capabilities": capabilities(),
                        "serverInfo": {"name": "resources", "version": "1.0.0"}})
        elif method == "ping":
            reply(rid, {})
        elif method == "tools/list":
            reply(rid, {"tools": TOOLS})
        elif method == "tools/call":
            call(rid, params)
        elif method == "resources/list":
            resources_list(rid, params)
        elif method == "resources/templates/list":
            reply(rid, {"resourceTemplates": [
                {"uriTemplate": "mem://item/{id}", "name": "item", "title": "An item",
                 "mimeType": "text/plain"}]})
        elif method == "resources/read":
            resources_read(rid, params)
        elif method in ("resources/subscribe", "resources/unsubscribe"):
            uri = params.get("uri")
            if method == "resources/subscribe":
                subscriptions.add(uri)
            else:
                subscriptions.discard(uri)
            reply(rid, {})
        elif method == "prompts/list":
            reply(rid, {"prompts": [{"name": "greet", "title": "Greet", "description": "says hello",
                                     "arguments": [{"name": "name", "required": True}]}]})
        elif method == "prompts/get":
            prompts_get(rid, params)
        elif method == "completion/complete":
            complete(rid, params)
        else:
            error(rid, -32601, f"method not found: {method}")


if __name__ == "__main__":
    main()
