"""`sidecar`'s argument parser: every command, its flags and their defaults (a contract: extend,
never rename). `sidecar.cli.commands` runs what it parses.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from sidecar.cli import asks as cli_asks
from sidecar.cli import calls as cli_calls
from sidecar.cli import client_config
from sidecar.cli import tokens as cli_tokens
from sidecar.cli import upstreams as cli_upstreams
from sidecar.cli.registry import DEFAULT_REGISTRY
from sidecar.formats import FORMATS
from sidecar.serve.local_door import DEFAULT_IDLE_EXIT


def build_parser(description: str) -> argparse.ArgumentParser:
    """`sidecar`'s commands and flags (`sidecar.cli.commands` runs them); `description`: the first
    line of `--help`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", help="state directory (default: $SIDECAR_STATE_DIR or "
                        "$XDG_STATE_HOME/mcp-sidecar)")
    common.add_argument("--manifests", action="append", default=None, metavar="DIR",
                        help="manifest directory or file (repeatable; default "
                        "$SIDECAR_MANIFESTS, else the bundled manifests/ directory)")
    common.add_argument("--no-manifests", action="store_true",
                        help="load no manifests (not even the bundled ones)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    idle = argparse.ArgumentParser(add_help=False)
    idle.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                      help="a daemon started on demand exits after this long without clients "
                      f"(default $SIDECAR_IDLE_EXIT or {DEFAULT_IDLE_EXIT:g})")
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--store", default=None, metavar="URL",
                       help="the fleet database, postgres://... or postgresql://... (default "
                       "$SIDECAR_DATABASE_URL; none: the state directory alone)")
    client = argparse.ArgumentParser(add_help=False, parents=[common, idle, store])
    client.add_argument("--url", default=None,
                        help="a running daemon (default $SIDECAR_URL, or the state directory's)")
    client.add_argument("--embedded", action="store_true",
                        help="run an embedded daemon even when one is running")

    parser = argparse.ArgumentParser(prog="sidecar", description=description)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", parents=[common, store], help="run the daemon over HTTP")
    serve_p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve_p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any)")
    serve_p.add_argument("--no-auth", action="store_true",
                         help="serve without a bearer token (explicitly insecure)")
    serve_p.add_argument("--allow-no-auth-on-network", action="store_true",
                         help="accept --no-auth on an address that is not loopback")
    serve_p.add_argument("--allow-weak-token", action="store_true",
                         help="accept a bearer token of less than 256 bits of estimated "
                         "entropy (also $SIDECAR_ALLOW_WEAK_TOKEN=1)")
    serve_p.add_argument("--allowed-host", action="append", default=[], metavar="HOST",
                         help="an extra Host/Origin name to accept (repeatable)")
    stdio_p = sub.add_parser("stdio", parents=[common, idle, store],
                             help="serve an MCP client on stdin/stdout from the state's daemon")
    stdio_p.add_argument("--standalone", action="store_true",
                         help="serve this client from this process alone (no shared daemon)")
    daemon_p = sub.add_parser("daemon", parents=[common, idle, store],
                              help="run the daemon on its local doors only (Unix sockets)")
    daemon_p.add_argument("--no-auth", action="store_true", help=argparse.SUPPRESS)
    stdio_p.add_argument("--profile", default=os.environ.get("SIDECAR_PROFILE") or None,
                         help="serve this profile's tools (default $SIDECAR_PROFILE, else the "
                         "default profile)")
    tools = sub.add_parser("tools", parents=[client], help="list the effective tools")
    tools.add_argument("--format", choices=FORMATS, default=None,
                       help="print definitions in a provider format (JSON)")
    tools.add_argument("--profile", default=None, metavar="NAME",
                       help="this profile's tools (default: the default profile's)")
    tools.add_argument("--all", action="store_true",
                       help="every tool, whichever profile serves it (the all-access token)")
    tools.add_argument("--tokens", action="store_true",
                       help="the tokens (cl100k_base) of each definition as the model sees "
                       "it, per server and in total")
    tools.add_argument("approve", nargs="*", metavar="approve NAME",
                       help="accept the changed upstream definition of tool NAME (pinning; "
                       "needs the running daemon)")
    call = sub.add_parser("call", parents=[client], help="call one tool through the seam")
    call.add_argument("name")
    call.add_argument("--input", default="{}",
                      help="the tool input as JSON (default {}); @FILE reads it from a file, "
                      "- from stdin")
    call.add_argument("--session", default="cli", help="session id (default: cli)")
    call.add_argument("--call-id", default=None, help="call id (default: a fresh one)")
    call.add_argument("--profile", default=None, metavar="NAME",
                      help="call through this profile: its tools, rules and limits (default: "
                      "the default profile)")
    call.add_argument("--progress", action="store_true",
                      help="show progress on stderr even when it is not a terminal (then as "
                      "plain lines)")
    managed = sub.add_parser("managed", help="retained text")
    managed_sub = managed.add_subparsers(dest="managed_command", required=True)
    read = managed_sub.add_parser("read", parents=[client], help="read retained text")
    read.add_argument("ref")
    read.add_argument("--offset", type=int, default=1, help="first line, 1-based")
    read.add_argument("--limit", type=int, default=200, help="number of lines")
    read.add_argument("--pattern", default=None, help="regular expression to search for")
    read.add_argument("--start", type=int, default=None,
                      help="read inside line --offset from this character (0-based)")
    read.add_argument("--length", type=int, default=None,
                      help="with --start: how many characters (default: as many as fit)")
    sub.add_parser("health", parents=[client], help="per-server status")
    client_config.add_parser(sub, [common, store])
    _registry_commands(sub, common)
    sub.add_parser("stop", parents=[common],
                   help="stop the daemon that owns the state directory (and its servers)")
    cli_tokens.add_parser(sub, argparse.ArgumentParser(add_help=False,
                                                       parents=[common, store]))
    cli_calls.add_parser(sub, client)
    cli_asks.add_parser(sub, client)
    cli_upstreams.add_parser(sub, client)
    check = sub.add_parser(
        "check", help="validate manifests without starting anything",
        description="Validate manifest files: every error of every entry, with its file and "
        "JSON path. --live also matches their globs against a running daemon's tools.")
    check.add_argument("files", nargs="*", metavar="FILE", help="manifest files or directories")
    check.add_argument("--live", action="store_true",
                       help="also report rule, profile, override and rate-limit globs that "
                       "match none of the running daemon's tools (starts no daemon)")
    check.add_argument("--url", default=None,
                       help="with --live: a running daemon (default $SIDECAR_URL, or the state "
                       "directory's)")
    check.add_argument("--state-dir", help="with --live: the daemon's state directory (default "
                       "$SIDECAR_STATE_DIR or $XDG_STATE_HOME/mcp-sidecar)")
    check.add_argument("--schema", action="store_true", help="print the manifest JSON Schema")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument("--allow-unknown", action="store_true",
                       help="do not fail on keys mcp-sidecar does not know (they are ignored)")
    auth = sub.add_parser("auth", help="OAuth logins of HTTP servers (docs/oauth.md)")
    auth_sub = auth.add_subparsers(dest="auth_command", required=True)
    login_p = auth_sub.add_parser("login", parents=[common, store], help="authorize one server")
    login_p.add_argument("name")
    login_p.add_argument("--user", default=None, metavar="USER",
                         help="store the grant of this user (a server with oauth.per_user)")
    login_p.add_argument("--no-browser", action="store_true",
                         help="print the authorization URL on stdout instead of opening it")
    status_p = auth_sub.add_parser("status", parents=[common, store],
                                   help="authorization per server")
    status_p.add_argument("name", nargs="?")
    logout_p = auth_sub.add_parser("logout", parents=[common, store],
                                   help="revoke and forget one server's tokens")
    logout_p.add_argument("name")
    logout_p.add_argument("--user", default=None, metavar="USER",
                          help="this user's grant (a server with oauth.per_user)")
    rekey_p = auth_sub.add_parser(
        "rekey", parents=[common, store],
        help="seal every OAuth grant of the fleet database with the first key of "
        "SIDECAR_GRANT_KEY (so the others can be dropped)")
    rekey_p.add_argument("--check", action="store_true",
                         help="only report which grants are not under the first key (exit 1 "
                         "while one is); change nothing")
    _describe(parser, [])
    return parser


