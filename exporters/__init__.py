"""Goodput exporters."""
