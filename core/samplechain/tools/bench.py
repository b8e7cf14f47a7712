"""Benchmarks of one sampling step: the shared timing pieces and the target matrix of `samplechain bench`.

It lives in the package (not in benchmarks/) so that `samplechain bench` works from a pip install, and so that
benchmarks/bench_chain.py, bench_presets.py and bench_targets.py measure with one timer and one set of inputs.

The matrix is the project's list of CPU speed targets (V = 128256, float32, 2 threads, medians). Each configuration
is timed in one process against

- transformers: the equivalent LogitsProcessorList, then softmax + torch.multinomial (GenerationMixin._sample);
- read: one `logits.max(dim=-1)` over the same input, a single pass that also finds an index, which any top-k
  or argmax pays (the "read floor");
- a baseline of our own where the target names one: the same chain with an unseeded `dist` (seeded sampling),
  or the same chain fed float32 logits (float16 / bfloat16 rows).

transformers is imported only when a pipeline is built; without it its columns are None ("n/a").
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import inspect
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import attrs
import torch

from ..errors import ConfigError

__all__ = [
    "LOGIT_KINDS",
    "DTYPES",
    "CONFIGS",
    "BenchConfig",
    "Target",
    "make_logits",
    "make_history",
    "transformers_step",
    "time_blocks",
    "stage_medians",
    "markdown_rows",
    "rich_rows",
    "print_rows",
    "print_breakdown",
    "summary",
    "warmup_for",
    "environment",
    "run_matrix",
]

LOGIT_KINDS = {
    "randn": "torch.randn(B, V) * 3: flat, every row has thousands of near-top tokens",
    "peaked": "Zipf-like, logit = -1.5 * ln(rank) + 0.1 * randn, ranks shuffled per row (top token p ~ 0.4)",
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PROMPT, GENERATED = 256, 64  # the token history of the penalty configurations: prompt + generated tokens per row
B1_SLACK_MS = 0.05  # the B = 1 target: <= 3x read + 50 microseconds


# --------------------------------------------------------------------------- inputs
def make_logits(kind: str, batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Seeded float32 logits (B, V), contiguous."""
    g = torch.Generator().manual_seed(seed)
    if kind == "randn":
        return torch.randn(batch, vocab, generator=g) * 3.0
    if kind == "peaked":
        # what a trained LM looks like: a heavy head and a long Zipfian tail spanning ~18 nats
        rank_logits = -1.5 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))  # (V,) descending
        perm = torch.argsort(torch.rand(batch, vocab, generator=g), dim=-1)  # a random token order per row
        logits = torch.empty(batch, vocab).scatter_(1, perm, rank_logits.expand(batch, -1).contiguous())
        return logits + 0.1 * torch.randn(batch, vocab, generator=g)
    raise ConfigError(f"unknown logits kind {kind!r}; choose from {', '.join(LOGIT_KINDS)}")


def make_history(batch: int = 32, vocab: int = 128256, length: int = PROMPT + GENERATED, seed: int = 0) -> torch.Tensor:
    """(B, L) int64 token ids: random tokens in [100, V) mixed with phrases of 3-8 tokens from a pool of 16 shared
    by all rows, each row ending in the first 5 tokens of a phrase it used earlier, so DRY finds repeats that the
    next token would extend, and penalties see repeated tokens. Never contains the breaker ids (< 100)."""
    g = torch.Generator().manual_seed(seed)
    pool = [torch.randint(100, vocab, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g) for _ in range(16)]
    rows = []
    for _ in range(batch):
        parts: list[torch.Tensor] = []
        used: list[int] = []
        n = 0
        while n < length - 5:
            if float(torch.rand((), generator=g)) < 0.35:
                i = int(torch.randint(len(pool), (1,), generator=g))
                used.append(i)
                parts.append(pool[i])
            else:
                parts.append(torch.randint(100, vocab, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g))
            n += len(parts[-1])
        row = torch.cat(parts)[: length - 5]
        tail = pool[used[int(torch.randint(len(used), (1,), generator=g))] if used else 0]
        tail = torch.cat([tail, tail])[:5] if len(tail) < 5 else tail[:5]
        rows.append(torch.cat([row, tail]))
    return torch.stack(rows)


