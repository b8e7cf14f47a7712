"""Benchmark: speculative decoding (generate(..., draft=...)) on SmolLM2-135M-Instruct, side by side.

Five sections; within each cell the configurations run interleaved, one run of each per repetition with the order
rotating, so a slow spell of a shared host lands on all of them alike. Tokens per second count the tokens every row
generated (to its end-of-turn token or --max-new-tokens) over the wall time of the whole call, prefill included;
reported are the median over --reps and the range (lowest-highest). The first run of every configuration is its
set-up and warm-up, untimed: a drafter or mode that is not installed or refuses the settings prints "n/a" with the
reason there, and the other rows go on.

1. Prompt lookup speed. Tasks that quote or edit a given passage (`code`: rewrite a ~30-line Python function with
   one variable renamed; `list`: repeat a 20-item list with one item changed; `quote`: answer a question by quoting
   sentences of a ~200-word text) and free chat (`chat`: open questions), rendered with the model's chat template;
   B = 1 is the first --prompts prompts of a task (4 by default) run one after another, their tokens and times
   added, B = 8 one batch of eight different prompts. For each engine (llama.cpp, the default,
   loaded with flash attention so that a multi-token pass gives the logits of one-token steps; transformers, the
   dequantized model), greedy and seeded sampling (temperature 0.8 -> top_k 40 -> top_p 0.95 -> min_p 0.05 -> dist,
   as bench_engines.py): generate() without a drafter against draft="prompt_lookup". Printed: both speeds, the
   ratio (median of the per-repetition ratios, and their range), the target (>= 2x at B = 1 and >= 1.5x at B = 8 on
   the quote / edit tasks, >= 0.95x on chat) with met / MISSED, kept / drafted and tokens per model call. With
   --occurrence (say switch,follow), prompt lookup with each of those `occurrence`s, side by side.
2. transformers' own speculative generation, B = 1, transformers engine, greedy and sampling with the same values:
   model.generate(prompt_lookup_num_tokens=10, max_matching_ngram_size=3), model.generate(assistant_early_exit=N)
   (where transformers refuses it: assistant_model = the first N layers) and model.generate(assistant_model=<the
   first N layers>) against generate() with prompt_lookup / early_exit / draft_model (the same first N layers), plus
   both without speculation; the ratio ours / theirs (> 1: ours is faster).
3. Coupling. One sampling chain at temperature 1 (dist alone, seeded), B = 1, the early_exit and draft_model
   drafters at a fixed draft length (their num_tokens, `adaptive = false`): kept / drafted for the `match` mode with
   coupled noise, the `rejection` mode (independent noise) and `match` with independent noise.
4. The model-running drafters at B = 1 and 8 (--batch), transformers engine, greedy and sampling: generate() with
   early_exit (on the generation's cache, and on a cache of its own as on a sliding-window model) and with
   draft_model (the first N layers) against generate() without a drafter, interleaved; --p-min adds both drafters
   ending their drafts at each of those confidence thresholds.

5. What drafting can give on the same texts (--sections 5, not run by default), per engine, task, B and setting:
   prompt lookup against a drafter that knows each row's text (from the run without a drafter) and proposes the
   longest run of its next tokens that occurs earlier in the row's prompt and text so far (the "copying bound": no
   drafter that copies from them keeps more, whichever earlier occurrence it picks) and one that proposes the text
   itself (every draft kept: no drafter keeps more), each against generate() without a drafter, interleaved.

--guidance SCALE runs sections 1, 4 and 5 under classifier-free guidance: cfg at that scale first in every chain and
a negative prompt for every row (NEGATIVE_PROMPT), with and without the drafters alike.

"same tokens": every run of a configuration whose mode promises the tokens of the run without a drafter (`match`,
greedy or seeded) is compared with that run; "NO" (also on stderr) says how many runs differed and where. Rows
where nothing is promised (rejection; transformers' sampling) say what they got in brackets.

The full run (about 1,100 generations of up to 256 tokens per row; on an otherwise idle host):

    .venv/bin/python benchmarks/bench_speculative.py --markdown --reps 5 --max-new-tokens 256 --json spec.json

A quick look: --sections 1 --engines llama.cpp --tasks code,chat --batch 1 --reps 1 --max-new-tokens 32.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import attrs
import torch

from samplechain.drafters import Drafter
from samplechain.errors import GenerationWarning
from samplechain.generation import generate
from samplechain.generation.model import TransformersRunner
from samplechain.tools.bench import write_json

SEED = 1234
VALUES = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0.8}
# --guidance: classifier-free guidance (cfg first in every chain of sections 1, 4 and 5) against this negative prompt
NEGATIVE_PROMPT = "Answer in your own words."
EDIT_TASKS = ("code", "list", "quote")
TASKS = (*EDIT_TASKS, "chat")

# ----------------------------------------------------------------- prompts
CODE = '''def {fn}({src}, limit={lim}):
    """Return the share of each {rec} in {src}, at most `limit` of them, largest first."""
    {out} = []
    {seen} = set()
    {count} = 0
    for {rec} in {src}:
        if {rec} is None:
            continue
        key = {rec}.get("{key}")
        if key in {seen}:
            continue
        {seen}.add(key)
        value = {rec}.get("{field}", 0)
        if value < {low}:
            value = {low}
        elif value > {high}:
            value = {high}
        {out}.append((key, value))
        {count} += 1
        if {count} >= limit:
            break
    {out}.sort(key=lambda pair: pair[1], reverse=True)
    total = sum(value for _, value in {out})
    if total == 0:
        return []
    result = []
    for key, value in {out}:
        share = round(value / total, {digits})
        result.append({{"key": key, "share": share, "{field}": value}})
    return result
'''
CODE_NAMES = {
    "fn": "top_shares rank_orders weigh_users best_items lead_regions main_sources peak_hours core_tags",
    "src": "records orders users items regions sources hours tags",
    "rec": "record order user item region source hour tag",
    "out": "pairs rows entries picks slots found kept chosen",
    "seen": "seen_keys done visited known used taken met listed",
    "count": "count kept_n added n_done tally num_seen steps hits",
    "new": "kept_count n_kept num_added done_count running tally_n step_count hit_count",
    "key": "id sku user_id code name url hour tag",
    "field": "score amount visits price sales hits load weight",
}
GROCERIES = (
    "apples bananas carrots onions potatoes tomatoes lemons garlic rice pasta flour sugar butter cheese yoghurt eggs "
    "milk bread honey coffee tea salt pepper beans lentils spinach mushrooms peppers cucumbers oranges grapes pears "
    "peaches cherries almonds walnuts oats cereal jam olives"
).split()
REPLACEMENTS = "plums melons leeks radishes celery ginger basil parsley".split()
TEXT = [
    "{town} is a small town on the river {river}, about {km} kilometres from the coast.",
    "It was founded in {year} by a group of {trade} who came down from the hills to the north.",
    "The old stone bridge in the centre of the town was built in {bridge} and still carries traffic today.",
    "Every {day} morning a market fills the main square with fruit, cheese, bread and {goods}.",
    "The town has {schools} schools, a small hospital and a library that opened in {library}.",
    "Most people work in {industry}, although tourism has grown quickly over the last twenty years.",
    "In summer the river is warm enough for swimming, and boats can be hired near the bridge.",
    "The winters are cold and wet, and snow falls on the hills around the town most years.",
    "A festival of music and food takes place every {month}, and it draws visitors from across the region.",
    "The museum next to the town hall shows tools, photographs and letters from the first settlers.",
    "A railway line reached the town in {rail}, and trains now run to the capital {trains} times a day.",
    "The population is about {people} people, and it has stayed nearly the same for a decade.",
    "Local people are proud of their {dish}, a dish made with river fish, potatoes and herbs.",
    "Visitors are often surprised by how quiet the streets are after eight in the evening.",
]
TEXT_NAMES = {
    "town": "Millbrook,Ashford,Kelton,Brindle,Harwick,Orsby,Tamley,Fenwick",
    "river": "Avon,Lune,Esk,Tavy,Wye,Ure,Nidd,Dart",
    "trade": "farmers,weavers,miners,potters,millers,masons,fishermen,carpenters",
    "day": "Saturday,Friday,Tuesday,Sunday,Wednesday,Thursday,Monday,Saturday",
    "goods": "flowers,honey,wool,pottery,candles,baskets,jam,cider",
    "industry": "farming,forestry,textiles,quarrying,dairy,boatbuilding,printing,brewing",
    "month": "June,July,August,May,September,June,July,August",
    "dish": "river pie,fish stew,herb soup,baked trout,potato cake,fish pie,hot pot,green broth",
}
QUESTIONS = [
    "When was the bridge built, and when did the railway reach the town?",
    "What happens at the market and at the festival?",
    "How many people live in the town, and what do most of them work in?",
    "What is the town like in summer and in winter?",
]
CHAT = [
    "What makes a good friend?",
    "Why do people enjoy music?",
    "What are some ways to stay focused while studying?",
    "How would you explain the seasons to a child?",
    "What should someone consider before adopting a dog?",
    "Why is sleep important for health?",
    "What are the benefits of learning a second language?",
    "How can a small town attract more visitors?",
]


def _code(i: int) -> str:
    rnd = random.Random(i)
    names = {slot: words.split()[i % 8] for slot, words in CODE_NAMES.items()}
    low = rnd.randint(0, 5)
    code = CODE.format(
        **names, lim=rnd.randint(5, 50), low=low, high=low + rnd.randint(50, 500), digits=rnd.randint(2, 4)
    )
    return (
        f"Rewrite this Python function with the variable `{names['count']}` renamed to `{names['new']}` everywhere. "
        f"Reply with the whole function only.\n\n```python\n{code}```"
    )


def _list(i: int) -> str:
    items = random.Random(i).sample(GROCERIES, 20)
    k = (7 * i + 3) % 20
    listed = "\n".join(f"{j + 1}. {item}" for j, item in enumerate(items))
    # the instruction before the list: after it, SmolLM2-135M answers with a list of its own instead of a copy
    change = f'Replace "{items[k]}" with "{REPLACEMENTS[i % 8]}"'
    return f"{change} in this shopping list and write out the whole new list.\n\n{listed}"


def _quote(i: int) -> str:
    rnd = random.Random(100 + i)
    values: dict[str, Any] = {slot: words.split(",")[i % 8] for slot, words in TEXT_NAMES.items()}
    values.update(km=rnd.randint(10, 90), year=rnd.randint(1100, 1600), schools=rnd.randint(2, 6))
    values.update(bridge=rnd.randint(1600, 1800), library=rnd.randint(1880, 1990), rail=rnd.randint(1840, 1900))
    values.update(trains=rnd.randint(4, 20), people=rnd.randint(20, 90) * 100)
    text = " ".join(s.format(**values) for s in TEXT)
    # the instruction and the question before the text, as in the other tasks (SmolLM2-135M quotes more then)
    return (
        "Answer the question by quoting, word for word, the sentences of the text that answer it.\n\n"
        f"Question: {QUESTIONS[i % len(QUESTIONS)]}\n\nText:\n{text}"
    )


PROMPTS: dict[str, Callable[[int], str]] = {"code": _code, "list": _list, "quote": _quote, "chat": CHAT.__getitem__}


@dataclass(frozen=True)
class Plan:
    max_new_tokens: int
    reps: int
    prompts: int  # B = 1 runs this many prompts of a task, one after another
    guidance: float | None = None  # sections 1, 4 and 5: classifier-free guidance at this scale (_settings)


@dataclass
class Batch:
    ids: torch.Tensor  # (B, width) left-padded chat-rendered prompts
    mask: torch.Tensor


def _runs(tok: Any, task: str, b: int, prompts: int) -> list[Batch]:
    """What one run of a cell generates: at B = 1 the first `prompts` prompts of `task`, one after another (one
    prompt would make a task's speed the speed of whatever that prompt's answer happens to be); at B > 1 one batch
    of the first B prompts."""
    if b == 1:
        return [_batch(tok, task, [i]) for i in range(prompts)]
    return [_batch(tok, task, range(b))]


def _batch(tok: Any, task: str, which: Iterable[int]) -> Batch:
    """Prompts `which` of `task`, each rendered as a one-message conversation as generate() renders it,
    left-padded."""
    rows = []
    for i in which:
        text = tok.apply_chat_template(
            [{"role": "user", "content": PROMPTS[task](i % 8)}], add_generation_prompt=True, tokenize=False
        )
        rows.append(tok(text, add_special_tokens=False)["input_ids"])
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), _pad(tok), dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for j, r in enumerate(rows):
        ids[j, width - len(r) :] = torch.tensor(r)
        mask[j, width - len(r) :] = 1
    return Batch(ids, mask)


def _pad(tok: Any) -> int:
    return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)


# ----------------------------------------------------------------- runs
@dataclass
class Sample:
    wall: float
    tokens: int  # generated tokens, all rows
    sequences: list[list[int]]
    drafted: int | None = None
    kept: int | None = None
    calls: int | None = None

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall


def _chain(setting: str) -> dict[str, Any]:
    if setting == "greedy":
        return {"samplers": [{"use": "greedy"}]}
    if setting == "t=1":
        return {"samplers": [{"use": "dist"}]}
    return {
        "samplers": [
            {"use": "temperature", "t": VALUES["temperature"]},
            {"use": "top_k", "k": VALUES["top_k"]},
            {"use": "top_p", "p": VALUES["top_p"]},
            {"use": "min_p", "p": VALUES["min_p"]},
            {"use": "dist"},
        ]
    }


def _settings(setting: str, n: int, guidance: float | None) -> dict[str, Any]:
    """generate()'s chain, seed and length for `setting`; with `guidance`, cfg at that scale first in the chain and
    NEGATIVE_PROMPT for every row."""
    kw: dict[str, Any] = {"max_new_tokens": n, "chain": _chain(setting), "seed": SEED}
    if guidance is not None:
        kw["chain"]["samplers"].insert(0, {"use": "cfg", "scale": guidance})
        kw["negative_prompt"] = NEGATIVE_PROMPT
    return kw


def _ours(
    model: Any, tok: Any, batches: list[Batch], setting: str, n: int, draft: Any = None, guidance: float | None = None
) -> Callable[[], Sample]:
    """A run of samplechain's generate() over `batches`, one after another, seeded; with `draft` only where given."""
    kw = _settings(setting, n, guidance)
    if draft is not None:
        kw["draft"] = draft

    def total(t: torch.Tensor | None) -> int | None:
        return None if t is None else int(t.sum())

    def one(batch: Batch) -> Sample:
        start = time.perf_counter()
        out = generate(model, tok, input_ids=batch.ids, attention_mask=batch.mask, **kw)
        wall = time.perf_counter() - start
        assert out.sequences is not None and out.num_generated is not None
        made, seqs = int(out.num_generated.sum()), out.sequences.tolist()
        return Sample(wall, made, seqs, total(out.drafted), total(out.kept), total(out.model_calls))

    return lambda: _summed([one(batch) for batch in batches])


