"""The cpu backend's compiled tails led by a top-k: `top_k -> [top_p | min_p | temperature]* -> dist | greedy` in one
compiled call per step (FUSED_SAMPLE), and `greedy` alone on the whole vocabulary (its argmax and the executor's
normaliser in one call).

Run sampler by sampler, such a tail is some forty torch calls on a few dozen candidates after the top-k: on one
row of an LLM's vocabulary (llama.cpp's default chain, B = 1) their fixed costs make up most of the step. Here each
row takes one pass over its logits (the k best by (logit, lowest id) through a min-heap, as
samplechain_cpu_rank.ranked_topk), then the parts in chain order on those k sorted candidates, each as its plugin
computes it on sorted candidates:
  top_p        the float64 mass over the current candidates around the top one, the cumulative sum in order, a
               candidate kept while the mass above it is < p; at least min_keep, at least 1;
  min_p        keep logit >= top + log p (float32, log p rounded to float32 as the plugin adds it); min_keep;
  temperature  x / t in float32 (t > 0);
and after each cut, equal logits at the cut keep their lowest ids (Candidates.keep_first_settled). Then the
selector: dist's Gumbel-max draw over the survivors with the counter-based noise of their ids (the noise and the
first-least rule of samplechain_cpu_draw), or greedy's largest logit of lowest id; and the chosen token's logprob
under the survivors, float32(logit - lse) with lse their float64 log-sum-exp rounded to float32, as the executor's.

The same tokens as the samplers' unless a cut or a draw falls within an ulp of its boundary: the float64 sums here
run in candidate order where torch's reductions pick their own order, and the logs and exponentials are libm's
(test_cpu_tail.py compares tokens and logprobs on many rows, seeds and ties). Rows holding a NaN or +inf, with
fewer finite logits than their top-k keeps, or with t <= 0 decline: the samplers run (and report)."""

from __future__ import annotations

import attrs
import numba
import numpy as np
import torch

from samplechain import FusedPart
from samplechain_cpu_draw import _log_p, lse64
from samplechain_cpu_jit import HUGE, jit, largest, noise, per_row, row_keys, salt, threads, token_bits
from samplechain_cpu_rank import _rank_key, drain, offer

__all__ = ["PART_KINDS", "greedy", "ranked_tail", "TailPlan"]

TOP_P, MIN_P, TEMPERATURE = 1, 2, 3  # the part codes of ranked_tail
PART_KINDS = {"top_p": TOP_P, "min_p": MIN_P, "temperature": TEMPERATURE}  # FusedPart kinds after the top_k


def _entries(logits: torch.Tensor) -> int:
    """What samplechain_cpu_jit.threads sizes numba's threads by: these kernels share rows out, so one row runs on
    the calling thread alone (a second thread would only be woken and waited for)."""
    return logits.numel() if logits.shape[0] > 1 else 1


_RUN = 64  # entries whose maximum the first pass keeps: the heap's pass skips a run below its smallest


@jit(inline="always")
def _run_maxima(xr, maxima):
    """maxima[r] = the largest of run r of the row (NaN passed over), and how many entries are NaN: one vectorised
    pass."""
    n = xr.shape[0]
    nan = 0
    for r in range(maxima.shape[0]):
        top = np.float32(-np.inf)
        for j in range(r * _RUN, min(r * _RUN + _RUN, n)):
            v = xr[j]
            top = v if v > top else top
            nan += v != v
        maxima[r] = top
    return nan


@jit(inline="always")
def _floor(maxima, xr, k):
    """The least of the maxima of k disjoint groups of runs (of entries where the row has fewer than k runs): each
    group's maximum is an entry, so at least k entries are >= it and no entry below it is among the k best."""
    if maxima.shape[0] >= k:
        m, n = maxima, maxima.shape[0]
    else:
        m, n = xr, xr.shape[0]
    size = n // k
    low = np.float32(np.inf)
    for g in range(k):
        top = np.float32(-np.inf)
        for j in range(g * size, n if g == k - 1 else g * size + size):
            v = m[j]
            top = v if v > top else top
        low = top if top < low else low
    return low


