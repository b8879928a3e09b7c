"""Goodput bench."""
