"""`SIDECAR_RETENTION` sets the retention period of the CLI's Locations (texts and outcomes);
a bad value is a one-line usage error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.model.retention import parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("604800", 604800.0), ("90s", 90.0), ("30m", 1800.0), ("12h", 43200.0), ("7d", 604800.0),
    (" 1.5h ", 5400.0), ("2D", 172800.0),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "7w", "-1d", "0", "inf", "nan", "1e999"])
def test_bad_durations_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def sidecar(tmp_path: Path, retention: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SIDECAR_RETENTION": retention, "SIDECAR_STATE_DIR": str(tmp_path / "s"),
           "SIDECAR_MANIFESTS": ""}
    env.pop("SIDECAR_URL", None)
    return subprocess.run([sys.executable, "-m", "sidecar.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)


def test_the_cli_reports_the_retention_it_was_given(tmp_path: Path) -> None:
    done = sidecar(tmp_path, "90m", "health", "--json")
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout)["state"]
    assert state["retention_seconds"] == 5400


def test_a_bad_retention_is_a_one_line_usage_error(tmp_path: Path) -> None:
    done = sidecar(tmp_path, "a week", "health")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "sidecar: SIDECAR_RETENTION: not a duration: 'a week' (use seconds, or 90s, 30m, 12h, 7d)"]
