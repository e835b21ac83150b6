"""`replica_id()`: `SIDECAR_REPLICA_ID`, else `<hostname>-<pid>`; always usable in a header."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

CODE = "import os; from sidecar.model.replica import replica_id; print(replica_id(), os.getpid())"


def run(value: str | None) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SIDECAR_REPLICA_ID"}
    if value is not None:
        env["SIDECAR_REPLICA_ID"] = value
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], out[1]


def test_the_default_is_hostname_and_pid() -> None:
    name, pid = run(None)
    assert name == f"{socket.gethostname()}-{pid}"


@pytest.mark.parametrize(("value", "expected"), [
    ("gateway-1", "gateway-1"),
    ("  spaced  ", "spaced"),
    ("a b\tc\u00e9", "a_b_c_"),
    ("x" * 300, "x" * 128),
])
def test_the_variable_names_the_replica(value: str, expected: str) -> None:
    assert run(value)[0] == expected


def test_an_empty_variable_means_the_default() -> None:
    name, pid = run("")
    assert name.endswith(f"-{pid}")
