"""Sub-commands of `goodput`, one module each, each exposing a typer `app`."""
