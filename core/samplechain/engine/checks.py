"""What a step is given, checked, and why a failing step failed.

The executor (`engine.chain`) checks its inputs here before it touches the request store: the logits (shape,
dtype, device, NaN / +inf under nonfinite = "sanitize"), the token history of history-reading samplers and the
unconditional logits of guidance. `bad_rows` is the slow path of a step whose chosen logprob is not finite: it
names each request and what made its row so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..candidates import Candidates
from ..errors import SamplingError

__all__ = [
    "bad_rows",
    "check_given_tokens",
    "check_history",
    "check_logits",
    "check_unconditional",
    "nonfinite_at",
    "sanitized",
]

FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INF = float("inf")


def check_logits(logits: Any, sanitize: bool) -> tuple[torch.Tensor, bool]:
    """(float32 contiguous logits, whether the chain owns them); with the chain's nonfinite = "sanitize" also
    cleaned (`sanitized`)."""
    if not isinstance(logits, torch.Tensor):
        fix = (
            "; convert with torch.as_tensor(logits)"
            if hasattr(logits, "__array__") or isinstance(logits, (list, tuple))
            else ""
        )
        raise SamplingError(f"logits must be a torch.Tensor of shape (batch, vocab), got {type(logits).__name__}{fix}")
    if logits.ndim != 2:
        hint = {
            1: "; add a batch dimension with logits[None]",
            3: "; a model's output (batch, seq, vocab) holds every position: pass the last, logits[:, -1, :]",
        }
        raise SamplingError(
            f"logits must have shape (batch, vocab), got {tuple(logits.shape)}{hint.get(logits.ndim, '')}"
        )
    if logits.dtype not in FLOATS:
        raise SamplingError(
            f"logits dtype {logits.dtype} is not supported: pass the model's floating-point logits "
            "(float32, float16, bfloat16 or float64)"
        )
    if logits.shape[1] == 0:
        raise SamplingError(
            f"logits have an empty vocabulary axis (shape {tuple(logits.shape)}): pass one score per vocabulary token"
        )
    if logits.device.type == "meta":
        raise SamplingError(
            "logits are on the meta device (a shape without values): run the model on a real "
            "device (cpu, cuda, ...) and pass its logits"
        )
    if logits.requires_grad:  # a model run outside torch.no_grad(): sampling is not differentiable anyway
        logits = logits.detach()
    writable = False
    if logits.dtype != torch.float32 or not logits.is_contiguous():
        logits, writable = logits.to(torch.float32, memory_format=torch.contiguous_format).contiguous(), True
    if sanitize:
        return sanitized(logits, writable)
    return logits, writable


def sanitized(x: torch.Tensor, writable: bool) -> tuple[torch.Tensor, bool]:
    """nonfinite = "sanitize", transformers' InfNanRemoveLogitsProcessor in effect: NaN -> 0; a row holding +inf keeps
    only its +inf tokens, at 0 each (transformers writes finfo.max there, so its softmax is the same uniform
    distribution over them; 0 cannot overflow in a later temperature or bias); -inf stays -inf, masked (transformers'
    finfo.min differs only in a row that is all -inf: here that row is still the every-token-masked error).
    x is only written when the chain owns it (writable)."""
    total = float(x.sum())  # one reduction: a NaN or +inf anywhere makes the sum NaN or +inf (+inf plus -inf is NaN)
    if not (math.isnan(total) or total == _INF):  # a finite overflow to +inf only costs the exact look below
        return x, writable
    nan, posinf = x.isnan(), x == _INF
    if not bool(nan.any()) and not bool(posinf.any()):
        return x, writable
    out = x if writable else x.clone()
    out.masked_fill_(nan, 0.0)
    rows = posinf.any(dim=1, keepdim=True)  # (B, 1)
    out.masked_fill_(rows & ~posinf, -_INF).masked_fill_(posinf, 0.0)
    return out, True


def check_history(
    history: torch.Tensor | None, prompt_lengths: torch.Tensor | None, positions: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Check the token history a chain with history-reading samplers needs; default prompt lengths."""
    batch = logits.shape[0]
    if history is None:
        if prompt_lengths is not None:
            raise SamplingError("prompt_lengths were given without history: pass history= (B, L) token ids too")
        return None
    if not (isinstance(history, torch.Tensor) and history.ndim == 2 and history.dtype in (torch.int64, torch.int32)):
        got = f"{history.dtype} {tuple(history.shape)}" if isinstance(history, torch.Tensor) else type(history)
        raise SamplingError(
            f"history must be a (B={batch}, L) int64 or int32 tensor of token ids (left padding as -1), got {got}"
        )
    if history.shape[0] != batch:
        raise SamplingError(
            f"history has {history.shape[0]} rows but the logits have {batch}: pass one row of "
            "token ids per logits row, in the same order"
        )
    history = history.to(device=logits.device, dtype=torch.int64)
    if prompt_lengths is None:
        known = (history >= 0).sum(dim=1)
        prompt_lengths = (known - positions.to(known.device)).clamp(min=0)
    else:
        lengths = prompt_lengths if isinstance(prompt_lengths, torch.Tensor) else torch.as_tensor(prompt_lengths)
        if lengths.shape != (batch,) or lengths.dtype.is_floating_point or lengths.dtype.is_complex:
            raise SamplingError(
                f"prompt_lengths must be a (B={batch},) integer tensor (each row's prompt length), "
                f"got {lengths.dtype} {tuple(lengths.shape)}"
            )
        prompt_lengths = lengths
    return history, prompt_lengths.to(device=logits.device, dtype=torch.int64)


