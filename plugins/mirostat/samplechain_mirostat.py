"""`mirostat`: llama.cpp's `llama_sampler_mirostat` (v1), per request, seeded and batch-invariant.

Per row, over the candidates the chain passes in (earlier filters included; -inf candidates count as removed,
as llama.cpp's filters shrink its array), as llama.cpp, in float64 (llama.cpp: float32; a float32 sum's rounding
would follow the row's width, so the batch), mu stored as float32:
    p      = softmax(logits), in descending order p_0 >= p_1 >= ...
    s_hat  = sum_i t_i b_i / sum_i t_i^2,  t_i = log((i+2)/(i+1)),  b_i = log(p_i / p_{i+1}),
             i < min(m - 1, n - 1)                               (n candidates)
    eps    = s_hat - 1
    k      = ((eps * 2^mu) / (1 - n_vocab^-eps)) ^ (1 / s_hat),  top-k with max(int(k), 1)
    token  ~ softmax(logits of the top k)                        Gumbel-max keyed by (seed, position, token id)
    mu    <- mu - eta * (-log2 p_topk(token) - tau)               mu starts at 2 * tau
Where llama.cpp's int(k) is undefined (k NaN: one candidate or m <= 1; k >= 2^31 or inf) this keeps 1 candidate
for NaN (what x86 builds do) and every candidate for an overflow (the intent; x86 builds keep 1). Ties at the
k-th logit keep the lowest token ids. The mu update is committed when the chain accepts the step (see
mirostat_v2); tokens accepted without a select() of the same step leave mu unchanged. A token other than the draw
accepted for the step select() saw (teacher forcing: chain.sample(accept=token_ids)) moves mu by its own surprise
under the top k, as though select() had drawn it; one outside the top k (surprise inf) leaves mu unchanged.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, StepContext, finite, hookimpl, in_range, seed_field
from samplechain.filters import SurpriseSteering

_INT_LIMIT = 2.0**31


@attrs.frozen
class MirostatParams:
    tau: float = attrs.field(default=5.0, validator=[finite, in_range(0.0, None, hint="target surprise in bits")])
    eta: float = attrs.field(default=0.1, validator=[finite, in_range(0.0, None, hint="learning rate of mu")])
    m: int = attrs.field(default=100, validator=in_range(1, None, hint="tokens used to estimate s_hat"))
    seed: int | None = seed_field()


def keep_top(logits: torch.Tensor, k: torch.Tensor, backend, ids: torch.Tensor | None = None) -> torch.Tensor:
    """(B, K) bool: the k[b] largest logits of each row (1 <= k[b] <= finite count); of logits tied at the k-th
    place the lowest token ids (ids None: positions). Decided by the k-th value and the ids, so a row's set
    depends neither on the other rows' k nor on the order earlier filters left the candidates in."""
    values, _ = backend.topk(logits, int(k.max()))
    kth = values.gather(1, (k - 1)[:, None])
    above = logits > kth
    tied = logits == kth
    room = k - above.sum(dim=-1)
    if ids is None:
        return above | (tied & (tied.cumsum(dim=-1) <= room[:, None]))
    order = torch.where(tied, ids, torch.iinfo(torch.int64).max).argsort(dim=-1)  # tied ones first, by id
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(order.shape[1], device=order.device).expand_as(order)
    )
    return above | (tied & (rank < room[:, None]))


def mirostat_k(logits: torch.Tensor, mu: torch.Tensor, m: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(B,) int64 llama.cpp's k for each row, clamped to [1, number of finite candidates]. Computed in float64:
    float32 sums would round differently with the row's width (which follows the batch after a truncation), and
    k, truncated to an integer, would then depend on the batch at its edges."""
    n = torch.isfinite(logits).sum(dim=-1)
    width = min(int(m.max()), logits.shape[1])
    probs = torch.softmax(logits.double(), dim=-1).topk(width, dim=-1).values  # descending
    i = torch.arange(width - 1, device=logits.device)
    t = torch.log((i + 2).double() / (i + 1).double())
    b = torch.log(probs[:, :-1] / probs[:, 1:])
    use = i[None, :] < torch.minimum(m - 1, n - 1)[:, None]
    zero = torch.zeros((), dtype=torch.float64, device=logits.device)
    s_hat = torch.where(use, t * b, zero).sum(dim=-1) / torch.where(use, t * t, zero).sum(dim=-1)
    eps = s_hat - 1
    vocab = torch.full_like(eps, float(vocab_size))
    k = torch.pow((eps * torch.pow(2.0, mu.double())) / (1 - torch.pow(vocab, -eps)), 1 / s_hat)
    whole = torch.where(k < _INT_LIMIT, k, torch.zeros_like(k)).long()  # int(k): truncation toward zero
    k_int = torch.where(torch.isnan(k), 1, torch.where(k >= _INT_LIMIT, n, whole))
    return torch.minimum(k_int.clamp(min=1), n.clamp(min=1))


class Mirostat(SurpriseSteering):
    name = "mirostat"
    Params = MirostatParams
    request_aliases = {"mirostat_tau": "tau", "mirostat_eta": "eta", "mirostat_m": "m", "seed": "seed"}
    summary = "llama.cpp's mirostat (v1): Zipf estimate, top-k from mu, sample, steer mu toward tau"

    def kept(self, cand: Candidates, ctx: StepContext, mu: torch.Tensor) -> torch.Tensor:
        k = mirostat_k(cand.logits, mu, ctx.param("m"), cand.vocab_size)
        return keep_top(cand.logits, k, ctx.backend, cand.ids)


@hookimpl
def register_samplers(register):
    register(Mirostat)
