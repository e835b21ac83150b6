"""`sidecar token create|list|revoke`: scoped bearer tokens (`sidecar.stores.tokens`).

They work on the token store directly, so they need no running daemon: the state
directory's, or with `--store`/`SIDECAR_DATABASE_URL` the fleet database's. A running daemon
sees a new token at its next request, and a revoked one at once (the state directory) or
within 2 seconds (every replica on the database, `sidecar.backends.postgres.tokens`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bridges.manifest.loading import load_manifests
from sidecar.cli.database import database_line
from sidecar.cli.output import EXIT_DATABASE
from sidecar.serve.local_door import database_mismatch, read_info
from sidecar.stores.state_dir import UnsafeStateDir, prepare_state_dir
from sidecar.stores.tokens import TokenError, TokenStore, create_token

TOKENS_FILE = "tokens.sqlite"

OpenTokenStore = Callable[[Path], Awaitable[TokenStore]]
"""The state directory's token store, as the composition root chooses it
(`sidecar.daemon.daemon.open_token_store`)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
               common: argparse.ArgumentParser) -> None:
    token = sub.add_parser("token", help="scoped bearer tokens (each reaches some profiles)")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", parents=[common],
                                  help="make a token for one or more profiles")
    create.add_argument("--profile", action="append", required=True, metavar="NAME",
                        help="a profile the token reaches (repeatable)")
    create.add_argument("--label", default="", help="a note to recognise it by")
    create.add_argument("--user", default=None, metavar="NAME",
                        help="the user the token belongs to (the history and quotas count "
                             "its calls as theirs; docs/identities.md)")
    token_sub.add_parser("list", parents=[common], help="the scoped tokens (never secrets)")
    revoke = token_sub.add_parser("revoke", parents=[common], help="revoke a token by id")
    revoke.add_argument("id", help="the token id (tok_...)")


def profile_names(manifests: list[str]) -> list[str]:
    """The profiles a token may name: those the manifests declare, and the implicit
    all-tools `default` unless `default_profile` names another."""
    from sidecar.registry.profiles import DEFAULT_PROFILE

    loaded = load_manifests(manifests)
    names = set(loaded.profiles)
    if loaded.default_profile is None or loaded.default_profile.value not in loaded.profiles:
        names.add(DEFAULT_PROFILE)
    return sorted(names)


def undeclared(wanted: list[str], manifests: list[str]) -> str | None:
    """Why a token for `wanted` would reach nothing (a profile no manifest declares)."""
    known = profile_names(manifests)
    missing = [p for p in wanted if p not in known]
    if not missing:
        return None
    where = ", ".join(manifests) or "no manifests"
    return (f"no profile {', '.join(repr(m) for m in missing)} in the manifests ({where}); "
            f"declared: {', '.join(known)}")


async def run(args: argparse.Namespace, state: Path, open_store: OpenTokenStore,
              manifests: list[str] | None = None) -> int:
    """`create` refuses a profile that the running daemon's manifests (else `manifests`, when
    named) do not declare. Exit code 0 on success, 1 for an unknown id, 2 for a bad request
    (such a profile), an unsafe state directory or a daemon on it that keeps its tokens
    elsewhere, 6 when the fleet database cannot be used: unreachable at the start, or lost or
    silent midway (one line, `sidecar.cli.database`)."""
    try:
        warning = prepare_state_dir(state)
    except UnsafeStateDir as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return 2
    if warning:
        print(f"sidecar: {warning}", file=sys.stderr)
    daemon = read_info(state)  # its tokens must be the ones this command changes
    # the profiles to check against: the running daemon's manifests, else those named
    known = list(daemon.manifests) if daemon is not None else manifests
    if args.token_command == "create" and known is not None:
        problem = undeclared(args.profile, known)
        if problem is not None:
            print(f"sidecar token create: {problem}", file=sys.stderr)
            return 2
    database = os.environ.get("SIDECAR_DATABASE_URL", "").strip()
    refusal = (database_mismatch(daemon, database, "would change tokens in")
               if daemon is not None else None)
    if refusal is not None:
        print(f"sidecar: {refusal}", file=sys.stderr)
        return 2
    try:
        return await _run(args, state, open_store)
    except Exception as exc:  # unreachable at the start, or lost midway: one line
        line = database_line(exc, f"sidecar token {args.token_command}")
        if line is None:
            raise
        print(line, file=sys.stderr)
        return EXIT_DATABASE


async def _run(args: argparse.Namespace, state: Path, open_store: OpenTokenStore) -> int:
    store = await open_store(state)
    try:
        if args.token_command == "create":
            try:
                secret, record = await create_token(store, profiles=args.profile,
                                                    label=args.label, user=args.user)
            except TokenError as exc:
                print(f"sidecar: {exc}", file=sys.stderr)
                return 2
            if args.json:
                print(json.dumps({**record.to_json(), "token": secret}))
            else:
                owner = f" of user {record.user}" if record.user else ""
                print(f"token {record.id}{owner} for profile(s) {', '.join(record.profiles)}; "
                      "it is shown only now:", file=sys.stderr)
                print(secret)
            return 0
        if args.token_command == "list":
            records = await store.list()
            if args.json:
                print(json.dumps([r.to_json() for r in records]))
            elif not records:
                print("no scoped tokens (make one with `sidecar token create --profile NAME`; "
                      "the state directory's own token reaches everything)", file=sys.stderr)
            for r in records if not args.json else ():
                made = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.created_at))
                owner = f"  user {r.user}" if r.user else ""
                print(f"{r.id}  {','.join(r.profiles)}  {made} UTC{owner}  {r.label}".rstrip())
            return 0
        if await store.revoke(args.id):
            print(f"revoked {args.id}", file=sys.stderr)
            return 0
        print(f"sidecar: no token with id {args.id!r} (see `sidecar token list`)",
              file=sys.stderr)
        return 1
    finally:
        await store.aclose()
