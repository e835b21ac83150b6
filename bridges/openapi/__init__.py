"""OpenAPI services as tools: each operation of an `[openapi.NAME]` description becomes the
tool `NAME_<operationId>`, called over HTTP through the seam like a manifest `http` tool
(docs/openapi.md).

    from bridges.openapi import OpenApiTools

    openapi = OpenApiTools(location.tools, store, permissions, store_namespace=location.name)
    problems = await openapi.apply(loaded.openapi)

Modules: `document` (reading a spec and the documents its `$ref`s name), `schemas` (OpenAPI
schemas as self-contained JSON Schemas), `operations` (names, input and output schemas),
`call` (a request per call), `registrar`. Part of the bridges: imports `sidecar.model`,
`sidecar.registry`, `managed_store`, `bridges.manifest` and `bridges.manifest_tools`.
"""

from bridges.openapi.registrar import OpenApiTools, Prepared, Service

__all__ = ["OpenApiTools", "Prepared", "Service"]
