"""Running one call: the seam (admission, validation, bounding, the durable outcome), hooks,
snapshots of what a request advertised, `managed_read`, outcomes kept while the fleet database is
down. Imports model, registry, stores and policy.
"""
