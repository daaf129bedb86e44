"""The autoscaler's pure parts: value types, the bin-packing scheduler,
the unavailable-capacity cache."""
