"""The console's sign-in through a real OpenID provider in Chromium: `/ui/login` offers it
beside the token form, the provider's own login form signs in, the session carries the
user and role; a user sees only their own history, an operator everyone's (and filters by
user)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.serve.identities.conftest import Daemon, Provider
from tests.serve.identities.test_access_tokens import call
from tests.serve.test_console import browser as browser  # a fixture
from tests.serve.test_console import page as page  # a fixture


def sign_in(page: Page, daemon: Daemon, user: str) -> None:
    page.goto(f"{daemon.url}/ui")
    expect(page).to_have_url(f"{daemon.url}/ui/login")
    expect(page.locator("input[name=token]")).to_be_visible()  # the token form stays
    page.click("#oidc-login")
    page.fill("input[name=login]", user)  # the provider's own login form
    page.fill("input[name=password]", "any")
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Authorize")  # the provider's consent form
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Servers")


@pytest.fixture(scope="module")
def histories(daemon: Daemon, oidc_provider: Provider) -> None:
    for who in ("alice", "bob"):
        with daemon.client(oidc_provider.token(who)) as client:
            assert call(client, "numbers", {"n": 1}, f"ui-{who}", "small").status_code == 200


def test_a_user_signs_in_and_sees_only_their_history(
        page: Page, daemon: Daemon, histories: None) -> None:
    sign_in(page, daemon, "alice")
    cookie = next(c for c in page.context.cookies() if c["name"] == "sidecar_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.goto(f"{daemon.url}/ui/calls")
    expect(page.locator("a code", has_text="ui-alice")).to_be_visible()
    expect(page.locator("a code", has_text="ui-bob")).to_have_count(0)
    page.goto(f"{daemon.url}/ui/calls?user=bob")
    expect(page.locator("p.bad")).to_contain_text("alice reads only their own history")
    response = page.goto(f"{daemon.url}/ui/asks")
    assert response is not None and response.status == 403
    expect(page.locator("p.bad")).to_contain_text("alice has the role user")


def test_an_operator_signs_in_and_filters_the_history_by_user(
        page: Page, daemon: Daemon, histories: None) -> None:
    sign_in(page, daemon, "olga")
    page.goto(f"{daemon.url}/ui/calls")
    expect(page.locator("a code", has_text="ui-alice")).to_be_visible()
    expect(page.locator("a code", has_text="ui-bob")).to_be_visible()
    page.fill("#filters input[name=user]", "bob")
    page.click("#filters button")
    expect(page.locator("a code", has_text="ui-bob")).to_be_visible()
    expect(page.locator("a code", has_text="ui-alice")).to_have_count(0)
    expect(page.locator("td", has_text="(bob)").first).to_be_visible()
    assert page.goto(f"{daemon.url}/ui/asks").status == 200  # type: ignore[union-attr]


def test_a_callback_without_its_login_is_refused(page: Page, daemon: Daemon) -> None:
    response = page.goto(f"{daemon.url}/ui/login/callback?state=forged&code=x")
    assert response is not None and response.status == 401
    expect(page.locator("p.bad")).to_contain_text("unknown or expired")
