"""A remote MCP server for plugd's tests: the official Python `mcp` SDK's
Streamable HTTP server, with the SDK's own OAuth 2.1 authorization server
(dynamic registration, PKCE, refresh) in the same process, on loopback.

The authorization endpoint approves at once (no login page: the "user" of
the test is whoever fetches the URL plugd prints). `--token-ttl` makes
access tokens expire quickly so refresh is exercised; `--no-auth` serves
without authorization and `--header NAME=VALUE` requires a static header
instead. GET /stats reports what the server saw, for the test to assert
(`tokens_seen`: a short hash of the token of each accepted request).

Prints `url: http://127.0.0.1:PORT/mcp` on stdout once it listens.
"""

import argparse
import asyncio
import hashlib
import secrets
import socket
import sys
import time

import uvicorn
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse

STATS = {
    "registrations": 0,
    "codes": 0,
    "refreshes": 0,
    "resources": [],
    "rejected_tokens": 0,
    "header_misses": 0,
    "tokens_seen": [],
}


class Provider:
    """An in-memory authorization server that approves every request."""

    def __init__(self, ttl: int):
        self.ttl = ttl
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}

    async def get_client(self, client_id):
        return self.clients.get(client_id)

    async def register_client(self, client_info):
        STATS["registrations"] += 1
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client, params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(32)
        STATS["resources"].append(params.resource)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client, authorization_code):
        return self.codes.get(authorization_code)

    def _issue(self, client_id, scopes, resource) -> OAuthToken:
        at = "at-" + secrets.token_urlsafe(24)
        rt = "rt-" + secrets.token_urlsafe(24)
        self.access[at] = AccessToken(
            token=at,
            client_id=client_id,
            scopes=scopes,
            expires_at=int(time.time()) + self.ttl,
            resource=resource,
        )
        self.refresh[rt] = RefreshToken(token=rt, client_id=client_id, scopes=scopes, resource=resource)
        return OAuthToken(access_token=at, expires_in=self.ttl, scope=" ".join(scopes), refresh_token=rt)

    async def exchange_authorization_code(self, client, authorization_code):
        STATS["codes"] += 1
        self.codes.pop(authorization_code.code, None)
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client, refresh_token):
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(self, client, refresh_token, scopes):
        STATS["refreshes"] += 1
        self.refresh.pop(refresh_token.token, None)
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token):
        t = self.access.get(token)
        if t is None or (t.expires_at is not None and t.expires_at < time.time()):
            STATS["rejected_tokens"] += 1
            return None
        # Which token each accepted request carried (a short hash).
        STATS["tokens_seen"].append(hashlib.sha256(token.encode()).hexdigest()[:12])
        return t

    async def revoke_token(self, token):
        self.access.pop(getattr(token, "token", ""), None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--token-ttl", type=int, default=3600)
    ap.add_argument("--no-auth", action="store_true")
    ap.add_argument("--header", default=None, help="NAME=VALUE every request must carry")
    ap.add_argument("--json-response", action="store_true")
    args = ap.parse_args()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue until uvicorn accepts them
    port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"

    kwargs = {}
    if not args.no_auth:
        kwargs["auth_server_provider"] = Provider(args.token_ttl)
        kwargs["auth"] = AuthSettings(
            issuer_url=base,
            resource_server_url=f"{base}/mcp",
            client_registration_options=ClientRegistrationOptions(
                enabled=True, valid_scopes=["mcp:tools"], default_scopes=["mcp:tools"]
            ),
            required_scopes=["mcp:tools"],
        )
    mcp = MCPServer("remote-fixture", **kwargs)

    @mcp.tool()
    async def echo(text: str) -> str:
        """Echo the text back."""
        return f"remote echo: {text}"

    @mcp.tool()
    async def count(n: int, ctx: Context) -> str:
        """Count to n with progress, 50 ms a step."""
        for i in range(1, n + 1):
            await ctx.report_progress(i, n)
            await asyncio.sleep(0.05)
        return f"counted to {n}"

    @mcp.custom_route("/stats", methods=["GET"])
    async def stats(request: Request):
        return JSONResponse(STATS)

    app = mcp.streamable_http_app(json_response=args.json_response)

    if args.header:
        name, _, value = args.header.partition("=")
        inner = app

        async def guarded(scope, receive, send):
            if scope["type"] == "http" and scope["path"].startswith("/mcp"):
                got = dict(scope["headers"]).get(name.lower().encode())
                if got != value.encode():
                    STATS["header_misses"] += 1
                    await PlainTextResponse("missing or wrong header", status_code=403)(scope, receive, send)
                    return
            await inner(scope, receive, send)

        app = guarded

    print(f"url: {base}/mcp", flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    sys.exit(main())
