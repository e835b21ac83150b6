"""The layers of DESIGN.md, checked on the import graph of `sidecar/`, `bridges/` and
`managed_store/` (read with `ast`, nothing is imported).

    root       sidecar.daemon,           wires everything (daemon_stores: which implementation
               sidecar.daemon_stores     keeps each store); imported only by the CLI entry point
                                         (`sidecar.cli`) and, lazily, by the `sidecar.Location`
                                         re-export in `sidecar/__init__.py`
    frontends  sidecar.serve.*, sidecar.cli*
    sources    bridges.*                 beside the frontends: core + managed_store only
    core       sidecar.* (the rest)      core + managed_store only
    storage    managed_store.*           nothing of ours

An edge is every `import` / `from ... import` of one of our modules, at module level or inside a
function. Imports under `if TYPE_CHECKING:` add no run-time dependency: they are left out of the
cycle and layer checks, but an import of the composition root counts wherever it is.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("sidecar", "bridges", "managed_store")
ROOT_MODULE = "sidecar.daemon"
ROOT_MODULES = {ROOT_MODULE, "sidecar.daemon_stores"}
"""The composition root: the daemon and its store choices (one opener per store)."""
CLI_ENTRY_POINT = "sidecar.cli"
PUBLIC_API = "sidecar"  # the package: re-exports `Location` from the root, lazily

Kind = Literal["module", "function", "type_checking"]


@dataclass(frozen=True, slots=True)
class Import:
    source: str
    target: str
    kind: Kind
    line: int
    name: str = ""
    """The imported name (`from target import name`), if one."""

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line}, {self.kind} level)"


def modules(base: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(base: Path) -> list[Import]:
    """Every import of one of our modules by one of our modules."""
    known = modules(base)

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found: list[Import] = []
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]

        def walk(node: ast.AST, kind: Kind, module: str = module, package: str = package) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    for stmt in child.body:
                        walk_stmt(stmt, "type_checking", module, package)
                    for stmt in child.orelse:
                        walk_stmt(stmt, kind, module, package)
                    continue
                inner: Kind = kind
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inner = "type_checking" if kind == "type_checking" else "function"
                walk_stmt(child, inner, module, package)

        def walk_stmt(node: ast.AST, kind: Kind, module: str, package: str) -> None:
            names: list[str] = []
            imported: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
                imported = ["" for _ in names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    origin = ".".join([*anchor, *([node.module] if node.module else [])])
                else:
                    origin = node.module or ""
                names = [f"{origin}.{alias.name}" for alias in node.names]
                imported = [alias.name for alias in node.names]
            for name, what in zip(names, imported, strict=True):
                target = resolve(name)
                if target is not None and target != module:
                    found.append(Import(module, target, kind, getattr(node, "lineno", 0), what))
            walk(node, kind)

        walk(ast.parse(path.read_text(), str(path)), "module")
    return found


def find_cycle(edges: list[Import]) -> list[str] | None:
    """One import cycle (its modules in import order, the first repeated last), or None."""
    graph: dict[str, list[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge.target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(set(graph.get(node, ()))):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def layer(module: str) -> str:
    if module in ROOT_MODULES:
        return "root"
    if module == PUBLIC_API:
        return "public api"
    top = module.split(".")[0]
    if top == "managed_store":
        return "storage"
    if top == "bridges":
        return "sources"
    if module == "sidecar.serve" or module.startswith(("sidecar.serve.", "sidecar.cli")):
        return "frontend"
    return "core"


ALLOWED: dict[str, set[str]] = {
    "storage": {"storage"},
    "core": {"core", "storage"},
    "sources": {"sources", "core", "storage"},
    "frontend": {"frontend", "sources", "core", "storage"},
    "public api": {"core"},
    "root": {"root", "frontend", "sources", "core", "storage", "public api"},
}


def root_violations(edges: list[Import]) -> list[Import]:
    """Imports of the composition root by anything but the CLI entry point and the lazy
    `sidecar.Location` re-export (function level, or for types). TYPE_CHECKING imports count
    everywhere else: a frontend types against the core's `Location`."""
    return [
        e for e in edges
        if e.target in ROOT_MODULES
        and e.source != CLI_ENTRY_POINT
        and e.source not in ROOT_MODULES
        and not (e.source == PUBLIC_API and e.kind != "module")
    ]