@jit(inline="always")
def _top(xr, k, vals, ids):
    """The k best of a row by (logit, lowest id) into vals[:k], ids[:k], in that order, through a min-heap of k
    ranked keys (samplechain_cpu_rank._ranked_topk's) that only runs reaching its smallest logit enter; False
    where the row holds a NaN (the caller declines)."""
    maxima = np.empty((xr.shape[0] + _RUN - 1) // _RUN, dtype=xr.dtype)
    if _run_maxima(xr, maxima):
        return False
    low = _floor(maxima, xr, k)
    heap = np.empty(k, dtype=np.int64)
    where = np.empty(k, dtype=np.int64)
    n = 0
    for r in range(maxima.shape[0]):
        if maxima[r] < low:
            continue
        for j in range(r * _RUN, min(r * _RUN + _RUN, xr.shape[0])):
            v = xr[j]
            if v < low:
                continue
            n, low = offer(xr, heap, where, n, j, _rank_key(v, j), low)
    drain(heap, where)
    for i in range(k):
        ids[i] = where[i]
        vals[i] = xr[where[i]]
    return True


@jit(inline="always")
def _settled(vals, ids, n, count):
    """Keep the first `count` of n sorted candidates (1 <= count <= n): where the cut splits a run of equal logits,
    the run's ids go in ascending order first (Candidates.keep_first_settled), so the lowest ids stay."""
    if count < n and vals[count - 1] == vals[count]:
        cut = vals[count - 1]
        s = count - 1
        while s > 0 and vals[s - 1] == cut:
            s -= 1
        e = count
        while e < n and vals[e] == cut:
            e += 1
        ids[s:e] = np.sort(ids[s:e])
    return count


@jit(inline="always")
def _top_p(vals, ids, n, p, least):
    """top_p on the n sorted candidates: how many it keeps (kept_counts' rule, its float64 mass), the cut settled."""
    if p >= 1.0:
        return n
    top = np.float64(vals[0])
    total = 0.0
    for j in range(n):
        total += np.exp(np.float64(vals[j]) - top)
    above = 0.0
    count = 0
    for j in range(n):
        if not above < p:  # `above` never decreases: the kept candidates are a prefix
            break
        count += 1
        above += np.exp(np.float64(vals[j]) - top) / total
    return _settled(vals, ids, n, min(max(count, least, 1), n))


@jit(inline="always")
def _min_p(vals, ids, n, logp, least):
    """min_p on the n sorted candidates: logit >= float32(top + log p); logp -inf (p <= 0) keeps them all."""
    if logp == -np.inf:
        return n
    edge = np.float32(np.float64(vals[0]) + logp)
    count = 0
    for j in range(n):
        count += vals[j] >= edge
    return _settled(vals, ids, n, min(max(count, least), n))


@jit(inline="always")
def _pick(vals, ids, n, greedy, k1, k2):
    """The selector's choice among the n candidates: greedy's largest logit of lowest id, or the first least
    noise - x (x less its maximum where that lies beyond +-2**24, as rng.shifted)."""
    if greedy:
        best = 0
        for j in range(1, n):
            if vals[j] > vals[best] or (vals[j] == vals[best] and ids[j] < ids[best]):
                best = j
        return best
    top = np.float64(vals[0])
    shift = top if abs(top) > HUGE and abs(top) < np.inf else 0.0
    best, best_v = 0, np.inf
    for j in range(n):
        val = noise(token_bits(ids[j], k1, k2)) - (np.float64(vals[j]) - shift)
        if val < best_v:
            best, best_v = j, val
    return best


@jit(inline="always")
def _logprob(vals, n, pick):
    """float32(vals[pick] - lse), lse the float64 log-sum-exp of vals[:n] around their largest (vals[0]: the
    candidates stay sorted), rounded to float32."""
    top = np.float64(vals[0])
    total = 0.0
    for j in range(n):
        total += np.exp(np.float64(vals[j]) - top)
    return vals[pick] - np.float32(top + np.log(total))


@jit(parallel=True, nogil=True)
def _ranked_tail(x, k, codes, args, least, greedy, seed, position, salt, tokens, logprobs):
    """Per row b: its k[b] best, the parts codes[i] (args[i, b], least[i, b]) in order, the selector: tokens[b] and
    logprobs[b]. Returns how many rows decline."""
    batch = x.shape[0]
    k1 = np.empty(batch, dtype=np.uint32)
    k2 = np.empty(batch, dtype=np.uint32)
    row_keys(seed, position, salt, k1, k2)
    declined = 0
    for row in numba.prange(batch):
        kk = k[row]
        vals = np.empty(kk, dtype=x.dtype)
        ids = np.empty(kk, dtype=np.int64)
        if not (_top(x[row], kk, vals, ids) and np.isfinite(vals[kk - 1])):
            declined += 1
            continue
        n = kk
        for i in range(codes.shape[0]):
            if codes[i] == TOP_P:
                n = _top_p(vals, ids, n, args[i, row], least[i, row])
            elif codes[i] == MIN_P:
                n = _min_p(vals, ids, n, args[i, row], least[i, row])
            else:
                t = np.float32(args[i, row])
                for j in range(n):
                    vals[j] = vals[j] / t
        pick = _pick(vals, ids, n, greedy, k1[row], k2[row])
        tokens[row] = ids[pick]
        logprobs[row] = _logprob(vals, n, pick)
    return declined


@attrs.frozen
class TailPlan:
    """A tail's arrays for _ranked_tail, formed once per batch: each row's k, the part codes, their values (B per
    part: top_p's p, min_p's log p as the plugin adds it, the temperature rounded to float32) and min_keeps, the
    selector and dist's seeds."""

    k: np.ndarray
    codes: np.ndarray
    args: np.ndarray
    least: np.ndarray
    greedy: bool
    seeds: np.ndarray

    @classmethod
    def build(
        cls,
        batch: int,
        k: torch.Tensor | int,
        parts: list[FusedPart],
        greedy: bool,
        seed: torch.Tensor | None,
    ) -> TailPlan | None:
        """k: each row's count, max(k, min_keep) clipped to V, between 1 and V - 1. parts: the FusedParts after the
        top_k (kinds in PART_KINDS), in chain order, each value a number or (B,). seed: dist's
        (B,) seeds (None with greedy). None where a row has t <= 0."""
        codes = np.array([PART_KINDS[part.kind] for part in parts], dtype=np.int64)
        args = np.empty((len(parts), batch))
        least = np.zeros((len(parts), batch), dtype=np.int64)
        for i, (code, part) in enumerate(zip(codes, parts)):
            value, keep = part.value, part.min_keep
            if code == TEMPERATURE:  # x / t divides by t rounded to float32, as torch's float32 division
                t = per_row(value, batch, np.dtype(np.float32))
                if not (t > 0).all():
                    return None
                args[i] = t
            else:
                args[i] = _log_p(value, batch) if code == MIN_P else per_row(value, batch, np.dtype(np.float64))
                least[i] = per_row(keep, batch, np.dtype(np.int64))
        seeds = np.zeros(batch, dtype=np.int64) if seed is None else per_row(seed, batch, np.dtype(np.int64))
        return cls(per_row(k, batch, np.dtype(np.int64)), codes, args, least, greedy, seeds)


def ranked_tail(
    logits: torch.Tensor, plan: TailPlan, position: torch.Tensor, stream: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(tokens (B,) int64, logprobs (B,) float32) of `top_k -> parts -> dist | greedy` (the plan's) over logits
    (B, V) float32 on the CPU. None where a row declines (see the module's text) or in a forked child."""
    if not threads(_entries(logits)):
        return None
    batch = logits.shape[0]
    tokens = np.empty(batch, dtype=np.int64)
    logprobs = np.empty(batch, dtype=np.float32)
    declined = _ranked_tail(
        logits.detach().contiguous().numpy(),
        plan.k,
        plan.codes,
        plan.args,
        plan.least,
        plan.greedy,
        plan.seeds,
        per_row(position, batch, np.dtype(np.int64)),
        salt(stream),
        tokens,
        logprobs,
    )
    return None if declined else (torch.from_numpy(tokens), torch.from_numpy(logprobs))


@jit(parallel=True, nogil=True)
def _greedy(x, tokens, logprobs):
    """tokens[b] = the first position of row b's largest entry, logprobs[b] = its logit - the row's float64
    log-sum-exp rounded to float32 (samplechain_cpu_draw.lse64, ROW_LSE's), in float32 as the executor subtracts.
    Returns how many rows hold a NaN (there the search may not end: a NaN maximum equals no entry)."""
    declined = 0
    for row in numba.prange(x.shape[0]):
        xr = x[row]
        nan = 0
        for j in range(xr.shape[0]):  # vectorised
            nan += xr[j] != xr[j]
        if nan:
            declined += 1
            continue
        top = largest(xr, xr.shape[0])
        best = 0
        while xr[best] != top:
            best += 1
        tokens[row] = best
        logprobs[row] = xr[best] - np.float32(lse64(xr))
    return declined


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(tokens (B,) int64, logprobs (B,) float32): torch.argmax of rows without NaN (the first maximum: the lowest
    id) and the logprob the executor gives it with ROW_LSE's normaliser, bit for bit, in one compiled call. Rows up
    to LSE64_WIDTH (where the executor's normaliser is ROW_LSE's); None where a row holds a NaN or in a forked
    child."""
    if not threads(_entries(logits)):
        return None
    batch = logits.shape[0]
    tokens = np.empty(batch, dtype=np.int64)
    logprobs = np.empty(batch, dtype=np.float32)
    declined = _greedy(logits.detach().contiguous().numpy(), tokens, logprobs)
    return None if declined else (torch.from_numpy(tokens), torch.from_numpy(logprobs))
