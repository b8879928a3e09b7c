"""Goodput catalogue."""
