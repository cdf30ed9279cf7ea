# sandbox_probe.py: a native plugin for plugd's sandbox tests (Python 3 stdlib only).
"""

Usage: python3 sandbox_probe.py ID [escape PIDFILE]

With `escape PIDFILE` (and PIDFILE not there yet) it first leaves three
`sleep 1000` processes behind: one forked child that stays in its process
group, one that calls setsid(), and one double-forked grandchild that calls
setsid() (its parent exits after 1.5 s); their pids go to PIDFILE.

Serves one tool, ID_probe, that tries one thing and reports what happened:

  {"op": "read", "path": P}        -> {"ok": true, "bytes": N} or {"ok": false, "error": "..."}
  {"op": "list", "path": P}        -> directory listing, or the error
  {"op": "write", "path": P}       -> writes "x" to P
  {"op": "connect", "port": N}     -> TCP connect to 127.0.0.1:N
  {"op": "env", "name": K}         -> {"ok": true, "value": os.environ.get(K)}
  {"op": "alloc", "mb": N}         -> allocates N MiB
  {"op": "open_many", "n": N}      -> opens N file descriptors at once
  {"op": "signal_parent"}          -> signal 0 to its parent (plugd)
  {"op": "burn"}                   -> spins the CPU until killed
  {"op": "whoami"}                 -> uid, gid, pid
  {"op": "append", "path": P, "text": T} -> appends T to P
  {"op": "die", "signal": N}       -> kills itself with signal N (no reply)
  {"op": "environ_of", "pid": N}   -> reads /proc/N/environ: whether
                                      PLUGD_MASTER_KEY is in it
  {"op": "unix_get", "path": S, "target": T}
                                   -> connects to the Unix socket S, sends
                                      `GET T` (HTTP/1.1) and returns the
                                      reply's status line
  {"op": "parent_environ"}         -> reads /proc/<parent>/environ (plugd's):
                                      whether PLUGD_MASTER_KEY is in it

Errors are reported as "ErrorClass: [Errno N] message" (str of the
exception), so tests can assert the exact errno text. stdout is the
protocol; nothing else is printed there.
"""

import json
import os
import socket
import sys


def reply(req_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req_id, "result": result}) + "\n")
    sys.stdout.flush()


def failure(e):
    return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def probe(args):
    op = args.get("op")
    try:
        if op == "read":
            with open(args["path"], "rb") as f:
                return {"ok": True, "bytes": len(f.read())}
        if op == "list":
            return {"ok": True, "entries": sorted(os.listdir(args["path"]))}
        if op == "write":
            with open(args["path"], "w") as f:
                f.write("x")
            return {"ok": True}
        if op == "connect":
            s = socket.create_connection(("127.0.0.1", int(args["port"])), timeout=3)
            s.close()
            return {"ok": True}
        if op == "env":
            return {"ok": True, "value": os.environ.get(args["name"])}
        if op == "alloc":
            block = bytearray(int(args["mb"]) * 1024 * 1024)
            return {"ok": True, "bytes": len(block)}
        if op == "open_many":
            files = [open("/dev/null") for _ in range(int(args["n"]))]
            for f in files:
                f.close()
            return {"ok": True}
        if op == "signal_parent":
            os.kill(os.getppid(), 0)
            return {"ok": True}
        if op == "burn":
            while True:
                pass
        if op == "parent_environ":
            with open(f"/proc/{os.getppid()}/environ", "rb") as f:
                env = f.read()
            return {"ok": True, "has_master_key": b"PLUGD_MASTER_KEY=" in env}
        if op == "die":
            os.kill(os.getpid(), int(args["signal"]))
        if op == "append":
            with open(args["path"], "a") as f:
                f.write(args["text"])
            return {"ok": True}
        if op == "environ_of":
            with open(f"/proc/{int(args['pid'])}/environ", "rb") as f:
                env = f.read()
            return {"ok": True, "has_master_key": b"PLUGD_MASTER_KEY=" in env}
        if op == "unix_get":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(args["path"])
            s.sendall(f"GET {args['target']} HTTP/1.1\r\nHost: plugd\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            s.close()
            return {"ok": True, "status": data.split(b"\r\n", 1)[0].decode("latin-1")}
        if op == "whoami":
            return {"ok": True, "uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid()}
        return {"ok": False, "error": f"unknown op {op!r}"}
    except Exception as e:  # the error text is the result
        return failure(e)


def sleeper(new_session):
    if new_session:
        os.setsid()
    os.execvp("sleep", ["sleep", "1000"])


def escape(pidfile):
    if os.path.exists(pidfile):
        return
    pids = []
    for new_session in (False, True):
        child = os.fork()
        if child == 0:
            sleeper(new_session)
        pids.append(child)
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        grandchild = os.fork()
        if grandchild == 0:
            sleeper(True)
        os.write(w, str(grandchild).encode())
        import time
        time.sleep(1.5)
        os._exit(0)
    os.close(w)
    pids.append(int(os.read(r, 32)))
    os.waitpid(middle, 0)
    with open(pidfile + ".part", "w") as f:
        f.write(" ".join(str(p) for p in pids))
    os.rename(pidfile + ".part", pidfile)


def main():
    pid = sys.argv[1]
    if len(sys.argv) > 3 and sys.argv[2] == "escape":
        escape(sys.argv[3])
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "id" not in msg:
            continue
        method, req_id = msg.get("method"), msg["id"]
        params = msg.get("params") or {}
        if method == "initialize":
            tools = [{"name": f"{pid}_probe", "description": "probe the sandbox", "input_schema": {"type": "object"}}]
            manifest = {"plugin": {"id": pid, "version": "0.1.0"}}
            reply(req_id, {"manifest": manifest, "server_version": f"{pid}-0.1.0", "tools": tools})
        elif method == "tool.invoke":
            reply(req_id, probe(params.get("args") or {}))
        elif method == "shutdown":
            reply(req_id, {"ok": True})
            return
        else:
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32601, "message": "method not found"}}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
