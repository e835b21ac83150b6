"""The `sidecar` command line.

    sidecar serve [--host H] [--port P] [--no-auth]   the daemon over HTTP (/v1, /mcp, /metrics)
                                                      (refuses weak tokens, --no-auth off loopback)
    sidecar stdio                                     the daemon as an MCP server on stdin/stdout
    sidecar tools [--format mcp|openai|anthropic|gemini] [--json]
    sidecar call NAME [--input JSON] [--json]         one call through the seam
    sidecar managed read REF [--offset N] [--limit N] [--pattern RE] [--start C] [--length N]
    sidecar health [--json]                           per-server status
    sidecar check FILE... [--json] | --schema         validate manifests (no daemon)
    sidecar auth login NAME [--no-browser] | status [--json] | logout NAME   OAuth logins

`tools`, `call`, `managed` and `health` talk to a running daemon when one is configured
(`--url` or `$SIDECAR_URL`, or the `daemon.json` a running `sidecar serve` wrote into the state
directory; token from `$SIDECAR_TOKEN` or `<state>/token`), else they run an embedded daemon
on the state directory and the manifests.

Exit codes: 0 success; 1 the call ended in an error outcome (or `check` found errors, or
`health` is degraded); 2 usage error (or the daemon refused the request, or `serve` refused an
unsafe configuration: see `sidecar.serve.serve_policy`); 3 the configured
daemon is unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridges.manifest import load_manifests, manifest_json_schema
from bridges.manifest_tools import manifest_tool_validator
from sidecar import cli_tokens
from sidecar.serve.replay import FORMATS
from sidecar.serve.serve_policy import UnsafeConfiguration
from sidecar.state_dir import UnsafeStateDir

if TYPE_CHECKING:
    from sidecar.cli_backends import Backend

# The daemon (`sidecar.daemon`, with the `mcp` SDK: most of a start) is imported by the
# commands that need it, after `serve` and `stdio` have spawned their stdio servers
# (`_import_daemon`): those start on another core while the imports run.

EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_STATE_IN_USE, EXIT_ADDRESS_IN_USE = 4, 5
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process killed by SIGPIPE (128 + 13)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", help="state directory (default: $SIDECAR_STATE_DIR or "
                        "$XDG_STATE_HOME/mcp-sidecar)")
    common.add_argument("--manifests", action="append", default=None, metavar="DIR",
                        help="manifest directory or file (repeatable; default $SIDECAR_MANIFESTS)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    client = argparse.ArgumentParser(add_help=False, parents=[common])
    client.add_argument("--url", default=None,
                        help="a running daemon (default $SIDECAR_URL, or the state directory's)")
    client.add_argument("--embedded", action="store_true",
                        help="run an embedded daemon even when one is running")

    parser = argparse.ArgumentParser(prog="sidecar", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", parents=[common], help="run the daemon over HTTP")
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
    stdio_p = sub.add_parser("stdio", parents=[common],
                             help="run the daemon as an MCP server over stdin/stdout")
    stdio_p.add_argument("--profile", default=os.environ.get("SIDECAR_PROFILE") or None,
                         help="serve this profile's tools (default $SIDECAR_PROFILE, else the "
                         "default profile)")
    tools = sub.add_parser("tools", parents=[client], help="list the effective tools")
    tools.add_argument("--format", choices=FORMATS, default=None,
                       help="print definitions in a provider format (JSON)")
    tools.add_argument("approve", nargs="*", metavar="approve NAME",
                       help="accept the changed upstream definition of tool NAME (pinning; "
                       "needs the running daemon)")
    call = sub.add_parser("call", parents=[client], help="call one tool through the seam")
    call.add_argument("name")
    call.add_argument("--input", default="{}", help="the tool input as JSON (default {})")
    call.add_argument("--session", default="cli", help="session id (default: cli)")
    call.add_argument("--call-id", default=None, help="call id (default: a fresh one)")
    call.add_argument("--progress", action="store_true",
                      help="show progress snapshots on stderr even when it is not a terminal")
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
    cli_tokens.add_parser(sub, common)
    check = sub.add_parser("check", help="validate manifests without starting anything")
    check.add_argument("files", nargs="*", metavar="FILE", help="manifest files or directories")
    check.add_argument("--schema", action="store_true", help="print the manifest JSON Schema")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    auth = sub.add_parser("auth", help="OAuth logins of HTTP servers (see sidecar.cli_auth)")
    auth_sub = auth.add_subparsers(dest="auth_command", required=True)
    login_p = auth_sub.add_parser("login", parents=[common], help="authorize one server")
    login_p.add_argument("name")
    login_p.add_argument("--no-browser", action="store_true",
                         help="print the authorization URL on stdout instead of opening it")
    status_p = auth_sub.add_parser("status", parents=[common], help="authorization per server")
    status_p.add_argument("name", nargs="?")
    logout_p = auth_sub.add_parser("logout", parents=[common],
                                   help="revoke and forget one server's tokens")
    logout_p.add_argument("name")
    return parser


def _manifests(args: argparse.Namespace) -> list[str]:
    if args.manifests:
        return list(args.manifests)
    env = os.environ.get("SIDECAR_MANIFESTS", "")
    return [p for p in env.split(os.pathsep) if p]


class Style:
    def __init__(self, stream: Any) -> None:
        self.on = bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text


def _check(args: argparse.Namespace) -> int:
    if args.schema:
        print(json.dumps(manifest_json_schema(), indent=2, sort_keys=True))
        return EXIT_OK
    if not args.files:
        print("sidecar check: name at least one manifest file or directory", file=sys.stderr)
        return EXIT_USAGE
    loaded = load_manifests(args.files, tool_validator=manifest_tool_validator(Path.cwd()))
    if args.json:
        print(json.dumps({
            "files": loaded.files,
            "servers": sorted(loaded.servers),
            "tools": sorted(loaded.tools),
            "problems": [
                {"file": p.file, "path": p.path, "message": p.message, "hint": p.hint,
                 "severity": p.severity}
                for p in loaded.problems
            ],
        }, indent=2))
    else:
        for problem in loaded.problems:
            print(f"{problem.severity}: {problem}")
        print(f"{len(loaded.files)} file(s), {len(loaded.servers)} server(s), "
              f"{len(loaded.tools)} tool(s), {len(loaded.errors)} error(s)")
    return EXIT_TOOL_ERROR if loaded.errors else EXIT_OK


def _print_outcome(outcome: dict[str, Any], as_json: bool) -> int:
    style = Style(sys.stdout)
    if as_json:
        print(json.dumps(outcome, ensure_ascii=False, indent=2))
    elif outcome["status"] == "completed":
        for item in outcome["content"]:
            if item["type"] == "text":
                print(item["text"], end="" if item["text"].endswith("\n") else "\n")
            else:
                shown = {k: v for k, v in item.items() if k not in ("data", "blob")}
                print(style(f"[{item['type']}: {json.dumps(shown)}]", "2"))
    else:
        error = outcome["error"]
        line = f"error ({error['kind']}): {error['message']}"
        print(Style(sys.stderr)(line, "31"), file=sys.stderr)
    return EXIT_OK if outcome["status"] == "completed" else EXIT_TOOL_ERROR


def _print_tools(tools: list[dict[str, Any]], args: argparse.Namespace) -> int:
    if args.json or args.format:
        print(json.dumps(tools, indent=2, ensure_ascii=False))
        return EXIT_OK
    style = Style(sys.stdout)
    width = max((len(t["name"]) for t in tools), default=0)
    for tool in tools:
        summary = (tool.get("description") or "").strip().splitlines()
        print(f"{style(tool['name'].ljust(width), '1')}  {summary[0] if summary else ''}")
    return EXIT_OK


def _state_line(state: dict[str, Any]) -> str:
    """The state directory's size by part, then what pruning and eviction removed."""
    parts = ", ".join(f"{part} {size / 1e6:.1f} MB" for part, size in state["bytes"].items())
    up = state.get("upkeep", {})
    return (f"state: {state['total_bytes'] / 1e6:.1f} MB ({parts})\n"
            f"  since start: {up.get('outcomes_pruned', 0)} outcomes pruned "
            f"({up.get('outcomes_expired', 0)} expired call ids kept), "
            f"{up.get('managed_evicted_expired', 0)} managed objects expired, "
            f"{up.get('managed_evicted_quota', 0)} evicted over quota, "
            f"{up.get('wal_truncations', 0)} WAL truncations")


