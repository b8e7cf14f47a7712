"""The whole plugin contract. Hooks only register; the chain executor calls what was registered, in order."""

from __future__ import annotations

from collections.abc import Callable

import pluggy

__all__ = ["hookspec", "hookimpl", "PROJECT"]

PROJECT = "samplechain"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_samplers(register: Callable[[type], None]) -> None:
    """Register Sampler subclasses: call register(cls) once per class."""


@hookspec
def register_stopping_criteria(register: Callable[[type], None]) -> None:
    """Register StoppingCriterion subclasses: call register(cls) once per class."""


@hookspec
def register_backends(register: Callable[[type], None]) -> None:
    """Register Backend subclasses: call register(cls) once per class."""


@hookspec
def register_runners(register: Callable[[type], None]) -> None:
    """Register ModelRunner subclasses (samplechain.runners): call register(cls) once per class."""


@hookspec
def register_drafters(register: Callable[[type], None]) -> None:
    """Register Drafter subclasses (samplechain.drafters): call register(cls) once per class."""


@hookspec
def register_guards(register: Callable[[type], None]) -> None:
    """Register Guard subclasses (samplechain.guards): call register(cls) once per class."""