def transformers_step(processors: Any, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """What transformers' sampling loop does per step (GenerationMixin._sample): process, softmax, multinomial."""
    scores = processors(input_ids, logits)
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


# --------------------------------------------------------------------------- timing
def time_blocks(fns: dict[str, Callable[[], Any]], reps: int, warmup: int, block: int = 5) -> dict[str, list[float]]:
    """Milliseconds of reps calls of each fn, after warmup calls of each.

    The functions take turns in blocks of `block` consecutive calls, so a slow spell of the machine (shared
    virtual CPUs stall for tens of milliseconds at times) lands on every pipeline alike instead of on one.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    while any(len(t) < reps for t in times.values()):
        for name, fn in fns.items():
            for _ in range(min(block, reps - len(times[name]))):
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def stage_medians(
    chain: Any, processors: Any, ours: Callable[[], Any], input_ids: torch.Tensor, logits: torch.Tensor, reps: int
) -> dict[str, dict[str, float]]:
    """Median ms of each stage of both pipelines, their steps alternating: for samplechain each sampler's
    apply()/select() of `chain` (timers set as instance attributes: this chain only) and "executor (rest of
    sample())"; for transformers each processor of `processors` on (input_ids, logits), softmax, multinomial and
    "LogitsProcessorList (rest)" (its per-step inspect.signature of every processor). `ours()` runs one step of
    the chain; a stage a step skipped (a fused one) counts 0 there."""
    step: dict[str, float] = {}

    def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            step[label] = step.get(label, 0.0) + (time.perf_counter() - t0) * 1e3
            return out

        return wrapper

    last = len(chain.samplers) - 1
    for i, sampler in enumerate(chain.samplers):
        method = "select" if i == last else "apply"
        setattr(sampler, method, timed(f"{i}: {sampler.qualified_name()}", getattr(sampler, method)))
    wrapped = [(proc, timed(type(proc).__name__, proc)) for proc in processors]
    softmax, multinomial = timed("softmax", torch.softmax), timed("multinomial", torch.multinomial)

    def theirs() -> None:
        scores = logits
        for proc, fn in wrapped:  # what LogitsProcessorList.__call__ does, each processor timed
            inspect.signature(proc.__call__)
            scores = fn(input_ids, scores)
        multinomial(softmax(scores, dim=-1), num_samples=1)

    samples: dict[str, list[dict[str, float]]] = {"ours": [], "transformers": []}
    rest = {"ours": "executor (rest of sample())", "transformers": "LogitsProcessorList (rest)"}
    warmup = warmup_for(reps)
    for n in range(warmup + reps):
        for name, fn in (("ours", ours), ("transformers", theirs)):
            step.clear()
            t0 = time.perf_counter()
            fn()
            total = (time.perf_counter() - t0) * 1e3
            stages = dict(step)
            stages[rest[name]] = total - sum(step.values())
            stages["total"] = total
            if n >= warmup:
                samples[name].append(stages)
    return {
        name: {label: statistics.median(r.get(label, 0.0) for r in rows) for label in rows[0]}
        for name, rows in samples.items()
    }


def markdown_rows(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int]) -> str:
    """A markdown table; the columns numbered in `right` right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def rich_rows(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int], title: str) -> Any:
    """The same table as a rich Table (cells may carry rich markup)."""
    from rich.table import Table

    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="right" if i in right else "left")
    for r in rows:
        table.add_row(*r)
    return table


def print_rows(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: Collection[int],
    *,
    markdown: bool,
    title: str = "ms per step: median (p10–p90)",
) -> None:
    """Print the table as markdown, or with rich (200 columns when piped: rich would wrap at 80)."""
    if markdown:
        print(markdown_rows(headers, rows, right))
        return
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(rich_rows(headers, rows, right, title))


def print_breakdown(b: dict[str, Any], what: str) -> None:
    """Print stage_medians' result for `what` (e.g. "randn logits, B=32 V=128256")."""
    print(f"\nstage breakdown, {what} (median ms per step, each stage its own median):")
    for name in ("ours", "transformers"):
        print(f"  {'samplechain' if name == 'ours' else name}: total {b[name]['total']:.3f}")
        for label, ms in b[name].items():
            if label != "total":
                print(f"    {label:40s} {ms:8.3f}")


def timing_arguments(parser: Any, *, reps: int, rounds: int | None = None, threads: int | None = 2) -> None:
    """The options every benchmark script shares: --reps, --rounds (when the script pools rounds), --threads,
    --markdown and --progress, with the script's own defaults."""
    parser.add_argument("--reps", type=int, default=reps, help=f"timed calls per pipeline per round (default {reps})")
    if rounds is not None:
        parser.add_argument(
            "--rounds",
            type=int,
            default=rounds,
            help=f"measure every cell this many times, spread over the run, samples pooled (default {rounds})",
        )
    parser.add_argument("--threads", type=int, default=threads, help=f"torch.set_num_threads (default {threads})")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table instead of a rich one")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a bar on stderr, drawn between timed blocks (default: when stderr is a terminal)",
    )


