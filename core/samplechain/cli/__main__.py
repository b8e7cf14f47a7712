"""`python -m samplechain.cli`: the command line, as `python -m samplechain`."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
