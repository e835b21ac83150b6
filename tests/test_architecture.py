"""The layers of docs/architecture.md, checked on the import graph of `sidecar/`, `bridges/` and
`managed_store/` (read with `ast`, nothing is imported). One table, keyed by package, says what
each package may import (`MAY_IMPORT`); a package may always import its own modules.

An edge is every `import` / `from ... import` of one of our modules, at module level or inside a
function. Imports under `if TYPE_CHECKING:` add no run-time dependency: they are left out of the
cycle and layer checks (a frontend types against `Location` that way), but an import of a backend
or of the composition root counts wherever it is.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("sidecar", "bridges", "managed_store")

CORE = ("sidecar.model", "sidecar.registry", "sidecar.stores", "sidecar.policy",
        "sidecar.execution", "sidecar.codemode", "sidecar.location")
"""The core, lowest first: a core package imports only the ones before it (and
`managed_store`, the library whose `TextStore` is the managed store's port)."""
BACKENDS = ("sidecar.backends.sqlite", "sidecar.backends.local", "sidecar.backends.postgres")
FACES = ("bridges.mcp", "bridges.mcp.oauth")
"""The package faces of the MCP bridge the frontends may use (their `__init__`), nothing below."""
DRIVERS = ("asyncpg", "obstore")
"""Optional drivers: named only by the backends (and the managed store's own S3 implementation)."""
DRIVER_PLACE_S3 = "managed_store.s3"

MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "managed_store": (),
    **{package: (*CORE[:i], "managed_store") for i, package in enumerate(CORE)},
    **dict.fromkeys(BACKENDS, ("sidecar.stores", "sidecar.model", "managed_store")),
    "bridges": ("sidecar.model", "sidecar.registry", "sidecar.stores", "managed_store"),
    "bridges.openapi": ("sidecar.model", "sidecar.registry", "sidecar.stores", "managed_store",
                        "bridges.manifest", "bridges.manifest_tools"),
    "sidecar.formats": ("sidecar.model", "sidecar.registry"),
    "sidecar.serve": (*CORE, "sidecar.formats", "managed_store", *FACES),
    "sidecar.cli": (*CORE, *BACKENDS, "sidecar.formats", "sidecar.serve", "sidecar.daemon",
                    "bridges", "managed_store"),
    "sidecar.daemon": (*CORE, *BACKENDS, "sidecar.formats", "sidecar.serve", "bridges",
                       "managed_store"),
    "sidecar": ("sidecar.model", "sidecar.execution", "sidecar.cli", "sidecar.daemon"),
}
"""Who may import whom. `sidecar` itself is the public API (`__init__` re-exports, the lazy
`Location` from the composition root, `__main__`). The composition root (`sidecar.daemon`) and
the CLI sit on top; only they (and tests) import backends."""
EXACT = set(FACES)
"""Entries of `MAY_IMPORT` that allow that module only, not the modules below it."""
ROOT = "sidecar.daemon"

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


def package(module: str) -> str:
    """The entry of `MAY_IMPORT` a module belongs to: the longest package that holds it."""
    candidates = [p for p in MAY_IMPORT if module == p or module.startswith(p + ".")]
    assert candidates, f"{module} is in no package of the table"
    return max(candidates, key=len)


def allowed(source: str, target: str) -> bool:
    home = package(source)
    if package(target) == home:
        return True
    for entry in MAY_IMPORT[home]:
        if entry in EXACT:
            if target == entry:
                return True
        elif target == entry or target.startswith(entry + "."):
            return True
    return False


def layer_violations(edges: list[Import]) -> list[Import]:
    return [e for e in edges if e.kind != "type_checking" and not allowed(e.source, e.target)]


def hidden_violations(edges: list[Import]) -> list[Import]:
    """Imports of a backend or of the composition root for types only, by a module that may
    not import them at run time: the frontends and the core type against the ports."""
    return [
        e for e in edges
        if e.kind == "type_checking" and not allowed(e.source, e.target)
        and (package(e.target) in BACKENDS or package(e.target) == ROOT)
    ]


def driver_names(base: Path) -> list[str]:
    """Modules outside the backends that import an optional driver or name it in code (an
    import, `sys.modules["asyncpg"]`, an attribute): docstrings and comments do not count."""
    found: list[str] = []
    for module, path in modules(base).items():
        if package(module) in BACKENDS or module.startswith(DRIVER_PLACE_S3):
            continue
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                           ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docstrings:
                names = [node.value]
            line = getattr(node, "lineno", 0)
            found += [f"{module} (line {line}): {n}" for n in names if n.split(".")[0] in DRIVERS]
    return found


