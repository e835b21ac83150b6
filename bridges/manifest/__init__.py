"""Manifest files: their data model (`model`), loading and validation (`loading`), `${...}`
secret references (`secrets`), the override, profile and `oauth` tables, globs that match no
tool (`globs`) and the JSON Schema of a manifest (`schema`). Part of the bridges: imports
`sidecar.model` (and `bridges.manifest_tools.config`, for the tool entries' schema); what a
manifest means at run time is wired by the composition root (`sidecar.daemon`).
"""
