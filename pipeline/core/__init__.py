"""The pure core: normalisation, keys, windows, bounded tables, policy and the refusal check.

Nothing here performs I/O or reads the clock: every time is an integer epoch-ms parameter.
"""
