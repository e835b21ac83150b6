"""`sidecar auth rekey [--check] [--json] [--store URL]`: seal every OAuth grant of the fleet
database again with the first key of `SIDECAR_GRANT_KEY`, so an old key can be dropped (a
grant that is never written again would keep the old key forever). Imports the postgres
grant backend, `sidecar.stores` and its `sidecar.cli` siblings; exports `rekey` (its exit
statuses are in its docstring). Users: docs/cli.md.

Each record is re-sealed under the grant store's per-server change lock
(`SealedGrantStore.reseal`), so a replica refreshing that grant at the same moment loses
nothing. Per server it reports: re-sealed, already under the first key, cannot be opened with
any given key (named by key id; left as it is), or gone (forgotten by a logout while rekey
ran: skipped). Then the logins waiting for their browser's redirect (`sidecar_pending_logins`)
are sealed again too, counted in one line (`pending logins: ...`); one no key opens cannot be
finished and expires within `PENDING_LOGIN_SECONDS` (reported, not a failure). No key and no
record is ever printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from sidecar.backends.postgres.grant_keys import (
    GRANT_KEY_ENV,
    GrantKeyMissing,
    Resealed,
    SealedGrantStore,
)
from sidecar.cli.database import database_url, scrubbed
from sidecar.cli.output import EXIT_DATABASE
from sidecar.serve.local_door import database_of
from sidecar.stores.errors import database_failure
from sidecar.stores.grants import GrantStore
from sidecar.stores.pending_logins import PENDING_LOGIN_SECONDS

_SAID = {
    "resealed": "re-sealed with the first key",
    "stale": "needs rekey",
    "current": "already under the first key",
    "unopenable": "cannot be opened",
    "gone": "gone (forgotten while rekey ran): skipped",
}
_COUNTED = {"resealed": "re-sealed", "stale": "to re-seal",
            "current": "already under the first key", "unopenable": "cannot be opened",
            "gone": "gone"}


async def rekey(args: argparse.Namespace, store: GrantStore) -> int:
    """Re-seal (with `--check`: only look, change nothing). Exit status 0: every record is
    (now) under the first key; 1: some record cannot be opened with any given key (or, with
    `--check`, is still under another key); 2: no fleet database (the embedded stores, the
    state directory's file and the OS keyring, are not sealed with `SIDECAR_GRANT_KEY`), or no
    key (`GrantKeyMissing`, reported by `sidecar.cli.auth.run`); 6: the database failed midway
    (the records done stay done: each is one transaction)."""
    if not isinstance(store, SealedGrantStore):
        print(f"sidecar auth rekey: nothing to rekey: {_embedded(store)}, which "
              f"{GRANT_KEY_ENV} does not seal; rekey re-seals the OAuth grants of a fleet "
              "database (--store postgresql://... or SIDECAR_DATABASE_URL)", file=sys.stderr)
        return 2
    keys = store.keys
    if keys is None:
        raise GrantKeyMissing
    results: list[Resealed] = []
    servers = await store.servers()
    for done, server in enumerate(servers):
        try:
            found = await store.reseal(server, check=args.check)
        except Exception as exc:
            failure = database_failure(exc)
            if failure is None:
                raise
            where = database_of(database_url())
            print(scrubbed(f"sidecar auth rekey: the fleet database {where} failed at the "
                            f"grant of {server} ({done} of {len(servers)} done, each one "
                            f"whole; run it again): {type(failure).__name__}: {failure}",
                            database_url()), file=sys.stderr)
            return EXIT_DATABASE
        results.append(found)  # "gone": forgotten (logout) meanwhile, nothing to seal
    try:
        waiting = await store.reseal_pending_logins(check=args.check)
    except Exception as exc:
        failure = database_failure(exc)
        if failure is None:
            raise
        print(scrubbed(f"sidecar auth rekey: the fleet database {database_of(database_url())} "
                        f"failed at the pending logins (every grant done; run it again): "
                        f"{type(failure).__name__}: {failure}", database_url()),
              file=sys.stderr)
        return EXIT_DATABASE
    counts: Counter[str] = Counter(r.outcome for r in results)
    if args.json:
        print(json.dumps({
            "check": args.check, "sealing_key_id": keys.ids[0], "key_ids": list(keys.ids),
            "grants": {r.server: {"outcome": r.outcome, "key_id": r.key_id,
                                  **({"reason": r.reason} if r.reason else {})}
                       for r in results},
            "counts": dict(counts), "pending_logins": dict(waiting)}, indent=2))
    else:
        _print(keys.ids, results, counts, waiting)
    failed = counts["unopenable"] + (counts["stale"] + waiting["stale"] if args.check else 0)
    if counts["unopenable"]:
        names = ", ".join(r.server for r in results if r.outcome == "unopenable")
        print(f"sidecar auth rekey: no key of {GRANT_KEY_ENV} opens the grant of {names}: "
              "left as it is", file=sys.stderr)
    return 1 if failed else 0


def _print(ids: tuple[str, ...], results: list[Resealed], counts: Counter[str],
           waiting: Counter[str]) -> None:
    print(f"first key of {GRANT_KEY_ENV}: key id {ids[0]} ({len(ids)} "
          f"key{'s' if len(ids) > 1 else ''} given)")
    for r in results:
        line = f"{r.server}: {_SAID[r.outcome]}"
        if r.outcome in ("resealed", "stale"):
            line += f" (was under key id {r.key_id})" if r.outcome == "resealed" else \
                f" (under key id {r.key_id})"
        elif r.outcome == "unopenable":
            line += (f", left as it is: {r.reason}; log in again (`sidecar auth login "
                     f"{r.server}`) or forget it (`sidecar auth logout {r.server}`)")
        print(line)
    total = len(results)
    summary = ", ".join(f"{counts[k]} {_COUNTED[k]}" for k in _COUNTED if counts[k])
    print(f"{total} grant{'' if total == 1 else 's'}" + (f": {summary}" if summary else ""))
    if waiting:
        said = ", ".join(f"{waiting[k]} {_COUNTED[k]}" for k in _COUNTED if waiting[k])
        print(f"pending logins (waiting for the browser): {said}" + (
            f" (those cannot be finished: they expire within {PENDING_LOGIN_SECONDS:g} s)"
            if waiting["unopenable"] else ""))
    if counts["stale"] or waiting["stale"]:
        print("run `sidecar auth rekey` without --check to re-seal them")
    elif not counts["unopenable"]:
        print(f"every grant is under key id {ids[0]}: the other keys can be dropped from "
              f"{GRANT_KEY_ENV} once every replica seals with this one")


def _embedded(store: GrantStore) -> str:
    path = getattr(store, "path", None)
    if path is not None:
        return f"without a fleet database OAuth grants are kept in {path} (mode 0600)"
    return "without a fleet database OAuth grants are kept in the OS keyring"
