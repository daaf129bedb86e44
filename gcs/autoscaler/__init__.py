"""Embedded autoscaler: pure scheduling policy, cluster config, planner CLI."""
