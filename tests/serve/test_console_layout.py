"""The console and `sidecar calls` with a realistic history, against a real `sidecar serve`:
every console page fits a 1280 px window (no horizontal scroll) with long tool names, long
ids, inputs and errors; a failed call's error message is shown on the calls page and by
`sidecar calls`; `--since`/`--until` take durations (`1h`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from sidecar.cli.calls import _ago
from tests.serve.test_console import SIDECAR, Daemon, login, serving, shot
from tests.serve.test_console import browser as browser  # a fixture
from tests.serve.test_console import page as page  # a fixture

LONG_TOOL = "github_enterprise_repository_pull_request_review_comments_list_a"  # 64, the most
FAILING = "migrate_production_database_schema_to_the_next_release_version"
FAILURE = "migration 0042_add_customer_billing_address_index failed: relation"
DETAIL = f"customer_billing_addresses_{'without_a_break_' * 20} does not exist"
MANIFEST = f"""
[tools.{LONG_TOOL}]
kind = "command"
description = "List every review comment of a pull request ({"very " * 60}long description)"
input = {{ type = "object", required = ["n"], properties = {{ n = {{ type = "integer" }}, \
query = {{ type = "string" }} }} }}
argv = ["seq", "{{n}}"]

[tools.{FAILING}]
kind = "command"
description = "Fails the way a real migration does"
input = {{ type = "object", properties = {{}} }}
argv = ["sh", "-c", "echo '{FAILURE} {DETAIL}' >&2; exit 3"]

[tools.deploy_the_service_to_the_production_cluster_in_every_region]
kind = "command"
description = "Asks first"
input = {{ type = "object", properties = {{ target = {{ type = "string" }} }} }}
argv = ["echo", "deployed {{target}}"]

[[permissions.rules]]
action = "deploy_the_service_to_the_production_cluster_in_every_region"
decision = "ask"

[profiles.platform_engineering_on_call_with_production_access_and_more]
include = ["deploy_*"]
"""
BROKEN_SERVER = {"command": sys.executable,
                 "args": ["-c", f"raise SystemExit('cannot reach {'z' * 400}')"]}
WIDTH = 1280
PAGES = ["/ui", "/ui/tools", "/ui/calls", "/ui/asks", "/ui/managed"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    servers = {"mcpServers": {"an_upstream_server_whose_process_exits_at_start": BROKEN_SERVER}}
    with serving(tmp_path_factory.mktemp("layout"),
                 {"tools.toml": MANIFEST, "servers.json": json.dumps(servers)}) as started:
        yield started


@pytest.fixture(scope="module")
def history(daemon: Daemon) -> dict[str, Any]:
    """A history as a day of agents leaves it: many calls with long ids and inputs, one
    retained output, one failed call, one call waiting for a permission answer."""
    query = "author:" + "someone-with-a-long-handle" * 10
    for i in range(40):
        done = daemon.call(LONG_TOOL, {"n": 3, "query": query},
                           f"toolu_01{'Q' * 40}{i:03d}",
                           session=f"mcp-session-{'7f3a9c' * 8}-{i % 4}")
        assert done["status"] == "completed", done
    big = daemon.call(LONG_TOOL, {"n": 100_000}, "big-output", session="s-big")
    failed = daemon.call(FAILING, {}, "failed-migration", session="s-fail")
    assert failed["status"] == "error", failed
    waiting = daemon.call("deploy_the_service_to_the_production_cluster_in_every_region",
                          {"target": "eu-" * 60}, "waits-for-an-answer", wait=False)
    assert waiting["status"] == "running", waiting
    return {"ref": big["managed"][0]["ref"], "error": failed["error"]["message"]}


def fits(page: Page) -> None:
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[1] == WIDTH and widths[0] <= widths[1], (page.url, widths)


def test_every_console_page_fits_a_1280_px_window(
    page: Page, daemon: Daemon, history: dict[str, Any],
) -> None:
    login(page, daemon)
    for path in [*PAGES, f"/ui/managed?ref={history['ref']}",
                 f"/ui/managed?ref={history['ref']}&pattern=^9999"]:
        page.goto(f"{daemon.url}{path}")
        expect(page.locator("h1")).to_be_visible()
        fits(page)
    page.goto(f"{daemon.url}/ui/tools?profile="
              "platform_engineering_on_call_with_production_access_and_more")
    fits(page)


def test_a_failed_calls_error_is_shown_on_the_calls_page(
    page: Page, daemon: Daemon, history: dict[str, Any],
) -> None:
    assert FAILURE in history["error"]
    login(page, daemon)
    page.goto(f"{daemon.url}/ui/calls")
    shown = page.locator("table:not(#live) tbody tr", has_text=FAILURE)
    expect(shown).to_be_visible()
    fits(page)
    shot(page, "calls-failed")
    page.goto(f"{daemon.url}/ui/calls?status=error")
    expect(page.locator("table:not(#live) tbody")).to_contain_text(FAILURE)
    expect(page.locator("table:not(#live) tbody")).not_to_contain_text(LONG_TOOL)


def calls(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SIDECAR, "calls", *args], env=daemon.env, capture_output=True,
                          text=True, timeout=60, check=False)


def test_sidecar_calls_prints_the_error_of_a_failed_call(
    daemon: Daemon, history: dict[str, Any],
) -> None:
    shown = calls(daemon, "--session", "s-fail")
    assert shown.returncode == 0, shown.stderr
    (line,) = shown.stdout.splitlines()
    assert "failed-migration" in line and "error tool_failure" in line
    assert f"  error: {FAILING}: " in line and FAILURE in line
    assert line.endswith("…")  # cut on its line, whole in --json
    whole = json.loads(calls(daemon, "--session", "s-fail", "--json").stdout)
    assert whole["calls"][0]["error"] == history["error"]


@pytest.mark.parametrize(("since", "seconds"), [
    ("30s", 30), ("15m", 900), ("1h", 3600), ("2d", 172_800), ("1w", 604_800), ("90 m", 5400)])
def test_a_duration_names_that_long_ago(since: str, seconds: int) -> None:
    named = datetime.fromisoformat(_ago(since)).timestamp()
    assert abs(time.time() - seconds - named) < 5
    assert _ago("2026-12-01T00:00:00") == "2026-12-01T00:00:00"  # a time stays as given


@pytest.mark.parametrize("since", ["1h", "90 m"])  # every form: `_ago` above
def test_sidecar_calls_since_takes_a_duration(daemon: Daemon, since: str) -> None:
    daemon.call(LONG_TOOL, {"n": 1}, f"just-now-{since}", session=f"s-since-{since}")
    shown = calls(daemon, "--session", f"s-since-{since}", "--since", since)
    assert shown.returncode == 0, shown.stderr
    assert f"just-now-{since}" in shown.stdout
    before = calls(daemon, "--session", f"s-since-{since}", "--until", since)
    assert before.returncode == 0 and before.stdout == ""
    assert "no calls match" in before.stderr


def test_sidecar_calls_names_a_since_it_cannot_read(daemon: Daemon) -> None:
    bad = calls(daemon, "--since", "1 fortnight")
    assert bad.returncode == 2
    assert "since" in bad.stderr and "'1 fortnight'" in bad.stderr
