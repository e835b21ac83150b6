"""The Code Mode catalog: the reachable tools of one snapshot and their Python paths.

A tool named `<namespace>_<key>` is called as `tools.<namespace>.<key>(...)` inside a program
(a dotted namespace such as `git.remote` nests: `tools.git.remote.<key>`); a tool without a
namespace as `tools.<key>(...)`. Each part is made a Python identifier: characters outside
`[A-Za-z0-9_]` become `_`, leading underscores are dropped, a leading digit gets a `t_` prefix
and a keyword a trailing `_`, and so does a namespace that names a module the sandbox provides
itself (`time`, `json`, `re`, ...: `tools.time_.convert_time(...)`). Namespaced tools are
placed first, then by effective name; a tool whose path is taken (by another tool or a
namespace) has none. Every tool stays reachable by its effective name with
`call_tool("<name>", ...)`.
"""

from __future__ import annotations

import functools
import keyword
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_monty import ExternalModule

from sidecar.model.names import sanitize
from sidecar.registry.registry import Entry, ToolDefinition

_NON_IDENT = re.compile(r"[^A-Za-z0-9_]")


def identifier(part: str) -> str | None:
    """`part` as a Python identifier a host module may expose, or None if nothing is left."""
    ident = _NON_IDENT.sub("_", part).lstrip("_")
    if not ident:
        return None
    if ident[0].isdigit():
        ident = "t_" + ident
    if keyword.iskeyword(ident) or keyword.issoftkeyword(ident):
        ident += "_"
    return ident


@functools.cache
def _namespace_part(part: str) -> str:
    """`part` as a namespace module of `tools`: the sandbox refuses a module under the name of
    one it provides (mcp-server-time's `time`), so such a part gets trailing `_`s."""
    while True:
        try:
            ExternalModule({part: ExternalModule({})})
        except ValueError:
            part += "_"
        else:
            return part


def _namespace_of(name: str, entry: Entry) -> str | None:
    """The namespace an effective name was built from (the Entry does not keep it)."""
    if entry.tool.namespace:
        return entry.tool.namespace
    key = sanitize(entry.key)
    if name != key and name.endswith("_" + key):
        return name[: -len(key) - 1] or None
    return None


def _path_of(name: str, entry: Entry) -> tuple[str, ...] | None:
    namespace = _namespace_of(name, entry)
    if namespace is None:
        tool = identifier(name)
        return (tool,) if tool else None
    parts = [identifier(p) for p in re.split(r"[./]", namespace)]
    tool = identifier(entry.key)
    if tool is None or any(p is None for p in parts):
        tool = identifier(name)
        return (tool,) if tool else None
    return (*[_namespace_part(p) for p in parts if p is not None], tool)


@dataclass(frozen=True, slots=True)
class CatalogTool:
    """One reachable tool: its effective name, its Python path (if any) and its definition."""

    name: str
    path: tuple[str, ...] | None
    definition: ToolDefinition

    @property
    def call_example(self) -> str:
        """How a program calls it: `tools.fs.read_file(...)` or `call_tool("name", ...)`."""
        if self.path is not None:
            return "tools." + ".".join(self.path) + "(...)"
        return f'call_tool("{self.name}", ...)'


class Catalog:
    """The reachable tools of one snapshot, by effective name and by Python path."""

    __slots__ = ("_by_name", "_by_path", "tree")

    def __init__(self, entries: Mapping[str, Entry]) -> None:
        self._by_name: dict[str, CatalogTool] = {}
        self._by_path: dict[tuple[str, ...], CatalogTool] = {}
        self.tree: dict[str, Any] = {}
        """Nested dicts of path parts; leaves are effective names (str)."""
        paths = {name: _path_of(name, entry) for name, entry in entries.items()}
        # namespaced tools first, so a namespace wins over a plain tool of the same name
        for name in sorted(entries, key=lambda n: (len(paths[n] or ()) < 2, n)):
            path = paths[name]
            if path is not None and not self._place(path, name):
                path = None
            tool = CatalogTool(name=name, path=path, definition=entries[name].definition)
            self._by_name[name] = tool
            if path is not None:
                self._by_path[path] = tool
        self._by_name = dict(sorted(self._by_name.items()))

    def _place(self, path: tuple[str, ...], name: str) -> bool:
        node = self.tree
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                return False  # a tool already sits where this namespace would go
            node = child
        if path[-1] in node:
            return False
        node[path[-1]] = name
        return True

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def tools(self) -> tuple[CatalogTool, ...]:
        return tuple(self._by_name.values())

    def get(self, name: str) -> CatalogTool | None:
        return self._by_name.get(name)

    def find(self, reference: str) -> CatalogTool | None:
        """A tool by effective name, Python path (`fs.read_file`, `tools.fs.read_file`) or
        call form (`call_tool("fs_read_file")`)."""
        reference = reference.strip()
        found = self._by_name.get(reference)
        if found is not None:
            return found
        quoted = re.fullmatch(r"""call_tool\(\s*["']([^"']+)["']\s*\)?""", reference)
        if quoted:
            return self._by_name.get(quoted.group(1))
        dotted = re.sub(r"\(.*\)$", "", reference.removeprefix("await ")).strip()
        dotted = dotted.removeprefix("tools.")
        return self._by_path.get(tuple(dotted.split(".")))

    def names(self) -> list[str]:
        return list(self._by_name)
