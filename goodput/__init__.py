"""The `goodput` command: wires exporters, detector and recovery together. No domain logic."""

__version__ = "0.1.0"
