"""Goodput detector."""
