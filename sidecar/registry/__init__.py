"""What tools exist and under which name: the registry and its scopes, profiles, overrides,
plugins. Imports model only.

`application_registry` is the registry of tools an application registers for every Location.
"""

from sidecar.registry.registry import application_registry

__all__ = ["application_registry"]
