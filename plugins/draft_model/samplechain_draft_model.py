"""`draft_model`: a smaller causal LM of the generation's vocabulary drafts, drawing through the verifying chain.

transformers' assisted generation (`assistant_model`), with coupled drafting: the draft model proposes `num_tokens`
tokens one at a time, each drawn through the generation's own chain from a copy of the request's state, with the
noise the verifying draw uses at that position (samplechain_draft_model_base). Where the two models' distributions
are close the two draws agree, so a sampled draft is kept about as often as a greedy one, and in mode match the
tokens are those of generation without a drafter whatever the draft model says.

    generate(model, tok, prompt, chain=..., seed=1, draft={"use": "draft_model", "model": "path/to/small-model"})
    generate(model, tok, prompt, chain=..., seed=1, draft=DraftModel.from_model(small, small_tokenizer))

`model` is a transformers model folder or a .gguf file (`samplechain.models.load_model` opens it; a folder's model
is moved to the generation's device), or, from Python, a loaded model object. A loaded path stays loaded for the
next generations (the two most recent paths).
"""

from __future__ import annotations

import atexit
import functools
import os
import weakref
from typing import Any

import attrs

from samplechain import ConfigError, hookimpl
from samplechain.drafters import DraftContext
from samplechain_draft_model_base import (
    ModelDrafter,
    logit_columns,
    noise_field,
    num_tokens_field,
    p_min_field,
    tokenizer_size,
)

__all__ = ["DraftModel", "DraftModelParams"]


def _model_ok(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
    if value is None:
        raise ValueError(
            "give the draft model: a transformers model folder or a .gguf file of the generation's vocabulary "
            "(from Python also a loaded model, or DraftModel.from_model(model, tokenizer))"
        )
    if isinstance(value, (str, os.PathLike)):
        if not os.path.exists(os.path.expanduser(str(value))):
            raise ValueError("no such folder or file; give a transformers model folder or a .gguf file")


@attrs.frozen
class DraftModelParams:
    model: Any = attrs.field(default=None, validator=_model_ok)  # a path, or a model object from Python
    num_tokens: int = num_tokens_field()
    noise: str = noise_field()
    p_min: float = p_min_field()


_CLOSABLE: weakref.WeakSet[Any] = weakref.WeakSet()  # opened models with a close() (llama.cpp's), closed at exit


@functools.lru_cache(maxsize=2)
def _opened(path: str, device: str, load_model: Any) -> tuple[Any, Any]:
    """(model, tokenizer) of a path, on `device` where it is a torch model. A GGUF file opens with flash attention
    (load_gguf's default): llama.cpp's attention over several tokens then gives the logits of one-token steps, so a
    drafter's draws do not depend on how its cache was fed."""
    try:
        model, tokenizer = load_model(path)
    except ConfigError as exc:  # the loader's own account (no config.json, not a GGUF file ...), named as a drafter's
        raise ConfigError(f"draft[draft_model].model = {path!r}: cannot be opened as a model: {exc}") from None
    except Exception as exc:  # transformers' or llama.cpp's own errors on a path that holds no model they open
        raise ConfigError(
            f"draft[draft_model].model = {path!r}: cannot be opened as a model ({type(exc).__name__}: {exc}); give a "
            "transformers model folder or a .gguf file with the generation model's vocabulary"
        ) from None
    if device != "cpu" and callable(getattr(model, "to", None)) and hasattr(model, "parameters"):
        model = model.to(device)
    if callable(getattr(model, "close", None)):
        _CLOSABLE.add(model)
    return model, tokenizer


@atexit.register
def _close_opened() -> None:
    """Close the opened models that hold native resources while the interpreter still runs (llama.cpp's cannot
    free them during its shutdown)."""
    for model in list(_CLOSABLE):
        model.close()


class DraftModel(ModelDrafter):
    name = "draft_model"
    Params = DraftModelParams
    summary = "drafter: a smaller model of the same vocabulary, drawing with the request's own noise (coupled)"

    def __init__(self, params: DraftModelParams | None = None) -> None:
        super().__init__(params)
        self.tokenizer: Any = None  # the draft model's tokenizer, where known (from_model, or a path's)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any = None, **params: Any) -> DraftModel:
        """A drafter of a loaded model (and its tokenizer, to check that it is the generation's vocabulary);
        `params`: num_tokens, noise, p_min."""
        try:
            drafter = cls(DraftModelParams(model=model, **params))
        except (TypeError, ValueError) as exc:
            for name, value in params.items():  # the parameter at fault, where one alone is
                try:
                    DraftModelParams(model=model, **{name: value})
                except (TypeError, ValueError):
                    raise ConfigError(f"DraftModel.from_model: {name} = {value!r}: {exc}") from None
            raise ConfigError(f"DraftModel.from_model: {exc}") from None
        drafter.tokenizer = tokenizer
        return drafter

    def drafting_model(self, context: DraftContext) -> Any:
        given = self.params.model
        if isinstance(given, (str, os.PathLike)):
            model, self.tokenizer = _opened(os.path.expanduser(str(given)), context.device.type, context.load_model)
        else:
            model = given
        self._check_vocabulary(model, context)
        return model

    def _check_vocabulary(self, model: Any, context: DraftContext) -> None:
        """The draft model gives the generation's logit columns and has a tokenizer of its size (where known);
        columns that differ only past a tokenizer both share (padding) are cut or masked to the generation's."""
        ours, theirs = logit_columns(model), context.vocab_size
        tok_ours, tok_theirs = tokenizer_size(self.tokenizer), tokenizer_size(context.tokenizer)
        same_tokenizer = tok_ours is not None and tok_ours == tok_theirs
        if ours is None or theirs <= 0 or ours == theirs:  # theirs 0: the generation model's width is unknown
            if tok_ours is None or tok_theirs is None or same_tokenizer:
                return
        elif tok_ours is not None and same_tokenizer and min(ours, theirs) >= tok_ours:
            return  # the same tokens, padded to other widths: ChainDraw masks the columns past them
        shown = [
            f"{n} logit columns" + (f", a tokenizer of {t} tokens" if t is not None else "")
            for n, t in ((ours, tok_ours), (theirs, tok_theirs))
        ]
        raise ConfigError(
            f"draft[draft_model].model: the draft model ({shown[0]}) does not share the generation model's "
            f"vocabulary ({shown[1]}); a draft model needs the generation's tokenizer: take a smaller model of the "
            "same family, or draft with prompt_lookup"
        )


@hookimpl
def register_drafters(register):
    register(DraftModel)
