"""May this call run: the permission service (rules, asks, replies), rate limits, pins.
Imports model, registry and stores.
"""
