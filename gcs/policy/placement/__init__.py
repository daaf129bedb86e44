"""Placement-group bundles: Ray's bundle resource names and the pure placement policy."""
