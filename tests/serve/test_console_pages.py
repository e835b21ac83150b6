"""The console's pages about one thing, in Debian's chromium (Playwright) against one real
`sidecar serve` with the published server-everything over stdio and manifest tools: a tool
run from its generated form, a resource read, a prompt got, a failed call's error, a server's
stderr followed live and its restart, the metrics plots; every page fits 1,280 px and axe-core
finds no serious or critical violation. The same daemon answers the CLI's `logs`, `restart`,
`resources` and `prompts` (they rest on the /v1 routes the pages use).

One daemon and one browser for the module. `SIDECAR_CONSOLE_SCREENSHOTS=DIR` saves the
screenshots docs/ shows.
"""

from __future__ import annotations

import json
import selectors
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.serve.test_console import SIDECAR, Daemon, login, serving, shot
from tests.serve.test_console import browser as browser  # a fixture

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = ROOT / ".deps/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
AXE = ROOT / ".deps/npm/node_modules/axe-core/axe.min.js"
MANIFEST = """
[tools.order]
kind = "command"
description = "Place an order (prints what it was given)"
stdin = "order"
argv = ["cat"]

[tools.order.input]
type = "object"
required = ["order"]

[tools.order.input.properties.order]
type = "object"
required = ["item", "quantity"]

[tools.order.input.properties.order.properties]
item = { type = "string", enum = ["tea", "coffee"], description = "What to order" }
quantity = { type = "integer", default = 1 }
price = { type = "number" }
rush = { type = "boolean" }
note = { type = "string", default = "none" }
tags = { type = "array", items = { type = "string" } }
extras = { type = "array", items = { type = "object" } }

[tools.migrate]
kind = "command"
description = "Fails the way a real migration does"
input = { type = "object", properties = {} }
argv = ["sh", "-c", "echo 'relation billing_addresses does not exist' >&2; exit 3"]

[profiles.ops]
include = ["order", "migrate"]
"""
WIDTH = 1280


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    for needed in (EVERYTHING, AXE):
        assert needed.exists(), f"{needed} is missing: run scripts/bootstrap-servers"
    servers = {"mcpServers": {"everything": {"command": "node",
                                             "args": [str(EVERYTHING), "stdio"]}}}
    with serving(tmp_path_factory.mktemp("pages"),
                 {"tools.toml": MANIFEST, "servers.json": json.dumps(servers)}) as started:
        with started.client() as client:  # server-everything starts in the background
            for _ in range(600):
                health = client.get("/v1/health").json()["servers"]["everything"]
                if health["state"] == "ready":
                    break
                time.sleep(0.05)
        assert health["state"] == "ready", health
        yield started


@pytest.fixture(scope="module")
def context(browser: Browser, daemon: Daemon) -> Iterator[BrowserContext]:
    made = browser.new_context(viewport={"width": WIDTH, "height": 900})
    try:
        login(made.new_page(), daemon)
        yield made
    finally:
        made.close()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    opened = context.new_page()
    try:
        yield opened
    finally:
        opened.close()


def fits(page: Page) -> None:
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[1] == WIDTH and widths[0] <= widths[1], (page.url, widths)


def test_a_tool_runs_from_the_form_its_schema_makes(page: Page, daemon: Daemon) -> None:
    page.goto(f"{daemon.url}/ui/tools/order")
    expect(page.locator("h1")).to_have_text("order")
    run = page.locator("form#run")
    expect(run.locator("abbr.req")).to_have_count(3)  # order, item, quantity
    expect(run.locator("input[name='f:/order/quantity']")).to_have_value("1")  # its default
    run.locator("select[name='f:/order/item']").select_option(label="coffee")
    run.locator("input[name='f:/order/quantity']").fill("2")
    run.locator("input[name='f:/order/price']").fill("3.5")
    run.locator("select[name='f:/order/rush']").select_option("true")
    run.locator("textarea[name='f:/order/tags']").fill("oat milk\nto go")
    run.locator("textarea[name='f:/order/extras']").fill('[{"sugar": 2}]')
    run.locator("button:text-is('Run')").click()
    expect(page.locator("#status strong")).to_have_text("completed")
    given = json.loads(page.locator("#result pre.content").inner_text())
    assert given == {"item": "coffee", "quantity": 2, "price": 3.5, "rush": True,
                     "note": "none", "tags": ["oat milk", "to go"], "extras": [{"sugar": 2}]}
    shot(page, "tool-run")
    run.locator("textarea[name='f:/order/extras']").fill("[{sugar: 2}]")  # not JSON
    run.locator("button:text-is('Run')").click()
    expect(page.locator("#form-problem")).to_contain_text(
        "order/extras: '[{sugar: 2}]' is not JSON")
    page.locator("summary", has_text="raw JSON input").click()
    page.fill("textarea[name=raw]", '{"order": {"item": "tea"}}')  # no quantity: the seam says
    page.locator("button:text-is('Run')").click()
    expect(page.locator("#error")).to_contain_text("invalid_input")
    expect(page.locator("#error")).to_contain_text("quantity")


