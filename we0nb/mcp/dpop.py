"""DPoP (RFC 9449): access tokens bound to a key this process holds, so a stolen token is useless.

:func:`dpop` wraps an OAuth ``auth=`` (``we0nb.mcp.oauth``'s, or the SDK's providers): the
wrapped flow runs as before, and on the way out this layer

- signs a fresh proof (a JWT: ``typ`` ``dpop+jwt``, ES256, the public key in its header; the
  request's method and URL, a new ``jti``, ``iat``) into the ``DPoP`` header of every token
  request, so the authorization server binds the token to the key;
- presents a DPoP-bound token (``token_type: DPoP``) as ``Authorization: DPoP <token>`` with a
  proof that also carries the token's hash (``ath``) on every request to the MCP server;
- answers a ``use_dpop_nonce`` challenge (the token endpoint's 400, the MCP server's 401, each
  with a ``DPoP-Nonce`` header) by signing again with the server's nonce, once per request.

The key lives in memory: tokens kept in a file (``tokens=``) outlive it, so a new process signs
in again where the server checks the binding.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from typing import Any, AsyncGenerator, Optional
from urllib.parse import urlsplit, urlunsplit

import httpx2  # (the mcp extra's HTTP client: this module is imported only by an OAuth auth=)

__all__ = ["dpop", "DPoPAuth"]



def dpop(auth: Any) -> "DPoPAuth":
    """``auth`` (an OAuth ``httpx2.Auth``) with its tokens bound to a fresh ES256 key (DPoP)."""
    return DPoPAuth(auth)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _htu(url: Any) -> str:
    """The URL a proof names: no query, no fragment (RFC 9449 §4.2)."""
    parts = urlsplit(str(url))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _is_token_request(request: Any) -> bool:
    """A form POST with a ``grant_type``: what the OAuth flows send to a token endpoint."""
    from urllib.parse import parse_qs

    if request.method != "POST" or not request.headers.get("content-type", "").startswith(
            "application/x-www-form-urlencoded"):
        return False
    return "grant_type" in parse_qs(request.content.decode("latin-1"))


def _origin(url: Any) -> str:
    parts = urlsplit(str(url))
    return f"{parts.scheme}://{parts.netloc}"


class DPoPAuth(httpx2.Auth):
    """An ``httpx2.Auth`` (see :func:`dpop`); ``inner`` is the OAuth flow it wraps."""

    requires_response_body = True

    def __init__(self, inner: Any) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec
        from jwt.algorithms import ECAlgorithm

        self.inner = inner
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._jwk = json.loads(ECAlgorithm.to_jwk(self._key.public_key()))
        #: the latest nonce each server (origin) gave
        self._nonces: dict[str, str] = {}
        #: the access tokens the authorization server bound to our key
        self._bound: set[str] = set()

    def proof(self, method: str, url: Any, token: Optional[str] = None) -> str:
        """A fresh proof for one request (``token``: the access token it presents)."""
        import jwt

        claims: dict[str, Any] = {"jti": uuid.uuid4().hex, "htm": method, "htu": _htu(url), "iat": int(time.time())}
        nonce = self._nonces.get(_origin(url))
        if nonce is not None:
            claims["nonce"] = nonce
        if token is not None:
            claims["ath"] = _b64(hashlib.sha256(token.encode("ascii")).digest())
        return jwt.encode(claims, self._key, algorithm="ES256", headers={"typ": "dpop+jwt", "jwk": self._jwk})

    def _sign(self, request: Any) -> bool:
        """Put a proof on ``request`` (and the DPoP scheme on a bound token); whether it needs one."""
        if _is_token_request(request):
            request.headers["DPoP"] = self.proof(request.method, request.url)
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() in ("bearer", "dpop") and token in self._bound:
            request.headers["Authorization"] = f"DPoP {token}"
            request.headers["DPoP"] = self.proof(request.method, request.url, token)
            return True
        return False

    async def _challenged(self, request: Any, response: Any) -> bool:
        """Whether ``response`` asks for a nonce (kept for the next proof to that server)."""
        nonce = response.headers.get("dpop-nonce")
        if nonce:
            self._nonces[_origin(request.url)] = nonce
        if not nonce or response.status_code not in (400, 401):
            return False
        if "use_dpop_nonce" in response.headers.get("www-authenticate", ""):
            return True
        await response.aread()
        return b"use_dpop_nonce" in response.content[:2000]

    async def _as_bearer(self, response: Any) -> Any:
        """A token response whose DPoP-bound token the wrapped flow can keep (the SDK's token
        model knows only ``Bearer``); the binding is remembered here."""
        await response.aread()
        try:
            body = json.loads(response.content)
        except ValueError:
            return response
        if not isinstance(body, dict) or str(body.get("token_type", "")).lower() != "dpop":
            return response
        self._bound.add(str(body.get("access_token")))
        body["token_type"] = "Bearer"
        headers = [(k, v) for k, v in response.headers.items() if k.lower() not in ("content-length", "content-encoding")]
        return httpx2.Response(response.status_code, headers=headers, content=json.dumps(body).encode(),
                               request=response.request)

    async def async_auth_flow(self, request: Any) -> AsyncGenerator[Any, Any]:
        flow = self.inner.async_auth_flow(request)
        try:
            outgoing = await flow.__anext__()
            while True:
                signed = self._sign(outgoing)
                response = yield outgoing
                if signed and await self._challenged(outgoing, response):
                    self._sign(outgoing)  # (again, with the nonce: a new jti)
                    response = yield outgoing
                if response.status_code == 200 and _is_token_request(outgoing):
                    response = await self._as_bearer(response)
                try:
                    outgoing = await flow.asend(response)
                except StopAsyncIteration:
                    return
        finally:
            await flow.aclose()  # (in this task: the wrapped flow may hold a lock)

    def sync_auth_flow(self, request: Any) -> Any:
        raise RuntimeError("DPoP (we0nb.mcp.dpop) works with the async HTTP client MCPServer.http uses.")
