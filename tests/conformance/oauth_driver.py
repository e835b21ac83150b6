"""Conformance client driver: the suite's mock MCP server, reached through the sidecar.

    conformance client --command "python tests/conformance/oauth_driver.py" --scenario auth/...

The suite runs this with the mock server's URL as the last argument, the scenario name in
`MCP_CONFORMANCE_SCENARIO` and, for pre-registered and client-credentials scenarios, the
credentials in `MCP_CONFORMANCE_CONTEXT` (JSON). What a user would do, step by step:

1. write a manifest for the URL (`namespace = ""`, `auth = "oauth"`, the secrets in files
   referenced as `${file:...}`);
2. `sidecar auth login remote --no-browser`, fetch the printed URL (the mock authorization
   endpoint redirects straight back to the sidecar's loopback callback with a code);
3. start `sidecar stdio` as an MCP client would and call the scenario's tool; when the call
   fails naming `sidecar auth login` (a step-up), log in again and retry: at most
   `MAX_LOGINS` logins in all.

The non-auth client scenarios (`initialize`, `tools_call`, `elicitation-sep1034-client-defaults`,
`sse-retry`) run the same way without the login. Exit 0 when the scenario's tool call
succeeded (or, for `initialize`, when the tool list was read).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext

REPO = Path(__file__).resolve().parents[2]
CIMD_URL = "https://conformance-test.local/client-metadata.json"
MAX_LOGINS = 3
SERVER = "remote"
TOOLS = {
    "tools_call": ("add_numbers", {"a": 2, "b": 3}),
    "elicitation-sep1034-client-defaults": ("test_client_elicitation_defaults", {}),
    "sse-retry": ("test_reconnection", {}),
}
LOGIN_HINT = f"sidecar auth login {SERVER}"


def log(*parts: Any) -> None:
    print("[driver]", *parts, file=sys.stderr, flush=True)
    if trace := os.environ.get("SIDECAR_DRIVER_LOG"):  # the suite shows a killed client's
        with open(trace, "a") as out:                   # output nowhere
            print("[driver]", *parts, file=out)


def manifest(url: str, scenario: str, context: dict[str, Any], work: Path) -> dict[str, Any]:
    # The mock servers speak the 2025 handshake: no `server/discover` probe.
    entry: dict[str, Any] = {"url": url, "namespace": "", "timeouts": {"startup": 20},
                             "protocol": "legacy"}
    if not scenario.startswith("auth/"):
        return entry
    oauth: dict[str, Any] = {"client_name": "mcp-sidecar conformance"}
    if "client_secret" in context:
        (work / "client_secret").write_text(context["client_secret"] + "\n")
        oauth["client_secret"] = "${file:client_secret}"
    if "private_key_pem" in context:
        (work / "client_key.pem").write_text(context["private_key_pem"])
        oauth["private_key"] = "${file:client_key.pem}"
        oauth["signing_algorithm"] = context.get("signing_algorithm") or "ES256"
    if "client_id" in context:
        oauth["client_id"] = context["client_id"]
    if scenario.startswith("auth/client-credentials"):
        oauth["grant"] = "client_credentials"
    elif scenario.startswith("auth/cross-app-access"):
        (work / "id_token").write_text(context["idp_id_token"])
        oauth.update(grant="cross_app_access", id_token="${file:id_token}",
                     idp_client_id=context["idp_client_id"],
                     idp_token_endpoint=context["idp_token_endpoint"],
                     issuer=authorization_server(url),
                     token_endpoint_auth_method="client_secret_basic")
    else:
        oauth["client_metadata_url"] = CIMD_URL
    entry.update(auth="oauth", oauth=oauth)
    return entry


def authorization_server(url: str) -> str:
    """The MCP server's authorization server, as its protected resource metadata names it
    (what an administrator configures as `oauth.issuer` for cross-app access)."""
    base = httpx.URL(url)
    metadata = httpx.get(str(base.copy_with(path="/.well-known/oauth-protected-resource"
                                            + base.path)), timeout=10).json()
    return str(metadata["authorization_servers"][0])


def sidecar(*args: str) -> list[str]:
    return [sys.executable, "-m", "sidecar.cli", *args]


async def login(common: list[str]) -> bool:
    """`sidecar auth login --no-browser`; fetch the URL it prints; True once it exits 0."""
    proc = await asyncio.create_subprocess_exec(
        *sidecar("auth", "login", SERVER, "--no-browser", *common),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = (await proc.stdout.readline()).decode().strip()
    if line.startswith("http"):
        log("authorization URL:", line)
        async with httpx.AsyncClient(follow_redirects=True, timeout=10) as http:
            try:
                response = await http.get(line)
                log("callback answered", response.status_code)
            except httpx.HTTPError as exc:
                log("fetching the authorization URL failed:", exc)
    rest, err = await proc.communicate()
    log("login exit", proc.returncode, (line + rest.decode()).strip()[:300], err.decode()[-600:])
    return proc.returncode == 0


async def elicit(context: ClientRequestContext, params: Any) -> types.ElicitResult:
    """Accept with the defaults the request's schema declares (SEP-1034)."""
    schema = getattr(params, "requested_schema", None) or {}
    if not isinstance(schema, dict):
        schema = schema.model_dump(by_alias=True)
    content = {name: prop["default"] for name, prop in schema.get("properties", {}).items()
               if isinstance(prop, dict) and "default" in prop}
    return types.ElicitResult(action="accept", content=content)


