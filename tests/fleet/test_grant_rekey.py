"""`sidecar auth rekey` against the real PostgreSQL server, run as a real process: records
sealed with an old key are sealed again with the first key of `SIDECAR_GRANT_KEY` and then open
with the new key alone; a record no key opens is reported by key id and left as it is (exit 1);
`--check` changes nothing; the logins waiting for their browser's redirect are re-sealed too
(one no key opens is reported, not a failure); a writer changing a grant while rekey runs loses
nothing (rekey waits for the per-server change lock a replica holds, then seals what that
replica wrote); a connection cut midway is one line and exit 6, keeps what was done, and a
second run finishes; a grant forgotten (logout) while rekey waits for it is reported as gone
and skipped (exit 0); without a database rekey says there is nothing to rekey. No key and no
token is ever printed."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import asyncpg
import pytest

from sidecar.backends.postgres.grant_keys import GrantKeys, key_id
from sidecar.backends.postgres.grants import PostgresGrantStore
from sidecar.backends.postgres.pending_logins import PostgresPendingLogins
from sidecar.backends.postgres.pool import LOCK_GRANT_UPDATE
from sidecar.serve.local_door import database_of
from sidecar.stores.grants import GrantRecord
from tests.fleet.postgres import PostgresServer

# Every test runs the CLI as a process: one event loop flavour is enough.
pytestmark = [pytest.mark.anyio,
              pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])]


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def kid(key: str) -> str:
    return key_id(GrantKeys.parse(key).keys[0])  # type: ignore[union-attr]


def record(server: str, n: int = 0) -> GrantRecord:
    return {"resource": f"https://{server}.example/mcp", "n": n,
            "tokens": {"access_token": f"secret-at-{server}", "refresh_token": "secret-rt"}}


@pytest.fixture
async def dsn(postgres_server: PostgresServer) -> str:
    return await postgres_server.new_database()


@pytest.fixture
async def opened(dsn: str) -> AsyncIterator[list[PostgresGrantStore]]:
    stores: list[PostgresGrantStore] = []
    yield stores
    for store in stores:
        await store.aclose()


async def store_with(dsn: str, opened: list[PostgresGrantStore],
                     keys: str) -> PostgresGrantStore:
    store = await PostgresGrantStore.open(dsn)
    store.keys = GrantKeys.parse(keys)
    opened.append(store)
    return store


def cli_env(tmp_path: Path, grant_key: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(tmp_path / "state"),
               SIDECAR_MANIFESTS=str(tmp_path / "none"))
    if grant_key is not None:
        env["SIDECAR_GRANT_KEY"] = grant_key
    return env


def rekey_argv(*flags: str) -> list[str]:
    return [sys.executable, "-m", "sidecar.cli", "auth", "rekey", *flags]


async def rekey(env: dict[str, str], *flags: str) -> tuple[int, str, str]:
    done = await anyio.run_process(rekey_argv(*flags), env=env, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def rows(dsn: str) -> dict[str, tuple[str, bytes]]:
    conn = await asyncpg.connect(dsn)
    try:
        found = await conn.fetch("SELECT server, key_id, sealed FROM sidecar_grants")
    finally:
        await conn.close()
    return {r["server"]: (r["key_id"], bytes(r["sealed"])) for r in found}


def no_secret_in(text: str, *keys: str) -> None:
    assert "secret-" not in text
    for key in keys:
        assert key not in text and key.rstrip("=") not in text


async def test_old_records_are_resealed_and_one_no_key_opens_is_left(
    dsn: str, opened: list[PostgresGrantStore], tmp_path: Path
) -> None:
    old, new, lost = new_key(), new_key(), new_key()
    before = await store_with(dsn, opened, old)
    for server in ("alpha", "beta", "changed"):
        await before.put(server, record(server))
    await (await store_with(dsn, opened, new)).put("gamma", record("gamma"))
    await (await store_with(dsn, opened, lost)).put("lost", record("lost"))
    conn = await asyncpg.connect(dsn)
    try:  # one bit of `changed` flipped: its key is given, but it does not decrypt
        await conn.execute("UPDATE sidecar_grants SET sealed = set_byte(sealed, 20, "
                           "get_byte(sealed, 20) # 1) WHERE server = 'changed'")
    finally:
        await conn.close()
    # two logins waiting for their browser's redirect: one under the old key, one under a key
    # not given (it cannot be finished; reported, not a failure)
    waiting_state, lost_state = "state-" + "w" * 40, "state-" + "l" * 40
    for state, key in ((waiting_state, old), (lost_state, lost)):
        pending = await PostgresPendingLogins.open(dsn)
        pending.keys = GrantKeys.parse(key)
        await pending.add(state, "alpha", {"code_verifier": "secret-verifier"}, 300)
        await pending.aclose()
    env = cli_env(tmp_path, f"{new},{old}")
    untouched = await rows(dsn)

    code, out, err = await rekey(env, "--check", "--store", dsn)
    assert code == 1, err
    assert ("pending logins (waiting for the browser): 1 to re-seal, 1 cannot be opened "
            "(those cannot be finished: they expire within 300 s)") in out
    assert f"alpha: needs rekey (under key id {kid(old)})" in out
    assert "gamma: already under the first key" in out
    assert f"lost: cannot be opened, left as it is: sealed with key id {kid(lost)}, " \
           "which is not in SIDECAR_GRANT_KEY" in out
    assert f"changed: cannot be opened, left as it is: does not decrypt with its key (key " \
           f"id {kid(old)})" in out
    assert "5 grants: 2 to re-seal, 1 already under the first key, 2 cannot be opened" in out
    assert await rows(dsn) == untouched  # --check changes nothing
    code, out_json, err = await rekey(env, "--check", "--json", "--store", dsn)
    report = json.loads(out_json)
    assert code == 1 and report["sealing_key_id"] == kid(new)
    assert report["key_ids"] == [kid(new), kid(old)]
    assert {s: g["outcome"] for s, g in report["grants"].items()} == {
        "alpha": "stale", "beta": "stale", "changed": "unopenable", "gamma": "current",
        "lost": "unopenable"}
    assert report["pending_logins"] == {"stale": 1, "unopenable": 1}
    assert await rows(dsn) == untouched

    code, out2, err2 = await rekey(env, "--store", dsn)
    assert code == 1  # `lost` and `changed` cannot be opened
    assert f"alpha: re-sealed with the first key (was under key id {kid(old)})" in out2
    assert "beta: re-sealed" in out2 and "gamma: already under the first key" in out2
    assert "no key of SIDECAR_GRANT_KEY opens the grant of changed, lost" in err2
    assert "pending logins (waiting for the browser): 1 re-sealed, 1 cannot be opened" in out2
    finishing = await PostgresPendingLogins.open(dsn)
    try:  # the waiting login is finished by a replica that has the new key alone
        finishing.keys = GrantKeys.parse(new)
        assert await finishing.take(waiting_state, "alpha") == {
            "code_verifier": "secret-verifier"}
    finally:
        await finishing.aclose()
    after = await rows(dsn)
    assert {s: after[s][0] for s in ("alpha", "beta", "gamma")} == dict.fromkeys(
        ("alpha", "beta", "gamma"), kid(new))
    assert after["lost"] == untouched["lost"] and after["changed"] == untouched["changed"]
    assert after["gamma"] == untouched["gamma"]  # already current: not written again
    only_new = await store_with(dsn, opened, new)
    for server in ("alpha", "beta", "gamma"):
        assert await only_new.get(server) == record(server)

    for server in ("lost", "changed"):  # forgotten: now nothing needs the old key
        assert await only_new.delete(server)
    code, out3, err3 = await rekey(env, "--check", "--store", dsn)
    assert code == 0, err3
    assert "3 grants: 3 already under the first key" in out3
    assert "pending logins (waiting for the browser): 1 cannot be opened" in out3
    assert f"every grant is under key id {kid(new)}" in out3
    code, out4, err4 = await rekey(cli_env(tmp_path, None), "--store", dsn)
    assert code == 2 and "SIDECAR_GRANT_KEY, which is not set" in err4
    for text in (out, err, out_json, out2, err2, out3, err3, out4, err4):
        no_secret_in(text, old, new, lost)


async def test_without_a_database_there_is_nothing_to_rekey(tmp_path: Path) -> None:
    env = cli_env(tmp_path, new_key())
    code, out, err = await rekey(env)
    assert code == 2 and out == ""
    assert "nothing to rekey" in err and "oauth-tokens.json" in err
    assert "SIDECAR_GRANT_KEY does not seal" in err
    code, out, err = await rekey({**env, "SIDECAR_OAUTH_STORE": "keyring"}, "--check")
    assert code == 2 and "nothing to rekey" in err and "OS keyring" in err


async def test_a_writer_during_rekey_loses_nothing(
    dsn: str, opened: list[PostgresGrantStore], tmp_path: Path
) -> None:
    """A replica still sealing with the old key is in the middle of changing `s-00` (it holds
    the change lock) when rekey reaches it: rekey waits, then seals what that replica wrote.
    Meanwhile another replica keeps changing the other grants: every change is kept, and
    every record opens with the new key alone."""
    old, new = new_key(), new_key()
    servers = [f"s-{i:02}" for i in range(12)]
    seed = await store_with(dsn, opened, old)
    for server in servers:
        await seed.put(server, record(server))

    entered, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def bump(old_record: GrantRecord | None) -> GrantRecord:
        entered.set()
        if not release.wait(120):
            raise TimeoutError("the test never released the writer")
        assert old_record is not None
        return {**old_record, "n": old_record["n"] + 1}

    async def held_writer() -> None:  # its own loop: `bump` blocks it while the lock is held
        store = await PostgresGrantStore.open(dsn)
        store.keys = GrantKeys.parse(f"{old},{new}")  # not restarted yet: seals with old
        try:
            await store.update("s-00", bump)
        finally:
            await store.aclose()

    def in_thread() -> None:
        try:
            asyncio.run(held_writer())
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    thread = threading.Thread(target=in_thread, daemon=True)
    thread.start()
    try:
        assert await anyio.to_thread.run_sync(entered.wait, 60)
        rotated = await store_with(dsn, opened, f"{new},{old}")
        writes = dict.fromkeys(servers[1:], 0)
        ended = anyio.Event()
        output: dict[str, bytes] = {}

        def plus_one(r: GrantRecord | None) -> GrantRecord:
            assert r is not None
            return {**r, "n": r["n"] + 1}

        async def keep_writing() -> None:
            while not ended.is_set():
                for server in servers[1:]:
                    await rotated.update(server, plus_one)
                    writes[server] += 1

        async def wait_for_rekey_to_queue(proc: anyio.abc.Process) -> None:
            conn = await asyncpg.connect(dsn)
            try:
                await until_rekey_waits_for(conn, "s-00", proc)
            finally:
                await conn.close()
            release.set()  # the held change commits; rekey gets the lock after it

        async def drain(name: str, stream: anyio.abc.ByteReceiveStream | None) -> None:
            assert stream is not None
            output[name] = b"".join([chunk async for chunk in stream])

        async with await anyio.open_process(
                rekey_argv("--store", dsn), env=cli_env(tmp_path, f"{new},{old}")) as proc:
            async with anyio.create_task_group() as tg:
                tg.start_soon(keep_writing)
                tg.start_soon(drain, "out", proc.stdout)
                tg.start_soon(drain, "err", proc.stderr)
                with anyio.fail_after(120):
                    await wait_for_rekey_to_queue(proc)
                    await proc.wait()
                ended.set()
        out, err = output["out"].decode(), output["err"].decode()
        assert proc.returncode == 0, err
    finally:
        release.set()
        await anyio.to_thread.run_sync(thread.join, 60)
    assert not failures, failures
    assert f"s-00: re-sealed with the first key (was under key id {kid(old)})" in out
    assert min(writes.values()) > 0
    only_new = await store_with(dsn, opened, new)
    for server in servers:
        got: dict[str, Any] = await only_new.get(server) or {}
        assert got["n"] == (1 if server == "s-00" else writes[server]), server
        assert got["tokens"] == record(server)["tokens"]
    assert {k for k, _ in (await rows(dsn)).values()} == {kid(new)}
    no_secret_in(out + err, old, new)


async def test_a_database_failure_midway_keeps_what_was_done(
    dsn: str, opened: list[PostgresGrantStore], tmp_path: Path
) -> None:
    """rekey's connection is cut while it waits for `s-1`'s change lock: one line, exit 6,
    `s-0` stays re-sealed, the others stay as they were; run again, it finishes."""
    old, new = new_key(), new_key()
    seed = await store_with(dsn, opened, old)
    for server in ("s-0", "s-1", "s-2"):
        await seed.put(server, record(server))
    env = cli_env(tmp_path, f"{new},{old}")
    holder = await asyncpg.connect(dsn)
    try:
        await holder.execute("SELECT pg_advisory_lock($1, hashtext('s-1'))", LOCK_GRANT_UPDATE)
        async with await anyio.open_process(rekey_argv("--store", dsn), env=env) as proc:
            with anyio.fail_after(60):
                while not (waiting := await holder.fetchval(
                        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                        "AND classid = $1 AND objid::bigint = "
                        "(hashtext('s-1')::bigint & 4294967295)", LOCK_GRANT_UPDATE)):
                    assert proc.returncode is None, "rekey ended without waiting"
                    await anyio.sleep(0.05)
                await holder.execute("SELECT pg_terminate_backend($1)", waiting)
                await proc.wait()
            assert proc.stderr is not None
            err = b"".join([chunk async for chunk in proc.stderr]).decode()
        await holder.execute("SELECT pg_advisory_unlock_all()")
    finally:
        await holder.close()
    assert proc.returncode == 6, err
    assert f"the fleet database {database_of(dsn)} failed at the grant of s-1 (1 of 3 done" \
        in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert {s: k for s, (k, _) in (await rows(dsn)).items()} == {
        "s-0": kid(new), "s-1": kid(old), "s-2": kid(old)}
    code, out, err2 = await rekey(env, "--store", dsn)
    assert code == 0, err2
    assert "3 grants: 2 re-sealed, 1 already under the first key" in out
    no_secret_in(err + out + err2, old, new)


async def test_a_grant_forgotten_while_rekey_runs_is_reported_gone_and_skipped(
    dsn: str, opened: list[PostgresGrantStore], tmp_path: Path
) -> None:
    """A replica forgets `s-1` (a logout: it holds the change lock and deletes the record)
    while rekey waits for that lock: rekey then finds nothing to seal, says so, goes on."""
    old, new = new_key(), new_key()
    seed = await store_with(dsn, opened, old)
    for server in ("s-0", "s-1", "s-2"):
        await seed.put(server, record(server))
    holder = await asyncpg.connect(dsn)
    try:
        await holder.execute("SELECT pg_advisory_lock($1, hashtext('s-1'))", LOCK_GRANT_UPDATE)
        async with await anyio.open_process(rekey_argv("--store", dsn),
                                            env=cli_env(tmp_path, f"{new},{old}")) as proc:
            with anyio.fail_after(60):
                await until_rekey_waits_for(holder, "s-1", proc)
                await holder.execute("DELETE FROM sidecar_grants WHERE server = 's-1'")
                await holder.execute("SELECT pg_advisory_unlock($1, hashtext('s-1'))",
                                     LOCK_GRANT_UPDATE)
                await proc.wait()
            assert proc.stdout is not None and proc.stderr is not None
            out = b"".join([chunk async for chunk in proc.stdout]).decode()
            err = b"".join([chunk async for chunk in proc.stderr]).decode()
    finally:
        await holder.close()
    assert proc.returncode == 0, err
    assert "s-1: gone (forgotten while rekey ran): skipped" in out
    assert "s-0: re-sealed" in out and "s-2: re-sealed" in out
    assert "3 grants: 2 re-sealed, 1 gone" in out
    assert {s: k for s, (k, _) in (await rows(dsn)).items()} == {"s-0": kid(new),
                                                                "s-2": kid(new)}
    no_secret_in(out + err, old, new)


async def until_rekey_waits_for(conn: Any, server: str, proc: anyio.abc.Process) -> None:
    """Until the rekey process `proc` waits for the change lock of `server`'s grant."""
    while not await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND classid = $1 AND objid::bigint = (hashtext($2)::bigint & 4294967295)",
            LOCK_GRANT_UPDATE, server):
        assert proc.returncode is None, "rekey ended without waiting"
        await anyio.sleep(0.05)
