"""The `fedveil` command: one module per command (entry points, the top layer)."""

from fedveil.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
