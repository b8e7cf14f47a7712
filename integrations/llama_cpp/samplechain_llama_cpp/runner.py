"""samplechain's model-runner contract on llama.cpp (`LlamaCppRunner`, the `llama_cpp` runner).

What is batched: every call is one `llama_decode` for the whole batch (split where it exceeds the context's
n_batch, 512 tokens, and, with a float KV cache, where a row takes 64 tokens or more after its prompt:
`_feed`). Each row is a llama.cpp sequence of its own with a KV cache stream of its own; a row feeds only its real
tokens, at positions 0..n-1 of its sequence, so left padding costs nothing. `prefill` decodes every prompt's tokens
together and keeps the logits of each row's last one; `step` one token per row; `extend` K tokens per row with the
logits after each; `truncate` cuts each row on its own (`llama_memory_seq_rm`).

How llama.cpp runs a decode of several streams: in passes (ubatches) of consecutive sequence ids, each pass as many
tokens of every sequence in it (llama_batch_allocr::split_equal), and each pass reads the weights once. So a decode
of rows 0, 2, 4 and 6 costs three passes more than one of rows 0-3 (on two cores, about as much as all eight rows),
and rows that feed different numbers of tokens take a pass per level. The runner keeps the rows still going on
consecutive sequences: once rows have finished (`release`, or left out of `step`), the rows past the gap move into
the finished rows' sequences (their cache copied cell for cell, so their logits do not change), and each decode lists
its tokens in sequence order.

What is not: `reorder` (beam search) copies each moved row's cache through host memory, row by row; llama.cpp's
sampler (the chain samples from the logits); its prompt cache across generations (each generation starts from a
cleared context). On the CPU builds measured, with flash attention, a row's logits in a batch equal its logits
alone bit for bit where its prompt has fewer than 64 tokens (tests/test_runner_batch.py checks it within a stated
tolerance): llama.cpp gives each sequence of a pass as many tokens, and with a float KV cache attends 64 or more
of them through another kernel than fewer, so which kernel a longer prompt's tokens take follows the batch;
alone, a prompt gives llama-cpp-python's own logits bit for bit.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from samplechain.errors import ConfigError, SamplechainError
from samplechain.runners import ModelRunner

from .model import LlamaCppModel, _llama_cpp, load_gguf

__all__ = ["LlamaCppRunner"]

# llama.cpp (0.3.36's CPU backend) splits a one-token decode's flash attention over its threads once the sequence's
# padded cache reaches 512 cells, that is past 256 tokens; a decode of several tokens never splits it
_SPLIT_PAST = 256
# ... and with a float KV cache runs 64 or more queries of one sequence in one pass through its tiled kernel
# (GGML_FA_TILE_Q), which sums otherwise than the kernel of fewer (logits up to about 1.4 apart). The runner decodes
# a check, a scoring pass or a resume's tokens that give a sequence 64 or more in passes of at most _TILED_FROM - 1,
# which give the logits of one-token steps bit for bit. A prompt runs in llama.cpp's own passes, as llama-cpp-python
# runs it (its logits bit for bit)
_TILED_FROM = 64


class LlamaCppRunner(ModelRunner):
    """Prefill then one token per row per step (or several, `extend`) on a `LlamaCppModel`, each row its own
    llama.cpp sequence. Logits are float32 on the CPU, one copy out of llama.cpp's buffer per call."""

    name = "llama_cpp"
    per_row_truncate = True
    file_suffixes = (".gguf",)
    sampling_threads = 1  # llama.cpp's own thread pool has the cores
    skips_inactive = True  # each row is a sequence of its own: a finished row is simply not decoded

    @classmethod
    def accepts(cls, model: Any) -> bool:
        return isinstance(model, LlamaCppModel)

    @classmethod
    def load(cls, path: Any, **kwargs: Any) -> tuple[Any, Any]:
        """(LlamaCppModel, tokenizer) of a GGUF file: `load_gguf`."""
        return load_gguf(path, **kwargs)

    def __init__(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        super().__init__(model, input_ids, attention_mask)
        ids = input_ids.detach().cpu().numpy()
        mask = np.ones(ids.shape, dtype=bool) if attention_mask is None else attention_mask.cpu().numpy() != 0
        self.batch, width = ids.shape
        self.pad = width - mask.sum(axis=1)  # left padding of each row: column c is position c - pad
        self.n = np.zeros(self.batch, dtype=np.int64)  # positions each row's sequence holds
        self.rows = np.arange(self.batch, dtype=np.int32)
        self.seq = np.arange(self.batch, dtype=np.int32)  # each row's llama.cpp sequence (and KV cache stream)
        self.gone = np.zeros(self.batch, dtype=bool)  # rows that will not be fed again (released, or left out of step)
        self.ctx = model.context(self.batch, owner=self)
        self.vocab = self.ctx.n_vocab

    def _decode(self, rows: np.ndarray, pos: np.ndarray, tokens: np.ndarray, want: np.ndarray) -> torch.Tensor:
        """llama_decode in chunks of n_batch tokens, the tokens in the order of their rows' sequences (one pass for
        rows on consecutive sequences); (count of `want`, V) float32, the logits of the wanted tokens in the order
        given."""
        # numpy copies out of llama.cpp's buffer on this thread; torch's copy would wake its own thread pool, which
        # competes with llama.cpp's threads for the cores (milliseconds a step on two cores)
        out = np.empty((int(np.count_nonzero(want)), self.vocab), dtype=np.float32)
        seq = self.seq[rows]
        order = np.argsort(seq, kind="stable")  # a row's tokens keep their order
        into = (np.cumsum(want) - 1)[order][want[order]]  # where each wanted logit goes, in decode order
        seq, pos, tokens, want = seq[order], pos[order], tokens[order], want[order]
        done, step = 0, self.ctx.n_batch
        for start in range(0, len(tokens), step):
            part = slice(start, start + step)
            view = self.ctx.decode(seq[part], pos[part], tokens[part], want[part])
            out[into[done : done + len(view)]] = view
            done += len(view)
        return torch.from_numpy(out)

    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        ids = self.input_ids.detach().cpu().numpy()
        width = ids.shape[1]
        row, col = np.nonzero(np.arange(width)[None, :] >= self.pad[:, None])  # row-major: each row's tokens in order
        self.n = width - self.pad
        return self._decode(row.astype(np.int32), col - self.pad[row], ids[row, col], col == width - 1)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: (B, L+1) every token so far; each row's sequence takes the last column at its next position.
        With `active` (B,) bool, only those rows' sequences do (the others have finished: released). A released
        row's logits are zeros."""
        if active is not None:
            self.release(np.flatnonzero(~active.cpu().numpy()).tolist())
        return self.extend(input_ids[:, -1:])[:, 0]

    def _several_tokens(self, longest: int) -> None:
        """Before a decode of several tokens a row, up to a sequence of `longest` tokens: a warning, once a model,
        where it computes other logits than one-token decodes would, which drafts and scoring rely on."""
        ctx, name = self.ctx, self.model.config.name_or_path
        if not ctx.flash_attn:
            why = "no-flash"
            text = (
                f"llama.cpp runs {name!r} without flash attention: a decode of several tokens (a check of drafted "
                "tokens, scoring) gives logits up to about 1.3 away from one-token decodes, so drafts can change "
                "the tokens; load with flash_attn=True (load_gguf's default)"
            )
        elif ctx.n_threads > 1 and ctx.float_kv and longest > _SPLIT_PAST:
            why = "split"
            text = (
                f"llama.cpp decodes {name!r} on {ctx.n_threads} threads with a float KV cache: past {_SPLIT_PAST} "
                "tokens of a sequence a one-token decode splits its attention over the threads and a decode of "
                "several tokens (a check of drafted tokens, scoring) does not, so from there drafts can change the "
                "tokens (logits up to about 1 apart); for the exact tokens load with "
                "type_k=type_v=llama_cpp.GGML_TYPE_Q8_0 or n_threads=1"
            )
        else:
            return
        self.warn_numerics(why, text, stacklevel=4)  # past extend and torch.no_grad: the caller of extend

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, K) appended to every row in one decode (`_feed`); the logits after each, (B, K, V), a
        released row's zeros."""
        k = tokens.shape[1]
        if k > 1:
            self._several_tokens(int(self.n.max()) + k)
        flat = tokens.detach().cpu().numpy()
        if not self.gone.any():
            logits = self._feed(self.rows, np.full(self.batch, k, dtype=np.int64), flat.reshape(-1))
            return logits.view(self.batch, k, self.vocab)
        rows = np.flatnonzero(~self.gone).astype(np.int32)
        out = torch.zeros((self.batch, k, self.vocab), dtype=torch.float32)
        fed = self._feed(rows, np.full(len(rows), k, dtype=np.int64), flat[rows].reshape(-1))
        out[torch.from_numpy(rows).long()] = fed.view(len(rows), k, self.vocab)
        return out

    @torch.no_grad()
    def extend_rows(self, rows: Sequence[int], tokens: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """rows[i] takes tokens[i] (its own count) at its next positions, all in one decode (`_feed`); the
        logits after each, one (k_i, V) per row given. The other rows' sequences are untouched."""
        seq = np.asarray(rows, dtype=np.int32)
        counts = np.asarray([len(t) for t in tokens], dtype=np.int64)
        if len(seq) == 0 or bool((counts < 1).any()):
            raise ConfigError(f"extend_rows: one or more tokens for each row given, got counts {counts.tolist()}")
        if self.gone[seq].any():
            raise ConfigError(f"extend_rows: row {int(seq[self.gone[seq]][0])} was released; it is not fed again")
        if bool((counts > 1).any()):
            self._several_tokens(int((self.n[seq] + counts).max()))
        flat = torch.cat([t.reshape(-1) for t in tokens]).detach().cpu().numpy()
        return list(self._feed(seq, counts, flat).split(counts.tolist()))

    def _feed(self, seq: np.ndarray, counts: np.ndarray, flat: np.ndarray) -> torch.Tensor:
        """Sequence seq[i] takes its counts[i] tokens of `flat` (row by row) at its next positions; the logits
        after each token, (sum(counts), V) in that order, those of one-token steps: one decode, or with a float KV
        cache and flash attention, where a row takes _TILED_FROM tokens or more, decodes of at most _TILED_FROM - 1
        tokens a row (each row's next ones in turn)."""
        total = int(counts.sum())
        within = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)  # each token's index in its row
        rows, pos = np.repeat(seq, counts), np.repeat(self.n[seq], counts) + within
        part = within // (_TILED_FROM - 1)
        if self.ctx.flash_attn and self.ctx.float_kv and part.any():
            logits = torch.empty((total, self.vocab), dtype=torch.float32)
            for p in range(int(part.max()) + 1):
                take = np.flatnonzero(part == p)
                logits[torch.from_numpy(take)] = self._decode(
                    rows[take], pos[take], flat[take], np.ones(len(take), bool)
                )
        else:
            logits = self._decode(rows, pos, flat, np.ones(total, dtype=bool))
        self.n[seq] += counts
        return logits

    def truncate(self, length: int | Sequence[int]) -> None:
        """Keep the first `length` columns of the padded rows (one int, or one per row): each row keeps
        length - its padding positions of its sequence."""
        lengths = np.full(self.batch, length) if isinstance(length, int) else np.asarray([int(n) for n in length])
        if lengths.shape != (self.batch,):
            raise ConfigError(f"truncate: {lengths.size} lengths for {self.batch} rows")
        keep = lengths - self.pad
        bad = np.nonzero((keep < 1) | (keep > self.n))[0]
        if len(bad):
            i = int(bad[0])
            raise ConfigError(
                f"truncate({int(lengths[i])}) in row {i}: the row holds columns {int(self.pad[i])}.."
                f"{int(self.pad[i] + self.n[i]) - 1}; keep at least its first real token and at most all of them"
            )
        lib = _llama_cpp()
        for i in np.nonzero((keep < self.n) & ~self.gone)[0].tolist():
            lib.llama_memory_seq_rm(self.ctx.mem, int(self.seq[i]), int(keep[i]), -1)
        self.n = keep.astype(np.int64)

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row i's sequence becomes a copy of row beam_idx[i]'s. Each row has a cache stream of its own, so a row
        that changes beam gets its source's state (`_state`, every source read before any row is written)."""
        src = [int(i) for i in beam_idx.tolist()]
        if len(src) != self.batch or not all(0 <= i < self.batch for i in src):
            raise ConfigError(f"reorder: beam_idx must hold {self.batch} row indices, got {src}")
        moved = [(i, j) for i, j in enumerate(src) if i != j]
        if not moved:
            return
        states = {j: self._state(int(self.seq[j])) for j in sorted({j for _, j in moved})}
        for i, j in moved:
            self._restore(states[j], int(self.seq[i]), f"row {j}'s cache to row {i}")
        self.n, self.pad = self.n[src], self.pad[src]

    def release(self, rows: Sequence[int]) -> None:
        """`rows` will not be fed again: left out of every later decode. Where that leaves the rows still going on
        sequences that are not consecutive, the fewest of them move into the released rows' sequences, so that a
        decode of every row still going is one pass of llama.cpp's, not one per run of consecutive sequences. A
        move copies the row's cells (about 12 KB a token on the default model with a Q8_0 KV cache), its logits
        unchanged; its time counts in `untimed`."""
        new = [int(b) for b in rows if not self.gone[int(b)]]
        if not new:
            return
        self.gone[new] = True
        going = np.flatnonzero(~self.gone)
        if len(going) == 0:
            return
        started = time.perf_counter()
        lib, held = _llama_cpp(), np.zeros(self.batch, dtype=bool)
        held[self.seq[going]] = True
        # the window of len(going) sequences that already holds the most rows still going: the others move in
        counts = np.convolve(held, np.ones(len(going), dtype=int), mode="valid")
        first = int(np.argmax(counts))
        inside = np.zeros(self.batch, dtype=bool)
        inside[first : first + len(going)] = True
        movers = [b for b in going.tolist() if not inside[self.seq[b]]]
        owner = np.empty(self.batch, dtype=np.int64)
        owner[self.seq] = self.rows  # sequence -> the row on it
        free = [int(owner[s]) for s in np.flatnonzero(inside & ~held)]  # released rows on sequences inside
        for b, g in zip(movers, free):
            was, to = int(self.seq[b]), int(self.seq[g])
            self._restore(self._state(was), to, f"row {b}'s cache to sequence {to}")
            lib.llama_memory_seq_rm(self.ctx.mem, was, -1, -1)
            self.seq[b], self.seq[g] = to, was
        if movers:
            self.untimed += time.perf_counter() - started

    def _state(self, seq: int) -> tuple[Any, int]:
        """A sequence's cells, read into host memory (llama_state_seq_get_data)."""
        lib, ctx = _llama_cpp(), self.ctx.ctx
        size = lib.llama_state_seq_get_size(ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        return buf, lib.llama_state_seq_get_data(ctx, buf, size, seq)

    def _restore(self, state: tuple[Any, int], seq: int, what: str) -> None:
        """Sequence `seq` cleared, then given `state`'s cells, in the same order (so its logits do not change)."""
        lib = _llama_cpp()
        lib.llama_memory_seq_rm(self.ctx.mem, seq, -1, -1)
        buf, size = state
        if lib.llama_state_seq_set_data(self.ctx.ctx, buf, size, seq) == 0:
            raise SamplechainError(f"llama.cpp could not copy {what}")
