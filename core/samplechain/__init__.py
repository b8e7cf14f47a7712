"""samplechain: composable, batched LLM decoding. Chains of sampler plugins, declared in TOML."""

from __future__ import annotations

from .backends import select_backend
from .chain import Chain, SampleOutput
from .mixed import MixedChains, MixedStore
from .config import ChainConfig, EntrySpec, load_config
from .contracts import (
    ALL_DEVICES,
    Backend,
    Candidates,
    FUSED_SAMPLE,
    FusedPart,
    NoParams,
    Sampler,
    Stage,
    StepContext,
    StopContext,
    StopMatch,
    StoppingCriterion,
    EosIds,
    SamplerSetup,
    StopSetup,
    max_positions,
    token_id_list,
)
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
from .plugins import PluginHost, PluginInfo, PluginWarning, get_host, reset_host
from .registry import Registry, load_registry
from .state import RequestStore
from .stopping import Stopping, StopResult

__version__ = "0.1.0"

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
