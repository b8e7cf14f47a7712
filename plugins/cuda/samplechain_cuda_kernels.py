"""Triton kernels for the cuda backend, their public functions in one place: the Gumbel-max draw and the fused
top-k -> top-p -> min-p truncation, one program per row, reading the row in blocks, with no (B, V) temporaries and no
host synchronisation. The kernels live in samplechain_cuda_draw (the draw), samplechain_cuda_truncate (the fused
truncation and draw) and samplechain_cuda_passes (its passes and pivot searches), their shared `@triton.jit` helpers
and launch helpers in samplechain_cuda_triton (a leaf); this module only gathers the public names.

Importable without triton (`kernels_unavailable_reason()` then says why the kernels cannot run). The kernels run on
CUDA tensors, or on CPU tensors under triton's interpreter (TRITON_INTERPRET=1 set before this module is imported:
how CI tests them without a GPU).

    gumbel_argmax(logits, seed, position, stream, ids=None)
        rng.gumbel_argmax in one pass: the counter hash of rng (row keys and per-token bits, uint32 arithmetic that
        wraps as rng's int32 path does), u in float64 as rng.uniform, M = log(-log u) - x in float64 and a running
        first argmin. Rows whose largest logit is finite and beyond +-2**24 are drawn again, shifted by it
        (rng.shifted); the first NaN wins, as torch's argmin; an all -inf row gives 0.
    uniform(seed, position, ids, stream)
        rng.uniform's float64 noise, bit for bit (for tests of the hash).
    truncate(logits, temperature=, top_k=, top_p=, min_p=, ..., mask=False)
        per row, the candidates the chain temperature -> top_k -> top_p -> min_p keeps on the cpu backend, found
        by pivot searches over the row (FlashInfer's idea: no sort) and returned as thresholds (`Truncation`),
        optionally as a (B, V) keep mask.
    sample_top_k_top_p_min_p(logits, seed, position, stream, ...)
        truncate + gumbel_argmax over the kept tokens, in one kernel: the token the chain
        temperature -> top_k -> top_p -> min_p -> dist draws on the cpu backend (stream = dist's index in the chain).
    sample(logits, seed, position, stream, ..., temperature_last=None)
        the same, with the chosen tokens' logprobs, and optionally a temperature after the truncation (llama.cpp's
        order top_k -> top_p -> min_p -> temperature -> dist): what the cuda backend's FUSED_SAMPLE kernel runs.

Kept sets, as the plugins define them (every filter settles equal logits at its cut by lowest token id):
  y = x / t in float32 (IEEE division, as torch on the CPU); t = 0 keeps the first maximum only. A temperature
  given as a Python float is the chain's scalar case, where the executor runs top_k before the temperature (top_k
  ranks the raw logits); a tensor is the per-row case (top_k ranks y). The two differ only where x / t rounds two
  different logits at the k-th place to the same value.
  top_k: S = the max(k, min_keep) best (k <= 0 or >= V: off).
  top_p (p >= 1 off): over S, probabilities exp(y - max y) / sum(exp) in float64; the first C_p of S in
  (y desc, id asc) order, C_p = max(#{tokens whose mass strictly above is < p}, min_keep, 1).
  min_p (p <= 0 off): thr = max y + log(p) in float32 (a Python float: float32(math.log(p)), as the chain's scalar
  path; a tensor: torch.log in float32, as its per-row path); keeps the first max(#{y >= thr}, min_keep) of those.
  The result is a prefix of S in (y desc, id asc) order: kept iff in S and (key(y) > cut or key(y) == cut and
  id <= last id), S itself given the same way in the order top_k ranks by.

Exactness (see the tests): the hash and u are bit for bit rng's; the token of gumbel_argmax equals rng's unless two
candidates' M - x lie within an ulp or two (float64 log may round differently on the device, in numpy under the
interpreter, and in torch: never seen; the cuda backend's own noise has the same caveat). top_k and min_p kept sets
are exact (integer counts, one float32 add). top_p's masses are float64 sums in another order than the chain's
torch.sum / cumsum, so a cut can differ where a cumulative mass lies within ~1e-15 of p; rows of V >= 16384 with
top_k off are cut by the chain with a float32 normaliser (top_p's wide path), where the kernel's float64 cut may
differ within ~1e-6 of p.
"""

from __future__ import annotations

from samplechain_cuda_draw import gumbel_argmax, uniform
from samplechain_cuda_triton import HUGE, kernels_unavailable_reason
from samplechain_cuda_truncate import Truncation, sample, sample_top_k_top_p_min_p, truncate

__all__ = [
    "HUGE",
    "Truncation",
    "gumbel_argmax",
    "kernels_unavailable_reason",
    "sample",
    "sample_top_k_top_p_min_p",
    "truncate",
    "uniform",
]
