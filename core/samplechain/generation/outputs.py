"""What generation returns: transformers' GenerateDecoderOnlyOutput fields, plus logprobs and finish reasons."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from transformers.utils import ModelOutput

__all__ = ["GenerationOutput", "ordinary"]


@dataclass
class GenerationOutput(ModelOutput):
    """Attribute and key access as transformers' outputs (`out.sequences`, `out["sequences"]`).

    sequences: (B, prompt_length + steps) int64, left-padded prompts then the new tokens; a row that finished
        early is padded with pad_token_id after its last token (as transformers pads it). input_ids keep their
        width and pad ids (prompt_length = input_ids.shape[1]), as in transformers.
    scores: per step (B, V) processed scores the chain sampled from (-inf where a token was removed), when
        output_scores=True. For beam search: per step the processed log-probabilities of every beam, as
        transformers gives them.
    logits: per step (B, V) raw model logits (float32), when output_logits=True.
    logprobs: (B, steps) float32 log-probability of each chosen token under the processed distribution (or under
        the stage logprobs_mode names, a logit for its ":logits" / "*_logits" forms); 0 after a row finished. Beam
        search: the per-token transition scores of each returned sequence.
    top_logprobs: per step a pair (values (B, n), token ids (B, n)) of the n most likely tokens of the same
        distribution, when top_logprobs=n > 0.
    finish_reasons: per row, the `reason` of the criterion that stopped it ("eos", "stop_strings",
        "stop_regex:<pattern>", "max_new_tokens", ...).
    stop_texts: per row, the text a stop string / stop_regex matched (vLLM's stop_reason for strings), else None.
    num_generated: (B,) int64 tokens each row generated, its finishing token included.
    texts: per row the decoded new text (special tokens skipped) when a tokenizer was given; a row stopped by a
        stop string / stop_regex ends before the matched text, or right after it with
        include_stop_str_in_output=True (as vLLM: `sequences` keep every generated token, only the text is cut).
    drafted / kept / model_calls: (B,) int64 per row, with a drafter (draft=): drafted tokens the model checked,
        those that came out, and the forward passes that produced the row's tokens (the prefill included; without
        a drafter that is num_generated).
    rewinds: (B,) int64 per row, with guards (guards=): the times a guard took the row's text back.
    sequences_scores / beam_indices: beam search only, as transformers' GenerateBeamDecoderOnlyOutput.
    The loop's cache is not returned (transformers' past_key_values field).
    """

    # torch.Tensor (the dtypes are in the docstring): torch's operations are typed to return it, not LongTensor
    sequences: torch.Tensor | None = None
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None
    attentions: tuple | None = None
    hidden_states: tuple | None = None
    sequences_scores: torch.Tensor | None = None
    beam_indices: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None
    top_logprobs: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None
    finish_reasons: list[str | None] | None = None
    stop_texts: list[str | None] | None = None
    num_generated: torch.Tensor | None = None
    texts: list[str] | None = None
    prompt_length: int | None = None
    drafted: torch.Tensor | None = None
    kept: torch.Tensor | None = None
    model_calls: torch.Tensor | None = None
    rewinds: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # the loop runs the model under torch.inference_mode, whose tensors refuse in-place changes and autograd
        # outside it: returned as ordinary tensors, as model.generate returns them (a trainer computes gradients
        # through the sequences, a caller edits them)
        for field in dataclasses.fields(self):
            setattr(self, field.name, _ordinary(getattr(self, field.name)))
        super().__post_init__()


def ordinary(tensor: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """`tensor` as an ordinary tensor (a copy where it is an inference tensor, or always with `copy`). The loop
    records per-step outputs through it, so that the output needs no second copy of them at the end."""
    if not copy and not tensor.is_inference():
        return tensor
    with torch.inference_mode(False):
        return tensor.clone()


def _ordinary(value: Any) -> Any:
    """`value` with every inference tensor in it (tuples and pairs of them too) copied to an ordinary tensor."""
    if isinstance(value, torch.Tensor):
        return ordinary(value)
    if isinstance(value, tuple):
        return tuple(_ordinary(v) for v in value)
    return value
