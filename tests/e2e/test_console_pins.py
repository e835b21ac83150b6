"""The console's tools page shows a definition change held by pinning, with its diff, and its
approve button pins the new definition (a real MCP test server whose description changes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import httpx
import pytest

from sidecar import Location
from sidecar.model.events import DefinitionChanged
from sidecar.serve.app import build_app
from tests.e2e.test_pins import CHANGED, ORIGINAL, TOKEN, ctx, description, manifests, ready
from tests.live_server import live_server

pytestmark = pytest.mark.anyio


async def test_a_held_change_is_approved_from_the_console(tmp_path: Path) -> None:
    descriptions = tmp_path / "descriptions.json"
    directory = manifests(tmp_path, descriptions)
    async with Location.open(tmp_path, state_dir=tmp_path / "state",
                             manifests=[directory]) as loc:
        await ready(loc)
        descriptions.write_text(json.dumps({"echo": CHANGED}))
        async with loc.events.subscribe() as sub:
            await loc.snapshot().execute("alpha_mutate", {}, ctx("m-alpha"))
            with anyio.fail_after(30):  # beta (same descriptions file) may report first
                while not (isinstance(event := await sub.next(), DefinitionChanged)
                           and event.tool == "alpha_echo"):
                    pass
        assert description(loc, "alpha_echo") == ORIGINAL
        app = build_app(loc, token=TOKEN)
        async with live_server(app) as port, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=30,
        ) as console:
            assert (await console.post("/ui/login", data={"token": TOKEN})).status_code == 303
            page = (await console.get("/ui/tools")).text
            assert "Definition changes waiting for approval" in page
            assert 'data-held="alpha_echo"' in page and "id_rsa" in page  # the diff is shown
            csrf = re.search(r'name=csrf value="([^"]+)"', page)
            assert csrf is not None
            forged = await console.post("/ui/tools/alpha_echo/approve", data={"csrf": "x"})
            assert forged.status_code == 403 and description(loc, "alpha_echo") == ORIGINAL
            done = await console.post("/ui/tools/alpha_echo/approve",
                                      data={"csrf": csrf.group(1)})
            assert done.status_code == 303
            assert description(loc, "alpha_echo") == CHANGED
            assert 'data-held="alpha_echo"' not in (await console.get("/ui/tools")).text
            again = await console.post("/ui/tools/alpha_echo/approve",
                                       data={"csrf": csrf.group(1)})
            assert again.status_code == 400 and "waiting" in again.text