def _registry_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """`search`, `add` and `remove` (`sidecar.cli.install`; docs/registry.md)."""
    registry = argparse.ArgumentParser(add_help=False)
    registry.add_argument("--registry", default=None, metavar="URL|FILE",
                          help=f"an MCP Registry (default {DEFAULT_REGISTRY}) or a local "
                          "catalog file")
    search = sub.add_parser(
        "search", parents=[common, registry], help="find servers in the MCP Registry",
        description="List the servers whose name or description holds QUERY (the latest "
        "version of each): name, version, transports, whether it needs secrets.")
    search.add_argument("query", nargs="?", default="", help="text to look for (default: all)")
    search.add_argument("--limit", type=int, default=30, help="at most this many (default 30)")
    add = sub.add_parser(
        "add", parents=[common, registry],
        help="install a server from the MCP Registry as a manifest entry",
        description="Write manifests/NAME.toml (in the manifest directory in use) for one "
        "registry server, after showing it: npm packages run as `npx -y PKG@VERSION`, PyPI "
        "packages as `uvx PKG==VERSION`, remotes as HTTP entries. Secrets are asked for (or "
        "given with --secret) and stored under the state directory, never in the manifest. "
        "A running daemon starts the server at once.")
    add.add_argument("server", metavar="NAME|server.json",
                     help="a registry name (io.github.owner/name, or its last part when that "
                     "is unique), or a server.json file")
    add.add_argument("--version", default=None, help="this version (default: the latest)")
    add.add_argument("--yes", "-y", action="store_true",
                     help="write without asking; a secret not given with --secret fails")
    add.add_argument("--secret", action="append", default=[], metavar="NAME=VALUE|@FILE",
                     help="a secret input (repeatable); @FILE reads the value from a file")
    add.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                     help="another input: an environment variable, argument or header "
                     "(repeatable)")
    add.add_argument("--as", dest="key", default=None, metavar="KEY",
                     help="the manifest entry's name (default: the name's last part)")
    remove = sub.add_parser(
        "remove", parents=[common], help="remove a server `sidecar add` installed",
        description="Delete manifests/NAME.toml written by `sidecar add` and its secrets; a "
        "running daemon stops the server at once.")
    remove.add_argument("key", metavar="NAME", help="the entry's name")