def test_an_upstream_tool_shows_its_image_and_structured_output(
    page: Page, daemon: Daemon,
) -> None:
    page.goto(f"{daemon.url}/ui/tools/everything_get-annotated-message")
    expect(page.locator("dl.facts")).to_contain_text("everything")  # its server
    expect(page.locator("dl.facts .tokens")).not_to_be_empty()
    page.select_option("select[name='f:/messageType']", label="success")
    page.select_option("select[name='f:/includeImage']", "true")
    page.locator("button:text-is('Run')").click()
    expect(page.locator("#result img.content")).to_be_visible()
    assert page.locator("#result img.content").evaluate("i => i.naturalWidth") > 0
    page.goto(f"{daemon.url}/ui/tools/everything_get-structured-content?profile=*")
    page.select_option("select[name='f:/location']", label="Chicago")
    page.locator("button:text-is('Run')").click()
    expect(page.locator("#result")).to_contain_text("structured output")
    expect(page.locator("#result")).to_contain_text("temperature")


def test_a_resource_is_read_and_downloaded(page: Page, daemon: Daemon) -> None:
    page.goto(f"{daemon.url}/ui/resources")
    page.click("a:text-is('architecture.md')")
    expect(page.locator("#resource pre.content")).not_to_be_empty()
    shot(page, "resources")
    page.fill("input[name=uri]", "demo://resource/dynamic/blob/7")
    page.click("button:text-is('read')")
    expect(page.locator("#resource")).to_contain_text("bytes")
    with page.expect_download() as download:
        page.click("#resource a:text-is('download')")
    path = download.value.path()
    assert path is not None and Path(path).read_text().startswith("Resource 7:")


def test_a_prompt_is_got_with_its_arguments(page: Page, daemon: Daemon) -> None:
    page.goto(f"{daemon.url}/ui/prompts")
    form = page.locator("form", has=page.locator("h3:text-is('args-prompt')"))
    form.locator("input[name='arg:city']").fill("Lisbon")
    form.locator("button").click()
    expect(page.locator("#prompt")).to_contain_text("Lisbon")
    shot(page, "prompts")


def test_a_failed_calls_error_and_its_page(page: Page, daemon: Daemon) -> None:
    failed = daemon.call("migrate", {}, "failed-migration-7", session="s-fail")
    assert failed["status"] == "error", failed
    page.goto(f"{daemon.url}/ui/calls?session=s-fail")
    expect(page.locator("td.error")).to_contain_text("relation billing_addresses does not")
    page.click("a:has-text('failed-migration-7')")
    expect(page.locator("h1")).to_have_text("Call failed-migration-7")
    expect(page.locator("dl.facts")).to_contain_text("error tool_failure")
    expect(page.locator("pre#error")).to_contain_text("relation billing_addresses")
    expect(page.locator("#result #error")).to_contain_text("tool_failure")
    shot(page, "call")


def test_a_servers_stderr_follows_live_and_it_restarts(page: Page, daemon: Daemon) -> None:
    page.goto(f"{daemon.url}/ui")
    page.click("a:text-is('everything')")
    expect(page.locator("#state")).to_have_text("ready")
    tail = page.locator("#stderr")
    expect(tail).to_contain_text("Starting default (STDIO) server")
    before = tail.inner_text().count("Starting default")
    with daemon.client() as client:  # elsewhere: the open page follows the new lines
        restarts = client.get("/v1/health").json()["servers"]["everything"]["restarts"]
        restarted = client.post("/v1/servers/everything/restart").json()
    assert restarted["health"]["state"] == "ready"
    assert restarted["health"]["restarts"] == restarts + 1
    page.wait_for_function(
        "n => document.getElementById('stderr').textContent.split('Starting default').length"
        " - 1 > n", arg=before)
    shot(page, "server")
    page.click("button:text-is('restart')")  # the page's own button
    expect(page.locator("#state")).to_have_text("ready")
    expect(page.locator("dl.facts")).to_contain_text(str(restarts + 2))


def test_the_metrics_page_plots_the_last_hour(page: Page, daemon: Daemon) -> None:
    for i in range(3):
        daemon.call("everything_echo", {"message": f"hi {i}"}, f"metrics-{i}")
    # its own failed call: the test that makes one may run in another worker's daemon
    assert daemon.call("migrate", {}, "metrics-failed")["status"] == "error"
    page.goto(f"{daemon.url}/ui/metrics")
    calls = page.locator("#calls-per-second svg.plot")
    expect(calls).to_be_visible()
    assert calls.locator("polyline, circle").count() >= 1
    expect(page.locator("#latency-p99 figcaption")).to_contain_text("everything_echo")
    expect(page.locator("#errors figcaption")).to_contain_text("tool_failure")
    expect(page.locator("#store-size svg.plot")).to_be_visible()
    box = calls.bounding_box()
    assert box is not None and box["width"] > 600 and box["height"] > 100
    shot(page, "metrics")


