# misbehave.py: one configurable hostile native plugin for plugd's integration tests (Python 3.11 stdlib only).
"""

Usage: python3 misbehave.py MODE [ARG]

Reads ./nexo-plugin.toml to learn its id and declared tools and behaves well
except for MODE, which alters exactly one thing. Good behaviour:

  initialize      -> {manifest, server_version, tools}; one catalog entry per
                     declared tool, input_schema {"type": "object"}
  tool.invoke, by tool name suffix after "<id>_" (or "ext_<id>_"):
    echo          -> {"echo": args}
    sleep {ms}    -> sleeps in a thread (other calls proceed), then {"slept_ms": ms}
    crash         -> exits with code 3 without answering
    fail {code, message, data}
                  -> that JSON-RPC error (data only when given)
    pid           -> {"pid": os.getpid(), "pgid": os.getpgid(0)}
    anything else -> -33401 tool not found
  shutdown        -> {ok: true}, then exit 0
  other requests  -> -32601; notifications are ignored; EOF -> exit 0

Modes: good, hang, no_read, junk, huge_line, unknown_ids, duplicate_ids,
wrong_identity [ID], undeclared_tool, unnamespaced_tool, exit_during_init,
slow_init [MS], slow_init_while PATH, ignore_shutdown, stderr_flood,
crash_after_init.
See MODES below for each one. stdout is the protocol: diagnostics go to
stderr only.

A manifest to run it from a plugin directory (tools are all optional):

    [plugin]
    id = "bad"
    version = "0.1.0"
    [plugin.entrypoint]
    command = "python3"
    args = ["/abs/path/to/tests/plugins/misbehave.py", "hang"]
    [plugin.extends]
    tools = ["bad_echo", "bad_sleep", "bad_crash", "bad_fail", "bad_pid"]

In ignore_shutdown mode the grandchild inherits stdin/stdout/stderr, so the
protocol pipe stays open until the whole process group is killed, and the
plugin also ignores EOF on stdin: only SIGKILL ends it.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib

MODES = {
    "good": "behave",
    "hang": "never answer tool.invoke; keep reading and answering the rest",
    "no_read": "after answering initialize, never read stdin again; stay alive",
    "junk": "before every reply, print non-JSON lines and a non-JSON-RPC JSON object",
    "huge_line": "answer the first tool.invoke with one 100 MiB line (in chunks), then behave",
    "unknown_ids": "before every reply, send responses with id 999999 and id \"nope\"",
    "duplicate_ids": "send every reply twice",
    "wrong_identity": "echo plugin.id = ARG (default \"impostor\") in the initialize manifest",
    "undeclared_tool": "advertise an extra tool <id>_extra not in the manifest",
    "unnamespaced_tool": "advertise an extra tool othername_tool",
    "exit_during_init": "on initialize, write a stderr line and exit 7",
    "slow_init": "sleep ARG ms (default 10000) before answering initialize",
    "slow_init_while": "sleep 10 s before answering initialize while the file ARG exists (a host too busy to start it)",
    "ignore_shutdown": "spawn grandchild `sleep 300` (same process group), ignore shutdown and SIGTERM",
    "stderr_flood": "at start, write 1000 stderr lines and one 1 MiB stderr line",
    "crash_after_init": "exit 9 ARG ms (default 0) after answering initialize, last stderr line [ERROR] boom",
}

HUGE_LINE_BYTES = 100 * 1024 * 1024
CHUNK = 1024 * 1024

_out = sys.stdout.buffer
_out_lock = threading.Lock()


def log(level, msg):
    sys.stderr.write(f"[{level}] {msg}\n")
    sys.stderr.flush()


def write_raw(data: bytes):
    with _out_lock:
        _out.write(data)
        _out.flush()


def frame(obj) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


class Plugin:
    def __init__(self, mode, arg):
        self.mode = mode
        self.arg = arg
        with open("nexo-plugin.toml", "rb") as f:
            self.manifest = tomllib.load(f)
        plugin = self.manifest["plugin"]
        self.id = plugin["id"]
        self.version = plugin.get("version", "0.0.0")
        self.declared = list(plugin.get("extends", {}).get("tools", []))
        self.huge_sent = False

    # ---- output -------------------------------------------------------
    def send_reply(self, obj):
        """Every reply goes through here, so reply-level modes apply uniformly."""
        if self.mode == "junk":
            write_raw(b"this line is not json\n{{{ nor is this\n" + frame({"hello": "world", "not": "json-rpc"}))
        if self.mode == "unknown_ids":
            write_raw(
                frame({"jsonrpc": "2.0", "id": 999999, "result": {"bogus": True}})
                + frame({"jsonrpc": "2.0", "id": "nope", "result": {"bogus": True}})
            )
        data = frame(obj)
        if self.mode == "duplicate_ids":
            data += data
        write_raw(data)

    def reply(self, req_id, result):
        self.send_reply({"jsonrpc": "2.0", "id": req_id, "result": result})

    def reply_error(self, req_id, code, message, data=None):
        err = {"code": code, "message": message}
        if data is not None:
            err["data"] = data
        self.send_reply({"jsonrpc": "2.0", "id": req_id, "error": err})

    # ---- lifecycle ----------------------------------------------------
    def initialize(self, req_id):
        if self.mode == "exit_during_init":
            log("ERROR", "exit_during_init: giving up during initialize")
            os._exit(7)
        if self.mode == "slow_init":
            time.sleep(int(self.arg or 10000) / 1000)
        if self.mode == "slow_init_while" and os.path.exists(self.arg or ""):
            time.sleep(10)
        manifest = json.loads(json.dumps(self.manifest))  # deep copy
        if self.mode == "wrong_identity":
            manifest["plugin"]["id"] = self.arg or "impostor"
        names = list(self.declared)
        if self.mode == "undeclared_tool":
            names.append(f"{self.id}_extra")
        if self.mode == "unnamespaced_tool":
            names.append("othername_tool")
        tools = [{"name": n, "description": f"misbehave tool {n}", "input_schema": {"type": "object"}} for n in names]
        self.reply(
            req_id,
            {"manifest": manifest, "server_version": f"{self.id}-{self.version}", "tools": tools},
        )
        if self.mode == "crash_after_init":
            # ARG: milliseconds to live after the reply (default 0).
            time.sleep(int(self.arg or 0) / 1000)
            log("ERROR", "boom")
            os._exit(9)
        if self.mode == "no_read":
            log("INFO", "no_read: not reading stdin any more")
            while True:
                time.sleep(3600)

    def suffix(self, tool):
        for prefix in (f"ext_{self.id}_", f"{self.id}_"):
            if tool.startswith(prefix):
                return tool[len(prefix):]
        return None

    def invoke(self, req_id, params):
        if self.mode == "hang":
            return
        if self.mode == "huge_line" and not self.huge_sent:
            self.huge_sent = True
            self.send_huge(req_id)
            return
        tool = params.get("tool_name")
        args = params.get("args")
        kind = self.suffix(tool) if isinstance(tool, str) else None
        if kind == "echo":
            self.reply(req_id, {"echo": args})
        elif kind == "sleep":
            ms = args.get("ms", 0) if isinstance(args, dict) else 0

            def later():
                time.sleep(ms / 1000)
                self.reply(req_id, {"slept_ms": ms})

            threading.Thread(target=later, daemon=True).start()
        elif kind == "crash":
            log("ERROR", "crash tool called; exiting 3")
            os._exit(3)
        elif kind == "fail":
            a = args if isinstance(args, dict) else {}
            self.reply_error(req_id, a.get("code", -33403), a.get("message", "failed on purpose"), a.get("data"))
        elif kind == "pid":
            self.reply(req_id, {"pid": os.getpid(), "pgid": os.getpgid(0)})
        else:
            self.reply_error(req_id, -33401, f"tool not found: {tool}")

    def send_huge(self, req_id):
        head = json.dumps({"jsonrpc": "2.0", "id": req_id, "result": {"blob": ""}}, separators=(",", ":"))
        prefix, suffix = head[:-3].encode(), head[-3:].encode() + b"\n"  # split inside the "" of blob
        filler = HUGE_LINE_BYTES - len(prefix) - len(suffix)
        log("INFO", f"huge_line: writing a {HUGE_LINE_BYTES}-byte line for id {req_id}")
        with _out_lock:
            _out.write(prefix)
            chunk = b"x" * CHUNK
            while filler > 0:
                n = min(filler, CHUNK)
                _out.write(chunk[:n])
                filler -= n
            _out.write(suffix)
            _out.flush()

    def shutdown(self, req_id):
        if self.mode == "ignore_shutdown":
            log("INFO", "ignore_shutdown: ignoring shutdown")
            return
        self.reply(req_id, {"ok": True})
        sys.exit(0)

    # ---- main loop ----------------------------------------------------
    def start(self):
        if self.mode == "stderr_flood":
            for n in range(1000):
                sys.stderr.write(f"[WARN] line {n}\n")
            sys.stderr.write("[WARN] " + "y" * (1024 * 1024) + "\n")
            sys.stderr.flush()
        if self.mode == "ignore_shutdown":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            grandchild = subprocess.Popen(["sleep", "300"])
            log("INFO", f"grandchild {grandchild.pid}")

    def run(self):
        self.start()
        for raw in sys.stdin.buffer:
            line = raw.strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                log("WARN", f"ignored non-JSON line: {line[:80]!r}")
                continue
            if not isinstance(msg, dict) or not isinstance(msg.get("method"), str):
                log("WARN", f"ignored non-request frame: {line[:80]!r}")
                continue
            if "id" not in msg:
                continue
            req_id, method = msg["id"], msg["method"]
            params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
            if method == "initialize":
                self.initialize(req_id)
            elif method == "tool.invoke":
                self.invoke(req_id, params)
            elif method == "shutdown":
                self.shutdown(req_id)
            else:
                self.reply_error(req_id, -32601, f"method not found: {method}")
        log("INFO", "stdin closed")
        if self.mode == "ignore_shutdown":
            while True:  # ignore EOF too: only a kill ends this one
                time.sleep(3600)


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        log("ERROR", f"usage: misbehave.py MODE [ARG]; MODE is one of {', '.join(MODES)}")
        sys.exit(2)
    mode = sys.argv[1]
    arg = sys.argv[2] if len(sys.argv) > 2 else None
    log("INFO", f"misbehave mode {mode}: {MODES[mode]}")
    Plugin(mode, arg).run()


if __name__ == "__main__":
    main()
