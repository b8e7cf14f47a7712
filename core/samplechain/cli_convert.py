"""`samplechain convert` (placeholder: being written)."""

from __future__ import annotations

from typing import Any


def add_convert_parser(sub: Any) -> None:
    """Register the subcommand(s) of this module on the `samplechain` parser."""