def _summed(samples: list[Sample]) -> Sample:
    """The runs of one cell as one sample: times and counts added, the rows of every run in turn."""

    def add(values: list[int | None]) -> int | None:
        return None if None in values else sum(v or 0 for v in values)

    return Sample(
        sum(s.wall for s in samples),
        sum(s.tokens for s in samples),
        [row for s in samples for row in s.sequences],
        add([s.drafted for s in samples]),
        add([s.kept for s in samples]),
        add([s.calls for s in samples]),
    )


def _theirs(
    model: Any, batches: list[Batch], setting: str, n: int, pad: int, extra: dict[str, Any]
) -> Callable[[], Sample]:
    """A run of transformers' model.generate over `batches` (one prompt each), one after another, with the same
    values (torch seeded before each call)."""
    kw: dict[str, Any] = {"max_new_tokens": n, "pad_token_id": pad, **extra}
    if setting == "greedy":
        kw.update(do_sample=False, temperature=None, top_k=None, top_p=None, min_p=None)
    else:
        kw.update(do_sample=True, **VALUES)

    def one(batch: Batch) -> Sample:
        torch.manual_seed(SEED)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model.generate(input_ids=batch.ids, attention_mask=batch.mask, **kw)
        wall = time.perf_counter() - start
        return Sample(wall, out.shape[0] * (out.shape[1] - batch.ids.shape[1]), out.tolist())  # B = 1: no padding

    return lambda: _summed([one(batch) for batch in batches])


