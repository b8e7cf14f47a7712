"""Backend selection, as vLLM selects platforms: availability check, fixed precedence, explicit override wins,
and a missing or unusable backend is a clear error, never a silent fallback."""

from __future__ import annotations

from ..contracts import Backend
from ..errors import BackendError, UnknownPluginError
from .discovery import PluginHost

__all__ = ["PRECEDENCE", "select_backend"]

PRECEDENCE = ("cuda", "mps", "cpu")


def _load(host: PluginHost, name: str) -> type[Backend]:
    try:
        return host.get("backend", name)
    except UnknownPluginError as exc:
        raise BackendError(str(exc)) from None


def select_backend(host: PluginHost, requested: str, device_type: str | None = None) -> Backend:
    """The backend for `requested` ("auto" or a name) and, when known, the device the logits live on."""
    if requested != "auto":
        cls = _load(host, requested)
        if not cls.is_available():
            raise BackendError(
                f"backend {requested!r} is installed but cannot run here: {cls.unavailable_reason() or 'unavailable'}"
                f'; choose another with backend = "..." in the chain or --backend'
            )
        if device_type is not None and cls.device_type != device_type:
            raise BackendError(
                f"logits are on device {device_type!r} but the chain asks for backend {requested!r}, which runs on "
                f'{cls.device_type!r}; move the logits with .to({cls.device_type!r}) or set backend = "auto"'
            )
        return cls()
    order = [device_type] if device_type is not None else list(PRECEDENCE)
    reasons = []
    for name in order:
        try:
            cls = host.get("backend", name)
        except UnknownPluginError as exc:
            reasons.append(str(exc))
            continue
        if cls.is_available():
            return cls()
        reasons.append(f"backend {name!r}: {cls.unavailable_reason() or 'unavailable'}")
    where = f"device {device_type!r}" if device_type else "this machine"
    raise BackendError(f"no usable backend for {where}: " + "; ".join(reasons))
