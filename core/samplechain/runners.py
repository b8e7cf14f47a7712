"""The model-runner contract: what the generation loop needs from a model, whatever engine runs it.

A runner drives one generation's batch through a model and its cache. Rows are left-padded to a common width
(`input_ids` (B, L), `attention_mask` (B, L)); every call returns float32 logits on the CPU or the model's device,
fresh tensors the caller may change:

- `prefill()` -> (B, V): run the prompts, the logits of their last position;
- `step(input_ids)` -> (B, V): `input_ids` is every token so far, (B, L + n); the last column is new, the cache has
  the rest. A runner with `skips_inactive` also takes `step(input_ids, active=...)` ((B,) bool): only the active
  rows need their logits (the others have finished: their rows of the result are zeros and their caches need not
  advance, as they are never read again);
- `extend(tokens)` -> (B, K, V): K new tokens per row at once, the logits after each (verifying drafted tokens);
- `truncate(length)`: cut the cache back so that it holds the first `length` columns (an int for every row, or one
  per row where `per_row_truncate` is True); the next `step` / `extend` continues from there;
- `extend_rows(rows, tokens)` -> one (k_i, V) per row given: rows[i] takes tokens[i] (k_i >= 1 of them, its own
  count) in one pass, the other rows are untouched (where `per_row_truncate` is True: rows of different lengths
  are what speculative decoding keeps when each row keeps its own number of drafted tokens);
- `reorder(beam_idx)`: beam search; rows of the cache follow their beams (optional);
- `release(rows)`: those rows will not be fed again (they have ended, or hold every token they will emit); a
  runner may drop them from its batch, so later calls run only the rows still going (optional; callers keep using
  the batch's row indices, and a released row's logits are zeros);
- `lookahead()`: a context manager whose calls are taken back when it ends, also after an error, the runner and
  its cache as they were before it; and `holds(row)`, the tokens a row's cache holds. A drafter that runs part of
  the generation's own model on its cache (early exit) drafts inside it (optional: None where the runner cannot).

A runner class is registered like a sampler (the `register_runners` hook of a plugin found through the `samplechain`
entry points) and says which model objects it drives (`accepts`). The transformers runner is built in and takes any
model no plugin claims; the llama.cpp runner (samplechain-llama-cpp) takes `LlamaCppModel` objects. A third engine
(MLX, ONNX Runtime) is one more plugin.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Generator, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import torch

from .candidates import PluginClass
from .errors import ConfigError, GenerationWarning

__all__ = ["ModelRunner", "running", "running_each_step"]

T = TypeVar("T")

# per model, the reasons ModelRunner.warn_numerics has already given
_NUMERICS_WARNED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


class ModelRunner(PluginClass):
    """Base class of runners. Subclasses set `name` (a lowercase identifier), implement `accepts`, `prefill`,
    `step`, `extend` and `truncate`, and set `per_row_truncate` (and implement `extend_rows`) when rows can hold
    different numbers of tokens."""

    per_row_truncate: bool = False  # a runner may decide per model (an instance attribute set in __init__)
    # step(input_ids, active=...) runs only the active rows: an engine whose rows are separate sequences saves the
    # finished rows' compute; one that runs the padded batch as a whole (transformers) keeps it, so that a batch's
    # logits stay those model.generate computes
    skips_inactive: ClassVar[bool] = False
    # extend_rows runs every row the runner holds as wide as the widest feed (a padded batch), so a call's work grows
    # with its longest draft times its rows; False: with the tokens it feeds. Speculation picks draft lengths by it.
    pads_rows: ClassVar[bool] = False
    # a call's time is not linear in the tokens it runs: a few cost about what one does, then it steps up (the
    # transformers runner's few-row products on a CPU). Speculation then prices a call of one row per width, as timed,
    # instead of on a line fitted to every call (which would price the few as dearly as the step).
    stepped_widths: bool = False
    # seconds of one-time work that this runner's calls have included so far (the transformers runner timing its
    # products' layouts on a CPU before the first pass of a row count): speculation leaves them out of the calls'
    # times it prices draft lengths by, which would otherwise price a draft length out for one slow first call
    untimed: float = 0.0
    # model files this runner's engine opens (`samplechain.models.load_model` picks the runner by them)
    file_suffixes: ClassVar[tuple[str, ...]] = ()
    # torch (and numba) threads for the sampling step while this runner generates; None leaves them. An engine with a
    # thread pool of its own on the same cores (llama.cpp) sets 1: two pools polling for work on few cores make
    # each other wait, and one row's sampling step is too small to gain from a second thread.
    sampling_threads: ClassVar[int | None] = None
    # a drafter's own runner (draft_model) sets it, before __init__: its logits choose drafts, which the generation's
    # model checks, so its numerics cannot change the tokens, a warning about them would be about the wrong model,
    # and it needs none of the numerics the generation's own passes may promise (batch-invariant passes)
    drafting: bool = False

    @classmethod
    def accepts(cls, model: Any) -> bool:
        """Whether this runner drives `model` (an object `load_model` or a user passed to generate())."""
        raise NotImplementedError

    @classmethod
    def load(cls, path: Any, **kwargs: Any) -> tuple[Any, Any]:
        """(model, tokenizer) for a model file of one of `file_suffixes`; `kwargs` go to the engine's loader."""
        raise ConfigError(f"the {cls.name} runner does not open model files; load the model yourself")

    def __init__(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        self.model = model
        self.input_ids = input_ids
        self.attention_mask = attention_mask

    def warn_numerics(self, why: str, text: str, stacklevel: int) -> None:
        """A GenerationWarning that this model's passes of several tokens can compute other logits than its
        one-token steps (so drafts can change the tokens, and scores the logprobs): once per model and `why`, and
        never from a drafter's own runner. `stacklevel` is warnings.warn's, as seen from the caller of this method."""
        if self.drafting:
            return
        given = _NUMERICS_WARNED.setdefault(self.model, set())
        if why not in given:
            given.add(why)
            warnings.warn(GenerationWarning(text), stacklevel=stacklevel + 1)

    def prefill(self) -> torch.Tensor:
        raise NotImplementedError

    def step(self, input_ids: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def truncate(self, length: int | Sequence[int]) -> None:
        raise NotImplementedError

    def extend_rows(self, rows: Sequence[int], tokens: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        raise ConfigError(f"the {self.name} runner feeds every row the same number of tokens (no extend_rows)")

    def reorder(self, beam_idx: torch.Tensor) -> None:
        raise ConfigError(
            f"the {self.name} runner cannot reorder its cache, so beam search cannot run on it; use greedy or sampling"
        )

    def release(self, rows: Sequence[int]) -> None:
        """Rows that will not be fed again; a runner may drop them from its batch. The default keeps them."""

    def kept_widths(self) -> dict[int, float]:
        """What the model's calls of F tokens took against a one-token call (F -> that ratio), as an earlier process
        on this machine timed and kept them (`keep_widths`): a `stepped_widths` runner's draft lengths price the
        widths this process has not timed yet by them. The default keeps none."""
        return {}

    def keep_widths(self, ratios: dict[int, float]) -> None:
        """Keeps `ratios` (F -> a call of F tokens' time against a one-token call's, timed in this process) for the
        next process on this machine (`kept_widths`). The default keeps nothing."""

    def lookahead(self) -> contextlib.AbstractContextManager[None] | None:
        """A block whose calls are taken back when it ends (see the module's docstring); None: the runner cannot."""
        return None

    def holds(self, row: int) -> torch.Tensor:
        """The tokens the cache holds for `row`, in order (CPU int64), where the runner has `lookahead`."""
        raise ConfigError(f"the {self.name} runner does not tell the tokens its cache holds")

    def _uniform_length(self, length: int | Sequence[int]) -> int:
        """`length` as one int; several different lengths are an error unless the runner cuts per row."""
        if isinstance(length, int):
            return length
        lengths = {int(n) for n in length}
        if len(lengths) != 1:
            raise ConfigError(
                f"the {self.name} runner cuts every row of its cache to the same length; got {sorted(lengths)}"
            )
        return lengths.pop()


@contextlib.contextmanager
def running(runner_cls: type[ModelRunner]) -> Iterator[None]:
    """What a runner's calls run under: torch's inference mode, and torch's threads as the runner asks for
    (`ModelRunner.sampling_threads`); the caller's mode and threads come back after it."""
    threads, wanted = torch.get_num_threads(), runner_cls.sampling_threads
    if wanted and wanted != threads:
        torch.set_num_threads(wanted)
    try:
        with torch.inference_mode():
            yield
    finally:
        if wanted and wanted != threads:
            torch.set_num_threads(threads)


def running_each_step(runner_cls: type[ModelRunner], steps: Generator[T, None, None]) -> Iterator[T]:
    """`steps` with each resumption inside `running(runner_cls)` and the caller's own mode and threads between them.
    A context held across a yield would reach into the consumer's code: a stream read step by step would leave its
    reader in inference mode (its tensors could not be changed in place) until the stream ended or was collected."""
    while True:
        with running(runner_cls):
            try:
                item = next(steps)
            except StopIteration:
                return
        try:
            yield item
        except GeneratorExit:  # the consumer stopped early: the steps' own clean-up runs as their steps did
            with running(runner_cls):
                steps.close()
            raise
