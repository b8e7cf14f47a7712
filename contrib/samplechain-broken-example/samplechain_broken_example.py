"""A plugin that cannot be imported: it needs a module nobody installed.

samplechain must report it (plugin name, distribution, version, the ModuleNotFoundError), list it as broken in
`samplechain plugins`, keep every other plugin working, and fail hard only in strict mode (SAMPLECHAIN_STRICT=1).
"""

from __future__ import annotations

import samplechain_missing_dependency  # noqa: F401  -- deliberately absent: importing this module fails here
from samplechain import Sampler, Stage, hookimpl


class NeverRegistered(Sampler):
    name = "never_registered"
    stage = Stage.TRANSFORM


@hookimpl
def register_samplers(register):
    register(NeverRegistered)
