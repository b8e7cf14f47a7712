"""samplechain: composable, batched LLM decoding. Chains of sampler plugins, declared in TOML."""

from __future__ import annotations

from . import _moved
from .contracts import (
    ALL_DEVICES,
    FUSED_SAMPLE,
    Backend,
    Candidates,
    EosIds,
    FusedPart,
    NoParams,
    Sampler,
    SamplerSetup,
    Stage,
    StepContext,
    StopContext,
    StopMatch,
    StoppingCriterion,
    StopSetup,
    max_positions,
    token_id_list,
)
from .engine.backends import select_backend
from .engine.chain import Chain, SampleOutput
from .engine.config import ChainConfig, EntrySpec, load_config
from .engine.discovery import PluginHost, PluginInfo, PluginWarning, get_host, reset_host
from .engine.mixed import MixedChains, MixedStore
from .engine.registry import Registry, load_registry
from .engine.stopping import Stopping, StopResult
from .engine.store import RequestStore
from .errors import (
    BackendError,
    ChainWarning,
    ConfigError,
    PluginError,
    PluginLoadError,
    RequestError,
    SamplechainError,
    SamplingError,
    UnknownPluginError,
)
from .hookspecs import hookimpl
from .params import finite, in_range, one_of, seed_field, token_ids_field

__version__ = "0.1.0"

_moved.install()  # the pre-layout module paths (samplechain.state, samplechain.plugins, ...) keep working

__all__ = [
    "ALL_DEVICES",
    "Backend",
    "BackendError",
    "ChainWarning",
    "Candidates",
    "Chain",
    "MixedChains",
    "MixedStore",
    "ChainConfig",
    "ConfigError",
    "EntrySpec",
    "FUSED_SAMPLE",
    "FusedPart",
    "NoParams",
    "PluginError",
    "PluginHost",
    "PluginInfo",
    "PluginLoadError",
    "PluginWarning",
    "Registry",
    "RequestError",
    "RequestStore",
    "SampleOutput",
    "Sampler",
    "SamplechainError",
    "SamplingError",
    "Stage",
    "StepContext",
    "StopContext",
    "StopMatch",
    "StopResult",
    "EosIds",
    "SamplerSetup",
    "StopSetup",
    "Stopping",
    "StoppingCriterion",
    "UnknownPluginError",
    "__version__",
    "finite",
    "get_host",
    "hookimpl",
    "in_range",
    "load_config",
    "load_registry",
    "max_positions",
    "one_of",
    "reset_host",
    "seed_field",
    "token_ids_field",
    "select_backend",
    "token_id_list",
]
