"""`command` manifest tools: real processes (python -c, sh -c) through a real Location."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from bridges.manifest_tools import BASE_ENV
from managed_store import Drained, SpoolWriter
from sidecar import ErrorKind, TextContent
from sidecar.model.permissions import PermissionRule
from tests.bridges.manifest_tools_support.location import (
    call,
    context,
    eventually,
    manifest_tools,
    open_location,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def location(tmp_path):
    async with open_location(tmp_path) as opened:
        yield opened

PY = sys.executable
A = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
NOTHING: dict[str, Any] = {"type": "object", "properties": {}}
PRINT_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"
INJECTIONS = [
    "; rm -rf /",
    "$(touch pwned)",
    "`touch pwned`",
    "../../etc/passwd",
    "a && touch pwned || touch pwned",
    "'; touch pwned; '",
    '"; touch pwned; "',
    "-rf",
    "$HOME ${PATH} *",
    "line1\nline2",
    "x > pwned",
]


def py(code: str, *args: str, input: dict[str, Any] | None = None, **keys: Any) -> dict[str, Any]:
    return {"kind": "command", "description": "test command", "input": input or NOTHING,
            "argv": [PY, "-c", code, *args], **keys}


def sh(command: str, input: dict[str, Any] | None = None, **keys: Any) -> dict[str, Any]:
    return {"kind": "command", "description": "test command", "input": input or NOTHING,
            "shell": True, "command": command, **keys}


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie waiting for an unrelated reaper is dead too)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def pids_in(path: Path) -> list[int]:
    """The pids a test command wrote to `path` (a complete line)."""
    return [int(pid) for pid in path.read_text().split()]


def complete(path: Path) -> bool:
    return path.exists() and path.read_text().endswith("\n")


def nothing_pwned(root: Path) -> bool:
    return not any(root.rglob("pwned")) and not Path("pwned").exists()


async def test_injection_attempts_arrive_as_plain_single_arguments(location):
    schema = {"type": "object", "properties": {f"v{i}": {"type": "string"}
                                               for i in range(len(INJECTIONS))}}
    argv = [f"{{v{i}}}" for i in range(len(INJECTIONS))]
    entries = {"args": py(PRINT_ARGV, *argv, "--opt={v0}", input=schema)}
    async with manifest_tools(location, entries):
        values = {f"v{i}": text for i, text in enumerate(INJECTIONS)}
        outcome = await call(location, "args", values)
    assert outcome.status == "completed", outcome.error
    assert json.loads(outcome.content[0].text) == [*INJECTIONS, f"--opt={INJECTIONS[0]}"]
    assert nothing_pwned(location.root)


async def test_shell_mode_quotes_every_value(location):
    entries = {"sh": sh("printf '[%s]\\n' {a} {b}; echo done",
                        {"type": "object", "properties": {"a": {"type": "string"},
                                                          "b": {"type": "array"}}})}
    async with manifest_tools(location, entries):
        outcome = await call(location, "sh", {"a": INJECTIONS[1], "b": INJECTIONS[:3]})
    assert outcome.status == "completed", outcome.error
    shown = [f"[{v}]" for v in (INJECTIONS[1], *INJECTIONS[:3])]
    assert outcome.content[0].text == "\n".join([*shown, "done", ""])
    assert nothing_pwned(location.root)


async def test_arrays_expand_and_absent_fields_drop_their_element(location):
    schema = {"type": "object", "properties": {"files": {"type": "array"},
                                               "n": {"type": "integer"},
                                               "opt": {"type": "string"}}}
    entries = {"args": py(PRINT_ARGV, "{files}", "-n", "{n}", "--opt={opt}", input=schema)}
    async with manifest_tools(location, entries):
        outcome = await call(location, "args", {"files": ["a b", "c"], "n": 3})
    assert json.loads(outcome.content[0].text) == ["a b", "c", "-n", "3"]


async def test_stdin_comes_from_a_field_and_cwd_stays_inside_the_root(location):
    (location.root / "sub").mkdir()
    code = "import os, sys; print(os.getcwd()); print(sys.stdin.read().upper())"
    entries = {
        "upper": py(code, input=A, stdin="a", cwd="sub"),
        "nostdin": py("import sys; print(repr(sys.stdin.read()))", input=A),
    }
    async with manifest_tools(location, entries):
        outcome = await call(location, "upper", {"a": "héllo\nwörld"})
        empty = await call(location, "nostdin", {"a": "x"})
    cwd, text = outcome.content[0].text.split("\n", 1)
    assert Path(cwd) == location.root / "sub"
    assert text == "HÉLLO\nWÖRLD\n"
    assert empty.content[0].text == "''\n"


async def test_big_stdin_and_stdout_flow_together_without_deadlock(location):
    entries = {
        "cat": {"kind": "command", "description": "cat", "input": A, "argv": ["cat"],
                "stdin": "a", "memory_cap_bytes": 65536},
        "ignores": py("print('did not read')", input=A, stdin="a"),
    }
    data = "".join(f"{i:07d}\n" for i in range(1_000_000))  # 8 MB through both pipes
    async with manifest_tools(location, entries):
        echoed = await call(location, "cat", {"a": data})
        ignored = await call(location, "ignores", {"a": data})
        stored = await location.seam.store.read_lines(echoed.metadata["stdout"]["ref"],
                                                      offset=999_999, limit=5)
    assert echoed.metadata["stdout"]["size_bytes"] == len(data)
    assert stored.text == "0999998\n0999999\n"
    assert ignored.status == "completed" and ignored.content[0].text == "did not read\n"


async def test_a_cwd_that_escapes_by_a_later_symlink_is_refused_at_call_time(location, tmp_path):
    (location.root / "later").mkdir()
    async with manifest_tools(location, {"t": py("print('ran')", cwd="later")}):
        (location.root / "later").rmdir()
        (location.root / "later").symlink_to(tmp_path)
        outcome = await call(location, "t", {})
    assert outcome.error.kind is ErrorKind.TOOL_FAILURE
    assert outcome.error.message == "t: cwd 'later' resolves outside the Location root"


async def test_only_allowed_variables_reach_the_child(location, monkeypatch):
    monkeypatch.setenv("MT_ALLOWED", "yes")
    monkeypatch.setenv("MT_SECRET", "never-seen")
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    entries = {"env": py(code, env_allow=["MT_ALLOWED", "MT_UNSET"],
                         env={"MT_EXPLICIT": "1", "MT_ALLOWED": "overridden"})}
    async with manifest_tools(location, entries):
        outcome = await call(location, "env", {})
    seen = json.loads(outcome.content[0].text)
    assert "MT_SECRET" not in seen and "MT_UNSET" not in seen
    assert seen["MT_EXPLICIT"] == "1" and seen["MT_ALLOWED"] == "overridden"
    assert set(seen) <= {*BASE_ENV, "MT_EXPLICIT", "MT_ALLOWED"}
    assert seen["PATH"] == os.environ["PATH"]


async def test_timeout_stops_the_whole_process_group(location, tmp_path):
    pids = tmp_path / "pids"
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '30'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{child.pid}} ' + str(__import__('os').getpid())"
        " + '\\n')\n"
        "print('started', flush=True)\n"
        "time.sleep(30)\n"
    )
    entries = {"slow": py(code, timeout=1.5, terminate_grace=0.5)}
    async with manifest_tools(location, entries):
        outcome = await call(location, "slow", {})
    assert outcome.error.kind is ErrorKind.TIMEOUT
    assert "timed out after 1.5 s; its process group was terminated" in outcome.error.message
    assert "stdout (last lines):\nstarted" in outcome.error.message
    for pid in pids_in(pids):
        await eventually(lambda pid=pid: gone(pid), within=2)  # SIGKILL was sent: dying


async def test_cancellation_stops_the_group_and_propagates(location, tmp_path):
    pids = tmp_path / "pids"
    code = (
        "import os, signal, subprocess, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # only SIGKILL ends this one
        "child = subprocess.Popen(['sleep', '30'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{child.pid}} {{os.getpid()}}\\n')\n"
        "time.sleep(30)\n"
    )
    entries = {"slow": py(code, timeout=30, terminate_grace=0.3)}
    async with manifest_tools(location, entries):
        task = asyncio.create_task(call(location, "slow", {}, call_id="cancelled"))
        await eventually(lambda: complete(pids))
        done_first = task.done()
        task.cancel()
        try:
            returned = await task
        except asyncio.CancelledError:
            pass
        else:  # seen once in CI on uvloop; say what the call did instead
            pytest.fail(f"the call was not cancelled (done before cancel(): {done_first}); "
                        f"it returned {returned!r}")
    for pid in pids_in(pids):
        await eventually(lambda pid=pid: gone(pid), within=2)  # SIGKILL was sent: dying
    assert await location.outcome("cancelled") is None  # a cancellation is never a result


async def test_a_failing_exit_code_reports_the_code_and_the_stderr_tail(location):
    code = ("import sys\n"
            "for i in range(100): print(f'err {{i}}', file=sys.stderr)\n"
            "print('some stdout'); sys.exit(3)")
    entries = {"fail": py(code), "ok1": sh("echo none; exit 1", success_codes=[0, 1]),
               "killed": sh("kill -9 $$")}
    async with manifest_tools(location, entries):
        failed = await call(location, "fail", {})
        ok1 = await call(location, "ok1", {})
        killed = await call(location, "killed", {})
    assert failed.error.kind is ErrorKind.TOOL_FAILURE
    message = failed.error.message
    assert message.startswith(f"fail: {PY} exited with code 3 (success codes: 0); stderr")
    assert message.endswith("err 98\nerr 99") and "err 79" not in message
    assert failed.partial == {"exit_code": 3}
    assert ok1.status == "completed" and ok1.content[0].text == "[exit code 1]\nnone\n"
    assert "was killed by signal SIGKILL" in killed.error.message


async def test_stderr_is_a_second_item_and_binary_output_is_replaced_and_said(location):
    code = ("import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe end\\n');"
            "sys.stderr.write('a warning\\n')")
    async with manifest_tools(location, {"bin": py(code)}):
        outcome = await call(location, "bin", {})
    assert outcome.content == (
        TextContent("[stdout is not valid UTF-8: invalid bytes were replaced with U+FFFD]\n"
                    "ok \ufffd\ufffd end\n"),
        TextContent("[stderr]\na warning\n"),
    )
    assert outcome.metadata == {"exit_code": 0, "stdout": {"replaced_invalid_bytes": True}}


async def test_huge_output_is_spooled_and_readable_through_managed_read(location):
    lines = 300_000  # 20.4 MB of numbered lines
    code = ("import sys\nw = sys.stdout.write\n"
            f"for i in range(1, {lines + 1}): w(f'line {{i:08d}} ' + 'x' * 53 + '\\n')")
    entries = {"big": py(code, memory_cap_bytes=65536, progress=True)}
    async with manifest_tools(location, entries):
        outcome = await call(location, "big", {})
        assert outcome.status == "completed", outcome.error
        ref = outcome.metadata["stdout"]["ref"]
        page = await call(location, "managed_read", {"ref": ref, "offset": 250_000, "limit": 2})
        found = await call(location, "managed_read", {"ref": ref, "pattern": "line 00299999"})
        last = await location.seam.store.read_lines(ref, offset=lines, limit=5)
    assert outcome.metadata["stdout"] == {"ref": ref, "size_bytes": lines * 68, "lines": lines}
    text = outcome.content[0].text
    assert text.startswith(f"[stdout: {lines * 68:,} bytes in {lines:,} lines, kept whole as "
                           f"{ref}")
    assert "line 00000001 " in text and "line 00300000 " in text
    assert f"(lines 101-{lines - 100:,} of {lines:,})" in text
    assert page.content[0].text.endswith(
        f"line 00250000 {'x' * 53}\nline 00250001 {'x' * 53}\n")
    assert "299999: line 00299999" in found.content[0].text
    assert last.text == f"line 00300000 {'x' * 53}\n"


@pytest.fixture
def fd_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The file descriptors `SpoolWriter.write_from` was given (it still does the work)."""
    given: list[int] = []
    real = SpoolWriter.write_from

    async def spy(self: SpoolWriter, fd: int, drained: Drained) -> None:
        given.append(fd)
        await real(self, fd, drained)

    monkeypatch.setattr(SpoolWriter, "write_from", spy)
    return given


