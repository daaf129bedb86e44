"""Thin gRPC servicers, one per service: validate, call a manager, encode."""
