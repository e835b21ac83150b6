"""The web console in a real browser: Playwright driving Debian's chromium against a real
`sidecar serve` process. Login, an ask answered while its call waits, a retained output read,
the history filtered, and the console's own security (cookie flags, CSRF, no token, no access).

`SIDECAR_CONSOLE_SCREENSHOTS=DIR` saves a screenshot of each page there (`docs/` holds the
ones the README shows).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

SIDECAR = [sys.executable, "-m", "sidecar.cli"]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MANIFEST = """
[tools.numbers]
kind = "command"
description = "Print the numbers 1..n, one per line"
input = { type = "object", properties = { n = { type = "integer" } }, required = ["n"] }
argv = ["seq", "{n}"]

[tools.deploy]
kind = "command"
description = "Pretend to deploy (asks first)"
input = { type = "object", properties = { target = { type = "string" } } }
argv = ["echo", "deployed {target}"]

[[permissions.rules]]
action = "deploy"
decision = "ask"

[profiles.ops]
include = ["deploy"]
"""


@dataclass
class Daemon:
    url: str
    token: str
    proc: subprocess.Popen[str]
    env: dict[str, str]
    log: list[str] = field(default_factory=list)
    """The daemon's stderr so far (shown when it stops answering)."""
    read_all: threading.Event = field(default_factory=threading.Event)
    """Set once its stderr is read to the end (the process closed it)."""

    def stderr(self) -> str:
        """Its stderr so far; once it exited, to the end (a fatal error's last lines, and with
        PYTHONFAULTHANDLER every thread's stack, come last)."""
        if self.proc.poll() is not None:
            self.read_all.wait(5)
        return "".join(self.log)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"authorization": f"Bearer {self.token}"})

    def call(self, name: str, arguments: dict[str, Any], call_id: str, session: str = "s1",
             wait: bool = True) -> dict[str, Any]:
        try:
            return self._call(name, arguments, call_id, session, wait)
        except httpx.ConnectError as exc:
            raise AssertionError(f"the daemon does not answer ({exc}); exit status "
                                 f"{self.proc.poll()}; its stderr:\n{self.stderr()}") from exc

    def answering(self, within: float = 30.0) -> None:
        """Return once `/v1/health` answers; fail with the daemon's stderr if it exits."""
        deadline = time.monotonic() + within
        while True:
            try:
                with self.client() as client:
                    client.get("/v1/health")
                return
            except httpx.TransportError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"the daemon does not answer ({exc}); exit status {self.proc.poll()}; "
                        f"its stderr:\n{self.stderr()}") from exc
                time.sleep(0.05)

    def _call(self, name: str, arguments: dict[str, Any], call_id: str, session: str,
              wait: bool) -> dict[str, Any]:
        with self.client() as client:
            snap = client.post("/v1/snapshots", json={"session_id": session}).json()["id"]
            response = client.post(
                f"/v1/snapshots/{snap}/calls",
                json={"name": name, "input": arguments, "context": {
                    "session_id": session, "agent": "browser-test", "message_id": "m",
                    "call_id": call_id}},
                headers={} if wait else {"prefer": "respond-async"},
            )
            return dict(response.json())


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with serving(tmp_path_factory.mktemp("console"), {"tools.toml": MANIFEST}) as started:
        yield started


@contextmanager
def serving(root: Path, manifests: dict[str, str]) -> Iterator[Daemon]:
    """A real `sidecar serve` on port 0 with these manifest files, until the block ends."""
    (root / "manifests").mkdir()
    for name, text in manifests.items():
        (root / "manifests" / name).write_text(text)
    token = secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(root / "state"), SIDECAR_MANIFESTS=str(root / "manifests"),
               SIDECAR_TOKEN=token, PYTHONFAULTHANDLER="1")  # a native crash shows its stacks
    proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0"], env=env, cwd=root,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    url = ""
    lines: list[str] = []
    read_all = threading.Event()
    def keep_reading() -> None:
        assert proc.stderr is not None
        lines.extend(proc.stderr)
        read_all.set()

    drain = threading.Thread(target=keep_reading, daemon=True)
    try:
        while not url:
            line = proc.stderr.readline()
            assert line, f"serve exited early: {''.join(lines)}"
            lines.append(line)
            if "listening on" in line:
                url = line.split("listening on ")[1].strip()
        drain.start()
        daemon = Daemon(url, token, proc, env, lines, read_all)
        daemon.answering()
        yield daemon
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        if drain.ident is not None:  # started: not when serve failed before 'listening on'
            drain.join(timeout=10)
        proc.stderr.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--disable-dev-shm-usage", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


