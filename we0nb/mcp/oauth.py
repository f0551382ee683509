"""OAuth 2.1 for remote MCP servers, built on the SDK's providers: give the result to
``MCPServer.http(url, auth=...)``.

- :func:`authorization_code` — a person signs in: the authorization URL is printed (and
  opened in a browser when one is available), the redirect is caught on ``127.0.0.1`` by a
  one-shot listener, and the tokens are kept in a JSON file you name (``tokens=``), so the
  next session — or kernel — reuses and refreshes them without asking again.
- :func:`client_credentials` — a headless worker with a client id and secret.
- :func:`dpop` — any of them with its tokens bound to a key this process holds (DPoP, RFC 9449;
  :mod:`we0nb.mcp.dpop`).
- :func:`workload_identity` — a workload whose platform vouches for it with a signed JWT (a
  Kubernetes service account token, a cloud's identity token): the RFC 7523 jwt-bearer grant,
  no secret kept anywhere (workload identity federation, SEP-1933).

Both return an ``httpx2.Auth`` (the SDK's ``OAuthClientProvider``): discovery, dynamic client
registration, PKCE, refresh and the ``resource`` parameter are the SDK's. A step that fails
(the server refuses, or the user never comes back within ``timeout``) is one line naming it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import webbrowser
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, Union
from urllib.parse import parse_qs, urlsplit

__all__ = ["FileTokenStorage", "MemoryTokenStorage", "authorization_code", "client_credentials", "dpop",
           "workload_identity", "OAuthError"]

PathLike = Union[str, "os.PathLike[str]"]


class OAuthError(RuntimeError):
    """One step of an OAuth flow failed (the message names the step and what to do)."""


class MemoryTokenStorage:
    """Tokens and client registration kept in this process only (the SDK's ``TokenStorage``)."""

    def __init__(self) -> None:
        self.tokens: Any = None
        self.client_info: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client_info

    async def set_client_info(self, client_info: Any) -> None:
        self.client_info = client_info


class FileTokenStorage(MemoryTokenStorage):
    """Tokens and client registration in a JSON file (created with mode 0600), read at start."""

    def __init__(self, path: PathLike) -> None:
        super().__init__()
        from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

        self.path = Path(path).expanduser()
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self.tokens = OAuthToken.model_validate(data["tokens"]) if data.get("tokens") else None
                self.client_info = (OAuthClientInformationFull.model_validate(data["client_info"])
                                    if data.get("client_info") else None)
            except (ValueError, KeyError, TypeError) as e:
                raise OAuthError(f"OAuth token file {self.path} cannot be read ({type(e).__name__}: {e}); "
                                 "delete it to sign in again.") from None

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens
        self._save()

    async def set_client_info(self, client_info: Any) -> None:
        self.client_info = client_info
        self._save()

    def _save(self) -> None:
        dump = {k: v.model_dump(mode="json", exclude_none=True) if v is not None else None
                for k, v in (("tokens", self.tokens), ("client_info", self.client_info))}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dump, f)
        os.replace(tmp, self.path)


def _storage(tokens: Any) -> MemoryTokenStorage:
    if tokens is None:
        return MemoryTokenStorage()
    if isinstance(tokens, (str, os.PathLike)):
        return FileTokenStorage(tokens)
    if all(hasattr(tokens, m) for m in ("get_tokens", "set_tokens", "get_client_info", "set_client_info")):
        return tokens
    raise TypeError("tokens=: expected a file path, None (kept in memory), or a TokenStorage object.")


class _Loopback:
    """A one-shot HTTP listener on 127.0.0.1 that catches the authorization redirect."""

    def __init__(self, port: int, timeout: float) -> None:
        self.port = port
        self.timeout = timeout
        self._server: Optional[asyncio.AbstractServer] = None
        self._result: Optional[asyncio.Future[dict[str, list[str]]]] = None

    async def start(self) -> None:
        await self.stop()
        self._result = asyncio.get_running_loop().create_future()
        try:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        except OSError as e:
            raise OAuthError(f"OAuth: cannot listen for the redirect on 127.0.0.1:{self.port} ({e}); pass another "
                             "port= (or free this one).") from None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await asyncio.wait_for(reader.readline(), 10)).decode("latin-1")
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.split(" ")
            query = parse_qs(urlsplit(parts[1]).query) if len(parts) > 1 else {}
            ok = "code" in query
            body = (b"Signed in. You can close this tab and go back to the notebook." if ok else
                    b"Sign-in did not complete: " + (query.get("error", ["no code"])[0]).encode()[:200])
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            if self._result is not None and not self._result.done() and ("code" in query or "error" in query):
                self._result.set_result(query)
        except (asyncio.TimeoutError, OSError, UnicodeError):
            pass
        finally:
            writer.close()

    async def wait(self) -> Any:
        from mcp.shared.auth import AuthorizationCodeResult

        assert self._result is not None
        try:
            query = await asyncio.wait_for(asyncio.shield(self._result), self.timeout)
        except asyncio.TimeoutError:
            raise OAuthError(f"OAuth: nobody completed the sign-in within {self.timeout:g} s (the redirect to "
                             f"127.0.0.1:{self.port} never came); call the server again to retry.") from None
        finally:
            await self.stop()
        if "error" in query:
            why = query.get("error_description", query["error"])[0]
            raise OAuthError(f"OAuth: the authorization server refused the sign-in ({query['error'][0]}: {why}).")
        first = {k: v[0] for k, v in query.items()}
        return AuthorizationCodeResult(code=first["code"], state=first.get("state"), iss=first.get("iss"))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None


