# llm_plugin.py: a native plugin serving LLM providers through llm.chat (nexo §5.y), for plugd's tests (Python 3.11 stdlib only).
"""

Reads ./nexo-plugin.toml for its id and [plugin.extends].llm_providers, and
answers:

  initialize  -> {manifest: {plugin: {id}}, server_version}
  llm.chat    -> by the latest user message (the last message wins for
                 tool results):
    "[error:CODE]"   -> that JSON-RPC error; -33103 carries
                        data.retry_after_secs = 7
    "[tool:NAME]"    -> a tool call of NAME with arguments {"q": <message>}
    "[bad_args]"     -> a tool call "lookup" whose arguments are the text "{nope"
    "[hang]"         -> never answers
    "[bad_chunk]"    -> streams a text_delta chunk without "delta"
    a tool message last -> "tool said: <its content>"
    anything else    -> "echo[<provider>/<model>]: <message>"
                 With params.stream, the answer is first sent as
                 llm.chat.delta chunks (text split into words; tool calls as
                 start, two argument halves, end; then usage and end), and
                 the final result carries empty text.
                 A provider not in llm_providers gets -32602.
  shutdown    -> {ok: true}, then exit 0

stdout is the protocol; diagnostics go to stderr.
"""

import json
import sys
import threading
import tomllib

with open("nexo-plugin.toml", "rb") as f:
    MANIFEST = tomllib.load(f)
PLUGIN_ID = MANIFEST["plugin"]["id"]
PROVIDERS = MANIFEST["plugin"].get("extends", {}).get("llm_providers", [])

_out = sys.stdout
_lock = threading.Lock()


def send(msg):
    msg["jsonrpc"] = "2.0"
    with _lock:
        _out.write(json.dumps(msg) + "\n")
        _out.flush()


def delta(request_id, chunk):
    send({"method": "llm.chat.delta", "params": {"request_id": request_id, "chunk": chunk}})


def latest(messages, role):
    for m in reversed(messages):
        if m.get("role") == role:
            return m.get("content") or ""
    return ""


def chat(rid, params):
    provider = params.get("provider")
    if provider not in PROVIDERS:
        return send({"id": rid, "error": {"code": -32602, "message": f"unknown provider {provider!r}"}})
    model = params.get("model")
    stream = bool(params.get("stream"))
    request = params.get("request") or {}
    messages = request.get("messages") or []
    user = latest(messages, "user")
    usage = {"prompt_tokens": len(messages), "completion_tokens": 3}

    if "[hang]" in user:
        return
    if "[error:" in user:
        code = int(user.split("[error:", 1)[1].split("]", 1)[0])
        error = {"code": code, "message": f"scripted error {code}"}
        if code == -33103:
            error["data"] = {"retry_after_secs": 7}
        return send({"id": rid, "error": error})

    calls = None
    if "[tool:" in user:
        name = user.split("[tool:", 1)[1].split("]", 1)[0]
        calls = [{"id": "call_1", "name": name, "arguments": {"q": user}}]
    elif "[bad_args]" in user:
        calls = [{"id": "call_1", "name": "lookup", "arguments": "{nope"}]

    if calls is not None and not (messages and messages[-1].get("role") == "tool"):
        if stream:
            for c in calls:
                args = c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"])
                half = len(args) // 2
                delta(rid, {"type": "tool_call_start", "id": c["id"], "name": c["name"]})
                delta(rid, {"type": "tool_call_args_delta", "id": c["id"], "delta": args[:half]})
                delta(rid, {"type": "tool_call_args_delta", "id": c["id"], "delta": args[half:]})
                delta(rid, {"type": "tool_call_end", "id": c["id"]})
            delta(rid, {"type": "usage", "usage": usage})
            delta(rid, {"type": "end", "finish_reason": {"kind": "tool_use"}})
            return send({"id": rid, "result": {"content": {"type": "text", "text": ""}}})
        return send({"id": rid, "result": {
            "content": {"type": "tool_calls", "tool_calls": calls},
            "usage": usage,
            "finish_reason": {"kind": "tool_use"},
        }})

    if messages and messages[-1].get("role") == "tool":
        text = "tool said: " + (messages[-1].get("content") or "")
    else:
        text = f"echo[{provider}/{model}]: {user}"

    if stream:
        if "[bad_chunk]" in user:
            delta(rid, {"type": "text_delta"})
        words = text.split(" ")
        for i, w in enumerate(words):
            delta(rid, {"type": "text_delta", "delta": w if i == len(words) - 1 else w + " "})
        delta(rid, {"type": "usage", "usage": usage})
        delta(rid, {"type": "end", "finish_reason": {"kind": "stop"}})
        return send({"id": rid, "result": {
            "content": {"type": "text", "text": ""},
            "usage": usage,
            "finish_reason": {"kind": "stop"},
        }})
    send({"id": rid, "result": {
        "content": {"type": "text", "text": text},
        "usage": usage,
        "finish_reason": {"kind": "stop"},
    }})


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            sys.stderr.write(f"[WARN] not JSON: {line[:80]}\n")
            continue
        method, rid = msg.get("method"), msg.get("id")
        if rid is None:
            continue  # notifications
        if method == "initialize":
            send({"id": rid, "result": {"manifest": {"plugin": {"id": PLUGIN_ID}}, "server_version": "llm-test-0.1"}})
        elif method == "llm.chat":
            chat(rid, msg.get("params") or {})
        elif method == "shutdown":
            send({"id": rid, "result": {"ok": True}})
            sys.exit(0)
        else:
            send({"id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}})


if __name__ == "__main__":
    main()