DESCRIPTIONS = {
    "serve": "Run the daemon in this process: HTTP on --host:--port (/v1, /mcp, the /ui "
             "console, /metrics) and its local doors (Unix sockets in the state directory). "
             "Refuses weak tokens, and --no-auth off loopback.",
    "stdio": "Serve one MCP client on stdin/stdout from the state directory's daemon "
             "(started on demand), or from this process alone with --standalone.",
    "daemon": "Run the daemon on its local doors only (Unix sockets in the state directory); "
              "client commands start one on demand, so this is rarely typed.",
    "tools": "List the tools a profile serves (the default profile's unless --profile, every "
             "tool with --all), or `tools approve NAME` to accept a held definition change.",
    "call": "Call one tool through the daemon, as a model would: the outcome's text on stdout, "
            "an error on stderr (exit 1). Ctrl-C cancels the call on the daemon.",
    "managed": "Read text that a truncated tool result kept (a managed reference, m_...).",
    "managed read": "Read retained text by lines, by characters inside one line, or the lines "
                    "matching a pattern.",
    "health": "The daemon's status, each server's state, and every reason it is degraded "
              "(exit 1 when degraded).",
    "stop": "Stop the daemon that owns the state directory, and its upstream servers.",
    "token": "Bearer tokens scoped to profiles (docs/profiles.md); they need no running "
             "daemon.",
    "auth": "OAuth logins of the manifests' HTTP servers (docs/oauth.md).",
}


def _describe(parser: argparse.ArgumentParser, path: list[str]) -> None:
    """Give every subcommand's --help page a description: its own, else its one-line help."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help for a in action._choices_actions}
        for name, sub in action.choices.items():
            key = " ".join([*path, name])
            if not sub.description:
                text = DESCRIPTIONS.get(key) or helps.get(name) or ""
                sub.description = (text[:1].upper() + text[1:]).rstrip(".") + "." if text else None
            _describe(sub, [*path, name])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcp-sidecar")
    except PackageNotFoundError:
        return "unknown (not installed)"
