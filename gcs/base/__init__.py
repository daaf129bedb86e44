"""Foundation: errors, the clock, background work, lifecycle, ids, wire helpers.

Imports nothing of the GCS above it (see docs/architecture.md).
"""
