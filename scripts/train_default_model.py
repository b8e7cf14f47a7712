#!/usr/bin/env python
"""Train the embedded default model: a small GPT-2 and its byte-level BPE tokenizer, on Python's own docs.

The corpus is text every Python installation carries: the language reference topics of `pydoc_data.topics`
(what `help("if")` shows) and the docstrings of the standard library's public modules, classes and functions,
collected in sorted order. Everything is seeded and single-process, so a run on the same Python and torch
versions reproduces the same weights.

    .venv/bin/python scripts/train_default_model.py                       # the committed model
    .venv/bin/python scripts/train_default_model.py --steps 200 --out /tmp/m  # a quick try

A progress bar over the optimizer steps, with the loss, is drawn on stderr when it is a terminal (--no-progress:
never); it only reads the loss, so the weights are the same with or without it.

Output: a folder loadable with AutoModelForCausalLM / AutoTokenizer.from_pretrained (safetensors, no pickles).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import io
import json
import math
import random
import sys
import time
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "core" / "samplechain" / "models" / "docs-gpt2"
EOS = "<|endoftext|>"

# Modules that do something on import (open a browser, print, start a GUI) or are tests / tools, not prose.
SKIP = {
    "antigravity",
    "this",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "test",
    "lib2to3",
    "ensurepip",
    "pydoc_data",
    "__main__",
    "__phello__",
    "msilib",
    "winreg",
    "winsound",
    "msvcrt",
    "_winapi",
    "nturl2path",
    "venv",
    "pydoc",
    "xxsubtype",
    "xxlimited",
    "xxlimited_35",
    "_xxtestfuzz",
    "_testcapi",
    "_testinternalcapi",
    "_testbuffer",
    "_testimportmultiple",
    "_testmultiphase",
    "_testclinic",
    "_testsinglephase",
    "sre_compile",
    "sre_parse",
    "sre_constants",
    "tabnanny",
}


def _clean(doc: str | None) -> str | None:
    if not doc:
        return None
    doc = inspect.cleandoc(doc).strip()
    words = doc.split()
    if len(words) < 8:  # signatures and one-liners carry little prose
        return None
    return doc


def _with_submodules(names: list[str]) -> list[str]:
    """Top-level stdlib modules and, for packages, their public submodules (email.mime.text, json.decoder ...)."""
    import pkgutil

    out: list[str] = []
    for name in names:
        out.append(name)
        spec = importlib.util.find_spec(name) if name not in sys.modules else sys.modules[name].__spec__
        locations = getattr(spec, "submodule_search_locations", None) if spec else None
        if not locations:
            continue
        for info in sorted(
            pkgutil.walk_packages(list(locations), prefix=name + ".", onerror=lambda _: None), key=lambda i: i.name
        ):
            parts = info.name.split(".")
            if any(p.startswith("_") or p in SKIP or p.startswith("test") for p in parts[1:]):
                continue
            out.append(info.name)
    return out


def collect_corpus() -> list[str]:
    """Documents in a fixed order: pydoc topics (sorted by key), then stdlib docstrings (sorted modules)."""
    from pydoc_data import topics

    docs: list[str] = [topics.topics[k].strip() for k in sorted(topics.topics)]
    seen: set[str] = set(docs)
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIP)
    for name in _with_submodules(names):
        try:
            with warnings.catch_warnings(), redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - platform-specific modules are simply absent
            continue
        found = [_clean(module.__doc__)]
        for attr in sorted(getattr(module, "__all__", None) or dir(module)):
            if attr.startswith("_"):
                continue
            obj = getattr(module, attr, None)
            if getattr(obj, "__module__", None) != name:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                found.append(_clean(obj.__doc__))
                if inspect.isclass(obj):
                    for meth in sorted(vars(obj)):
                        if not meth.startswith("_") and inspect.isfunction(vars(obj)[meth]):
                            found.append(_clean(vars(obj)[meth].__doc__))
        for doc in found:
            if doc and doc not in seen:
                seen.add(doc)
                docs.append(doc)
    return docs


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    # GPT-2's inputs: no token_type_ids (GPT-2 would embed them as tokens). No pad token, as GPT-2.
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        model_max_length=256,
        model_input_names=["input_ids", "attention_mask"],
    )
    return fast


def save_tokenizer(tok, out: Path) -> None:
    """save_pretrained, naming the class every transformers release knows.

    transformers 5 writes "TokenizersBackend", which 4.x cannot load; "PreTrainedTokenizerFast" (a tokenizer.json
    and nothing else) loads in both. The input names keep 4.x from returning token_type_ids.
    """
    tok.save_pretrained(out)
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["model_input_names"] = ["input_ids", "attention_mask"]
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


HELD_OUT_SEPARATOR = "\n\n" + EOS + "\n\n"


@torch.no_grad()
def print_samples(model, tok, prompts=("The function", "A list is", "In Python,")) -> None:
    """Greedy and sampled (temperature 0.8, top-k 40, seeded) continuations, to eyeball the result."""
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt")
        for label, kwargs in (
            ("greedy", {"do_sample": False}),
            ("sampled", {"do_sample": True, "temperature": 0.8, "top_k": 40}),
        ):
            torch.manual_seed(0)
            out = model.generate(**ids, max_new_tokens=48, pad_token_id=tok.eos_token_id, **kwargs)
            print(f"--- {label}: {tok.decode(out[0], skip_special_tokens=True)!r}", flush=True)


def encode_all(tok, texts: list[str]) -> torch.Tensor:
    eos = tok.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for enc in tok.backend_tokenizer.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    ap.add_argument("--vocab", type=int, default=4096, help="BPE vocabulary size, <|endoftext|> included")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (n_layer)")
    ap.add_argument("--width", type=int, default=256, help="hidden size (n_embd)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (n_head)")
    ap.add_argument("--context", type=int, default=256, help="n_positions, the longest sequence the model takes")
    ap.add_argument("--seq", type=int, default=128, help="training sequence length in tokens")
    ap.add_argument("--batch", type=int, default=20, help="sequences per optimizer step")
    ap.add_argument("--steps", type=int, default=1600, help="optimizer steps (5%% warmup, then cosine to lr/10)")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    ap.add_argument(
        "--threads", type=int, default=2, help="torch CPU threads; keep it the same to reproduce weights bit for bit"
    )
    ap.add_argument("--seed", type=int, default=20261123, help="seeds the split, the batches and the init")
    ap.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a bar over the steps with the loss on stderr (default: when stderr is a terminal)",
    )
    args = ap.parse_args(argv)

    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

    from samplechain.tools.progress import progress_bar

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    t0 = time.time()
    docs = collect_corpus()
    rng = random.Random(args.seed)
    order = list(range(len(docs)))
    rng.shuffle(order)
    n_val = max(len(docs) // 50, 1)
    val_docs = [docs[i] for i in sorted(order[:n_val])]
    train_docs = [docs[i] for i in sorted(order[n_val:])]
    chars = sum(map(len, docs))
    print(f"corpus: {len(docs)} documents, {chars / 1e6:.2f} M characters ({len(val_docs)} held out)", flush=True)

    tok = train_tokenizer(train_docs, args.vocab)
    train_ids, val_ids = encode_all(tok, train_docs), encode_all(tok, val_docs)
    print(f"tokens: train {len(train_ids)}, held-out {len(val_ids)}; vocab {len(tok)}", flush=True)

    eos = tok.convert_tokens_to_ids(EOS)
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=args.context,
        n_embd=args.width,
        n_layer=args.layers,
        n_head=args.heads,
        bos_token_id=eos,
        eos_token_id=eos,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(config)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f} M parameters", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    warmup = max(args.steps // 20, 1)

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(args.steps - warmup, 1)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(args.seed)
    span = len(train_ids) - args.seq - 1

    @torch.no_grad()
    def held_out_loss() -> float:
        model.eval()
        losses = []
        for start in range(0, len(val_ids) - args.seq - 1, args.seq):
            chunk = val_ids[start : start + args.seq + 1][None]
            losses.append(model(chunk[:, :-1], labels=chunk[:, :-1]).loss.item())
            if len(losses) >= 64:
                break
        model.train()
        return sum(losses) / len(losses)

    model.train()
    with progress_bar(args.steps, "training", args.progress, transient=False) as bar:
        for step in range(args.steps):
            starts = torch.randint(0, span, (args.batch,), generator=gen)
            batch = torch.stack([train_ids[s : s + args.seq] for s in starts.tolist()])
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            loss = model(batch, labels=batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            bar.advance(status=f"loss {loss.item():.3f}" if bar.enabled else None)
            if step % 100 == 0 or step == args.steps - 1:
                print(
                    f"step {step:5d}  loss {loss.item():.3f}  lr {lr_at(step):.2e}  {time.time() - t0:7.0f} s",
                    flush=True,
                )
    val = held_out_loss()
    print(f"held-out loss {val:.3f} (uniform: {math.log(len(tok)):.3f}); {time.time() - t0:.0f} s", flush=True)

    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos)
    model.save_pretrained(args.out, safe_serialization=True)
    save_tokenizer(tok, args.out)
    (args.out / "training.json").write_text(
        json.dumps(
            {
                "command": "scripts/train_default_model.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "documents": len(docs),
                "characters": chars,
                "train_tokens": len(train_ids),
                "held_out_tokens": len(val_ids),
                "parameters": params,
                "held_out_loss": round(val, 4),
                "seconds": round(time.time() - t0),
                "args": {
                    k: str(v) if isinstance(v, Path) else v
                    for k, v in vars(args).items()
                    if k not in ("out", "progress")
                },
            },
            indent=2,
        )
        + "\n"
    )
    # The held-out split, one document per paragraph block: the tests measure loss and English-ness against it.
    (args.out / "held_out.txt").write_text(HELD_OUT_SEPARATOR.join(val_docs) + "\n")
    print(f"saved to {args.out}", flush=True)
    print_samples(model, tok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