STARTING_META = "io.mcp-sidecar/starting"


async def drive(scenario: str, common: list[str], grant_needs_login: bool) -> int:
    logins = 0
    if grant_needs_login:
        logins += 1
        if not await login(common):
            return 1
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "sidecar.cli", "stdio", *common],
                                   env=dict(os.environ))
    name, arguments = TOOLS.get(scenario, ("test-tool", {}))
    async with Client(params, mode="legacy", cache=None, read_timeout_seconds=25,
                      elicitation_callback=elicit) as client:
        while True:
            listed = await settled_listing(client)
            log("tools:", listed)
            if scenario == "initialize":
                return 0
            error = ""
            if name in listed:
                result = await client.call_tool(name, arguments)
                text = " ".join(getattr(c, "text", "") for c in result.content)
                log("call:", "error" if result.is_error else "ok", text[:300])
                if not result.is_error:
                    return 0
                error = text
            else:
                error = await status_text(common)
            if LOGIN_HINT not in error or logins >= MAX_LOGINS:
                log("giving up")
                return 1
            logins += 1
            if not await login(common):
                return 1
            # the daemon looks for new tokens about once a second: give it that time
            await asyncio.sleep(2.0)
            await wait_for_tool(client, name)


async def settled_listing(client: Client) -> list[str]:
    """The tool names once no server is still starting (the daemon answers at once and starts
    its servers in the background; a listing says which are still starting in `_meta`)."""
    for _ in range(240):
        listing = await client.list_tools()
        starting = (listing.meta or {}).get(STARTING_META)
        if not starting:
            break
        await asyncio.sleep(0.25)
    return [t.name for t in listing.tools]


async def status_text(common: list[str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        *sidecar("auth", "status", SERVER, *common),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    log("status:", out.decode().strip())
    return out.decode()


async def wait_for_tool(client: Client, name: str) -> None:
    """A daemon waiting in needs_auth reconnects once it sees the new tokens."""
    for _ in range(24):
        if name in [t.name for t in (await client.list_tools()).tools]:
            return
        await asyncio.sleep(0.25)


def main() -> int:
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    with tempfile.TemporaryDirectory(prefix="sidecar-conformance-") as tmp:
        work = Path(tmp)
        (work / "manifests").mkdir()
        entry = manifest(url, scenario, context, work / "manifests")
        (work / "manifests" / "remote.json").write_text(
            json.dumps({"mcpServers": {SERVER: entry}}, indent=1)
        )
        common = ["--manifests", str(work / "manifests"), "--state-dir", str(work / "state")]
        needs_login = scenario.startswith("auth/") and not scenario.startswith(
            ("auth/client-credentials", "auth/cross-app-access")
        )
        code = asyncio.run(drive(scenario, common, needs_login))
        log("driver done", code)
        return code


if __name__ == "__main__":
    sys.exit(main())
