"""Issue 38 item 3: expensive searches of retained text against a real `sidecar serve`.

A valid RE2 pattern on one 3.5 MB line runs about a minute; eight at once used to fill the
daemon's shared thread pool and stall `/v1/health` for 20 s and more. Each search must end with
a clear time-limit error (the limit holds inside the line), health and reads keep answering
meanwhile, and a client past its concurrent searches gets 429 naming the cap."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hardening.conftest import TEXT_TOOL, Daemon, start_daemon, stop_daemon
from tests.hardening.daemon_process import processes_with

SLOW = r"a.{1000}.{1000}c"  # ~20 µs a byte on random a/b text: over a minute for 3.5 MB
TIME_LIMIT = 3
_RANDOM = ("import random, sys; sys.stdout.write(''.join(random.Random(7).choices('ab', "
           "k=int(sys.argv[1]))) + chr(10))")
RANDOM_TOOL = f'''
[tools.random_line]
kind = "command"
description = "prints one line of random a and b"
argv = [{json.dumps(sys.executable)}, "-c", {json.dumps(_RANDOM)}, "{{size}}"]

[tools.random_line.input]
type = "object"
required = ["size"]
properties = {{ size = {{ type = "integer" }} }}
'''


def _searching_daemon(tmp_path: Path, **env: str) -> Iterator[Daemon]:
    running = start_daemon(tmp_path, env={"SIDECAR_SEARCH_TIME_LIMIT": str(TIME_LIMIT), **env},
                           manifests={"text.toml": TEXT_TOOL, "random.toml": RANDOM_TOOL})
    try:
        yield running
    finally:
        stop_daemon(running)


@pytest.fixture
def uncapped(tmp_path: Path) -> Iterator[Daemon]:
    yield from _searching_daemon(tmp_path, SIDECAR_SEARCHES_PER_CLIENT="8")


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Daemon]:
    # The default cap (2 searches per client); a longer limit keeps both slots taken while
    # the test sends its refused requests.
    yield from _searching_daemon(tmp_path, SIDECAR_SEARCH_TIME_LIMIT="6")


def _long_line(daemon: Daemon) -> str:
    outcome = daemon.call("random_line", {"size": 3_500_000}, "long-line")
    assert outcome["status"] == "completed", outcome
    return str(outcome["managed"][0]["ref"])


def _search(daemon: Daemon, ref: str, via: str, key: str, results: dict[str, Any]) -> None:
    started = time.monotonic()
    if via == "http":
        with daemon.client(timeout=120) as client:
            response = client.get(f"/v1/managed/{ref}", params={"pattern": SLOW})
        results[key] = (response.status_code, response.json(), time.monotonic() - started)
    else:
        outcome = daemon.call("managed_read", {"ref": ref, "pattern": SLOW}, key)
        results[key] = (outcome["status"], outcome, time.monotonic() - started)


def _children(daemon: Daemon) -> list[int]:
    def parent(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])

    found = []
    for pid in processes_with("search_worker.py"):
        try:
            if parent(pid) == daemon.proc.pid:
                found.append(pid)
        except (OSError, IndexError):
            continue
    return found


def test_eight_expensive_searches_end_at_the_limit_while_health_answers(
        uncapped: Daemon) -> None:
    ref = _long_line(uncapped)
    small = uncapped.call("text", {"line": "a short line", "count": 4000}, "small")
    small_ref = small["managed"][0]["ref"]
    results: dict[str, Any] = {}
    threads = [threading.Thread(target=_search, args=(uncapped, ref, via, f"{via}-{n}", results))
               for via in ("http", "tool") for n in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # the searches are admitted and matching
    health, reads = [], []
    workers = set(_children(uncapped))
    while any(thread.is_alive() for thread in threads):
        workers.update(_children(uncapped))
        started = time.monotonic()
        uncapped.health(timeout=5.0)
        health.append(time.monotonic() - started)
        started = time.monotonic()
        with uncapped.client(timeout=5.0) as client:
            page = client.get(f"/v1/managed/{small_ref}", params={"offset": 2, "limit": 1})
        assert page.status_code == 200 and page.json()["text"] == "a short line\n"
        reads.append(time.monotonic() - started)
    for thread in threads:
        thread.join(timeout=120)
    print(f"health during 8 searches: {len(health)} probes, max {max(health):.3f} s; "
          f"page reads max {max(reads):.3f} s")
    assert len(health) >= 3 and max(health) < 2.0 and max(reads) < 2.0  # generous: not stalled
    assert sorted(results) == sorted(f"{via}-{n}" for via in ("http", "tool") for n in range(4))
    for key, (status, body, took) in results.items():
        assert took < TIME_LIMIT + 15, (key, took)  # not the minute the match alone takes
        if key.startswith("http"):
            assert status == 422, body
            error = body["error"]
            assert error["code"] == "search_timeout" and error["field"] == "pattern"
        else:
            assert status == "error", body
            error = body["error"]
            assert error["kind"] == "timeout"
        assert f"search of {ref} stopped after {TIME_LIMIT} s at line 1:" in error["message"]
    # Each search past its limit killed its worker process (an RE2 match cannot be stopped);
    # those the daemon keeps idle end with it.
    assert len(workers) >= 4
    workers.update(_children(uncapped))
    stop_daemon(uncapped)
    assert not workers & set(processes_with("search_worker.py"))


def test_a_client_past_its_concurrent_searches_gets_429_naming_the_cap(capped: Daemon) -> None:
    ref = _long_line(capped)
    results: dict[str, Any] = {}
    running = [threading.Thread(target=_search, args=(capped, ref, "http", f"slow-{n}", results))
               for n in range(2)]
    for thread in running:
        thread.start()
    time.sleep(1.0)  # both admitted (generous); each holds a slot until its 6 s limit
    with capped.client() as client:
        refused = client.get(f"/v1/managed/{ref}", params={"pattern": "b"})
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "too_many_searches" and error["field"] == "pattern"
    assert ("the all-access token already runs 2, the limit is 2 concurrent searches per client"
            in error["message"])
    tool = capped.call("managed_read", {"ref": ref, "pattern": "b"}, "refused-tool")
    assert tool["error"]["kind"] == "unavailable", tool
    assert "limit is 2 concurrent searches per client" in tool["error"]["message"]
    for thread in running:
        thread.join(timeout=120)
    assert [results[f"slow-{n}"][0] for n in range(2)] == [422, 422]
    with capped.client() as client:  # the slots are free again
        again = client.get(f"/v1/managed/{ref}", params={"pattern": "^[ab]+$"})
    assert again.status_code == 200 and [m["line"] for m in again.json()["matches"]] == [1]
    capped.health()