@dataclass
class Measured:
    first: Sample | None  # the warm-up run; None when the configuration failed to set up
    timed: list[Sample]
    reason: str = ""  # why it is n/a
    note: str = ""  # a warning its warm-up raised (a drafter switched off, ...)


def _interleave(configs: dict[str, Callable[[], Sample]], reps: int) -> dict[str, Measured]:
    """One untimed set-up / warm-up run of each configuration (a failure there makes it n/a, with the reason), then
    `reps` rounds with one run of each, the order rotating by one every round."""
    result: dict[str, Measured] = {}
    for name, run in configs.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result[name] = Measured(run(), [])
            except Exception as exc:  # noqa: BLE001 - a drafter, mode or option not available here: n/a
                reason = f"{type(exc).__name__}: {exc}".strip()
                print(f"  n/a {name}: {reason}", file=sys.stderr, flush=True)
                result[name] = Measured(None, [], reason.splitlines()[0][:140])
                continue
        notes = [str(w.message) for w in caught if issubclass(w.category, GenerationWarning)]
        result[name].note = notes[0].splitlines()[0] if notes else ""
    live = [name for name, m in result.items() if m.first is not None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rep in range(reps):
            k = rep % len(live) if live else 0
            for name in live[k:] + live[:k]:
                result[name].timed.append(configs[name]())
    return result


# ----------------------------------------------------------------- statistics
def _spread(values: list[float]) -> tuple[float, float, float] | None:
    return (statistics.median(values), min(values), max(values)) if values else None


def _speed(m: Measured) -> tuple[float, float, float] | None:
    return _spread([s.tok_s for s in m.timed])


def _ratio(a: Measured, b: Measured) -> tuple[float, float, float] | None:
    """a's tokens/s over b's, per repetition (the runs of one round side by side)."""
    return _spread([x.tok_s / y.tok_s for x, y in zip(a.timed, b.timed)])


def _acceptance(m: Measured) -> tuple[str, str]:
    """The share of drafted tokens kept (with both counts) and the generated tokens per model call, of the warm-up
    run (seeded: every run drafts alike)."""
    s = m.first
    if s is None or s.drafted is None:
        return "n/a", "n/a"
    kept = f"{(s.kept or 0) / s.drafted:.2f}" if s.drafted else "-"
    return f"{kept} ({s.kept}/{s.drafted})", _num(s.tokens / s.calls if s.calls else None)


def _same(m: Measured, base: Measured, promised: bool, label: str) -> str:
    """Whether every run of `m` gave the tokens of the run without a drafter; a mismatch is printed on stderr."""
    if m.first is None or base.first is None:
        return "n/a"
    want = base.first.sequences
    runs = [m.first, *m.timed]
    bad = [s for s in runs if s.sequences != want]
    if not bad:
        return "yes" if promised else "(yes)"
    if not promised:
        return "(no)"
    got = bad[0].sequences
    row = next(r for r in range(len(want)) if r >= len(got) or got[r] != want[r])
    pos = next((p for p, (x, y) in enumerate(zip(got[row], want[row])) if x != y), min(len(got[row]), len(want[row])))
    print(f"  MISMATCH {label}: {len(bad)}/{len(runs)} runs differ (row {row}, position {pos})", file=sys.stderr)
    return f"NO ({len(bad)}/{len(runs)} runs)"


def _fmt(v: tuple[float, float, float] | None, suffix: str = "") -> str:
    if v is None:
        return "n/a"
    digits = 2 if suffix == "x" else 1
    return f"{v[0]:.{digits}f}{suffix} ({v[1]:.{digits}f}-{v[2]:.{digits}f})"


def _num(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)  # the warnings its configurations raised, each once

    def add(self, row: list[str]) -> None:
        """A row, printed on stderr as it comes."""
        self.rows.append(row)
        print("| " + " | ".join(row) + " |", file=sys.stderr, flush=True)

    def noted(self, m: Measured) -> str:
        """A mark for a cell of `m`'s row that points to the warning its warm-up raised, listed under the table."""
        if not m.note:
            return ""
        if m.note not in self.notes:
            self.notes.append(m.note)
        return f" [{self.notes.index(m.note) + 1}]"

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        notes = [f"[{i}] warning: {note}" for i, note in enumerate(self.notes, 1)]
        return "\n".join(lines + ([""] + notes if notes else []))

    def records(self) -> dict[str, Any]:
        return {"rows": [dict(zip(self.header, r)) for r in self.rows], "warnings": self.notes}


# ----------------------------------------------------------------- models
def _load(engine: str, threads: int, gguf: str | None = None, kv_cache: str = "f16") -> tuple[Any, Any]:
    if engine == "llama.cpp":
        import llama_cpp

        from samplechain.models import default_gguf_path
        from samplechain_llama_cpp import load_gguf

        # a multi-token decode (the prefill, a draft's check) runs on n_threads_batch, which would otherwise be every
        # core: on a busy host its spinning threads make a draft's check cost seconds
        kw: dict[str, Any] = {"n_threads": threads, "n_threads_batch": threads}
        if kv_cache != "f16":
            kw["type_k"] = kw["type_v"] = getattr(llama_cpp, f"GGML_TYPE_{kv_cache.upper()}")
        return load_gguf(gguf or default_gguf_path(), n_ctx=2048, flash_attn=True, **kw)
    from samplechain.models import load_model

    return load_model(engine="transformers")


def _first_layers(model: Any, layers: int) -> Any:
    """A copy of a transformers decoder-only model with its first `layers` layers (the embeddings, final norm and
    head kept): the draft model of sections 2 and 3."""
    base = getattr(model, model.base_model_prefix)
    every = base.layers
    base.layers = every[:layers]
    try:
        small = copy.deepcopy(model)
    finally:
        base.layers = every
    small.config.num_hidden_layers = layers
    getattr(small, small.base_model_prefix).config.num_hidden_layers = layers
    return small.eval()


def _target(task: str, b: int) -> float:
    return 0.95 if task not in EDIT_TASKS else 2.0 if b == 1 else 1.5


# ----------------------------------------------------------------- sections
S1_HEADER = (
    "engine|task|B|setting|no drafter tok/s|prompt_lookup tok/s|ratio|target|met|kept/drafted|tok/call|same tokens"
).split("|")
S4_HEADER = (
    "engine|task|B|setting|drafter|no drafter tok/s|drafter tok/s|ratio|kept/drafted|tok/call|same tokens"
).split("|")


def _against_none(
    table: Table, engines: dict[str, tuple[Any, Any]], tasks: list[str], batches: list[int], plan: Plan,
    drafters: dict[str, Any] | Callable[[Any, Any, list[Batch], str, int], dict[str, Any]], targeted: bool,
    named: bool = False,
) -> Table:  # fmt: skip
    """Each drafter against generate() without one, per engine, task, batch size and setting, interleaved; with
    `targeted`, the prompt-lookup targets' columns instead of the drafter's name (and the name too with `named`).
    `drafters` may be a function of (model, tokenizer, runs, setting, max_new_tokens) giving them per cell."""
    for engine, (model, tok) in engines.items():
        for task in tasks:
            for b in batches:
                runs, n = _runs(tok, task, b, plan.prompts), plan.max_new_tokens
                for setting in ("greedy", "sampling"):
                    cell = drafters(model, tok, runs, setting, n) if callable(drafters) else drafters
                    g = plan.guidance
                    configs = {"none": _ours(model, tok, runs, setting, n, guidance=g)}
                    configs |= {name: _ours(model, tok, runs, setting, n, d, g) for name, d in cell.items()}
                    m = _interleave(configs, plan.reps)
                    base = m["none"]
                    for name in cell:
                        spec = m[name]
                        ratio, target = _ratio(spec, base), _target(task, b)
                        accept, per_call = _acceptance(spec)
                        same = _same(spec, base, True, f"{engine} {task} B={b} {setting} {name}")
                        speed = _fmt(_speed(spec)) if spec.first else f"n/a: {spec.reason}"
                        cells = [engine, task, str(b), setting] + ([name] if named or not targeted else [])
                        cells += [_fmt(_speed(base)), speed, _fmt(ratio, "x")]
                        if targeted:
                            met = "n/a" if ratio is None else "met" if ratio[0] >= target else "MISSED"
                            cells += [f">= {target:g}x", met]
                        table.add([*cells, accept, per_call, same + table.noted(spec)])
    return table


def section1(
    engines: dict[str, tuple[Any, Any]], tasks: list[str], batches: list[int], plan: Plan, occurrences: list[str]
) -> Table:
    """Prompt lookup against no drafter, per engine, task, batch size and setting; with `occurrences`, prompt lookup
    with each of them (its `occurrence`), side by side, a column naming it."""
    if not occurrences:
        table = Table("Prompt lookup against no drafter", S1_HEADER, [])
        return _against_none(table, engines, tasks, batches, plan, {"prompt_lookup": "prompt_lookup"}, True)
    header = [*S1_HEADER[:4], "occurrence", *S1_HEADER[4:]]
    table = Table("Prompt lookup against no drafter, by occurrence", header, [])
    drafters = {o: {"use": "prompt_lookup", "occurrence": o} for o in occurrences}
    return _against_none(table, engines, tasks, batches, plan, drafters, True, named=True)


def section4(
    model: Any, tok: Any, tasks: list[str], batches: list[int], plan: Plan, layers: int, p_mins: Sequence[float] = ()
) -> Table:
    """The model-running drafters against no drafter on the transformers engine, B = 1 and 8; with `p_mins`, also
    early_exit and draft_model ending their drafts at each of those confidence thresholds (`p_min`)."""
    table = Table(f"early_exit and draft_model ({layers} layers) against no drafter", S4_HEADER, [])
    from samplechain_early_exit import EarlyExit, EarlyExitParams

    class OwnCache(EarlyExit):
        """early_exit kept off the generation's cache: a cache of its own, filled on its first draft."""

        def start(self, rows: int, context: Any) -> None:
            super().start(rows, attrs.evolve(context, generation_runner=None))

    drafters = {
        "early_exit": {"use": "early_exit", "layers": layers},
        "early_exit, own cache": {"use": OwnCache(EarlyExitParams(layers=layers))},
        "draft_model": {"use": "draft_model", "model": _first_layers(model, layers)},
    }
    for p in p_mins:
        drafters[f"early_exit, p_min {p:g}"] = {"use": "early_exit", "layers": layers, "p_min": p}
        drafters[f"draft_model, p_min {p:g}"] = {**drafters["draft_model"], "p_min": p}
    return _against_none(table, {"transformers": (model, tok)}, tasks, batches, plan, drafters, False)


class Knows(Drafter):
    """Knows each row's text in the run without a drafter (its prompt and what it generated) and proposes its next
    tokens: all of them (`copying = False`: every draft is kept, the most any drafter can give), or only the longest
    run of them that occurs earlier in the row's prompt and text so far (`copying = True`: the most any drafter that
    copies from them, as prompt lookup does, can keep, had it always picked the right earlier occurrence)."""

    name = "knows"

    def __init__(self, texts: list[torch.Tensor], copying: bool) -> None:
        super().__init__()
        self.texts, self.copying = texts, copying
        self._text: dict[int, torch.Tensor] = {}  # row -> the text it writes, once found

    def expect(self, row: int, tokens: torch.Tensor) -> tuple[str, float] | None:
        """Certain: the draft lengths draft as long as pays from the first draft on."""
        return ("known", 1.0) if len(self.propose(row, tokens, 1)) else None

    def _text_of(self, row: int, tokens: torch.Tensor) -> torch.Tensor | None:
        n = len(tokens)
        known = self._text.get(row)
        if known is None or len(known) <= n or not torch.equal(known[:n], tokens):
            known = next((t for t in self.texts if len(t) > n and torch.equal(t[:n], tokens)), None)
            if known is not None:
                self._text[row] = known
        return known

    def propose(self, row: int, tokens: torch.Tensor, limit: int) -> torch.Tensor:
        n = len(tokens)
        text = self._text_of(row, tokens)
        if text is None:
            return tokens[:0]
        ahead = text[n : n + limit]
        if not self.copying:
            return ahead
        return ahead[: occurring(tokens, ahead)[0]]


def occurring(tokens: torch.Tensor, ahead: torch.Tensor) -> tuple[int, list[int]]:
    """(k, starts): the longest prefix of `ahead` that occurs in `tokens` (k tokens) and the positions in `tokens`
    where it does (none where k is 0)."""
    k, starts = 0, []
    while k < len(ahead) and k < len(tokens):
        hits = (tokens.unfold(0, k + 1, 1) == ahead[: k + 1]).all(dim=1).nonzero().flatten().tolist()
        if not hits:
            break
        k, starts = k + 1, hits
    return k, starts


def _texts(model: Any, tok: Any, runs: list[Batch], setting: str, n: int, guidance: float | None) -> list[torch.Tensor]:
    """Each row's prompt (without padding) and generated tokens, in the run without a drafter."""
    texts = []
    for batch in runs:
        kw = _settings(setting, n, guidance)
        out = generate(model, tok, input_ids=batch.ids, attention_mask=batch.mask, **kw)
        assert out.sequences is not None and out.num_generated is not None
        width = batch.ids.shape[1]
        for j in range(batch.ids.shape[0]):
            prompt = batch.ids[j][batch.mask[j] == 1]
            texts.append(torch.cat([prompt, out.sequences[j, width : width + int(out.num_generated[j])]]))
    return texts


def section5(engines: dict[str, tuple[Any, Any]], tasks: list[str], batches: list[int], plan: Plan) -> Table:
    """Prompt lookup against what drafting can give on the same texts: a drafter that knows the text and copies
    only from the prompt and text so far, and one that proposes the text itself."""
    table = Table("Prompt lookup against the copying bound and a drafter always right", S4_HEADER, [])

    def drafters(model: Any, tok: Any, runs: list[Batch], setting: str, n: int) -> dict[str, Any]:
        texts = _texts(model, tok, runs, setting, n, plan.guidance)
        return {
            "prompt_lookup": "prompt_lookup",
            "copying bound": {"use": Knows(texts, copying=True)},
            "always right": {"use": Knows(texts, copying=False)},
        }

    return _against_none(table, engines, tasks, batches, plan, drafters, False)


S2_HEADER = (
    "setting|task|method|samplechain tok/s|transformers tok/s|samplechain / transformers|kept/drafted (ours)|"
    "same tokens (ours, theirs)"
).split("|")


def _early_exit_theirs(model: Any, small: Any, runs: list[Batch], setting: str, n: int, pad: int, layers: int):
    """model.generate(assistant_early_exit=layers), or with assistant_model = the first `layers` layers where
    transformers refuses early exit on this model; and the label of what ran."""
    batch = runs[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.generate(
                input_ids=batch.ids, attention_mask=batch.mask, max_new_tokens=2, do_sample=False,
                pad_token_id=pad, assistant_early_exit=layers,
            )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - early exit unsupported here: the truncated model instead
        extra, label = {"assistant_model": small}, f"assistant_model=first {layers} layers ({type(exc).__name__})"
    else:
        extra, label = {"assistant_early_exit": layers}, f"assistant_early_exit={layers}"
    return _theirs(model, runs, setting, n, pad, extra), label


def section2(model: Any, tok: Any, tasks: list[str], plan: Plan, layers: int) -> Table:
    """samplechain's speculative generate() against transformers' own, B = 1, transformers engine."""
    small, pad, n = _first_layers(model, layers), _pad(tok), plan.max_new_tokens
    table = Table("samplechain against transformers' speculative generation (B = 1)", S2_HEADER, [])
    for setting in ("greedy", "sampling"):
        for task in tasks:
            runs = _runs(tok, task, 1, plan.prompts)
            ee_theirs, ee_label = _early_exit_theirs(model, small, runs, setting, n, pad, layers)
            methods = {
                "none": (None, {}, "no speculation"),
                "prompt_lookup": (
                    {"use": "prompt_lookup", "num_tokens": 10, "max_ngram": 3},
                    {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 3},
                    "prompt_lookup_num_tokens=10",
                ),
                "early_exit": ({"use": "early_exit", "layers": layers}, None, ee_label),
                "draft_model": (
                    {"use": "draft_model", "model": small},
                    {"assistant_model": small},
                    f"assistant_model=first {layers} layers",
                ),
            }
            configs: dict[str, Callable[[], Sample]] = {}
            for name, (draft, extra, _) in methods.items():
                configs[f"ours {name}"] = _ours(model, tok, runs, setting, n, draft=draft)
                configs[f"theirs {name}"] = ee_theirs if extra is None else _theirs(model, runs, setting, n, pad, extra)
            m = _interleave(configs, plan.reps)
            for name, (_, _, label) in methods.items():
                ours, theirs = m[f"ours {name}"], m[f"theirs {name}"]
                who = f"{setting} {task} {name}"
                same_ours = "-" if name == "none" else _same(ours, m["ours none"], True, f"ours {who}")
                same_theirs = "-" if name == "none" else _same(theirs, m["theirs none"], setting == "greedy", who)
                accept, _ = _acceptance(ours)
                speed = _fmt(_speed(ours)) if ours.first else f"n/a: {ours.reason}"
                theirs_speed = _fmt(_speed(theirs)) if theirs.first else f"n/a: {theirs.reason}"
                cells = [setting, task, f"{name} / {label}", speed, theirs_speed, _fmt(_ratio(ours, theirs), "x")]
                cells += [accept, f"{same_ours}, {same_theirs}" + table.noted(ours)]
                table.add(cells)
    return table


S3_HEADER = "engine|task|drafter|configuration|kept/drafted|tok/call|tok/s|same tokens".split("|")
COUPLING = {  # configuration -> (the draft table's mode, its noise); mode None: the default, match
    "match, coupled noise": (None, "coupled"),
    "rejection, independent noise": ("rejection", "independent"),
    "match, independent noise": (None, "independent"),
}


def section3(engines: dict[str, tuple[Any, Any]], small: Any, tasks: list[str], plan: Plan, layers: int) -> Table:
    """Acceptance of the same drafters under the three ways of verifying, at temperature 1, B = 1."""
    table = Table("Coupling: kept / drafted at temperature 1 (B = 1)", S3_HEADER, [])
    drafters = {
        "early_exit": {"use": "early_exit", "layers": layers},
        "draft_model": {"use": "draft_model", "model": small},
    }
    for engine, (model, tok) in engines.items():
        for task in tasks:
            runs, n = _runs(tok, task, 1, plan.prompts), plan.max_new_tokens
            configs = {"none": _ours(model, tok, runs, "t=1", n)}
            for drafter, entry in drafters.items():
                for config, (mode, noise) in COUPLING.items():
                    # a fixed length: every configuration checks drafts of num_tokens, whatever it keeps
                    draft = {**entry, "noise": noise, "adaptive": False} | ({} if mode is None else {"mode": mode})
                    configs[f"{drafter}: {config}"] = _ours(model, tok, runs, "t=1", n, draft=draft)
            m = _interleave(configs, plan.reps)
            for drafter in drafters:
                for config, (mode, _) in COUPLING.items():
                    got = m[f"{drafter}: {config}"]
                    accept, per_call = _acceptance(got)
                    label = f"{engine} {task} {drafter} {config}"
                    same = _same(got, m["none"], mode is None, label) + table.noted(got)
                    kept = accept if got.first else f"n/a: {got.reason}"
                    table.add([engine, task, drafter, config, kept, per_call, _fmt(_speed(got)), same])
    return table


# ----------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument(
        "--sections",
        default="1,2,3,4",
        help="which of 1 (prompt lookup), 2 (transformers), 3 (coupling), 4 (model drafters against no drafter), "
        "5 (prompt lookup against the copying bound)",
    )
    ap.add_argument("--engines", default="llama.cpp,transformers", help="engines of sections 1, 3 and 5")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"of {', '.join(TASKS)}")
    ap.add_argument(
        "--batch", default="1,8", help="the batch sizes of sections 1, 4 and 5 (sections 2 and 3 run B = 1)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--prompts", type=int, default=4, help="B = 1 runs the first N prompts of a task one after another (1-8)"
    )
    ap.add_argument("--layers", type=int, default=24, help="early exit / draft model: the first N of the 30 layers")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--gguf", default=None, help="the llama.cpp engine's model file (default: the default model's Q4_1 GGUF)"
    )
    ap.add_argument(
        "--kv-cache",
        default="f16",
        choices=("f16", "q8_0"),
        help="the llama.cpp engine's KV cache type (q8_0: a one-token decode past 256 tokens on several threads "
        "runs the attention code of a check, docs/speculative.md)",
    )
    ap.add_argument(
        "--fast-steps",
        action="store_true",
        help="the transformers runner's steps in its own products (TransformersRunner.fast_steps), with and "
        "without a drafter",
    )
    ap.add_argument(
        "--batch-invariant",
        action="store_true",
        help="the transformers runner's batch-invariant passes (TransformersRunner.batch_invariant), with and "
        "without a drafter",
    )
    ap.add_argument(
        "--occurrence",
        default="",
        help="section 1: prompt lookup with each of these `occurrence`s side by side (comma-separated; default: the "
        "drafter's default alone)",
    )
    ap.add_argument(
        "--p-min",
        default="",
        help="section 4: also early_exit and draft_model with each of these p_min (comma-separated), side by side",
    )
    ap.add_argument(
        "--guidance",
        type=float,
        default=None,
        help="sections 1, 4 and 5: classifier-free guidance at this scale (cfg first in the chain, a negative prompt "
        "for every row) with and without the drafters",
    )
    ap.add_argument("--markdown", action="store_true", help="print markdown tables (default: JSON)")
    ap.add_argument("--json", default=None, help="also write the tables, the environment and the command here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    TransformersRunner.fast_steps = args.fast_steps
    TransformersRunner.batch_invariant = args.batch_invariant
    sections = {int(s) for s in args.sections.split(",")}
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        ap.error(f"--tasks: unknown {', '.join(unknown)} (known: {', '.join(TASKS)})")
    if not 1 <= args.prompts <= 8:
        ap.error(f"--prompts {args.prompts}: each task has 8 prompts; give 1-8")
    occurrences = [o for o in args.occurrence.split(",") if o]
    if occurrences:
        from samplechain_prompt_lookup import OCCURRENCES

        if unknown := [o for o in occurrences if o not in OCCURRENCES]:
            ap.error(f"--occurrence: unknown {', '.join(unknown)} (known: {', '.join(OCCURRENCES)})")
    names = args.engines.split(",") if sections & {1, 3, 5} else []
    if sections & {2, 4} and "transformers" not in names:
        names.append("transformers")
    engines = {name: _load(name, args.threads, args.gguf, args.kv_cache) for name in names}
    plan = Plan(args.max_new_tokens, args.reps, args.prompts, args.guidance)
    batches = [int(b) for b in args.batch.split(",")]
    tables: list[Table] = []
    if 1 in sections:
        picked = {e: engines[e] for e in args.engines.split(",")}
        tables.append(section1(picked, tasks, batches, plan, occurrences))
    if 2 in sections:
        tables.append(section2(*engines["transformers"], tasks, plan, args.layers))
    if 3 in sections:
        hf = engines["transformers"][0] if "transformers" in engines else _load("transformers", args.threads)[0]
        picked = {e: engines[e] for e in args.engines.split(",")}
        tables.append(section3(picked, _first_layers(hf, args.layers), tasks, plan, args.layers))
    if 4 in sections:
        p_mins = [float(p) for p in args.p_min.split(",") if p]
        tables.append(section4(*engines["transformers"], tasks, batches, plan, args.layers, p_mins))
    if 5 in sections:
        picked = {e: engines[e] for e in args.engines.split(",")}
        tables.append(section5(picked, tasks, batches, plan))
    records = {t.title: t.records() for t in tables}
    print("\n\n".join(t.markdown() for t in tables) if args.markdown else json.dumps(records, indent=2))
    if args.json:
        write_json(args.json, args.threads, tables=records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
