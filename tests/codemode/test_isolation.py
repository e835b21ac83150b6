"""No filesystem, network or host access from a program, except the tool functions."""

from __future__ import annotations

import pytest

from sidecar.model.content import text_of

from .conftest import Env

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.listdir('/')",
        "from os import path",
        "import os.path",
        "import sys",
        "import pathlib",
        "import subprocess",
        "import socket\nsocket.create_connection(('127.0.0.1', 9))",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/')",
        "import shutil",
        "if True:\n    import importlib",
    ],
)
async def test_host_modules_are_refused_before_the_program_runs(env: Env, code: str):
    outcome = await env.run(f"print('started')\n{code}\n")
    error = outcome.output["error"]
    assert error["type"] == "ImportError"
    assert "no filesystem, network or host access" in error["message"]
    assert error["line"] >= 2
    assert outcome.output["tool_calls"] == []
    assert "started" not in text_of(outcome.content)  # refused before anything ran


@pytest.mark.parametrize(
    ("code", "kind", "needle"),
    [
        ("open('/etc/passwd').read()", "PermissionError", "no filesystem, network or host"),
        ("open('notes.txt', 'w').write('x')", "PermissionError", "no filesystem"),
        ("exec(\"import os\\nos.listdir('/')\")", "PermissionError", "no filesystem"),
        ("exec(\"import os\\nx = os.environ\")", "PermissionError", "os.environ: Code Mode"),
        ("exec(\"import os\\nx = os.getenv('HOME')\")", "PermissionError", "no filesystem"),
        ("__import__('os')", "NameError", "__import__"),
        ("exec('import socket')", "ModuleNotFoundError", "socket"),
        ("import http_client_lib", "ModuleNotFoundError", "http_client_lib"),
    ],
)
async def test_dynamic_host_access_is_refused_when_it_runs(
    env: Env, code: str, kind: str, needle: str
):
    outcome = await env.run(code)
    error = outcome.output["error"]
    assert error["type"] == kind, error
    assert needle in error["message"]
    assert error["line"] == 1


async def test_the_tools_module_exposes_only_reachable_tools(env: Env):
    outcome = await env.run(
        "names = ['calc', 'issues', 'slow', 'managed_read', 'secret', 'execute', "
        "'search_tools', 'describe_tools']\n"
        "[n for n in names if hasattr(tools, n)] + [hasattr(tools.issues, 'search')]\n"
    )
    assert outcome.output["result"] == ["calc", "issues", "slow", "managed_read", True]
