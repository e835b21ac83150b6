"""One workspace the daemon serves: `Location` with its registry, seam, stores (one `Stores`
value, `ports`) and sources; health, state usage and store pressure. Imports the whole core.
"""
