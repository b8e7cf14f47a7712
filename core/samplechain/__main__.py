"""`python -m samplechain ...`: the `samplechain` command (same subcommands, output and exit codes)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
