"""Greedy decoding with `left_padding` pad tokens in front of the prompt (transformers' documentation example)."""

import torch

from .checks import check_left_padding


def generate(model, input_ids, generation_config=None, left_padding=None, **kwargs):
    config = generation_config or model.generation_config
    max_new = kwargs.pop("max_new_tokens", None) or config.max_new_tokens
    limit = input_ids.shape[1] + max_new if max_new else (config.max_length or input_ids.shape[1] + 20)
    if left_padding is not None:
        check_left_padding(left_padding)
        pad = kwargs.pop("pad_token", None) or config.pad_token_id or model.config.pad_token_id
        if pad is None:
            pad = config.eos_token_id if isinstance(config.eos_token_id, int) else None
        if pad is None:
            raise ValueError("no pad token: pass pad_token=ID")
        padding = torch.full((input_ids.shape[0], left_padding), pad, dtype=input_ids.dtype, device=input_ids.device)
        limit += left_padding
        input_ids = torch.cat([padding, input_ids], dim=1)
    with torch.no_grad():
        while input_ids.shape[1] < limit:
            logits = model(input_ids).logits[:, -1, :]
            input_ids = torch.cat([input_ids, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return input_ids
