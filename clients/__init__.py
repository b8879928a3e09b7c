"""Clients for the stack's HTTP APIs: `clients.prometheus` (Prometheus and VictoriaMetrics) and
`clients.loki`. One place for timeouts, the bound on an answer's size and typed errors.

The package imports no other Goodput package, so every one of them may import it (the
import-linter contracts in pyproject.toml).
"""
