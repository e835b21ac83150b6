"""One `Protocol` (with its value types) per kind of state a Location keeps, and the store
errors (`errors`). No implementation and no driver here: they live in `sidecar.backends`.
Imports model and registry.
"""
