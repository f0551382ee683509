"""The client the official MCP conformance suite (@modelcontextprotocol/conformance) drives,
built on we0nb: ``MCPServer.http`` + ``We0Agent``, with we0nb's own ``auth=`` helpers.

The suite starts a test server per scenario, passes its URL as the last argument, names the
scenario in ``MCP_CONFORMANCE_SCENARIO`` and gives credentials in ``MCP_CONFORMANCE_CONTEXT``.
The exit status is 0 when the client did what the scenario asks (the suite checks the wire).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

import httpx2

from we0nb import ScriptedModel, We0Agent, text, tool_call, user_message
from we0nb.mcp import MCPServer, oauth

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
log = logging.getLogger("conformance")

#: the tool each scenario's server expects to be called, and its arguments
CALLS = {"tools_call": ("add_numbers", {"a": 5, "b": 3}), "sse-retry": ("test_reconnection", {})}
#: the scenarios that check a call to each of their tools (SEP-2322: the multi-round-trip ones)
EVERY_TOOL = {"sep-2322-client-request-state"}


def context() -> dict[str, Any]:
    raw = os.environ.get("MCP_CONFORMANCE_CONTEXT")
    return json.loads(raw) if raw else {}


async def browser(url: str) -> None:
    """A person signing in: follow the authorization server's redirect to our 127.0.0.1 listener."""
    async with httpx2.AsyncClient(follow_redirects=True, timeout=30) as client:
        await client.get(url)


def auth_for(scenario: str, url: str) -> Any:
    if not scenario.startswith("auth/"):
        return None
    ctx = context()
    if scenario == "auth/client-credentials-basic":
        return oauth.client_credentials(url, ctx["client_id"], ctx["client_secret"])
    if scenario == "auth/client-credentials-jwt":
        from mcp.client.auth.extensions.client_credentials import PrivateKeyJWTOAuthProvider, SignedJWTParameters

        jwt = SignedJWTParameters(issuer=ctx["client_id"], subject=ctx["client_id"],
                                  signing_algorithm=ctx.get("signing_algorithm", "ES256"),
                                  signing_key=ctx["private_key_pem"])
        return PrivateKeyJWTOAuthProvider(server_url=url, storage=oauth.MemoryTokenStorage(),
                                          client_id=ctx["client_id"], assertion_provider=jwt.create_assertion_provider())
    if scenario in ("auth/cross-app-access-complete-flow", "auth/enterprise-managed-authorization"):
        return identity_assertion(url, ctx)
    if scenario == "auth/wif-jwt-bearer":  # the workload's JWT, the authorization server from configuration
        return oauth.workload_identity(url, ctx["client_id"], ctx["valid_jwt"], issuer=issuer_of(url))
    storage = oauth.MemoryTokenStorage()
    auth = oauth.authorization_code(url, tokens=storage, open_url=browser, timeout=20,
                                    client_metadata_url="https://conformance-test.local/client-metadata.json")
    if ctx.get("client_id"):  # pre-registered: the client id and secret the authorization server knows
        from mcp.shared.auth import OAuthClientInformationFull

        redirect = auth.context.client_metadata.redirect_uris
        storage.client_info = OAuthClientInformationFull(
            client_id=ctx["client_id"], client_secret=ctx.get("client_secret"), redirect_uris=redirect,
            token_endpoint_auth_method="client_secret_basic" if ctx.get("client_secret") else "none")
    return oauth.dpop(auth) if scenario.startswith("auth/dpop") else auth


def identity_assertion(url: str, ctx: dict[str, Any]) -> Any:
    """SEP-990 (enterprise-managed authorization): an ID-JAG from the enterprise IdP (RFC 8693 token
    exchange), then the MCP authorization server's jwt-bearer grant — the SDK's provider, as auth=."""
    from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider

    async def fetch_id_jag(audience: str, resource: str) -> str:
        async with httpx2.AsyncClient(timeout=30) as http:
            resp = await http.post(ctx["idp_token_endpoint"], data={
                "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
                "requested_token_type": "urn:ietf:params:oauth:token-type:id-jag",
                "subject_token": ctx["idp_id_token"], "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
                "audience": audience, "resource": resource, "client_id": ctx["idp_client_id"]})
            resp.raise_for_status()
            return str(resp.json()["access_token"])

    return IdentityAssertionOAuthProvider(server_url=url, storage=oauth.MemoryTokenStorage(),
                                          client_id=ctx["client_id"], client_secret=ctx["client_secret"],
                                          issuer=issuer_of(url), assertion_provider=fetch_id_jag,
                                          token_endpoint_auth_method="client_secret_basic")


def issuer_of(url: str) -> str:
    """The authorization server the MCP server names (configuration, in practice: the scenario's
    servers listen on ports chosen at start)."""
    from mcp.client.auth.utils import build_protected_resource_metadata_discovery_urls

    prm_url = build_protected_resource_metadata_discovery_urls(None, url)[0]
    return str(httpx2.get(prm_url, timeout=30).raise_for_status().json()["authorization_servers"][0])


def stub_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    by_type = {"string": "x", "integer": 0, "number": 0, "boolean": False, "object": {}, "array": []}
    props = schema.get("properties", {})
    return {n: by_type.get(props.get(n, {}).get("type"), "x") for n in schema.get("required", [])}


async def run(url: str, scenario: str) -> None:
    server = MCPServer.http(url, name="conformance", auth=auth_for(scenario, url), protocol="auto",
                            elicitation=lambda request: request.accept({}), timeout=60)
    async with server:
        tools = {t.remote_name: t for t in server._tools}
        log.info("tools: %s", sorted(tools))
        if scenario == "initialize" or not tools:
            return
        if scenario == "json-schema-2020-12-preservation":  # echo the focal tool's inputSchema as listed
            CALLS[scenario] = ("json_schema_echo", {"schema": tools["json_schema_2020_12_tool"].input_schema})
        for name, args in calls(scenario, tools):
            await call(server, name, args)


def calls(scenario: str, tools: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The tool calls the scenario expects: those its context names, its own, or every tool
    (in the listed order) where it checks each, else the first one with stub arguments."""
    if context().get("toolCalls"):  # (a null argument is one not given: we0nb checks arguments against the
        # tool's inputSchema before calling, and null is not a boolean; the scenario accepts either)
        return [(c["name"], {k: v for k, v in (c.get("arguments") or {}).items() if v is not None})
                for c in context()["toolCalls"]]
    if scenario in CALLS:
        return [CALLS[scenario]]
    names = list(tools) if scenario in EVERY_TOOL else [next(iter(tools))]
    return [(n, stub_arguments(tools[n].input_schema)) for n in names]


async def call(server: MCPServer, name: str, args: dict[str, Any]) -> None:
    """One call the way an agent makes it: a model asks for the tool, we0nb calls the server."""
    model = ScriptedModel([[tool_call(name, args)], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        result = await agent.invoke(messages=[user_message(f"call {name}")])
        (part,) = [p for m in (await agent.transcript(result.session_id)).messages for p in m.tool_parts]
    log.info("%s -> %s: %s", name, part.state.status, getattr(part.state, "output", None)
             or getattr(part.state, "error", None))


def main() -> None:
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "initialize")
    asyncio.run(run(url, scenario))


if __name__ == "__main__":
    main()