def layer_violations(edges: list[Import]) -> list[Import]:
    bad: list[Import] = []
    for edge in edges:
        if edge.kind == "type_checking" or edge.target in ROOT_MODULES:
            continue  # no run-time dependency / checked by `root_violations`
        if edge.source == CLI_ENTRY_POINT:
            continue  # the entry point sits on top with the root
        if layer(edge.target) not in ALLOWED[layer(edge.source)]:
            bad.append(edge)
    return bad


# The store implementations (`sidecar.stores` lists their interfaces), by class name and
# defining module. Only the composition root chooses them.
CONCRETE_STORES = {
    "ManagedStore": "managed_store.store",
    "MemorySnapshotRecords": "sidecar.snapshot_records",
    "MemoryPendingLogins": "sidecar.pending_logins",
    "PostgresPendingLogins": "sidecar.postgres_pending_logins",
    "S3TextStore": "managed_store.s3.store",
    "MemoryEventLog": "sidecar.serve.event_log",
    "PostgresAsks": "sidecar.postgres_asks",
    "PostgresCancels": "sidecar.postgres_cancels",
    "PostgresEventLog": "sidecar.serve.postgres_event_log",
    "PostgresGrantStore": "sidecar.postgres_grants",
    "PostgresOutcomeLog": "sidecar.postgres_outcome_log",
    "PostgresCallHistory": "sidecar.postgres_call_history",
    "PostgresPermissionStore": "sidecar.postgres_permission_store",
    "PostgresPinStore": "sidecar.postgres_pins",
    "PostgresRounds": "sidecar.postgres_rounds",
    "PostgresSnapshotRecords": "sidecar.postgres_snapshots",
    "PostgresTokenStore": "sidecar.postgres_tokens",
    "SqliteCallHistory": "sidecar.call_history",
    "SqliteOutcomeLog": "sidecar.outcome_log",
    "SqlitePermissionStore": "sidecar.permission_store",
    "SqlitePinStore": "sidecar.pins",
    "SqliteTokenStore": "sidecar.tokens",
}
IMPLEMENTATION_MODULES = {"sidecar.permission_store", "sidecar.postgres_outcome_log",
                          "sidecar.postgres_permission_store", "sidecar.postgres_tokens",
                          "sidecar.postgres_pins", "sidecar.postgres_call_history",
                          "sidecar.serve.postgres_event_log", "sidecar.postgres_asks",
                          "sidecar.postgres_snapshots", "sidecar.postgres_cancels",
                          "sidecar.postgres_grants", "sidecar.postgres_pending_logins"}
COMPOSITION_ROOT = ROOT_MODULES | {CLI_ENTRY_POINT}


def concrete_store_imports(edges: list[Import]) -> list[Import]:
    """Imports of a store implementation outside the composition root: by class name, or of
    a module that holds nothing else. `managed_store` is exempt: it is the library that
    defines `ManagedStore` (its `__init__` re-exports it)."""

    def names_one(e: Import) -> bool:
        return e.name in CONCRETE_STORES or e.target in IMPLEMENTATION_MODULES

    return [
        e for e in edges
        if names_one(e) and e.source not in COMPOSITION_ROOT
        and not e.source.startswith("managed_store")
    ]


def _describe(bad: list[Import]) -> str:
    lines = (f"  {e}  [{layer(e.source)} -> {layer(e.target)}]" for e in bad)
    return "\n".join(dict.fromkeys(lines))


# --- the tree ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def edges() -> list[Import]:
    found = imports(REPO)
    assert len(found) > 200, "the import walker found almost nothing: is it broken?"
    return found


def test_no_import_cycle(edges: list[Import]) -> None:
    runtime = [e for e in edges if e.kind != "type_checking"]
    cycle = find_cycle(runtime)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_only_the_cli_imports_the_composition_root(edges: list[Import]) -> None:
    bad = root_violations(edges)
    assert not bad, "the composition root is imported from below:\n" + _describe(bad)


def test_layers(edges: list[Import]) -> None:
    bad = layer_violations(edges)
    assert not bad, "imports against the layers of DESIGN.md:\n" + _describe(bad)


def test_only_the_composition_root_names_a_store_implementation(edges: list[Import]) -> None:
    bad = concrete_store_imports(edges)
    assert not bad, (
        "store implementations named outside the composition root (use the interfaces in "
        "sidecar.stores):\n" + _describe(bad)
    )


def test_every_store_implementation_is_where_the_test_looks(edges: list[Import]) -> None:
    for name, module in CONCRETE_STORES.items():
        path = modules(REPO)[module]
        assert f"class {name}" in path.read_text(), f"{name} is not defined in {module}"


def test_the_layers_are_all_present(edges: list[Import]) -> None:
    seen = {layer(e.source) for e in edges} | {layer(e.target) for e in edges}
    assert seen == set(ALLOWED)