async def test_spooled_output_is_read_off_the_loop_unless_lines_are_published(location, fd_reads):
    code = ("import sys\nw = sys.stdout.write\n"
            "for i in range(1, 100_001): w(f'line {i:08d} caf\u00e9 \u20ac\\n')\n"
            "sys.stderr.write('e' * 3_000_000)")
    # stderr beyond one read of the loop (READ_SIZE, a full pipe): whenever the loop wakes,
    # bytes are left for the spool's thread (200 KB could all be there for one read)
    entries = {"threaded": py(code, memory_cap_bytes=65536),
               "published": py(code, memory_cap_bytes=65536, progress=True)}
    async with manifest_tools(location, entries):
        threaded = await call(location, "threaded", {})
        assert len(fd_reads) == 2, "stdout and stderr were both read by the spool's thread"
        published = await call(location, "published", {})
        assert len(fd_reads) == 2, "with progress, the loop reads the lines itself"
        refs = [o.metadata["stdout"]["ref"] for o in (threaded, published)]
        texts = [await location.seam.store.read_bytes(ref, 0, 1 << 24) for ref in refs]
    assert threaded.status == published.status == "completed", threaded.error
    for name in ("stdout", "stderr"):
        assert {**threaded.metadata[name], "ref": ""} == {**published.metadata[name], "ref": ""}
    assert threaded.metadata["stdout"]["lines"] == 100_000
    assert texts[0].text == texts[1].text == "".join(
        f"line {i:08d} caf\u00e9 \u20ac\n" for i in range(1, 100_001))
    shown = [[item.text.replace(ref, "<ref>") for item in outcome.content]
             for outcome, ref in zip((threaded, published), refs, strict=True)]
    assert shown[0][0] == shown[1][0]


