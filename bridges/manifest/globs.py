"""Globs of the manifests that match no tool: a permission rule, a profile's `include` or
`exclude`, an override or a rate limit whose pattern names nothing decides nothing, silently
(a rule meant to ask before `git_commit` written as `git_git_commit` lets it run unasked).

`unmatched_globs(loaded, names)` lists each as a `ManifestProblem` (severity "warning")
naming the file, the JSON path and the closest tool names. `ToolNames` is what the globs are
matched against: the tools' effective names, their names after overrides, their permission
actions, and each MCP server's upstream names (what `[mcpServers.KEY.overrides]` match).
`sidecar check --live` matches against a running daemon's tools; the daemon reports its own
at start and at each reload (`sidecar.location.health`, one log line).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from bridges.manifest.loading import ManifestSet, _key_path
from bridges.manifest.values import ManifestProblem
from sidecar.model.suggest import closest


@dataclass(frozen=True, slots=True)
class ToolNames:
    """The names a manifest glob may mean (see the module docstring)."""

    names: frozenset[str]
    upstream: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Upstream tool names by MCP server key; a server absent here is matched against
    `names` with and without its `KEY_` prefix."""

    def of_server(self, server: str) -> frozenset[str]:
        known = self.upstream.get(server)
        if known is not None:
            return known
        prefix = f"{server}_"
        return self.names | {n[len(prefix):] for n in self.names if n.startswith(prefix)}


@dataclass(frozen=True, slots=True)
class _Glob:
    file: str
    path: str
    pattern: str
    what: str
    """What the glob is, for the message ("permission rule", "profile coding's exclude")."""
    server: str | None = None


def _globs(loaded: ManifestSet) -> Iterator[_Glob]:
    for i, rule in enumerate(loaded.rules):
        file, path = (loaded.rule_sources[i] if i < len(loaded.rule_sources)
                      else ("(manifests)", f"$.permissions.rules[{i}]"))
        yield _Glob(file, f"{path}.action", rule.action, f"permission rule ({rule.decision})")
    for sourced in loaded.overrides:
        server, _ = sourced.value
        base = _key_path(f"$.mcpServers.{server}.overrides" if server else "$.tools.overrides",
                         sourced.key)
        yield _Glob(sourced.file, base, sourced.key,
                    f"override of server {server}" if server else "tool override", server)
    for glob, sourced in loaded.rate_limits.items():
        yield _Glob(sourced.file, _key_path("$.rate_limits", glob), glob, "rate limit")
    for key, sourced in loaded.profiles.items():
        config = sourced.value
        base = _key_path("$.profiles", key)
        for which in ("include", "exclude"):
            for i, pattern in enumerate(getattr(config, which) or ()):
                yield _Glob(sourced.file, f"{base}.{which}[{i}]", pattern,
                            f"profile {key}'s {which}")
        for i, rule in enumerate(config.permissions.rules):
            yield _Glob(sourced.file, f"{base}.permissions.rules[{i}].action", rule.action,
                        f"profile {key}'s permission rule ({rule.decision})")
        for glob in config.tool_rate_limits:
            yield _Glob(sourced.file, _key_path(f"{base}.tool_rate_limits", glob), glob,
                        f"profile {key}'s rate limit")
        for glob in config.overrides:
            yield _Glob(sourced.file, _key_path(f"{base}.overrides", glob), glob,
                        f"profile {key}'s override")


def _matches_any(pattern: str, names: Iterable[str]) -> bool:
    if not any(c in pattern for c in "*?["):
        return pattern in names
    compiled = re.compile(fnmatch.translate(pattern))  # fnmatchcase, compiled once
    return any(compiled.match(n) for n in names)


def unmatched_globs(loaded: ManifestSet, tools: ToolNames) -> list[ManifestProblem]:
    """Every glob of `loaded` that matches none of `tools` (see the module docstring)."""
    problems = []
    for glob in _globs(loaded):
        names = tools.of_server(glob.server) if glob.server is not None else tools.names
        if _matches_any(glob.pattern, names):
            continue
        near = closest(glob.pattern.rstrip("*?"), names, limit=3)
        problems.append(ManifestProblem(
            glob.file, glob.path,
            f"{glob.what} {glob.pattern!r} matches no tool, so it applies to nothing",
            hint=("tools with a close name: " + ", ".join(near)) if near else
            f"none of the {len(names)} tool names served now is close",
            severity="warning",
        ))
    return problems