def summary(times: list[float]) -> dict[str, float]:
    """{"median", "p10", "p90"} of a list of milliseconds (nearest-rank percentiles)."""
    times = sorted(times)

    def pct(q: float) -> float:
        return times[min(len(times) - 1, max(0, round(q * (len(times) - 1))))]

    return {"median": statistics.median(times), "p10": pct(0.10), "p90": pct(0.90)}


def warmup_for(reps: int) -> int:
    return max(3, reps // 5)


def environment(threads: int) -> dict[str, Any]:
    """Versions and machine, for the header line and the JSON of a run. transformers: None when not installed."""
    import samplechain

    try:
        import transformers

        hf_version: str | None = transformers.__version__
    except ImportError:
        hf_version = None
    return {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": hf_version,
        "samplechain": getattr(samplechain, "__version__", "?"),
        "python": platform.python_version(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "platform": platform.platform(),
    }


def write_json(path: str, threads: int, **body: Any) -> None:
    """`body` (a run's rows or tables) at `path` as JSON, with the machine and versions (`environment`) and the
    command line under "env"."""
    env = {**environment(threads), "command": " ".join(sys.argv)}
    with open(path, "w") as fh:
        json.dump({"env": env, **body}, fh, indent=2)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# --------------------------------------------------------------------------- the target matrix
@attrs.frozen
class Target:
    """One speed target. check(row) -> True / False, or None when a column it reads is n/a; applies(row) says
    whether the target is about this row at all (the B = 1 target only at B = 1)."""

    text: str
    check: Callable[[dict[str, Any]], bool | None]
    applies: Callable[[dict[str, Any]], bool] = lambda row: True


def _ratio_at_most(key: str, limit: float) -> Callable[[dict[str, Any]], bool | None]:
    return lambda row: None if row[key] is None else row[key] <= limit


def faster_than_transformers(x: float) -> Target:
    return Target(
        f">= {x:g}x faster than transformers",
        lambda row: None if row["transformers_over_ours"] is None else row["transformers_over_ours"] >= x,
    )


def within_read(x: float) -> Target:
    return Target(f"<= {x:g}x read", _ratio_at_most("ours_over_read", x))


B1 = Target(
    f"B=1: <= 3x read + {B1_SLACK_MS * 1e3:g} us",
    lambda row: row["ours"]["median"] <= 3 * row["read"]["median"] + B1_SLACK_MS,
    lambda row: row["batch"] == 1,
)
SEEDED = Target("seeded <= 1.2x unseeded", _ratio_at_most("ours_over_baseline", 1.2))
DTYPE = Target("no slower than float32 input", _ratio_at_most("ours_over_baseline", 1.0))


@attrs.frozen
class BenchConfig:
    """One row group of the matrix: our chain, the transformers pipeline it is compared with, and its targets
    (at float32; float16 / bfloat16 rows are held to DTYPE instead).

    transformers() builds the LogitsProcessorList (imports transformers; an empty list is plain softmax +
    multinomial). request(i) gives row i's per-request parameters. baseline: (label, chain dict) of a second
    chain of ours timed beside it with default request parameters."""

    name: str
    chain: dict[str, Any]
    transformers: Callable[[], Any]
    transformers_text: str
    targets: tuple[Target, ...]
    history: bool = False
    request: Callable[[int], dict[str, Any]] | None = None
    baseline: tuple[str, dict[str, Any]] | None = None

    @property
    def target_text(self) -> str:
        return "; ".join(t.text for t in self.targets)


def _chain(name: str, *samplers: dict[str, Any]) -> dict[str, Any]:
    return {"chain": {"name": name, "samplers": list(samplers)}}


def _hf(*names_and_args: tuple[str, tuple[Any, ...]]) -> Callable[[], Any]:
    """A builder of LogitsProcessorList([transformers.<name>(*args), ...]); transformers is imported when called."""

    def build() -> Any:
        import transformers

        return transformers.LogitsProcessorList([getattr(transformers, n)(*a) for n, a in names_and_args])

    return build


CONFIGS: dict[str, BenchConfig] = {
    c.name: c
    for c in (
        BenchConfig(
            "llama.cpp",
            _chain(
                "llama.cpp preset",
                {"use": "penalties", "repeat": 1.1, "last_n": 64},
                {"use": "top_k", "k": 40},
                {"use": "top_p", "p": 0.95},
                {"use": "min_p", "p": 0.05},
                {"use": "temperature", "t": 0.8},
                {"use": "dist"},
            ),
            _hf(
                ("RepetitionPenaltyLogitsProcessor", (1.1,)),
                ("TopKLogitsWarper", (40,)),
                ("TopPLogitsWarper", (0.95,)),
                ("MinPLogitsWarper", (0.05,)),
                ("TemperatureLogitsWarper", (0.8,)),
            ),
            "RepetitionPenalty 1.1 (whole history) → TopK 40 → TopP .95 → MinP .05 → Temp .8",
            (faster_than_transformers(50), within_read(5), B1),
            history=True,
        ),
        BenchConfig(
            "top-p",
            _chain("top-p 0.9", {"use": "top_p", "p": 0.9}, {"use": "dist"}),
            _hf(("TopPLogitsWarper", (0.9,))),
            "TopP .9",
            (faster_than_transformers(30), within_read(10), B1),
        ),
        BenchConfig(
            "min-p",
            _chain(
                "min-p 0.05 + temperature",
                {"use": "min_p", "p": 0.05},
                {"use": "temperature", "t": 0.8},
                {"use": "dist"},
            ),
            _hf(("MinPLogitsWarper", (0.05,)), ("TemperatureLogitsWarper", (0.8,))),
            "MinP .05 → Temp .8",
            (within_read(4), B1),
        ),
        BenchConfig(
            "seeded",
            _chain("dist, seeded per request", {"use": "dist"}),
            _hf(),
            "softmax + multinomial only",
            (SEEDED,),
            request=lambda i: {"seed": 1000 + i},
            baseline=("unseeded", _chain("dist, unseeded", {"use": "dist"})),
        ),
    )
}


def _targets_for(config: BenchConfig, row: dict[str, Any]) -> list[Target]:
    targets = config.targets if row["dtype"] == "float32" else (DTYPE,)
    return [t for t in targets if t.applies(row)]


def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


# --------------------------------------------------------------------------- running it
def _parse_choices(names: Sequence[str], known: Sequence[str], what: str) -> list[str]:
    import difflib

    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown {what} {name!r}{hint} (choose from {', '.join(known)})")
    if not names:
        raise ConfigError(f"no {what} given: name at least one of {', '.join(known)}")
    return list(names)


def run_matrix(
    batches: Sequence[int] = (1, 8, 32),
    vocab: int = 128256,
    kinds: Sequence[str] = ("peaked",),
    dtypes: Sequence[str] = ("float32", "float16", "bfloat16"),
    reps: int = 20,
    rounds: int = 3,
    progress: bool | None = None,
    *,
    configs: Sequence[str] | None = None,
    threads: int = 2,
    warmup: int | None = None,
) -> list[dict[str, Any]]:
    """Time every (config, kind, dtype, B) cell; one row per cell, in that order.

    Each cell is measured `rounds` times (reps calls of each pipeline, alternating in blocks), the rounds spread
    over the run and the samples pooled, so a slow spell of a shared machine spoils a part of every cell rather
    than all of one. A row holds {"median", "p10", "p90"} milliseconds for "ours", "transformers", "read" and
    "baseline" (None where not timed), ratios of medians, and its targets with "met": True / False / None (n/a).
    transformers is timed on float32 rows only (the dtype target compares with our own float32 time).
    torch's thread count is `threads` for the run and restored afterwards.

    progress: a bar over rounds x cells on stderr (None: when stderr is a terminal), drawn between timed blocks.
    """
    from ..engine.chain import Chain
    from .progress import progress_bar

    config_names = _parse_choices(
        list(configs) if configs is not None else list(CONFIGS), list(CONFIGS), "configuration"
    )
    kinds = _parse_choices(list(kinds), list(LOGIT_KINDS), "logits kind")
    dtypes = _parse_choices(list(dtypes), list(DTYPES), "dtype")
    if not batches or min(batches) < 1:
        raise ConfigError(f"batch sizes {list(batches)}: give at least one, each >= 1 (e.g. 1,8,32)")
    if vocab < 200:
        raise ConfigError(f"vocab {vocab}: must be >= 200 (the penalty history draws token ids from [100, V))")
    if reps < 1 or rounds < 1:
        raise ConfigError(f"reps {reps}, rounds {rounds}: both must be >= 1")
    warmup = warmup_for(reps) if warmup is None else warmup
    have_hf = transformers_available()

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        chains = {n: Chain.load(CONFIGS[n].chain) for n in config_names}
        baselines = {n: Chain.load(b[1]) for n in config_names if (b := CONFIGS[n].baseline) is not None}
        pipelines = {n: CONFIGS[n].transformers() for n in config_names} if have_hf else {}
        cells = [(c, k, d, b) for c in config_names for k in kinds for d in dtypes for b in batches]
        samples: dict[tuple[str, str, str, int], dict[str, list[float]]] = {cell: {} for cell in cells}
        with progress_bar(rounds * len(cells), "samplechain bench", progress, auto_refresh=False) as bar:
            for r in range(rounds):
                for cell in cells:
                    name, kind, dtype, batch = cell
                    bar.update(status=f"round {r + 1}/{rounds}: {name} {kind} {dtype} B={batch}")  # before timing
                    fns, inputs = _cell_fns(
                        CONFIGS[name],
                        chains[name],
                        baselines.get(name),
                        pipelines.get(name),
                        kind,
                        DTYPES[dtype],
                        batch,
                        vocab,
                    )
                    before = [x.clone() for x in inputs]
                    times = time_blocks(fns, reps, warmup)
                    if not all(torch.equal(x, y) for x, y in zip(inputs, before)):
                        raise AssertionError(f"{name}: a pipeline modified the caller's logits in place")
                    for key, t in times.items():
                        samples[cell].setdefault(key, []).extend(t)
                    bar.advance()  # drawn after timing
    finally:
        torch.set_num_threads(previous_threads)
    return [_row(cell, samples[cell], vocab, reps * rounds) for cell in cells]


def _cell_fns(
    config: BenchConfig, chain: Any, baseline: Any, pipeline: Any, kind: str, dtype: torch.dtype, batch: int, vocab: int
) -> tuple[dict[str, Callable[[], Any]], list[torch.Tensor]]:
    """The timed calls of one cell, each with its own request store (one request per row), and their inputs."""
    logits32 = make_logits(kind, batch, vocab)
    logits = logits32.to(dtype).contiguous()
    ids = [f"req{i}" for i in range(batch)]
    extra: dict[str, Any] = {}
    if config.history:
        extra = {"history": make_history(batch, vocab), "prompt_lengths": torch.full((batch,), PROMPT)}

    def store_for(c: Any, request: Callable[[int], dict[str, Any]] | None) -> Any:
        store = c.new_store(capacity=batch)
        for i, rid in enumerate(ids):
            store.add(rid, request(i) if request else None)
        return store

    ours_store = store_for(chain, config.request)
    fns: dict[str, Callable[[], Any]] = {
        "ours": lambda: chain.sample(logits, ours_store, ids, **extra),
        "read": lambda: logits.max(dim=-1),  # one pass with indices: what any top-k or argmax pays
    }
    if dtype != torch.float32:  # the dtype target: the same chain on the float32 logits
        base_store = store_for(chain, config.request)
        fns["baseline"] = lambda: chain.sample(logits32, base_store, ids, **extra)
    else:
        if baseline is not None:
            base_store = store_for(baseline, None)
            fns["baseline"] = lambda: baseline.sample(logits, base_store, ids, **extra)
        if pipeline is not None:
            input_ids = extra.get("history", torch.zeros(batch, 1, dtype=torch.long))
            fns["transformers"] = lambda: transformers_step(pipeline, input_ids, logits)
    return fns, [logits, logits32]


def _row(cell: tuple[str, str, str, int], times: dict[str, list[float]], vocab: int, reps: int) -> dict[str, Any]:
    name, kind, dtype, batch = cell
    config = CONFIGS[name]
    stats = {
        key: (summary(times[key]) if key in times else None) for key in ("ours", "transformers", "read", "baseline")
    }
    ours = stats["ours"]["median"]  # type: ignore[index]

    def over(a: dict[str, float] | None, b: dict[str, float] | None) -> float | None:
        return None if a is None or b is None else a["median"] / b["median"]

    baseline_label = None
    if "baseline" in times:
        baseline_label = "float32 input" if dtype != "float32" else config.baseline[0]  # type: ignore[index]
    row: dict[str, Any] = {
        "config": name,
        "chain": config.chain["chain"]["name"],
        "kind": kind,
        "dtype": dtype,
        "batch": batch,
        "vocab": vocab,
        "reps": reps,
        **stats,
        "baseline_label": baseline_label,
        "transformers_pipeline": config.transformers_text if stats["transformers"] else None,
        "transformers_over_ours": over(stats["transformers"], stats["ours"]),
        "ours_over_read": ours / stats["read"]["median"],  # type: ignore[index]
        "ours_over_baseline": over(stats["ours"], stats["baseline"]),
    }
    checks: list[dict[str, Any]] = [{"text": t.text, "met": t.check(row)} for t in _targets_for(config, row)]
    row["targets"] = checks
    row["target"] = "; ".join(c["text"] for c in checks)
    results = [c["met"] for c in checks]  # met: False if any target is missed, None if any is n/a, else True
    row["met"] = False if False in results else (None if None in results or not results else True)
    return row
