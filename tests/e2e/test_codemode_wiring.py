"""Code Mode chosen by a manifest setting, per snapshot, and through the HTTP API."""

from __future__ import annotations

import pytest

from sidecar import Location, ToolContext
from tests.serve.test_api import ctx

pytestmark = pytest.mark.anyio

TOOL = """
codemode = "codemode"

[tools.utc_now]
kind = "command"
description = "now"
input = { type = "object", properties = {} }
argv = ["date", "-u", "+%Y"]

[tools.direct_only]
kind = "command"
description = "stays direct"
codemode = false
input = { type = "object", properties = {} }
argv = ["echo", "direct"]
"""


async def test_manifest_setting_and_per_snapshot_override(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "main.toml").write_text(TOOL)
    async with Location.open(tmp_path, state_dir=tmp_path / "s", manifests=[tmp_path / "m"]) as loc:
        names = set(loc.snapshot().names)
        assert {"execute", "search_tools", "describe_tools", "direct_only"} <= names
        assert "utc_now" not in names  # reachable from programs only
        snap = loc.snapshot()
        code = 'r = await call_tool("utc_now")\nprint("year", r.strip())\nr'
        outcome = await snap.execute("execute", {"code": code}, ToolContext("s", "a", "m", "x1"))
        assert outcome.status == "completed", outcome
        assert "year 20" in outcome.content[0].text
        nested = await loc.outcome("x1/1")
        assert nested is not None and nested.tool == "utc_now"
        direct = set(loc.snapshot(codemode="direct").names)
        assert "utc_now" in direct and "execute" not in direct


async def test_http_snapshot_codemode_option(served):
    res = await served.client.post("/v1/snapshots", json={"session_id": "s1",
                                                          "codemode": "both"})
    names = [d["name"] for d in res.json()["definitions"]]
    assert "execute" in names and "echo" in names
    call = await served.client.post(
        f"/v1/snapshots/{res.json()['id']}/calls",
        json={"name": "execute", "input": {"code": 'print((await tools.echo(text="hi")))'},
              "context": ctx("cm1")},
    )
    body = call.json()
    assert body["status"] == "completed", body
    assert "echoed" in body["content"][0]["text"]
