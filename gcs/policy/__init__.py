"""Policy: pure decisions, values in and values out (no I/O, no clock reads).

Placement of bundles, the virtual-cluster model, the autoscaler's scheduler.
"""
