"""An MCP server that is its own OAuth 2.1 authorization server (the SDK's auth routes over an
in-memory provider, after the SDK's own interaction tests), for the OAuth client tests.

``python oauth_app.py --port P [--deny]``: ``/authorize`` grants at once (no login page: the
test's "browser" follows the redirect) — or, with ``--deny``, answers ``access_denied``.
Tool: ``whoami`` (the OAuth client id of the caller).
"""

from __future__ import annotations

import argparse
import secrets
import time

from mcp.server.auth.provider import (AccessToken, AuthorizationCode, AuthorizationParams,
                                      OAuthAuthorizationServerProvider, RefreshToken, construct_redirect_uri)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken


class Provider(OAuthAuthorizationServerProvider[AuthorizationCode, RefreshToken, AccessToken]):
    def __init__(self, issuer: str, deny: bool) -> None:
        self.issuer, self.deny = issuer, deny
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.access: dict[str, AccessToken] = {}

    async def get_client(self, client_id: str):
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client, params: AuthorizationParams) -> str:
        if self.deny:
            return construct_redirect_uri(str(params.redirect_uri), error="access_denied",
                                          error_description="user denied", state=params.state)
        code = AuthorizationCode(code=f"code_{secrets.token_hex(8)}", client_id=client.client_id,
                                 scopes=params.scopes or ["mcp"], expires_at=time.time() + 300,
                                 code_challenge=params.code_challenge, redirect_uri=params.redirect_uri,
                                 redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
                                 resource=params.resource)
        self.codes[code.code] = code
        return construct_redirect_uri(str(params.redirect_uri), code=code.code, state=params.state, iss=self.issuer)

    async def load_authorization_code(self, client, authorization_code: str):
        return self.codes.get(authorization_code)

    def _mint(self, client_id: str, scopes: list[str]) -> OAuthToken:
        access, refresh = f"access_{secrets.token_hex(8)}", f"refresh_{secrets.token_hex(8)}"
        self.access[access] = AccessToken(token=access, client_id=client_id, scopes=scopes,
                                          expires_at=int(time.time()) + 3600)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes)
        return OAuthToken(access_token=access, token_type="Bearer", expires_in=3600, scope=" ".join(scopes),
                          refresh_token=refresh)

    async def exchange_authorization_code(self, client, authorization_code: AuthorizationCode) -> OAuthToken:
        del self.codes[authorization_code.code]
        return self._mint(client.client_id, authorization_code.scopes)

    async def load_access_token(self, token: str):
        return self.access.get(token)

    async def load_refresh_token(self, client, refresh_token: str):
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(self, client, refresh_token: RefreshToken, scopes: list[str]) -> OAuthToken:
        del self.refresh[refresh_token.token]
        return self._mint(client.client_id, scopes or refresh_token.scopes)

    async def revoke_token(self, token) -> None:
        self.access.pop(token.token, None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--deny", action="store_true")
    args = ap.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    provider = Provider(base, args.deny)
    app = MCPServer("we0nb-oauth-test", auth_server_provider=provider, auth=AuthSettings(
        issuer_url=base, resource_server_url=None, required_scopes=["mcp"],
        client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=["mcp"],
                                                              default_scopes=["mcp"])))

    @app.tool()
    def whoami(ctx: Context) -> str:
        """The OAuth client id the call was made with."""
        from mcp.server.auth.middleware.auth_context import get_access_token

        token = get_access_token()
        return token.client_id if token else "(anonymous)"

    app.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
