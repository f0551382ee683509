"""OAuth 2.1 for remote MCP servers (issue 37 item 5): we0nb.mcp.oauth against a real SDK server
that is its own authorization server (tests/mcp_servers/oauth_app.py, a process on 127.0.0.1).
The "browser" is a function that follows the authorization URL's redirects, as a person's would."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from mcpkit import free_port, wait_until

httpx2 = pytest.importorskip("httpx2")

from we0nb.errors import MCPServerError  # noqa: E402
from we0nb.mcp import MCPServer, oauth  # noqa: E402

pytestmark = pytest.mark.timeout(120)

APP = Path(__file__).with_name("mcp_servers") / "oauth_app.py"


def _serve(*extra: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(APP), "--port", str(port), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            assert proc.poll() is None, "the OAuth test server exited"
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        wait_until(listening, 30, "the OAuth test server")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def oauth_url() -> Iterator[str]:
    yield from _serve()


@pytest.fixture
def denying_url() -> Iterator[str]:
    yield from _serve("--deny")


class Browser:
    """Opens the sign-in page and follows its redirects to our 127.0.0.1 listener."""

    def __init__(self) -> None:
        self.opened: list[str] = []

    async def __call__(self, url: str) -> None:
        self.opened.append(url)
        async with httpx2.AsyncClient(follow_redirects=True) as client:
            await client.get(url)


async def test_sign_in_once_then_the_token_file_is_reused(oauth_url: str, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    browser = Browser()
    server = MCPServer.http(oauth_url, auth=oauth.authorization_code(oauth_url, tokens=tokens, open_url=browser))
    async with server:
        client_id = (await server.call_tool("whoami", {}))["result"]
    assert len(browser.opened) == 1 and "code_challenge=" in browser.opened[0]
    assert stat.S_IMODE(os.stat(tokens).st_mode) == 0o600
    assert client_id != "(anonymous)" and client_id in tokens.read_text()
    again = Browser()  # a new session (a new kernel): the stored tokens are used, nobody signs in
    server2 = MCPServer.http(oauth_url, auth=oauth.authorization_code(oauth_url, tokens=tokens, open_url=again))
    async with server2:
        assert (await server2.call_tool("whoami", {}))["result"] == client_id
    assert again.opened == []


async def test_a_refused_sign_in_is_one_line_naming_the_step(denying_url: str) -> None:
    auth = oauth.authorization_code(denying_url, open_url=Browser())
    with pytest.raises(MCPServerError, match=r"authorization failed — OAuth: the authorization server refused the "
                                             r"sign-in \(access_denied: user denied\)\.$"):
        await MCPServer.http(denying_url, auth=auth).connect()


async def test_nobody_signing_in_times_out_with_a_clear_line(oauth_url: str) -> None:
    async def nobody(url: str) -> None:
        return None

    auth = oauth.authorization_code(oauth_url, open_url=nobody, timeout=1)
    with pytest.raises(MCPServerError, match=r"authorization failed — OAuth: nobody completed the sign-in within 1 s"):
        await MCPServer.http(oauth_url, auth=auth).connect()


def test_client_credentials_and_bad_token_storage() -> None:
    auth = oauth.client_credentials("https://example.org/mcp", "worker", "secret", scope="mcp")
    assert isinstance(auth, httpx2.Auth)
    MCPServer.http("https://example.org/mcp", auth=auth)  # accepted as auth=
    with pytest.raises(TypeError, match="tokens=: expected a file path"):
        oauth.authorization_code("https://example.org/mcp", tokens=42)


async def test_workload_identity_trades_the_current_jwt_for_a_token_as_a_public_client() -> None:
    """The jwt-bearer grant (RFC 7523) at the configured issuer's token endpoint: the JWT the
    function returns now, the client id, the resource, and no secret; then the MCP request carries
    the token. A refusal is one line, not retried."""
    issuer, seen = "https://as.example.org", []
    jwts = iter(["jwt-1", "jwt-2"])

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/.well-known/oauth-authorization-server":
            return httpx2.Response(200, json={"issuer": issuer, "token_endpoint": f"{issuer}/token",
                                              "authorization_endpoint": f"{issuer}/authorize",
                                              "response_types_supported": ["code"]})
        if request.url.path == "/token":
            form = dict(x.split("=", 1) for x in request.content.decode().split("&"))
            seen.append(form)
            if form["assertion"] == "jwt-2":
                return httpx2.Response(400, json={"error": "invalid_grant"})
            return httpx2.Response(200, json={"access_token": "tok", "token_type": "Bearer"})
        ok = request.headers.get("authorization") == "Bearer tok"
        return httpx2.Response(200 if ok else 401, json={})

    auth = oauth.workload_identity("https://mcp.example.org/mcp", "workload", lambda: next(jwts), issuer=issuer)
    async with httpx2.AsyncClient(auth=auth, transport=httpx2.MockTransport(handler)) as http:
        assert (await http.post("https://mcp.example.org/mcp")).status_code == 200
    (form,) = seen
    assert form == {"grant_type": "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer", "assertion": "jwt-1",
                    "client_id": "workload", "resource": "https%3A%2F%2Fmcp.example.org%2Fmcp"}
    refused = oauth.workload_identity("https://mcp.example.org/mcp", "workload", lambda: next(jwts), issuer=issuer)
    async with httpx2.AsyncClient(auth=refused, transport=httpx2.MockTransport(handler)) as http:
        with pytest.raises(Exception, match="invalid_grant"):
            await http.post("https://mcp.example.org/mcp")
    assert len(seen) == 2
    with pytest.raises(TypeError, match="assertion="):
        oauth.workload_identity("https://mcp.example.org/mcp", "workload", "", issuer=issuer)


async def test_dpop_binds_the_token_to_a_key_and_answers_a_nonce_challenge() -> None:
    """dpop(auth): the token request carries a proof signed by the key in its header; a DPoP token
    is presented with the DPoP scheme and a proof naming it (ath), a fresh one each request; a
    use_dpop_nonce challenge is answered once, signing again with the server's nonce."""
    import base64
    import hashlib

    import jwt

    issuer, proofs = "https://as.example.org", []

    def proof_of(request: httpx2.Request) -> dict:
        token = request.headers["dpop"]
        header = jwt.get_unverified_header(token)
        key = jwt.algorithms.ECAlgorithm.from_jwk(header["jwk"])
        claims = jwt.decode(token, key, algorithms=["ES256"])
        assert header["typ"] == "dpop+jwt" and "d" not in header["jwk"]
        proofs.append(claims)
        return claims

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/.well-known/oauth-authorization-server":
            return httpx2.Response(200, json={"issuer": issuer, "token_endpoint": f"{issuer}/token",
                                              "authorization_endpoint": f"{issuer}/authorize",
                                              "response_types_supported": ["code"]})
        if request.url.path == "/mcp" and "authorization" not in request.headers:
            return httpx2.Response(401, headers={"WWW-Authenticate": "DPoP"})
        claims = proof_of(request)
        if request.url.path == "/token":
            assert claims["htm"] == "POST" and claims["htu"] == f"{issuer}/token" and "ath" not in claims
            return httpx2.Response(200, json={"access_token": "tok", "token_type": "DPoP"})
        if claims.get("nonce") != "n-1":
            return httpx2.Response(401, headers={"WWW-Authenticate": 'DPoP error="use_dpop_nonce"',
                                                 "DPoP-Nonce": "n-1"})
        assert request.headers["authorization"] == "DPoP tok"
        assert claims["ath"] == base64.urlsafe_b64encode(hashlib.sha256(b"tok").digest()).rstrip(b"=").decode()
        return httpx2.Response(200, json={})

    auth = oauth.dpop(oauth.workload_identity("https://mcp.example.org/mcp?x=1", "workload", "jwt", issuer=issuer))
    assert isinstance(auth, httpx2.Auth)
    async with httpx2.AsyncClient(auth=auth, transport=httpx2.MockTransport(handler)) as http:
        assert (await http.post("https://mcp.example.org/mcp?x=1")).status_code == 200
        assert (await http.post("https://mcp.example.org/mcp?x=1")).status_code == 200
    mcp = [p for p in proofs if p["htu"] == "https://mcp.example.org/mcp"]  # (no query in htu)
    assert len(mcp) >= 3 and [p.get("nonce") for p in mcp[-2:]] == ["n-1", "n-1"]
    assert len({p["jti"] for p in proofs}) == len(proofs)  # a fresh proof each time
