"""Goodput recovery."""