async def test_output_that_turns_invalid_after_spooling_began_is_replaced_and_said(
    location, fd_reads
):
    code = ("import sys, time\nw = sys.stdout.buffer.write\n"
            "w(b'valid line\\n' * 100_000); sys.stdout.flush(); time.sleep(0.2)\n"
            "w(b'bad \\xff byte\\n'); w(b'more\\n' * 100_000)")
    async with manifest_tools(location, {"bad": py(code, memory_cap_bytes=65536)}):
        outcome = await call(location, "bad", {})
        assert outcome.status == "completed", outcome.error
        stored = await location.seam.store.read_bytes(
            outcome.metadata["stdout"]["ref"], 0, 1 << 24)
    assert len(fd_reads) == 1
    assert outcome.metadata["stdout"]["replaced_invalid_bytes"] is True
    assert "[stdout is not valid UTF-8" in outcome.content[0].text
    assert stored.text == "valid line\n" * 100_000 + "bad \ufffd byte\n" + "more\n" * 100_000


async def test_a_descendant_holding_stdout_after_a_large_output_times_out_cleanly(
    location, tmp_path, fd_reads
):
    pid_file = tmp_path / "escaped"
    code = (
        "import os, subprocess, sys\n"
        "sys.stdout.write('output line\\n' * 100_000); sys.stdout.flush()\n"
        "child = subprocess.Popen(['sleep', '30'], start_new_session=True)\n"  # escapes the group
        f"open({str(pid_file)!r}, 'w').write(f'{{child.pid}}\\n')\n"
    )
    try:
        async with manifest_tools(location, {"held": py(code, timeout=1.5,
                                                        memory_cap_bytes=65536)}):
            outcome = await call(location, "held", {})
            ref = outcome.partial["stdout"]["ref"]
            stored = await location.seam.store.stat(ref)
    finally:
        for pid in pids_in(pid_file) if complete(pid_file) else []:
            os.kill(pid, 9)
    assert fd_reads, "the pipe was being read by the spool's thread when the timeout came"
    assert outcome.error.kind is ErrorKind.TIMEOUT
    assert "kept its output open until the timeout (1.5 s)" in outcome.error.message
    assert stored.size_bytes == len("output line\n") * 100_000


