"""`sidecar auth login|status|logout`: OAuth grants of the manifests' HTTP servers.

    sidecar auth login NAME [--no-browser]   authorize NAME; exits 0 once its tokens are stored
        [--user USER]                        USER's own grant (a server with oauth.per_user)
    sidecar auth status [NAME] [--json]      per server: authorized, expiry, scopes, needs login
    sidecar auth logout NAME                 revoke (where supported) and forget NAME's tokens
    sidecar auth rekey [--check] [--json]    seal every fleet grant with the first key
                                             of SIDECAR_GRANT_KEY (`sidecar.cli.rekey`)

Tokens live in the state directory (`oauth-tokens.json`, mode 0600), where a running daemon
finds them: a server waiting in `needs_auth` reconnects within a second of a login. With
`--store`/`SIDECAR_DATABASE_URL` they live in the fleet database instead, encrypted with
`SIDECAR_GRANT_KEY` (`sidecar.backends.postgres.grants`): one login serves every replica.
`--no-browser` prints the authorization URL as the only line on stdout (for scripts and remote
shells); otherwise the URL opens in the browser and is also printed on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import webbrowser
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from bridges.manifest.loading import ServerConfig, load_manifests
from bridges.mcp.oauth.login import login, logout
from bridges.mcp.oauth.records import (
    grant_status,
    login_command,
    split_grant_key,
    user_grant_key,
)
from sidecar.cli.database import database_line
from sidecar.cli.output import EXIT_DATABASE
from sidecar.stores.grants import GrantStore, GrantStoreUnavailable

OpenGrantStore = Callable[[Path], AbstractAsyncContextManager[GrantStore]]
"""The grants of a state directory, as the composition root chooses them
(`sidecar.daemon.daemon.grant_store_of`)."""


def oauth_servers(manifests: list[str]) -> tuple[dict[str, ServerConfig], list[str]]:
    """The manifests' servers that may use OAuth, and the manifest errors (as text)."""
    servers, errors = manifest_servers(manifests)
    return {key: c for key, c in servers.items() if c.oauth_mode != "none"}, errors


def manifest_servers(manifests: list[str]) -> tuple[dict[str, ServerConfig], list[str]]:
    """Every server of the manifests, and the manifest errors (as text)."""
    loaded = load_manifests(manifests)
    return ({key: sourced.value for key, sourced in loaded.servers.items()},
            [str(p) for p in loaded.errors])


def no_login_for(name: str, servers: dict[str, ServerConfig]) -> str:
    """Why server `name` has no OAuth login to start or show (it is not an HTTP server that
    may use OAuth, or the manifests do not name it)."""
    config = servers.get(name)
    oauth = sorted(k for k, c in servers.items() if c.oauth_mode != "none")
    known = f"(servers that may: {', '.join(oauth) or 'none'})"
    if config is None:
        return f"no server {name!r} in the manifests {known}"
    if config.url is None:
        return f"server {name!r} is a stdio server: it has no OAuth login {known}"
    return f"server {name!r} does not use OAuth (`auth = \"none\"`) {known}"


async def run(args: argparse.Namespace, manifests: list[str], state_dir: str,
              open_store: OpenGrantStore) -> int:
    """Exit 0 on success, 1 for a failed login (or a server needing one, for `status`; a grant
    no key opens, for `rekey`), 2 for a bad request or an unusable grant store, 6 when the
    fleet database cannot be used: unreachable at the start, or lost or silent midway (one
    line, `sidecar.cli.database`)."""
    try:
        async with open_store(Path(state_dir)) as store:
            if args.auth_command == "rekey":
                from sidecar.cli.rekey import rekey

                return await rekey(args, store)
            return await _run(args, manifests, store)
    except GrantStoreUnavailable as exc:
        print(f"sidecar auth: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # unreachable at the start, or lost midway: one line
        line = database_line(exc, f"sidecar auth {args.auth_command}", prefix="sidecar auth")
        if line is None:
            raise
        print(line, file=sys.stderr)
        return EXIT_DATABASE


async def _run(args: argparse.Namespace, manifests: list[str], store: GrantStore) -> int:
    every, errors = manifest_servers(manifests)
    servers = {key: c for key, c in every.items() if c.oauth_mode != "none"}
    if args.auth_command == "status":
        if args.name and args.name not in servers and args.name not in await store.servers():
            print(f"sidecar auth status: {no_login_for(args.name, every)}", file=sys.stderr)
            return 2
        return await _status(args, servers, store)
    name = args.name
    config = servers.get(name)
    user = getattr(args, "user", None)
    if user is not None:
        if config is not None and (config.oauth is None or not config.oauth.per_user):
            print(f"sidecar auth {args.auth_command}: server {name!r} has no credentials per "
                  "user (oauth.per_user = true)", file=sys.stderr)
            return 2
        name = user_grant_key(name, user)
    if args.auth_command == "logout":
        print(await logout(name, config, store))
        return 0
    if config is None:
        print(f"sidecar auth login: {no_login_for(args.name, every)}", file=sys.stderr)
        for error in errors:
            print(f"  manifest: {error}", file=sys.stderr)
        return 2

    async def show(url: str) -> None:
        if args.no_browser:
            print(url, flush=True)
            return
        print(f"Opening {url}", file=sys.stderr, flush=True)
        if not webbrowser.open(url):
            print("No browser here: open the URL above yourself.", file=sys.stderr, flush=True)

    try:
        result = await login(name, config, store, show=show)
    except (GrantStoreUnavailable, OSError, ValueError) as exc:  # one line, not a traceback
        print(f"sidecar auth login: {name}: failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    # the reason may end with the advice to log in, which is what just failed
    message = result.message.replace(f"; run `{login_command(name)}`", "")
    print(message if result.ok else f"sidecar auth login: {message}", file=sys.stderr)
    return 0 if result.ok else 1


async def _status(
    args: argparse.Namespace, servers: dict[str, ServerConfig], store: GrantStore
) -> int:
    names = [args.name] if args.name else sorted(set(servers) | set(await store.servers()))
    report: dict[str, dict[str, Any]] = {}
    now = time.time()
    for name in names:
        config = servers.get(split_grant_key(name)[0])
        report[name] = grant_status(name, config, await store.get(name), now)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        if not report:
            print("no HTTP server in the manifests uses OAuth")
        for name, entry in report.items():
            if entry["authorized"] and not entry["needs_login"]:
                expiry = entry["expires_at"]
                left = f", expires in {int(expiry - now)} s" if expiry else ""
                print(f"{name}: authorized (scopes: {entry['scopes'] or '-'}{left})")
            else:
                why = f" ({entry['reason']})" if entry["reason"] else ""
                print(f"{name}: needs login{why}: run `{login_command(name)}`")
    return 1 if any(e["needs_login"] and e["configured"] for e in report.values()) else 0
