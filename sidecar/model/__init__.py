"""Value types without I/O: tools and codecs, content and outcomes, errors, names, events,
permission requests and rules, metadata, JSON depth, text measures, the Code Mode setting,
tracing (the opentelemetry-api facade). The lowest package of the core: imports nothing of
ours but `managed_store`. See README.md.
"""
