"""`sidecar calls [filters] [--json | --jsonl]`: the call history (`sidecar.stores.call_history`).

Like the other client commands it asks the state directory's daemon (`GET /v1/calls`, over the
local socket or `--url`); with `--embedded` it reads the history itself and starts nothing:
the state directory's `history.sqlite`, or the fleet database's (`--store`,
`SIDECAR_DATABASE_URL`). `--jsonl` prints every matching row (all pages) as JSON Lines,
for export; `--json` prints one page with its `next_cursor`. A row shows the tokens of what
the call returned to the model (cl100k_base, `content_tokens`); a failed call's ends with its
error message, and its guardrail decisions when a guardrail applied (docs/guardrails.md).
`--since`/`--until` also take a duration back from now (`30s`, `15m`,
`1h`, `2d`, `1w`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.cli.database import database_line
from sidecar.cli.output import EXIT_DATABASE
from sidecar.stores.call_history import CallHistory, CallQuery, CallRecord, InvalidQuery

if TYPE_CHECKING:
    from sidecar.cli.targets import RemoteBackend

FILTERS = ("tool", "server", "status", "session", "agent", "profile", "user", "since",
           "until", "limit", "cursor")
OpenCallHistory = Callable[[Path], Awaitable[CallHistory | None]]
"""The history `--embedded` reads, as the composition root chooses it
(`sidecar.daemon.daemon.open_call_history`; None: there is none yet)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
               client: argparse.ArgumentParser) -> None:
    calls = sub.add_parser("calls", parents=[client], help="the call history (newest first)")
    for name in FILTERS:
        calls.add_argument(f"--{name}", default=None, help={
            "since": "from this time (ISO 8601, UTC unless an offset is given, or epoch s) "
                     "or this long ago (30s, 15m, 1h, 2d, 1w)",
            "until": "before this time (the same forms)",
            "limit": "rows per page (1-1000, default 50)",
            "cursor": "the next page (printed after a page)",
        }.get(name, f"only calls with this {name}"))
    calls.add_argument("--jsonl", action="store_true",
                       help="every matching row as JSON Lines (an export)")


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
ERROR_SHOWN = 300
"""Characters of a failed call's error message on its line (`--json` has all of it)."""


def _params(args: argparse.Namespace) -> dict[str, str]:
    params = {name: str(getattr(args, name)) for name in FILTERS
              if getattr(args, name) is not None}
    for name in ("since", "until"):
        if name in params:
            params[name] = _ago(params[name])
    params.setdefault("limit", "50")
    return params


def _ago(value: str) -> str:
    """A duration back from now (`1h`) as the UTC time it names; anything else as given."""
    found = _DURATION.fullmatch(value.strip().lower())
    if found is None:
        return value
    seconds = float(found[1]) * _UNIT_SECONDS[found[2]]
    moment = max(time.time() - seconds, 0.0)
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds")


def _line(row: dict[str, Any]) -> str:
    status = row["status"] + (f" {row['error_kind']}" if row.get("error_kind") else "")
    status += " (replayed)" if row.get("replayed") else ""
    refs = " " + " ".join(row["retained"]) if row.get("retained") else ""
    where = f"{row['server']}/" if row.get("server") else ""
    tokens = row.get("content_tokens")
    shown = f"  {tokens:,} tokens" if tokens is not None else ""
    return (f"{row['started_at']}  {row['call_id']}  {where}{row['tool']}  {status}  "
            f"{row['duration_ms']:.1f} ms{shown}  session {row['session_id']}  agent "
            f"{row['agent']}{refs}{_guardrail(row.get('guardrail'))}{_error(row.get('error'))}")


def _guardrail(decisions: list[dict[str, Any]] | None) -> str:
    """`  guardrail: output secrets redact (AWS Access Key)`, one part per decision."""
    if not decisions:
        return ""
    parts = []
    for d in decisions:
        found = d.get("kinds") or ([d["reason"]] if d.get("reason") else [])
        found = found or ([d["error"]] if d.get("error") else [])
        parts.append(f"{d.get('stage')} {d.get('rule')} {d.get('decision')}"
                     + (f" ({', '.join(map(str, found))})" if found else ""))
    return "  guardrail: " + "; ".join(parts)


def _error(message: str | None) -> str:
    if not message:
        return ""
    flat = " ".join(message.split())
    return "  error: " + (flat if len(flat) <= ERROR_SHOWN else flat[:ERROR_SHOWN] + "…")


async def _local_pages(history: CallHistory | None, query: CallQuery, every: bool
                       ) -> tuple[list[dict[str, Any]], str | None]:
    if history is None:
        return [], None
    try:
        rows: list[CallRecord] = []
        page: CallQuery | None = query
        cursor: str | None = None
        while page is not None:
            found, cursor = await history.query(page)
            rows += found
            page = replace(page, cursor=cursor) if every and cursor is not None else None
        return [r.to_json() for r in rows], cursor
    finally:
        await history.aclose()


async def run(args: argparse.Namespace, state: Path, remote: RemoteBackend | None,
              open_history: OpenCallHistory) -> int:
    """Exit code 0, or 2 for a bad filter or a refused request, or 6 when the fleet database
    cannot be used (`--embedded`: unreachable at the start, or lost or silent midway; one
    line, `sidecar.cli.database`)."""
    params = _params(args)
    try:
        query = CallQuery.from_params(params)
    except InvalidQuery as exc:
        print(f"sidecar calls: {exc}", file=sys.stderr)
        return 2
    if remote is not None:
        async with remote:
            rows: list[dict[str, Any]] = []
            cursor: str | None = None
            while True:
                page = await remote.history({**params, **({"cursor": cursor} if cursor else {})})
                rows += page["calls"]
                cursor = page["next_cursor"]
                if not args.jsonl or cursor is None:
                    break
    else:
        try:
            rows, cursor = await _local_pages(await open_history(state), query, args.jsonl)
        except Exception as exc:  # unreachable at the start, or lost midway: one line
            line = database_line(exc, "sidecar calls --embedded")
            if line is None:
                raise
            print(line, file=sys.stderr)
            return EXIT_DATABASE
    if args.jsonl:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False))
    elif args.json:
        print(json.dumps({"calls": rows, "next_cursor": cursor}, indent=2, ensure_ascii=False))
    else:
        for row in rows:
            print(_line(row))
        if not rows:
            print("no calls match", file=sys.stderr)
        if cursor is not None:
            more = " ".join(f"--{k} {v}" for k, v in params.items() if k != "cursor")
            print(f"more: sidecar calls {more} --cursor {cursor}".replace("  ", " "),
                  file=sys.stderr)
    return 0
