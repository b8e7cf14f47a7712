"""`samplechain trace` (placeholder: being written)."""

from __future__ import annotations

from typing import Any


def add_trace_parser(sub: Any) -> None:
    """Register the subcommand(s) of this module on the `samplechain` parser."""
