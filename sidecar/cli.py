"""The `sidecar` command line.

Implemented so far (each runs an embedded daemon on the state directory; talking to a running
daemon arrives with the HTTP frontend):

    sidecar tools [--json]                       the effective tool list
    sidecar call NAME [--input JSON] [--json]    one call through the seam
    sidecar managed read REF [--offset N] [--limit N] [--pattern RE]
    sidecar check FILE... [--json]               validate manifests (no daemon)
    sidecar check --schema                       print the manifest JSON Schema

Exit codes: 0 success, 1 the call ended in an error outcome (or `check` found errors),
2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Any

from bridges.manifest import load_manifests, manifest_json_schema
from sidecar.content import TextContent, item_to_json
from sidecar.daemon import Location
from sidecar.outcome import Outcome
from sidecar.tool import ToolContext

EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", help="state directory (default: $SIDECAR_STATE_DIR or "
                        "$XDG_STATE_HOME/mcp-sidecar)")
    common.add_argument("--manifests", action="append", default=None, metavar="DIR",
                        help="manifest directory or file (repeatable; default $SIDECAR_MANIFESTS)")
    common.add_argument("--json", action="store_true", help="machine-readable output")

    parser = argparse.ArgumentParser(prog="sidecar", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tools", parents=[common], help="list the effective tools")
    call = sub.add_parser("call", parents=[common], help="call one tool through the seam")
    call.add_argument("name")
    call.add_argument("--input", default="{}", help="the tool input as JSON (default {})")
    call.add_argument("--session", default="cli", help="session id (default: cli)")
    call.add_argument("--call-id", default=None, help="call id (default: a fresh one)")
    managed = sub.add_parser("managed", help="retained text")
    managed_sub = managed.add_subparsers(dest="managed_command", required=True)
    read = managed_sub.add_parser("read", parents=[common], help="read retained text")
    read.add_argument("ref")
    read.add_argument("--offset", type=int, default=1, help="first line, 1-based")
    read.add_argument("--limit", type=int, default=200, help="number of lines")
    read.add_argument("--pattern", default=None, help="regular expression to search for")
    check = sub.add_parser("check", help="validate manifests without starting anything")
    check.add_argument("files", nargs="*", metavar="FILE", help="manifest files or directories")
    check.add_argument("--schema", action="store_true", help="print the manifest JSON Schema")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _check(args: argparse.Namespace) -> int:
    if args.schema:
        print(json.dumps(manifest_json_schema(), indent=2, sort_keys=True))
        return EXIT_OK
    if not args.files:
        print("sidecar check: name at least one manifest file or directory", file=sys.stderr)
        return EXIT_USAGE
    loaded = load_manifests(args.files)
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
        errors = len(loaded.errors)
        print(f"{len(loaded.files)} file(s), {len(loaded.servers)} server(s), "
              f"{len(loaded.tools)} tool(s), {errors} error(s)")
    return EXIT_TOOL_ERROR if loaded.errors else EXIT_OK


def _manifests(args: argparse.Namespace) -> list[str]:
    if args.manifests:
        return list(args.manifests)
    env = os.environ.get("SIDECAR_MANIFESTS", "")
    return [p for p in env.split(os.pathsep) if p]


def _print_outcome(outcome: Outcome, as_json: bool) -> int:
    if as_json:
        print(json.dumps(outcome.to_json(), ensure_ascii=False, indent=2))
    elif outcome.status == "completed":
        for item in outcome.content:
            if isinstance(item, TextContent):
                print(item.text)
            else:
                summary = {k: v for k, v in item_to_json(item).items() if k not in ("data", "blob")}
                print(f"[{item.type}: {json.dumps(summary)}]")
    else:
        assert outcome.error is not None
        print(f"error ({outcome.error.kind.value}): {outcome.error.message}", file=sys.stderr)
    return EXIT_OK if outcome.status == "completed" else EXIT_TOOL_ERROR


async def _run(args: argparse.Namespace) -> int:
    async with Location.open(".", state_dir=args.state_dir, manifests=_manifests(args)) as loc:
        snapshot = loc.snapshot()
        if args.command == "tools":
            if args.json:
                print(json.dumps([d.to_json() for d in snapshot.definitions], indent=2))
            else:
                width = max((len(d.name) for d in snapshot.definitions), default=0)
                for d in snapshot.definitions:
                    summary = d.description.splitlines()[0] if d.description else ""
                    print(f"{d.name:<{width}}  {summary}")
            return EXIT_OK
        if args.command == "call":
            name, raw_input = args.name, args.input
        else:
            name = "managed_read"
            payload: dict[str, Any] = {"ref": args.ref, "offset": args.offset, "limit": args.limit}
            if args.pattern is not None:
                payload["pattern"] = args.pattern
            raw_input = json.dumps(payload)
        call_id = getattr(args, "call_id", None) or "cli_" + secrets.token_hex(8)
        context = ToolContext(
            session_id=getattr(args, "session", "cli"), agent="cli", message_id=call_id,
            call_id=call_id,
        )
        return _print_outcome(await snapshot.execute(name, raw_input, context), args.json)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check":
        return _check(args)
    try:
        import uvloop
    except ImportError:  # uvloop does not build on Windows
        return asyncio.run(_run(args))
    return uvloop.run(_run(args))


if __name__ == "__main__":
    sys.exit(main())
