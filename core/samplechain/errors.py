"""Exceptions. Every message names the culprit (plugin, key path, value) and suggests a fix."""

from __future__ import annotations

__all__ = [
    "SamplechainError",
    "ConfigError",
    "PluginError",
    "PluginLoadError",
    "UnknownPluginError",
    "BackendError",
    "SamplingError",
    "RequestError",
]


class SamplechainError(Exception):
    """Base class of every error samplechain raises on purpose."""


class ConfigError(SamplechainError, ValueError):
    """A chain config (TOML file or dict) is invalid. The message carries file, key path, value and expectation."""


class PluginError(SamplechainError):
    """A plugin misbehaves: bad registration, conflicting names."""


class PluginLoadError(PluginError):
    """A plugin failed to import or register (raised in strict mode, otherwise reported as broken)."""


class UnknownPluginError(PluginError, ConfigError):
    """A chain names a sampler, criterion or backend that no installed plugin provides."""


class BackendError(SamplechainError):
    """The requested backend is missing or cannot run here. Never answered by a silent fallback."""


class SamplingError(SamplechainError):
    """A step failed: bad logits, a sampler raising mid-chain, every token of a row masked."""


class RequestError(SamplechainError, KeyError):
    """A request id is unknown, duplicated, or its per-request parameters are invalid."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class ChainWarning(UserWarning):
    """A chain that is valid but probably not what was meant (a known pitfall); it runs as written."""


class GenerationWarning(UserWarning):
    """Something about the inputs was fixed up (pad token from eos, an empty prompt given bos, ...)."""