async def test_cancelling_while_the_spool_reads_the_pipe_propagates_and_keeps_nothing(
    location, tmp_path, fd_reads
):
    pids = tmp_path / "pids"
    code = (
        "import os, sys, time\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}}\\n')\n"
        "sys.stdout.write('output line\\n' * 100_000); sys.stdout.flush()\n"
        "while True: sys.stdout.write('slow\\n'); sys.stdout.flush(); time.sleep(0.05)\n"
    )
    async with manifest_tools(location, {"endless": py(code, memory_cap_bytes=65536)}):
        task = asyncio.create_task(call(location, "endless", {}, call_id="stopped"))
        await eventually(lambda: bool(fd_reads) and complete(pids))
        await asyncio.sleep(0.1)  # the spool's threads are reading the slow lines
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await location.seam.store.stats()).count == 0  # the spool was aborted
    assert not [t for t in threading.enumerate() if t.name.startswith("managed-store-append")]
    for pid in pids_in(pids):
        await eventually(lambda pid=pid: gone(pid), within=2)
    assert await location.outcome("stopped") is None


async def test_the_hard_cap_keeps_draining_and_states_the_exact_loss(location):
    code = ("import sys\nchunk = b'y' * 65536\n"
            "for _ in range(48): sys.stdout.buffer.write(chunk)\n"
            "sys.stdout.buffer.write(b'tail\\n'); print('done', file=sys.stderr)")
    total, limit = 48 * 65536 + 5, 1_000_003
    entries = {"cap": py(code, memory_cap_bytes=65536, max_output_bytes=limit)}
    async with manifest_tools(location, entries):
        outcome = await call(location, "cap", {})
        assert outcome.status == "completed", outcome.error
        stored = await location.seam.store.stat(outcome.metadata["stdout"]["ref"])
    assert outcome.metadata["stdout"]["kept_bytes"] == limit
    assert outcome.metadata["stdout"]["dropped_bytes"] == total - limit
    assert stored.size_bytes == limit
    assert outcome.content[0].text.startswith(
        f"[stdout reached max_output_bytes = {limit:,}: the last {total - limit:,} of its "
        f"{total:,} bytes were discarded (not kept)]\n[stdout: {limit:,} bytes"
    )
    assert outcome.content[1].text == "[stderr]\ndone\n"  # the command ran to its end