def _print_and_open(url: str) -> None:
    print(f"Sign in to the MCP server: {url}", file=sys.stderr if "ipykernel" not in sys.modules else sys.stdout)
    try:
        webbrowser.open(url)
    except Exception:  # no browser here: the printed link is enough
        pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def authorization_code(url: str, *, tokens: Any = None, scope: Optional[str] = None, client_name: str = "we0nb",
                       port: Optional[int] = None, timeout: float = 300.0,
                       open_url: Optional[Callable[[str], Union[None, Awaitable[None]]]] = None,
                       client_metadata_url: Optional[str] = None) -> Any:
    """An ``auth=`` for a server that needs a person to sign in (OAuth 2.1 authorization code + PKCE).

    ``tokens``: a JSON file that keeps the tokens and the client registration (reused and
    refreshed next time), None to keep them in memory, or a ``TokenStorage``. ``port``: where
    the redirect is caught (default: the port registered before, else a free one).
    ``open_url(url)``: shows the sign-in page (default: print it and open a browser).
    ``client_metadata_url``: an HTTPS URL of this client's metadata document, used as its
    client id where the authorization server supports that (else it registers dynamically).
    """
    from mcp.client.auth import OAuthClientProvider
    from mcp.shared.auth import OAuthClientMetadata

    storage = _storage(tokens)
    if port is None:
        known = getattr(getattr(storage, "client_info", None), "redirect_uris", None) or ()
        port = next((urlsplit(str(u)).port for u in known if urlsplit(str(u)).hostname == "127.0.0.1"), None)
    loopback = _Loopback(port or _free_port(), timeout)
    show = open_url or _print_and_open

    async def redirect(auth_url: str) -> None:
        await loopback.start()
        shown = show(auth_url)
        if asyncio.iscoroutine(shown):
            await shown

    metadata = OAuthClientMetadata.model_validate({
        "client_name": client_name, "redirect_uris": [f"http://127.0.0.1:{loopback.port}/callback"],
        "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"], "scope": scope})
    return OAuthClientProvider(url, metadata, storage, redirect_handler=redirect, callback_handler=loopback.wait,
                               client_metadata_url=client_metadata_url)


def client_credentials(url: str, client_id: str, client_secret: str, *, tokens: Any = None,
                       scope: Optional[str] = None, issuer: Optional[str] = None) -> Any:
    """An ``auth=`` for a headless worker: the OAuth client credentials grant (no person involved)."""
    import warnings

    from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider

    with warnings.catch_warnings():  # (issuer=None is deprecated by the SDK; the warning says nothing new here)
        warnings.simplefilter("ignore")
        return ClientCredentialsOAuthProvider(url, _storage(tokens), client_id, client_secret, scope=scope,
                                              issuer=issuer)


def workload_identity(url: str, client_id: str, assertion: Union[str, Callable[[], Union[str, Awaitable[str]]]], *,
                      issuer: str, tokens: Any = None, scope: Optional[str] = None) -> Any:
    """An ``auth=`` for a workload that proves who it is with a JWT its platform signed (workload
    identity federation): the jwt-bearer grant (RFC 7523) at ``issuer``'s token endpoint, as the
    public client ``client_id``. ``assertion``: the JWT, or a function returning the current one
    (sync or async: platforms rotate them, e.g. re-read a projected token file), asked each time
    a token is needed. ``issuer``: the authorization server, configuration rather than discovery
    (the MCP server is not asked where to send the JWT). A refusal (``invalid_grant`` …) is not
    retried with the same JWT or another grant: it is one line naming the step.
    """
    from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider

    if not (isinstance(assertion, str) and assertion) and not callable(assertion):
        raise TypeError("workload_identity(assertion=...): expected the JWT, or a function returning it.")

    async def current(_audience: str, _resource: str) -> str:
        jwt = assertion() if callable(assertion) else assertion
        return str(await jwt) if asyncio.iscoroutine(jwt) else str(jwt)

    class _WorkloadIdentity(IdentityAssertionOAuthProvider):
        def _build_token_request(self, scope: Optional[str], assertion: str) -> Any:
            import httpx2

            assert self._token_endpoint is not None
            data = {"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer", "assertion": assertion,
                    "client_id": client_id, "resource": self._resource, **({"scope": scope} if scope else {})}
            return httpx2.Request("POST", self._token_endpoint, data=data,
                                  headers={"Content-Type": "application/x-www-form-urlencoded"})

    # (the SDK's provider is for confidential clients; a workload is a public one: no secret is sent)
    return _WorkloadIdentity(server_url=url, storage=_storage(tokens), client_id=client_id,
                             client_secret="(none: a public client)", issuer=issuer, assertion_provider=current,
                             scope=scope)


def dpop(auth: Any) -> Any:
    """``auth`` (one of the above, or an SDK provider) with DPoP-bound tokens: proofs signed with a
    fresh key on the token requests and on every request to the MCP server (see :mod:`we0nb.mcp.dpop`)."""
    from .dpop import dpop as bind

    return bind(auth)