def _describe(bad: list[Import]) -> str:
    lines = (f"  {e}  [{package(e.source)} -> {package(e.target)}]" for e in bad)
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


def test_every_module_is_in_a_package_of_the_table() -> None:
    for module in modules(REPO):
        package(module)


def test_layers(edges: list[Import]) -> None:
    bad = layer_violations(edges)
    assert not bad, "imports against docs/architecture.md:\n" + _describe(bad)


def test_backends_and_the_root_are_not_named_even_for_types(edges: list[Import]) -> None:
    bad = hidden_violations(edges)
    assert not bad, "a backend or the composition root named for types:\n" + _describe(bad)


def test_only_the_backends_name_a_driver() -> None:
    assert driver_names(REPO) == []


def test_every_package_of_the_table_exists() -> None:
    homes = {package(m) for m in modules(REPO)}
    assert homes == set(MAY_IMPORT), f"in the table, without a module: {set(MAY_IMPORT) - homes}"


# --- the checker, on small made-up trees (so a broken walker cannot pass the real one) ------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for package_name in PACKAGES:
        (tmp_path / package_name).mkdir()
        (tmp_path / package_name / "__init__.py").write_text("")
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


def test_layer_violations_are_named(tmp_path: Path) -> None:
    edges = imports(_tree(tmp_path, {
        "managed_store/store.py": "from sidecar.model.tool import Tool\n",
        "sidecar/model/tool.py": "def f():\n    import bridges.mcp\n",
        "sidecar/registry/registry.py": "from sidecar.model.tool import Tool\n",
        "sidecar/execution/seam.py": "from sidecar.serve import app\n",
        "sidecar/serve/app.py": "from bridges.mcp import x\nfrom bridges.mcp.pool import y\n",
        "sidecar/serve/api.py": "from sidecar.backends.sqlite import z\n",
        "sidecar/backends/sqlite/__init__.py": "from sidecar.backends.postgres import w\n",
        "sidecar/backends/postgres/__init__.py": "w = 1\n",
        "bridges/mcp/__init__.py": "from managed_store.store import y\nx = 1\n",
        "bridges/mcp/pool.py": "from sidecar.execution.seam import s\ny = 1\n",
    }))
    assert sorted((e.source, e.target) for e in layer_violations(edges)) == [
        ("bridges.mcp.pool", "sidecar.execution.seam"),
        ("managed_store.store", "sidecar.model.tool"),
        ("sidecar.backends.sqlite", "sidecar.backends.postgres"),
        ("sidecar.execution.seam", "sidecar.serve.app"),
        ("sidecar.model.tool", "bridges.mcp"),
        ("sidecar.serve.api", "sidecar.backends.sqlite"),
        ("sidecar.serve.app", "bridges.mcp.pool"),
    ]


def test_a_backend_named_for_types_is_found(tmp_path: Path) -> None:
    edges = imports(_tree(tmp_path, {
        "sidecar/backends/sqlite/store.py": "class SqliteStore: ...\n",
        "sidecar/daemon/daemon.py": "from sidecar.backends.sqlite.store import SqliteStore\n",
        "sidecar/serve/app.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from sidecar.backends.sqlite.store import SqliteStore\n"
            "    from sidecar.location.location import Location\n"
        ),
        "sidecar/location/location.py": "class Location: ...\n",
    }))
    assert [(e.source, e.target) for e in hidden_violations(edges)] == [
        ("sidecar.serve.app", "sidecar.backends.sqlite.store")
    ]


def test_a_driver_named_outside_the_backends_is_found(tmp_path: Path) -> None:
    base = _tree(tmp_path, {
        "sidecar/stores/errors.py": (
            '"""Mentions asyncpg in a docstring: fine."""\n'
            "import sys\n# asyncpg in a comment: fine\n"
            "driver = sys.modules.get('asyncpg')\n"
        ),
        "sidecar/backends/postgres/pool.py": "import asyncpg\n",
        "managed_store/s3/objects.py": "import obstore\n",
        "bridges/x.py": "def f():\n    from obstore.store import S3Store\n",
    })
    assert sorted(driver_names(base)) == [
        "bridges.x (line 2): obstore.store",
        "sidecar.stores.errors (line 4): asyncpg",
    ]
