"""Thin servicers, one per gRPC service: validate, call a manager, encode."""
