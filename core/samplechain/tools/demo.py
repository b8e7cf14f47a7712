"""The demo job: a chain sampling over the logits of a real transformers causal LM (GPT-2 architecture, built
from a small config with fixed random weights and a byte-level vocabulary), with a KV cache and per-request
state. Until the trained default model lands it shows the machinery, not fluent text."""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..engine.chain import Chain

__all__ = ["tiny_model", "run_demo"]

EOS = 256  # byte-level vocabulary: ids 0..255 are bytes, 256 is end-of-text


def tiny_model(seed: int = 0):
    """A small GPT-2 with deterministic random weights (no download, no training)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=257, n_positions=512, n_embd=64, n_layer=2, n_head=4, bos_token_id=EOS, eos_token_id=EOS
    )
    return GPT2LMHeadModel(config).eval()


def _encode(prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [list(p.encode("utf-8")) for p in prompts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), EOS, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):  # left padding
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask


@torch.inference_mode()
def run_demo(args: argparse.Namespace, console: Console) -> int:
    chain = Chain.load(args.chain, backend=args.backend)
    prompts = args.prompt or ["The sampler chain says: ", "Plugins all the way down: "]
    model = tiny_model()
    store = chain.new_store()
    ids = [f"req{i}" for i in range(len(prompts))]
    for rid in ids:
        store.add(rid, {"seed": args.seed} if args.seed is not None else {})
    console.print(f"[bold]chain[/bold] {escape(repr(chain))}")
    input_ids, mask = _encode(prompts)
    out = model(
        input_ids=input_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True
    )
    generated: list[list[int]] = [[] for _ in prompts]
    history = input_ids.masked_fill(mask == 0, -1)  # for samplers that read the tokens so far (penalties, DRY)
    lengths = mask.sum(-1)
    sample_s = 0.0
    for _ in range(args.max_new_tokens):
        t0 = time.perf_counter()
        extra: dict[str, Any] = {"history": history, "prompt_lengths": lengths} if chain.needs_history else {}
        step = chain.sample(out.logits[:, -1, :], store, ids, **extra)
        history = torch.cat([history, step.token_ids[:, None]], dim=1)
        sample_s += time.perf_counter() - t0
        for row, tok in enumerate(step.token_ids.tolist()):
            generated[row].append(tok)
        mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=mask.dtype)], dim=1)
        out = model(
            input_ids=step.token_ids[:, None],
            attention_mask=mask,
            position_ids=(mask.sum(-1, keepdim=True) - 1),
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    table = Table(title=f"{args.max_new_tokens} tokens per request")
    table.add_column("request")
    table.add_column("prompt")
    table.add_column("generated (bytes, undecodable shown as \ufffd)")
    for rid, prompt, toks in zip(ids, prompts, generated):
        text = bytes(t for t in toks if t < 256).decode("utf-8", errors="replace")
        table.add_row(rid, escape(prompt), escape(repr(text)))
    console.print(table)
    steps = args.max_new_tokens
    console.print(f"sampling: {1e3 * sample_s / steps:.3f} ms/step for a batch of {len(prompts)}")
    return 0
