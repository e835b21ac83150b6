"""Shared contract suites for the store ports of `sidecar.stores` (one Protocol per module).

Each `test_<store>_contract.py` takes its store from one fixture parametrised over the
implementations: an implementation on another engine (PostgreSQL, S3-compatible storage) adds
one `pytest.param` to that fixture and must pass the same suite. A fixture yields a
`Reopen`-style factory where the contract includes surviving a restart: calling it again opens
the same storage anew.
"""