# --- the checker, on small made-up trees (so a broken walker cannot pass the real one) ------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _cycle_of(tmp_path: Path, files: dict[str, str]) -> list[str] | None:
    edges = imports(_tree(tmp_path, files))
    return find_cycle([e for e in edges if e.kind != "type_checking"])


def test_a_function_level_import_closes_a_cycle(tmp_path: Path) -> None:
    cycle = _cycle_of(tmp_path, {
        "sidecar/a.py": "from sidecar.b import x\n",
        "sidecar/b.py": "x = 1\ndef f():\n    from sidecar import a\n    return a\n",
    })
    assert cycle == ["sidecar.a", "sidecar.b", "sidecar.a"]


def test_a_type_checking_import_closes_no_cycle(tmp_path: Path) -> None:
    cycle = _cycle_of(tmp_path, {
        "sidecar/a.py": "from sidecar.b import x\n",
        "sidecar/b.py": (
            "from typing import TYPE_CHECKING\nx = 1\n"
            "if TYPE_CHECKING:\n    from sidecar.a import y\n"
        ),
    })
    assert cycle is None


def test_relative_imports_are_resolved(tmp_path: Path) -> None:
    cycle = _cycle_of(tmp_path, {
        "bridges/p/__init__.py": "from .q import z\n",
        "bridges/p/q.py": "from .. import p\nz = 1\n",
    })
    assert cycle == ["bridges.p", "bridges.p.q", "bridges.p"]


def test_an_import_of_the_root_is_found_even_for_types(tmp_path: Path) -> None:
    edges = imports(_tree(tmp_path, {
        "sidecar/daemon.py": "",
        "sidecar/cli.py": "import sidecar.daemon\n",
        "sidecar/serve/__init__.py": "",
        "sidecar/serve/app.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from sidecar.daemon import Location\n"
        ),
        "sidecar/__init__.py": "def __getattr__(n):\n    from sidecar.daemon import Location\n",
    }))
    assert [(e.source, e.kind) for e in root_violations(edges)] == [
        ("sidecar.serve.app", "type_checking")
    ]


def test_a_store_implementation_outside_the_root_is_found(tmp_path: Path) -> None:
    edges = imports(_tree(tmp_path, {
        "sidecar/daemon.py": "from sidecar.outcome_log import SqliteOutcomeLog\n",
        "sidecar/outcome_log.py": "class SqliteOutcomeLog: ...\nclass OutcomeLog: ...\n",
        "sidecar/seam.py": "from sidecar.outcome_log import OutcomeLog\n",
        "sidecar/location.py": "def f():\n    from sidecar.outcome_log import SqliteOutcomeLog\n",
        "managed_store/__init__.py": "from managed_store.store import ManagedStore\n",
        "managed_store/store.py": "class ManagedStore: ...\n",
    }))
    assert [(e.source, e.name) for e in concrete_store_imports(edges)] == [
        ("sidecar.location", "SqliteOutcomeLog")
    ]


def test_layer_violations_are_named(tmp_path: Path) -> None:
    edges = imports(_tree(tmp_path, {
        "managed_store/store.py": "from sidecar.tool import Tool\n",
        "sidecar/tool.py": "def f():\n    import bridges.mcp\n",
        "sidecar/serve/__init__.py": "",
        "sidecar/seam.py": "from sidecar.serve import app\n",
        "sidecar/serve/app.py": "from bridges.mcp import x\n",
        "bridges/mcp.py": "from managed_store.store import y\nx = 1\n",
    }))
    assert sorted((e.source, e.target) for e in layer_violations(edges)) == [
        ("managed_store.store", "sidecar.tool"),
        ("sidecar.seam", "sidecar.serve.app"),
        ("sidecar.tool", "bridges.mcp"),
    ]


def test_the_store_choices_are_part_of_the_root(tmp_path: Path) -> None:
    edges = imports(_tree(tmp_path, {
        "sidecar/daemon.py": "from sidecar.daemon_stores import open_local_stores\n",
        "sidecar/daemon_stores.py": "from sidecar.outcome_log import SqliteOutcomeLog\n",
        "sidecar/outcome_log.py": "class SqliteOutcomeLog: ...\n",
        "sidecar/seam.py": "from sidecar.daemon_stores import open_local_stores\n",
    }))
    assert concrete_store_imports(edges) == []
    assert [(e.source, e.target) for e in root_violations(edges)] == [
        ("sidecar.seam", "sidecar.daemon_stores")
    ]
