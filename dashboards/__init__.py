"""Goodput dashboards."""
