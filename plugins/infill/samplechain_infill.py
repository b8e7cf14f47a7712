"""`infill`: llama.cpp's fill-in-the-middle sampler (src/llama-sampling.cpp `llama_sampler_infill_apply`).

Per row, over the live (finite) candidates sorted by descending logit (ties: by position), in float32 as the C++:
1. p = softmax; p_eog = sum of p over end-of-generation tokens, p_txt = the rest (sequential sums).
2. If 3 * p_eog * n > p_txt (n = live candidates): keep only the EOG tokens, done.
3. Merge tokens whose text is a prefix of another's: for i0, then i1, in sorted order (skipping removed ones), when
   text(i0) is non-empty and a prefix of text(i1), the less probable of the two is removed and its p added to the
   more probable one (ties: into i0). The pass is sequential: every merge changes the p the next ones compare.
4. Drop non-EOG tokens with p < 0.2; if no non-EOG token is left, the row becomes the single EOT token (logit 1).
5. Renormalise; drop non-EOG tokens with p < 1 / (n_non_eog + 1); renormalise.

`output` says what the survivors carry:
- "logits" (default, llama.cpp): their original logits (merged-away tokens are removed). llama.cpp's dist sampler
  recomputes the softmax from the logits, so this is what a llama.cpp chain `infill -> dist` samples from.
- "probs": log of the infill's own final probabilities (merged mass included), for a selector to sample those.

Token texts are what llama.cpp's `token_to_piece(id, special=false)` gives, from the core's string service
(`samplechain.strings`, cached per tokenizer): the raw bytes of the token (byte-level BPE: through the GPT-2 byte
table; SentencePiece: '▁' as a space, <0xNN> as that byte; WordPiece: a leading space unless "##", as llama.cpp's
converter writes it), and an empty text for special tokens, which therefore never merge. `prepare` builds them
from the tokenizer; without it `apply` fails.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import torch

from samplechain import Candidates, Sampler, SamplerSetup, Stage, StepContext, hookimpl, one_of
from samplechain.params import in_range, token_ids_field
from samplechain.strings import byte_table

OUTPUTS = ("logits", "probs")
F32 = np.float32


@attrs.frozen
class InfillParams:
    enabled: bool = attrs.field(default=True)
    eog_ids: tuple[int, ...] = token_ids_field()
    eot_id: int = attrs.field(default=-1, validator=in_range(-1, None, hint="-1 = the first eos id"))
    output: str = attrs.field(default="logits", validator=one_of(*OUTPUTS))


def token_pieces(tokenizer: Any, size: int | None = None) -> list[bytes]:
    """The piece (bytes) of every token id, as llama.cpp's token_to_piece(id, special=false): the core's cached
    byte table (`samplechain.strings`), padded with empty pieces to `size`."""
    pieces = list(byte_table(tokenizer).pieces)
    if size is not None and size > len(pieces):
        pieces.extend([b""] * (size - len(pieces)))
    return pieces


def prefix_successors(pieces: list[bytes]) -> dict[int, np.ndarray]:
    """a -> every b != a whose piece starts with the (non-empty) piece of a."""
    by_text: dict[bytes, list[int]] = {}
    for i, text in enumerate(pieces):
        if text:
            by_text.setdefault(text, []).append(i)
    succ: dict[int, list[int]] = {}
    for b, text in enumerate(pieces):
        for length in range(1, len(text) + 1):
            for a in by_text.get(text[:length], ()):
                if a != b:
                    succ.setdefault(a, []).append(b)
    return {a: np.asarray(bs, dtype=np.int64) for a, bs in succ.items()}


@attrs.define
class InfillRow:
    """Result of the infill on one row: kept positions (into the sorted live candidates) and their final p, or
    the EOT fallback."""

    kept: np.ndarray  # indices into the sorted order
    probs: np.ndarray  # float32 final p of the kept ones
    fallback: bool = False


def infill_row(logits: np.ndarray, ids: np.ndarray, is_eog: np.ndarray, succ: dict[int, np.ndarray]) -> InfillRow:
    """llama_sampler_infill_apply on one row of live candidates already sorted by descending logit (float32)."""
    n = logits.shape[0]
    with np.errstate(over="ignore"):  # logits float32 cannot subtract come out -inf, p = 0, as in C
        p = np.exp(logits - logits[0]).astype(F32)
    p = (p / np.cumsum(p, dtype=F32)[-1]).astype(F32)
    eog = is_eog[ids]
    p_eog = np.cumsum(np.where(eog, p, F32(0)), dtype=F32)[-1]
    p_txt = np.cumsum(np.where(eog, F32(0), p), dtype=F32)[-1]
    if F32(F32(3) * p_eog) * F32(n) > p_txt:
        kept = np.nonzero(eog)[0]
        total = np.cumsum(p[kept], dtype=F32)[-1]
        return InfillRow(kept, (p[kept] / total).astype(F32))

    # merge tokens whose text is a prefix of another's (sequential, as the C++ double loop)
    dead = np.zeros(n, dtype=bool)
    pos_of = {int(t): j for j, t in enumerate(ids)}
    for i0 in range(n):
        partners = succ.get(int(ids[i0]))
        if partners is None:
            continue
        others = sorted(pos_of[b] for b in partners.tolist() if b in pos_of)
        for i1 in others:
            if dead[i0]:
                break
            if dead[i1]:
                continue
            dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
            p[dst] = F32(p[dst] + p[src])
            p[src] = F32(0)
            dead[src] = True

    keep = eog | ~(p < F32(0.2))
    n_non_eog = int((keep & ~eog).sum())
    if n_non_eog == 0:
        return InfillRow(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=F32), fallback=True)
    kept = np.nonzero(keep)[0]
    q = (p[kept] / np.cumsum(p[kept], dtype=F32)[-1]).astype(F32)
    thold = 1.0 / (n_non_eog + 1)  # double in the C++; the float p is promoted for the comparison
    second = eog[kept] | ~(q.astype(np.float64) < thold)
    kept, q = kept[second], q[second]
    q = (q / np.cumsum(q, dtype=F32)[-1]).astype(F32)
    return InfillRow(kept, q)


class Infill(Sampler):
    name = "infill"
    stage = Stage.FILTER
    Params = InfillParams
    request_aliases = {"infill": "enabled"}
    summary = "llama.cpp fill-in-the-middle: end early when EOG is likely, merge prefix tokens, cut the tail"

    _pieces: list[bytes] | None = None

    def prepare(self, setup: SamplerSetup) -> None:
        tok = setup.tokenizer
        if tok is None:
            self._pieces = None
            return
        size = max(len(tok), setup.vocab_size or 0)
        self._pieces = token_pieces(tok, size)
        self._succ = prefix_successors(self._pieces)
        eog = set(setup.eos_token_ids) | set(self.params.eog_ids)
        eos = getattr(tok, "eos_token_id", None)
        if isinstance(eos, int):
            eog.add(eos)
        self._eog = sorted(eog)
        self._eos = tuple(setup.eos_token_ids) or ((eos,) if isinstance(eos, int) else ())

    def _is_eog(self, vocab: int) -> np.ndarray:
        size = max(vocab, len(self._pieces or ()), max(self._eog, default=-1) + 1)
        out = np.zeros(size, dtype=bool)
        out[self._eog] = True
        return out

    def _eot_for(self, eot_id: int) -> int:
        if eot_id >= 0:
            return eot_id
        if self._eos:
            return self._eos[0]
        raise ValueError("infill: no EOT token to end with: set eot_id, or give the tokenizer an eos token")

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        enabled = ctx.param("enabled")
        shared = ctx.scalar("enabled")
        if shared is not None and not shared:
            return cand
        if self._pieces is None:
            raise ValueError(
                "infill needs the vocabulary (each token's text and the end-of-generation ids): call "
                "chain.prepare(tokenizer=...) before sampling (generate() does it for you)"
            )
        is_eog = self._is_eog(cand.vocab_size)
        x = cand.logits
        xs = x.detach().cpu().numpy().astype(F32)
        ids_all = cand.token_ids().cpu().numpy()
        eot_ids = ctx.param("eot_id").tolist()
        probs_out = self.params.output == "probs"
        out = torch.full_like(x, float("-inf")).cpu()
        new_ids: np.ndarray | None = None
        changed = False
        for b in range(x.shape[0]):
            if not bool(enabled[b]):
                out[b] = x[b].cpu()
                continue
            changed = True
            live = np.nonzero(np.isfinite(xs[b]))[0]
            if live.size == 0:
                continue
            if cand.is_sorted:
                order = live
            else:
                order = live[np.argsort(-xs[b, live], kind="stable")]
            row = infill_row(xs[b, order], ids_all[b, order], is_eog, self._succ)
            if row.fallback:
                eot = self._eot_for(int(eot_ids[b]))
                if eot >= cand.vocab_size:
                    raise ValueError(f"infill: eot_id {eot} is outside the vocabulary (size {cand.vocab_size})")
                where = np.nonzero(ids_all[b] == eot)[0]
                if where.size:
                    pos = int(where[0])
                else:  # the EOT token is not among the candidates: it replaces the first one
                    if new_ids is None:
                        new_ids = ids_all.copy()
                    new_ids[b, 0] = eot
                    pos = 0
                out[b, pos] = 0.0 if probs_out else 1.0
                continue
            positions = torch.from_numpy(order[row.kept])
            if probs_out:
                with np.errstate(divide="ignore"):  # a probability that underflowed to 0 is log 0 = -inf, as in C
                    out[b, positions] = torch.from_numpy(np.log(row.probs))
            else:
                out[b, positions] = x[b].cpu()[positions]
        if not changed:
            return cand
        out = out.to(x.device)
        if new_ids is not None:
            ids = torch.from_numpy(new_ids).to(x.device)
            return Candidates(out, ids, cand.vocab_size, False, True)
        return cand.replace_logits(out, is_sorted=False)  # survivors are scattered among removed ones


@hookimpl
def register_samplers(register):
    register(Infill)