def _print_health(report: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        style = Style(sys.stdout)
        colour = "32" if report["status"] == "ok" else "33"
        print(f"status: {style(report['status'], colour)}  tools: {report['tools']}  "
              f"store: {report['store']['objects']} objects, {report['store']['bytes']:,} bytes")
        if report.get("state"):
            print(_state_line(report["state"]))
        for name, server in sorted(report.get("servers", {}).items()):
            state = server.get("state", "?")
            mark = style(state, "32" if state == "ready" else "31")
            error = f"  ({server['last_error']})" if server.get("last_error") else ""
            print(f"  {name}: {mark}, {server.get('tool_count', 0)} tools{error}")
        for ref, plugin in sorted(report.get("plugins", {}).items()):
            print(f"  plugin {ref}: {plugin['state']}")
        for problem in report.get("manifest_problems", []):
            if problem["severity"] == "error":
                print(f"  manifest {problem['file']}: {problem['path']}: {problem['message']}")
    return EXIT_OK if report["status"] == "ok" else EXIT_TOOL_ERROR


async def stdio(
    *, state_dir: str | None, manifests: list[str], profile: str | None = None
) -> None:
    """`sidecar.daemon.stdio`, imported when called (after `_import_daemon`)."""
    from sidecar.daemon import stdio as run_stdio

    await run_stdio(state_dir=state_dir, manifests=manifests, profile=profile)


async def serve(
    *, state_dir: str | None, manifests: list[str], host: str, port: int, auth: bool,
    allowed_hosts: list[str], allow_weak_token: bool, allow_no_auth_on_network: bool,
) -> None:
    """`sidecar.daemon.serve`, imported when called (after `_import_daemon`)."""
    from sidecar.daemon import serve as run_serve

    await run_serve(state_dir=state_dir, manifests=manifests, host=host, port=port, auth=auth,
                    allowed_hosts=allowed_hosts, allow_weak_token=allow_weak_token,
                    allow_no_auth_on_network=allow_no_auth_on_network)


def _import_daemon(args: argparse.Namespace) -> None:
    """For `serve` and `stdio`: spawn the manifests' stdio servers, then import the daemon
    while they start (`bridges.prestart`; the Location's pool adopts them)."""
    from bridges.prestart import prestart_servers

    prestart_servers(_manifests(args))
    import sidecar.daemon  # noqa: F401  (the imports the servers' start overlaps)


async def _client(args: argparse.Namespace) -> int:
    from sidecar.cli_backends import EmbeddedBackend, RemoteBackend, find_daemon
    from sidecar.daemon import Location, default_state_dir, retention_from_env

    state = args.state_dir or str(default_state_dir())
    url = args.url or os.environ.get("SIDECAR_URL") or (
        None if args.embedded else find_daemon(state)
    )
    backend: Backend
    if url is not None:
        backend = RemoteBackend(url, state)
    else:
        retention = retention_from_env()
        backend = EmbeddedBackend(
            state, _manifests(args),
            lambda root, **options: Location.open(root, retention_seconds=retention, **options),
        )
    async with backend:
        if args.command == "tools" and args.approve:
            return await _approve(backend, args)
        if args.command == "tools":
            return _print_tools(await backend.tools(args.format), args)
        if args.command == "health":
            return _print_health(await backend.health(), args.json)
        if args.command == "call":
            name, raw_input = args.name, args.input
        else:
            name = "managed_read"
            payload: dict[str, Any] = {"ref": args.ref, "offset": args.offset, "limit": args.limit}
            if args.pattern is not None:
                payload["pattern"] = args.pattern
            if args.start is not None:
                payload["start"] = args.start
            if args.length is not None:
                payload["length"] = args.length
            raw_input = json.dumps(payload)
        call_id = getattr(args, "call_id", None) or "cli_" + secrets.token_hex(8)
        context = {"session_id": getattr(args, "session", "cli"), "agent": "cli",
                   "message_id": call_id, "call_id": call_id}
        progress = getattr(args, "progress", False) or (sys.stderr.isatty() and not args.json)
        outcome = await backend.call(name, raw_input, context, show_progress=progress)
        return _print_outcome(outcome, args.json)


async def _approve(backend: Backend, args: argparse.Namespace) -> int:
    from sidecar.cli_backends import RemoteBackend

    if len(args.approve) != 2 or args.approve[0] != "approve":
        print("sidecar: usage: sidecar tools approve NAME", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(backend, RemoteBackend):
        print("sidecar: approving a definition needs the running daemon (it holds the "
              "change); start `sidecar serve`, or pass --url", file=sys.stderr)
        return EXIT_UNREACHABLE
    change = await backend.approve(args.approve[1])
    if args.json:
        print(json.dumps(change))
    else:
        print(f"approved {change['tool']} ({change['key']}): its new definition is pinned")
    return EXIT_OK


def _configure_logging() -> None:
    """Daemon logs to stderr at INFO (`$SIDECAR_LOG_LEVEL` overrides). HTTP client libraries
    stay at WARNING: their INFO lines carry full request URLs, which may hold secrets."""
    level = os.environ.get("SIDECAR_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _run(coro: Any, *, daemon: bool = False) -> Any:
    """Run `coro` on uvloop where it builds; `daemon`: a long-lived process, whose import-time
    heap is frozen first (`freeze_startup_heap`)."""
    run: Callable[[Any], Any]
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # uvloop does not build on Windows
        run = asyncio.run
    if daemon:
        from sidecar.daemon import freeze_startup_heap

        freeze_startup_heap()
    return run(coro)


def _auth(args: argparse.Namespace) -> int:
    from sidecar import cli_auth
    from sidecar.daemon import default_state_dir

    logging.basicConfig(level=os.environ.get("SIDECAR_LOG_LEVEL", "WARNING").upper(),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    state = args.state_dir or str(default_state_dir())
    return int(_run(cli_auth.run(args, _manifests(args), state)))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader of stdout left (`sidecar call ... | head`). Point stdout at /dev/null so
        # that the interpreter's last flush cannot fail again, and say it once.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        print("sidecar: stdout was closed before the output was written (broken pipe)",
              file=sys.stderr)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check":
        return _check(args)
    if args.command == "auth":
        return _auth(args)
    if args.command == "token":
        from sidecar.daemon import default_state_dir

        state = Path(args.state_dir) if args.state_dir else default_state_dir()
        return int(_run(cli_tokens.run(args, state)))
    if args.command == "stdio":
        _configure_logging()  # stderr only: stdout carries MCP messages
        _import_daemon(args)
        from sidecar.profiles import UnknownProfile

        try:
            return _daemon_exit(args, lambda: _run(
                stdio(state_dir=args.state_dir, manifests=_manifests(args),
                      profile=args.profile), daemon=True))
        except (UnknownProfile, UnsafeStateDir) as exc:
            print(f"sidecar: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if args.command == "serve":
        _configure_logging()
        _import_daemon(args)
        try:
            return _daemon_exit(args, lambda: _run(
                serve(state_dir=args.state_dir, manifests=_manifests(args), host=args.host,
                      port=args.port, auth=not args.no_auth, allowed_hosts=args.allowed_host,
                      allow_weak_token=args.allow_weak_token,
                      allow_no_auth_on_network=args.allow_no_auth_on_network),
                daemon=True))
        except (UnsafeConfiguration, UnsafeStateDir) as exc:
            print(f"sidecar: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from sidecar.cli_backends import Refused, Unreachable

    try:
        return int(_run(_client(args)))
    except Unreachable as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except Refused as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UnsafeStateDir as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except json.JSONDecodeError as exc:
        print(f"sidecar: --input is not valid JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _daemon_exit(args: argparse.Namespace, run: Callable[[], Any]) -> int:
    """Run a daemon command; the failures a user causes by starting it twice are one line."""
    from managed_store import StoreInUse
    from sidecar.daemon import AddressInUse, default_state_dir

    try:
        run()
    except StoreInUse:
        state = args.state_dir or default_state_dir()
        print(f"sidecar: another sidecar daemon is running on {state} (one daemon per state "
              "directory; stop it, or use another --state-dir)", file=sys.stderr)
        return EXIT_STATE_IN_USE
    except AddressInUse as exc:
        print(f"sidecar: {exc.strerror}", file=sys.stderr)
        return EXIT_ADDRESS_IN_USE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
