"""Issue 26 items 1 and 13: catastrophic, unsupported and huge grep patterns, and offsets past
SQLite's integers, against a real `sidecar serve` process."""

from __future__ import annotations

import threading
from typing import Any

from tests.hardening.conftest import Daemon

CATASTROPHIC = [r"(a+)+$", r"^(\w+\s?)*$", r"(x+x+)+y", r"(.*a){12}$"]


def _managed_ref(daemon: Daemon, line: str, count: int = 4000) -> str:
    outcome = daemon.call("text", {"line": line, "count": count}, f"big-{len(line)}-{count}")
    assert outcome["status"] == "completed", outcome
    return str(outcome["managed"][0]["ref"])


def test_catastrophic_patterns_return_while_health_keeps_answering(daemon: Daemon) -> None:
    ref = _managed_ref(daemon, "a" * 28 + "!")
    sentence = _managed_ref(daemon, "an ordinary sentence with words in it that goes on and on!")
    results: dict[str, Any] = {}

    def grep(target: str, pattern: str) -> None:
        with daemon.client(timeout=120) as client:
            results[target + pattern] = client.get(f"/v1/managed/{target}",
                                                   params={"pattern": pattern})

    # Two at a time: the daemon runs at most 2 searches per client (test_search_limits.py).
    jobs = [(target, pattern) for target in (ref, sentence) for pattern in CATASTROPHIC]
    for pair in (jobs[i:i + 2] for i in range(0, len(jobs), 2)):
        threads = [threading.Thread(target=grep, args=job) for job in pair]
        for thread in threads:
            thread.start()
        daemon.health(timeout=2.0)  # not stalled while the searches run
        for thread in threads:
            thread.join(timeout=120)
            assert not thread.is_alive()
    for response in results.values():
        assert response.status_code == 200, response.text
    assert results[ref + CATASTROPHIC[0]].json()["matches"] == []
    assert results[sentence + CATASTROPHIC[1]].json()["matches"] == []
    outcome = daemon.call("managed_read", {"ref": ref, "pattern": r"(a+)+!$", "limit": 3}, "cat")
    assert outcome["status"] == "completed", outcome
    assert "3 matching line(s)" in outcome["content"][0]["text"]
    daemon.health()


def test_unsupported_and_oversized_patterns_are_invalid_input(daemon: Daemon) -> None:
    ref = _managed_ref(daemon, "abcabc")
    cases = {r"(abc)\1": "backreference", "(?=abc)": "lookahead", "(?<=a)b": "lookbehind",
             "a++": "possessive", "(unclosed": "missing )"}
    with daemon.client() as client:
        for pattern, reason in cases.items():
            response = client.get(f"/v1/managed/{ref}", params={"pattern": pattern})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "invalid_parameter" and error["field"] == "pattern"
            assert reason in error["message"]
        long = client.get(f"/v1/managed/{ref}", params={"pattern": "a" * 5000})
        assert long.status_code == 400 and "limit is 4,096" in long.json()["error"]["message"]
    for index, (pattern, reason) in enumerate(cases.items()):
        outcome = daemon.call("managed_read", {"ref": ref, "pattern": pattern}, f"bad-{index}")
        assert outcome["error"]["kind"] == "invalid_input", outcome
        assert reason in outcome["error"]["message"]
    # A 1.7 MB pattern is refused by the input schema before anything compiles it.
    huge = daemon.call("managed_read", {"ref": ref, "pattern": "(a|b)" * 340_000}, "huge")
    assert huge["error"]["kind"] == "invalid_input"
    assert huge["error"]["path"] == "$.pattern"
    daemon.health()


def test_an_offset_past_sqlite_integers_is_invalid_input(daemon: Daemon) -> None:
    ref = _managed_ref(daemon, "line")
    for index, offset in enumerate((2**63, 2**64 + 5, 2**62 + 1)):
        outcome = daemon.call("managed_read", {"ref": ref, "offset": offset}, f"offset-{index}")
        assert outcome["error"]["kind"] == "invalid_input", outcome
        assert outcome["error"]["path"] == "$.offset"
    with daemon.client() as client:
        response = client.get(f"/v1/managed/{ref}", params={"offset": str(2**63)})
        assert response.status_code == 400
        assert response.json()["error"]["field"] == "offset"
        past = client.get(f"/v1/managed/{ref}", params={"offset": str(2**62)})
        assert past.status_code == 200 and past.json()["text"] == ""
    daemon.health()
