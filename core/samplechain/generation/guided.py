"""Classifier-free guidance under speculation: the runner of the generation's context and the runner of its
unconditional context (the negative prompt) driven as one runner.

Every call feeds both contexts the same tokens, returns the conditional logits as the runner would, and leaves the
unconditional logits of the same positions in `unconditional`, laid out alike; a cut keeps the same generated
tokens in both. The two contexts have prompts of their own widths (each left-padded), so a cut's column counts are
moved by the difference of those widths, and where a cut reaches into the prompts (a guard taking a row's first token
back) the prompt tokens fed again come from each context's own prompt. A drafter that runs part of the model on the generation's cache (early
exit) drafts on the conditional runner (`conditional`): its drafts are guesses, and the chain's guided draws decide.

`with_guidance` puts guidance into a chain that has none, as transformers' `guidance_scale` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import torch

from ..engine.chain import Chain
from ..engine.config import load_config
from ..runners import ModelRunner

__all__ = ["GuidedRunner", "guided", "unconditional_of", "with_guidance"]


def with_guidance(chain: Chain, scale: float) -> Chain:
    """`chain` with `{ use = "cfg", scale = scale }` first: guidance before every other sampler, as transformers runs
    its guidance processor before the others. Its ConfigErrors name `samplers[0].scale`."""
    # load_config checks whole chains (one needs a selector): the cfg entry is resolved in a chain of two
    spec = {"samplers": [{"use": "cfg", "scale": scale}, {"use": "greedy"}]}
    entry = load_config(spec, host=chain.host, name="guidance").samplers[0]
    config = attrs.evolve(chain.config, samplers=(entry, *chain.config.samplers))
    return Chain(config, host=chain.host, backend=chain.backend_name)


class GuidedRunner(ModelRunner):
    """`conditional` and `guidance` (the unconditional context's runner, of the same class) as one runner; after
    each call `unconditional` holds the unconditional logits of the positions the call returned (the same shape, or
    the same list of per-row tensors)."""

    def __init__(self, conditional: ModelRunner, guidance: ModelRunner, prompt: torch.Tensor, width: int) -> None:
        super().__init__(conditional.model, conditional.input_ids, conditional.attention_mask)
        self.conditional, self.guidance = conditional, guidance
        self.prompt = prompt  # the unconditional context's prompt block (B, width'), left-padded
        self.width = width  # the conditional prompt block's width: columns past it are generated tokens
        self.shift = prompt.shape[1] - width  # a conditional column count -> the unconditional one
        self.per_row_truncate = conditional.per_row_truncate and guidance.per_row_truncate
        self.unconditional: Any = None
        # per row, the prompt tokens a cut took back (a guard's rewind before the first token): the next feed
        # begins with the conditional prompt's last ones, which the unconditional context takes from its own prompt
        self.inside = [0] * prompt.shape[0]

    def prefill(self) -> torch.Tensor:
        self.unconditional = self.guidance.prefill()
        return self.conditional.prefill()

    def step(self, input_ids: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """The unconditional context takes the same new column after its own prompt."""
        context = torch.cat([self.prompt.to(input_ids.device), input_ids[:, self.width :]], dim=1)
        self.inside = [0] * len(self.inside)  # a step's token is the context's last column, in either prompt
        self.unconditional = self.guidance.step(context, active)
        return self.conditional.step(input_ids, active)

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        self.unconditional = self.guidance.extend(torch.stack(self._own(range(tokens.shape[0]), list(tokens))))
        return self.conditional.extend(tokens)

    def extend_rows(self, rows: Sequence[int], tokens: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.unconditional = self.guidance.extend_rows(rows, self._own(rows, tokens))
        return self.conditional.extend_rows(rows, tokens)

    def truncate(self, length: int | Sequence[int]) -> None:
        self.conditional.truncate(length)
        lengths = [int(length)] * len(self.inside) if isinstance(length, int) else [int(n) for n in length]
        self.inside = [max(self.width - n, 0) for n in lengths]
        shift = self.shift
        self.guidance.truncate(length + shift if isinstance(length, int) else [n + shift for n in lengths])

    def _own(self, rows: Iterable[int], tokens: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each row's feed for the unconditional context: where a cut took prompt tokens back, the feed's first
        tokens are the conditional prompt's and become the unconditional prompt's last ones."""
        out = list(tokens)
        for i, b in enumerate(rows):
            n, self.inside[b] = self.inside[b], 0
            if n:
                out[i] = torch.cat([self.prompt[b, -n:].to(out[i].device, out[i].dtype), out[i][n:]])
        return out

    def release(self, rows: Sequence[int]) -> None:
        self.conditional.release(rows)
        self.guidance.release(rows)

    def keep_past(self) -> None:
        """Both caches keep what a sliding window would drop until the next cut (TransformersRunner.keep_past)."""
        for runner in (self.conditional, self.guidance):
            keep = getattr(runner, "keep_past", None)
            if callable(keep):
                keep()

    def lookahead(self) -> contextlib.AbstractContextManager[None] | None:
        return self.conditional.lookahead()

    def holds(self, row: int) -> torch.Tensor:
        return self.conditional.holds(row)


def unconditional_of(runner: ModelRunner) -> Any:
    """The unconditional logits of the runner's last call where it is a GuidedRunner; None without guidance."""
    return runner.unconditional if isinstance(runner, GuidedRunner) else None


# per runner class, GuidedRunner with that class's class-level traits (its name, whether it pads rows and skips
# finished ones), which the loop reads from the class
_CLASSES: dict[type[ModelRunner], type[GuidedRunner]] = {}


def guided(conditional: ModelRunner, guidance: ModelRunner, prompt: torch.Tensor, width: int) -> GuidedRunner:
    """The two runners of a generation with a negative prompt as one (see the module's docstring); `prompt`: the
    unconditional context's prompt block, `width`: the conditional one's width."""
    runner_cls = type(conditional)
    if runner_cls not in _CLASSES:
        traits = {key: getattr(runner_cls, key) for key in ("name", "pads_rows", "skips_inactive", "sampling_threads")}
        _CLASSES[runner_cls] = type(f"Guided{runner_cls.__name__}", (GuidedRunner,), traits)
    return _CLASSES[runner_cls](conditional, guidance, prompt, width)
