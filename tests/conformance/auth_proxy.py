"""A loopback HTTP proxy that adds plugd's bearer token, for scripts/conformance.

It exists only because the official MCP conformance runner
(@modelcontextprotocol/conformance) cannot send credentials, and plugd never
serves MCP unauthenticated. It adds `Authorization: Bearer <token>` to every
request and forwards everything else unchanged: method, path and query, body,
and every end-to-end header including Host and Origin (so plugd's own
Host/Origin checks are what the dns-rebinding scenario sees). Responses are
streamed back as they arrive, never buffered, so SSE (`text/event-stream`)
responses reach the runner event by event. Hop-by-hop headers are not
forwarded (RFC 9110 7.6.1); each client connection serves one request.

Usage: auth_proxy.py --listen 127.0.0.1:0 --upstream-file F --token-file T

Prints `auth proxy listening on http://HOST:PORT` once bound. The upstream
`HOST:PORT` (plugd serve's address) and the token are read from their files
at the first request, so the proxy can be bound, and its port put in
plugd.yaml's `http.allowed_hosts`, before plugd serve starts. The token
comes from a file (mode 0600), never from the command line.

Standard library only.
"""

import argparse
import http.client
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}

# Long enough for a tool call that waits on the client (elicitation, approval).
UPSTREAM_TIMEOUT = 300


class Config:
    upstream_file: Path
    token_file: Path
    upstream: str | None = None
    token: str | None = None

    @classmethod
    def load(cls) -> tuple[str, str] | None:
        if cls.upstream is None or cls.token is None:
            try:
                upstream = cls.upstream_file.read_text().strip()
                token = cls.token_file.read_text().strip()
            except FileNotFoundError:
                return None
            if not upstream or not token:
                return None
            cls.upstream, cls.token = upstream, token
        return cls.upstream, cls.token


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_any(self) -> None:
        self.close_connection = True
        config = Config.load()
        if config is None:
            self.send_error(503, "auth proxy: upstream not ready (no upstream or token file yet)")
            return
        upstream, token = config
        body = self.read_body()
        conn = http.client.HTTPConnection(upstream, timeout=UPSTREAM_TIMEOUT)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            connection_tokens = {
                t.strip().lower() for v in self.headers.get_all("Connection", []) for t in v.split(",")
            }
            for name, value in self.headers.items():
                lname = name.lower()
                if lname in HOP_BY_HOP or lname in connection_tokens or lname in ("authorization", "content-length"):
                    continue
                conn.putheader(name, value)
            conn.putheader("Authorization", f"Bearer {token}")
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            self.send_error(502, f"auth proxy: upstream {upstream}: {e}")
            return
        try:
            self.relay(resp)
        finally:
            conn.close()

    def read_body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = self.headers.get("Content-Length")
        if length is None:
            return None
        return self.rfile.read(int(length))

    def relay(self, resp: http.client.HTTPResponse) -> None:
        """Status and headers, then the body as it arrives (the connection
        closes after it, which ends a body of unknown length)."""
        self.send_response_only(resp.status, resp.reason)
        connection_tokens = {t.strip().lower() for v in resp.headers.get_all("Connection", []) for t in v.split(",")}
        for name, value in resp.headers.items():
            lname = name.lower()
            if lname in HOP_BY_HOP or lname in connection_tokens:
                continue
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command == "HEAD":
            return
        try:
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                self.wfile.write(chunk)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the runner went away (it closes SSE streams it is done with)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = do_OPTIONS = do_any

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("auth proxy: %s %s\n" % (self.address_string(), format % args))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:0", help="loopback HOST:PORT to bind (port 0: any free port)")
    ap.add_argument("--upstream-file", type=Path, required=True, help="file holding plugd serve's HOST:PORT")
    ap.add_argument("--token-file", type=Path, required=True, help="file holding the bearer token to add")
    args = ap.parse_args()
    host, _, port = args.listen.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        ap.error(f"--listen {args.listen!r}: the proxy adds a credential, so it binds loopback only")
    Config.upstream_file = args.upstream_file
    Config.token_file = args.token_file
    server = ThreadingHTTPServer((host, int(port)), Proxy)
    server.daemon_threads = True
    bound_host, bound_port = server.server_address[:2]
    print(f"auth proxy listening on http://{bound_host}:{bound_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
