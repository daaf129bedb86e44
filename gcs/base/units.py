"""Human units for what people read (``gcs status``, plan reasons, the simulator's report).

Memory is formatted exactly as Ray 2.60's ``ray status`` does
(``ray.autoscaler._private.util.format_memory``): the largest binary unit the amount
reaches, two decimals (``15.15GiB``), plain bytes below 1 KiB (``0B``).  Other resources
print as Ray prints them (``0.0/16.0 CPU``).  JSON output keeps raw numbers: programs read it.
"""

from __future__ import annotations

from collections.abc import Mapping

MEMORY_RESOURCES = frozenset({"memory", "object_store_memory"})
"""Resources measured in bytes (Ray's list)."""

_MEMORY_SUFFIXES = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_memory(mem_bytes: float) -> str:
    """``2**30 + 1`` -> ``1.00GiB``, ``1`` -> ``1B`` (never rounded down to ``0GiB``)."""
    for suffix, per_unit in _MEMORY_SUFFIXES:
        if mem_bytes >= per_unit:
            return f"{mem_bytes / per_unit:.2f}{suffix}"
    return f"{int(mem_bytes)}B"


def format_count(value: float) -> str:
    """A resource amount as Ray prints a float: ``16.0``, ``0.5``."""
    return str(float(value))


def format_amount(resource: str, value: float) -> str:
    """One amount of ``resource``: bytes for memory, Ray's float otherwise."""
    return format_memory(value) if resource in MEMORY_RESOURCES else format_count(value)


def usage_line(resource: str, used: float, total: float) -> str:
    """``0B/15.15GiB memory``, ``2.0/16.0 CPU`` (Ray's usage line, without the indent)."""
    return f"{format_amount(resource, used)}/{format_amount(resource, total)} {resource}"


def format_quantity(resource: str, value: float) -> str:
    """A compact amount for sentences: ``4`` CPUs, ``0.5`` GPU, ``2.00GiB`` memory."""
    return format_memory(value) if resource in MEMORY_RESOURCES else f"{value:g}"


def format_shape(shape: Mapping[str, float]) -> str:
    """A resource request for people: ``{CPU: 1, memory: 2.00GiB}``."""
    parts = [f"{name}: {format_quantity(name, value)}" for name, value in sorted(shape.items())]
    return "{" + ", ".join(parts) + "}"
