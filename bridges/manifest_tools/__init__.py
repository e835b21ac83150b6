"""Manifest tools: `http` and `command` tools declared in a Location's manifests.

    from bridges.manifest_tools import ManifestTools, manifest_tool_validator

    loaded = load_manifests(dirs, tool_validator=manifest_tool_validator(root))
    manifest_tools = ManifestTools(location.tools, store, root, permissions)
    await manifest_tools.apply(loaded.tools)

Modules: `config` (keys and validation), `templates` (`{field}` placeholders), `capture`
(bounded output capture and spooling), `progress` (output lines as progress), `process`
(process groups), `http_tool`, `command_tool`, `registrar`. The key reference is README.md.
Part of the bridges: imports `sidecar.model`, `sidecar.registry`, `managed_store` and the rest
of `bridges` only.
"""

from bridges.manifest_tools.config import (
    BASE_ENV,
    CommandToolConfig,
    HttpRequestConfig,
    HttpToolConfig,
    ManifestToolConfig,
    manifest_tool_validator,
    tool_entry_json_schema,
    validate_tool_entry,
)
from bridges.manifest_tools.registrar import ManifestTools

__all__ = [
    "BASE_ENV",
    "CommandToolConfig",
    "HttpRequestConfig",
    "HttpToolConfig",
    "ManifestToolConfig",
    "ManifestTools",
    "manifest_tool_validator",
    "tool_entry_json_schema",
    "validate_tool_entry",
]
