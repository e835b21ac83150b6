"""`sidecar asks [--session S]` and `sidecar asks reply ID once|always|reject`: the permission
asks calls wait on, and their answers (`GET /v1/permissions`, `POST
/v1/permissions/{id}/reply` of the state directory's daemon, or `--url`). Asks live in a
running daemon, so `--embedded` has none to show.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sidecar.cli.output import EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE

if TYPE_CHECKING:
    from sidecar.cli.targets import RemoteBackend

REPLIES = ("once", "always", "reject")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
               client: argparse.ArgumentParser) -> None:
    asks = sub.add_parser(
        "asks", parents=[client], help="permission asks waiting for an answer",
        description="List the permission asks calls wait on, or answer one: `sidecar asks "
        "reply ID once|always|reject`.")
    asks.add_argument("reply", nargs="*", metavar="reply ID ANSWER",
                      help="answer ask ID: once (this call), always (a rule for the session, "
                      "or with --scope location for every session) or reject")
    asks.add_argument("--session", default=None, help="only this session's asks")
    asks.add_argument("--scope", choices=("session", "location"), default="session",
                      help="where an `always` answer applies (default: the session)")
    asks.add_argument("--feedback", default=None,
                      help="a note for the model with a rejection")


def _line(ask: dict[str, Any], now: float) -> str:
    source = ask.get("source") or {}
    waited = max(0.0, now - float(ask.get("created_at") or now))
    resources = f" on {', '.join(ask['resources'])}" if ask.get("resources") else ""
    return (f"{ask['id']}  {ask['action']}{resources}  session {ask['session_id']}  "
            f"agent {ask['agent']}  call {source.get('call_id') or '-'}  waiting {waited:.0f} s")


async def run(args: argparse.Namespace, backend: RemoteBackend | None) -> int:
    """Exit 0 when listed or answered, 1 for an ask that is not pending, 2 for a bad request
    (or `--embedded`, which has no asks)."""
    if backend is None:
        print("sidecar asks: asks wait in a running daemon; --embedded has none",
              file=sys.stderr)
        return EXIT_USAGE
    if args.reply:
        return await _reply(args, backend)
    params = {"session_id": args.session} if args.session else {}
    pending = list((await backend.request("GET", "/v1/permissions", params=params))["pending"])
    if args.json:
        print(json.dumps(pending, indent=2))
        return EXIT_OK
    if not pending:
        print("no permission ask is waiting" + (f" in session {args.session}"
                                                 if args.session else ""))
    now = time.time()
    for ask in pending:
        print(_line(ask, now))
    return EXIT_OK


async def _reply(args: argparse.Namespace, backend: RemoteBackend) -> int:
    from sidecar.cli.targets import Refused

    if len(args.reply) != 3 or args.reply[0] != "reply" or args.reply[2] not in REPLIES:
        print("sidecar asks: usage: sidecar asks reply ID once|always|reject",
              file=sys.stderr)
        return EXIT_USAGE
    ask_id, answer = args.reply[1], args.reply[2]
    body: dict[str, Any] = {"reply": answer, "scope": args.scope}
    if args.feedback is not None:
        body["feedback"] = args.feedback
    try:
        await backend.request("POST", f"/v1/permissions/{quote(ask_id, safe='')}/reply",
                              json=body)
    except Refused as exc:
        if exc.code != "unknown_ask":
            raise
        print(f"sidecar asks: no ask {ask_id!r} is waiting (answered, withdrawn or expired; "
              "`sidecar asks` lists those that are)", file=sys.stderr)
        return EXIT_TOOL_ERROR
    print(f"answered {ask_id}: {answer}", file=sys.stderr)
    return EXIT_OK
