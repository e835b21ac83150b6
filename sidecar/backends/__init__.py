"""Store implementations, one subpackage per kind of backing: `sqlite` (embedded databases
in the state directory), `local` (files, the keyring, memory), `postgres` (the fleet database).
Only `sidecar.daemon`, `sidecar.cli` and tests import them; no backend imports another.
"""