PAGES = ["/ui", "/ui/servers/everything", "/ui/tools", "/ui/tools?profile=*",
         "/ui/tools/order", "/ui/tools/everything_get-annotated-message", "/ui/calls",
         "/ui/calls/failed-migration-7", "/ui/asks", "/ui/managed", "/ui/resources",
         "/ui/resources?uri=demo://resource/static/document/architecture.md", "/ui/prompts",
         "/ui/metrics"]


def test_every_page_fits_1280_px_and_axe_finds_nothing_serious(
    browser: Browser, daemon: Daemon,
) -> None:
    daemon.call("migrate", {}, "failed-migration-7", session="s-fail")  # the call page's call
    context = browser.new_context(viewport={"width": WIDTH, "height": 900}, bypass_csp=True)
    try:
        page = context.new_page()
        login(page, daemon)
        found: dict[str, Any] = {}
        for path in PAGES:
            page.goto(f"{daemon.url}{path}")
            expect(page.locator("h1")).to_be_visible()
            fits(page)
            page.add_script_tag(path=str(AXE))
            result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
            bad = [f"{v['id']} ({v['impact']}): {v['nodes'][0]['target']}"
                   for v in result["violations"] if v["impact"] in ("serious", "critical")]
            if bad:
                found[path] = bad
        assert not found, json.dumps(found, indent=1)
    finally:
        context.close()


def test_the_keyboard_reaches_the_run_button(page: Page, daemon: Daemon) -> None:
    page.goto(f"{daemon.url}/ui/tools/everything_get-tiny-image")
    page.keyboard.press("Tab")
    expect(page.locator("a.skip")).to_be_focused()
    page.keyboard.press("Enter")  # skip the navigation
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Run":
            break
    expect(page.locator("button:text-is('Run')")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#result img.content")).to_be_visible()


def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SIDECAR, *args, "--url", daemon.url], env=daemon.env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_cli_lists_reads_gets_restarts_and_shows_logs(daemon: Daemon) -> None:
    listed = cli(daemon, "resources")
    assert listed.returncode == 0, listed.stderr
    assert "everything  demo://resource/static/document/architecture.md" in listed.stdout
    assert "demo://resource/dynamic/blob/{resourceId}  (template)" in listed.stdout
    read = cli(daemon, "resources", "read", "demo://resource/dynamic/text/3")
    assert read.returncode == 0 and "Resource 3" in read.stdout, read.stderr
    missing = cli(daemon, "resources", "read", "demo://nothing/here")
    assert missing.returncode == 1 and "not found" in missing.stderr
    prompts = cli(daemon, "prompts")
    assert "args-prompt(city, state?)" in prompts.stdout, prompts.stderr
    got = cli(daemon, "prompts", "get", "args-prompt", "--arg", "city=Oslo")
    assert got.returncode == 0 and "[user]" in got.stdout and "Oslo" in got.stdout
    restarted = cli(daemon, "restart", "everything")
    assert restarted.returncode == 0 and restarted.stdout.startswith("everything: ready,")
    logs = cli(daemon, "logs", "everything")
    assert logs.returncode == 0 and "Starting default (STDIO) server" in logs.stdout
    unknown = cli(daemon, "logs", "nothing")
    assert unknown.returncode == 1 and "no MCP server named 'nothing'" in unknown.stderr
    embedded = subprocess.run([*SIDECAR, "restart", "everything", "--embedded"],
                              env=daemon.env, capture_output=True, text=True, timeout=60,
                              check=False)
    assert embedded.returncode == 2 and "--embedded has none" in embedded.stderr


def test_sidecar_logs_follow_prints_new_stderr(daemon: Daemon) -> None:
    follower = subprocess.Popen([*SIDECAR, "logs", "everything", "-f", "--url", daemon.url],
                                env=daemon.env, stdout=subprocess.PIPE)
    assert follower.stdout is not None
    watch = selectors.DefaultSelector()
    watch.register(follower.stdout, selectors.EVENT_READ)

    def read_until(text: str, seconds: float = 30.0) -> str:
        seen, deadline = b"", time.monotonic() + seconds
        while text.encode() not in seen:
            left = deadline - time.monotonic()
            assert left > 0 and watch.select(left), f"no {text!r} within {seconds} s: {seen!r}"
            chunk = follower.stdout.read1(65536)  # type: ignore[union-attr]
            assert chunk, f"sidecar logs -f ended: {seen!r}"
            seen += chunk
        return seen.decode()

    try:
        kept = read_until("Starting default (STDIO) server")  # the kept tail first
        with daemon.client() as client:
            client.post("/v1/servers/everything/restart")
        assert "Starting default (STDIO) server" in read_until("Starting default"), kept
    finally:
        watch.close()
        follower.terminate()
        follower.wait(timeout=30)
        follower.stdout.close()
