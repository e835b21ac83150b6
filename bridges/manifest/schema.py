"""The JSON Schema of a manifest file, shipped as `schema/manifest.schema.json` (`sidecar check
--schema` prints it): the file format of `bridges.manifest.loading` with the entries validated
elsewhere
(manifest tools, profiles, rate limits, overrides) filled in. Above both, so neither imports
the other to build it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from bridges.manifest.auth import AuthConfig
from bridges.manifest.guardrails import GuardrailsConfig
from bridges.manifest.loading import (
    AuditConfig,
    BoundsConfig,
    ManifestFile,
    PermissionsConfig,
    ServerConfig,
)
from bridges.manifest.openapi import OpenApiConfig
from bridges.manifest.overrides import OverrideConfig
from bridges.manifest.profiles import PROFILE_NAME, ProfileConfig, RateLimitConfig
from bridges.manifest_tools.config import tool_entry_json_schema


def manifest_json_schema() -> dict[str, Any]:
    """The JSON Schema of a manifest file (shipped as schema/manifest.schema.json)."""
    schema = ManifestFile.model_json_schema()
    defs = schema.setdefault("$defs", {})
    defs["ServerConfig"] = ServerConfig.model_json_schema(ref_template="#/$defs/{model}")
    for sub in ("$defs",):
        defs.update(defs["ServerConfig"].pop(sub, {}))
    defs["PermissionsConfig"] = PermissionsConfig.model_json_schema(
        ref_template="#/$defs/{model}"
    )
    defs.update(defs["PermissionsConfig"].pop("$defs", {}))
    defs["BoundsConfig"] = BoundsConfig.model_json_schema()
    props = schema["properties"]
    props["mcpServers"] = {"type": "object", "additionalProperties": {
        "$ref": "#/$defs/ServerConfig"}}
    props["servers"] = props["mcpServers"]
    props["permissions"] = {"$ref": "#/$defs/PermissionsConfig"}
    props["bounds"] = {"$ref": "#/$defs/BoundsConfig"}
    defs["AuditConfig"] = AuditConfig.model_json_schema()
    props["audit"] = {"$ref": "#/$defs/AuditConfig"}
    defs["GuardrailsConfig"] = GuardrailsConfig.model_json_schema()
    props["guardrails"] = {"$ref": "#/$defs/GuardrailsConfig"}
    auth: dict[str, Any] = AuthConfig.model_json_schema(ref_template="#/$defs/{model}")
    defs.update(auth.pop("$defs", {}))
    defs["AuthConfig"] = auth
    props["auth"] = {"$ref": "#/$defs/AuthConfig"}
    entry = tool_entry_json_schema()
    defs.update(entry.pop("$defs", {}))
    defs["ManifestTool"] = entry
    models: tuple[type[BaseModel], ...] = (ProfileConfig, RateLimitConfig, OverrideConfig,
                                           OpenApiConfig)
    for model in models:
        part: dict[str, Any] = model.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(part.pop("$defs", {}))
        defs[model.__name__] = part
    overrides: dict[str, Any] = {
        "type": "object", "additionalProperties": {"$ref": "#/$defs/OverrideConfig"},
        "description": "tool overrides by effective name or glob",
    }
    defs["ServerConfig"]["properties"]["overrides"] = {
        **overrides, "description": "tool overrides by upstream name or glob"}
    props["tools"] = {"type": "object", "additionalProperties": {"$ref": "#/$defs/ManifestTool"},
                      "properties": {"overrides": overrides},
                      "description": "manifest tools (kind = http | command)"}
    props["profiles"] = {"type": "object", "additionalProperties": {
        "$ref": "#/$defs/ProfileConfig"}, "propertyNames": {"pattern": PROFILE_NAME.pattern}}
    props["rate_limits"] = {"type": "object", "additionalProperties": {
        "$ref": "#/$defs/RateLimitConfig"}, "description": "per-tool rate limits by glob"}
    props["openapi"] = {"type": "object", "additionalProperties": {
        "$ref": "#/$defs/OpenApiConfig"}, "description": "OpenAPI services as tools"}
    schema["title"] = "mcp-sidecar manifest"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
