"""Issue 26 item 11: values of a `shell = true` command never become shell source. The
heredoc attacks (`$(...)` in the body, an `EOF` line breaking out) and the unquoted-word ones
are sent to a real `sidecar serve` through `sidecar call`; each would create a file if any
value ran."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bridges.manifest_tools.shell_slots import place_slots
from bridges.manifest_tools.templates import Template
from tests.hardening.daemon_process import Daemon, run_cli, serving, sidecar_env

MANIFEST = '''
[tools.note]
kind = "command"
description = "writes a note through a heredoc"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
shell = true
command = """cat <<EOF
note: {text}
EOF"""

[tools.indented]
kind = "command"
description = "a <<- heredoc after a command substitution"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
shell = true
command = """x=$(printf '%s' {text}); cat <<-END
	{text}|$x
	END"""

[tools.words]
kind = "command"
description = "printf of unquoted words"
shell = true
command = "printf '[%s]' {a} {many}"

[tools.words.input]
type = "object"
required = ["a"]
properties = { a = { type = "string" }, many = { type = "array", items = { type = "string" } } }
'''

REFUSED = '''
[tools.quoted_heredoc]
kind = "command"
description = "nothing expands in a quoted heredoc"
input = { type = "object", properties = { text = { type = "string" } } }
shell = true
command = """cat <<'EOF'
{text}
EOF"""

[tools.arithmetic]
kind = "command"
description = "arithmetic evaluates values"
input = { type = "object", properties = { n = { type = "string" } } }
shell = true
command = "echo $(( {n} + 1 ))"
'''


_CALL_IDS = itertools.count()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("shell")
    manifests = root / "manifests"
    manifests.mkdir()
    (manifests / "tools.toml").write_text(MANIFEST)
    with serving(root / "state", manifests=manifests) as running:
        yield running


def _call(daemon: Daemon, tool: str, **values: object) -> str:
    """One call over the daemon's /v1 API (a real HTTP request to the process)."""
    headers = {"authorization": f"Bearer {daemon.token}"}
    with httpx.Client(base_url=daemon.url, headers=headers, timeout=60) as client:
        snapshot = client.post("/v1/snapshots", json={"session_id": "s"}).json()
        call_id = f"c{next(_CALL_IDS)}"
        context = {"session_id": "s", "agent": "a", "message_id": call_id, "call_id": call_id}
        response = client.post(f"/v1/snapshots/{snapshot['id']}/calls",
                               json={"name": tool, "input": values, "context": context})
    outcome = response.json()
    assert outcome["status"] == "completed", outcome
    return "".join(item["text"] for item in outcome["content"])


def _attacks(marker: Path) -> list[str]:
    return [
        f"$(touch {marker}-1)",
        f"`touch {marker}-2`",
        f"x\nEOF\ntouch {marker}-3\ncat <<EOF\ny",
        f"EOF\ntouch {marker}-4",
        f"\tEND\ntouch {marker}-5\ncat <<-END",
        f"${{x:=$(touch {marker}-6)}}",
        f"'; touch {marker}-7; '",
    ]


def test_a_heredoc_body_never_runs_a_value(daemon: Daemon, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for attack in _attacks(marker):
        assert _call(daemon, "note", text=attack) == f"note: {attack}\n"
        assert _call(daemon, "indented", text=attack) == f"{attack}|{attack}\n"
    assert list(tmp_path.iterdir()) == []


def test_unquoted_words_never_run_a_value_nor_split_it(daemon: Daemon, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for attack in [*_attacks(marker), "*", "a b", ""]:  # absent `many`: one empty word
        assert _call(daemon, "words", a=attack) == f"[{attack}][]"
    assert _call(daemon, "words", a="x", many=["$(id)", "a b", "*"]) == "[x][$(id)][a b][*]"
    assert list(tmp_path.iterdir()) == []


def test_places_no_value_can_work_are_refused_by_check_and_at_load(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "refused.toml").write_text(REFUSED)
    checked = run_cli("check", str(manifests), env=sidecar_env(tmp_path / "state"))
    assert checked.returncode == 1, checked.stdout
    assert "placeholder {text} stands in a heredoc with a quoted delimiter" in checked.stdout
    assert "placeholder {n} stands inside arithmetic" in checked.stdout
    with serving(tmp_path / "state", manifests=manifests) as daemon:
        env = sidecar_env(daemon.state, manifests)  # the manifests it serves
        names = [t["name"] for t in json.loads(run_cli("tools", "--json", env=env).stdout)]
        assert "quoted_heredoc" not in names and "arithmetic" not in names
        health = json.loads(run_cli("health", "--json", env=env).stdout)
        messages = " ".join(p["message"] for p in health["manifest_problems"])
        assert "quoted delimiter" in messages and "arithmetic" in messages


@pytest.mark.parametrize(("command", "contexts", "problem"), [
    ("cat <<EOF\n{a}\nEOF\necho {b}", ("heredoc", "word"), None),
    ("cat <<A <<B\n{a}\nA\n{b}\nB\necho {c}", ("heredoc", "heredoc", "word"), None),
    ("cat <<EOF\n$(echo {a}) {b}\nEOF", ("word", "heredoc"), None),
    ("awk '{print $1}' {f} # {g}", ("word", "word"), None),
    ("cat <<'EOF'\n{a}\nEOF", ("word",), "quoted delimiter"),
    ("cat <<{a}\nx\n", ("word",), "heredoc delimiter"),
    ("echo $(( {n} * 2 ))", ("word",), "arithmetic"),
    ("(( {n} > 1 ))", ("word",), "arithmetic"),
    ("echo ${a}", ("word",), "follows '$'"),
    ("cat <<EOF\n\\{a}\nEOF", ("word",), "follows a backslash"),
])
def test_each_slot_is_placed_by_its_shell_context(
    command: str, contexts: tuple[str, ...], problem: str | None
) -> None:
    placement = place_slots(Template.parse(command))
    assert placement.contexts == contexts
    if problem is None:
        assert placement.problems == ()
    else:
        assert len(placement.problems) == 1 and problem in placement.problems[0]
