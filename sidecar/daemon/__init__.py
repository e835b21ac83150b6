"""The composition root: chooses the backends (`stores`), attaches the manifests' sources
(`sources`) and runs the daemon (`daemon`). Only the CLI and the lazy `sidecar.Location` import it.
"""
