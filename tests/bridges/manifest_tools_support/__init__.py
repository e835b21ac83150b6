"""Helpers of the manifest tools tests: a real Starlette app on uvicorn, a Location with the
registrar wired the way the composition root wires it, and memory probes."""
