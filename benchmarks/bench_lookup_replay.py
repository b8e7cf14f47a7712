"""Benchmark: what prompt lookup could keep on the texts the default model writes, replayed without the model.

In mode `match` a row's text does not depend on its drafter, so the run without a drafter fixes it, and what a
drafter keeps at a fixed draft length follows from the text alone: each call proposes up to --num-tokens tokens
(fewer where the length limit leaves less room, as the loop's `limit`), keeps the proposal's longest prefix that the
text goes on with and draws one token more, and the next call starts after it. The replay counts that loop's calls
(the prefill included), drafted and kept tokens, as `generate(..., draft={"use": ..., "adaptive": False})` counts
them, for bench_speculative.py's tasks, prompts and chains (B = 1, the first --prompts prompts of each task):

- `prompt_lookup` as it ships, with each `occurrence` ("follow", "switch", "first", "last");
- `every occurrence`: the best of the continuations of every earlier occurrence of the longest matching n-gram,
  which a tree of drafts checked in one call would keep; its "drafted" counts the tree's distinct tokens;
- `every n-gram`: the same over the occurrences of every matching n-gram (1 to 3 tokens), what any lookup of the
  row's last tokens could keep;
- `copying bound` (bench_speculative.Knows): the longest run of the row's next tokens that occurs earlier in its
  prompt and text so far, whichever occurrence that is.

It also sorts the copying bound's kept tokens by where each kept run occurs earlier (`bound_sources`): where the
passage the row copied last goes on, near it, after an occurrence of the row's last token, or elsewhere, where
nothing a lookup sees leads.

With sampling it also counts how often a drafted token is kept against the Gumbel noise g that the chain's draw adds
to it at its position (a pure function of the request's seed, the position and the token id, which a drafter can
read before the model runs): a token the processed distribution gives the chance p is drawn with probability
exp(-(1 - p) / p * e^-g) given g, so where drafts miss between tokens of comparable chances the kept share climbs
with g, and where they miss at tokens the chain's filters leave no chance it does not. As a check of the noise, the
mean noise of the drawn tokens is printed beside a Gumbel's mean (0.58): above it, the noise is the draw's.

    .venv/bin/python benchmarks/bench_lookup_replay.py --tasks code,list,quote --prompts 8 --markdown
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

import bench_speculative as bs  # noqa: E402 - the tasks, prompts, chains and model loading of that benchmark

from samplechain import rng  # noqa: E402
from samplechain.generation import generate  # noqa: E402
from samplechain_prompt_lookup import OCCURRENCES, PromptLookup, PromptLookupParams  # noqa: E402

BUCKETS = (-1, 0, 1, 2, 3)  # noise buckets: g < -0.5, [-0.5, 0.5), ..., >= 2.5

# a policy: (tokens so far, limit) -> (the draft the call checks, the tokens it feeds for it)
Policy = Callable[[torch.Tensor, int], tuple[torch.Tensor, int]]


@dataclass
class Text:
    prompt: list[int]
    generated: list[int]
    seed: int
    stream: int  # the chain's selector's noise stream: its index in the chain


@dataclass
class Counts:
    calls: int = 0
    tokens: int = 0
    drafted: int = 0
    kept: int = 0
    # (a draft's first token or a later one, noise bucket) -> [kept, checked]
    by_noise: dict[tuple[str, int], list[int]] = field(default_factory=dict)

    def add(self, other: Counts) -> None:
        self.calls, self.tokens = self.calls + other.calls, self.tokens + other.tokens
        self.drafted, self.kept = self.drafted + other.drafted, self.kept + other.kept
        for key, (k, c) in other.by_noise.items():
            record = self.by_noise.setdefault(key, [0, 0])
            record[0], record[1] = record[0] + k, record[1] + c


def replay(text: Text, policy: Policy, num_tokens: int, max_new: int, noise: bool = False) -> Counts:
    """The calls, drafted and kept tokens of the loop at a fixed draft length on `text` (see the module's doc)."""
    prompt, gen = torch.tensor(text.prompt), text.generated
    counts = Counts(calls=1, tokens=len(gen))  # the prefill draws the first token
    t = 1
    while t < len(gen):
        limit = min(num_tokens, max_new - t - 1)
        tokens = torch.cat([prompt, torch.tensor(gen[:t], dtype=torch.int64)])
        draft, fed = policy(tokens, limit) if limit > 0 else (tokens[:0], 0)
        draft = draft.tolist()
        k = _reach(draft, gen, t)
        counts.calls, counts.drafted, counts.kept = counts.calls + 1, counts.drafted + fed, counts.kept + k
        if noise and draft:
            checked = draft[: min(k + 1, len(draft))]
            for j, g in enumerate(_noise(text, t, checked)):
                record = counts.by_noise.setdefault(("first" if j == 0 else "later", _bucket(g)), [0, 0])
                record[0], record[1] = record[0] + (j < k), record[1] + 1
        t += k + 1
    return counts


def _reach(draft: Sequence[int], gen: list[int], t: int) -> int:
    """How many of the draft's first tokens the text goes on with from generated position t."""
    k = 0
    while k < len(draft) and t + k < len(gen) and draft[k] == gen[t + k]:
        k += 1
    return k


def _noise(text: Text, start: int, ids: Sequence[int]) -> list[float]:
    """The Gumbel noise the chain's draw adds to ids[j] at generated position start + j (the RNG position of a
    request counts the tokens it accepted)."""
    n = len(ids)
    return rng.gumbel(
        torch.full((n,), text.seed, dtype=torch.int64),
        torch.arange(start, start + n, dtype=torch.int64),
        torch.tensor(ids, dtype=torch.int64)[:, None],
        text.stream,
    )[:, 0].tolist()


def _bucket(g: float) -> int:
    return math.floor(min(max(g, BUCKETS[0]), BUCKETS[-1]) + 0.5)


def drawn_noise(texts: list[Text]) -> float:
    """The mean noise of the tokens the runs drew (a Gumbel's mean is 0.577 where the noise is not the draw's)."""
    values = [g for x in texts for g in _noise(x, 0, x.generated)]
    return sum(values) / max(len(values), 1)


# ----------------------------------------------------------------- policies
def lookup(occurrence: str, num_tokens: int) -> Policy:
    drafter = PromptLookup(PromptLookupParams(num_tokens=num_tokens, occurrence=occurrence))

    def propose(tokens: torch.Tensor, limit: int) -> tuple[torch.Tensor, int]:
        draft = drafter.propose(0, tokens, limit)
        return draft, len(draft)

    return propose


def every_occurrence(text: Text, max_ngram: int = 3, every_n: bool = False) -> Policy:
    """The continuation of an earlier occurrence of the longest matching n-gram that the text goes on with longest
    (`every_n`: of every matching n-gram, 1 to max_ngram tokens, what any lookup of the row's last tokens could
    draft); "fed": the distinct tokens of all the continuations (a tree's nodes)."""
    gen = text.generated

    def propose(tokens: torch.Tensor, limit: int) -> tuple[torch.Tensor, int]:
        t = len(tokens) - len(text.prompt)
        branches: set[tuple[int, ...]] = set()
        for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
            hits = (tokens.unfold(0, n, 1)[:-1] == tokens[-n:]).all(dim=1).nonzero().flatten().tolist()
            branches |= {tuple(tokens[h + n : h + n + limit].tolist()) for h in hits} - {()}
            if branches and not every_n:
                break
        if not branches:
            return tokens[:0], 0
        nodes = {branch[: j + 1] for branch in branches for j in range(len(branch))}
        best = max(sorted(branches), key=lambda branch: _reach(branch, gen, t))
        return torch.tensor(best, dtype=torch.int64), len(nodes)

    return propose


def copying_bound(text: Text) -> Policy:
    knows = bs.Knows([torch.tensor(text.prompt + text.generated)], copying=True)

    def propose(tokens: torch.Tensor, limit: int) -> tuple[torch.Tensor, int]:
        draft = knows.propose(0, tokens, limit)
        return draft, len(draft)

    return propose


# ----------------------------------------------------------------- where the copying bound's tokens come from
SOURCES = ("goes on", "near", "after its last token", "elsewhere")


def bound_sources(text: Text, num_tokens: int, max_new: int, near: int = 3) -> dict[str, list[int]]:
    """The copying bound's calls as `replay` makes them, by where the run each call keeps occurs earlier: where the
    passage of the row's last kept run goes on (counting one passage token per token drawn since: "goes on"),
    within `near` tokens of that ("near": words of the row's own in place of the passage's, longer or shorter),
    after an occurrence of the row's last token ("after its last token": what a lookup of one token finds) or
    elsewhere (nothing in the row's last tokens or its passage leads there). Of several occurrences, the first of
    those kinds that one is. Source -> [calls, kept tokens]."""
    prompt, gen = text.prompt, text.generated
    out = {source: [0, 0] for source in SOURCES}
    t, cursor = 1, None  # cursor: where in prompt + text the row's passage goes on
    while t < len(gen):
        tokens = torch.tensor(prompt + gen[:t], dtype=torch.int64)
        ahead = torch.tensor(gen[t : t + max(min(num_tokens, max_new - t - 1), 0)], dtype=torch.int64)
        k, starts = bs.occurring(tokens, ahead)
        if not k:
            t, cursor = t + 1, None if cursor is None else cursor + 1
            continue
        kinds = {
            "goes on": [s for s in starts if s == cursor],
            "near": [s for s in starts if cursor is not None and abs(s - cursor) <= near],
            "after its last token": [s for s in starts if s and tokens[s - 1] == tokens[-1]],
            "elsewhere": starts,
        }
        source = next(name for name in SOURCES if kinds[name])
        out[source][0] += 1
        out[source][1] += k
        t, cursor = t + k + 1, kinds[source][0] + k + 1
    return out


# ----------------------------------------------------------------- texts
def texts_of(model: Any, tok: Any, task: str, setting: str, n: int, prompts: int) -> list[Text]:
    """Each of the task's first `prompts` prompts and what generate() writes for it without a drafter (B = 1)."""
    chain = bs._chain(setting)
    out = []
    for batch in bs._runs(tok, task, 1, prompts):
        made = generate(model, tok, input_ids=batch.ids, attention_mask=batch.mask, max_new_tokens=n,
                        chain=chain, seed=bs.SEED)  # fmt: skip
        assert made.sequences is not None and made.num_generated is not None
        width = batch.ids.shape[1]
        prompt = batch.ids[0][batch.mask[0] == 1].tolist()
        generated = made.sequences[0, width : width + int(made.num_generated[0])].tolist()
        out.append(Text(prompt, generated, bs.SEED, len(chain["samplers"]) - 1))
    return out


def policies(text: Text, num_tokens: int) -> dict[str, Policy]:
    return {
        **{f"prompt_lookup ({o})": lookup(o, num_tokens) for o in OCCURRENCES},
        "every occurrence": every_occurrence(text),
        "every n-gram": every_occurrence(text, every_n=True),
        "copying bound": copying_bound(text),
    }


def measure(texts: list[Text], num_tokens: int, max_new: int, noise: bool) -> dict[str, Counts]:
    totals: dict[str, Counts] = {}
    for text in texts:
        for name, policy in policies(text, num_tokens).items():
            counted = replay(text, policy, num_tokens, max_new, noise and name == "prompt_lookup (switch)")
            totals.setdefault(name, Counts()).add(counted)
    return totals


def _from(calls: int, kept: int, total: int) -> str:
    """A source's share of the copying bound's kept tokens, its kept tokens and the tokens a call of it kept."""
    return f"{kept / max(total, 1):.2f} ({kept} in {calls} calls, {kept / calls if calls else 0:.1f} a call)"


def _share(kept: int, checked: int) -> str:
    return f"{kept / checked:.2f} ({kept}/{checked})" if checked else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--engine", default="transformers", choices=("transformers", "llama.cpp"))
    ap.add_argument("--tasks", default="code,list,quote", help=f"of {', '.join(bs.TASKS)}")
    ap.add_argument("--settings", default="greedy,sampling")
    ap.add_argument("--prompts", type=int, default=8, help="the first N prompts of each task (1-8)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--num-tokens", type=int, default=10, help="the draft length")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--markdown", action="store_true", help="print markdown tables (default: JSON)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = bs._load(args.engine, args.threads)
    rows, noise_rows, source_rows, checks = [], [], [], []
    for task in args.tasks.split(","):
        for setting in args.settings.split(","):
            texts = texts_of(model, tok, task, setting, args.max_new_tokens, args.prompts)
            sampled = setting != "greedy"
            for name, c in measure(texts, args.num_tokens, args.max_new_tokens, sampled).items():
                tree = " (tree)" if name.startswith("every") else ""
                rows.append([task, setting, name, f"{c.tokens / c.calls:.2f}", str(c.kept), f"{c.drafted}{tree}"])
                for part in ("first", "later") if c.by_noise else ():
                    cells = [_share(*c.by_noise.get((part, b), [0, 0])) for b in BUCKETS]
                    noise_rows.append([task, part, *cells])
            sources = {name: [0, 0] for name in SOURCES}
            for text in texts:
                for name, (calls, kept) in bound_sources(text, args.num_tokens, args.max_new_tokens).items():
                    sources[name][0], sources[name][1] = sources[name][0] + calls, sources[name][1] + kept
            total = sum(kept for _, kept in sources.values())
            source_rows.append([task, setting, *(_from(calls, kept, total) for calls, kept in sources.values())])
            if sampled:
                checks.append(f"{task}: the drawn tokens' mean noise {drawn_noise(texts):.2f} (a Gumbel's: 0.58)")
    header = ["task", "setting", "drafter", "tokens per call", "kept", "drafted"]
    noise_header = ["task", "drafted token", *(f"g ~ {b}" for b in BUCKETS)]
    noise_header[2], noise_header[-1] = f"g < {BUCKETS[0] + 0.5}", f"g >= {BUCKETS[-1] - 0.5}"
    source_header = ["task", "setting", *(f"copying bound: {name}" for name in SOURCES)]
    if not args.markdown:
        print(json.dumps({"replay": [dict(zip(header, r)) for r in rows],
                          "noise": [dict(zip(noise_header, r)) for r in noise_rows],
                          "sources": [dict(zip(source_header, r)) for r in source_rows], "checks": checks}, indent=2))  # fmt: skip
        return 0
    for head, body in ((header, rows), (noise_header, noise_rows), (source_header, source_rows)):
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        print("\n".join("| " + " | ".join(r) + " |" for r in body) + "\n")
    print("\n".join(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