def check_unconditional(
    uncond: torch.Tensor | None, logits: torch.Tensor, needed_by: list[str], sanitize: bool
) -> torch.Tensor | None:
    """Check the unconditional logits a guidance sampler (cfg) needs: the same shape as the logits. needed_by: the
    chain's samplers that need them (an error when they are missing)."""
    if uncond is None:
        if needed_by:
            names = needed_by
            verb = "needs" if len(names) == 1 else "need"
            raise SamplingError(
                f"{', '.join(names)} {verb} the unconditional logits of a second forward (the negative prompt): "
                "pass unconditional_logits= (B, V) to chain.sample; samplechain.generation.generate runs that "
                "forward for you"
            )
        return None
    if not isinstance(uncond, torch.Tensor) or tuple(uncond.shape) != tuple(logits.shape):
        got = tuple(uncond.shape) if isinstance(uncond, torch.Tensor) else type(uncond).__name__
        raise SamplingError(
            f"unconditional_logits must have the logits' shape {tuple(logits.shape)} (one row per "
            f"logits row, the same vocabulary), got {got}"
        )
    if uncond.dtype not in FLOATS:
        raise SamplingError(
            f"unconditional_logits dtype {uncond.dtype} is not supported: pass the second "
            "forward's floating-point logits"
        )
    uncond = uncond.detach().to(device=logits.device, dtype=torch.float32)
    return sanitized(uncond, False)[0] if sanitize else uncond


def check_given_tokens(tokens: Any, logits: torch.Tensor) -> torch.Tensor:
    """The tokens of sample(accept=token_ids) (teacher forcing): a (B,) integer tensor of ids within the logits'
    vocabulary, as int64 on their device (the range check reads them on the host)."""
    batch, vocab = logits.shape
    if not (
        isinstance(tokens, torch.Tensor) and tokens.shape == (batch,) and tokens.dtype in (torch.int64, torch.int32)
    ):
        got = f"{tokens.dtype} {tuple(tokens.shape)}" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise SamplingError(f"accept= token ids must be a (B={batch},) int64 or int32 tensor, one per row, got {got}")
    tokens = tokens.to(device=logits.device, dtype=torch.int64)
    if batch and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise SamplingError(
            f"accept= token ids {tokens.tolist()} are not all in the vocabulary [0, {vocab}): pass ids of tokens "
            "the logits have a column for"
        )
    return tokens


def bad_rows(
    bad: torch.Tensor,
    request_ids: Sequence[str],
    given: torch.Tensor,
    uncond: Any,
    stages: Callable[[], Iterator[Candidates]],
    *,
    sanitize: bool,
    describe: Callable[[int], str],
    selector: int,
) -> SamplingError:
    """The error of a step whose chosen logprob is not finite (the slow path: only a failing step gets here).
    Each bad row is blamed on what made it so: NaN / +inf in the logits as given, then in the unconditional
    logits (neither under "sanitize": those were replaced); else a row given with every token masked; else the
    first sampler after which the row had no finite candidate left, or held NaN / +inf (the chain is run again
    stage by stage, in the declared order, to find it); else the selector."""
    rows = bad.nonzero().flatten().tolist()
    parts = []
    sources = () if sanitize else (("logits", given), ("unconditional_logits", uncond))
    for label, tensor in sources:
        found = {r: what for r in rows if isinstance(tensor, torch.Tensor) and (what := nonfinite_at(tensor[r]))}
        if not found:
            continue
        details = "; ".join(f"{request_ids[r]!r}: {what}" for r, what in list(found.items())[:8])
        parts.append(
            f"{label} contain NaN or +inf for request(s) {[request_ids[r] for r in found]} ({details}): "
            f"check the model's output (a float16 overflow, bad weights), or set nonfinite = "
            f'"sanitize" in the chain to replace them as transformers\' remove_invalid_values does'
        )
        rows = [r for r in rows if r not in found]
    blame: dict[tuple[int, str], list[str]] = {}  # (stage, what) -> requests; stage -1: the logits as given
    pending = set(rows)
    for i, cand in enumerate(stages(), start=-1):
        if not pending:
            break
        x = cand.logits[sorted(pending)]
        nonfinite = (x.isnan() | (x == _INF)).any(dim=1).tolist()
        empty = (~(x > -_INF)).all(dim=1).tolist()
        for r, hot, dead in zip(sorted(pending), nonfinite, empty):
            if hot or dead:
                blame.setdefault((i, "nonfinite" if hot else "masked"), []).append(request_ids[r])
                pending.discard(r)
    if pending:  # every stage left the row something: the selector chose what it cannot score
        blame[(selector, "selector")] = [request_ids[r] for r in sorted(pending)]
    for (i, what), names in sorted(blame.items()):
        by = "in the logits as given" if i < 0 else f"after {describe(i)}"
        if what == "masked":
            parts.append(
                f"every token is masked (-inf) for request(s) {names} {by}: relax the chain's filters "
                f"or bias for those rows"
            )
        elif what == "nonfinite":
            parts.append(
                f"the chain turned finite logits into NaN or +inf for request(s) {names} {by}: it "
                f"overflowed float32 (a temperature near 0, a huge bias?); chain.process() shows the "
                f"scores after the transforms and filters"
            )
        else:
            parts.append(
                f"{describe(i)} chose a token without a finite logprob for request(s) {names}: "
                f"report it to the plugin named"
            )
    return SamplingError("; ".join(parts) + "; no request state was changed")


def nonfinite_at(row: torch.Tensor) -> str:
    """ "2 NaN (first at token 5), +inf at token 3" for one row of logits; "" when it has neither."""
    out = []
    for name, hit in (("NaN", row.isnan()), ("+inf", row == _INF)):
        where = hit.nonzero().flatten().tolist()
        if len(where) == 1:
            out.append(f"{name} at token {where[0]}")
        elif where:
            out.append(f"{len(where)} {name} (first at token {where[0]})")
    return ", ".join(out)
