"""The data bench/tool_search.py ranks: every task names tools the catalog has (by the names
the sidecar gives them), carries the query a model wrote for it, and belongs to a known set;
no request is there twice (one would count twice). Read, not ranked: no set's misses are shown."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from sidecar.registry.registry import build_entries

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from tool_search import SETS, TASKS, catalog_tools  # noqa: E402


def test_every_task_names_catalog_tools_and_has_a_model_query() -> None:
    names = {name for server, tools in catalog_tools().items()
             for name in build_entries(tools, server)}
    tasks = json.loads(TASKS.read_text())["tasks"]
    assert len(names) == 389 and len(tasks) >= 60
    for task in tasks:
        assert task["set"] in SETS, task
        assert task["expected"] and set(task["expected"]) <= names, task
        assert task["model_query"].strip(), task
    counts = Counter(task["query"].lower() for task in tasks)
    assert [query for query, n in counts.items() if n > 1] == []
    assert Counter(task["set"] for task in tasks) == {
        "tuning": 77, "held-out": 74, "held-out-2": 300, "held-out-3": 198}