def shot(page: Page, name: str) -> None:
    folder = os.environ.get("SIDECAR_CONSOLE_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"console-{name}.png"), full_page=True)


def login(page: Page, daemon: Daemon) -> None:
    page.goto(f"{daemon.url}/ui")
    expect(page).to_have_url(f"{daemon.url}/ui/login")
    page.fill("input[name=token]", daemon.token)
    page.click("button:text-is('log in')")
    expect(page.locator("h1")).to_have_text("Servers")


def test_login_sets_a_private_cookie_and_a_wrong_token_is_refused(
    page: Page, daemon: Daemon
) -> None:
    page.goto(f"{daemon.url}/ui/login")
    page.fill("input[name=token]", "not-the-token")
    page.click("button:text-is('log in')")
    expect(page.locator("text=That token is not this daemon's.")).to_be_visible()
    login(page, daemon)
    cookie = next(c for c in page.context.cookies() if c["name"] == "sidecar_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert page.evaluate("document.cookie") == ""  # not readable by scripts
    shot(page, "servers")
    page.goto(f"{daemon.url}/ui/tools?q=numbers")
    expect(page.locator(".card strong", has_text="numbers")).to_be_visible()
    shot(page, "tools")
    page.select_option("select[name=profile]", "ops")
    page.fill("input[name=q]", "")
    page.click("button:text-is('search')")
    expect(page.locator(".card > strong")).to_have_text(["deploy", "managed_read"])


def test_answering_an_ask_while_its_call_waits(page: Page, daemon: Daemon) -> None:
    login(page, daemon)
    started = daemon.call("deploy", {"target": "staging"}, "ask-1", wait=False)
    assert started["status"] == "running"
    page.goto(f"{daemon.url}/ui/asks")
    ask = page.locator("form[data-ask]")
    expect(ask).to_contain_text("deploy")
    expect(ask).to_contain_text("ask-1")
    shot(page, "asks")
    with daemon.client() as client:
        assert client.get("/v1/calls/ask-1").json()["status"] == "running"
        ask.locator("button[value=once]").click()
        expect(page.locator("text=No permission request is waiting.")).to_be_visible()
        for _ in range(200):
            state = client.get("/v1/calls/ask-1").json()
            if state["status"] != "running":
                break
            time.sleep(0.05)
    assert state["status"] == "completed"
    assert "deployed staging" in json.dumps(state["content"])


def test_reading_a_retained_output_and_filtering_the_history(page: Page, daemon: Daemon) -> None:
    outcome = daemon.call("numbers", {"n": 100000}, "big-1", session="s-hist")
    ref = outcome["managed"][0]["ref"]
    daemon.call("numbers", {"n": 3}, "small-1", session="s-other")
    login(page, daemon)
    page.goto(f"{daemon.url}/ui/calls?session=s-hist")
    rows = page.locator("table:not(#live) tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("big-1")
    daemon.call("numbers", {"n": 2}, "live-1", session="s-live")  # while the page is open
    expect(page.locator("#live tbody tr", has_text="live-1")).to_contain_text("call.settled")
    shot(page, "calls")
    page.fill("#filters input[name=session]", "")
    page.fill("#filters input[name=tool]", "numbers")
    page.click("#filters button")
    expect(page.locator("table:not(#live) tbody tr")).to_have_count(3)  # big, small, live
    page.click(f"a:has-text('{ref}')")
    expect(page.locator("pre#text")).to_contain_text("200")
    page.fill("input[name=offset]", "50000")
    page.fill("input[name=limit]", "3")
    page.click("button:text-is('read')")
    expect(page.locator("pre#text")).to_have_text("50000\n50001\n50002\n")
    page.fill("input[name=limit]", "")
    page.fill("input[name=pattern]", "^7777[0-9]$")
    page.click("button:text-is('read')")
    expect(page.locator("pre#text")).to_contain_text("77779")
    page.fill("input[name=pattern]", "")
    page.fill("input[name=offset]", "12345")
    page.fill("input[name=start]", "2")
    page.fill("input[name=length]", "2")
    page.click("button:text-is('read')")
    expect(page.locator("pre#text")).to_have_text("34")  # characters 2-3 of line "12345"
    expect(page.locator("text=read on from start=4")).to_be_visible()
    page.fill("input[name=start]", "")
    page.fill("input[name=length]", "")
    page.fill("input[name=pattern]", "^7777[0-9]$")
    page.click("button:text-is('read')")
    shot(page, "managed")
    with page.expect_download() as download:
        page.click("text=download the whole text")
    path = download.value.path()
    assert path is not None and Path(path).read_text().endswith("99999\n100000\n")


def test_the_console_refuses_without_a_login_and_forged_posts(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url, follow_redirects=False) as client:
        assert client.get("/ui/calls").status_code == 303  # to the login form
        assert client.post("/ui/asks/x", data={"reply": "once"}).status_code == 401
        login = client.post("/ui/login", data={"token": daemon.token})
        assert login.status_code == 303 and "sidecar_ui" in login.cookies
        # logged in, but a POST without the page's CSRF token is refused
        forged = client.post("/ui/asks/x", data={"reply": "once", "csrf": "guess"})
        assert forged.status_code == 403
        # and a page from another origin cannot post at all
        cross = client.post("/ui/logout", headers={"origin": "http://evil.example"})
        assert cross.status_code == 403
        # the console's cookie is no key to /v1
        assert client.get("/v1/health").status_code == 401