async def test_output_lines_are_published_as_progress_at_a_bounded_rate(location):
    code = ("import sys, time\n"
            "for i in range(1, 5):\n"
            "    print(f'step {{i}}', flush=True); time.sleep(0.25)\n"
            "for i in range(10_000): print(f'burst {{i}}')\n"
            "sys.stdout.write('no newline at the end')\n")
    entries = {"steps": py(code, progress=True), "quiet": py("print('a'); print('b')")}
    async with manifest_tools(location, entries), location.events.subscribe() as events:
        outcome = await call(location, "steps", {}, call_id="steps")
        await call(location, "quiet", {}, call_id="quiet")
        snapshots = []
        while not events.queue.empty():
            event = events.queue.get_nowait()
            if type(event).__name__ == "CallProgress":
                snapshots.append((event.call_id, event.snapshot))
    assert outcome.status == "completed"
    assert {call_id for call_id, _ in snapshots} == {"steps"}
    seen = [snapshot for _, snapshot in snapshots]
    assert 2 <= len(seen) <= 12  # about one per line while slow, rate-limited in the burst
    assert seen[0]["stream"] == "stdout" and seen[0]["line"].startswith("step ")
    assert seen[-1] == {"stream": "stdout", "line": "no newline at the end", "lines": 10_005}
    assert [s["lines"] for s in seen] == sorted({s["lines"] for s in seen})


async def test_json_output_with_and_without_a_schema(location):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    entries = {
        "typed": py("import sys; print(sys.argv[1])", "{a}", input=A, output="json",
                    output_schema=schema),
        "untyped": py("print('[1, 2]')", output="json"),
        "broken": py("print('not json')", output="json"),
    }
    async with manifest_tools(location, entries):
        good = await call(location, "typed", {"a": '{"n": 5}'})
        bad = await call(location, "typed", {"a": '{"n": "five"}'})
        untyped = await call(location, "untyped", {})
        broken = await call(location, "broken", {})
    assert good.output == {"n": 5} and good.content[0].text == '{"n":5}'
    assert bad.error.kind is ErrorKind.INVALID_OUTPUT and bad.error.path == "$.n"
    assert untyped.output is None and untyped.content[0].text == "[1, 2]\n"
    assert broken.error.kind is ErrorKind.TOOL_FAILURE
    assert broken.error.message.startswith("broken: stdout is not JSON")


async def test_a_missing_program_is_a_tool_failure(location):
    entry = {"kind": "command", "description": "d", "input": NOTHING,
             "argv": ["definitely-not-a-program-xyz"]}
    async with manifest_tools(location, {"nope": entry}):
        outcome = await call(location, "nope", {})
    assert outcome.error.kind is ErrorKind.TOOL_FAILURE
    assert outcome.error.message.startswith("nope: cannot start 'definitely-not-a-program-xyz'")


async def test_permission_is_asked_before_anything_runs(location, tmp_path):
    marker = tmp_path / "ran"
    entries = {"touch": py(f"open({str(marker)!r}, 'w')", "{a}", input=A, permission="ask")}
    async with manifest_tools(location, entries):
        location.permissions.set_location_rules([PermissionRule("touch", "deny")])
        denied = await location.snapshot(session_id="s1", hide_denied=False).execute(
            "touch", {"a": "x"}, context("denied"))
        location.permissions.set_location_rules([])  # the tool's default decision: ask
        task = asyncio.create_task(call(location, "touch", {"a": "y"}, call_id="asked"))
        await eventually(lambda: bool(location.permissions.pending()))
        [ask] = location.permissions.pending()
        assert not marker.exists()
        await location.permissions.reply(ask.id, "reject")
        rejected = await task
    assert denied.error.kind is ErrorKind.DENIED
    assert rejected.error.kind is ErrorKind.DECLINED
    assert ask.request.resources == (PY,)
    assert ask.request.metadata == {"kind": "command", "argv": [PY, "-c", ask.request.metadata[
        "argv"][2], "y"], "cwd": "."}
    assert not marker.exists()
