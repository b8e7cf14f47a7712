"""Lets the tests run from a plain checkout as well as after `pip install -e .`: the plugin module sits one
folder up, next to pyproject.toml. An installed copy, if any, wins."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("samplechain_example_suffix") is None:
    sys.path.insert(0, str(PACKAGE_ROOT))
